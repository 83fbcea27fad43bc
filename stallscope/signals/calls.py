"""What a run's logger calls are made of: their wall time and the process's CPU in them.

``logging.frequency`` hands a logger that blocks to a background thread. The thread takes the
call's waiting (a server's answer, a disk) off the training thread; the call's own Python work
still needs the GIL, so the prediction keeps that part on the training thread. Measuring it per
call lets the prediction count only the wait as removed.

The CPU read is the process's (every thread's), not the training thread's alone: a call whose
work runs on another thread of the process (a library's own helper thread), or that competes
with one, counts as work, not as waiting, which errs on the side of promising less.

The Lightning hooks measure each call to the Trainer's loggers (``log_metrics``, ``save``...),
which Lightning makes every ``log_every_n_steps`` steps; a plain loop's ``logging`` phase has its
first 16 calls measured and then one in 8 (it may run at every step), each of those counted 8
times, so that the sums stand for all the calls. Two clock reads at each end of a measured call
(the process's CPU clock is a system call, about a microsecond).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class CallSummary:
    """The calls measured so far."""

    #: calls (measured ones counted with their weight), their wall time and the CPU in them
    calls: int
    wall_ns: int
    cpu_ns: int

    @property
    def cpu_share(self) -> float:
        """The share of the calls' wall time that the process spent computing (at most 1)."""
        return self.cpu_ns / self.wall_ns if self.wall_ns > 0 else 0.0


#: what a call's two ends read: the CPU clock, the wall clock, and what a subclass adds
Marks = tuple[int, int, "int | None"]


class NestedMeter:
    """Wall and CPU time of calls on the training thread (``begin`` / ``end``; a call made inside
    another counts once). Never raises. ``CallMeter`` reads the process's CPU clock for the
    logging calls; ``signals.saves.SaveMeter`` the thread's, and adds the bytes each save writes."""

    def __init__(
        self,
        *,
        clock: Callable[[], int] = time.perf_counter_ns,
        cpu_clock: Callable[[], int] = time.process_time_ns,
    ) -> None:
        self._clock = clock
        self._cpu_clock = cpu_clock
        self._depth = 0
        self._start: Marks | None = None
        self._calls = 0
        self._wall_ns = 0
        self._cpu_ns = 0

    def begin(self) -> None:
        self._depth += 1
        if self._depth == 1:
            self._start = self._open()

    def end(self, weight: int = 1) -> None:
        """The call that ``begin`` started is over (also when it raised); ``weight``: how many
        calls it stands for (a sampled call stands for those not measured)."""
        if self._depth == 0:
            return
        self._depth -= 1
        start = self._start
        if self._depth or start is None:
            return
        self._start = None
        self._add(start, self._close(), weight)

    def _open(self) -> Marks:
        """The readings at a call's start: the wall clock last, so that its window lies inside
        the CPU clock's (the CPU read is then never short of the wall time's)."""
        cpu = self._cpu_clock()
        return cpu, self._clock(), None

    def _close(self) -> Marks:
        now = self._clock()
        return self._cpu_clock(), now, None

    def _add(self, start: Marks, end: Marks, weight: int) -> None:
        wall = max(0, end[1] - start[1])
        self._calls += weight
        self._wall_ns += wall * weight
        self._cpu_ns += min(wall, max(0, end[0] - start[0])) * weight


class CallMeter(NestedMeter):
    """The logging calls' wall time and the process's CPU in them (``NestedMeter``)."""

    def summary(self) -> CallSummary | None:
        """The calls so far; None before the first."""
        if self._calls == 0:
            return None
        return CallSummary(calls=self._calls, wall_ns=self._wall_ns, cpu_ns=self._cpu_ns)
