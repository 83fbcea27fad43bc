"""The timeline recorder: attributes every nanosecond to exactly one phase, in O(1) per event.

The recorder keeps a *current phase* and the timestamp it was entered at. Entering a phase
credits the time since then to the current one and pushes it; leaving credits the phase being
left and resumes the one below. Time covered by no phase is ``other``. So phase totals always
sum to the wall time, nested phases count exclusively, and no per-step structure grows:

* run-wide totals and entry counts per phase (a list indexed by phase id);
* a ring of the most recent steps' durations and data waits, for percentiles;
* idle windows of ``window_steps`` steps, at most ``max_windows`` of them: when full, neighbours
  are merged and the window doubles, so a run of any length keeps a bounded, evenly spaced series.

Epoch and run statistics are differences of snapshots of the totals, taken at epoch ends only.
"""

from __future__ import annotations

import time
from array import array
from collections.abc import Callable, Iterator
from typing import NamedTuple, TypeVar

from stallscope.timeline.phases import BUILTIN_PHASES, COMPUTE, DATA, OTHER
from stallscope.timeline.stats import Distribution, EpochBoundary, IdleWindow, SpanStats

Clock = Callable[[], int]
T = TypeVar("T")

#: the CPU time of in-process loading is read on one ``next()`` in this many (two syscalls each),
#: and scaled to all of them by wall time
DATA_CPU_EVERY = 8

_DATA = BUILTIN_PHASES.index(DATA)
_COMPUTE = BUILTIN_PHASES.index(COMPUTE)
_OTHER = BUILTIN_PHASES.index(OTHER)


def _nothing() -> None:
    return None


class PhaseProbe(NamedTuple):
    """What the timeline looked like at one instant, as another thread may read it (``probe``)."""

    #: when the probe was taken (the timeline's clock), ns
    now_ns: int
    #: id of the phase in progress (the innermost one)
    phase: int
    #: when that phase was entered or resumed, ns: ``[since_ns, now_ns]`` lies wholly in ``phase``
    since_ns: int
    #: time credited to each phase id up to ``since_ns`` (``Timeline`` totals), ns
    totals_ns: tuple[int, ...]


class Timeline:
    """Records phases and steps of one run. Not thread-safe: drive it from the training thread."""

    def __init__(
        self,
        *,
        clock: Clock = time.perf_counter_ns,
        cpu_clock: Clock = time.process_time_ns,
        recent_steps: int = 4096,
        window_steps: int = 16,
        max_windows: int = 256,
    ) -> None:
        if recent_steps < 1:
            raise ValueError(f"recent_steps must be >= 1, got {recent_steps!r}")
        if window_steps < 1:
            raise ValueError(f"window_steps must be >= 1, got {window_steps!r}")
        if max_windows < 2 or max_windows % 2:
            raise ValueError(f"max_windows must be an even number >= 2, got {max_windows!r}")
        self._clock = clock
        self._cpu_clock = cpu_clock
        self._names: list[str] = list(BUILTIN_PHASES)
        self._ids: dict[str, int] = {name: i for i, name in enumerate(BUILTIN_PHASES)}
        self._totals: list[int] = [0] * len(BUILTIN_PHASES)
        self._counts: list[int] = [0] * len(BUILTIN_PHASES)
        self._cur = _OTHER
        self._stack: list[int] = []
        self._mark = 0
        self._start_ns = 0
        self._started = False
        #: while StallScope does its own work (``pause``): when the clock stopped
        self._paused_at: int | None = None
        self._paused_cpu = 0
        # steps
        self._steps = 0
        self._step_total = 0
        self._ep_step_total = 0
        self._in_step = False
        self._step_start = 0
        self._step_wait = 0
        self._ring_size = recent_steps
        self._ring_step = array("q", bytes(8 * recent_steps))
        self._ring_wait = array("q", bytes(8 * recent_steps))
        self._ring_pos = 0
        # CPU time of in-process data loading
        self._measure_data_cpu = False
        self._data_cpu_mark = -1
        self._cpu_countdown = 1
        #: CPU time and wall time of the sampled in-process waits (one in DATA_CPU_EVERY)
        self._data_cpu_total = 0
        self._data_cpu_wall = 0
        self._ep_data_cpu_wall = 0
        self._last_wait = 0
        #: set when the iterator given to ``fetch`` raised (its own error, or StopIteration)
        self.raised_by_iterator = False
        #: an internal failure inside ``fetch`` after the item was taken
        self.error: Exception | None = None
        self._data_cpu_valid_run = True
        self._data_cpu_valid_epoch = True
        # idle windows
        self._window_steps = window_steps
        self._max_windows = max_windows
        self._windows: list[IdleWindow] = []
        self._win_steps = 0
        self._win_start = 0
        self._win_busy = 0
        # epoch snapshots
        self._epochs = 0
        self._ep_start_ns = 0
        self._ep_totals: list[int] = []
        self._ep_counts: list[int] = []
        self._ep_steps = 0
        self._ep_cpu = 0
        self._ep_data_cpu = 0
        self._cpu_start = 0
        self._boundaries: list[EpochBoundary] = []
        self._ep_boundaries: list[EpochBoundary] = []
        # one watched phase whose enter/leave call listeners (CUDA events around ``compute``);
        # -1: none. The listeners must not raise.
        self._watch = -1
        self._on_watch_enter: Callable[[], None] = _nothing
        self._on_watch_leave: Callable[[], None] = _nothing

    # -- set-up --------------------------------------------------------------------------

    def start(self) -> None:
        """Start the clock: the run (and its first epoch) begins now."""
        now = self._clock()
        self._start_ns = self._mark = self._ep_start_ns = self._win_start = now
        self._cpu_start = self._ep_cpu = self._cpu_clock()
        self._ep_totals = list(self._totals)
        self._ep_counts = list(self._counts)
        self._started = True

    @property
    def started(self) -> bool:
        return self._started

    def phase_id(self, name: str) -> int:
        """The id of phase ``name``, registering a custom phase on first use."""
        pid = self._ids.get(name)
        if pid is None:
            pid = len(self._names)
            self._names.append(name)
            self._ids[name] = pid
            self._totals.append(0)
            self._counts.append(0)
            self._ep_totals.append(0)
            self._ep_counts.append(0)
        return pid

    @property
    def steps(self) -> int:
        return self._steps

    @property
    def depth(self) -> int:
        """How many phases are open (0 outside any phase)."""
        return len(self._stack)

    # -- hot path ------------------------------------------------------------------------

    def enter(self, pid: int) -> None:
        """Enter phase ``pid``; the phase that was current resumes at the matching ``leave``.
        Starts the clock if it has not started (a plain loop's first phase may come before its
        first ``scope.iter``)."""
        if not self._started:
            self.start()
        now = self._clock()
        self._totals[self._cur] += now - self._mark
        self._stack.append(self._cur)
        self._cur = pid
        self._counts[pid] += 1
        self._mark = now
        if pid == self._watch:
            self._on_watch_enter()

    def switch(self, pid: int) -> None:
        """Leave the current phase and enter ``pid`` at one instant: ``leave()`` + ``enter(pid)``
        with one clock read (Lightning's h2d -> compute, every step)."""
        now = self._clock()
        left = self._cur
        self._totals[left] += now - self._mark
        self._cur = pid
        self._counts[pid] += 1
        self._mark = now
        if left == self._watch:
            self._on_watch_leave()
        if pid == self._watch:
            self._on_watch_enter()

    def leave(self) -> None:
        """Leave the current phase."""
        now = self._clock()
        left = self._cur
        self._totals[left] += now - self._mark
        self._cur = self._stack.pop() if self._stack else _OTHER
        self._mark = now
        if left == self._watch:
            self._on_watch_leave()

    def fetch(self, it: Iterator[T]) -> T:
        """``next(it)``, timed as the data phase: the step in progress ends and a new one starts
        with the item. ``data_begin`` + ``next`` + ``data_end`` in one call, for the plain-loop
        iterator.

        StopIteration and the iterator's own errors propagate unchanged, with
        ``raised_by_iterator`` set (the wait is then ``last_wait_ns`` and no step starts). Any other
        exception is StallScope's own. A failure after ``next`` succeeded is stored in ``error``
        and the item is still returned.
        """
        now = self._clock()
        if self._in_step:
            self._close_step(now)
        cur = self._cur
        self._totals[cur] += now - self._mark
        self._cur = _DATA
        self._mark = now
        self._counts[_DATA] += 1
        self._step_start = now
        cpu0 = -1
        if self._measure_data_cpu:
            self._cpu_countdown -= 1
            if self._cpu_countdown <= 0:
                self._cpu_countdown = DATA_CPU_EVERY
                cpu0 = self._cpu_clock()
        try:
            item = next(it)
        except BaseException:
            self.raised_by_iterator = True
            end = self._clock()
            self._totals[_DATA] += end - now
            self._cur = cur
            self._mark = end
            self._last_wait = end - now
            raise
        try:
            end = self._clock()
            wait = end - now
            self._totals[_DATA] += wait
            self._cur = cur
            self._mark = end
            self._in_step = True
            self._step_wait = wait
            if cpu0 >= 0:
                self._data_cpu_total += self._cpu_clock() - cpu0
                self._data_cpu_wall += wait
        except Exception as exc:  # never lose the item: report the failure beside it
            self.error = exc
        return item

    @property
    def step_wait_ns(self) -> int:
        """The data wait of the step in progress."""
        return self._step_wait

    @property
    def last_wait_ns(self) -> int:
        """The wait of the last ``fetch`` that raised (StopIteration: the end of a pass)."""
        return self._last_wait

    def data_begin(self, *, new_step: bool = True) -> None:
        """About to wait for the next batch. With ``new_step`` the step in progress ends here."""
        now = self._clock()
        if self._in_step and new_step:
            self._close_step(now)
        self._totals[self._cur] += now - self._mark
        self._stack.append(self._cur)
        self._cur = _DATA
        self._counts[_DATA] += 1
        self._mark = now
        if new_step:
            self._step_start = now
        self._data_cpu_mark = -1
        if self._measure_data_cpu:
            self._cpu_countdown -= 1
            if self._cpu_countdown <= 0:
                self._cpu_countdown = DATA_CPU_EVERY
                self._data_cpu_mark = self._cpu_clock()

    def data_end(self, *, got_item: bool) -> int:
        """The wait for a batch is over; ``got_item`` starts a step. Returns the wait in ns."""
        cpu1 = self._cpu_clock() if self._data_cpu_mark >= 0 else -1
        now = self._clock()
        wait = now - self._mark
        if cpu1 >= 0:
            self._data_cpu_total += cpu1 - self._data_cpu_mark
            self._data_cpu_wall += wait
            self._data_cpu_mark = -1
        self._totals[self._cur] += wait
        self._cur = self._stack.pop() if self._stack else _OTHER
        self._mark = now
        if got_item:
            self._in_step = True
            self._step_wait = wait
        return wait

    def _close_step(self, now: int) -> None:
        pos = self._ring_pos
        dur = now - self._step_start
        self._step_total += dur
        self._ring_step[pos] = dur
        self._ring_wait[pos] = self._step_wait
        self._ring_pos = pos + 1 if pos + 1 < self._ring_size else 0
        self._steps += 1
        self._in_step = False
        self._win_steps += 1
        if self._win_steps >= self._window_steps:
            self._close_window(now)

    def _close_window(self, now: int) -> None:
        busy = self._totals[_COMPUTE] + (now - self._mark if self._cur == _COMPUTE else 0)
        self._windows.append(
            IdleWindow(steps=self._win_steps, wall_ns=now - self._win_start, busy_ns=busy - self._win_busy)
        )
        self._win_steps = 0
        self._win_start = now
        self._win_busy = busy
        if len(self._windows) >= self._max_windows:
            pairs = zip(self._windows[0::2], self._windows[1::2], strict=True)
            self._windows = [
                IdleWindow(a.steps + b.steps, a.wall_ns + b.wall_ns, a.busy_ns + b.busy_ns) for a, b in pairs
            ]
            self._window_steps *= 2

    # -- epochs --------------------------------------------------------------------------

    def begin_epoch(self, *, in_process_data: bool) -> None:
        """A pass over a loader starts. ``in_process_data``: batches are made in this process,
        so the CPU time of each ``next()`` is measured (two clock reads per step)."""
        self._measure_data_cpu = in_process_data
        if not in_process_data:
            self._data_cpu_valid_epoch = False
            self._data_cpu_valid_run = False
        self._epochs += 1

    def note_boundary(self, boundary: EpochBoundary) -> None:
        """Record the start-up and tear-down cost of the current pass."""
        self._boundaries.append(boundary)
        self._ep_boundaries.append(boundary)
        if len(self._boundaries) > 4096:  # bounded: keep the first and the most recent passes
            del self._boundaries[1:2049]

    def end_epoch(self) -> SpanStats:
        """Close the current epoch (and its step in progress) and return its statistics.

        The epoch spans from the end of the previous one (or ``start``) to now, so the epochs'
        wall times add up to the run's.
        """
        now = self._flush()
        if self._in_step:
            self._close_step(now)
        ep_steps = self._steps - self._ep_steps
        cpu = self._cpu_clock()
        stats = SpanStats(
            wall_ns=now - self._ep_start_ns,
            steps=ep_steps,
            epochs=1 if self._ep_boundaries or ep_steps else 0,
            step_total_ns=self._step_total - self._ep_step_total,
            phase_ns=self._diff(self._totals, self._ep_totals),
            phase_counts=self._diff(self._counts, self._ep_counts),
            step=Distribution.of(self._recent(self._ring_step, ep_steps)),
            data_wait=Distribution.of(self._recent(self._ring_wait, ep_steps)),
            data_cpu_ns=self._scaled_data_cpu(
                self._data_cpu_total - self._ep_data_cpu,
                self._data_cpu_wall - self._ep_data_cpu_wall,
                self._totals[_DATA] - self._ep_totals[_DATA],
            )
            if self._data_cpu_valid_epoch
            else None,
            process_cpu_ns=cpu - self._ep_cpu,
            boundaries=tuple(self._ep_boundaries),
        )
        self._ep_start_ns = now
        self._ep_totals = list(self._totals)
        self._ep_counts = list(self._counts)
        self._ep_steps = self._steps
        self._ep_step_total = self._step_total
        self._ep_cpu = cpu
        self._ep_data_cpu = self._data_cpu_total
        self._ep_data_cpu_wall = self._data_cpu_wall
        self._ep_boundaries = []
        self._data_cpu_valid_epoch = True
        self._measure_data_cpu = False
        return stats

    def run_stats(self) -> SpanStats:
        """Statistics of the whole run so far (closes nothing)."""
        now = self._flush()
        windows = list(self._windows)
        if self._win_steps * 2 >= self._window_steps:
            busy = self._totals[_COMPUTE]
            windows.append(IdleWindow(self._win_steps, now - self._win_start, busy - self._win_busy))
        return SpanStats(
            wall_ns=now - self._start_ns,
            steps=self._steps,
            epochs=self._epochs,
            step_total_ns=self._step_total,
            phase_ns=self._diff(self._totals, [0] * len(self._totals)),
            phase_counts=self._diff(self._counts, [0] * len(self._counts)),
            step=Distribution.of(self._recent(self._ring_step, self._steps)),
            data_wait=Distribution.of(self._recent(self._ring_wait, self._steps)),
            data_cpu_ns=self._scaled_data_cpu(self._data_cpu_total, self._data_cpu_wall, self._totals[_DATA])
            if self._data_cpu_valid_run
            else None,
            process_cpu_ns=self._cpu_clock() - self._cpu_start,
            boundaries=tuple(self._boundaries),
            windows=tuple(windows),
        )

    # -- for samplers (off the hot path) --------------------------------------------------

    def watch(self, pid: int, on_enter: Callable[[], None], on_leave: Callable[[], None]) -> None:
        """Call ``on_enter`` / ``on_leave`` whenever phase ``pid`` is entered / left (one phase at a
        time; the listeners must not raise). Call from the training thread."""
        self._on_watch_enter = on_enter
        self._on_watch_leave = on_leave
        self._watch = pid

    def unwatch(self) -> None:
        self._watch = -1
        self._on_watch_enter = self._on_watch_leave = _nothing

    def phase_names(self) -> tuple[str, ...]:
        """Phase names indexed by phase id."""
        return tuple(self._names)

    def probe(self) -> PhaseProbe | None:
        """The phase in progress and the totals, read consistently from any thread; None before
        ``start`` or when the training thread kept changing phase during four attempts.

        Lock-free: every change of phase credits the totals and then moves ``_mark``, so a reading
        is consistent when ``_mark`` did not move while it was taken and the totals add up to it.
        """
        if not self._started:
            return None
        for _ in range(4):
            mark = self._mark
            cur = self._cur
            totals = tuple(self._totals)
            now = self._clock()
            if self._mark == mark and sum(totals) == mark - self._start_ns:
                return PhaseProbe(now_ns=now, phase=cur, since_ns=mark, totals_ns=totals)
        return None

    # -- helpers -------------------------------------------------------------------------

    @staticmethod
    def _scaled_data_cpu(cpu_ns: int, sampled_wall_ns: int, data_wall_ns: int) -> int:
        """CPU of all in-process waits, from the sampled ones: their CPU share times the data time."""
        if sampled_wall_ns <= 0:
            return 0
        return round(min(1.0, cpu_ns / sampled_wall_ns) * data_wall_ns) if cpu_ns >= 0 else 0

    def _flush(self) -> int:
        """Credit the current phase up to now, so totals are exact at this instant (while paused:
        up to the pause)."""
        if self._paused_at is not None:
            return self._paused_at
        now = self._clock()
        self._totals[self._cur] += now - self._mark
        self._mark = now
        return now

    # -- StallScope's own work -----------------------------------------------------------

    def pause(self) -> None:
        """Stop the clock for StallScope's own work (the epoch-end diagnosis, printing, the report
        write): until ``resume``, no time is credited to any phase, epoch or the run."""
        if self._paused_at is not None or not self._started:
            return
        self._paused_at = self._flush()
        self._paused_cpu = self._cpu_clock()

    def resume(self) -> None:
        """Restart the clock: the paused interval is cut out of the run, as if it never happened."""
        paused_at = self._paused_at
        if paused_at is None:
            return
        now = self._clock()
        gap = now - paused_at
        cpu_gap = self._cpu_clock() - self._paused_cpu
        self._start_ns += gap
        self._ep_start_ns += gap
        self._win_start += gap
        self._step_start += gap
        self._cpu_start += cpu_gap
        self._ep_cpu += cpu_gap
        self._paused_at = None
        self._mark = now  # last: a probe reading totals against _mark sees a consistent state

    def _diff(self, now: list[int], then: list[int]) -> dict[str, int]:
        out = {name: now[i] - then[i] for i, name in enumerate(self._names) if i < len(BUILTIN_PHASES)}
        for i in range(len(BUILTIN_PHASES), len(self._names)):
            if now[i] - then[i] or self._counts[i]:
                out[self._names[i]] = now[i] - then[i]
        return out

    def _recent(self, ring: array[int], count: int) -> list[int]:
        count = min(count, self._ring_size)
        end = self._ring_pos
        if count <= end:
            return list(ring[end - count : end])
        return list(ring[self._ring_size - (count - end) :]) + list(ring[:end])
