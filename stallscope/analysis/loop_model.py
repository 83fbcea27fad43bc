"""A what-if model of the input pipeline: how long a run would take with N loader workers.

The loop is a producer (the loader) and a consumer (everything the training process does per
step). Per step, in seconds:

    c   consumer time: the step minus its wait for data (compute, logging, checkpoints, ...)
    P   time one process needs to make one batch (wall), of which P_cpu is CPU
    m   CPU the training process burns per step besides loading (all its threads)
    K   cores this process may use
    x   cost of moving one batch from a worker to the training process (pickling, shared
        memory hand-over), paid on both sides; zero when the loader already has workers,
        since it is then inside the measured times

With N = 0 the two alternate: step = c + P. With N workers they overlap, and the step is set by
the slowest of three limits:

    step(N) = max(c + x,  (P + x) / N,  (m + P_cpu + 2x) / K)

the consumer itself, the workers' production rate, and the total CPU work spread over the cores.
The last term keeps the advice honest on small machines: past it, more workers only compete for
the same cores. Without ``persistent_workers`` every pass also pays a start-up: spawning the
workers, their first batch and their shutdown.

The constants below were measured on a 2-core x86-64 box with torch 2.13 (``benchmarks/whatif.py``
checks the predictions they make); they are conservative for larger machines.
"""

from __future__ import annotations

from dataclasses import dataclass

from stallscope.analysis.context import Context
from stallscope.timeline.phases import DATA

#: a loader counts as starved when the steady wait per step exceeds this share of the consumer time
STARVED_WAIT_RATIO = 0.10
#: fixed cost of handing one batch from a worker to the training process, seconds
TRANSFER_BASE_S = 0.2e-3
#: extra hand-over cost per tensor in the batch, seconds
TRANSFER_PER_TENSOR_S = 0.25e-3
#: tensors assumed per batch when they were not counted
DEFAULT_BATCH_TENSORS = 2
#: start-up plus shutdown of a pass with workers, besides its first batch: base + per worker
PASS_START_BASE_S = 0.015
PASS_START_PER_WORKER_S = 0.010


@dataclass(frozen=True)
class LoopModel:
    """Per-step costs of one span, in seconds."""

    #: steps the costs are averaged over
    steps: int
    #: passes over the loader in the span
    passes: int
    #: consumer time per step
    consumer_s: float
    #: steady-state wait per step (start-up waits excluded)
    wait_s: float
    #: wall time for one process to make one batch
    load_s: float
    #: CPU time for one process to make one batch
    load_cpu_s: float
    #: whether ``load_cpu_s`` was measured (in-process loading) or assumed equal to ``load_s``
    load_cpu_measured: bool
    #: CPU of the training process per step, loading excluded
    main_cpu_s: float
    #: workers the loader runs now
    workers: int
    #: cores this process may use
    cores: int
    #: worker-to-trainer hand-over cost per batch (0 when it is already measured)
    transfer_s: float
    #: measured start-up and shutdown of all passes in the span, seconds
    pass_overhead_s: float
    #: whether workers outlive a pass
    persistent: bool = False

    @property
    def step_s(self) -> float:
        """The measured steady-state step time."""
        return self.consumer_s + self.wait_s

    @property
    def starved(self) -> bool:
        return self.wait_s > STARVED_WAIT_RATIO * self.consumer_s

    @property
    def cpu_share_of_loading(self) -> float:
        """How much of making a batch is CPU work (1.0: CPU-bound, near 0: waiting on I/O)."""
        return min(1.0, self.load_cpu_s / self.load_s) if self.load_s > 0 else 1.0

    def predict_step_s(self, workers: int) -> float:
        """Steady-state step time with ``workers`` loader processes."""
        if workers <= 0:
            return self.consumer_s + self.load_s
        x = self.transfer_s
        return max(
            self.consumer_s + x,
            (self.load_s + x) / workers,
            (self.main_cpu_s + self.load_cpu_s + 2 * x) / self.cores,
        )

    def predict_pass_overhead_s(self, workers: int) -> float:
        """Start-up and shutdown of one pass with ``workers`` (non-persistent) workers, with
        the pass's first step (its first batch and its consumer time)."""
        if workers <= 0:
            return self.load_s + self.consumer_s
        return PASS_START_BASE_S + PASS_START_PER_WORKER_S * workers + self.load_s + self.consumer_s

    def predict_saving_s(self, workers: int) -> float:
        """Seconds the span would have saved with ``workers`` workers (negative: it would lose)."""
        now = self.steps * self.step_s + self.pass_overhead_s
        passes = max(1, self.passes)
        if self.persistent and workers > 0:
            after_overhead = self.predict_pass_overhead_s(workers) + (passes - 1) * (self.load_s + self.consumer_s)
        else:
            after_overhead = passes * self.predict_pass_overhead_s(workers)
        after = self.steps * self.predict_step_s(workers) + after_overhead
        return now - after

    def best_workers(self, cap: int) -> int:
        """The fewest workers (at most ``cap``) whose step time is within 3% of the best reachable."""
        cap = max(1, cap)
        best = min(self.predict_step_s(n) for n in range(1, cap + 1))
        for n in range(1, cap + 1):
            if self.predict_step_s(n) <= best * 1.03:
                return n
        return cap


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
    transfer_s = 0.0
    if workers == 0:
        load_s = wait_s
        tensors = ctx.batch_tensors if ctx.batch_tensors is not None else DEFAULT_BATCH_TENSORS
        transfer_s = TRANSFER_BASE_S + TRANSFER_PER_TENSOR_S * tensors
        if span.data_cpu_ns is not None:
            nexts = max(1, span.phase_counts.get(DATA, span.steps))
            load_cpu_s = min(load_s, span.data_cpu_ns / nexts / 1e9) if load_s > 0 else 0.0
            measured = True
            main_cpu_s = max(0.0, process_cpu_s - span.data_cpu_ns / max(1, span.steps) / 1e9)
        else:
            load_cpu_s, measured, main_cpu_s = load_s, False, process_cpu_s
    else:
        # with workers, a starved loop runs at their production rate: N batches per P seconds
        load_s = workers * (consumer_s + wait_s)
        load_cpu_s, measured, main_cpu_s = load_s, False, process_cpu_s
    pass_overhead_ns = sum(b.iter_ns + b.first_wait_ns + b.last_wait_ns for b in boundaries)
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
        transfer_s=transfer_s,
        pass_overhead_s=pass_overhead_ns / 1e9 + len(boundaries) * consumer_s,
        persistent=bool(ctx.loader.persistent_workers) if ctx.loader is not None else False,
    )
