"""How hard the loader's processes work: the CPU evidence behind ``data.cpu_bound`` / ``data.io_bound``.

With workers, the host sampler measures their CPU time: ``busy`` is their CPU time per batch
over the time one worker takes to make a batch (1.0: making a batch is all CPU work; near 0:
the workers wait on storage). Without workers, the timeline measures the CPU time of each
in-process ``next()`` directly, and the training thread's waits for a core (``demand``) tell
CPU work preempted by other processes from waiting on storage. The loop model
(``loop_model.py``) assumes a worker's batch costs as much CPU as wall time when it cannot
measure it; ``refined_model`` puts the measured share in instead.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from stallscope.analysis.context import Context
from stallscope.analysis.loop_model import LoopModel

#: the process tree counts as saturating the cores above this share of them
SATURATED = 0.85
#: worker CPU is read as the CPU share of making a batch only when the loop waits at least this
#: share of its consumer time: the workers then never idle (their queue is always empty)
CLEARLY_STARVED = 0.5


@dataclass(frozen=True)
class LoaderCpu:
    """CPU use of loading over a span."""

    #: share of loading time spent on a CPU, in [0, 1] (per worker, or per in-process next())
    busy: float
    #: where it was measured: ``workers`` (host sampler) or ``in_process`` (timeline)
    source: str
    #: share of the usable cores the whole process tree kept busy; None without the host sampler
    cores_busy: float | None
    #: CPU cores the training process and its workers used on average; None without the sampler
    main_cores: float | None
    workers_cores: float | None
    #: share of loading time on a CPU or runnable and waiting for one (``demand``); ``busy``
    #: where the waits were not measured
    demand: float


def loader_cpu(ctx: Context, model: LoopModel) -> LoaderCpu | None:
    """The CPU share of loading, or None when it was not measured."""
    host = ctx.host_signals
    cores_busy = host.cpu_busy_fraction if host is not None and host.wall_s > 0 else None
    main = host.main_cores if host is not None and host.wall_s > 0 else None
    workers = host.workers_cores if host is not None and host.wall_s > 0 else None
    if model.workers > 0:
        if host is None or host.wall_s <= 0 or workers is None or model.load_s <= 0 or ctx.span.steps <= 0:
            return None
        if model.wait_s < CLEARLY_STARVED * model.consumer_s:
            return None  # workers that keep up part of the time idle then: their CPU says little
        # CPU per batch over the time a worker takes per batch (making it and handing it over);
        # per batch, not per second of the span, so start-up and quiet stretches do not dilute it
        busy = min(1.0, host.workers_cpu_s / ctx.span.steps / (model.load_s + model.transfer_worker_s))
        return LoaderCpu(busy, "workers", cores_busy, main, workers, busy)
    if not model.load_cpu_measured or model.load_s <= 0:
        return None
    share = model.cpu_share_of_loading
    return LoaderCpu(share, "in_process", cores_busy, main, workers, demand(ctx, model))


def demand(ctx: Context, model: LoopModel) -> float:
    """The share of making a batch spent on a CPU or runnable and waiting for one: CPU work, by
    that measure, where other processes keep the cores busy. In-process loading runs on the
    training thread, so its CPU share counts with the thread's waits for a core per second it ran
    (the host sampler's, over the window); a worker's waits are not read, so with workers, and
    where the thread's were not read, it is the measured CPU share alone."""
    share = model.cpu_share_of_loading
    waits = thread_waits(ctx, model)
    return share if waits is None else min(1.0, share * (1.0 + waits))


def thread_waits(ctx: Context, model: LoopModel) -> float | None:
    """The training thread's waits for a core per second it ran, where the loading is its own (no
    workers) and the host sampler read them; None otherwise."""
    host = ctx.host_signals
    return host.thread_wait_per_cpu if host is not None and model.workers == 0 else None


def refine(ctx: Context, model: LoopModel) -> tuple[LoopModel, LoaderCpu | None]:
    """``model`` with the measured CPU share of loading put in, and that measurement (None, and
    the model unchanged, when it was not measured)."""
    cpu = loader_cpu(ctx, model)
    if cpu is not None and cpu.source == "workers" and model.load_source != "probe":
        model = replace(model, load_cpu_s=cpu.busy * model.load_s, load_cpu_measured=True)
    return model, cpu


def refined_model(ctx: Context) -> tuple[LoopModel, LoaderCpu] | None:
    """The loop model with the measured CPU share of loading; None when either is unknown."""
    model = ctx.loop_model
    if model is None:
        return None
    model, cpu = refine(ctx, model)
    return (model, cpu) if cpu is not None else None
