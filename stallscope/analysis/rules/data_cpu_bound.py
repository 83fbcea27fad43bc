"""``data.cpu_bound``: preparing batches already saturates the CPU cores; more workers cannot help.

Evidence: the loop is starved for data, loading is CPU work (workers on a CPU most of the time,
or in-process ``next()`` calls burning CPU), and the host sampler saw the process tree keep the
usable cores busy. Without that measurement, and without workers, the loop model must show the
cores binding: their share of the CPU work, at the worker count that would help most, within
``NO_GAIN`` of the step time now. A loop that waits while the cores idle is not called CPU-bound.

Model: preprocessing made ``1 / (1 - COST_REDUCTION)`` times cheaper (caching decoded samples,
moving augmentation to the GPU) takes that share off each batch's CPU time; the loop model
predicts the step time with it at the same worker count. The saving is capped by the time the
GPU sat idle while the loop waited for data.
"""

from __future__ import annotations

from dataclasses import replace

from stallscope.analysis.context import Context
from stallscope.analysis.device_model import cap_by_device_idle
from stallscope.analysis.finding import Finding, speedup_for
from stallscope.analysis.numbers import count, fmt_ms, frac, ms
from stallscope.analysis.worker_cpu import SATURATED

ID = "data.cpu_bound"

#: share of a batch's CPU cost the suggested rework is assumed to remove
COST_REDUCTION = 0.5
#: loading counts as CPU work above this share of its time on a CPU
CPU_HEAVY = 0.7
#: more workers "cannot help" when the loop model predicts less than this gain from them
NO_GAIN = 0.1


def rule(ctx: Context) -> Finding | None:
    got = ctx.refined_model
    if got is None or ctx.span.wall_s <= 0:
        return None
    model, cpu = got
    if not model.starved or cpu.busy < CPU_HEAVY:
        return None
    now = model.predict_step_s(model.workers)
    if cpu.cores_busy is not None:
        saturated = cpu.cores_busy >= SATURATED
    elif model.workers == 0:
        # in-process loading, cores not sampled: the CPU work spread over the cores would still
        # set the step time at the most useful worker count
        saturated = model.cores_step_s >= (1 - NO_GAIN) * now
    else:
        saturated = False
    if not saturated:
        return None
    cut = COST_REDUCTION * model.load_cpu_s
    cheaper = replace(model, load_s=model.load_s - cut, load_cpu_s=model.load_cpu_s - cut)
    after = cheaper.predict_step_s(model.workers)
    saving = frac(cap_by_device_idle(model.steps * (now - after) / ctx.span.wall_s, ctx))
    if saving <= 0:
        return None
    busy_cores = f"{cpu.cores_busy:.0%}" if cpu.cores_busy is not None else "all"
    on_gpu = ctx.cuda_device is not None
    tensors = ctx.loader is not None and ctx.loader.in_memory is not None
    if tensors:
        # a dataset of tensors has nothing to decode or resize
        fix = (
            "More workers cannot help: loading already uses the cores. The dataset already holds tensors, "
            "so make each batch cheaper to index (one index per batch, see data.batch_indexing), do less per "
            f"sample, or run on a machine with more cores. The estimate assumes the per-batch CPU cost is cut "
            f"by {COST_REDUCTION:.0%}."
        )
        snippet = ""
    else:
        collate = ctx.loader.collate if ctx.loader is not None else None
        cheaper_what = (
            f"Make each batch cheaper: the loader's collate_fn ({collate}) and the dataset's __getitem__ run for"
            " every batch (do their work once ahead of time and cache it, vectorise it over the batch"
            if collate is not None
            else "Make each sample cheaper (decode and resize once and cache the result, use a lighter augmentation"
        )
        fix = (
            f"More workers cannot help: preprocessing already uses the cores. {cheaper_what})"
            + (", move augmentation to the GPU," if on_gpu else "")
            + " or run on a machine with more cores. The estimate assumes the per-batch CPU cost is cut by "
            f"{COST_REDUCTION:.0%}."
        )
        snippet = (
            "# augment on the GPU instead of in the DataLoader workers\n"
            'x = x.to("cuda", non_blocking=True)\n'
            "x = gpu_augment(x)  # e.g. torchvision.transforms.v2 on CUDA tensors"
            if on_gpu
            else "# prepare once, then load the cached tensors\ntorch.save(preprocess(raw_dataset), cache_path)"
        )
    return Finding(
        id=ID,
        title=(
            f"Batch preparation is CPU-bound: the {count(model.cores, 'usable core')} "
            f"{'is' if model.cores == 1 else 'are'} {busy_cores} busy and "
            f"training still waits {fmt_ms(model.measured_wait_s)} per step"
        ),
        est_saving_fraction=saving,
        est_speedup=round(speedup_for(saving), 3),
        confidence="medium",
        evidence={
            "num_workers": model.workers,
            "usable_cores": model.cores,
            "cpu_busy_fraction": frac(cpu.cores_busy) if cpu.cores_busy is not None else None,
            "loading_cpu_share": frac(cpu.busy),
            "cpu_measured_in": cpu.source,
            "load_cpu_per_batch_ms": ms(model.load_cpu_s),
            "wait_per_step_ms": ms(model.measured_wait_s),
            "consumer_per_step_ms": ms(model.consumer_s),
            "assumed_cpu_cost_cut": COST_REDUCTION,
            "predicted_step_ms": ms(after),
            "gpu_util_during_data": _util(ctx),
        },
        fix=fix,
        suggestion={},
        snippet=snippet,
    )


def _util(ctx: Context) -> float | None:
    if ctx.nvml is None:
        return None
    util = ctx.nvml.util_by_phase.get("data")
    return frac(util) if util is not None else None
