"""StallScope's background threads take no process signals: ``start_quiet``.

A signal sent to the process (SIGCHLD when a DataLoader worker dies, SIGINT from Ctrl-C, a
scheduler's SIGTERM) goes to one thread that does not block it, chosen by the kernel, and that
may be one of StallScope's. Python runs its handler in the main thread all the same, but a main
thread blocked in a wait (the DataLoader's ``queue.get(timeout=...)``) is woken only by a signal
delivered to it: a killed worker was reported after the loader's 60 s timeout instead of at once
(seen once in a full test-suite run). A new thread inherits its creator's signal mask, so
StallScope starts its threads with every signal blocked: the process's signals reach the user's
threads as they would without StallScope.
"""

from __future__ import annotations

import importlib
import signal
import threading
from typing import Any

try:  # the C functions behind ``signal``'s: they take and give ints, where ``signal``'s wrappers
    # make an enum of each of the 62 signals twice a call (about 0.3 ms a thread started)
    _masks: Any = importlib.import_module("_signal")
except ImportError:  # another Python: the wrappers
    _masks = signal

#: every signal, as ints, read once
_ALL = frozenset(int(s) for s in signal.valid_signals()) if hasattr(signal, "valid_signals") else frozenset()


def start_quiet(thread: threading.Thread) -> None:
    """Start ``thread`` with every signal blocked in it (where threads have signal masks)."""
    mask = getattr(_masks, "pthread_sigmask", None)
    if mask is None or not _ALL:  # no POSIX signal masks (Windows)
        thread.start()
        return
    # the mask read first, changing nothing: each call also runs the handlers of signals already
    # pending, and one that raises (a Ctrl-C just then) must not leave this thread's signals blocked
    previous = mask(signal.SIG_BLOCK, ())
    try:
        mask(signal.SIG_BLOCK, _ALL)
        thread.start()
    finally:
        mask(signal.SIG_SETMASK, previous)
