"""``stallscope.testing``: the gate as pytest assertions."""

from __future__ import annotations

from pathlib import Path

import pytest
from gate_reports import data_workers, make_report, regressed_pair, write

from stallscope import testing
from stallscope._exceptions import ComparisonError, ReportError
from stallscope.analysis.regression import compare
from stallscope.cli.verdict import format_verdict
from stallscope.report.io import load_report


def test_public_names() -> None:
    assert sorted(testing.__all__) == ["assert_idle_below", "assert_no_regression", "load_report"]
    assert testing.load_report is load_report


def test_assert_idle_below_passes_and_fails(tmp_path: Path) -> None:
    path = write(tmp_path, "run", make_report(0.6, findings=[data_workers()]))
    assert testing.assert_idle_below(path, 0.7).regressed is False
    assert testing.assert_idle_below(Path(path).parent, 0.7).regressed is False  # the folder
    with pytest.raises(AssertionError) as info:
        testing.assert_idle_below(path, 0.5)
    message = str(info.value)
    assert message.startswith("REGRESSION: accelerator idle 60.0%, above the allowed maximum 50.0%")
    assert "data.workers" in message
    assert path in message


def test_assert_idle_below_takes_a_report_object() -> None:
    testing.assert_idle_below(make_report(0.1), 0.2)
    with pytest.raises(AssertionError, match="above the allowed maximum 5.0%"):
        testing.assert_idle_below(make_report(0.1), 0.05)


def test_assert_idle_below_rejects_a_bad_bound() -> None:
    with pytest.raises(ValueError, match="bound must be a fraction"):
        testing.assert_idle_below(make_report(0.1), 20)


def test_assert_no_regression_message_is_the_check_output(tmp_path: Path) -> None:
    cur, base = regressed_pair(tmp_path)
    with pytest.raises(AssertionError) as info:
        testing.assert_no_regression(cur, base)
    expected = format_verdict(compare(load_report(cur), load_report(base)), current_path=cur, baseline_path=base)
    assert str(info.value) == expected
    assert "phases that grew" in expected
    assert "data.workers" in expected


def test_assert_no_regression_passes(tmp_path: Path) -> None:
    cur, base = regressed_pair(tmp_path)
    assert testing.assert_no_regression(cur, cur).regressed is False
    assert testing.assert_no_regression(cur, base, max_increase=0.5).increase == pytest.approx(0.35)


def test_assert_no_regression_takes_several_baselines(tmp_path: Path) -> None:
    """30, 32, 34%: bound 0.32 + 6.9646 * 0.02 * sqrt(4/3) = 48.08%. 47% passes, 49% fails."""
    paths = [write(tmp_path / "base", f"run{i}", make_report(v)) for i, v in enumerate((0.30, 0.32, 0.34))]
    verdict = testing.assert_no_regression(make_report(0.47), paths)
    assert verdict.method == "prediction"
    assert verdict.within_noise
    assert testing.assert_no_regression(make_report(0.47), tmp_path / "base").within_noise  # the folder
    objects = [make_report(v) for v in (0.30, 0.32, 0.34)]
    with pytest.raises(AssertionError, match=r"vs baseline 32.0% \(mean of 3 runs\)") as info:
        testing.assert_no_regression(make_report(0.49, findings=[data_workers()]), objects)
    assert "48.1%" in str(info.value)
    with pytest.raises(ValueError, match="at least one report"):
        testing.assert_no_regression(make_report(0.3), [])


def test_assert_no_regression_max_idle(tmp_path: Path) -> None:
    cur, _ = regressed_pair(tmp_path)
    with pytest.raises(AssertionError, match="above the 50.0% maximum"):
        testing.assert_no_regression(cur, cur, max_idle=0.5)


def test_broken_setup_is_not_an_assertion(tmp_path: Path) -> None:
    with pytest.raises(ReportError, match="no such file"):
        testing.assert_idle_below(tmp_path / "missing.json", 0.5)
    with pytest.raises(ComparisonError, match="runs not comparable"):
        testing.assert_no_regression(make_report(0.2, device="cuda", idle_source="nvml"), make_report(0.2))
    verdict = testing.assert_no_regression(
        make_report(0.2, device="cuda", idle_source="nvml"), make_report(0.2), allow_mismatch=True
    )
    assert not verdict.regressed
