"""The CI gate's verdict (stallscope.analysis.regression) on synthetic reports; the expected
verdicts come from numbers worked out by hand in each test's docstring."""

from __future__ import annotations

from dataclasses import replace

import pytest
from gate_reports import data_workers, logging_frequency, make_report, windows

from stallscope._exceptions import ComparisonError, ReportError
from stallscope.analysis.regression import (
    GateSettings,
    compare,
    compare_paired,
    comparison_problem,
    explaining_findings,
    phase_deltas,
    phase_of,
    windows_of,
)
from stallscope.report.schema import Report


def _runs(*idle: float, **kw: object) -> list[Report]:
    return [make_report(v, window_idle=windows(v, 10, seed=i), **kw) for i, v in enumerate(idle)]  # type: ignore[arg-type]


def test_windows_of_checks_values_and_falls_back_to_equal_weights() -> None:
    r = make_report(0.3, window_idle=[0.2, 0.4])
    assert [w.weight for w in windows_of(r.summary)] == [0.2, 0.2]
    unknown = replace(r.summary, idle_windows=({"idle_fraction": 0.2, "wall_s": 0.0}, {"idle_fraction": 0.4}))
    assert [w.weight for w in windows_of(unknown)] == [1.0, 1.0]
    broken = replace(r.summary, idle_windows=({"idle_fraction": 1.5},))
    with pytest.raises(ReportError, match=r"idle_windows\[0\]\.idle_fraction"):
        windows_of(broken)


# -- three or more baseline runs: the healthy runs' prediction bound ----------------------------
# 30%, 32%, 34% idle: mean 32%, sd 2 points, 99% bound 0.32 + 6.9646 * 0.02 * sqrt(4/3) = 48.08%.


def test_increase_within_the_healthy_runs_bound_passes() -> None:
    v = compare(make_report(0.47, window_idle=windows(0.47, 10, seed=9)), _runs(0.30, 0.32, 0.34))
    assert v.method == "prediction"
    assert v.increase == pytest.approx(0.15)
    assert v.over_threshold
    assert v.over_bound is False
    assert v.within_noise
    assert v.spread is not None
    assert v.spread.bound == pytest.approx(0.48084, abs=1e-4)
    assert v.allowed_increase == pytest.approx(0.16084, abs=1e-4)
    assert not v.regressed
    assert v.close  # +15 of the allowed +16.1 points


def test_increase_beyond_the_bound_fails() -> None:
    v = compare(make_report(0.49, findings=[data_workers()]), _runs(0.30, 0.32, 0.34))
    assert v.over_bound is True
    assert v.regressed
    assert v.exit_code == 1
    assert v.explanations[0].finding.id == "data.workers"
    assert v.explanations[0].new


def test_the_threshold_still_applies_when_the_runs_agree_closely() -> None:
    """30.0/30.1/30.2%: bound 30.1 + 8.042 * 0.1 = 30.90%. 31.5% is above it but only +1.4 points."""
    bases = _runs(0.300, 0.301, 0.302)
    small = compare(make_report(0.315), bases)
    assert small.over_bound is True
    assert not small.over_threshold
    assert not small.regressed
    assert small.allowed_increase == pytest.approx(0.02)
    assert compare(make_report(0.322), bases).regressed  # +2.1 points, above the bound too


def test_the_issue_s_noisy_healthy_runs() -> None:
    """77.1, 70.1, 68.8% (one noisy job, three healthy runs): mean 72.0%, sd 4.464 points, bound
    72.0 + 8.042 * 4.464 = 107.9%: a healthy rerun 8 points up passes, and the output says that
    such a spread can only catch increases above +35.9 points."""
    v = compare(make_report(0.80), _runs(0.771, 0.701, 0.688))
    assert v.spread is not None
    assert v.spread.sd == pytest.approx(0.044643, abs=1e-5)
    assert v.spread.bound == pytest.approx(1.0790, abs=1e-3)
    assert not v.regressed
    assert any("only an increase above +35.9 points can fail" in n for n in v.notes)


def test_a_bursty_regression_is_not_called_noise() -> None:
    """Idle time in a few windows (a validation three times a run instead of once; window means
    40% and 60%). The windows alone cannot tell it from noise; the run-level numbers do: 39, 40,
    41% -> bound 0.40 + 8.042 * 0.01 = 48.04%, and the run is at 60%."""
    once = [0.9] + [0.3] * 5  # a validation in one window of six
    thrice = [0.9, 0.9, 0.3, 0.3, 0.3, 0.9]
    bases = [make_report(v, window_idle=once) for v in (0.39, 0.40, 0.41)]
    cur = make_report(0.60, window_idle=thrice)
    v = compare(cur, bases, GateSettings(min_windows=6))
    assert v.interval is not None
    assert not v.interval.above_zero  # the windows would have called it noise
    assert v.over_bound is True
    assert v.regressed


def test_several_baselines_report_means_and_name_the_odd_one_out() -> None:
    bases = _runs(0.30, 0.32, 0.34)
    bases[1] = replace(bases[1], run=replace(bases[1].run, device=replace(bases[1].run.device, kind="cuda")))
    with pytest.raises(ComparisonError, match="b2.json ran on cuda"):
        compare(make_report(0.3), bases, baseline_names=["b1.json", "b2.json", "b3.json"])
    phases = phase_deltas(make_report(0.5).summary, [b.summary for b in _runs(0.2, 0.4)])
    assert phases[0].phase == "data"
    assert phases[0].baseline == pytest.approx(0.3)


def test_the_same_baseline_twice_counts_once() -> None:
    a, b = _runs(0.30, 0.34)
    v = compare(make_report(0.31), [a, b, a], baseline_names=["a", "b", "a again"])
    assert v.method == "threshold"
    assert len(v.baseline) == 2
    assert any("a again is the same run as a: counted once" in n for n in v.notes)


# -- one or two baseline runs: the threshold alone, and a note ---------------------------------


def test_one_baseline_run_decides_on_the_threshold_and_says_noise_is_unknown() -> None:
    base = make_report(0.40, window_idle=windows(0.40, 10, sd=0.1, seed=1))
    v = compare(make_report(0.43, window_idle=windows(0.43, 10, sd=0.1, seed=2)), base)
    assert v.method == "threshold"
    assert v.over_bound is None
    assert v.regressed  # +3 points over the allowed 2, whatever the windows say
    assert any("between-run noise unknown: only 1 baseline run" in n and "baseline add" in n for n in v.notes)
    assert not compare(make_report(0.415), base).regressed


def test_two_baseline_runs_show_their_values() -> None:
    v = compare(make_report(0.33), _runs(0.30, 0.34))
    assert v.method == "threshold"
    assert v.increase == pytest.approx(0.01)
    assert any("only 2 baseline runs (30.0% and 34.0% idle)" in n for n in v.notes)


def test_shifted_distribution_fails() -> None:
    base = make_report(0.20, window_idle=windows(0.20, 10, seed=1))
    cur = make_report(0.35, window_idle=windows(0.35, 10, seed=2), findings=[data_workers()])
    v = compare(cur, base)
    assert v.regressed
    assert v.increase == pytest.approx(0.15)
    assert v.interval is not None
    assert v.interval.above_zero
    assert [d.phase for d in v.grown_phases] == ["data"]
    assert v.explanations[0].grown_phase == "data"


def test_few_windows_skip_the_within_run_evidence() -> None:
    base = make_report(0.40, window_idle=windows(0.40, 5, sd=0.1, seed=1))
    cur = make_report(0.41, window_idle=windows(0.41, 5, sd=0.1, seed=2))
    v = compare(cur, base)
    assert v.interval is None
    assert any("too few idle windows for the within-run evidence" in n for n in v.notes)
    assert compare(cur, base, GateSettings(min_windows=4)).interval is not None


# -- paired runs of the base and the head commit -----------------------------------------------


def test_paired_regression() -> None:
    """Differences 10, 11, 9 points: mean 10, sd 1; bound 4.021 * 0.01 = +4.02 points."""
    heads = [make_report(v, findings=[data_workers()]) for v in (0.50, 0.52, 0.49)]
    bases = [make_report(v) for v in (0.40, 0.41, 0.40)]
    v = compare_paired(heads, bases)
    assert v.paired
    assert v.method == "paired"
    assert v.increase == pytest.approx(0.10)
    assert v.spread is not None
    assert v.spread.bound == pytest.approx(0.04021, abs=1e-4)
    assert v.current_idle == pytest.approx(0.50333, abs=1e-4)
    assert v.regressed
    assert v.explanations[0].finding.id == "data.workers"


def test_paired_scatter_passes() -> None:
    """Differences 10, -2, 4 points: mean +4, sd 6; bound 4.021 * 0.06 = +24.1 points."""
    heads = [make_report(v) for v in (0.50, 0.39, 0.44)]
    bases = [make_report(v) for v in (0.40, 0.41, 0.40)]
    v = compare_paired(heads, bases)
    assert v.over_threshold
    assert v.over_bound is False
    assert not v.regressed


def test_paired_needs_matching_sides() -> None:
    with pytest.raises(ValueError, match="as many head runs as base runs"):
        compare_paired([make_report(0.3)], [make_report(0.3), make_report(0.3)])
    one = compare_paired([make_report(0.35)], [make_report(0.30)])
    assert one.method == "threshold"
    assert one.regressed
    assert any("only 1 pair" in n for n in one.notes)


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
        {"false_alarm": 0.0},
        {"false_alarm": 0.6},
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
