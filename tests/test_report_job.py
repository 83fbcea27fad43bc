"""A job's report: its summary from the ranks' (``report/job.py``), ``ranks[]`` in JSON, the rank
table (``report/render.py``) and the CLI on job reports."""

from __future__ import annotations

import io
import json
from collections.abc import Callable
from pathlib import Path

import pytest
from rich.console import Console

from stallscope._exceptions import ReportError
from stallscope.cli import main
from stallscope.report.io import load_report, write_report
from stallscope.report.job import job_summary, rank_entry
from stallscope.report.render import format_ranks, render_ranks
from stallscope.report.schema import RankEntry, Report, RunInfo, Summary, report_from_dict, report_to_dict

MakeSummary = Callable[..., Summary]
MakeReport = Callable[..., Report]


def two_ranks(make_summary: MakeSummary) -> list[Summary]:
    fast = make_summary(
        wall_s=2.0,
        steps=100,
        gpu_idle_fraction=0.1,
        phase_fractions={"data": 0.1, "compute": 0.9},
        idle_windows=({"steps": 50, "wall_s": 1.0, "idle_fraction": 0.1},),
    )
    slow = make_summary(
        wall_s=3.0,
        steps=100,
        gpu_idle_fraction=0.6,
        phase_fractions={"data": 0.6, "compute": 0.4},
        step_time_s={"mean": 0.03},
        idle_windows=({"steps": 50, "wall_s": 1.5, "idle_fraction": 0.5},),
    )
    return [fast, slow]


def test_job_summary_weights_the_ranks_by_wall_time(make_summary: MakeSummary) -> None:
    job = job_summary(two_ranks(make_summary))
    assert job.wall_s == 3.0  # the longest rank
    assert job.steps == 100
    assert job.steps_per_s == pytest.approx(33.3333, abs=1e-3)
    assert job.gpu_idle_fraction == pytest.approx((0.1 * 2 + 0.6 * 3) / 5)
    assert job.phase_fractions == pytest.approx({"data": (0.2 + 1.8) / 5, "compute": (1.8 + 1.2) / 5})
    assert sum(job.phase_fractions.values()) == pytest.approx(1.0)
    assert job.step_time_s == {"mean": 0.03}  # the slowest rank's
    assert job.idle_windows == ({"steps": 50, "wall_s": 1.5, "idle_fraction": 0.3},)


def test_job_summary_of_one_rank_is_that_rank(make_summary: MakeSummary) -> None:
    only = make_summary()
    assert job_summary([only]) is only
    with pytest.raises(ValueError, match="at least one"):
        job_summary([])


def job_report(make_report: MakeReport, make_summary: MakeSummary) -> Report:
    fast, slow = two_ranks(make_summary)
    base = make_report()
    return make_report(
        run=RunInfo(**{**vars(base.run), "rank": 0, "world_size": 2, "local_rank": 0}),
        summary=job_summary([fast, slow]),
        ranks=(rank_entry(0, "node-a", fast, 2), rank_entry(1, "node-b", slow, 2)),
    )


def test_ranks_and_rank_fields_round_trip(make_report: MakeReport, make_summary: MakeSummary) -> None:
    report = job_report(make_report, make_summary)
    data = report_to_dict(report)
    assert data["run"]["rank"] == 0
    assert data["run"]["world_size"] == 2
    assert [r["host"] for r in data["ranks"]] == ["node-a", "node-b"]
    assert set(data["ranks"][1]) >= {
        "rank",
        "host",
        "steps",
        "wall_s",
        "steps_per_s",
        "gpu_idle_fraction",
        "phase_fractions",
        "data_wait_s",
    }
    assert report_from_dict(json.loads(json.dumps(data))) == report


def test_a_single_process_report_has_no_ranks(make_report: MakeReport) -> None:
    data = report_to_dict(make_report())
    assert "ranks" not in data
    assert "rank" not in data["run"]


@pytest.mark.parametrize(
    ("path", "value", "message"),
    [
        (("ranks",), {"rank": 0}, "report.ranks must be a list"),
        (("ranks", 0, "gpu_idle_fraction"), 1.5, r"report.ranks\[0\].gpu_idle_fraction must be a fraction"),
        (("ranks", 1, "phase_fractions", "data"), -0.1, r"report.ranks\[1\].phase_fractions.data"),
        (("ranks", 0, "steps"), "many", r"report.ranks\[0\].steps has the wrong type"),
        (("run", "rank"), -1, "report.run.rank must be a non-negative integer"),
    ],
)
def test_bad_ranks_are_report_errors(
    make_report: MakeReport, make_summary: MakeSummary, path: tuple[object, ...], value: object, message: str
) -> None:
    data = report_to_dict(job_report(make_report, make_summary))
    target = data
    for key in path[:-1]:
        target = target[key]  # type: ignore[index]
    target[path[-1]] = value  # type: ignore[index]
    with pytest.raises(ReportError, match=message):
        report_from_dict(data)


def entries() -> list[RankEntry]:
    return [
        RankEntry(0, "node-a", 100, 2.0, 50.0, 0.08, {"data": 0.02, "compute": 0.92, "other": 0.06}),
        RankEntry(1, "node-b", 100, 2.0, 48.5, 0.61, {"data": 0.6, "compute": 0.38, "other": 0.02}),
    ]


def test_the_rank_table_as_text() -> None:
    assert format_ranks(entries()) == [
        "rank  host    steps  steps/s  idle  data  compute  largest phase",
        "0     node-a    100     50.0    8%    2%      92%  compute 92%",
        "1     node-b    100     48.5   61%   60%      38%  data 60%",
    ]


def test_the_rank_table_in_a_panel() -> None:
    console = Console(file=io.StringIO(), width=100)
    console.print(render_ranks(entries()))
    out = console.file.getvalue()  # type: ignore[attr-defined]
    assert "largest phase" in out
    assert "node-b" in out
    assert "data 60%" in out


def test_a_large_job_lists_its_slowest_ranks() -> None:
    many = [RankEntry(r, f"n{r}", 10, 1.0, 100.0 - r, 0.1, {"compute": 1.0}) for r in range(40)]
    rows = format_ranks(many)
    assert len(rows) == 1 + 16
    assert [row.split()[0] for row in rows[1:]] == [str(r) for r in range(24, 40)]


def test_show_check_and_diff_read_job_reports(
    make_report: MakeReport, make_summary: MakeSummary, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    job = write_report(job_report(make_report, make_summary), tmp_path / "job" / "report.json")
    single = write_report(make_report(), tmp_path / "single" / "report.json")
    assert load_report(job).ranks
    assert main(["show", str(job)]) == 0
    out = capsys.readouterr().out
    assert "job of 2 ranks" in out
    assert "node-b" in out
    assert "data 60%" in out
    assert main(["check", str(job), "--baseline", str(job)]) == 0
    assert capsys.readouterr().out.startswith("OK:")
    assert main(["diff", str(single), str(job)]) == 0
    assert "accelerator idle" in capsys.readouterr().out
