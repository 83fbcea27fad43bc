"""Gate on idle time from pytest: the same verdict as ``stallscope check``, as assertions.

    from stallscope.testing import assert_idle_below, assert_no_regression

    def test_training_keeps_the_gpu_busy(tmp_path):
        train(report_dir=tmp_path)                       # a short reference run under StallScope
        assert_idle_below(tmp_path, 0.30)
        assert_no_regression(tmp_path, "tests/baselines/", max_increase=0.02)   # 3+ healthy runs

Reports may be given as ``Report`` objects or as paths (a ``report.json`` or its folder); the
baseline also as a folder of several runs' reports or a list of any of these. A failed
assertion raises ``AssertionError`` whose message is what ``stallscope check`` prints: the numbers,
the phases that grew and the findings that explain them. Reports that cannot be read or compared
raise ``ReportError`` / ``ComparisonError``: a broken setup, not a regression.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

from stallscope.analysis.regression import (
    DEFAULT_FALSE_ALARM,
    DEFAULT_MAX_INCREASE,
    MIN_WINDOWS,
    GateSettings,
    Verdict,
    compare,
)
from stallscope.cli.verdict import format_verdict
from stallscope.report.history import load_reports
from stallscope.report.io import load_report
from stallscope.report.schema import Report

__all__ = ["assert_idle_below", "assert_no_regression", "load_report"]

ReportLike = Report | str | os.PathLike[str]


def _load(report: ReportLike) -> tuple[Report, str | None]:
    if isinstance(report, Report):
        return report, None
    return load_report(report), os.fspath(report)


def _load_many(reports: ReportLike | Sequence[ReportLike]) -> tuple[list[Report], list[str], str | list[str] | None]:
    """The baseline runs, their names (paths, or ``#i`` for ``Report`` objects) and the paths given."""
    items = [reports] if isinstance(reports, (Report, str, os.PathLike)) else list(reports)
    loaded: list[Report] = []
    names: list[str] = []
    given: list[str] = []
    for i, item in enumerate(items, start=1):
        if isinstance(item, Report):
            loaded.append(item)
            names.append(f"#{i}")
            continue
        given.append(os.fspath(item))
        more_names, more = load_reports([os.fspath(item)])
        loaded.extend(more)
        names.extend(more_names)
    if not loaded:
        raise ValueError("baseline must name at least one report")
    path: str | list[str] | None = None if not given else given[0] if len(given) == 1 else given
    return loaded, names, path


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
    baseline: ReportLike | Sequence[ReportLike],
    max_increase: float = DEFAULT_MAX_INCREASE,
    *,
    max_idle: float | None = None,
    false_alarm: float = DEFAULT_FALSE_ALARM,
    min_windows: int = MIN_WINDOWS,
    allow_mismatch: bool = False,
) -> Verdict:
    """Fail when ``report``'s idle fraction regressed against ``baseline``, as ``stallscope check``
    decides it: above ``max_increase`` and, with three or more baseline runs, above the healthy
    runs' prediction bound (a healthy run fails it with probability ``false_alarm``).

    ``baseline`` is one report, a folder of several runs' reports, or a list of either.
    Returns the verdict when it passes.
    """
    __tracebackhide__ = True
    settings = GateSettings(
        max_increase=max_increase, max_idle=max_idle, false_alarm=false_alarm, min_windows=min_windows
    )
    current, current_path = _load(report)
    bases, names, baseline_path = _load_many(baseline)
    labels = None if len(names) < 2 else [f"baseline run {n}" for n in names]
    verdict = compare(current, bases, settings, allow_mismatch=allow_mismatch, baseline_names=labels)
    if verdict.regressed:
        raise AssertionError(format_verdict(verdict, current_path=current_path, baseline_path=baseline_path))
    return verdict
