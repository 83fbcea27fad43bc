"""Device-side busy time of the compute phase from CUDA events, resolved lazily; pinned batches.

On a CUDA run the timeline calls ``begin`` / ``end`` when the ``compute`` phase is entered and
left (``Timeline.watch``). Each records a CUDA event on the current stream: recording is
asynchronous, nothing waits for the device. Pairs queue up and are resolved later, oldest first,
once ``query()`` says the end event has happened, every ``POLL_EVERY`` phases and at each epoch
end; ``elapsed_time`` then gives the time the device spent between them. Never ``synchronize()``.
The queue is bounded: when the device falls far behind, phases go untimed (counted) rather than
piling up events. Events are pooled and reused.

Recording costs the host: on an H100 host two records cost about 38 us, 2.5% of a 1.5 ms step
there. So not every compute phase is timed: a phase is timed when at least the records' measured cost
over ``TIMING_BUDGET`` of host time (16 ms for 40 us) has passed since the last timed one begun,
which keeps timing within that share of the host's time (the gap is at most ``MAX_GAP_NS``,
below: records dearer than 250 us would take more): every phase of steps that long, about one
in eleven of 1.5 ms steps. The busy time of a window is the mean device time of the timed
phases resolved in it, times the compute phases it began, timed or not: an estimate for steps
that vary, exact for steps that repeat. A phase still on the device when its window closes is
resolved in a later window and counts there in the mean; its window counted it by number, so it
is neither lost nor counted twice.

The device span of a compute phase runs from when the device reached its first piece of work to
when it finished the last; gaps in between (a launch-bound loop) count as busy, so the idle
fraction from CUDA events is a lower bound.

Short windows. An epoch of a few dozen short steps may have only a timed phase or two resolved
(or none: its events still on the device when it ends), and its idle fraction then swung
between sources and values from one epoch to the next (seen on an H100: most epochs 0% idle
from CUDA events, some 90% from NVML). A window with fewer than ``MIN_WINDOW_PHASES`` resolved
timed phases takes its busy time per compute phase from the run's timed phases so far
(``CudaSummary.borrowed``), once the run has that many. That mean is the whole run's: one odd
phase (a recompilation, an autotuning step) weighs on every borrowed window after it.

Warm-up. A process's first compute phase is where CUDA initialises lazily (the cuBLAS handle,
each kernel's module at its first launch): the host spends up to a second there while the
device, past the start event, waits, and that whole span would read as busy. Scaled up to the
untimed phases it once made a data-bound run on an H100 read "GPU 0% idle". So a timer leaves
its first ``WARMUP_PHASES`` compute phases untimed (the others' busy time stands in for them),
and the wait between timed phases is at most ``MAX_GAP_NS`` whatever a first record cost.

Also here: whether the run computes on CUDA at all (``cuda_in_use``), facts about the CUDA device
read on the training thread without initialising CUDA (``cuda_facts``), and ``batch_pinning``,
which tells whether a batch lies in pinned memory.
"""

from __future__ import annotations

import sys
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

#: most compute phases waiting to be resolved
MAX_PENDING = 256
#: resolve finished pairs every this many timed compute phases
POLL_EVERY = 16
#: most of the host's time the event records may take (module doc)
TIMING_BUDGET = 0.0025
#: a window with fewer resolved timed phases than this borrows the run's busy time per phase
#: (module doc, "Short windows")
MIN_WINDOW_PHASES = 4
#: compute phases a timer leaves untimed at its start: CUDA's lazy initialisation (module doc)
WARMUP_PHASES = 1
#: the longest wait between two timed phases, ns (at 40 us for two records the budget asks
#: for 16 ms; a first record that also initialises CUDA's events must not stretch it to seconds)
MAX_GAP_NS = 100_000_000


class EventLike(Protocol):
    """The part of ``torch.cuda.Event`` used here."""

    def record(self) -> None: ...

    def query(self) -> bool: ...

    def elapsed_time(self, end_event: Any) -> float: ...


@dataclass(frozen=True)
class CudaSummary:
    """Device-side timing of the compute phase over one window."""

    #: device time of the window's compute phases, ns: the mean device time (between start and
    #: end events) of the timed phases resolved in the window, times the compute phases the
    #: window began (timed or not); see ``borrowed``
    busy_ns: int
    #: compute phases timed and resolved
    phases: int
    #: compute phases not counted: the queue of pairs was full, or the timer was released with
    #: them still on the device
    dropped: int
    #: phases still in flight on the device when the window closed (resolved in a later window)
    pending: int
    #: batches checked for pinned memory, and how many of them held pageable CPU tensors
    batches_checked: int = 0
    pageable_batches: int = 0
    #: compute phases left untimed, to keep the records' cost down or as the timer's warm-up
    #: (counted in ``busy_ns``)
    untimed: int = 0
    #: ``busy_ns`` is the window's compute phases times the run's busy time per timed phase: the
    #: window had fewer than ``MIN_WINDOW_PHASES`` of its own (module doc, "Short windows")
    borrowed: bool = False

    @property
    def timed(self) -> bool:
        """Whether ``busy_ns`` measures the window: from its own timed phases or the run's."""
        return self.phases > 0 or self.borrowed


@dataclass(frozen=True)
class CudaDevice:
    """Facts about the CUDA device torch uses, read without initialising CUDA."""

    index: int
    name: str
    #: UUID as NVML spells it (``GPU-…``), None when torch does not report one
    uuid: str | None
    #: compute capability (major, minor)
    capability: tuple[int, int]
    total_memory_bytes: int
    #: peak memory torch's caching allocator reserved in this process, bytes
    max_reserved_bytes: int
    #: peak memory held by tensors, bytes
    max_allocated_bytes: int
    #: whether float32 matmuls may use TF32 (``torch.backends.cuda.matmul.allow_tf32``)
    tf32_matmul: bool


class CudaComputeTimer:
    """Times the compute phase on the device with pooled CUDA events. See the module docstring.

    ``begin`` and ``end`` run on the hot path and never raise: a failure turns the timer off and
    leaves a note.
    """

    def __init__(
        self,
        new_event: Callable[[], EventLike],
        *,
        max_pending: int = MAX_PENDING,
        poll_every: int = POLL_EVERY,
        clock: Callable[[], int] = time.perf_counter_ns,
        warmup: int = WARMUP_PHASES,
    ) -> None:
        self._new_event = new_event
        self._clock = clock
        self._max_pending = max_pending
        self._poll_every = max(1, poll_every)
        self._free: list[EventLike] = []
        self._pending: deque[tuple[EventLike, EventLike]] = deque()
        self._open: EventLike | None = None
        self._depth = 0
        self._ended = 0
        self.enabled = True
        self.note: str | None = None
        # cumulative counters; windows are differences
        self._busy_ns = 0
        self._phases = 0
        self._dropped = 0
        self._checked = 0
        self._pageable = 0
        self._started = 0  # timed phases whose start was recorded
        self._untimed = 0
        # sampling (module doc): host time between timed phases, from the records' cost
        self.gap_ns = 0.0
        self._last_begin_ns: int | None = None
        self._record_ns = 0.0  # the records' cost per timed phase (start + end), smoothed
        self._open_cost_ns = 0
        #: compute phases still to be left untimed at the start (module doc, "Warm-up")
        self._warmup = max(0, warmup)
        self._mark = (0, 0, 0, 0, 0, 0, 0)
        self._group_mark = (0, 0, 0, 0, 0, 0, 0)

    # -- hot path ------------------------------------------------------------------------

    def begin(self) -> None:
        """The compute phase starts: record a start event."""
        self._depth += 1
        if self._depth > 1 or not self.enabled:
            return
        if self._warmup:
            self._warmup -= 1
            self._untimed += 1
            return
        try:
            t0 = self._clock()
            if self._last_begin_ns is not None and t0 - self._last_begin_ns < self.gap_ns:
                self._untimed += 1
                return
            self._last_begin_ns = t0
            if len(self._pending) >= self._max_pending:
                self._poll()
                if len(self._pending) >= self._max_pending:
                    self._dropped += 1
                    return
            event = self._free.pop() if self._free else self._new_event()
            event.record()
            self._open = event
            self._started += 1
            self._open_cost_ns = self._clock() - t0
        except Exception as exc:
            self._fail(exc)

    def end(self) -> None:
        """The compute phase ends: record an end event and queue the pair."""
        self._depth = max(0, self._depth - 1)
        start = self._open
        if self._depth > 0 or start is None:
            return
        self._open = None
        if not self.enabled:
            return
        try:
            t0 = self._clock()
            event = self._free.pop() if self._free else self._new_event()
            event.record()
            cost = self._open_cost_ns + self._clock() - t0
            self._record_ns = cost if self._record_ns <= 0 else 0.8 * self._record_ns + 0.2 * cost
            self.gap_ns = min(MAX_GAP_NS, self._record_ns / TIMING_BUDGET)
            self._pending.append((start, event))
            self._ended += 1
            if self._ended % self._poll_every == 0:
                self._poll()
        except Exception as exc:
            self._fail(exc)

    # -- resolution ----------------------------------------------------------------------

    def _poll(self) -> None:
        pending = self._pending
        while pending:
            start, end = pending[0]
            if not (end.query() and start.query()):
                break
            pending.popleft()
            self._busy_ns += max(0, round(start.elapsed_time(end) * 1e6))
            self._phases += 1
            self._free.append(start)
            self._free.append(end)

    def poll(self) -> None:
        """Resolve the pairs the device has finished (training thread; never waits)."""
        if not self.enabled:
            return
        try:
            self._poll()
        except Exception as exc:
            self._fail(exc)

    def release(self) -> None:
        """The run is over: resolve what the device has finished, then let go of every event.

        Called in the training process while CUDA is valid there. An event still held when the
        timer becomes garbage could be collected in a DataLoader worker forked later (a second
        fit in the same process), whose CUDA cannot be used: destroying it there aborts the
        worker (seen on an H100: ``cudaErrorInitializationError`` in ``ExchangeDevice``)."""
        try:
            if self.enabled:
                self._poll()
        finally:
            self._dropped += len(self._pending)
            self._pending.clear()
            self._free.clear()
            self._open = None
            self._new_event = _no_event

    def note_batch(self, pinned: int, pageable: int) -> None:
        """A batch was checked: ``pinned`` / ``pageable`` CPU tensors in it."""
        if pinned or pageable:
            self._checked += 1
            if pageable:
                self._pageable += 1

    def _fail(self, exc: BaseException) -> None:
        self.enabled = False
        self._pending.clear()
        self._free.clear()
        self._open = None
        self.note = f"CUDA-event timing of the compute phase turned itself off ({type(exc).__name__}: {exc})"

    # -- summaries -----------------------------------------------------------------------

    def _totals(self) -> tuple[int, int, int, int, int, int, int]:
        return (self._busy_ns, self._phases, self._dropped, self._checked, self._pageable, self._started, self._untimed)

    def close_window(self) -> CudaSummary | None:
        """The window since the previous call; starts the next."""
        self.poll()
        now = self._totals()
        before, self._mark = self._mark, now
        return self._summary(now, before)

    def close_group(self) -> CudaSummary | None:
        """The window since the previous call (the epochs diagnosed together); starts the next."""
        self.poll()
        now = self._totals()
        before, self._group_mark = self._group_mark, now
        return self._summary(now, before)

    def run_summary(self) -> CudaSummary | None:
        self.poll()
        return self._summary(self._totals(), (0, 0, 0, 0, 0, 0, 0))

    def _summary(self, now: tuple[int, ...], before: tuple[int, ...]) -> CudaSummary | None:
        busy, phases, dropped, checked, pageable, started, untimed = (a - b for a, b in zip(now, before, strict=True))
        run_busy, run_phases = now[0], now[1]
        # the window's own compute phases, timed or not: each counts for the busy time per phase
        # of the phases resolved in the window (some of which an earlier window began), so a
        # phase still on the device when its window closed is neither lost nor counted twice
        count = started + untimed
        borrowed = phases < MIN_WINDOW_PHASES <= run_phases and count > 0
        if borrowed:  # too few resolved: the run's busy time per phase instead
            busy = round(run_busy / run_phases * count)
        elif phases == 0 and checked == 0:
            return None
        elif phases > 0:
            busy = round(busy / phases * count)
        return CudaSummary(
            busy_ns=busy,
            phases=phases,
            dropped=dropped,
            pending=len(self._pending),
            batches_checked=checked,
            pageable_batches=pageable,
            untimed=untimed,
            borrowed=borrowed,
        )


def _no_event() -> EventLike:
    raise RuntimeError("the CUDA-event timer was released")


# -- torch, only when the user's code already initialised CUDA ----------------------------------


def cuda_in_use(torch: Any) -> bool:
    """Whether this process computes on CUDA: the user's code initialised CUDA and holds tensors
    on the device (torch's caching allocator counts their bytes). CUDA initialised with nothing
    on the device (a library that probed it, an evaluation that is over) is a run on the CPU: its
    compute phases would time nothing on the device, and NVML would report another process's
    use of the GPU as this run's. Never initialises CUDA; may raise on a broken install."""
    return bool(torch.cuda.is_initialized()) and _allocated_bytes(torch) > 0


def _allocator_stats(torch: Any, index: int | None = None) -> dict[str, Any] | None:
    """The caching allocator's statistics as torch keeps them (nested: ``stats["allocated_bytes"]
    ["all"]["current"]``), or None where this torch does not offer them so. ``memory_allocated``
    and the other one-number functions each flatten the whole table in Python first: about 250 us
    each on an H100 host, which an epoch end paid several times over."""
    nested = getattr(torch.cuda, "memory_stats_as_nested_dict", None)
    if nested is None:
        return None
    stats = nested(index)
    return stats if isinstance(stats, dict) else None


def _stat(stats: dict[str, Any], *path: str) -> int | None:
    value: Any = stats
    for key in path:
        value = value.get(key) if isinstance(value, dict) else None
    return int(value) if isinstance(value, int) else None


def _allocated_bytes(torch: Any) -> int:
    stats = _allocator_stats(torch)
    if stats is None:
        return int(torch.cuda.memory_allocated())
    return _stat(stats, "allocated_bytes", "all", "current") or 0


def cuda_allocations(torch: Any) -> int | None:
    """How many allocations torch's caching allocator has made on the current device since the
    process began (a count that only grows: every step of a model on the GPU allocates its
    activations); None when the allocator does not say, or torch is not imported (``torch``:
    the module, or None). Only once CUDA is in use."""
    if torch is None:
        return None
    try:
        backend = getattr(torch.cuda, "get_allocator_backend", None)
        if backend is not None and backend() != "native":
            return None  # cudaMallocAsync keeps no such count (its tables read 0)
        stats = _allocator_stats(torch)
        if stats is not None:
            count = _stat(stats, "allocation", "all", "allocated")
        else:
            count = torch.cuda.memory_stats().get("allocation.all.allocated")
    except Exception:
        return None
    # holding tensors takes at least one allocation: a count of 0 is an allocator that does not count
    return int(count) if isinstance(count, int) and count > 0 else None


def _cuda_torch(*, in_use: bool = False) -> Any:
    """torch, when it is imported and the run computes on CUDA (``cuda_in_use``, unless the
    caller saw it in use: ``in_use``); else None."""
    torch: Any = sys.modules.get("torch")
    if in_use:
        return torch
    try:
        if torch is not None and cuda_in_use(torch):
            return torch
    except Exception:
        return None
    return None


def event_factory() -> Callable[[], EventLike] | None:
    """``torch.cuda.Event(enable_timing=True)`` when CUDA is in use; else None."""
    torch = _cuda_torch()
    if torch is None:
        return None

    def new_event() -> EventLike:
        event: EventLike = torch.cuda.Event(enable_timing=True)
        return event

    return new_event


def cuda_facts(*, in_use: bool = False) -> CudaDevice | None:
    """The CUDA device torch uses on this thread, or None when CUDA is not in use (``in_use``:
    the caller saw it in use, and only its peak memory is wanted anew)."""
    torch = _cuda_torch(in_use=in_use)
    if torch is None:
        return None
    try:
        index = int(torch.cuda.current_device())
        stats = _allocator_stats(torch, index)
        if stats is not None:
            max_reserved = _stat(stats, "reserved_bytes", "all", "peak") or 0
            max_allocated = _stat(stats, "allocated_bytes", "all", "peak") or 0
        else:
            max_reserved = int(torch.cuda.max_memory_reserved(index))
            max_allocated = int(torch.cuda.max_memory_allocated(index))
        props = torch.cuda.get_device_properties(index)
        raw = getattr(props, "uuid", None)
        uuid = None if raw is None else str(raw)
        if uuid is not None and not uuid.startswith(("GPU-", "MIG-")):
            uuid = f"GPU-{uuid}"
        return CudaDevice(
            index=index,
            name=str(props.name),
            uuid=uuid,
            capability=(int(props.major), int(props.minor)),
            total_memory_bytes=int(props.total_memory),
            max_reserved_bytes=max_reserved,
            max_allocated_bytes=max_allocated,
            tf32_matmul=bool(torch.backends.cuda.matmul.allow_tf32),
        )
    except Exception:
        return None


def batch_pinning(batch: object, limit: int = 16, *, in_use: bool = False) -> tuple[int, int]:
    """(pinned, pageable) CPU tensors among the first ``limit`` tensors of a batch (nested tuples,
    lists, dicts). (0, 0) when CUDA is not in use: pinning matters only for copies to a GPU, and
    asking a tensor without CUDA could initialise it (``in_use``: the caller saw it in use)."""
    torch = _cuda_torch(in_use=in_use)
    if torch is None:
        return 0, 0
    pinned = pageable = seen = 0
    stack = [batch]
    while stack and seen < 4 * limit and pinned + pageable < limit:
        item = stack.pop()
        seen += 1
        if isinstance(item, torch.Tensor):
            if item.device.type == "cpu":
                if item.is_pinned():
                    pinned += 1
                else:
                    pageable += 1
        elif isinstance(item, (list, tuple)):
            stack.extend(item)
        elif isinstance(item, dict):
            stack.extend(item.values())
    return pinned, pageable
