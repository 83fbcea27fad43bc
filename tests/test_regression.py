"""The CI gate's verdict (stallscope.analysis.regression) on synthetic window lists."""

from __future__ import annotations

from dataclasses import replace

import pytest
from gate_reports import data_workers, logging_frequency, make_report, windows

from stallscope._exceptions import ComparisonError, ReportError
from stallscope.analysis.regression import (
    GateSettings,
    Window,
    bootstrap_increase,
    compare,
    comparison_problem,
    explaining_findings,
    phase_deltas,
    phase_of,
    weighted_mean,
    windows_of,
)


def _w(values: list[float]) -> list[Window]:
    return [Window(v, 1.0) for v in values]


# -- bootstrap -------------------------------------------------------------------------------


def test_same_distribution_interval_includes_zero() -> None:
    iv = bootstrap_increase(_w(windows(0.4, 20, sd=0.08, seed=1)), _w(windows(0.4, 20, sd=0.08, seed=2)))
    assert iv.low < 0 < iv.high
    assert not iv.above_zero
    assert (iv.current_windows, iv.baseline_windows) == (20, 20)


def test_shifted_distribution_interval_above_zero() -> None:
    iv = bootstrap_increase(_w(windows(0.5, 20, sd=0.08, seed=1)), _w(windows(0.4, 20, sd=0.08, seed=2)))
    assert iv.above_zero
    assert 0.0 < iv.low < 0.1 < iv.high < 0.2


def test_bootstrap_is_deterministic_for_a_seed() -> None:
    cur, base = _w(windows(0.45, 12, seed=3)), _w(windows(0.4, 12, seed=4))
    assert bootstrap_increase(cur, base, seed=7) == bootstrap_increase(cur, base, seed=7)
    assert bootstrap_increase(cur, base, seed=7) != bootstrap_increase(cur, base, seed=8)


def test_interval_narrows_with_more_windows() -> None:
    few = bootstrap_increase(_w(windows(0.4, 8, seed=1)), _w(windows(0.4, 8, seed=2)))
    many = bootstrap_increase(_w(windows(0.4, 200, seed=1)), _w(windows(0.4, 200, seed=2)))
    assert many.high - many.low < few.high - few.low


def test_interval_coverage_matches_confidence() -> None:
    """Across many same-distribution pairs, a 90% interval misses zero about 10% of the time."""
    misses = 0
    for seed in range(100):
        iv = bootstrap_increase(
            _w(windows(0.4, 16, sd=0.05, seed=2 * seed)),
            _w(windows(0.4, 16, sd=0.05, seed=2 * seed + 1)),
            confidence=0.90,
            resamples=500,
        )
        misses += not iv.low <= 0 <= iv.high
    assert 2 <= misses <= 25


def test_weighted_mean_uses_wall_time() -> None:
    assert weighted_mean([Window(1.0, 3.0), Window(0.0, 1.0)]) == pytest.approx(0.75)
    assert weighted_mean([]) == 0.0


def test_bootstrap_needs_windows() -> None:
    with pytest.raises(ValueError, match="at least one window"):
        bootstrap_increase([], _w([0.1]))


def test_windows_of_checks_values_and_falls_back_to_equal_weights() -> None:
    r = make_report(0.3, window_idle=[0.2, 0.4])
    assert [w.weight for w in windows_of(r.summary)] == [0.2, 0.2]
    unknown = replace(r.summary, idle_windows=({"idle_fraction": 0.2, "wall_s": 0.0}, {"idle_fraction": 0.4}))
    assert [w.weight for w in windows_of(unknown)] == [1.0, 1.0]
    broken = replace(r.summary, idle_windows=({"idle_fraction": 1.5},))
    with pytest.raises(ReportError, match=r"idle_windows\[0\]\.idle_fraction"):
        windows_of(broken)


# -- the verdict -----------------------------------------------------------------------------


def test_same_distribution_passes_even_above_threshold() -> None:
    """+3 points with noisy windows: over the 2-point threshold, but the interval includes zero."""
    base = make_report(0.40, window_idle=windows(0.40, 10, sd=0.1, seed=1))
    cur = make_report(0.43, window_idle=windows(0.43, 10, sd=0.1, seed=2))
    v = compare(cur, base)
    assert v.method == "bootstrap"
    assert v.over_threshold
    assert v.interval is not None
    assert not v.interval.above_zero
    assert v.within_noise
    assert not v.regressed
    assert v.exit_code == 0


def test_shifted_distribution_fails() -> None:
    base = make_report(0.20, window_idle=windows(0.20, 10, seed=1))
    cur = make_report(0.35, window_idle=windows(0.35, 10, seed=2), findings=[data_workers()])
    v = compare(cur, base)
    assert v.method == "bootstrap"
    assert v.regressed
    assert v.exit_code == 1
    assert v.increase == pytest.approx(0.15)
    assert [d.phase for d in v.grown_phases] == ["data"]
    assert v.explanations[0].finding.id == "data.workers"
    assert v.explanations[0].new
    assert v.explanations[0].grown_phase == "data"


def test_significant_but_small_increase_passes() -> None:
    """Tight windows make +1 point significant, but it is under the threshold."""
    base = make_report(0.20, window_idle=windows(0.20, 50, sd=0.002, seed=1))
    cur = make_report(0.21, window_idle=windows(0.21, 50, sd=0.002, seed=2))
    v = compare(cur, base)
    assert v.interval is not None
    assert v.interval.above_zero
    assert not v.over_threshold
    assert not v.regressed


def test_few_windows_falls_back_to_threshold() -> None:
    base = make_report(0.40, window_idle=windows(0.40, 5, sd=0.1, seed=1))
    cur = make_report(0.43, window_idle=windows(0.43, 5, sd=0.1, seed=2))
    v = compare(cur, base)
    assert v.method == "threshold"
    assert v.interval is None
    assert v.regressed  # the same numbers pass with enough windows (above)
    assert any("too few idle windows" in n and "threshold alone" in n for n in v.notes)


def test_few_windows_under_threshold_passes() -> None:
    v = compare(make_report(0.41, window_idle=[0.41]), make_report(0.40, window_idle=[0.40]))
    assert v.method == "threshold"
    assert not v.regressed


def test_min_windows_is_a_setting() -> None:
    base = make_report(0.40, window_idle=windows(0.40, 5, sd=0.1, seed=1))
    cur = make_report(0.43, window_idle=windows(0.43, 5, sd=0.1, seed=2))
    assert compare(cur, base, GateSettings(min_windows=4)).method == "bootstrap"


def test_max_increase_is_respected() -> None:
    base = make_report(0.20, window_idle=windows(0.20, 10, seed=1))
    cur = make_report(0.35, window_idle=windows(0.35, 10, seed=2))
    assert not compare(cur, base, GateSettings(max_increase=0.2)).regressed


def test_improvement_passes() -> None:
    v = compare(make_report(0.1, window_idle=windows(0.1, 10)), make_report(0.5, window_idle=windows(0.5, 10)))
    assert not v.regressed
    assert v.increase == pytest.approx(-0.4)


def test_max_idle_without_baseline() -> None:
    v = compare(make_report(0.6, findings=[data_workers()]), None, GateSettings(max_idle=0.5))
    assert v.method == "ceiling"
    assert v.regressed
    assert v.over_max_idle
    assert v.explanations[0].finding.id == "data.workers"
    assert not compare(make_report(0.4), None, GateSettings(max_idle=0.5)).regressed


def test_max_idle_fails_even_without_regression() -> None:
    report = make_report(0.6, window_idle=windows(0.6, 10))
    v = compare(report, report, GateSettings(max_idle=0.5))
    assert v.increase == 0.0
    assert v.regressed
    assert v.over_max_idle
    assert not v.over_threshold


def test_needs_baseline_or_max_idle() -> None:
    with pytest.raises(ValueError, match="baseline or a max_idle"):
        compare(make_report(0.1), None)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"device": "cuda"}, "ran on cpu and the current run on cuda"),
        ({"idle_source": "nvml"}, "measured with host_phases in the baseline and with nvml"),
        ({"steps": 1000}, "160 steps and the current run 1000"),
    ],
)
def test_mismatched_runs_raise(kwargs: dict[str, object], match: str) -> None:
    base = make_report(0.2)
    cur = make_report(0.2, **kwargs)  # type: ignore[arg-type]
    with pytest.raises(ComparisonError, match=match):
        compare(cur, base)
    v = compare(cur, base, allow_mismatch=True)
    assert any(n.startswith("compared although") for n in v.notes)


def test_close_step_counts_and_gpu_indices_are_comparable() -> None:
    assert comparison_problem(make_report(0.2, steps=300), make_report(0.2, steps=160)) is None
    gpu = {"device": "cuda", "idle_source": "cuda_events"}
    assert comparison_problem(make_report(0.2, **gpu), make_report(0.2, **gpu)) is None  # type: ignore[arg-type]


def test_run_without_steps_is_an_error() -> None:
    with pytest.raises(ComparisonError, match="no steps"):
        compare(make_report(0.0, steps=0), make_report(0.2), allow_mismatch=True)
    with pytest.raises(ComparisonError, match="no steps"):
        compare(make_report(0.0, steps=0), None, GateSettings(max_idle=0.5))


def test_incomplete_reports_are_noted() -> None:
    v = compare(make_report(0.2, complete=False), make_report(0.2, complete=False))
    assert sum("epoch end" in n for n in v.notes) == 2


@pytest.mark.parametrize(
    "kwargs",
    [
        {"max_increase": -0.1},
        {"max_increase": 1.5},
        {"max_idle": 2.0},
        {"min_windows": 1},
        {"resamples": 10},
        {"confidence": 1.0},
        {"max_step_ratio": 0.5},
    ],
)
def test_settings_are_validated(kwargs: dict[str, float]) -> None:
    with pytest.raises(ValueError, match=next(iter(kwargs))):
        GateSettings(**kwargs)  # type: ignore[arg-type]


# -- explanation -----------------------------------------------------------------------------


def test_phase_deltas_largest_growth_first() -> None:
    base = make_report(0.2, phases={"data": 0.2, "compute": 0.8})
    cur = make_report(0.5, phases={"data": 0.4, "compute": 0.5, "logging": 0.1})
    deltas = phase_deltas(cur.summary, base.summary)
    assert [d.phase for d in deltas] == ["data", "logging", "compute"]
    assert deltas[0].delta == pytest.approx(0.2)
    assert deltas[1].baseline == 0.0


def test_findings_about_grown_phases_come_first() -> None:
    base = make_report(0.2, phases={"data": 0.2, "compute": 0.8})
    cur = make_report(
        0.5,
        phases={"data": 0.2, "compute": 0.5, "logging": 0.3},
        findings=[data_workers(0.4), logging_frequency(0.1)],
    )
    grown = [d for d in phase_deltas(cur.summary, base.summary) if d.delta > 0]
    out = explaining_findings(cur, base, grown)
    assert [e.finding.id for e in out] == ["logging.frequency", "data.workers"]
    assert out[0].grown_phase == "logging"
    assert out[1].grown_phase is None


@pytest.mark.parametrize(
    ("finding_id", "phase"),
    [
        ("data.workers", "data"),
        ("data.pin_memory", "h2d"),
        ("checkpoint.frequency", "checkpoint"),
        ("host.sync", "compute"),
        ("host.memory", None),
    ],
)
def test_phase_of(finding_id: str, phase: str | None) -> None:
    assert phase_of(finding_id) == phase
