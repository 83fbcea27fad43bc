"""StallScope's exceptions and its one warning class.

    StallScopeError            anything StallScope raises on purpose
     ├── ReportError           a report file that is missing, unreadable, malformed or of an
     │                         unsupported schema_version
     └── ComparisonError       two reports that cannot be compared fairly (CPU vs GPU, different
                               idle measurement, step counts far apart, a run with no steps)

    PossibleFalsePositiveWarning   a finding or a measurement that may not mean what it seems
                                   (a very short run, a clock that went backwards, ...)

Bad constructor arguments raise the built-in ``ValueError``, naming the value.
"""

from __future__ import annotations


class StallScopeError(Exception):
    """Base class of every exception StallScope raises on purpose."""


class ReportError(StallScopeError):
    """A report file could not be read as a StallScope report."""


class ComparisonError(StallScopeError):
    """Two reports (a run and its baseline) that cannot be compared fairly."""


class PossibleFalsePositiveWarning(UserWarning):
    """A measurement or finding that may be a false positive."""
