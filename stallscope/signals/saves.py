"""What a checkpoint save is made of, as an asynchronous save would split it.

An asynchronous save (Lightning's ``AsyncCheckpointIO``, ``torch.distributed.checkpoint.async_save``,
a background thread of the user's) first copies the state on the training thread, so that
training may change it, then writes the copy from another thread. The copy is new work: a
blocking ``torch.save`` reads the tensors where they are. So ``checkpoint.frequency`` needs,
for each save, how long the write takes, how much of that is CPU work (which a background thread
still does on one of the host's cores) and how many bytes the copy would move.

**Per save**, on the training thread (a plain loop's ``checkpoint`` phase; in Lightning, the
checkpoint IO's ``save_checkpoint``, the call ``AsyncCheckpointIO`` moves to its thread): the
save's wall time, the thread's CPU time in it (the rest is waiting: an ``fsync``, a disk, a
network store) and the bytes the process handed to ``write()`` meanwhile (``wchar`` of
``/proc/self/io``, ``procfs.written_bytes``). Two clock reads at each end; the file is read by a
thread of its own, which each end asks and waits for at most ``READ_DEADLINE_S`` (a read of /proc
can block for good, and none is made on the training thread; a reader that missed the deadline
once is not asked again, and the bytes are then unknown), some 50 us a save.

**Once per run**, after the first save that wrote bytes: what a copy of that many bytes costs
here (``probe_copy_s``: one tensor of the save's size, at least 256 KiB and at most 64 MiB,
filled, then cloned three times; the median wall time per byte). The hooks run it with the
timeline paused, so it is in no phase. A clone is what ``AsyncCheckpointIO`` does to each tensor
of the checkpoint; it allocates fresh memory, so it costs more than a ``memcpy`` into memory
already mapped (on the 2-core test host: about 0.42 ms per MB, 2.4 GB/s).

Every reading is contained: a missing ``/proc/self/io`` (not Linux) leaves the bytes unknown, a
probe that fails leaves the copy unknown, and the rule then falls back to counting the saves
removed.
"""

from __future__ import annotations

import queue
import statistics
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from stallscope._threads import start_quiet
from stallscope.signals.calls import Marks, NestedMeter
from stallscope.signals.procfs import written_bytes

#: the copy probe's size: the save's bytes, within these bounds. The size matters: glibc serves
#: an allocation of 32 MiB or more with fresh pages every time (each page faulted in: about 0.42
#: ms per MB on the 2-core test host), a smaller one often from memory the process already has
#: (several times faster), as the copies of a real asynchronous save would be. 64 MiB bounds the
#: probe's memory (twice that, for a moment) and time (about 120 ms once per run; a save that
#: large takes longer than that itself)
PROBE_MIN_BYTES = 1 << 18
PROBE_MAX_BYTES = 1 << 26
#: clones timed by the probe (their median is taken)
PROBE_REPEATS = 3


@dataclass(frozen=True)
class SaveSummary:
    """The saves measured so far in a run (totals over them)."""

    #: saves measured (a Lightning burst of top-k and ``last`` saves is two)
    saves: int
    #: their wall time, ns
    wall_ns: int
    #: CPU time of the training thread in them, ns (the rest of ``wall_ns`` it waited)
    cpu_ns: int
    #: bytes the process wrote during them; None when that could not be read
    bytes: int | None
    #: seconds a copy of one byte takes on the training thread (``probe_copy_s``); None before
    #: the probe ran or when it failed
    copy_s_per_byte: float | None
    #: the saves already go through an asynchronous writer (Lightning's ``AsyncCheckpointIO``)
    already_async: bool = False

    @property
    def measured(self) -> bool:
        """Whether the split is known: bytes written and the copy's cost."""
        return self.saves > 0 and self.bytes is not None and self.bytes > 0 and self.copy_s_per_byte is not None


def probe_copy_s(
    nbytes: float, *, repeats: int = PROBE_REPEATS, clock: Callable[[], int] = time.perf_counter_ns
) -> float | None:
    """Seconds per byte that a ``clone()`` of a CPU tensor of about ``nbytes`` bytes takes here:
    one tensor of ``nbytes`` (at least ``PROBE_MIN_BYTES``, at most ``PROBE_MAX_BYTES``), filled
    (a copy of memory never written reads the kernel's zero page, and is too fast), cloned
    ``repeats`` times; the median. None without torch, or when anything fails."""
    torch: Any = sys.modules.get("torch")
    if torch is None or repeats < 1:
        return None
    size = int(min(max(nbytes, PROBE_MIN_BYTES), PROBE_MAX_BYTES))
    try:
        source = torch.empty(size, dtype=torch.uint8)
        source.fill_(1)
        times = []
        for _ in range(repeats):
            start = clock()
            copy = source.clone()
            times.append(clock() - start)
            del copy
        del source
    except Exception:  # out of memory, a torch without CPU tensors: no figure, no harm
        return None
    median = statistics.median(times)
    return median / 1e9 / size if median > 0 else None


#: reads of ``/proc/self/io`` not answered yet, at most; past that the saves' bytes are unknown
MAX_PENDING_READS = 256


#: how long a save's begin or end waits for its read of ``/proc/self/io``, seconds (a read takes
#: some microseconds; once one misses this, the saves' bytes are not read again until that read
#: is done: unknown)
READ_DEADLINE_S = 0.05


class _Read:
    """One read of the bytes written, made by ``_Reader``'s thread: ``value`` once ``done``."""

    __slots__ = ("done", "event", "value")

    def __init__(self, value: int | None = None, *, done: bool = False) -> None:
        self.value = value
        self.done = done
        self.event = threading.Event()


class _Reader:
    """A daemon thread that reads ``/proc/self/io`` when asked: a read of /proc can block for
    good, and none is made on the training thread (SPEC §6). The asking thread waits for the
    answer at most ``READ_DEADLINE_S`` (the wait releases the GIL, so the read is made at once,
    and the bytes stay those of the save); a read that misses it marks the reader slow, and it is
    not asked again until that read is done: a read that blocks for good costs one wait, a thread
    that a busy machine scheduled late costs that save's bytes."""

    def __init__(self, read: Callable[[], int | None]) -> None:
        self._read = read
        self._queue: queue.SimpleQueue[_Read | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self.slow = False
        #: the read that missed its deadline (``slow``), until it is done
        self._late: _Read | None = None

    def ask(self) -> _Read:
        if self.slow:
            late = self._late
            if late is None or not late.event.is_set():
                return _Read(None, done=True)  # unknown: the bytes of this save are not read
            self.slow, self._late = False, None  # the late read came back: the reader is free
        slot = _Read()
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="stallscope-save-bytes", daemon=True)
            start_quiet(self._thread)
        self._queue.put(slot)
        if not slot.event.wait(READ_DEADLINE_S):
            self.slow, self._late = True, slot
        return slot

    def stop(self) -> None:
        """End the thread once it is done with what it was asked (a wedged read: never)."""
        thread = self._thread
        if thread is None:
            return
        self._queue.put(None)
        if not self.slow:
            thread.join(READ_DEADLINE_S)

    def _run(self) -> None:
        while True:
            slot = self._queue.get()
            if slot is None:
                return
            try:
                slot.value = self._read()
            except Exception:
                slot.value = None
            slot.done = True
            slot.event.set()


class SaveMeter(NestedMeter):
    """Measures each save on the training thread (``begin`` / ``end``, nested calls count once:
    its wall time, the training thread's CPU and the bytes written) and, once per run, the cost of
    a copy (``probe``). Its readers never raise. The bytes written are read by a thread of their
    own (``_Reader``) unless ``written`` is given (tests pass a scripted one, read in place)."""

    def __init__(
        self,
        *,
        clock: Callable[[], int] = time.perf_counter_ns,
        cpu_clock: Callable[[], int] = time.thread_time_ns,
        written: Callable[[], int | None] | None = None,
        probe: Callable[[float], float | None] = probe_copy_s,
    ) -> None:
        super().__init__(clock=clock, cpu_clock=cpu_clock)
        self._written = written
        self._reader = _Reader(written_bytes) if written is None else None
        #: (begin, end) reads of each save not yet added to ``_bytes``, oldest first
        self._reads: list[tuple[_Read, _Read]] = []
        self._begin_read = self._end_read = _Read(done=True)
        self._probe = probe
        self._bytes = 0
        self._bytes_known = True
        self._probed = False
        self._copy_s_per_byte: float | None = None
        #: the saves already go through an asynchronous writer (set by the Lightning hooks)
        self.already_async = False

    def _read_bytes(self) -> _Read:
        if self._reader is not None:
            return self._reader.ask()
        assert self._written is not None
        return _Read(self._written(), done=True)

    def _open(self) -> Marks:
        self._begin_read = self._read_bytes()  # first: the bytes' window holds the clocks'
        cpu, now, _ = super()._open()
        return cpu, now, None

    def _close(self) -> Marks:
        cpu, now, _ = super()._close()
        self._end_read = self._read_bytes()
        return cpu, now, None

    def _add(self, start: Marks, end: Marks, weight: int) -> None:
        super()._add(start, end, weight)
        if len(self._reads) >= MAX_PENDING_READS:  # the reader does not answer: bytes unknown
            self._bytes_known = False
            self._reads.clear()
        if self._bytes_known:
            self._reads.append((self._begin_read, self._end_read))
        self._settle_reads()

    def _settle_reads(self) -> None:
        """Add the bytes of the saves whose reads are in, oldest first (never waits)."""
        done = 0
        for begin, end in self._reads:
            if not (begin.done and end.done):
                break
            done += 1
            if begin.value is None or end.value is None:
                self._bytes_known = False
            else:
                self._bytes += max(0, end.value - begin.value)
        del self._reads[:done]
        if not self._bytes_known:
            self._reads.clear()

    def close(self) -> None:
        """The run is over: the reader thread ends (what was read stays)."""
        if self._reader is not None:
            self._reader.stop()

    @property
    def wants_probe(self) -> bool:
        """The copy has not been probed yet and a save wrote bytes: probe now (once per run)."""
        self._settle_reads()
        return not self._probed and self._bytes_known and self._bytes > 0 and self._depth == 0

    def probe(self) -> None:
        """Time a copy of one save's bytes (the mean so far), once. The caller pauses the timeline."""
        if not self.wants_probe:
            return
        self._probed = True
        self._copy_s_per_byte = self._probe(self._bytes / self._calls)

    def summary(self) -> SaveSummary | None:
        """The saves so far; None before the first."""
        if self._calls == 0:
            return None
        self._settle_reads()
        return SaveSummary(
            saves=self._calls,
            wall_ns=self._wall_ns,
            cpu_ns=self._cpu_ns,
            bytes=self._bytes if self._bytes_known else None,
            copy_s_per_byte=self._copy_s_per_byte,
            already_async=self.already_async,
        )
