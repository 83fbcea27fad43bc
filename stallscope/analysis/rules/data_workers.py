"""``data.workers``: the wrong number of loader workers, too few or too many.

Uses the loop model (``analysis/loop_model.py``): finds the fewest workers, from none up, that
reach the best step time the cores allow, and predicts the saving from the step time at that
count. Too few: the loader cannot keep up and more processes would. Too many: handing each batch
over from a worker (pickling, shared memory, unpickling) costs the training process more than
making the batch itself, as with an in-memory dataset; fewer workers, often none, are faster.
Never suggests more workers than the usable cores when loading is CPU work; when batches wait on
I/O latency (little CPU per batch), up to ``io_workers_per_core`` per core. More workers than
that (16 on 2 cores) are told fewer even where the loader keeps up: each pass spawns them all,
one after another in the training process, and they compete with training for the cores. Their
rate then says nothing of a batch's cost, so the host sampler's measure of their CPU time per
batch stands for it (their start-up included, which errs towards more workers); without it,
nothing is said.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from stallscope.analysis.context import Context
from stallscope.analysis.device_model import cap_by_device_idle
from stallscope.analysis.finding import Confidence, Finding, speedup_for
from stallscope.analysis.loop_model import LoopModel, batches_may_be_ready, host_share
from stallscope.analysis.numbers import count, fmt_ms, frac, ms
from stallscope.analysis.worker_cpu import demand, refine, thread_waits

ID = "data.workers"

#: the openings of the fix's last sentences, which say what the prediction counts and how far it
#: may be off (``caveats``)
_GIL = " The prediction counts"
_SHARED = " The workers share"
_WARMER = " Without workers each step also starts with warmer caches"
_COLDER = " With workers each step also starts with colder caches"
_RANGE = " The realized speedup may land anywhere from"
_CAVEATS = (_GIL, _SHARED, _WARMER, _COLDER, _RANGE)


def caveats(fix: str) -> str:
    """The sentences at the end of a ``data.workers`` fix that say what its prediction counts
    and how far it may be off (a GIL wait, cores shared, colder caches, the range), with their
    leading space; "" when it has none. A loop that words the settings its own way (transformers'
    ``dataloader_num_workers``) keeps them."""
    starts = [at for at in (fix.find(opening) for opening in _CAVEATS) if at >= 0]
    return fix[min(starts) :] if starts else ""


def rule(ctx: Context) -> Finding | None:
    model = ctx.loop_model
    if model is None:
        return None
    # with workers, the host sampler's measured CPU share of a batch replaces "CPU = wall"
    model, _ = refine(ctx, model)
    io_bound = _io_bound(ctx, model)
    host = ctx.host_signals
    # the training thread's waits for a core, evidence where the loading is its own
    waits = thread_waits(ctx, model)
    cap = ctx.cores * ctx.config.io_workers_per_core if io_bound else ctx.cores
    # more workers than the cores allow: each pass spawns them all, and they compete with
    # training for the cores, even where the loader keeps up
    crowded = not io_bound and model.workers > cap
    if not model.starved and not crowded:
        return None
    if not model.starved:
        # the workers keep up, so their rate says nothing of a batch's cost: their CPU time per
        # batch, as the host sampler measured it (their start-up included: more, not fewer)
        if host is None or host.wall_s <= 0 or host.workers_cpu_s <= 0 or ctx.span.steps <= 0:
            return None
        per_batch = host.workers_cpu_s / ctx.span.steps
        model = replace(model, load_s=per_batch, load_cpu_s=per_batch, load_cpu_measured=True)
    # with workers, fewer (down to none) may win: the hand-over then costs more than it hides.
    # Without a probe, a batch's in-process cost is the workers' rate less the hand-over, an upper
    # bound, so a suggestion to lower stays on the safe side.
    suggested = model.best_workers(min(cap, 64), lowest=0 if model.workers > 0 and model.starved else 1)
    if suggested == model.workers or (model.workers == 0 and suggested < 1):
        return None
    fewer = suggested < model.workers
    if not fewer and batches_may_be_ready(ctx, model):
        return None
    # Training on the CPU itself: its intra-op threads and the workers share the cores. The
    # suggestion then also lowers torch's threads so both fit, and the prediction assumes that
    # the compute runs on those fewer threads (its CPU time per step spread over them).
    threads: int | None = None
    if not fewer and ctx.compute_threads > 1 and suggested + ctx.compute_threads > ctx.cores:
        threads = max(1, ctx.cores - suggested)
        model = replace(model, consumer_s=max(model.consumer_s, model.main_cpu_s / threads))
        if model.predict_step_s(suggested) >= model.step_s:
            return None
    predicted = model.predict_step_s(suggested)
    if ctx.span.wall_s <= 0:
        return None
    shared = _shared_cores(ctx, model, suggested, predicted)
    # passes that start their workers again: where keeping them is worth a fix of its own, the
    # suggestion keeps them (one change to make and to try, not two in turn)
    keep = _keep_workers(ctx, model, suggested)
    # on a GPU, only the time the device actually idled during the waits can be recovered
    saving_s = model.predict_saving_s(suggested, persistent=keep)
    saving = frac(cap_by_device_idle(saving_s / ctx.span.wall_s, ctx))
    if saving <= 0:
        return None
    wait_share = ctx.span.phase_fraction("data")
    lightning = ctx.config.framework == "lightning"
    where = "the train DataLoader" if lightning else "the DataLoader"
    snippet = f"DataLoader(dataset, batch_size=..., num_workers={suggested}"
    snippet += ", persistent_workers=True)" if keep else ")"
    suggestion: dict[str, int | bool] = {"num_workers": suggested}
    if keep:
        suggestion["persistent_workers"] = True
    if model.workers == 0 and ctx.loader is None and ctx.source in ("generator", "callable"):
        fix, snippet = _ready_batches_fix(ctx, suggested)
    elif model.workers == 0 and ctx.loader is None:
        fix = (
            f"Wrap the iterable in a torch DataLoader with num_workers={suggested} so batches are "
            "prepared in parallel with training."
        )
    elif fewer and crowded and not model.starved:
        fix = (
            f"Lower num_workers of {where} from {model.workers} to {suggested}: {model.workers} workers on"
            f" {count(ctx.cores, 'usable core')} are started at every pass"
            + (f" ({model.pass_overhead_s / max(1, model.passes) * 1e3:.0f} ms each time)" if model.passes else "")
            + f" and compete with training for the cores; {count(suggested, 'worker')} would keep up with the steps"
            " (their CPU time per batch, as measured)."
        )
    elif fewer:
        fix = (
            f"Lower num_workers of {where} from {model.workers} to {suggested}: receiving a batch from a "
            f"worker costs the training process {fmt_ms(model.transfer_main_s)} (unpickling, shared memory) "
            f"and the worker {fmt_ms(model.transfer_worker_s)} more, while making it in-process takes "
            f"{'at most ' if model.load_source == 'production' else ''}{fmt_ms(model.load_s)}."
        )
    else:
        fix = f"Raise num_workers of {where} from {model.workers} to {suggested}."
    if keep:
        gain_s = _persistent_gain_s(model, suggested)
        fix += f" {_keep_workers_fix(model, suggested, gain_s)}"
    if threads is not None:
        fix += (
            f" Training runs on the CPU with {ctx.compute_threads} intra-op threads; also call"
            f" torch.set_num_threads({threads}) so the {'worker' if suggested == 1 else 'workers'} and the"
            " compute do not stall each other."
        )
        snippet = f"torch.set_num_threads({threads})\n{snippet}"
        suggestion["torch_num_threads"] = threads
    # what the prediction counts and how far it may be off, last (``caveats``: other loops'
    # words for the settings keep them)
    gil_wait = model.gil_wait_at(suggested)
    if not fewer and gil_wait >= 0.1 * predicted:
        workers_gil = "worker's" if suggested == 1 else "workers'"
        fix += (
            f"{_GIL} {fmt_ms(gil_wait)} a batch of waiting for the busy {workers_gil} GIL in the"
            " hand-over (torch.multiprocessing.set_sharing_strategy('file_system') avoids it)."
        )
    speedup = round(speedup_for(saving), 3)
    confidence: Confidence = "low" if threads is not None else "high" if model.load_cpu_measured else "medium"
    range_evidence: dict[str, object] = {}
    ends = [speedup]
    reasons: list[str] = []
    if shared is not None:
        ends.append(round(speedup * shared.step_ratio, 3))
        range_evidence = {
            "cores_demand_now": round(shared.demand_now, 2),
            "cores_demand_after": round(shared.demand_after, 2),
        }
        slower = ends[-1] < speedup
        reasons.append(
            f"{_SHARED.strip()} the {count(ctx.cores, 'usable core')} with the training process"
            + (f" and other processes ({shared.others:.1f} cores' worth)" if shared.others >= 0.05 else "")
            + f": about {shared.demand_now:.1f} cores of work now, {shared.demand_after:.1f} with the change,"
            + (" so the training step itself may run slower." if slower else " so the step itself may run faster.")
        )
    cold = _cold_step_ends(ctx, model, suggested, keep)
    if cold is not None:
        ends.extend(cold)
        change_s = abs(model.consumer_at(suggested) - model.consumer_at(model.workers))
        range_evidence["cold_step_ms"] = ms(change_s)
        reasons.append(
            (
                f"{_WARMER.strip()} (no batch to receive from a worker"
                if suggested < model.workers
                else f"{_COLDER.strip()} (after receiving a batch from a worker"
            )
            + f" first): about {fmt_ms(change_s)} a step as modelled, a cost that varies from run to run and"
            " from host to host."
        )
    low, high = min(ends), max(ends)
    if shared is not None or cold is not None:
        range_evidence["est_speedup_range"] = [low, high]
    if high > SPREAD * low:
        confidence = "low" if confidence == "low" else "medium"
        fix += " " + " ".join(reasons) + f"{_RANGE} x{low:.2f} to x{high:.2f}."
    return Finding(
        id=ID,
        title=(
            f"{count(model.workers, 'worker')} on {count(ctx.cores, 'usable core')}: more than "
            f"{'it' if ctx.cores == 1 else 'the cores'} can run"
            if fewer and crowded and not model.starved
            else f"Handing batches over from {count(model.workers, 'worker')} costs more than making them: training "
            f"waits {fmt_ms(model.wait_s)} per step ({wait_share:.0%} of the time)"
            if fewer
            else f"Training waits for data {wait_share:.0%} of the time (num_workers={model.workers})"
        ),
        est_saving_fraction=saving,
        est_speedup=speedup,
        confidence=confidence,
        evidence={
            "num_workers": model.workers,
            "data_wait_fraction": frac(wait_share),
            "wait_per_step_ms": ms(model.measured_wait_s),
            "consumer_per_step_ms": ms(model.consumer_s),
            "load_per_batch_ms": ms(model.load_s),
            "load_cpu_per_batch_ms": ms(model.load_cpu_s),
            "load_cpu_measured": model.load_cpu_measured,
            # the loading's time neither on a CPU nor blocked, counted as the host's (the consumer's)
            **({"host_still_per_batch_ms": ms(model.still_s)} if model.still_s > 0 else {}),
            **({"thread_core_wait_per_cpu": round(waits, 3)} if waits is not None else {}),
            "main_cpu_per_step_ms": ms(model.main_cpu_s),
            "usable_cores": ctx.cores,
            "compute_threads": ctx.compute_threads,
            "load_source": model.load_source,
            "transfer_per_batch_ms": ms(model.transfer_s),
            "transfer_main_per_batch_ms": ms(model.transfer_main_s),
            "transfer_worker_per_batch_ms": ms(model.transfer_worker_s),
            "gil_wait_per_batch_ms": ms(model.gil_wait_at(suggested)),
            "batch_tensors": ctx.batch_tensors,
            "batch_bytes": ctx.batch_bytes,
            "step_ms": ms(model.step_s),
            "predicted_step_ms": ms(predicted),
            # the saving also pays for each pass's worker start-up (spawn, first batch, shutdown)
            "passes": model.passes,
            "pass_start_ms": ms(model.pass_overhead_s / max(1, model.passes)),
            "predicted_pass_start_ms": ms(model.predict_pass_overhead_s(suggested)),
            "predicted_saving_ms": ms(saving_s),
            **({"persistent_saving_ms": ms(gain_s)} if keep else {}),
            **range_evidence,
        },
        fix=fix,
        suggestion=suggestion,
        snippet=snippet,
    )


def _io_bound(ctx: Context, model: LoopModel) -> bool:
    """Whether making a batch waits on I/O more than it computes: its CPU time under half its
    wall time, and under half the share of a core the compute got (on a host shared with other
    jobs, loading that is CPU work gets no more than that either), and its time on a CPU or
    waiting for one under half its wall time (``worker_cpu.demand``): the compute's share alone
    misjudges a loaded host, where a long stretch of loading is preempted more often than a few
    milliseconds of compute."""
    if not model.load_cpu_measured:
        return False
    share = host_share(ctx, model.main_cpu_s, model.consumer_s)
    return model.cpu_share_of_loading < 0.5 * share and demand(ctx, model) < 0.5


def _ready_batches_fix(ctx: Context, workers: int) -> tuple[str, str]:
    """The fix and snippet for a loop fed whole batches by a generator or by ``scope.batch``
    calls: not a Dataset of samples, so no ``batch_size`` (it would batch the batches again)."""
    if ctx.source == "callable":
        fix = (
            f"Make the batches in {count(workers, 'DataLoader worker process')}, ahead of the loop: an IterableDataset"
            " whose __iter__ calls your batch function in a loop, read through"
            f" DataLoader(ds, batch_size=None, num_workers={workers}) (batch_size=None: its items are batches"
            " already), and scope.batch(next, batches) where the loop called it. Each worker has its own random"
            " state, seeded apart by torch. Where the batches come from the GPU, or from NumPy slices of a"
            " memory-mapped file that release the GIL, a background thread keeping a few batches ready in a"
            " queue.Queue does the same without processes."
        )
        snippet = (
            "class Batches(IterableDataset):\n"
            "    def __iter__(self):\n"
            "        while True:\n"
            "            yield get_batch()\n"
            f"batches = iter(DataLoader(Batches(), batch_size=None, num_workers={workers}))\n"
            "x, y = scope.batch(next, batches)"
        )
        return fix, snippet
    shard = (
        " Each worker runs its own copy of __iter__: shard it with torch.utils.data.get_worker_info(), so that"
        " worker k of n makes only every n-th batch (making a batch and skipping it saves nothing), or each"
        f" batch comes {'twice' if workers == 2 else f'{workers} times'}."
        if workers > 1
        else ""
    )
    fix = (
        f"Make the batches in {count(workers, 'DataLoader worker process')}: an IterableDataset whose __iter__"
        f" yields the generator's batches, read through DataLoader(ds, batch_size=None, num_workers={workers})"
        f" (batch_size=None: its items are batches already).{shard} Where the batches come from the GPU or a"
        " memory-mapped array, a background thread keeping a few batches ready in a queue.Queue does the same"
        " without processes."
    )
    snippet = (
        "class Batches(IterableDataset):\n"
        "    def __iter__(self):\n"
        "        info = get_worker_info()\n"
        "        k, n = (info.id, info.num_workers) if info is not None else (0, 1)\n"
        "        yield from make_batches(worker=k, workers=n)  # every n-th batch, from the k-th\n"
        f"DataLoader(Batches(), batch_size=None, num_workers={workers})"
    )
    return fix, snippet


#: a range whose ends differ by more than this factor lowers the finding's confidence
SPREAD = 1.3
#: the most the cold-step cost is taken to reach, as a multiple of its modelled median
COLD_STEP_SPREAD = 2.0


def _persistent_gain_s(model: LoopModel, workers: int) -> float:
    """What the span would save more with ``workers`` persistent workers than with as many
    started at every pass."""
    return model.predict_saving_s(workers, persistent=True) - model.predict_saving_s(workers, persistent=False)


def _keep_workers(ctx: Context, model: LoopModel, workers: int) -> bool:
    """Whether the suggestion also sets ``persistent_workers=True``: a DataLoader with no workers
    now, in a span of several passes, where keeping the workers suggested saves at least
    ``min_saving`` of the span on top of the count (what ``data.persistent_workers`` would find
    once the count is applied). A loader whose workers start at every pass already has that
    finding of its own: the two never count the same start-ups."""
    loader = ctx.loader
    if loader is None or not loader.takes_persistent or model.workers > 0 or workers <= 0 or model.passes < 2:
        return False
    wall = ctx.span.wall_s
    if wall <= 0:
        return False
    # on a GPU only the device's idle time can be saved: the gain is what keeping them adds
    # to the count's saving, both capped
    both = cap_by_device_idle(model.predict_saving_s(workers, persistent=True) / wall, ctx)
    alone = cap_by_device_idle(model.predict_saving_s(workers, persistent=False) / wall, ctx)
    return both - max(0.0, alone) >= ctx.config.min_saving


def _keep_workers_fix(model: LoopModel, workers: int, gain_s: float) -> str:
    """The fix's words for keeping ``workers`` for the run, which saves ``gain_s`` over the span."""
    each = gain_s / max(1, model.passes - 1)
    its = "its worker outlives" if workers == 1 else f"its {workers} workers outlive"
    return (
        f"Also set persistent_workers=True so {its} the epoch: without it each of the {model.passes} epochs here"
        f" starts {'the worker' if workers == 1 else 'them'} anew (about {fmt_ms(each)} each time, as modelled)."
        " The prediction is for both together."
    )


def _cold_step_ends(ctx: Context, model: LoopModel, suggested: int, keep: bool = False) -> list[float] | None:
    """The speedups with none of the cold-step cost's change and with ``COLD_STEP_SPREAD`` times
    it, where the change moves the step between starting cold and warm (on the CPU only); None
    where it does not. The run-to-run spread of that cost (0.17 to 0.71 ms over nine runs of the
    same step, ``loop_model``) is the range's reason."""
    if model.step_drag_s <= 0 or abs(model.cold_share(suggested) - model.drag_measured) < 0.05:
        return None
    if ctx.span.wall_s <= 0:
        return None
    # the larger cost, no larger than leaves the warm step at half the measured consumer (the
    # most ``build_loop_model`` takes off it)
    most = COLD_STEP_SPREAD
    if model.drag_measured > 0:
        most = min(most, 0.5 * model.consumer_s / (model.step_drag_s * model.drag_measured))
    ends = []
    for scale in (0.0, max(1.0, most)):
        other = replace(model, step_drag_s=model.step_drag_s * scale)
        saving = frac(cap_by_device_idle(other.predict_saving_s(suggested, persistent=keep) / ctx.span.wall_s, ctx))
        ends.append(round(speedup_for(saving), 3) if saving > 0 else 1.0)
    return ends


@dataclass(frozen=True)
class SharedCores:
    """How the workers and the training process share the cores, now and with the change."""

    #: cores' worth of work asked for per second of stepping: the training process, the workers,
    #: other processes
    demand_now: float
    demand_after: float
    #: cores other processes kept busy (0 when not sampled)
    others: float
    #: the predicted step over the step with the training process's own work slowed (or sped up)
    #: by the change in how over-subscribed the cores are: the other end of the range
    step_ratio: float


def _shared_cores(ctx: Context, model: LoopModel, suggested: int, predicted: float) -> SharedCores | None:
    """The other end of the estimate where the workers compete with the training step for the
    cores. The loop model packs the CPU work onto the cores perfectly; on over-subscribed cores
    each process gets ``cores / demand`` of what it asks for (the training process's threads
    counted whole while it steps: the step waits on them), and the step, measured at today's
    over-subscription, stretches (more workers) or shrinks (fewer) with the change's. Measured
    on 2-core hosts: 0 -> 2 workers predicted x1.92 and realized x1.38; in-memory tensors with
    workers -> 0 predicted x1.87 and realized x3.09. A model of the scheduler's fairness, not a
    measurement: the estimate keeps the step as the loop model has it, and the two ends make the
    range the realized speedup may land in (other processes' cores from the host sampler, where
    sampled). None when neither now nor the change over-subscribes the cores."""
    host = ctx.host_signals if ctx.host_signals is not None and ctx.host_signals.wall_s > 0 else None
    others = (host.others_cores or 0.0) if host is not None else 0.0
    cores = max(1, ctx.cores)

    def demand(workers: int, step_s: float) -> float:
        # the training process's threads while it steps (its critical path wants them all), the
        # workers' CPU work per second of stepping, and other processes'
        if step_s <= 0:
            return 0.0
        loading = min(float(workers), (model.load_cpu_s + model.transfer_worker_s) / step_s) if workers > 0 else 0.0
        return max(1, ctx.compute_threads) + loading + others

    now, after = demand(model.workers, model.step_s), demand(suggested, predicted)
    if host is not None and model.workers > 0:  # today's workers as the host sampler saw them
        now = max(now, max(1, ctx.compute_threads) + host.workers_cores + others)
    if now <= cores and after <= cores:
        return None
    # every process gets cores / demand of what it asks for where the cores are short: the step
    # stretched (or shrunk) by the change in over-subscription
    factor = max(1.0, after / cores) / max(1.0, now / cores)
    return SharedCores(now, after, others, 1 / factor)
