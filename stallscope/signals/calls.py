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


class CallMeter:
    """Wall and process-CPU time of calls on the training thread (``begin`` / ``end``; a call
    made inside another counts once). Never raises."""

    __slots__ = ("_clock", "_cpu_clock", "_depth", "_start", "_calls", "_wall_ns", "_cpu_ns")

    def __init__(
        self,
        *,
        clock: Callable[[], int] = time.perf_counter_ns,
        cpu_clock: Callable[[], int] = time.process_time_ns,
    ) -> None:
        self._clock = clock
        self._cpu_clock = cpu_clock
        self._depth = 0
        self._start: tuple[int, int] | None = None
        self._calls = 0
        self._wall_ns = 0
        self._cpu_ns = 0

    def begin(self) -> None:
        self._depth += 1
        if self._depth == 1:
            self._start = (self._cpu_clock(), self._clock())

    def end(self, weight: int = 1) -> None:
        """The call that ``begin`` started is over (also when it raised); ``weight``: how many
        calls it stands for (a sampled call stands for those not measured)."""
        if self._depth == 0:
            return
        self._depth -= 1
        start = self._start
        if self._depth or start is None:
            return
        now, cpu = self._clock(), self._cpu_clock()
        self._start = None
        wall = max(0, now - start[1])
        self._calls += weight
        self._wall_ns += wall * weight
        self._cpu_ns += min(wall, max(0, cpu - start[0])) * weight

    def summary(self) -> CallSummary | None:
        """The calls so far; None before the first."""
        if self._calls == 0:
            return None
        return CallSummary(calls=self._calls, wall_ns=self._wall_ns, cpu_ns=self._cpu_ns)
