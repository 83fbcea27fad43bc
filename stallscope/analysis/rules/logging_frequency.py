"""``logging.frequency``: logging or metric syncing blocks training; log less often, or off the
training thread.

Two levers, chosen by what one call costs:

* **Many cheap calls** (each under ``BLOCKING_CALL_S``): log every ``K`` steps, ``K`` the round
  interval at which logging takes the target share; in Lightning at most the fit's steps
  (``log_every_n_steps`` longer than the fit logs no step at all). Lightning also logs at each
  epoch's end whatever the interval: those calls stay in the prediction. The prediction counts
  only the calls removed (a floor).
* **Calls that block** (each ``BLOCKING_CALL_S`` or longer, and the process idle for at least
  half of the logging time: a logger waiting for a server or a disk, not computing): hand each
  call to a background thread (``"async_logging": true``): in Lightning, the logger wrapped so
  that ``log_metrics`` puts the metrics on a queue that a thread drains; in a plain loop, a
  queue and a thread, or ``logging.handlers.QueueHandler`` for the standard library's logging.
  Every step is still logged. The prediction: each call then costs the hand-off,
  ``HANDOFF_S``, on the training thread, and the rest of it, the wait, moves off it. The thread
  makes the calls one after another, so it must keep up: a logger slower than the steps would
  fall behind, and the run's end would wait for it. So the suggestion also logs every ``K``
  steps when a call takes longer than a step (``K`` = call / step rounded up to 1, 2, 5, 10,
  ...), or when even the hand-offs would take more than the target share. The call's own CPU
  work still needs the GIL: where it was measured (Lightning's logger calls, a plain loop's
  ``logging`` phase: ``signals.calls``) it stays on the training thread in the prediction,
  which then counts only the wait removed. That is a floor (steps that run faster once the
  thread no longer sleeps between them are not counted) where the wait is surely the loop's to
  lose: on the CPU as the accelerator, with cores to spare (``_wait_is_removable``). Otherwise,
  or unmeasured, an estimate.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from stallscope.analysis.context import Context
from stallscope.analysis.finding import Finding, SpeedupBound, speedup_for
from stallscope.analysis.numbers import every as every_n
from stallscope.analysis.numbers import nice_ceil
from stallscope.analysis.rules._frequency import FrequencyEstimate, estimate, runs_every, steps_in_fit, training_time
from stallscope.timeline.phases import LOGGING

ID = "logging.frequency"

#: a logging call this long or longer waits on something (a server, a disk): it blocks on I/O
BLOCKING_CALL_S = 1e-3
#: ... and the process was idle for at least this share of the logging time: the calls wait
WAITING_SHARE = 0.5
#: what a call handed to a background thread still costs the training thread: a ``queue.put`` of
#: the metrics (the logger scenarios of ``examples/`` measured about 10 us a call on a 2-core
#: x86-64 host; twice that here, for slower hosts and bigger metrics dicts)
HANDOFF_S = 20e-6
#: the background thread is kept busy at most this share of the time (a call every
#: ``log_every_n_steps`` steps): one that calls a logger nearly as slow as the steps falls behind
#: on a host whose sleeps and scheduling jitter, and the run then waits for it to catch up
THREAD_BUSY_MAX = 0.8
#: cores busier than this share of the machine's (this process tree and others together): a
#: call's time off the CPU may then be time waiting for a core, which no thread takes away
SATURATED_SHARE = 0.9


def _interval_finding(ctx: Context, est: FrequencyEstimate) -> Finding | None:
    """Log less often: ``log_every_n_steps``. In Lightning, only an interval longer than the
    Trainer's own (the calls at each epoch's end made the calls look more frequent than it)."""
    lightning = ctx.config.framework == "lightning"
    total = steps_in_fit(ctx)
    if ctx.config.framework == "transformers" and ctx.shape is not None:
        total = ctx.shape.total_steps  # the Trainer's state.max_steps
    k = est.interval if total is None else max(1, min(est.interval, total))
    setting = ctx.shape.log_every_n_steps if lightning and ctx.shape is not None else None
    if setting is not None and k <= setting:
        return None  # the Trainer already logs this seldom: the calls left are not the setting's
    runs_after = runs_every(ctx.steps_before, ctx.span.steps, k)
    if lightning:
        runs_after += ctx.span.epochs  # the epoch-end logging, which log_every_n_steps does not change
    saving = est.saving_for(min(runs_after, est.count))
    if saving <= 0:
        return None
    every = f"every {k} steps (about every {training_time(k * est.step_without_s)} of training)"
    if lightning:
        now = every_n(setting if setting is not None else est.interval_now, "step")
        fix = f"Log {every} instead of {now}: Trainer(log_every_n_steps={k})."
        snippet = f"Trainer(log_every_n_steps={k})"
    else:
        fix = f"Log {every} instead of {every_n(est.interval_now, 'step')}."
        observed = (ctx.run_span or ctx.span).steps
        if k > observed:
            fix += f" The {observed} steps seen so far are fewer than {k}: a run this long would log no step."
        snippet = f"if step % {k} == 0:\n    log(loss.item())"
    return _finding(est, saving, {"log_every_n_steps": k}, fix, snippet, runs_after, _bound(est, "lower"))


_LIGHTNING_SNIPPET = """\
class BackgroundLogger(Logger):  # from lightning.pytorch.loggers
    def __init__(self, inner):
        super().__init__()
        self.inner, self.queue = inner, queue.Queue()
        self.thread = threading.Thread(target=self._drain, daemon=True)
        self.thread.start()
    # what Lightning reads from a logger (checkpoint paths, trainer.log_dir, the progress bar)
    name = property(lambda self: self.inner.name)
    version = property(lambda self: self.inner.version)
    save_dir = property(lambda self: self.inner.save_dir)
    root_dir = property(lambda self: self.inner.root_dir)
    log_dir = property(lambda self: self.inner.log_dir)
    experiment = property(lambda self: self.inner.experiment)
    def log_hyperparams(self, *args, **kwargs):
        self.inner.log_hyperparams(*args, **kwargs)
    def log_graph(self, *args, **kwargs):
        self.inner.log_graph(*args, **kwargs)
    def after_save_checkpoint(self, checkpoint_callback):
        self.inner.after_save_checkpoint(checkpoint_callback)
    def log_metrics(self, metrics, step=None):
        self.queue.put((dict(metrics), step))  # the training thread waits no more
    def _drain(self):
        while (item := self.queue.get()) is not None:
            self.inner.log_metrics(*item)
    def finalize(self, status):
        if self.thread.is_alive():
            self.queue.put(None)
            self.thread.join()  # everything is logged before the fit ends
        self.inner.finalize(status)

Trainer(logger=BackgroundLogger(your_logger){every})"""

_PLAIN_SNIPPET = """\
calls = queue.Queue()
def drain():
    while (item := calls.get()) is not None:
        log(*item)
writer = threading.Thread(target=drain)
writer.start()
...
{guard}calls.put((step, loss.item()))  # instead of log(step, loss.item())
...
calls.put(None); writer.join()  # after the loop: the last calls are logged"""


def _async_finding(ctx: Context, est: FrequencyEstimate) -> Finding | None:
    """Log off the training thread: ``async_logging``, and a longer interval when the thread
    would be busy more than ``THREAD_BUSY_MAX`` of the time or even the hand-offs would take more
    than the target share."""
    lightning = ctx.config.framework == "lightning"
    # the hand-offs within the target share, and the thread busy at most THREAD_BUSY_MAX of the time
    needed = max(
        HANDOFF_S / (ctx.config.logging_target_share * est.step_without_s),
        est.each_s / (THREAD_BUSY_MAX * est.step_without_s),
    )
    k = nice_ceil(needed)
    suggestion: dict[str, Any] = {"async_logging": True}
    runs_after = est.count
    every = ""
    if k > math.ceil(est.interval_now - 1e-9):  # the run's own interval, less its epoch-end calls
        suggestion["log_every_n_steps"] = k
        runs_after = runs_every(ctx.steps_before, ctx.span.steps, k) + (ctx.span.epochs if lightning else 0)
        runs_after = min(runs_after, est.count)
        every = f", log_every_n_steps={k}"
    calls = ctx.logging_calls
    # the call's own CPU work, where measured, stays on the training thread (the GIL): the wait
    # alone is removed, and where that wait is surely the thread's to lose, the prediction is a floor
    cpu_s = est.each_s * calls.cpu_share if calls is not None else 0.0
    saving = est.saving_for(runs_after, HANDOFF_S + cpu_s)
    if saving <= 0:
        return None
    wait = f"Each logging call waits {est.each_s * 1e3:.1f} ms (on a server or a disk)"
    if lightning:
        fix = (
            f"{wait}: hand the metrics to a background thread, so training goes on while the logger waits:"
            " wrap the Trainer's logger so that log_metrics puts them on a queue that a thread drains."
        )
    else:
        fix = (
            f"{wait}: hand each call to a background thread, so training goes on while it waits: a queue and a"
            " thread (or logging.handlers.QueueHandler with a QueueListener for the standard library's logging)."
        )
    if "log_every_n_steps" in suggestion:
        fix += (
            f" And log every {k} steps, so that the thread keeps up with the steps with time to spare and the"
            " hand-offs stay"
            f" under {ctx.config.logging_target_share:.0%} of the time."
        )
    else:
        fix += " Every step is still logged."
    kept = f" and the call's own CPU work ({cpu_s * 1e3:.2f} ms a call, measured)" if calls is not None else ""
    fix += (
        f" The prediction keeps {HANDOFF_S * 1e6:.0f} us a call for the hand-off{kept} on the training thread."
        f" Logging less often would do it too (every {est.interval} steps), with fewer points logged."
    )
    if lightning:
        snippet = _LIGHTNING_SNIPPET.format(every=every)
    else:
        guard = f"if step % {k} == 0:\n    " if "log_every_n_steps" in suggestion else ""
        snippet = _PLAIN_SNIPPET.format(guard=guard)
    bound = _bound(est, "lower" if _wait_is_removable(ctx) else "estimate")
    measured: dict[str, float] = {"call_cpu_share": round(calls.cpu_share, 4)} if calls is not None else {}
    cores = busy_cores(ctx)
    if cores is not None:
        measured.update(busy_cores=round(cores[0], 2), machine_cores=cores[1])
    return _finding(est, saving, suggestion, fix, snippet, runs_after, bound, **measured)


def _finding(
    est: FrequencyEstimate,
    saving: float,
    suggestion: dict[str, Any],
    fix: str,
    snippet: str,
    runs_after: int,
    bound: SpeedupBound,
    **evidence: float,
) -> Finding:
    return Finding(
        id=ID,
        title=f"Logging blocks training {est.share_now:.0%} of the time ({est.each_s * 1e3:.1f} ms per call)",
        est_saving_fraction=saving,
        est_speedup=round(speedup_for(saving), 3),
        confidence="high",
        evidence={
            **est.evidence(),
            "calls_after": runs_after,
            "blocking_calls": "async_logging" in suggestion,
            **evidence,
        },
        fix=fix,
        suggestion=suggestion,
        snippet=snippet,
        est_speedup_bound=bound,  # fewer calls, or only the waits moved off, removes work
    )


def _bound(est: FrequencyEstimate, bound: SpeedupBound) -> SpeedupBound:
    """A floor only for the calls removed: a slowdown of the steps after each call
    (``slower_after_each_ms``) may be another source's that falls near the calls (an epoch's
    start, another callback's thread), so a saving that counts it is an estimate."""
    return bound if est.after_s <= 0 else "estimate"


def rule(ctx: Context) -> Finding | None:
    est = estimate(ctx, LOGGING, ctx.config.logging_target_share)
    if est is None:
        return None
    # the steps after a logging call billed at most as much again as the call itself: a slower
    # stretch beyond that is not the call's doing (logging measured 0 where nothing else ran)
    est = dataclasses.replace(est, after_s=min(est.after_s, est.each_s))
    if waits(ctx, est):  # each call waits: the wait can move off the training thread
        return _async_finding(ctx, est)
    return _interval_finding(ctx, est)


def _wait_is_removable(ctx: Context) -> bool:
    """Whether the measured calls' time off the CPU is waiting that a background thread surely
    takes away from the training loop, so that the prediction is a floor: the calls were measured,
    the accelerator is the CPU itself (on a GPU the wait may overlap the device's own work, or be
    a synchronisation with it that stays with the loss's ``.item()``), and the cores were not
    saturated (a thread ready to run but given no core looks like waiting too)."""
    if ctx.logging_calls is None:
        return False
    if ctx.cuda_device is not None or ctx.cuda is not None or ctx.nvml is not None:
        return False
    cores = busy_cores(ctx)
    return cores is not None and cores[0] < SATURATED_SHARE * cores[1]


def busy_cores(ctx: Context) -> tuple[float, int] | None:
    """(cores busy on average: this process tree's and other processes', the machine's cores)
    over the span, from the host sampler; None when it took no sample."""
    host = ctx.host_signals
    if host is None or host.wall_s <= 0:
        return None
    return host.main_cores + host.workers_cores + (host.others_cores or 0.0), host.machine_cores or host.cores


def waits(ctx: Context, est: FrequencyEstimate) -> bool:
    """Whether the logging calls block on I/O: each is long (``BLOCKING_CALL_S`` or more), and
    they mostly wait, not compute: the process's CPU in them is at most half of their time where
    it was measured (``ctx.logging_calls``), else the process was idle for at least half of the
    logging time (its CPU time over the span is at most the span's wall time less half the
    logging time)."""
    if est.each_s < BLOCKING_CALL_S:
        return False
    calls = ctx.logging_calls
    if calls is not None:
        return calls.cpu_share <= 1 - WAITING_SHARE
    span = ctx.span
    idle_ns = span.wall_ns - span.process_cpu_ns
    return idle_ns >= WAITING_SHARE * span.phase_ns.get(LOGGING, 0)
