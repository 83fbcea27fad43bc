"""Each training step's forward pass, timed apart from the collectives (SPEC §3a).

Ranks of a DDP job meet in the gradient all-reduce inside backward: a rank that gets there first
waits for the last one, inside its ``compute`` phase. So a rank whose own compute is slower (more
work per step, a slower device) shows the same ``compute`` per step as the ranks waiting for it.
The forward pass meets no collective (``SyncBatchNorm`` aside): its time is the rank's own work,
and ranks of even work spend about the same in it. ``analysis/job.py`` compares it across ranks.

Finding the forward pass without the user's help
    ``torch.nn.modules.module.register_module_forward_pre_hook`` (public) sees every module call
    until the first call of a ``DistributedDataParallel``; then hooks go on the module it wraps
    alone (DDP's own forward may broadcast buffers, a collective) and the global one is removed.
    A run whose first epoch ends without one removes it then, so a model without DDP pays for it
    during one epoch at most. Lightning's ``ddp`` strategy wraps the
    LightningModule in DDP and calls it for each ``training_step``: the same hooks see it.
    Only forwards in training mode count (Lightning's validation goes through DDP too, after
    ``eval()``); two forwards in one step count as that step's forward time together.

Timing
    On the CPU, the calling thread's CPU time (injected: ``time.thread_time_ns``): a forward's own
    work, which other processes on a busy machine do not inflate (wall time did, by 2x, on a loaded
    2-core machine, where alike ranks then looked uneven), nor the process's other threads (the
    process's CPU time counted gloo's and StallScope's threads, which blurred forwards of 0.1 ms).
    With several intra-op threads the training thread does its share of each forward, so ranks of
    the same settings still compare. On CUDA, a pair of events recorded on the current stream at
    the forward's start and end; they are read at epoch ends once complete (``query``), never
    waited for: nothing synchronises. Events still pending at an epoch end count in the next one.
    The event factory is injected (``tests/test_signals_forward.py`` drives fakes).

The training thread's own work a step (CPU clock only)
    The forward is a cut that every rank's work goes through, but it is not all of a rank's own
    work: the backward, the optimizer, a metric or a second pass outside the DDP module are too,
    and on a small model the step's time may go mostly to the all-reduce, which is not a rank's
    own work at all. On the CPU the same clock read at each forward's start gives the training
    thread's CPU time from one forward to the next (a *cycle*): its own work in between, the
    forward, backward and optimizer included, and not its waits, which block in the collective
    without using the CPU (gloo and NCCL wait on a condition, they do not spin). Cycles that run
    through an epoch's end or a validation (an evaluation-mode forward) are not counted; of the
    rest, those over ``CYCLE_OUTLIER`` times the median (a checkpoint saved, a first step's
    warm-up) are left out of the per-step figure. ``analysis/job.py`` takes a compute
    straggler's extra work from it. A busy machine stretches work in wall time beyond its CPU
    time: each forward is also timed on the wall clock (``wall``), and the ratio of the two
    (``stretch``, 1 on a quiet machine) turns the cycle into the wall time it takes there.
"""

from __future__ import annotations

import sys
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol, cast

#: most forward durations kept per span for the percentiles (the mean counts them all)
MAX_SAMPLES = 2048
#: most forwards whose CUDA events wait to be read (later ones are not timed until some are)
MAX_PENDING = 4096
#: a cycle over this many times the median cycle is left out of the per-step figure
CYCLE_OUTLIER = 4.0


class Event(Protocol):
    """The part of ``torch.cuda.Event`` the timer uses."""

    def record(self) -> None: ...

    def query(self) -> bool: ...

    def elapsed_time(self, end: Any) -> float: ...


@dataclass(frozen=True)
class ForwardStats:
    """A span's forward passes: how many, their total time, and the spread of one pass."""

    calls: int
    total_s: float
    #: one pass's duration: p10, p50, p90 (seconds), over the kept samples
    p10_s: float
    p50_s: float
    p90_s: float
    #: ``cpu_time`` (the training thread's CPU time) or ``cuda_events`` (device time)
    source: str
    #: the training thread's CPU time from one forward's start to the next (module docstring),
    #: the mean of the cycles counted, outliers left out; None where not measured (CUDA, or
    #: fewer than two forwards in a row)
    cycle_s: float | None = None
    #: the forwards' wall time over their CPU time (at least 1); None where not measured
    stretch: float | None = None

    def to_dict(self, steps: int) -> dict[str, float | int | str]:
        """As ``ranks[].forward_ms`` holds it: per step (``steps`` of the span) and per pass;
        ``cycle_per_step``: the training thread's own work a step (CPU time), where measured."""
        out: dict[str, float | int | str] = {
            "per_step": round(self.total_s / steps * 1e3, 4) if steps > 0 else 0.0,
            "calls": self.calls,
            "p10": round(self.p10_s * 1e3, 4),
            "p50": round(self.p50_s * 1e3, 4),
            "p90": round(self.p90_s * 1e3, 4),
            "source": self.source,
        }
        if self.cycle_s is not None and steps > 0:
            out["cycle_per_step"] = round(self.cycle_s * self.calls / steps * 1e3, 4)
        if self.stretch is not None:
            out["stretch"] = round(self.stretch, 4)
        return out


def _quantile(ordered: list[float], q: float) -> float:
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))] if ordered else 0.0


def _typical_cycle(cycles: list[float]) -> float | None:
    """The mean cycle, those over ``CYCLE_OUTLIER`` times the median left out."""
    if not cycles:
        return None
    bound = CYCLE_OUTLIER * _quantile(sorted(cycles), 0.5)
    kept = [c for c in cycles if c <= bound]
    return sum(kept) / len(kept) if kept else None


class _Span:
    """Durations summed and sampled over one span, and its cycles (sampled)."""

    def __init__(self) -> None:
        self.calls = 0
        self.total_s = 0.0
        self.samples: deque[float] = deque(maxlen=MAX_SAMPLES)
        self.cycles: deque[float] = deque(maxlen=MAX_SAMPLES)
        #: cycles ever appended to the run's span (``cycles`` keeps the latest ``MAX_SAMPLES``;
        #: ``mark`` reads it)
        self.cycles_added = 0
        #: the forwards' wall time, where the CPU clock timed them
        self.wall_s = 0.0

    def add(self, seconds: float, wall_s: float = 0.0) -> None:
        self.calls += 1
        self.total_s += seconds
        self.samples.append(seconds)
        self.wall_s += wall_s

    def mark(self) -> tuple[int, float, float, int]:
        """Where the span is now (``stats(as_of=...)``): a few numbers, not a copy."""
        return (self.calls, self.total_s, self.wall_s, self.cycles_added)

    def stats(self, source: str, as_of: tuple[int, float, float, int] | None = None) -> ForwardStats | None:
        """The span's statistics; ``as_of``: as of a ``mark`` (the count and the totals then; the
        samples then, less the oldest ones the window has dropped since, or the window as it is
        when it holds none of them)."""
        calls, total_s, wall_s = self.calls, self.total_s, self.wall_s
        samples, cycles = list(self.samples), list(self.cycles)
        if as_of is not None:
            calls, total_s, wall_s = as_of[0], as_of[1], as_of[2]
            # the samples of then still in the window; all of it when it moved past them (a
            # report read well after the mark: a SIGTERM mid-epoch), rather than none
            samples = samples[: max(0, len(samples) - (self.calls - calls))] or samples
            cycles = cycles[: max(0, len(cycles) - (self.cycles_added - as_of[3]))] or cycles
        if calls == 0:
            return None
        ordered = sorted(samples)
        return ForwardStats(
            calls=calls,
            total_s=total_s,
            p10_s=_quantile(ordered, 0.1),
            p50_s=_quantile(ordered, 0.5),
            p90_s=_quantile(ordered, 0.9),
            source=source,
            cycle_s=_typical_cycle(cycles),
            stretch=max(1.0, wall_s / total_s) if wall_s > 0 and total_s > 0 else None,
        )


class ForwardTimer:
    """Times a module's forward passes (``begin`` / ``end``, called by its hooks): CPU time with
    ``clock``, or device time with ``event`` (a factory of CUDA events) when given."""

    def __init__(
        self,
        *,
        clock: Callable[[], int] = time.thread_time_ns,
        wall: Callable[[], int] = time.perf_counter_ns,
        event: Callable[[], Event] | None = None,
    ) -> None:
        self._clock = clock
        self._wall = wall
        self._wall_started = 0
        self._event = event
        self.source = "cuda_events" if event is not None else "cpu_time"
        self._started: int | None = None
        #: the clock at the latest forward's start, for the cycle (None: the next start begins one)
        self._cycle_from: int | None = None
        self._start_event: Event | None = None
        self._pending: deque[tuple[Event, Event]] = deque()
        self._epoch = _Span()
        self._run = _Span()

    def begin(self) -> None:
        if self._event is None:
            now = self._started = self._clock()
            self._wall_started = self._wall()
            if self._cycle_from is not None and now >= self._cycle_from:
                cycle = (now - self._cycle_from) / 1e9
                self._epoch.cycles.append(cycle)
                run = self._run
                run.cycles.append(cycle)
                run.cycles_added += 1
            self._cycle_from = now
        elif len(self._pending) < MAX_PENDING:
            self._start_event = self._event()
            self._start_event.record()

    def end(self) -> None:
        if self._event is None:
            started, self._started = self._started, None
            if started is not None:
                self._add((self._clock() - started) / 1e9, (self._wall() - self._wall_started) / 1e9)
            return
        start, self._start_event = self._start_event, None
        if start is not None:
            end = self._event()
            end.record()
            self._pending.append((start, end))

    def break_cycle(self) -> None:
        """Work that is not a training step's follows (an evaluation, an epoch's end): the cycle
        running now is not counted."""
        self._cycle_from = None

    def _add(self, seconds: float, wall_s: float = 0.0) -> None:
        if seconds >= 0:
            self._epoch.add(seconds, max(0.0, wall_s))
            self._run.add(seconds, max(0.0, wall_s))

    def _resolve(self) -> None:
        """The CUDA forwards whose end event completed, in order (never waits)."""
        while self._pending and self._pending[0][1].query():
            start, end = self._pending.popleft()
            self._add(start.elapsed_time(end) / 1e3)

    def take_epoch(self) -> ForwardStats | None:
        """The forwards since the last epoch end (None when none was timed)."""
        return self.cut_epoch()()

    def cut_epoch(self) -> Callable[[], ForwardStats | None]:
        """End the epoch's span of forwards now (the next ones are the next epoch's) and return
        its statistics, made when the function returned is called: an epoch end whose close
        waits for a later one (``Session._wait``) pays only for the cut."""
        self._resolve()
        span, source = self._epoch, self.source
        self._epoch = _Span()
        self._cycle_from = None
        return lambda: span.stats(source)

    def run(self) -> ForwardStats | None:
        """The run's forwards so far."""
        return self.run_later()()

    def run_later(self) -> Callable[[], ForwardStats | None]:
        """The run's forwards as of now, summed up when the function returned is called (on the
        training thread): forwards timed after are left out. Cheap now (a few numbers, no copy),
        since a job asks at every epoch end and needs the sum only when a run summary goes out;
        the percentiles then come from the samples kept then, less any the window dropped since."""
        self._resolve()
        span, source = self._run, self.source
        mark = span.mark()
        return lambda: span.stats(source, as_of=mark)


class ForwardProbe:
    """Finds the job's ``DistributedDataParallel`` module at its first call and times its forward
    passes in training mode (``ForwardTimer``). ``stop`` removes every hook."""

    def __init__(self, timer_for: Callable[[Any], ForwardTimer]) -> None:
        #: makes the timer for the module found (CUDA events when its parameters are on CUDA)
        self._timer_for = timer_for
        self.timer: ForwardTimer | None = None
        self._global: Any = None
        self._handles: list[Any] = []

    def start(self) -> bool:
        """Watch for the first DDP call; False when torch is not imported (nothing to watch)."""
        if "torch" not in sys.modules or self._global is not None or self.timer is not None:
            return False
        from torch.nn.modules.module import register_module_forward_pre_hook

        self._global = register_module_forward_pre_hook(self._first_call)
        return True

    def _first_call(self, module: Any, args: Any) -> None:
        from torch.nn.parallel import DistributedDataParallel

        if self.timer is not None or not isinstance(module, DistributedDataParallel):
            return
        self.give_up()
        # the wrapped module: DDP's own forward may broadcast buffers first (a collective);
        # hooked now, its call inside this one is already timed
        inner = getattr(module, "module", module)
        self.timer = self._timer_for(inner)
        self._handles = [
            inner.register_forward_pre_hook(self._begin),
            inner.register_forward_hook(self._end),
        ]

    def _begin(self, module: Any, args: Any) -> None:
        if self.timer is not None:
            if module.training:
                self.timer.begin()
            else:
                self.timer.break_cycle()

    def _end(self, module: Any, args: Any, output: Any) -> None:
        if module.training and self.timer is not None:
            self.timer.end()

    @property
    def looking(self) -> bool:
        """Whether it still watches every module call for the first DDP one."""
        return self._global is not None

    def give_up(self) -> None:
        """Stop looking for a DDP module (the first epoch ended without one, or one was found)."""
        handle, self._global = self._global, None
        if handle is not None:
            handle.remove()

    def stop(self) -> None:
        self.give_up()
        for handle in self._handles:
            handle.remove()
        self._handles = []


def timer_for(module: Any, *, clock: Callable[[], int] = time.thread_time_ns) -> ForwardTimer:
    """A timer for ``module``'s forward: CUDA events when its parameters are on a CUDA device."""
    try:
        param = next(module.parameters(), None)
        if param is not None and param.is_cuda:
            import torch

            def event() -> Event:
                return cast("Event", torch.cuda.Event(enable_timing=True))  # type: ignore[no-untyped-call]

            return ForwardTimer(clock=clock, event=event)
    except Exception:
        pass
    return ForwardTimer(clock=clock)
