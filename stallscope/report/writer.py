"""The mid-run report writes, in proportion to the run: ``ReportWriter``.

A report write (building the run's statistics and findings, the JSON, the file) takes a few
milliseconds whatever the length of the epoch, and with many short epochs that alone cost more
than the training (docs/overhead.md, "Many short epochs"). So an epoch end *submits* its report,
as a builder (``Callable[[], Report]``), and the writer writes it:

* at once, on the caller's thread, when the time since the previous write ended is at least
  ``1 / share`` times what that write took (``share`` = 0.25%; the epoch panels have as much,
  so together they take at most about 0.5% of the run), and an epoch longer than that has each of
  its reports written at its end, as before. The first write waits as if a write of
  ``first_write_s`` had just ended when the writer was made (the session's: 5 ms, so 2 s): a
  run of many short epochs does not pay for a write at its very first epoch end;
* else later: it is kept as the pending report, and a background thread writes it once it has
  waited that long itself, unless an epoch end writes a newer one first (with short epochs, one
  soon does). While a report is pending, later epoch ends need not hand theirs in
  (``wants_report``): taking a report's snapshot costs tens of microseconds, which a 10 ms
  epoch should not pay each time. The wait, ``interval``, is ``write time / share``, at most
  ``max_interval_s``, so the file on disk is never more than two intervals (10 s) behind the
  latest epoch end, and usually less than one.

Writes are ordered: they happen under one lock, and a report is written only when it is newer
than the last one written. ``close`` drops the pending report and stops the thread; the final
report is then written by ``write_final`` (with ``fsync``), after any write in progress. An
error in the thread is kept and raised by the next ``submit``, on the training thread, as a
failed write at an epoch end always was.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path

from stallscope._threads import start_quiet
from stallscope.report.io import write_report
from stallscope.report.schema import Report

#: at most this share of the run's time goes to mid-run report writes (as much again to the
#: epoch panels: together 0.5%)
WRITE_SHARE = 0.0025
#: the longest wait between two mid-run writes (a write that takes more than 12.5 ms, on a slow
#: network disk, is then more than 0.25% of the time)
MAX_INTERVAL_S = 5.0
#: what the session's writer takes a write to cost before it has timed one. A run of short
#: epochs pays most for its first write: it makes the summaries of the epochs so far, the record
#: of the recent steps and their JSON (12 ms at 0.8 s into loop (d), a hundred epochs of 30 steps:
#: docs/overhead.md); a run killed by a signal after 2 s still leaves a report.
FIRST_WRITE_S = 0.005
#: how long ``close`` waits for a write in progress before going on (the final write still
#: waits for it, under the lock: it must come last)
JOIN_TIMEOUT_S = 5.0
#: a ``close`` that waited this long for a write in progress says so (seconds)
SLOW_CLOSE_S = 1.0


class ReportWriter:
    """Writes the reports of one run to ``path`` (see the module docstring)."""

    def __init__(
        self,
        path: Path,
        *,
        clock: Callable[[], int] = time.perf_counter_ns,
        share: float = WRITE_SHARE,
        max_interval_s: float = MAX_INTERVAL_S,
        write: Callable[..., object] | None = None,
        on_error: Callable[[OSError], None] | None = None,
        first_write_s: float = 0.0,
    ) -> None:
        self.path = path
        self._clock = clock
        #: the share of the run's time this writer's mid-run writes may take (read at each write:
        #: rank 0 of a job lowers it once it knows it writes two files)
        self.share = share
        self._max_interval_ns = round(max_interval_s * 1e9)
        #: ``write_report`` (looked up now, so a test can replace the module's)
        self._write = write if write is not None else write_report
        #: told of a write the file system refused (``OSError``), on the writing thread; the next
        #: epoch end's report is then written at once. Without it the error is raised.
        self._on_error = on_error
        #: guards everything below, and is held during each write (which orders them)
        self._cond = threading.Condition()
        #: (sequence number, builder) of the report waiting for its turn
        self._pending: tuple[int, Callable[[], Report]] | None = None
        #: when it was handed in (a clock reading)
        self._pending_since = 0
        self._submitted = 0
        self._written = 0
        #: the wait between writes that keeps them to ``share`` of the time, ns (the first: as if
        #: a write of ``first_write_s`` had just ended)
        self._interval_ns = min(self._max_interval_ns, round(first_write_s * 1e9 / share))
        #: no mid-run write before this clock reading
        self._next_ns = clock() + self._interval_ns if first_write_s > 0 else 0
        self._closed = False
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        #: mid-run writes so far (on either thread)
        self.writes = 0

    def wants_report(self, now: int | None = None) -> bool:
        """Whether an epoch end should hand in its report: a write is due, or none is pending.
        ``now``: a reading of the clock just taken."""
        return self._pending is None or (self._clock() if now is None else now) >= self._next_ns

    def submit(self, build: Callable[[], Report]) -> None:
        """An epoch's report: written now if the budget allows, else kept for later."""
        with self._cond:
            error, self._error = self._error, None
            if error is not None:
                raise error
            if self._closed:
                return
            self._submitted += 1
            now = self._clock()
            if now >= self._next_ns:
                self._pending = None
                self._write_locked(self._submitted, build)
                return
            self._pending = (self._submitted, build)
            self._pending_since = now
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="stallscope-report", daemon=True)
                start_quiet(self._thread)
            self._cond.notify()

    def close(self) -> float:
        """Drop the pending report and stop the thread (waiting a while for a write in progress).
        Returns the seconds it waited for a write in progress (0.0 when none was)."""
        start = time.perf_counter()
        with self._cond:  # held by the thread while it writes
            self._closed = True
            self._pending = None
            self._cond.notify()
            thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(JOIN_TIMEOUT_S)
        waited = time.perf_counter() - start
        return waited if waited >= SLOW_CLOSE_S else 0.0

    def write_final(self, report: Report) -> None:
        """Write ``report`` last: after any write in progress, durably, and no other after it."""
        with self._cond:
            self._closed = True
            self._pending = None
            self._written = self._submitted = self._submitted + 1
            try:
                self._write(report, self.path, durable=True)
            except OSError as exc:
                if self._on_error is None:
                    raise
                self._on_error(exc)

    # -- the thread ------------------------------------------------------------------------

    def _run(self) -> None:
        with self._cond:
            while not self._closed:
                pending = self._pending
                if pending is None:
                    self._cond.wait()
                    continue
                # an epoch end has the first chance to write a newer one
                wait_ns = max(self._next_ns, self._pending_since + self._interval_ns) - self._clock()
                if wait_ns > 0:
                    # a clock a test drives does not move while this waits: look again each second
                    self._cond.wait(min(wait_ns / 1e9, 1.0))
                    continue
                self._pending = None
                try:
                    self._write_locked(*pending)
                except BaseException as exc:
                    self._error = exc  # raised by the next ``submit``, on the training thread
                    return

    def _write_locked(self, number: int, build: Callable[[], Report]) -> None:
        """Build and write report ``number`` (the lock is held); set when the next may be written."""
        if number <= self._written:
            return
        start = self._clock()
        try:
            self._write(build(), self.path, durable=False)
        except OSError as exc:
            if self._on_error is None:
                raise
            self._on_error(exc)
            self._next_ns = 0  # the next report is tried at once
            return
        self._written = number
        self.writes += 1
        end = self._clock()
        self._interval_ns = min(self._max_interval_ns, round((end - start) / self.share))
        self._next_ns = end + self._interval_ns
