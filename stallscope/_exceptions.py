"""StallScope's exceptions and its one warning class.

    StallScopeError            anything StallScope raises on purpose
     ├── ReportError           a report file that is missing, unreadable, malformed or of an
     │                         unsupported schema_version
     └── ComparisonError       two reports that cannot be compared fairly (CPU vs GPU, different
                               idle measurement, step counts far apart, a run with no steps)

    PossibleFalsePositiveWarning   a finding or a measurement that may not mean what it seems
                                   (a very short run, a clock that went backwards, ...)

Bad constructor arguments raise the built-in ``ValueError``, naming the value.

``from_signal_handler`` tells StallScope's own failures from the user's exceptions that merely
surfaced while StallScope's code ran (a signal handler's).
"""

from __future__ import annotations

import signal


class StallScopeError(Exception):
    """Base class of every exception StallScope raises on purpose."""


class ReportError(StallScopeError):
    """A report file could not be read as a StallScope report."""


class ComparisonError(StallScopeError):
    """Two reports (a run and its baseline) that cannot be compared fairly."""


class PossibleFalsePositiveWarning(UserWarning):
    """A measurement or finding that may be a false positive."""


def from_signal_handler(exc: BaseException) -> bool:
    """Whether ``exc`` was raised by a Python signal handler that happened to run while
    StallScope's own code did (a handler runs between any two bytecodes of the main thread).
    Such an exception is the user's, not a failure of StallScope's: torch's SIGCHLD handler, for
    one, raises ``RuntimeError`` in the training loop when a DataLoader worker dies. Read only on
    the failure path; never raises."""
    try:
        handlers = set()
        for signum in signal.valid_signals():
            code = getattr(signal.getsignal(signum), "__code__", None)
            if code is not None:
                handlers.add(code)
        tb = exc.__traceback__
        while tb is not None:
            if tb.tb_frame.f_code in handlers:
                return True
            tb = tb.tb_next
    except Exception:
        return False
    return False
