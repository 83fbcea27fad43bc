"""The seam every background signal source fits: the ``Sampler`` protocol and a periodic thread.

A sampler watches something besides the training loop (the GPU through NVML, the process tree
through psutil) from its own daemon thread, and summarises what it saw over *windows*: the
current window (an epoch) is closed with ``close_window``, and ``run_summary`` covers everything
since ``start``. Summaries are built from running tallies, so memory stays bounded however long
the run is; the raw samples themselves are kept only in a small ring (``recent``) for a future
trace export.

Failures stay inside: an exception in a sample turns that sampler off, with a note for the
report, and never reaches the training thread. Nothing on the training thread waits on a
sampler's reads: they run on the sampler's own thread (NVML calls, /proc and psutil reads can
block for good on a wedged driver or a process stuck in the kernel), and the lock a summary takes
is held only while a sample's readings are added to the tallies, never around a read. Where an
epoch end wants a sample taken right then (the host sampler closes its window where the epoch
ends), it asks the sampler's thread for one and waits for it at most ``FRESH_DEADLINE_S``, and
only while that thread is answering: a thread in the middle of a sample is not waited for, and
one that missed the deadline once is not asked again. A sample in progress for longer than
``STUCK_AFTER_S`` turns the sampler off, with a note. A sampler that is off costs nothing.
``stop`` never hangs: it sets the stop event and joins with a timeout, and does not join a
thread that is stuck in a sample.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Generic, Protocol, TypeVar

from stallscope._threads import start_quiet

S_co = TypeVar("S_co", covariant=True)
S = TypeVar("S")
R = TypeVar("R")
T = TypeVar("T")

Clock = Callable[[], int]

#: samples kept in each sampler's ring of recent raw samples
RING_SIZE = 512
#: how long ``stop`` waits for a thread that is between samples (it then takes its last sample
#: and ends), seconds; a thread in the middle of a sample gets ``FRESH_DEADLINE_S`` at most
JOIN_TIMEOUT_S = 0.5
#: how long the training thread waits for a sampler's lock (held only while a sample's readings
#: are added to the tallies, so never long unless something is badly wrong), seconds
LOCK_TIMEOUT_S = 0.5
#: how long an epoch end waits for a sample it asked the sampler's thread for, seconds (once
#: missed, the sampler is not asked again: its windows then close at its latest sample)
FRESH_DEADLINE_S = 0.1
#: a sample in progress for longer than this is stuck (a wedged driver, a read that never
#: returns): the sampler turns itself off, seconds
STUCK_AFTER_S = 2.0


class Sampler(Protocol[S_co]):
    """A background signal source, summarised per window (an epoch) and for the whole run."""

    #: short name used in notes and thread names (``nvml``, ``host``)
    name: str

    def start(self) -> None:
        """Begin sampling (returns at once; the work happens on the sampler's thread)."""

    def stop(self) -> None:
        """Stop sampling; returns within about ``JOIN_TIMEOUT_S`` whatever the thread is doing."""

    def close_window(self) -> S_co | None:
        """Summary of the window since the previous ``close_window`` (or ``start``); starts the next.
        None when nothing was measured."""

    def run_summary(self) -> S_co | None:
        """Summary of everything since ``start``; None when nothing was measured."""

    def notes(self) -> tuple[str, ...]:
        """What the report should say about this sampler (missing library, metric not supported...)."""


class PeriodicSampler(Generic[S, R]):
    """Base of a sampler driven by a daemon thread: one sample every ``interval_s``, or at once
    when an epoch end asks for one (``_fresh``), until ``stop``.

    Subclasses implement ``_setup`` (runs first, on the thread), ``_tick(now_ns)`` (one sample: it
    reads without the lock, then holds ``self._lock`` only while it adds what it read to the
    tallies the summaries read), ``_final_tick`` (runs on the thread after the last regular
    sample), ``_teardown`` and the summaries. Tests call ``sample_once`` directly with a fake clock
    instead of starting the thread.
    """

    name = "sampler"

    def __init__(
        self,
        *,
        interval_s: float,
        clock: Clock = time.perf_counter_ns,
        ring_size: int = RING_SIZE,
        join_timeout_s: float = JOIN_TIMEOUT_S,
    ) -> None:
        if not interval_s > 0:
            raise ValueError(f"interval_s must be > 0, got {interval_s!r}")
        self.interval_s = float(interval_s)
        self._clock = clock
        self._join_timeout_s = join_timeout_s
        self._stop = threading.Event()
        #: set to wake the thread early: by ``stop``, or by a request for a sample (``_fresh``)
        self._wake = threading.Event()
        #: the sample an epoch end asked for (the tick to take), and the event that says it is done
        self._wanted: Callable[[int], None] | None = None
        self._served = threading.Event()
        #: the thread missed a requested sample's deadline once: it is not asked again
        self._slow = False
        #: ``time.monotonic()`` when the sample in progress on the thread began; None between samples
        self._busy_since: float | None = None
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._ring: deque[R] = deque(maxlen=ring_size)
        self._notes: list[str] = []
        self._enabled = True
        #: samples taken
        self.ticks = 0

    # -- lifecycle -----------------------------------------------------------------------

    def start(self) -> None:
        if self._thread is not None or not self._enabled:
            return
        self._thread = threading.Thread(target=self._run, name=f"stallscope-{self.name}", daemon=True)
        start_quiet(self._thread)

    def request_stop(self) -> None:
        """Tell the thread to take its last sample and end, without waiting for it (``stop``
        waits): several samplers told first take their last samples together."""
        self._stop.set()
        self._wake.set()

    def stop(self) -> None:
        self.request_stop()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            since = self._busy_since
            if since is None:  # between samples: it wakes at once, takes its last one and ends
                thread.join(self._join_timeout_s)
            elif time.monotonic() - since < FRESH_DEADLINE_S:  # in a sample that just began
                thread.join(FRESH_DEADLINE_S)
            # else: stuck in a sample, not waited for
            if thread.is_alive() and self._enabled:
                self.note(f"the {self.name} sampler did not stop (a sample had not returned) and was abandoned")
                self._enabled = False
                self._turned_off()
        self._finish()

    @property
    def enabled(self) -> bool:
        """False once the sampler turned itself off (or could not start)."""
        return self._enabled

    def notes(self) -> tuple[str, ...]:
        return tuple(self._notes)

    def note(self, text: str) -> None:
        if text not in self._notes:
            self._notes.append(text)

    def recent(self) -> list[R]:
        """The most recent raw samples (at most the ring size), oldest first."""
        with self._lock:
            return list(self._ring)

    # -- the thread ----------------------------------------------------------------------

    def _run(self) -> None:
        # BaseException: a SystemExit or KeyboardInterrupt raised inside a library call would
        # otherwise end this thread silently, with no note
        try:
            self._busy_since = time.monotonic()
            try:
                self._setup()
            finally:
                self._busy_since = None
        except BaseException as exc:
            self.disable(exc)
        while self._enabled:
            self._wake.wait(self.interval_s)
            self._wake.clear()  # before the flags are read: a request made after this wakes us again
            if self._stop.is_set():
                break
            wanted, self._wanted = self._wanted, None
            self.sample_once(wanted)
            if wanted is not None:
                self._served.set()
        if self._enabled:
            self.sample_once(self._final_tick)
        try:
            self._teardown()
        except BaseException as exc:
            self.note(f"the {self.name} sampler failed to shut down cleanly ({type(exc).__name__}: {exc})")

    def sample_once(self, tick: Callable[[int], None] | None = None) -> None:
        """Take one sample now (``tick``: instead of ``_tick``); an exception turns the sampler off."""
        if not self._enabled:
            return
        self._busy_since = time.monotonic()
        try:
            (tick or self._tick)(self._clock())
            self.ticks += 1
        except Exception as exc:
            self.disable(exc)
        except BaseException as exc:  # SystemExit from a library: off, with a note; on the
            if threading.current_thread() is not self._thread:  # training thread Ctrl-C is the user's
                raise
            self.disable(exc)
        finally:
            self._busy_since = None

    def _fresh(self, tick: Callable[[int], None] | None = None) -> None:
        """A sample now, for an epoch end: taken by the sampler's thread (``tick``: instead of
        ``_tick``), waiting at most ``FRESH_DEADLINE_S`` for it, and only while the thread
        answers (see the module docstring). Without a thread (tests drive ``sample_once``) it is
        taken here. Otherwise the summary that follows uses the latest sample."""
        if not self._enabled:
            return
        thread = self._thread
        if thread is None:
            self.sample_once(tick)
            return
        if self._slow or self.check_stuck() or self._busy_since is not None or not thread.is_alive():
            return
        self._served.clear()
        self._wanted = tick or self._tick
        self._wake.set()
        if not self._served.wait(FRESH_DEADLINE_S):
            self._slow = True  # not asked again: its windows close at its latest sample

    def check_stuck(self) -> bool:
        """True when a sample has been in progress on the thread for longer than ``STUCK_AFTER_S``:
        the sampler is then off (one note), and its thread abandoned."""
        since = self._busy_since
        if since is None or time.monotonic() - since <= STUCK_AFTER_S:
            return False
        if self._enabled:
            self.disable(reason=f"a sample has not returned for more than {STUCK_AFTER_S:.0f} s (abandoned)")
        return True

    def disable(self, exc: BaseException | None = None, reason: str = "") -> None:
        """Turn this sampler off (the others and the training go on)."""
        if exc is not None:
            reason = f"{type(exc).__name__}: {_text(exc)}"
        if self._enabled:
            self.note(f"{self.name} sampling is off: {reason or 'stopped'}")
            self._turned_off()
        self._enabled = False
        self._stop.set()
        self._wake.set()

    def _turned_off(self) -> None:
        """Runs once when the sampler turns itself off (subclasses note what that leaves out)."""

    def _locked(self) -> bool:
        """Take the lock for a summary on the training thread, without ever waiting long (and not
        at all once the sampler is off)."""
        if not self._enabled:
            return self._lock.acquire(blocking=False)
        if self._lock.acquire(timeout=LOCK_TIMEOUT_S):
            return True
        self.disable(reason=f"a sample took longer than {LOCK_TIMEOUT_S} s")
        return False

    def _with_lock(self, read: Callable[[], T]) -> T | None:
        """``read()`` with the lock held, or None when the lock could not be had in time. (A
        summary is where a sample stuck on the thread is found: the sampler then turns off.)"""
        self.check_stuck()
        if not self._locked():
            return None
        try:
            return read()
        finally:
            self._lock.release()

    # -- for subclasses ------------------------------------------------------------------

    def _setup(self) -> None:
        """Runs once on the thread before the first sample."""

    def _tick(self, now_ns: int) -> None:
        """Take one sample at ``now_ns`` (read first, then add it to the tallies with the lock held)."""
        raise NotImplementedError

    def _final_tick(self, now_ns: int) -> None:
        """The last sample, on the thread once it is asked to stop (by default none)."""

    def _teardown(self) -> None:
        """Runs once on the thread after the last sample."""

    def _finish(self) -> None:
        """Runs on the caller of ``stop`` after the thread ended (or was abandoned)."""


def _text(exc: BaseException) -> str:
    """``str(exc)``, which runs code of the exception's own and may itself fail."""
    try:
        return str(exc)
    except Exception:
        return type(exc).__name__
