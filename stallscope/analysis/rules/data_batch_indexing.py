"""``data.batch_indexing``: an in-memory dataset of tensors indexed one sample at a time.

With automatic batching the loader calls ``dataset[i]`` once per sample and ``default_collate``
stacks the samples again: for a ``TensorDataset`` (or a dataset whose items are rows of its
tensors) that is a few microseconds of Python per sample, often more than the model's step on a
small model. A ``BatchSampler`` passed as ``sampler`` with ``batch_size=None`` hands the dataset a
list of indices instead: one advanced-indexing gather per tensor, no collate.

Model (constants from ``benchmarks/handoff.py`` on a 2-core x86-64 box, torch 2.13; see
``docs/predictions.md``, "Batched indexing"):

    per sample  B * (PER_SAMPLE + PER_SAMPLE_PER_TENSOR * T) + T * COLLATE_PER_TENSOR + bytes * COPY
    per batch   B * BATCH_PER_INDEX + T * GATHER_PER_TENSOR + bytes * COPY

for B samples of T tensors. The measured cost of a batch (in-process ``next()`` without workers,
or the in-process probe with workers) is scaled by the ratio of the two, so a slower machine
scales both. For a dataset of the user's own class, whose ``__getitem__`` may do more than slice,
the saving is at most the modelled indexing overhead itself. The loop model then predicts the step
time at the same worker count with the cheaper batch.
"""

from __future__ import annotations

from dataclasses import replace

from stallscope.analysis.context import Context
from stallscope.analysis.device_model import cap_by_device_idle
from stallscope.analysis.finding import Finding, speedup_for
from stallscope.analysis.loop_model import DEFAULT_BATCH_TENSORS
from stallscope.analysis.numbers import fmt_ms, frac, ms

ID = "data.batch_indexing"

#: one ``dataset[i]`` of a TensorDataset and its share of the collate: per sample, per tensor
PER_SAMPLE_S = 2.3e-6
PER_SAMPLE_PER_TENSOR_S = 0.8e-6
#: ``default_collate``'s stack, per tensor of the batch
COLLATE_PER_TENSOR_S = 10e-6
#: one gather with a list of indices, per tensor; the BatchSampler's list, per index
GATHER_PER_TENSOR_S = 18e-6
BATCH_PER_INDEX_S = 0.5e-6
#: copying the batch's bytes (both ways do it once)
COPY_PER_BYTE_S = 0.16e-9


def per_sample_cost_s(batch_size: int, tensors: int, nbytes: int) -> float:
    """Modelled cost of one batch indexed one sample at a time."""
    per_sample = PER_SAMPLE_S + PER_SAMPLE_PER_TENSOR_S * tensors
    return batch_size * per_sample + tensors * COLLATE_PER_TENSOR_S + nbytes * COPY_PER_BYTE_S


def per_batch_cost_s(batch_size: int, tensors: int, nbytes: int) -> float:
    """Modelled cost of the same batch indexed once."""
    return batch_size * BATCH_PER_INDEX_S + tensors * GATHER_PER_TENSOR_S + nbytes * COPY_PER_BYTE_S


def rule(ctx: Context) -> Finding | None:
    loader = ctx.loader
    if loader is None or not loader.per_sample_indexing or loader.in_memory is None:
        return None
    batch_size = loader.batch_size
    if batch_size is None or batch_size < 2 or ctx.span.wall_s <= 0:
        return None
    model = ctx.loop_model
    if model is None or model.load_source == "production" or model.load_s <= 0:
        return None  # a batch's in-process cost is not known
    tensors = ctx.batch_tensors or DEFAULT_BATCH_TENSORS
    nbytes = ctx.batch_bytes or 0
    before = per_sample_cost_s(batch_size, tensors, nbytes)
    after = per_batch_cost_s(batch_size, tensors, nbytes)
    cut = model.load_s * (1.0 - after / before)
    own_class = loader.in_memory != "TensorDataset"
    if own_class:
        cut = min(cut, before - after)  # its __getitem__ may do more than index
    cheaper = model.load_s - cut
    faster = replace(model, load_s=cheaper, load_cpu_s=min(model.load_cpu_s, cheaper))
    now_step = model.predict_step_s(model.workers)
    new_step = faster.predict_step_s(model.workers)
    saving = frac(cap_by_device_idle(model.steps * (now_step - new_step) / ctx.span.wall_s, ctx))
    if saving <= 0:
        return None
    lightning = ctx.config.framework == "lightning"
    where = "the train DataLoader" if lightning else "the DataLoader"
    what = "a TensorDataset" if not own_class else "a dataset of tensors"
    fix = (
        f"Index {what} once per batch instead of once per sample: pass a BatchSampler as sampler and "
        f"batch_size=None to {where}, so the dataset gets a list of {batch_size} indices and each tensor "
        "is gathered once, with no collate."
    )
    if own_class:
        fix += (
            " Its __getitem__ then receives that list: tensor indexing (self.x[indices]) handles it as is;"
            " or give the dataset a __getitems__(indices) that gathers the whole batch."
        )
    head, base, note = _batch_sampler(loader.sampler, loader.shuffle, lightning)
    fix += note
    suggestion: dict[str, object] = {"batch_sampler": True}
    if lightning and loader.sampler == "DistributedSampler":
        suggestion["use_distributed_sampler"] = False  # with it: a Trainer setting, applied by hand
    snippet = (
        f"{head}\nsampler = BatchSampler({base}, batch_size={batch_size}, drop_last={loader.drop_last})\n"
        f"DataLoader(dataset, sampler=sampler, batch_size=None, num_workers={model.workers})"
    )
    return Finding(
        id=ID,
        title=(
            f"The in-memory dataset is indexed one sample at a time: {fmt_ms(model.load_s)} per batch of "
            f"{batch_size} ({fmt_ms(model.load_s / batch_size)} per sample)"
        ),
        est_saving_fraction=saving,
        est_speedup=round(speedup_for(saving), 3),
        confidence="low" if own_class else "medium",
        evidence={
            "dataset": loader.in_memory,
            "num_workers": model.workers,
            "batch_size": batch_size,
            "batch_tensors": tensors,
            "batch_bytes": nbytes,
            "load_per_batch_ms": ms(model.load_s),
            "load_measured_in": model.load_source,
            "per_sample_us": round(model.load_s / batch_size * 1e6, 3),
            "modelled_cost_ratio": round(after / before, 4),
            "predicted_load_per_batch_ms": ms(cheaper),
            "step_ms": ms(now_step),
            "predicted_step_ms": ms(new_step),
        },
        fix=fix,
        suggestion=suggestion,
        snippet=snippet,
    )


def _batch_sampler(kind: str | None, shuffle: bool | None, lightning: bool) -> tuple[str, str, str]:
    """The snippet's first lines, the sampler the BatchSampler draws its indices from, and what
    the fix adds about it, for a loader whose sampler is a ``kind`` (its class name) that shuffles
    or not (None: not known). The order and each rank's share of the data stay what they are: a
    plain loop's ``DistributedSampler`` is the loader's own, kept inside; in Lightning, whose own
    distributed wrapper would list a BatchSampler anew on each rank (each drawing its own order),
    a ``DistributedSampler`` inside it with the Trainer's left off; any other sampler is the
    user's own, wrapped as it is."""
    if kind in ("RandomSampler", "SequentialSampler") or (kind is None and not lightning):
        order = "RandomSampler" if shuffle else "SequentialSampler"
        return f"from torch.utils.data import BatchSampler, {order}", f"{order}(dataset)", ""
    if kind == "DistributedSampler" and lightning:
        return (
            "from torch.utils.data import BatchSampler, DistributedSampler\n"
            f"base = DistributedSampler(dataset, shuffle={bool(shuffle)})"
            "  # and Trainer(use_distributed_sampler=False)",
            "base",
            " In this distributed fit, keep a DistributedSampler inside the BatchSampler and set"
            " Trainer(use_distributed_sampler=False): Lightning's own would wrap the BatchSampler and list it anew"
            " on each rank, each in its own order, so the ranks' batches would overlap. Call base.set_epoch(epoch)"
            " in on_train_epoch_start (Lightning calls it only on the loader's sampler, the BatchSampler).",
        )
    if kind == "DistributedSampler":
        return (
            "from torch.utils.data import BatchSampler\n"
            "base = loader.sampler  # its DistributedSampler: call base.set_epoch(epoch) each epoch",
            "base",
            " Keep the loader's DistributedSampler inside the BatchSampler, so that each rank still reads its own"
            " share, and call its set_epoch(epoch) at the start of each epoch (loader.sampler is then the"
            " BatchSampler, which has no set_epoch).",
        )
    name = kind or "sampler"
    return (
        f"from torch.utils.data import BatchSampler\nbase = loader.sampler  # the loader's {name}, as it is now",
        "base",
        f" Wrap the loader's own {name} as it is, so that its order and its share of the data stay the same.",
    )
