"""The seam every background signal source fits: the ``Sampler`` protocol and a periodic thread.

A sampler watches something besides the training loop (the GPU through NVML, the process tree
through psutil) from its own daemon thread, and summarises what it saw over *windows*: the
current window (an epoch) is closed with ``close_window``, and ``run_summary`` covers everything
since ``start``. Summaries are built from running tallies, so memory stays bounded however long
the run is; the raw samples themselves are kept only in a small ring (``recent``) for a future
trace export.

Failures stay inside: an exception in a sample turns that sampler off, with a note for the
report, and never reaches the training thread. ``stop`` never hangs: it sets the stop event and
joins with a timeout.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Generic, Protocol, TypeVar

S_co = TypeVar("S_co", covariant=True)
S = TypeVar("S")
R = TypeVar("R")
T = TypeVar("T")

Clock = Callable[[], int]

#: samples kept in each sampler's ring of recent raw samples
RING_SIZE = 512
#: how long ``stop`` waits for the thread, seconds
JOIN_TIMEOUT_S = 1.0
#: how long the training thread waits for a sampler's lock at an epoch end, seconds
LOCK_TIMEOUT_S = 0.5


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
    """Base of a sampler driven by a daemon thread: ``while not stop.wait(interval): sample_once()``.

    Subclasses implement ``_setup`` (runs first, on the thread), ``_tick(now_ns)`` (one sample; runs
    with ``self._lock`` held), ``_teardown`` and the summaries. Tests call ``sample_once`` directly
    with a fake clock instead of starting the thread.
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
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(self._join_timeout_s)
            if thread.is_alive():
                self.note(f"the {self.name} sampler did not stop within {self._join_timeout_s:.1f} s and was abandoned")
                self._enabled = False
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
        try:
            self._setup()
        except Exception as exc:
            self.disable(exc)
        while self._enabled and not self._stop.wait(self.interval_s):
            self.sample_once()
        try:
            self._teardown()
        except Exception as exc:
            self.note(f"the {self.name} sampler failed to shut down cleanly ({type(exc).__name__}: {exc})")

    def sample_once(self) -> None:
        """Take one sample now; an exception turns the sampler off."""
        if not self._enabled:
            return
        try:
            with self._lock:
                self._tick(self._clock())
                self.ticks += 1
        except Exception as exc:
            self.disable(exc)

    def sample_now(self, tick: Callable[[int], None] | None = None) -> None:
        """Take one sample on the calling thread (an epoch end), waiting at most ``LOCK_TIMEOUT_S``
        for a sample in progress on the sampler's thread. ``tick``: a cheaper sample than
        ``_tick`` for the training thread to take (called with the lock held, like ``_tick``)."""
        if not self._enabled or not self._locked():
            return
        try:
            (tick or self._tick)(self._clock())
            self.ticks += 1
        except Exception as exc:
            self.disable(exc)
        finally:
            self._lock.release()

    def disable(self, exc: BaseException | None = None, reason: str = "") -> None:
        """Turn this sampler off (the others and the training go on)."""
        if exc is not None:
            reason = f"{type(exc).__name__}: {exc}"
        if self._enabled:
            self.note(f"{self.name} sampling is off: {reason or 'stopped'}")
        self._enabled = False
        self._stop.set()

    def _locked(self) -> bool:
        """Take the lock for a summary on the training thread, without ever waiting long."""
        if self._lock.acquire(timeout=LOCK_TIMEOUT_S):
            return True
        self.disable(reason=f"a sample took longer than {LOCK_TIMEOUT_S} s")
        return False

    def _with_lock(self, read: Callable[[], T]) -> T | None:
        """``read()`` with the lock held, or None when the lock could not be had in time."""
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
        """Take one sample at ``now_ns`` (called with the lock held)."""
        raise NotImplementedError

    def _teardown(self) -> None:
        """Runs once on the thread after the last sample."""

    def _finish(self) -> None:
        """Runs on the caller of ``stop`` after the thread ended (or was abandoned)."""
