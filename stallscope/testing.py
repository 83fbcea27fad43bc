"""Gate on idle time from pytest: the same verdict as ``stallscope check``, as assertions.

    from stallscope.testing import assert_idle_below, assert_no_regression

    def test_training_keeps_the_gpu_busy(tmp_path):
        train(report_dir=tmp_path)                       # a short reference run under StallScope
        assert_idle_below(tmp_path, 0.30)
        assert_no_regression(tmp_path, "tests/baselines/report.json", max_increase=0.02)

Reports may be given as ``Report`` objects or as paths (a ``report.json`` or its folder). A failed
assertion raises ``AssertionError`` whose message is what ``stallscope check`` prints: the numbers,
the phases that grew and the findings that explain them. Reports that cannot be read or compared
raise ``ReportError`` / ``ComparisonError``: a broken setup, not a regression.
"""

from __future__ import annotations

import os

from stallscope.analysis.regression import DEFAULT_MAX_INCREASE, MIN_WINDOWS, GateSettings, Verdict, compare
from stallscope.cli.verdict import format_verdict
from stallscope.report.io import load_report
from stallscope.report.schema import Report

__all__ = ["assert_idle_below", "assert_no_regression", "load_report"]

ReportLike = Report | str | os.PathLike[str]


def _load(report: ReportLike) -> tuple[Report, str | None]:
    if isinstance(report, Report):
        return report, None
    return load_report(report), os.fspath(report)


def assert_idle_below(report: ReportLike, bound: float) -> Verdict:
    """Fail when the run's accelerator idle fraction is above ``bound`` (a fraction in [0, 1]).

    Returns the verdict when it passes.
    """
    __tracebackhide__ = True  # pytest: show the caller's line, not this helper's
    if not 0.0 <= bound <= 1.0:
        raise ValueError(f"bound must be a fraction in [0, 1], got {bound!r}")
    current, path = _load(report)
    verdict = compare(current, None, GateSettings(max_idle=bound))
    if verdict.regressed:
        raise AssertionError(format_verdict(verdict, current_path=path))
    return verdict


def assert_no_regression(
    report: ReportLike,
    baseline: ReportLike,
    max_increase: float = DEFAULT_MAX_INCREASE,
    *,
    max_idle: float | None = None,
    min_windows: int = MIN_WINDOWS,
    allow_mismatch: bool = False,
) -> Verdict:
    """Fail when ``report``'s idle fraction regressed against ``baseline``, as ``stallscope check``
    decides it (threshold ``max_increase`` plus the bootstrap noise check).

    Returns the verdict when it passes.
    """
    __tracebackhide__ = True
    settings = GateSettings(max_increase=max_increase, max_idle=max_idle, min_windows=min_windows)
    current, current_path = _load(report)
    base, baseline_path = _load(baseline)
    verdict = compare(current, base, settings, allow_mismatch=allow_mismatch)
    if verdict.regressed:
        raise AssertionError(format_verdict(verdict, current_path=current_path, baseline_path=baseline_path))
    return verdict
