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

import signal
import threading


def start_quiet(thread: threading.Thread) -> None:
    """Start ``thread`` with every signal blocked in it (where threads have signal masks)."""
    mask = getattr(signal, "pthread_sigmask", None)
    if mask is None:  # no POSIX signal masks (Windows)
        thread.start()
        return
    previous = mask(signal.SIG_BLOCK, signal.valid_signals())
    try:
        thread.start()
    finally:
        mask(signal.SIG_SETMASK, previous)
