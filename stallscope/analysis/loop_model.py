"""A what-if model of the input pipeline: how long a run would take with N loader workers.

The loop is a producer (the loader) and a consumer (everything the training process does per
step). Per step, in seconds:

    c    consumer time: the step minus its wait for data (compute, logging, checkpoints, ...)
    P    time one process needs to make one batch (wall), of which P_cpu is CPU
    m    CPU the training process burns per step besides loading (all its threads)
    K    cores this process may use
    x_m  what receiving one batch from a worker costs the training process (unpickling it,
         receiving and mapping its shared memory), inside its ``next()``
    x_w  what handing one batch over costs the worker on top of making it (collating into
         shared memory, pickling, serving the file descriptors)

With N = 0 the two alternate: step = c + P. With N workers they overlap, and the step is set by
the slowest of three limits:

    step(N) = max(c + x_m + g u,  (P + x_w) / N,  (m + x_m + P_cpu + x_w) / K)

the consumer itself with its share of the hand-over, the workers' production rate, and the total
CPU work spread over the cores. The last term keeps the advice honest on small machines: past
it, more workers only compete for the same cores. Without ``persistent_workers`` every pass also
pays a start-up: spawning the workers, their first batch and their shutdown.

``g u`` is a wait inside the hand-over. torch passes each tensor of a batch from a worker as a
file descriptor (its default sharing strategy on Linux), which the training process fetches, one
round trip per tensor, from a thread of the worker that must take the worker's GIL. When the
worker is computing its next batch in Python, that takes up to ``sys.getswitchinterval()``
(5 ms): ``g`` is the batch's tensors times the interval, charged only where loading is measured
CPU work (a worker waiting on storage answers at once), and ``u`` is the share of the time a
worker is busy, ``(P + x_w) / (N step)``. ``g`` counts in full when the loop keeps the cores
busy, in proportion to the share it keeps busy otherwise: with a core free, the serving thread
gets the GIL the moment the worker's C code lets go of it; with none, it also waits for a core,
and the worker takes the GIL back first. On the 2-core box a starved loop of CPU-bound Python
loading with 2 workers ran 12 ms steps where the three limits alone gave 7.6 ms (9 ms with the
``file_system`` strategy, or a shorter switch interval in the workers); on a 16-core GPU host
the same kind of loading, with cores to spare, met the three limits within 3% to 12%.

The model predicts both ways. From ``num_workers=0`` it knows c, P and P_cpu (measured) and
estimates x_m and x_w from the batch's tensors and bytes (counted in each pass's first batch).
From N workers it knows c and the wait; x_m is estimated the same way and capped by the fastest
waits (a batch already queued still costs x_m); P comes, best first, from one batch of an
in-memory ``TensorDataset`` timed in-process at a pass start (``signals.loader.probe_batch_s``,
scaled by the training process's share of a core on a loaded host), or from the workers'
production rate (an upper bound: a loop bound by x_m leaves its workers idle part of the time).
When x_m + c exceeds c + P, fewer workers (down to none) win.

On the CPU the consumer itself changes with the workers. A step that follows other work of its
thread, or a pause, starts with cold caches and runs slower than one that follows at once. On the
2-core box a small MLP's step took a median 0.32 ms more CPU after a batch received from a worker
than after 0.25 ms of in-process indexing (0.17 to 0.71 ms over nine runs; 0.28 and 0.41 ms for
steps of 1.9 and 7 ms), and 0.4 to 0.5 ms more after 2 ms of in-process loading or of sleep than
after none. ``d`` (``step_drag_s``), ``COLD_STEP_BASE_S`` plus ``COLD_STEP_SHARE`` of the step,
is that cost in full; a batch from a worker (a receive that maps new memory, round trips that
sleep) pays it in full, in-process loading in proportion to its time P up to ``COLD_GAP_S``. So
dropping the workers of an in-memory dataset also speeds the step up, and adding them to brief
in-process loading slows it down. How much moves from run to run, so ``data.workers`` gives the
range from none of it to twice the median. On a GPU the host only queues the work: ``d`` is 0.

The constants below were measured on a 2-core x86-64 box with torch 2.13 (``benchmarks/handoff.py``
measures them, ``benchmarks/whatif.py`` checks the predictions they make; method and numbers in
``docs/predictions.md``, "Workers and the handoff").
"""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass
from typing import Any, Literal

from stallscope.analysis.context import Context
from stallscope.timeline.phases import DATA

#: a loader counts as starved when the steady wait per step exceeds this share of the consumer time
STARVED_WAIT_RATIO = 0.10
#: receiving one batch from a worker, in the training process: per batch, per tensor, per byte
MAIN_TRANSFER_BASE_S = 1.0e-3
MAIN_TRANSFER_PER_TENSOR_S = 0.15e-3
MAIN_TRANSFER_PER_BYTE_S = 0.15e-9
#: handing one batch over, in the worker, on top of making it: per batch, per tensor, per byte
WORKER_TRANSFER_BASE_S = 0.55e-3
WORKER_TRANSFER_PER_TENSOR_S = 0.17e-3
WORKER_TRANSFER_PER_BYTE_S = 0.8e-9
#: most the probe's in-process batch time is scaled up for a loaded host (wall over CPU time)
MAX_CONTENTION = 4.0
#: the least share of a core the training process is taken to get on a loaded host
MIN_HOST_SHARE = 0.1
#: tensors assumed per batch when they were not counted
DEFAULT_BATCH_TENSORS = 2
#: start-up plus shutdown of a pass with workers, besides its first batch: base + per worker
PASS_START_BASE_S = 0.015
PASS_START_PER_WORKER_S = 0.010
#: a CPU step after other work of its thread runs slower (cold caches): base + share of the step
COLD_STEP_BASE_S = 0.30e-3
COLD_STEP_SHARE = 0.015
#: in-process loading this long before each step leaves it as cold as a batch from a worker
COLD_GAP_S = 2.0e-3


def transfer_s(tensors: int | None, nbytes: int | None) -> tuple[float, float]:
    """(x_m, x_w): the estimated hand-over cost of one batch in the training process and in the
    worker, from its tensors and bytes (``DEFAULT_BATCH_TENSORS`` and no bytes when unknown)."""
    t = tensors if tensors is not None else DEFAULT_BATCH_TENSORS
    b = nbytes if nbytes is not None else 0
    main = MAIN_TRANSFER_BASE_S + MAIN_TRANSFER_PER_TENSOR_S * t + MAIN_TRANSFER_PER_BYTE_S * b
    worker = WORKER_TRANSFER_BASE_S + WORKER_TRANSFER_PER_TENSOR_S * t + WORKER_TRANSFER_PER_BYTE_S * b
    return main, worker


#: where ``LoopModel.load_s`` came from: ``in_process`` (timed ``next()`` calls, no workers),
#: ``probe`` (one batch built in-process at a pass start while workers ran), ``production``
#: (the workers' measured rate, less the hand-over: an upper bound when the loop is not starved)
LoadSource = Literal["in_process", "probe", "production"]


@dataclass(frozen=True)
class LoopModel:
    """Per-step costs of one span, in seconds."""

    #: steps the costs are averaged over
    steps: int
    #: passes over the loader in the span
    passes: int
    #: consumer time per step (data waits excluded, hence also the hand-over's x_m)
    consumer_s: float
    #: steady-state wait per step (start-up waits excluded)
    wait_s: float
    #: wall time for one process to make one batch, without the hand-over
    load_s: float
    #: CPU time for one process to make one batch
    load_cpu_s: float
    #: whether ``load_cpu_s`` was measured (in-process loading) or assumed equal to ``load_s``
    load_cpu_measured: bool
    #: CPU of the training process per step, loading and the hand-over excluded
    main_cpu_s: float
    #: workers the loader runs now
    workers: int
    #: cores this process may use
    cores: int
    #: hand-over of one batch from a worker: in the training process (x_m), in the worker (x_w)
    transfer_main_s: float
    transfer_worker_s: float
    #: measured start-up and shutdown of all passes in the span, seconds
    pass_overhead_s: float
    #: whether workers outlive a pass
    persistent: bool = False
    #: where ``load_s`` came from
    load_source: LoadSource = "in_process"
    #: g: the wait for the workers' GIL in one batch's hand-over when the worker is busy (its
    #: tensors times the switch interval); 0 when loading is not measured CPU work, or tensors
    #: do not travel as file descriptors
    gil_wait_s: float = 0.0
    #: d: what a step on the CPU runs slower when it starts cold (0 on a GPU)
    step_drag_s: float = 0.0
    #: the share of d the measured ``consumer_s`` includes (``cold_share`` of the span's loading)
    drag_measured: float = 0.0
    #: s: of the in-process wait per step, the time the training thread was neither on a CPU nor
    #: blocked beyond what its compute's pace explains, counted in ``consumer_s`` instead of
    #: ``load_s`` (``still_moved_s``)
    still_s: float = 0.0

    @property
    def step_s(self) -> float:
        """The measured steady-state step time."""
        return self.consumer_s + self.wait_s

    @property
    def measured_wait_s(self) -> float:
        """The wait per step as measured: ``wait_s`` with the host's share of it (``still_s``)."""
        return self.wait_s + self.still_s

    @property
    def starved(self) -> bool:
        return self.wait_s > STARVED_WAIT_RATIO * self.consumer_s

    @property
    def transfer_s(self) -> float:
        """The whole hand-over of one batch, both sides."""
        return self.transfer_main_s + self.transfer_worker_s

    @property
    def cpu_share_of_loading(self) -> float:
        """How much of making a batch is CPU work (1.0: CPU-bound, near 0: waiting on I/O)."""
        return min(1.0, self.load_cpu_s / self.load_s) if self.load_s > 0 else 1.0

    def cold_share(self, workers: int) -> float:
        """How cold each step starts with ``workers`` (``cold_share``): in-process, after the
        whole gap before it, the host's share (``still_s``) included."""
        return cold_share(workers, self.load_s + self.still_s)

    def consumer_at(self, workers: int) -> float:
        """The consumer time per step with ``workers``: the measured one with its share of d
        exchanged for the share it would have."""
        if self.step_drag_s <= 0:
            return self.consumer_s
        return self.consumer_s + self.step_drag_s * (self.cold_share(workers) - self.drag_measured)

    def predict_step_s(self, workers: int) -> float:
        """Steady-state step time with ``workers`` loader processes."""
        if workers <= 0:
            return self.consumer_at(0) + self.load_s
        xm, xw = self.transfer_main_s, self.transfer_worker_s
        consumer = self.consumer_at(workers) + xm
        production = (self.load_s + xw) / workers
        cores = self.cores_step_s
        g = self._gil_wait(max(consumer, production, cores))
        if g > 0:
            # step = c + x_m + g * production / step where the consumer sets the step: its root
            consumer = (consumer + math.sqrt(consumer * consumer + 4 * g * production)) / 2
        return max(consumer, production, cores)

    def _gil_wait(self, step_s: float) -> float:
        """g at a step of ``step_s`` (without the wait): in full when the loop keeps the cores
        busy, in proportion to the share it keeps busy otherwise. With a core free, the worker's
        serving thread runs the moment the worker lets go of its GIL (in C code that releases
        it); with none, it waits for a core too, and the worker takes the GIL back first."""
        if self.gil_wait_s <= 0 or step_s <= 0:
            return 0.0
        return self.gil_wait_s * min(1.0, self.cores_step_s / step_s)

    def gil_wait_at(self, workers: int) -> float:
        """The hand-over's expected wait for the workers' GIL per batch with ``workers``: g (as
        the cores' load scales it) times the share of the time a worker is busy."""
        if workers <= 0 or self.gil_wait_s <= 0:
            return 0.0
        step = self.predict_step_s(workers)
        if step <= 0:
            return 0.0
        busy = min(1.0, (self.load_s + self.transfer_worker_s) / workers / step)
        xm, xw = self.transfer_main_s, self.transfer_worker_s
        free = max(self.consumer_s + xm, (self.load_s + xw) / workers, self.cores_step_s)
        return self._gil_wait(free) * busy

    @property
    def cores_step_s(self) -> float:
        """The step time the cores alone allow with workers: all CPU work over the cores."""
        return (self.main_cpu_s + self.transfer_s + self.load_cpu_s) / self.cores

    def predict_pass_overhead_s(self, workers: int) -> float:
        """Start-up and shutdown of one pass with ``workers`` (non-persistent) workers, with
        the pass's first step (its first batch and its consumer time)."""
        consumer = self.consumer_at(workers)
        if workers <= 0:
            return self.load_s + consumer
        return PASS_START_BASE_S + PASS_START_PER_WORKER_S * workers + self.load_s + self.transfer_s + consumer

    def predict_saving_s(self, workers: int, *, persistent: bool | None = None) -> float:
        """Seconds the span would have saved with ``workers`` workers (negative: it would lose),
        persistent or not (``None``: as the loader is now)."""
        keep = self.persistent if persistent is None else persistent
        now = self.steps * self.step_s + self.pass_overhead_s
        passes = max(1, self.passes)
        # a later pass of persistent workers waits for its first batch, made and handed over
        later_pass = self.load_s + self.transfer_s + self.consumer_at(workers)
        if keep and workers > 0:
            after_overhead = self.predict_pass_overhead_s(workers) + (passes - 1) * later_pass
        else:
            after_overhead = passes * self.predict_pass_overhead_s(workers)
        if workers > 0 and self.workers > 0:
            # another count of workers still pays the start-up measured now (spawning, a slow
            # worker_init_fn): only none at all, or persistent workers, remove it; fewer workers
            # spawn fewer processes (one after another, in the training process): the measured
            # start-up less the modelled spawns removed. Workers made persistent start once: the
            # first pass keeps its share of it, a later pass only waits for its first batch
            fewer = max(0, self.workers - workers)
            if keep and not self.persistent:
                first = self.pass_overhead_s / passes - PASS_START_PER_WORKER_S * fewer
                kept = first + (passes - 1) * later_pass
            else:
                kept = self.pass_overhead_s - passes * PASS_START_PER_WORKER_S * fewer
            after_overhead = max(after_overhead, kept)
        after = self.steps * self.predict_step_s(workers) + after_overhead
        return now - after

    def best_workers(self, cap: int, *, lowest: int = 1) -> int:
        """The fewest workers (``lowest`` to ``cap``) whose step time is within 3% of the best
        reachable. ``lowest=0`` lets loading in the training process win."""
        cap = max(lowest, cap)
        counts = range(max(0, lowest), cap + 1)
        best = min(self.predict_step_s(n) for n in counts)
        for n in counts:
            if self.predict_step_s(n) <= best * 1.03:
                return n
        return cap


#: waits within this many times their 10th percentile are one cost paid each time (the hand-over),
#: not a loader that falls behind now and then
READY_SPREAD = 2.0


def batches_may_be_ready(ctx: Context, model: LoopModel) -> bool:
    """Whether the batches may simply be ready when the loop asks for them, so that neither more
    workers nor faster storage can be shown to help: in-memory tensors behind a dataset class of
    the user's own (its ``__getitem__`` is not run to time a batch, so ``load_s`` is only the
    workers' rate, an upper bound), and waits that are the hand-over alone: the mean no longer
    than the hand-over's estimate, and no more than ``READY_SPREAD`` times the fastest waits (a
    loader that falls behind leaves some waits far longer than others, whatever it holds in
    memory). Workers that spend little CPU there may be idle for being ahead."""
    if model.workers == 0 or model.load_source != "production" or ctx.loader is None:
        return False
    if ctx.loader.in_memory is None or ctx.span.data_wait.n == 0:
        return False
    handover_s, _ = transfer_s(ctx.batch_tensors, ctx.batch_bytes)
    fastest_s = ctx.span.data_wait.p10
    return model.wait_s <= min(handover_s, READY_SPREAD * fastest_s)


def build_loop_model(ctx: Context) -> LoopModel | None:
    """Estimate the model's costs from a span; None when the span has too few steps."""
    span = ctx.span
    boundaries = span.boundaries
    steady_steps = span.steps - len(boundaries)
    if span.steps < 4 or steady_steps < 2:
        return None
    data_ns = span.phase_ns.get(DATA, 0)
    # waits inside steps: all data time except iter() calls and epoch-ending next() calls
    step_wait_ns = data_ns - sum(b.iter_ns + b.last_wait_ns for b in boundaries)
    consumer_s = max(0.0, (span.step_total_ns - step_wait_ns) / span.steps / 1e9)
    steady_wait_ns = max(0, step_wait_ns - sum(b.first_wait_ns for b in boundaries))
    wait_s = steady_wait_ns / steady_steps / 1e9
    workers = ctx.loader.num_workers if ctx.loader is not None else 0
    process_cpu_s = span.process_cpu_ns / max(1, span.steps) / 1e9
    x_main, x_worker = transfer_s(ctx.batch_tensors, ctx.batch_bytes)
    source: LoadSource = "in_process"
    if workers == 0:
        load_s = wait_s
        if span.data_cpu_ns is not None:
            nexts = max(1, span.phase_counts.get(DATA, span.steps))
            load_cpu_s = min(load_s, span.data_cpu_ns / nexts / 1e9) if load_s > 0 else 0.0
            measured = True
            main_cpu_s = max(0.0, process_cpu_s - span.data_cpu_ns / max(1, span.steps) / 1e9)
        else:
            load_cpu_s, measured, main_cpu_s = load_s, False, process_cpu_s
    else:
        # every next() pays x_m, even for a batch already queued: the fastest waits bound it
        if span.data_wait.n > 0:
            x_main = min(x_main, span.data_wait.p10)
        x_main = min(x_main, wait_s)
        main_cpu_s = max(0.0, process_cpu_s - x_main)
        # a starved loop runs at the workers' production rate: N batches per N x step seconds,
        # each costing a worker P + x_w; a loop bound by x_m does not, so this is an upper bound
        production_s = max(0.0, workers * (consumer_s + wait_s) - x_worker)
        if ctx.in_process_batch_s is not None:
            # the probe ran for a few milliseconds, rarely preempted; in the loop the training
            # process gets the share of a core the host leaves it: its busy wall time per step
            # over its CPU time (at least 1) scales the probe to that share
            busy_wall_s = consumer_s + x_main
            share = min(MAX_CONTENTION, busy_wall_s / process_cpu_s) if process_cpu_s > 0 else 1.0
            load_s, source = min(ctx.in_process_batch_s * max(1.0, share), production_s), "probe"
            load_cpu_s, measured = load_s, True  # an in-memory batch is CPU work
        else:
            load_s, source = production_s, "production"
            load_cpu_s, measured = load_s, False
    still_s = 0.0
    if workers == 0 and measured and span.data_still_ns:
        still_s = still_moved_s(
            ctx,
            span.data_still_ns / max(1, span.phase_counts.get(DATA, span.steps)) / 1e9,
            load_s,
            load_cpu_s,
            main_cpu_s,
            consumer_s,
        )
        # the loop waits for the host, not for the batch: the consumer's time, whichever the loader
        load_s, consumer_s = load_s - still_s, consumer_s + still_s
        wait_s = load_s
    if workers == 0 and measured and load_cpu_s > 0:
        # The hand-over's constants were measured on a quiet host. Where other processes keep the
        # cores busy, the training process gets only a share of a core (its compute's CPU time
        # over its wall time): receiving a batch from a worker, CPU work in that process, would
        # take as much longer, and a worker on the same cores would hand its batches over as
        # much more slowly. No more than the loading itself was slowed (its wall time over its
        # CPU time): on a quiet host whose steps also wait (a logger, a save), loading that is
        # CPU work shows that nothing took the cores.
        stretch = min(1.0 / host_share(ctx, main_cpu_s, consumer_s), load_s / load_cpu_s)
        if stretch > 1.0:
            x_main, x_worker = x_main * stretch, x_worker * stretch
    pass_overhead_ns = sum(b.iter_ns + b.first_wait_ns + b.last_wait_ns for b in boundaries)
    # a worker busy in Python makes each tensor's file-descriptor hand-over wait for its GIL
    cpu_work = measured and load_s > 0 and load_cpu_s >= 0.5 * load_s
    tensors = ctx.batch_tensors if ctx.batch_tensors is not None else DEFAULT_BATCH_TENSORS
    gil_wait = tensors * sys.getswitchinterval() if cpu_work and _tensors_as_descriptors() else 0.0
    # a step on the CPU starts cold after a batch from a worker or long in-process loading: d
    cold = cold_share(workers, load_s + still_s)
    drag = 0.0
    if ctx.cuda_device is None and ctx.cuda is None:
        hot = max(0.5 * consumer_s, (consumer_s - COLD_STEP_BASE_S * cold) / (1 + COLD_STEP_SHARE * cold))
        drag = (consumer_s - hot) / cold if cold > 0 else COLD_STEP_BASE_S + COLD_STEP_SHARE * hot
    # the first batch of each pass is counted in the start-up, not in the steady steps
    return LoopModel(
        steps=steady_steps,
        passes=len(boundaries),
        consumer_s=consumer_s,
        wait_s=wait_s,
        load_s=load_s,
        load_cpu_s=load_cpu_s,
        load_cpu_measured=measured,
        main_cpu_s=main_cpu_s,
        workers=workers,
        cores=ctx.cores,
        transfer_main_s=x_main,
        transfer_worker_s=x_worker,
        pass_overhead_s=pass_overhead_ns / 1e9 + len(boundaries) * consumer_s,
        persistent=bool(ctx.loader.persistent_workers) if ctx.loader is not None else False,
        load_source=source,
        gil_wait_s=gil_wait,
        step_drag_s=drag,
        drag_measured=cold if drag > 0 else 0.0,
        still_s=still_s,
    )


def still_moved_s(
    ctx: Context, still_s: float, load_s: float, load_cpu_s: float, main_cpu_s: float, consumer_s: float
) -> float:
    """s: the part of in-process loading's time per batch that a loader worker would not take off
    the training thread. A wait for a batch in which the thread made no voluntary context switch
    did not wait on storage (a read that waits blocks, and gives up the core); what of it was not
    on a CPU either (``still_s``, measured: ``SpanStats.data_still_ns``) was the host's: a
    preemption, or a busy VM taking the core. The share of it the loading's own CPU time explains
    at the pace the compute ran (its CPU time over its wall time: a thread preempted that often
    while it loads as while it computes) moves with the work; the rest falls on whatever the thread
    does after its compute, a batch received from a worker as much as one made in-process. Beside
    four CPU-bound processes on the 2-core VM, a healthy loop's in-memory batches took 0.4 ms of
    CPU and 4 to 10 ms of wall time, none of their waits blocked, and one worker made the loop 17%
    slower; the same loop waiting 0.2 ms a sample on storage blocked in every wait."""
    off_cpu_s = max(0.0, load_s - load_cpu_s)
    if still_s <= 0 or off_cpu_s <= 0:
        return 0.0
    share = host_share(ctx, main_cpu_s, consumer_s)
    paced_s = load_cpu_s * (1.0 / share - 1.0)
    return min(off_cpu_s, max(0.0, still_s - paced_s))


def cold_share(workers: int, load_s: float) -> float:
    """How cold each step starts, as a share of d: in full after a batch from a worker, in
    proportion to the in-process loading's time ``load_s`` before it, up to ``COLD_GAP_S``."""
    return 1.0 if workers > 0 else min(1.0, load_s / COLD_GAP_S)


def host_share(ctx: Context, main_cpu_s: float, consumer_s: float) -> float:
    """The share of a core the training process got while it computed, when the compute runs on
    the CPU (its CPU time over its wall time, at least ``MIN_HOST_SHARE``; 1.0 on a GPU, where the
    host also waits on the device). On a host shared with other jobs, CPU-bound loading gets no
    more than this share either, so it is not mistaken for loading that waits on storage."""
    if ctx.cuda_device is not None or ctx.cuda is not None or consumer_s <= 0:
        return 1.0
    return min(1.0, max(MIN_HOST_SHARE, main_cpu_s / consumer_s))


def _tensors_as_descriptors() -> bool:
    """Whether torch hands tensors between processes as file descriptors (the default on Linux;
    ``file_system`` passes names of shared-memory files instead, with no round trip)."""
    torch: Any = sys.modules.get("torch")
    if torch is None:
        return False
    try:
        return bool(torch.multiprocessing.get_sharing_strategy() == "file_descriptor")
    except Exception:
        return False
