"""``stallscope check``: exit codes (SPEC §5), the explanation, ``--format json``, ``--github``."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
from gate_reports import data_workers, logging_frequency, make_report, regressed_pair, windows, write
from rich.console import Console

from stallscope.analysis.regression import compare
from stallscope.cli import main
from stallscope.cli.verdict import format_verdict, points, render_verdict, verdict_to_dict


def test_regression_exits_1_with_numbers_phases_and_findings(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cur, base = regressed_pair(tmp_path)
    assert main(["check", cur, "--baseline", base]) == 1
    out, err = capsys.readouterr()
    assert err == ""
    assert out.startswith("REGRESSION: accelerator idle 55.0% vs baseline 20.0% (+35.0 pp, allowed +2.0 pp)")
    assert "bootstrap interval of the increase" in out
    assert "above zero" in out
    assert "phases that grew" in out
    assert "    data          20.0% ->  55.0%  +35.0 pp" in out
    assert "1. data.workers  x1.54 faster (saves 35% of wall time)" in out
    assert "new since the baseline" in out
    assert "fix: Raise num_workers of the DataLoader from 0 to 4." in out
    assert f"current  {cur}: 160 steps" in out


def test_same_report_exits_0(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cur, _ = regressed_pair(tmp_path)
    assert main(["check", cur, "--baseline", cur]) == 0
    out = capsys.readouterr().out
    assert out.startswith("OK: accelerator idle 55.0% vs baseline 55.0% (+0.0 pp, allowed +2.0 pp)")
    assert "phases that grew" not in out


def test_folder_paths_are_accepted(tmp_path: Path) -> None:
    regressed_pair(tmp_path)
    assert main(["check", str(tmp_path / "current"), "--baseline", str(tmp_path / "baseline")]) == 1


def test_max_increase_option(tmp_path: Path) -> None:
    cur, base = regressed_pair(tmp_path)
    assert main(["check", cur, "--baseline", base, "--max-increase", "0.4"]) == 0
    assert main(["check", cur, "--baseline", base, "--max-increase", "40%"]) == 0
    assert main(["check", cur, "--baseline", base, "--max-increase", "30%"]) == 1


def _folder(tmp_path: Path, name: str, idle: tuple[float, ...]) -> str:
    """A folder of baseline runs, one report file each."""
    folder = tmp_path / name
    for i, v in enumerate(idle):
        write(folder, f"run{i}", make_report(v, window_idle=windows(v, 10, seed=i)))
        (folder / f"run{i}" / "report.json").rename(folder / f"run{i}.json")
        (folder / f"run{i}").rmdir()
    return str(folder)


def test_within_the_healthy_runs_spread_passes_and_says_why(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """30, 32, 34%: mean 32%, sd 2.0 pp, bound 32 + 6.96 * 2.0 * 1.15 = 48.1%; 47% passes, closely."""
    base = _folder(tmp_path, "baselines", (0.30, 0.32, 0.34))
    cur = write(tmp_path, "c", make_report(0.47, window_idle=windows(0.47, 10, seed=7)))
    assert main(["check", cur, "--baseline", base]) == 0
    out = capsys.readouterr().out
    assert out.startswith("OK: accelerator idle 47.0% vs baseline 32.0% (mean of 3 runs) (+15.0 pp, allowed +16.1 pp)")
    assert "  baseline runs: 30.0%, 32.0%, 34.0% idle; mean 32.0%, spread (sd) 2.0 pp\n" in out
    assert (
        "99% prediction bound for a healthy run = mean + t x sd x sqrt(1+1/3) = 32.0% + 6.96 x 2.0 pp x 1.15 = 48.1%"
        in out
    )
    assert "the current run's 47.0% is within the bound" in out
    assert "close: the increase +15.0 pp is 1.1 pp short of the allowed +16.1 pp" in out
    assert f"baseline {base}: 3 runs of 160 steps" in out


def test_beyond_the_healthy_runs_spread_fails_with_the_numbers(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    b = [
        write(tmp_path, f"b{i}", make_report(v, window_idle=windows(v, 10, seed=i)))
        for i, v in enumerate((0.30, 0.32, 0.34))
    ]
    cur = write(tmp_path, "c", make_report(0.55, window_idle=windows(0.55, 10, seed=7), findings=[data_workers(0.35)]))
    assert main(["check", cur, "--baseline", b[0], "--baseline", b[1], "--baseline", b[2]]) == 1
    out = capsys.readouterr().out
    assert out.startswith(
        "REGRESSION: accelerator idle 55.0% vs baseline 32.0% (mean of 3 runs) (+23.0 pp, allowed +16.1 pp)"
    )
    assert "spread (sd) 2.0 pp" in out
    assert "= 48.1%" in out
    assert "the current run's 55.0% is above the bound: beyond what healthy runs scatter" in out
    assert "1. data.workers" in out
    assert "close:" not in out


def test_one_baseline_says_the_noise_is_unknown(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    base = write(tmp_path, "b", make_report(0.40, window_idle=windows(0.40, 10, sd=0.1, seed=1)))
    cur = write(tmp_path, "c", make_report(0.43, window_idle=windows(0.43, 10, sd=0.1, seed=2)))
    assert main(["check", cur, "--baseline", base]) == 1
    out = capsys.readouterr().out
    assert "between-run noise unknown with 1 baseline run" in out
    assert "record 3 or more healthy runs of the reference job (stallscope baseline add REPORT --dir DIR)" in out
    assert "block-bootstrap interval" in out
    assert "includes zero, so the windows alone cannot tell" in out


def test_paired_runs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Differences 10, 11, 9 points: mean +10.0, sd 1.0, bound 6.96 * 1.0 / 1.73 = +4.0 pp."""
    heads = [write(tmp_path, f"head-{i}", make_report(v)) for i, v in enumerate((0.50, 0.51, 0.49), start=1)]
    bases = [write(tmp_path, f"base-{i}", make_report(v)) for i, v in enumerate((0.40, 0.40, 0.40), start=1)]
    argv = ["check", "--paired", *heads]
    for b in bases:
        argv += ["--baseline", b]
    assert main(argv) == 1
    out = capsys.readouterr().out
    assert out.startswith(
        "REGRESSION: accelerator idle 50.0% on the head commit vs 40.0% on the base, paired over 3 runs each "
        "(+10.0 pp, allowed +4.0 pp)"
    )
    assert "pairs (base -> head): 40.0% -> 50.0%, 40.0% -> 51.0%, 40.0% -> 49.0%; mean difference +10.0 pp" in out
    assert "6.96 x 1.0 pp / 1.73 = +4.0 pp" in out
    assert main(["check", "--paired", *heads, "--baseline", bases[0]]) == 2
    assert "as many head runs as base runs, got 3 and 1" in capsys.readouterr().err


def test_several_reports_need_paired(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    a = write(tmp_path, "a", make_report(0.3))
    assert main(["check", a, a, "--baseline", a]) == 2
    assert "several are head runs only with --paired" in capsys.readouterr().err


def test_max_idle_alone(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cur = write(tmp_path, "c", make_report(0.6, findings=[data_workers()]))
    assert main(["check", cur, "--max-idle", "0.5"]) == 1
    out = capsys.readouterr().out
    assert out.startswith("REGRESSION: accelerator idle 60.0%, above the allowed maximum 50.0%")
    assert "data.workers" in out
    assert main(["check", cur, "--max-idle", "0.7"]) == 0
    assert capsys.readouterr().out.startswith("OK: accelerator idle 60.0%, within the allowed maximum 70.0%")


def test_max_idle_with_baseline(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cur, _ = regressed_pair(tmp_path)
    assert main(["check", cur, "--baseline", cur, "--max-idle", "0.5"]) == 1
    assert "above the 50.0% maximum" in capsys.readouterr().out
    assert main(["check", cur, "--baseline", cur, "--max-idle", "0.6"]) == 0
    assert "ceiling: idle 55.0% is within the allowed maximum 60.0%" in capsys.readouterr().out


def test_json_format(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cur, base = regressed_pair(tmp_path)
    assert main(["check", cur, "--baseline", base, "--format", "json"]) == 1
    data = json.loads(capsys.readouterr().out)
    assert data["verdict"] == "regression"
    assert data["exit_code"] == 1
    assert data["method"] == "threshold"
    assert data["increase"] == pytest.approx(0.35)
    assert data["current"]["path"] == cur
    assert data["current"]["runs"][0]["steps"] == 160
    assert data["baseline"]["gpu_idle_fraction"] == 0.2
    assert data["allowed_increase"] == 0.02
    assert data["spread"]["n"] == 1
    assert data["spread"]["bound"] is None
    assert data["over_bound"] is None
    assert data["interval"]["above_zero"] is True
    assert data["interval"]["low"] > 0
    assert data["phase_deltas"][0] == {"phase": "data", "baseline": 0.2, "current": 0.55, "delta": pytest.approx(0.35)}
    assert data["findings"][0]["id"] == "data.workers"
    assert data["findings"][0]["suggestion"] == {"num_workers": 4}
    assert data["format_version"] == 2

    assert main(["check", cur, "--baseline", cur, "--format", "json"]) == 0
    assert json.loads(capsys.readouterr().out)["verdict"] == "pass"


def test_github_summary_and_annotation(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    summary = tmp_path / "summary.md"
    summary.write_text("earlier step\n", encoding="utf-8")
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary))
    cur, base = regressed_pair(tmp_path)
    assert main(["check", cur, "--baseline", base, "--github"]) == 1
    out = capsys.readouterr().out
    error = [line for line in out.splitlines() if line.startswith("::error ")]
    assert len(error) == 1
    assert error[0].startswith("::error title=StallScope%3A accelerator idle time regressed::REGRESSION")
    assert "55.0%25 vs baseline 20.0%25" in error[0]
    assert "Top fix: data.workers" in error[0]
    md = summary.read_text(encoding="utf-8")
    assert md.startswith("earlier step\n### StallScope check: ❌ regression")
    assert "| **accelerator idle** | 20.0% | 55.0% | +35.0 pp |" in md
    assert "**Findings in the current run** (about a phase that grew first, then best first)" in md
    assert "1. `data.workers`: x1.54 faster (new since the baseline)." in md

    assert main(["check", cur, "--baseline", cur, "--github"]) == 0
    assert "::error" not in capsys.readouterr().out
    assert "### StallScope check: ✅ passed" in summary.read_text(encoding="utf-8")


def test_github_without_summary_file_still_annotates(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("GITHUB_STEP_SUMMARY", raising=False)
    cur, base = regressed_pair(tmp_path)
    assert main(["check", cur, "--baseline", base, "--github"]) == 1
    assert "::error title=" in capsys.readouterr().out


def test_unwritable_summary_is_a_warning(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(tmp_path / "no" / "such" / "dir" / "summary.md"))
    cur, base = regressed_pair(tmp_path)
    assert main(["check", cur, "--baseline", base, "--github"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("stallscope: warning: cannot write GITHUB_STEP_SUMMARY")
    assert len(err.splitlines()) == 1


def test_help_explains_the_statistics(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["check", "--help"]) == 0
    out = capsys.readouterr().out
    for words in ("prediction bound", "t x sd x sqrt(1 + 1/n)", "--paired", "moving-block bootstrap", "exit status"):
        assert words in out


def test_render_verdict_into_a_console(tmp_path: Path) -> None:
    base = make_report(0.20, window_idle=windows(0.20, 10, seed=1))
    cur = make_report(0.55, window_idle=windows(0.55, 10, seed=2), findings=[data_workers(0.35)])
    verdict = compare(cur, base)
    console = Console(file=io.StringIO(), width=100)
    console.print(render_verdict(verdict))
    text = console.file.getvalue()  # type: ignore[attr-defined]
    assert text.splitlines()[0].startswith("REGRESSION: accelerator idle 55.0%")
    assert "data.workers" in text
    assert format_verdict(verdict).splitlines()[0] == text.splitlines()[0]


@pytest.mark.parametrize(
    ("delta", "text"),
    [(0.35, "+35.0 pp"), (0.0, "+0.0 pp"), (0.0001, "+0.0 pp"), (-0.0001, "-0.0 pp"), (-0.021, "-2.1 pp")],
)
def test_points(delta: float, text: str) -> None:
    assert points(delta) == text


def test_the_findings_are_listed_in_the_order_the_heading_names() -> None:
    """A finding about a phase that grew comes before a larger one about a phase that did not;
    the heading says so, instead of "best first"."""
    phases = {"data": 0.2, "compute": 0.7, "logging": 0.1}
    base = make_report(0.2, window_idle=windows(0.2, 12), phases=phases)
    grown = {"data": 0.55, "compute": 0.35, "logging": 0.1}
    cur = make_report(
        0.55, window_idle=windows(0.55, 12), phases=grown, findings=[logging_frequency(0.6), data_workers(0.3)]
    )
    lines = format_verdict(compare(cur, base)).splitlines()
    heading = lines.index("  findings that explain it, those about a phase that grew first, then best first:")
    assert lines[heading + 1].startswith(
        "    1. data.workers  x1.43 faster (saves 30% of wall time)  [about the data phase"
    )
    assert lines[heading + 3].startswith("    2. logging.frequency  x2.50 faster (saves 60% of wall time)")


def test_json_deltas_carry_no_float_noise() -> None:
    base = make_report(0.2, window_idle=windows(0.2, 12), phases={"data": 0.2, "compute": 0.8})
    cur = make_report(0.200372, window_idle=windows(0.200372, 12), phases={"data": 0.200372, "compute": 0.799628})
    assert 0.200372 - 0.2 != 0.000372  # the noise this test is about
    out = verdict_to_dict(compare(cur, base))
    assert out["increase"] == 0.000372
    deltas = {d["phase"]: d["delta"] for d in out["phase_deltas"]}
    assert deltas == {"data": 0.000372, "compute": -0.000372}
    assert out["interval"] is not None
    assert out["interval"]["low"] == round(out["interval"]["low"], 6)
    assert out["interval"]["high"] == round(out["interval"]["high"], 6)


@pytest.mark.parametrize(
    ("extra", "words"),
    [
        (["--false-alarm", "0"], "must be above 0 and at most 0.5"),
        (["--false-alarm", "60%"], "must be above 0 and at most 0.5"),
        (["--paired"], "as many head runs as base runs, got 3 and 1"),
        ([], "holds 3 reports; give one run to check"),
    ],
)
def test_bad_options_exit_2_with_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], extra: list[str], words: str
) -> None:
    runs = _folder(tmp_path, "runs", (0.30, 0.32, 0.34))
    base = write(tmp_path, "b", make_report(0.3))
    assert main(["check", runs, "--baseline", base, *extra]) == 2
    out, err = capsys.readouterr()
    assert len(err.splitlines()) == 1
    assert words in err


def test_false_alarm_option_moves_the_bound(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """30, 32, 34%: at 1% the bound is 48.1%; at 10%, 0.32 + t(0.90, 2) 1.886 * 0.02 * 1.1547 = 36.4%."""
    base = _folder(tmp_path, "baselines", (0.30, 0.32, 0.34))
    cur = write(tmp_path, "c", make_report(0.40))
    assert main(["check", cur, "--baseline", base]) == 0
    capsys.readouterr()
    assert main(["check", cur, "--baseline", base, "--false-alarm", "10%"]) == 1
    out = capsys.readouterr().out
    assert "90% prediction bound for a healthy run" in out
    assert "= 32.0% + 1.89 x 2.0 pp x 1.15 = 36.4%" in out
