"""The timeline recorder: attributes every nanosecond to exactly one phase.

The recorder keeps a *current phase* and the timestamp it was entered at. Entering a phase
credits the time since then to the current one and pushes it; leaving credits the phase being
left and resumes the one below. Time covered by no phase is ``other``. So phase totals always
sum to the wall time, nested phases count exclusively, and no per-step structure grows:

* run-wide totals and entry counts per phase (a list indexed by phase id);
* a ring of the most recent steps' durations and data waits, for percentiles;
* idle windows of ``window_steps`` steps, at most ``max_windows`` of them: when full, neighbours
  are merged and the window doubles, so a run of any length keeps a bounded, evenly spaced series.

The training thread only *logs* each event, a (code, timestamp) pair appended to a short log
(``_log``: a C array of ints where ``_native`` is built, else a list), and the log is folded into
the totals every ``FOLD_AT`` entries and whenever statistics are read. Between two training
steps the CPU caches hold the step's own work, not ours, so every Python call and every object
touched there costs several times its tight-loop price: one append per event is what keeps the
recording cheap enough to leave on. The fold runs the log through the same rules, in a tight
loop, with the same result as applying each event at once. A *watched* phase (CUDA events
around ``compute``) calls its listeners when it is entered and left, not when the log is folded:
its ``PhaseTimer`` calls them itself, and the methods Lightning drives track their own phases
while a watch is on (``_tracked``).

Epoch and run statistics are differences of snapshots of the totals, taken at epoch ends only.

The two pieces a plain loop runs between steps, ``PhaseTimer`` and ``Timeline._stream``, the
log and the fold (``_fold_events``) have twins in C (``_native.c``, built at install time where a
C compiler is found): the same events, with no Python frame and no object allocated per step,
folded into the same state. ``NATIVE`` tells which is in use; ``STALLSCOPE_NO_NATIVE=1``
selects the Python ones.
"""

from __future__ import annotations

import contextlib
import os
import time
from array import array
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from operator import sub
from threading import get_ident
from typing import NamedTuple, TypeVar

from stallscope._exceptions import from_signal_handler
from stallscope.timeline import stats as _stats
from stallscope.timeline.phases import BUILTIN_PHASES, COMPUTE, DATA, OTHER
from stallscope.timeline.stats import Distribution, EpochBoundary, IdleWindow, SpanSnapshot, SpanStats

Clock = Callable[[], int]
T = TypeVar("T")

#: the CPU time of in-process loading is read around one ``next()`` per this much wall time, and
#: scaled to all of them by wall time. A reading is two CPU-clock syscalls, 0.7 us each on a VM:
#: at one per 2 ms that was 0.1% of a run; fifty readings a second are still plenty for a ratio
DATA_CPU_INTERVAL_NS = 20_000_000
#: a time no clock reaches: no data-CPU reading is due
_NEVER = 1 << 62


def _no_switch_count() -> int:
    return -1


def _make_switch_clock() -> Clock:
    """``voluntary_switches``: the calling thread's voluntary context switches so far, from
    ``getrusage(RUSAGE_THREAD)`` (one syscall); -1 always where the system does not count them per
    thread."""
    try:
        import resource

        who = resource.RUSAGE_THREAD  # Linux
        resource.getrusage(who)
    except (ImportError, AttributeError, OSError, ValueError):
        return _no_switch_count
    getrusage = resource.getrusage

    def voluntary_switches() -> int:
        return getrusage(who).ru_nvcsw

    return voluntary_switches


#: A thread that blocks (on storage, a socket, a lock, a sleep) gives up its core: a voluntary
#: context switch. A sampled wait for a batch in which the training thread made none did not wait
#: on I/O, whatever share of its wall time was not on a CPU: that time was the host's (a busy VM
#: took it, an interrupt, a preemption), and the wait's share of it is ``data_still``. Read at the
#: same sampled waits as the CPU time.
voluntary_switches: Clock = _make_switch_clock()

#: a step's phases are kept as bits of an int64 (``Timeline._ring_kinds``): phase id ``i`` sets
#: bit ``i``; ids from this one on share its bit
KIND_BITS = 62

#: a recent step's phase times are kept in this many columns (``Timeline._ring_phases``): phase id
#: ``i`` in column ``i``; the custom phases (ids from the last column on) share the last one
RECENT_COLUMNS = 8

#: the log is folded into the totals when it holds this many entries (two per event)
FOLD_AT = 2048

# Event codes in the log. A code >= 0 enters the phase with that id.
#: leave the current phase
LEAVE = -1
#: a wait for data begins, and a new step with it (the step in progress ends)
STEP = -2
#: a wait for data begins that starts no step (``iter(loader)``; a fetch inside a step)
WAIT = -3
#: the wait is over and an item came: the step runs
GOT = -4
#: the wait is over without an item (``iter()`` returned; the pass ended)
NONE = -5
#: the step in progress ends (the epoch ends)
END = -6


_DATA = BUILTIN_PHASES.index(DATA)
_COMPUTE = BUILTIN_PHASES.index(COMPUTE)
_OTHER = BUILTIN_PHASES.index(OTHER)


try:  # the C hot path (``_native.c``), built at install time where a C compiler is found
    from stallscope.timeline import _native
except ImportError:  # built without it: the Python classes below do the same work
    _native = None  # type: ignore[assignment]
#: what the C module must agree on with this file (a stale build from an older checkout does not)
_NATIVE_CONSTANTS = {
    "LEAVE": LEAVE,
    "STEP": STEP,
    "WAIT": WAIT,
    "GOT": GOT,
    "NONE": NONE,
    "END": END,
    "DATA_ID": _DATA,
    "COMPUTE_ID": _COMPUTE,
    "OTHER_ID": _OTHER,
    "KIND_BITS": KIND_BITS,
    "RECENT_COLUMNS": RECENT_COLUMNS,
}
if _native is not None and (
    os.environ.get("STALLSCOPE_NO_NATIVE")  # a way out, should the C code ever be in doubt
    or any(getattr(_native, name, None) != value for name, value in _NATIVE_CONSTANTS.items())
    or not all(hasattr(_native, name) for name in ("fold", "StepHook", "HookBase"))
):
    _native = None  # type: ignore[assignment]
if _native is None:  # one switch: a build refused here does not summarise steps either
    _stats._order_stats = None
#: whether the C hot path is in use
NATIVE = _native is not None
#: the C module where it is in use (hooks/lightning.py builds its per-step ``StepHook``s), else None
NATIVE_MODULE = _native

#: a push that records nothing (after ``stop``), in C: ``deque(maxlen=0)`` drops what it is given
_SINK: deque[int] = deque(maxlen=0)
_DISCARD: Callable[[tuple[int, ...]], None] = _SINK.extend
#: a ``SpanSnapshot``'s span holds this until ``stats()`` sorts the recent steps
_UNSORTED = Distribution.of(())


def _nothing() -> None:
    return None


def _raise(exc: Exception) -> None:
    raise exc


class _Mark(NamedTuple):
    """An epoch ended by ``Timeline.mark_epoch``, waiting for the fold to reach its ``END``: what
    only that instant could read, and StallScope's own time right after it, to cut out."""

    #: the log's length just after its ``END`` (entries since the last fold)
    at: int
    #: the caller's, handed back with the epoch's snapshot
    token: object
    #: when the epoch ended, and the process's CPU time then (ns)
    now: int
    cpu: int
    #: the sampled in-process waits' CPU, wall and still time so far, and whether the epoch's and
    #: the run's loading were all in this process
    data_cpu: int
    data_cpu_wall: int
    data_still: int
    data_cpu_valid: bool
    data_cpu_valid_run: bool
    #: the passes noted in the epoch; phases named by then; passes begun and noted in the run by then
    boundaries: list[EpochBoundary]
    known: int
    run_epochs: int
    run_boundaries: int
    #: StallScope's own wall and CPU time from ``now`` to the mark (the epoch end's work), cut out
    #: of the run as ``pause`` ... ``resume`` would
    gap: int
    cpu_gap: int
    #: given the epoch's snapshot: whether to take the run's as of the same instant as well
    run_if: Callable[[SpanSnapshot], bool] | None


class RecentRecord(NamedTuple):
    """The most recent steps (``Timeline.recent_record``), oldest first, copied: what the report's
    record of them is made of, on any thread."""

    #: the name of each phase column (``RECENT_COLUMNS``; the last: the custom phase, or
    #: ``"custom"`` when there are several)
    columns: tuple[str, ...]
    #: steps in the run: the first one kept is step ``steps - len(start_ns)``
    steps: int
    #: when each step began, on the timeline's clock (ns)
    start_ns: array[int]
    #: each step's time in each column, ``len(columns)`` a step (ns)
    phase_ns: array[int]
    #: a reading of the timeline's clock, taken when the record was, and the run's start on it
    #: (as read: StallScope's own time is not cut out of the steps' starts)
    clock_ns: int
    run_start_ns: int


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


class PhaseTimer:
    """``with timer:`` counts the time inside to one phase (``Timeline.timer``). Reusable, and
    nothing is allocated but the two events it logs."""

    # what __enter__ and __exit__ use is held here, on one object (the timeline keeps ``push``
    # up to date): between two training steps each object touched costs
    __slots__ = ("_pid", "_push", "_clock", "_log", "_timeline")

    def __init__(self, timeline: Timeline, pid: int) -> None:
        self._pid = pid
        self._push = timeline._push
        self._clock = timeline._clock
        self._log = timeline._log
        self._timeline = timeline

    def __enter__(self) -> None:
        if self._timeline._owner and not self._timeline._owner_thread():
            return  # another thread's phase: not the training's time
        try:
            self._push((self._pid, self._clock()))
        except Exception as exc:
            self._timeline._failed(exc)

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        if self._timeline._owner and not self._timeline._owner_thread():
            return
        try:
            self._push((LEAVE, self._clock()))
            if len(self._log) >= FOLD_AT:
                self._timeline._fold()
        except Exception as err:
            self._timeline._failed(err)
        # returns None: the user's exception, if any, propagates unchanged


class Timeline:
    """Records phases and steps of one run. Not thread-safe: drive it from the training thread
    (``probe`` is the one method for other threads)."""

    # slots: attribute reads on the hot path are fixed offsets, and the object stays compact
    __slots__ = (
        "_clock",
        "_cpu_clock",
        "on_error",
        "_log",
        "_live",
        "_push",
        "_direct",
        "_timers",
        "_folds",
        "_stream_token",
        "_names",
        "_ids",
        "_totals",
        "_counts",
        "_cur",
        "_stack",
        "_mark",
        "_start_ns",
        "_origin_ns",
        "_started",
        "_paused_at",
        "_paused_cpu",
        "_steps",
        "_step_total",
        "_ep_step_total",
        "_in_step",
        "_step_start",
        "_step_wait",
        "_data_mark",
        "_ring_size",
        "_ring_step",
        "_ring_wait",
        "_ring_compute",
        "_ring_kinds",
        "_ring_start",
        "_ring_phases",
        "_step_phases0",
        "_ring_pos",
        "_step_compute0",
        "_step_kinds",
        "_data_t0",
        "_data_cpu_mark",
        "_cpu_due",
        "_data_cpu_total",
        "_data_cpu_wall",
        "_switch_clock",
        "_data_switch_mark",
        "_data_still_total",
        "_ep_data_cpu_wall",
        "_ep_data_still",
        "_gr_data_still",
        "_data_cpu_valid_run",
        "_data_cpu_valid_epoch",
        "_window_steps",
        "_max_windows",
        "_windows",
        "_built_windows",
        "_win_steps",
        "_win_start",
        "_win_busy",
        "_epochs",
        "_ep_start_ns",
        "_ep_totals",
        "_ep_counts",
        "_ep_steps",
        "_ep_cpu",
        "_ep_data_cpu",
        "_cpu_start",
        "_boundaries",
        "_ep_boundaries",
        "_gr_steps_min",
        "_gr_wall_min",
        "_gr_totals",
        "_gr_counts",
        "_gr_steps",
        "_gr_step_total",
        "_gr_wall",
        "_gr_cpu",
        "_gr_data_cpu",
        "_gr_epochs",
        "_gr_n",
        "_gr_boundaries",
        "_watch",
        "_on_watch_enter",
        "_on_watch_leave",
        "_tracked",
        "_marks",
        "_closed",
        "_owner",
        "_foreign",
    )

    def __init__(
        self,
        *,
        clock: Clock = time.perf_counter_ns,
        cpu_clock: Clock = time.process_time_ns,
        switch_clock: Clock | None = None,
        recent_steps: int = 4096,
        window_steps: int = 16,
        max_windows: int = 256,
        group_steps: int = 0,
        group_wall_ns: int = 0,
    ) -> None:
        if recent_steps < 1:
            raise ValueError(f"recent_steps must be >= 1, got {recent_steps!r}")
        if window_steps < 1:
            raise ValueError(f"window_steps must be >= 1, got {window_steps!r}")
        if max_windows < 2 or max_windows % 2:
            raise ValueError(f"max_windows must be an even number >= 2, got {max_windows!r}")
        self._clock = clock
        self._cpu_clock = cpu_clock
        #: the thread's count says nothing of a made-up clock's waits: by default it is read with
        #: the real clocks only
        real = clock is time.perf_counter_ns and cpu_clock is time.process_time_ns
        self._switch_clock = switch_clock or (voluntary_switches if real else _no_switch_count)
        #: called with StallScope's own error when the hot path fails (the timeline then stops);
        #: by default it is raised
        self.on_error: Callable[[Exception], None] = _raise
        # the event log and how events reach it
        self._log: list[int] | _native.EventLog = _native.EventLog() if _native is not None else []
        #: the training thread's ident (0: any thread) and the first other thread that entered or
        #: left a phase (``set_owner``; the C log keeps its own copy)
        self._owner = 0
        self._foreign = 0
        self._live = True
        self._push: Callable[[tuple[int, ...]], None] = self._push_first
        #: for a ``_native.StepHook``, which logs its usual case itself: 0 while events go through
        #: ``_push`` to anything but the log; 1 while they go straight into it; 2 when a phase is
        #: watched as well (``_track_enter``/``_track_leave`` follow each event)
        self._direct = 0
        self._timers: dict[int, PhaseTimer | _native.Timer] = {}
        #: bumped whenever the folded state is rewritten: odd while that is in progress (``probe``)
        self._folds = 0
        #: item 0 is replaced to make the running ``stream`` (C or Python) pass items through
        #: unrecorded; a list, so the C stream holds it and sees the change
        self._stream_token: list[object] = [object()]
        # the folded state
        self._names: list[str] = list(BUILTIN_PHASES)
        self._ids: dict[str, int] = {name: i for i, name in enumerate(BUILTIN_PHASES)}
        self._totals: list[int] = [0] * len(BUILTIN_PHASES)
        self._counts: list[int] = [0] * len(BUILTIN_PHASES)
        self._cur = _OTHER
        self._stack: list[int] = []
        self._mark = 0
        self._start_ns = 0
        #: when the run began, as read (``_start_ns`` moves later past StallScope's own time)
        self._origin_ns = 0
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
        #: when the data wait being folded began
        self._data_mark = 0
        self._ring_size = recent_steps
        self._ring_step = array("q", bytes(8 * recent_steps))
        self._ring_wait = array("q", bytes(8 * recent_steps))
        #: per recent step: its compute time, ns, and the phases entered in it (bit ``id``, custom
        #: phases past bit 61 share bit 62): which steps saved, validated or logged (``kinds``)
        self._ring_compute = array("q", bytes(8 * recent_steps))
        self._ring_kinds = array("q", bytes(8 * recent_steps))
        #: per recent step: when it began (the timeline's clock, ns), and its time in each phase,
        #: ``RECENT_COLUMNS`` a step (``recent_steps``: what the report's record of them holds)
        self._ring_start = array("q", bytes(8 * recent_steps))
        self._ring_phases = array("q", bytes(8 * RECENT_COLUMNS * recent_steps))
        #: the phases' times (by column) when the step in progress began
        self._step_phases0 = array("q", bytes(8 * RECENT_COLUMNS))
        self._ring_pos = 0
        #: compute credited when the step in progress began, and the phases entered in it so far
        self._step_compute0 = 0
        self._step_kinds = 0
        # the wait in progress, measured at once (``data_end`` returns it)
        self._data_t0 = 0
        # CPU time of in-process data loading
        self._data_cpu_mark = -1
        #: when the next wait's CPU time is read (_NEVER: loading is not in this process)
        self._cpu_due = _NEVER
        #: CPU time and wall time of the sampled in-process waits (one per DATA_CPU_INTERVAL_NS)
        self._data_cpu_total = 0
        self._data_cpu_wall = 0
        #: the voluntary switches when the sampled wait in progress began (-1: not counted), and
        #: the sampled waits' time neither on a CPU nor blocked (``voluntary_switches``)
        self._data_switch_mark = -1
        self._data_still_total = 0
        self._ep_data_cpu_wall = 0
        self._ep_data_still = 0
        self._data_cpu_valid_run = True
        self._data_cpu_valid_epoch = True
        # idle windows
        self._window_steps = window_steps
        self._max_windows = max_windows
        #: the closed windows, flat: (steps, wall_ns, busy_ns) each (a window closes every few
        #: steps: three ints are cheaper to append than an ``IdleWindow`` to build)
        self._windows: list[int] = []
        #: (the flat list, its length, its windows built): ``run_stats`` builds only what is new
        self._built_windows: tuple[list[int], int, tuple[IdleWindow, ...]] = ([], 0, ())
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
        # groups of epochs (``_group``): an epoch end closes the group of the epochs since the
        # last one closed when they have at least ``group_steps`` steps and ``group_wall_ns`` of
        # wall time together (by default every epoch closes its own); the phase totals and counts,
        # steps and step time as of the last close, and the open group's sums so far
        self._gr_steps_min = group_steps
        self._gr_wall_min = group_wall_ns
        self._gr_totals: list[int] = self._ep_totals
        self._gr_counts: list[int] = self._ep_counts
        self._gr_steps = 0
        self._gr_step_total = 0
        self._gr_wall = 0
        self._gr_cpu = 0
        #: None once an epoch of the group had loading outside this process
        self._gr_data_cpu: int | None = 0
        self._gr_data_still = 0
        self._gr_epochs = 0
        self._gr_n = 0
        self._gr_boundaries: list[EpochBoundary] = []
        # one watched phase whose enter/leave call listeners (CUDA events around ``compute``);
        # -1: none. The listeners must not raise.
        self._watch = -1
        self._on_watch_enter: Callable[[], None] = _nothing
        self._on_watch_leave: Callable[[], None] = _nothing
        #: while a phase is watched: the phases the methods below entered and have not left
        self._tracked: list[int] = []
        #: epochs ended by ``mark_epoch`` whose events are not folded yet, oldest first: what the
        #: fold needs to close each where its ``END`` lies in the log (``_close_mark``)
        self._marks: list[_Mark] = []
        #: epochs the fold closed at their marks, for ``closed_epochs``: (token, the epoch's
        #: snapshot, the run's as of its end or None)
        self._closed: list[tuple[object, SpanSnapshot, SpanSnapshot | None]] = []

    # -- set-up --------------------------------------------------------------------------

    def start(self, at: int | None = None) -> None:
        """Start the clock: the run (and its first epoch) begins now (or at ``at``, a reading of
        the clock already taken)."""
        now = self._clock() if at is None else at
        self._start_ns = self._mark = self._ep_start_ns = self._win_start = self._origin_ns = now
        self._cpu_start = self._ep_cpu = self._cpu_clock()
        self._ep_totals = self._gr_totals = list(self._totals)
        self._ep_counts = self._gr_counts = list(self._counts)
        self._started = True
        self._set_push()

    @property
    def started(self) -> bool:
        return self._started

    def set_owner(self, ident: int) -> None:
        """Only thread ``ident`` (the training thread) times phases from now on: a phase entered
        on another thread (a logging thread's ``scope.phase``) records nothing, and the first such
        thread is kept (``foreign_thread``). ``0``: any thread, as before the call."""
        self._owner = ident
        if not isinstance(self._log, list):
            self._log.owner = ident

    @property
    def foreign_thread(self) -> int:
        """The ident of the first thread other than the owner that entered a phase; 0: none."""
        if self._foreign:
            return self._foreign
        return 0 if isinstance(self._log, list) else self._log.foreign

    def is_owner_thread(self) -> bool:
        """Whether the calling thread times phases (the owner, or any thread while there is none)."""
        return not self._owner or get_ident() == self._owner

    def _owner_thread(self) -> bool:
        """Whether the calling thread is the owner (``PhaseTimer``); remembers the first that is not."""
        me = get_ident()
        if me == self._owner:
            return True
        if not self._foreign:
            self._foreign = me
        return False

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
            if self._gr_totals is not self._ep_totals:  # the open group's baseline, when apart
                self._gr_totals.append(0)
                self._gr_counts.append(0)
        return pid

    def timer(self, pid: int) -> AbstractContextManager[None]:
        """A reusable context manager for phase ``pid`` (what ``scope.phase`` hands out). Entering
        one starts the clock if it has not started. One per phase id: at most one per name."""
        timer = self._timers.get(pid)
        if timer is None:
            if _native is not None:
                log = self._c_log()
                timer = _native.Timer(pid, log, log, self._clock, self, FOLD_AT)
            else:
                timer = PhaseTimer(self, pid)
            self._timers[pid] = timer
            self._retarget(pid, timer)
        return timer

    @property
    def steps(self) -> int:
        self._fold()
        return self._steps

    @property
    def depth(self) -> int:
        """How many phases are open (0 outside any phase)."""
        self._fold()
        return len(self._stack)

    def stop(self) -> None:
        """Record nothing more: later events are dropped and a running ``stream`` passes its items
        through. What was recorded stays readable."""
        self._live = False
        self.end_streams()
        self._set_push()
        with contextlib.suppress(Exception):  # a fold cut short leaves a consistent state
            self._fold()

    def end_streams(self) -> None:
        """A running ``stream`` passes its remaining items through unrecorded (a new pass began)."""
        self._stream_token[0] = object()

    # -- hot path: log one event ---------------------------------------------------------

    def enter(self, pid: int) -> None:
        """Enter phase ``pid``; the phase that was current resumes at the matching ``leave``.
        Starts the clock if it has not started."""
        self._push((pid, self._clock()))
        if self._watch >= 0:
            self._track_enter(pid)

    def switch(self, pid: int) -> None:
        """Leave the current phase and enter ``pid`` at one instant: ``leave()`` + ``enter(pid)``
        with one clock read (Lightning's h2d -> compute, every step)."""
        now = self._clock()
        self._push((LEAVE, now, pid, now))
        if self._watch >= 0:
            self._track_leave()
            self._track_enter(pid)

    def leave(self) -> None:
        """Leave the current phase."""
        self._push((LEAVE, self._clock()))
        if self._watch >= 0:
            self._track_leave()
        if len(self._log) >= FOLD_AT:
            self._fold()

    def stream(self, it: Iterator[T], on_first: Callable[[T, int], None], result: list[int]) -> Iterator[T]:
        """The items of ``it``, each ``next()`` timed as the data phase: the step in progress ends
        and a new one starts with the item. ``on_first(item, wait_ns)`` sees the first item.

        When ``it`` is exhausted, the wait of the final ``next()`` (the one that raised
        StopIteration) is appended to ``result``; nothing is when the stream stopped recording
        (``stop``, ``end_streams``, or StallScope's own failure, which goes to ``on_error``): it
        then passes the remaining items through. The iterator's own errors propagate unchanged.

        In C where ``_native`` is built (no Python frame between two training steps), else the
        generator ``_stream``; both log the same events.
        """
        if _native is None or not self._started or not self._live:
            return self._stream(it, on_first, result, self._stream_token[0], self._cpu_due)
        stream: Iterator[T] = _native.Stream(
            it,
            self._c_log(),
            self._clock,
            self._cpu_clock,
            self._switch_clock,
            self,
            on_first,
            result,
            self._stream_token,
            self._cpu_due,
            DATA_CPU_INTERVAL_NS,
            FOLD_AT,
        )
        return stream

    def _stream(
        self, it: Iterator[T], on_first: Callable[[T, int], None], result: list[int], mine: object, cpu_due: int
    ) -> Iterator[T]:
        """``stream`` in Python. ``mine`` (the stream token) and ``cpu_due`` are read by the caller,
        when the stream is made, as the C stream reads them: a generator's body runs only at the
        first ``next()``, and an ``end_streams`` or ``begin_epoch`` in between must not count."""
        token = self._stream_token
        clock = self._clock
        cpu_clock = self._cpu_clock
        switch_clock = self._switch_clock
        log = self._log
        first = True
        while True:  # the hot loop: two log entries per item
            if token[0] is not mine:
                yield from it
                return
            try:
                now = clock()
                # logged before next(): phases the loader itself times nest inside the wait
                self._push((STEP, now))
                cpu0 = -1
                if now >= cpu_due:
                    cpu_due = now + DATA_CPU_INTERVAL_NS
                    cpu0 = cpu_clock()
                    switches0 = switch_clock()
            except Exception as exc:
                self._failed(exc)
                yield from it
                return
            try:
                item = next(it)
            except StopIteration:  # the pass is over
                if token[0] is not mine:  # stopped, or a new pass began, during next()
                    return
                try:
                    end = clock()
                    self._push((NONE, end))
                    result.append(end - now)
                except Exception as exc:
                    self._failed(exc)
                return
            except BaseException:
                if token[0] is mine:
                    try:
                        self._push((NONE, clock()))
                    except Exception as exc:
                        self._failed(exc)
                raise  # the loader's own error, or Ctrl-C: unchanged
            if token[0] is not mine:  # stopped, or a new pass began, during next(): not this pass's
                yield item
                yield from it
                return
            try:
                end = clock()
                self._push((GOT, end))
                if cpu0 >= 0:
                    self._add_data_cpu(cpu_clock() - cpu0, end - now, switches0, switch_clock())
                if first:
                    first = False
                    on_first(item, end - now)
                if len(log) >= FOLD_AT:
                    self._fold()
            except Exception as exc:  # never lose the item: pass it on, then the rest
                self._failed(exc)
                yield item
                yield from it
                return
            yield item

    def _add_data_cpu(self, cpu_ns: int, wall_ns: int, switches0: int, switches1: int) -> None:
        """One in-process wait whose CPU time was read, with the thread's voluntary switches at its
        two ends (the C stream reports it here): a wait that did not block keeps its time off a CPU
        as ``data_still``."""
        self._data_cpu_total += cpu_ns
        self._data_cpu_wall += wall_ns
        if switches0 >= 0 and switches1 == switches0 and wall_ns > cpu_ns:
            self._data_still_total += wall_ns - cpu_ns

    def data_begin(self, *, new_step: bool = True) -> None:
        """About to wait for the next batch. With ``new_step`` the step in progress ends here."""
        now = self._clock()
        self._data_t0 = now
        self._push((STEP if new_step else WAIT, now))
        if self._watch >= 0:
            self._track_enter(_DATA)
        self._data_cpu_mark = -1
        if now >= self._cpu_due:
            self._cpu_due = now + DATA_CPU_INTERVAL_NS
            self._data_cpu_mark = self._cpu_clock()
            self._data_switch_mark = self._switch_clock()

    def drop_step(self) -> None:
        """The step in progress never ran: a batch was logged as arrived, but the loader raised
        instead (Lightning's probe after ``next()`` runs either way). It is not counted; its time
        stays where it was logged."""
        self._fold()
        self._in_step = False

    def data_end(self, *, got_item: bool, then: int | None = None) -> int:
        """The wait for a batch is over; ``got_item`` starts a step. Returns the wait in ns.
        ``then``: enter this phase at the same instant (Lightning's h2d, every step)."""
        cpu1 = self._cpu_clock() if self._data_cpu_mark >= 0 else -1
        switches1 = self._switch_clock() if self._data_cpu_mark >= 0 else -1
        now = self._clock()
        wait = now - self._data_t0
        if cpu1 >= 0:
            self._add_data_cpu(cpu1 - self._data_cpu_mark, wait, self._data_switch_mark, switches1)
            self._data_cpu_mark = -1
        code = GOT if got_item else NONE
        self._push((code, now) if then is None else (code, now, then, now))
        if self._watch >= 0:
            self._track_leave()
            if then is not None:
                self._track_enter(then)
        if len(self._log) >= FOLD_AT:
            self._fold()
        return wait

    # -- where events go -----------------------------------------------------------------

    def _set_push(self) -> None:
        """Point the timeline and its timers at where events go now."""
        if not self._live:
            self._push = _DISCARD
        elif not self._started:
            self._push = self._push_first
        else:
            self._push = self._log.extend
        self._direct = 0 if not (self._live and self._started) else 1 if self._watch < 0 else 2
        for pid, timer in self._timers.items():
            self._retarget(pid, timer)

    def _retarget(self, pid: int, timer: PhaseTimer | _native.Timer) -> None:
        """Point a timer at where its events go now (``_timer_push``). The C timer appends to the
        log itself when that is where they go; else it calls what it is given."""
        push = self._timer_push(pid)
        if isinstance(timer, PhaseTimer):
            timer._push = push
            timer._log = self._log
        else:
            log = self._c_log()
            timer.target = log if push == log.extend else push
            timer.log = log

    def _c_log(self) -> _native.EventLog:
        """The log, as the C objects take it (it is a C one wherever they are in use)."""
        log = self._log
        if isinstance(log, list):
            raise TypeError("stallscope: the C hot path needs the C event log")
        return log

    def _timer_push(self, pid: int) -> Callable[[tuple[int, ...]], None]:
        """Where the timer of phase ``pid`` sends its events."""
        if pid == self._watch and self._live:
            return self._push_watched
        return self._push

    def _push_first(self, event: tuple[int, ...]) -> None:
        """The first event starts the clock at its own timestamp."""
        self.start(at=event[1])
        self._push(event)

    def _push_watched(self, event: tuple[int, ...]) -> None:
        """The watched phase's timer: log the event (starting the clock if it is the first) and
        call the listener at once."""
        self._push(event)
        if event[0] == LEAVE:
            self._on_watch_leave()
        else:
            self._on_watch_enter()

    def _track_enter(self, pid: int) -> None:
        self._tracked.append(pid)
        if pid == self._watch:
            self._on_watch_enter()

    def _track_leave(self) -> None:
        if self._tracked and self._tracked.pop() == self._watch:
            self._on_watch_leave()

    def _failed(self, exc: Exception) -> None:
        """StallScope's own failure on the hot path: stop recording, hand the error on. (An
        exception a signal handler raised meanwhile is the user's: it goes on up, unchanged.)"""
        if from_signal_handler(exc):
            raise exc
        self.stop()
        self.on_error(exc)

    def _fold(self) -> None:
        """Apply the logged events to the totals, steps and windows, in order (in C where
        ``_native`` is built: ``_native.fold`` is ``_fold_events`` without the interpreter).

        The events are taken out of the log first, so none is ever applied twice: a fold cut short
        (Ctrl-C in a window's close, a failure) keeps the events before the one it stopped at, and
        the state stays a consistent partition of the time."""
        log = self._log
        if not log:
            return
        self._folds += 1
        try:
            if self._marks:  # epochs ended in the log: each is closed where its END lies
                self._fold_closing(log)
            else:
                self._fold_first(log)
        finally:
            self._folds += 1

    def _fold_first(self, log: list[int] | _native.EventLog, upto: int | None = None) -> None:
        """Take the first ``upto`` entries (all by default) out of the log and apply them: in C
        where the log is the C one, which the C fold takes them out of first."""
        if isinstance(log, list):
            n = len(log) if upto is None else upto
            pending = log[:n]
            del log[:n]
            self._fold_events(pending)
        elif upto is None:
            _native.fold(self, log)
        else:
            _native.fold(self, log, upto)

    def _fold_closing(self, log: list[int] | _native.EventLog) -> None:
        """Fold a log that holds epochs' ends: closing them is StallScope's work, and the fold may
        run inside a step (the log filled up), so it is cut out of the run as ``pause`` ...
        ``resume`` would: the phase in progress is credited up to the fold's start."""
        cut = self._paused_at is None  # (marks are folded before any pause: always)
        start = self._clock() if cut else 0
        start_cpu = self._cpu_clock() if cut else 0
        try:
            self._fold_marks(log)
            if log:
                self._fold_first(log)
        finally:
            if cut:
                self._totals[self._cur] += start - self._mark
                self._mark = start
                self._paused_at = start
                self._paused_cpu = start_cpu
                self.resume()

    def _fold_marks(self, log: list[int] | _native.EventLog) -> None:
        """Fold the log up to each epoch end ``mark_epoch`` left in it, in order, closing each
        epoch there (``_close_mark``). A failure part-way drops the marks not reached: their
        places in the log are not known any more."""
        marks = self._marks
        taken = 0
        try:
            while marks:
                mark = marks.pop(0)
                upto = mark.at - taken
                taken = mark.at
                if upto > len(log):  # the log was changed behind the marks' back
                    raise RuntimeError("stallscope: an epoch's mark lies past the end of the event log")
                self._fold_first(log, upto)
                self._closed.append(self._close_mark(mark))
        except BaseException:
            marks.clear()
            raise

    def _fold_events(self, pending: list[int]) -> None:
        """The fold's loop in Python. The hot state is held in locals while the loop runs and
        written back at its end, even when the loop is cut short."""
        totals = self._totals
        counts = self._counts
        stack = self._stack
        cur = self._cur
        mark = self._mark
        in_step = self._in_step
        step_start = self._step_start
        step_wait = self._step_wait
        data_mark = self._data_mark
        ring_step = self._ring_step
        ring_wait = self._ring_wait
        ring_compute = self._ring_compute
        ring_kinds = self._ring_kinds
        ring_start = self._ring_start
        # a step's phase times are the totals at its end less those at its start (``begin``):
        # both are copied here per step, as they are (two list extends, the cheapest way in
        # Python), and turned into the ring's rows by column at the fold's end (``_phase_rows``)
        width = len(totals)  # fixed during a fold: no phase is registered in one
        begin = _uncolumns(self._step_phases0, width)
        ends: list[int] = []
        begins: list[int] = []
        rows_at = self._ring_pos
        step_compute0 = self._step_compute0
        step_kinds = self._step_kinds
        pos = self._ring_pos
        size = self._ring_size
        steps = self._steps
        step_total = self._step_total
        window_left = self._window_steps - self._win_steps
        events = iter(pending)
        try:
            for code, t in zip(events, events, strict=True):
                totals[cur] += t - mark
                mark = t
                if code >= 0:
                    stack.append(cur)
                    cur = code
                    counts[code] += 1
                    step_kinds |= 1 << (code if code < KIND_BITS else KIND_BITS)
                elif code == LEAVE:
                    cur = stack.pop() if stack else _OTHER
                elif code == GOT:  # the wait is over, the step runs
                    cur = stack.pop() if stack else _OTHER
                    in_step = True
                    step_wait = t - data_mark
                else:
                    if in_step and code in (STEP, END):  # the step in progress ends
                        in_step = False
                        duration = t - step_start
                        step_total += duration
                        ring_step[pos] = duration
                        ring_wait[pos] = step_wait
                        ring_compute[pos] = totals[_COMPUTE] - step_compute0
                        ring_kinds[pos] = step_kinds
                        ring_start[pos] = step_start
                        ends += totals
                        begins += begin
                        pos = pos + 1 if pos + 1 < size else 0
                        steps += 1
                        window_left -= 1
                        if window_left <= 0:  # below 0 after a close that was cut short
                            self._win_steps = self._window_steps - window_left
                            self._close_window(t, totals[_COMPUTE])
                            window_left = self._window_steps
                    if code in (STEP, WAIT):
                        if code == STEP:
                            step_start = t
                            step_compute0 = totals[_COMPUTE]
                            step_kinds = 0
                            begin = totals[:]
                        data_mark = t
                        stack.append(cur)
                        cur = _DATA
                        counts[_DATA] += 1
                    elif code == NONE:
                        cur = stack.pop() if stack else _OTHER
        finally:
            self._step_phases0[:] = array("q", _columns(begin))
            _write_rows(self._ring_phases, _phase_rows(ends, begins, width), rows_at, size)
            self._in_step = in_step
            self._step_start = step_start
            self._step_wait = step_wait
            self._data_mark = data_mark
            self._step_compute0 = step_compute0
            self._step_kinds = step_kinds
            self._ring_pos = pos
            self._steps = steps
            self._step_total = step_total
            self._win_steps = self._window_steps - window_left
            self._cur = cur
            self._mark = mark

    def _close_window(self, now: int, busy: int) -> None:
        """The idle window in progress ends at ``now``, when ``busy`` ns of compute had been
        credited in all (by the fold, which is called mid-way)."""
        windows = self._windows
        windows += (self._win_steps, now - self._win_start, busy - self._win_busy)
        self._win_steps = 0
        self._win_start = now
        self._win_busy = busy
        if len(windows) >= 3 * self._max_windows:  # full: neighbours merge, windows get twice as long
            self._windows = [windows[i] + windows[i + 3] for j in range(0, len(windows), 6) for i in range(j, j + 3)]
            self._window_steps *= 2

    # -- epochs --------------------------------------------------------------------------

    def begin_epoch(self, *, in_process_data: bool) -> None:
        """A pass over a loader starts. ``in_process_data``: batches are made in this process,
        so the CPU time of ``next()`` is measured (on one wait per ``DATA_CPU_INTERVAL_NS``)."""
        self._cpu_due = 0 if in_process_data else _NEVER
        if not in_process_data:
            self._data_cpu_valid_epoch = False
            self._data_cpu_valid_run = False
        self._epochs += 1

    def note_boundary(self, boundary: EpochBoundary) -> None:
        """Record the start-up and tear-down cost of the current pass."""
        self._boundaries.append(boundary)
        self._ep_boundaries.append(boundary)
        # bounded: keep the first and the most recent passes (not while a marked epoch's run
        # snapshot may still count them: at most ``Session.MAX_WAITING`` more)
        if len(self._boundaries) > 4096 and not self._marks:
            del self._boundaries[1:2049]

    def end_epoch(self) -> SpanStats:
        """Close the current epoch (and its step in progress) and return its statistics.

        The epoch spans from the end of the previous one (or ``start``) to now, so the epochs'
        wall times add up to the run's.
        """
        return self.end_epoch_snapshot().stats()

    def end_epoch_snapshot(self, *, pause: bool = False) -> SpanSnapshot:
        """``end_epoch``, with the sorting for the epoch's percentiles left to
        ``SpanSnapshot.stats()`` (its steps are copied: two short ``memcpy``), and the rest of its
        record (phase counts, data CPU, boundaries) made when first asked for. ``pause``: also
        ``pause`` the clock, at the instant the epoch ends (one reading of each clock for both).
        Epochs ``mark_epoch`` ended before are closed first (``closed_epochs``)."""
        now = self._flush()
        if self._in_step:
            self._log.extend((END, now))
            self._fold()
        cpu = self._cpu_clock()
        if pause and self._paused_at is None and self._started:
            self._paused_at = now
            self._paused_cpu = cpu
        boundaries = self._ep_boundaries
        snapshot = self._epoch_snapshot(
            now,
            cpu,
            self._data_cpu_total,
            self._data_cpu_wall,
            self._data_still_total,
            self._data_cpu_valid_epoch,
            boundaries,
            len(self._names),
        )
        self._next_epoch()
        return snapshot

    def _next_epoch(self) -> None:
        """What the training thread keeps for the epoch in progress starts again (an epoch ended)."""
        self._ep_boundaries = []
        self._data_cpu_valid_epoch = True
        self._cpu_due = _NEVER

    @property
    def markable(self) -> bool:
        """Whether ``mark_epoch`` may end the epoch now."""
        return self._paused_at is None and self._started and self._live and bool(self._ep_boundaries)

    def mark_epoch(
        self, token: object, *, at: tuple[int, int], run_if: Callable[[SpanSnapshot], bool] | None = None
    ) -> bool:
        """End the epoch at ``at`` (readings of the clock and the CPU clock taken when it ended,
        before StallScope's work on it) and leave its closing to the next fold: the fold closes it
        where it lies in the log, as ``end_epoch_snapshot`` would have then, and ``closed_epochs``
        hands its snapshot back with ``token``. What only this instant can read is read now; the
        time from ``at`` to now is StallScope's and is cut out, as ``pause`` ... ``resume`` would.
        ``run_if(snapshot)``: take the run's snapshot as of the same instant too.

        So an epoch end between training steps touches a few objects, not the folded state:
        between steps, what it touches is what it costs. Call it last in the epoch's end, from
        the training thread. False, and nothing done, when the epoch must be closed at once
        (``end_epoch_snapshot``): the clock paused or stopped, or no pass noted in the epoch
        (``note_boundary``; an epoch with none may be empty): see ``markable``."""
        if not self.markable:
            return False
        now, cpu = at
        log = self._log
        log.extend((END, now))
        end = self._clock()
        gap = end - now
        self._marks.append(
            _Mark(  # (in the order of its fields: keywords cost more, between steps)
                len(log),
                token,
                now,
                cpu,
                self._data_cpu_total,
                self._data_cpu_wall,
                self._data_still_total,
                self._data_cpu_valid_epoch,
                self._data_cpu_valid_run,
                self._ep_boundaries,
                len(self._names),
                self._epochs,
                len(self._boundaries),
                gap,
                self._cpu_clock() - cpu,
                run_if,
            )
        )
        self._data_t0 += gap  # a wait in progress (none at a pass's end) does not count it either
        self._next_epoch()
        return True

    @property
    def waiting_epochs(self) -> int:
        """Epochs ``mark_epoch`` ended that were not taken from ``closed_epochs`` yet."""
        return len(self._marks) + len(self._closed)

    def closed_epochs(self) -> list[tuple[object, SpanSnapshot, SpanSnapshot | None]]:
        """The epochs ``mark_epoch`` ended, closed, oldest first: (its token, its snapshot, the
        run's snapshot as of its end when ``run_if`` asked for it). The list itself: the caller
        removes each epoch once it has taken it, so one it has not (an exception part-way) is
        handed again by the next call."""
        self._fold()
        return self._closed

    def _close_mark(self, mark: _Mark) -> tuple[object, SpanSnapshot, SpanSnapshot | None]:
        """The fold has just applied the mark's ``END`` (the folded state is as of ``mark.now``):
        close its epoch there, then cut StallScope's time after it out of the run."""
        snapshot = self._epoch_snapshot(
            mark.now,
            mark.cpu,
            mark.data_cpu,
            mark.data_cpu_wall,
            mark.data_still,
            mark.data_cpu_valid,
            mark.boundaries,
            mark.known,
        )
        run = None
        if mark.run_if is not None and mark.run_if(snapshot):
            run = self._run_snapshot_at(
                mark.now,
                mark.cpu,
                mark.data_cpu,
                mark.data_cpu_wall,
                mark.data_still,
                mark.data_cpu_valid_run,
                mark.run_epochs,
                mark.run_boundaries,
            )
        # as ``resume`` would, as of this instant: the next event is credited from the mark on
        self._cut_out(mark.gap, mark.cpu_gap)
        self._mark = mark.now + mark.gap
        return mark.token, snapshot, run

    def _epoch_snapshot(
        self,
        now: int,
        cpu: int,
        data_cpu: int,
        data_cpu_wall: int,
        data_still: int,
        data_cpu_valid: bool,
        boundaries: list[EpochBoundary],
        known: int,
    ) -> SpanSnapshot:
        """The epoch that ends at ``now`` (the folded state is as of then), given what was read
        when it ended; the next one starts there."""
        ep_steps = self._steps - self._ep_steps
        totals, then_totals = self._totals, self._ep_totals
        names = self._names
        # the phases' times now (the report's statistics and the frequency check need them); the
        # rest is read from what the epoch end keeps: the lists it replaces are not changed again
        phase_ns = _diff(names, known, totals, then_totals, self._counts)
        new_totals = list(totals)
        new_counts = list(self._counts)
        then_counts = self._ep_counts
        epochs = 1 if boundaries or ep_steps else 0
        wall_ns = now - self._ep_start_ns
        step_total_ns = self._step_total - self._ep_step_total
        process_cpu_ns = cpu - self._ep_cpu
        sampled_wall = data_cpu_wall - self._ep_data_cpu_wall
        data_wall = totals[_DATA] - then_totals[_DATA]
        data_cpu_ns = (
            self._scaled_data_cpu(data_cpu - self._ep_data_cpu, sampled_wall, data_wall) if data_cpu_valid else None
        )
        data_still_ns = (
            self._scaled_data_cpu(data_still - self._ep_data_still, sampled_wall, data_wall) if data_cpu_valid else None
        )

        def make() -> SpanStats:
            return SpanStats(
                wall_ns=wall_ns,
                steps=ep_steps,
                epochs=epochs,
                step_total_ns=step_total_ns,
                phase_ns=phase_ns,
                phase_counts=_diff(names, known, new_counts, then_counts, new_counts),
                step=_UNSORTED,
                data_wait=_UNSORTED,
                data_cpu_ns=data_cpu_ns,
                process_cpu_ns=process_cpu_ns,
                boundaries=tuple(boundaries),
                data_still_ns=data_still_ns,
            )

        snapshot = SpanSnapshot(
            make,
            *(self._recent_values(which, ep_steps) for which in range(4)),
            steps=ep_steps,
            epochs=epochs,
            wall_ns=wall_ns,
            phase_ns=phase_ns,
        )
        # the open group, with this epoch in it
        self._gr_wall += wall_ns
        self._gr_cpu += process_cpu_ns
        gr_data_cpu = self._gr_data_cpu
        self._gr_data_cpu = None if data_cpu_ns is None or gr_data_cpu is None else gr_data_cpu + data_cpu_ns
        self._gr_data_still += data_still_ns or 0
        if epochs:
            self._gr_epochs += 1
            self._gr_n += 1
            if boundaries:
                self._gr_boundaries += boundaries
                if len(self._gr_boundaries) > 4096:  # bounded as the run's are
                    del self._gr_boundaries[1:2049]
            if self._steps - self._gr_steps >= self._gr_steps_min and self._gr_wall >= self._gr_wall_min:
                snapshot.group = (
                    snapshot
                    if self._gr_n == 1
                    else self._group_snapshot(new_totals, new_counts, known, self._steps, self._step_total)
                )
                self._new_group(new_totals, new_counts, self._steps, self._step_total)
        self._ep_start_ns = now
        self._ep_totals = new_totals
        self._ep_counts = new_counts
        self._ep_steps = self._steps
        self._ep_step_total = self._step_total
        self._ep_cpu = cpu
        self._ep_data_cpu = data_cpu
        self._ep_data_cpu_wall = data_cpu_wall
        self._ep_data_still = data_still
        return snapshot

    def _group_snapshot(
        self, totals: list[int], counts: list[int], known: int, steps_at: int, step_total_at: int
    ) -> SpanSnapshot:
        """The open group's snapshot, as of the state ``totals``, ``counts``, ``steps_at`` and
        ``step_total_at`` (steps taken after that are left out of its recent steps)."""
        names = self._names
        extra = self._steps - steps_at
        steps = steps_at - self._gr_steps
        step_total_ns = step_total_at - self._gr_step_total
        wall_ns, cpu_ns, data_cpu_ns, epochs = self._gr_wall, self._gr_cpu, self._gr_data_cpu, self._gr_epochs
        data_still_ns = self._gr_data_still if data_cpu_ns is not None else None
        then_totals, then_counts, boundaries = self._gr_totals, self._gr_counts, tuple(self._gr_boundaries)
        phase_ns = _diff(names, known, totals, then_totals, counts)

        def make() -> SpanStats:
            return SpanStats(
                wall_ns=wall_ns,
                steps=steps,
                epochs=epochs,
                step_total_ns=step_total_ns,
                phase_ns=phase_ns,
                phase_counts=_diff(names, known, counts, then_counts, counts),
                step=_UNSORTED,
                data_wait=_UNSORTED,
                data_cpu_ns=data_cpu_ns,
                process_cpu_ns=cpu_ns,
                boundaries=boundaries,
                data_still_ns=data_still_ns,
            )

        recent = []
        for which in range(4):
            values = self._recent_values(which, steps + extra)
            recent.append(values[: max(0, len(values) - extra)] if extra else values)
        return SpanSnapshot(make, *recent, steps=steps, epochs=epochs, wall_ns=wall_ns, phase_ns=phase_ns)

    def _new_group(self, totals: list[int], counts: list[int], steps: int, step_total: int) -> None:
        """A group closed: the next one starts from this state."""
        self._gr_totals, self._gr_counts = totals, counts
        self._gr_steps, self._gr_step_total = steps, step_total
        self._gr_wall = self._gr_cpu = self._gr_epochs = self._gr_n = 0
        self._gr_data_cpu = 0
        self._gr_data_still = 0
        self._gr_boundaries = []

    @property
    def open_group(self) -> int:
        """Epochs (with steps or a pass) closed since the last group closed (``SpanSnapshot.group``)."""
        return self._gr_n

    def close_group(self) -> SpanSnapshot | None:
        """Close the open group as of the last epoch's end (the run ends before it was long
        enough): its snapshot, or None when no epoch is in it. Epochs ``mark_epoch`` ended that
        were not closed yet (``closed_epochs``) are not in it."""
        if not self._gr_n:
            return None
        totals, counts = self._ep_totals, self._ep_counts
        known = min(len(totals), len(self._gr_totals), len(self._names))
        snapshot = self._group_snapshot(totals, counts, known, self._ep_steps, self._ep_step_total)
        self._new_group(totals, counts, self._ep_steps, self._ep_step_total)
        return snapshot

    def run_stats(self) -> SpanStats:
        """Statistics of the whole run so far (closes nothing)."""
        return self.run_snapshot().stats()

    def run_wall_ns(self) -> int:
        """The run's wall time so far, ns (``run_stats().wall_ns`` without the statistics)."""
        return self._flush() - self._start_ns

    def run_snapshot(self) -> SpanSnapshot:
        """What ``run_stats`` returns, with the sorting for its percentiles left to
        ``SpanSnapshot.stats()``: the recent steps are copied (two ``memcpy``), so the statistics
        can be taken later, on any thread, as of now. An epoch end takes one for the report that
        may be written later (``report/writer.py``)."""
        now = self._flush()
        return self._run_snapshot_at(
            now,
            self._cpu_clock(),
            self._data_cpu_total,
            self._data_cpu_wall,
            self._data_still_total,
            self._data_cpu_valid_run,
            self._epochs,
            len(self._boundaries),
        )

    def _run_snapshot_at(
        self,
        now: int,
        cpu: int,
        data_cpu: int,
        data_cpu_wall: int,
        data_still: int,
        data_cpu_valid: bool,
        epochs: int,
        boundaries: int,
    ) -> SpanSnapshot:
        """The run's snapshot at ``now`` (the folded state is as of then), given what was read then."""
        flat = self._windows
        built_from, built_len, built = self._built_windows
        if built_from is not flat or built_len != len(flat):  # new windows closed, or a merge (a new list)
            start = built_len if built_from is flat and built_len <= len(flat) else 0
            built = (built if start else ()) + tuple(IdleWindow(*flat[i : i + 3]) for i in range(start, len(flat), 3))
            self._built_windows = (flat, len(flat), built)
        windows = built
        if self._win_steps * 2 >= self._window_steps:
            busy = self._totals[_COMPUTE]
            windows = (*built, IdleWindow(self._win_steps, now - self._win_start, busy - self._win_busy))
        kept = self._boundaries
        span = SpanStats(
            wall_ns=now - self._start_ns,
            steps=self._steps,
            epochs=epochs,
            step_total_ns=self._step_total,
            phase_ns=self._diff(self._totals, [0] * len(self._totals)),
            phase_counts=self._diff(self._counts, [0] * len(self._counts)),
            step=_UNSORTED,
            data_wait=_UNSORTED,
            data_cpu_ns=self._scaled_data_cpu(data_cpu, data_cpu_wall, self._totals[_DATA]) if data_cpu_valid else None,
            process_cpu_ns=cpu - self._cpu_start,
            boundaries=tuple(kept if boundaries >= len(kept) else kept[:boundaries]),
            windows=windows,
            data_still_ns=(
                self._scaled_data_cpu(data_still, data_cpu_wall, self._totals[_DATA]) if data_cpu_valid else None
            ),
        )
        return SpanSnapshot(span, *(self._recent_values(which, self._steps) for which in range(4)))

    # -- for samplers (off the hot path) --------------------------------------------------

    def watch(self, pid: int, on_enter: Callable[[], None], on_leave: Callable[[], None]) -> None:
        """Call ``on_enter`` / ``on_leave`` whenever phase ``pid`` is entered / left (one phase at a
        time; the listeners must not raise). Call from the training thread.

        The phases open now are taken as the methods' own (``enter`` ... ``leave``), so a
        ``leave`` that closes the watched phase calls ``on_leave``."""
        self._fold()
        self._tracked = [*self._stack, self._cur] if self._started else []
        self._on_watch_enter = on_enter
        self._on_watch_leave = on_leave
        self._watch = pid
        self._set_push()

    def unwatch(self) -> None:
        self._watch = -1
        self._tracked = []
        self._on_watch_enter = self._on_watch_leave = _nothing
        self._set_push()

    def phase_names(self) -> tuple[str, ...]:
        """Phase names indexed by phase id."""
        return tuple(self._names)

    def recent_record(self) -> RecentRecord:
        """The most recent steps as folded so far (a snapshot has just folded the log), oldest
        first: two copies of arrays, no loop over the steps."""
        now = self._clock()
        count = min(self._steps, self._ring_size)
        last = RECENT_COLUMNS - 1
        custom = self._names[last:]
        tail = custom[0] if len(custom) == 1 else "custom" if custom else ""
        columns = (*self._names[:last], *([""] * (last - len(self._names))), tail)
        end = self._ring_pos
        width = RECENT_COLUMNS
        phases = self._ring_phases
        if count <= end:
            start = self._ring_start[end - count : end]
            phase_ns = phases[(end - count) * width : end * width]
        else:
            start = self._ring_start[self._ring_size - (count - end) :] + self._ring_start[:end]
            phase_ns = phases[(self._ring_size - (count - end)) * width :] + phases[: end * width]
        return RecentRecord(columns, self._steps, start, phase_ns, now, self._origin_ns)

    def probe(self) -> PhaseProbe | None:
        """The phase in progress and the totals, read consistently from any thread; None before
        ``start`` or when the training thread kept rewriting the state during four attempts.

        Lock-free: the folded state is read between two equal, even readings of ``_folds``, and
        the events logged since (a copy of the log) are applied to that copy.
        """
        if not self._started:
            return None
        for _ in range(4):
            folds = self._folds
            if folds % 2:
                time.sleep(0)  # a fold is in progress on the training thread: let it finish
                continue
            cur = self._cur
            mark = self._mark
            totals = list(self._totals)
            stack = list(self._stack)
            events = self._log.copy()
            now = self._clock()
            if self._folds != folds or len(self._log) != len(events):
                continue  # folded, or an event was logged before ``now`` was read: read again
            cur, mark = _apply_phases(events, cur, mark, totals, stack)
            return PhaseProbe(now_ns=now, phase=cur, since_ns=mark, totals_ns=tuple(totals))
        return None

    # -- helpers -------------------------------------------------------------------------

    @staticmethod
    def _scaled_data_cpu(cpu_ns: int, sampled_wall_ns: int, data_wall_ns: int) -> int:
        """CPU of all in-process waits, from the sampled ones: their CPU share times the data time."""
        if sampled_wall_ns <= 0:
            return 0
        return round(min(1.0, cpu_ns / sampled_wall_ns) * data_wall_ns) if cpu_ns >= 0 else 0

    def _flush(self) -> int:
        """Fold the log and credit the current phase up to now, so totals are exact at this instant
        (while paused: up to the pause)."""
        self._fold()
        if self._paused_at is not None:
            return self._paused_at
        now = self._clock()
        self._folds += 1
        self._totals[self._cur] += now - self._mark
        self._mark = now
        self._folds += 1
        return now

    # -- StallScope's own work -----------------------------------------------------------

    @property
    def paused(self) -> bool:
        """Whether the clock is paused (``pause`` ... ``resume``)."""
        return self._paused_at is not None

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
        self._cut_out(gap, self._cpu_clock() - self._paused_cpu)
        self._data_t0 += gap
        self._paused_at = None
        self._folds += 1
        self._mark = now
        self._folds += 1

    def _cut_out(self, gap: int, cpu_gap: int) -> None:
        """``gap`` ns of wall time and ``cpu_gap`` of CPU, StallScope's own, belong to no phase,
        step, window, epoch or the run: what started before them moves later by as much."""
        self._start_ns += gap
        self._ep_start_ns += gap
        self._win_start += gap
        self._step_start += gap
        self._data_mark += gap
        self._cpu_start += cpu_gap
        self._ep_cpu += cpu_gap

    def _diff(self, now: list[int], then: list[int]) -> dict[str, int]:
        return _diff(self._names, len(self._names), now, then, self._counts)

    def _recent_values(self, which: int, count: int) -> array[int]:
        """A copy of the last ``count`` values of a ring (0: step times, 1: waits, 2: compute
        times, 3: phases entered), oldest first."""
        ring = (self._ring_step, self._ring_wait, self._ring_compute, self._ring_kinds)[which]
        count = min(count, self._ring_size)
        end = self._ring_pos
        if count <= end:
            return ring[end - count : end]
        return ring[self._ring_size - (count - end) :] + ring[:end]


def _uncolumns(columns: array[int], width: int) -> list[int]:
    """Totals of ``width`` phases whose ``_columns`` are ``columns`` (the custom phases' sum in the
    first custom one): what a step's start is compared with."""
    last = RECENT_COLUMNS - 1
    if width <= last:  # no custom phase: its column is 0
        return list(columns[:width])
    return [*columns, *([0] * (width - RECENT_COLUMNS))]


def _phase_rows(ends: list[int], begins: list[int], width: int) -> list[int]:
    """The ring's rows (``RECENT_COLUMNS`` a step) of steps whose totals at their end and at their
    start are ``ends`` and ``begins`` (``width`` a step), in loops over whole columns."""
    diff = list(map(sub, ends, begins))
    if width == RECENT_COLUMNS:
        return diff
    steps = len(diff) // width
    rows = [0] * (steps * RECENT_COLUMNS)
    last = RECENT_COLUMNS - 1
    for c in range(min(width, last)):
        rows[c::RECENT_COLUMNS] = diff[c::width]
    if width > RECENT_COLUMNS:  # several custom phases share the last column
        rows[last::RECENT_COLUMNS] = [sum(diff[i * width + last : (i + 1) * width]) for i in range(steps)]
    return rows


def _write_rows(ring: array[int], rows: list[int], at: int, size: int) -> None:
    """Write ``rows`` (``RECENT_COLUMNS`` ints each, of consecutive steps) into ``ring`` (``size``
    rows), the first at row ``at``, wrapping; only the last ``size`` rows when there are more."""
    width = RECENT_COLUMNS
    count = len(rows) // width
    if count > size:
        at = (at + count - size) % size
        rows = rows[(count - size) * width :]
        count = size
    first = min(count, size - at)
    if first:
        ring[at * width : (at + first) * width] = array("q", rows[: first * width])
    if count > first:
        ring[: (count - first) * width] = array("q", rows[first * width :])


def _columns(totals: list[int]) -> list[int]:
    """The phases' totals by column (``RECENT_COLUMNS``): the last sums the phases from its id on."""
    last = RECENT_COLUMNS - 1
    out = totals[:last]
    out += [0] * (last - len(out))
    out.append(sum(totals[last:]))
    return out


def _diff(names: list[str], known: int, now: list[int], then: list[int], counts: list[int]) -> dict[str, int]:
    """``now - then`` by phase name, for the first ``known`` phases: every built-in one, and a
    custom one when it has time in the span or was ever entered (``counts``)."""
    builtin = len(BUILTIN_PHASES)
    out = {names[i]: now[i] - then[i] for i in range(min(builtin, known))}
    for i in range(builtin, known):
        if now[i] - then[i] or counts[i]:
            out[names[i]] = now[i] - then[i]
    return out


def _apply_phases(events: list[int], cur: int, mark: int, totals: list[int], stack: list[int]) -> tuple[int, int]:
    """What ``Timeline._fold`` does to the phases, on copies: credits ``totals`` and moves
    ``stack``; returns the phase in progress and when it began (``probe``)."""
    pairs = iter(events)
    for code, t in zip(pairs, pairs, strict=False):  # a copy taken mid-append may end half-way
        top = max(code, cur)
        if top >= len(totals):  # a phase registered after ``totals`` was copied
            totals.extend([0] * (top + 1 - len(totals)))
        totals[cur] += t - mark
        mark = t
        if code >= 0:
            stack.append(cur)
            cur = code
        elif code in (STEP, WAIT):
            stack.append(cur)
            cur = _DATA
        elif code != END:  # LEAVE, GOT, NONE
            cur = stack.pop() if stack else _OTHER
    return cur, mark
