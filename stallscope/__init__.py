"""StallScope: why is the accelerator waiting, and which change buys the most time?

Public API (everything else is private and may change)::

    from stallscope import StallScope
    with StallScope(report_dir="runs/scope") as scope:
        for batch in scope.iter(loader):
            with scope.phase("compute"):
                ...
"""

from stallscope._exceptions import ComparisonError, PossibleFalsePositiveWarning, ReportError, StallScopeError
from stallscope._version import __version__
from stallscope.analysis.finding import Finding
from stallscope.hooks.scope import StallScope
from stallscope.report.io import load_report
from stallscope.report.schema import Report

__all__ = [
    "ComparisonError",
    "Finding",
    "PossibleFalsePositiveWarning",
    "Report",
    "ReportError",
    "StallScope",
    "StallScopeError",
    "__version__",
    "load_report",
]
