"""Folders of baseline runs (stallscope.report.history) and ``stallscope baseline add``."""

from __future__ import annotations

import json
from datetime import datetime, timezone
from pathlib import Path

import pytest
from gate_reports import make_report, write

from stallscope._exceptions import ReportError
from stallscope.cli import main
from stallscope.report.history import HISTORY_NAME, add_to_history, report_files


def _clock(*seconds: int):  # type: ignore[no-untyped-def]
    times = iter(datetime(2026, 1, 1, 0, 0, s, tzinfo=timezone.utc) for s in seconds)
    return lambda: next(times)


def test_report_files_of_a_file_a_run_folder_and_a_folder_of_runs(tmp_path: Path) -> None:
    one = write(tmp_path, "run", make_report(0.3))
    assert report_files(one) == [Path(one)]
    assert report_files(tmp_path / "run") == [Path(one)]  # a folder holding report.json is one run
    many = tmp_path / "many"
    write(many, "b", make_report(0.3))
    (many / "a.json").write_text((tmp_path / "run" / "report.json").read_text(encoding="utf-8"), encoding="utf-8")
    (many / ".a.json.tmp").write_text("half", encoding="utf-8")
    (many / "notes.txt").write_text("not a report", encoding="utf-8")
    assert report_files(many) == [many / "a.json", many / "b" / "report.json"]
    (tmp_path / "empty").mkdir()
    with pytest.raises(ReportError, match="no reports in this folder"):
        report_files(tmp_path / "empty")


def test_add_names_uniquely_and_keeps_the_newest(tmp_path: Path) -> None:
    folder = tmp_path / "baselines"
    (folder).mkdir()
    (folder / "mine.json").write_text("{}", encoding="utf-8")  # not added by add_to_history: left alone
    clock = _clock(1, 2, 3)
    added = []
    for i, idle in enumerate((0.30, 0.31, 0.32)):
        src = write(tmp_path, f"run{i}", make_report(idle))
        added.append(add_to_history(src, folder, keep=2, now=clock))
    first, second, third = (a.path for a in added)
    assert HISTORY_NAME.match(first.name)
    assert first.name.startswith("report-20260101T000001000000Z-")
    assert third.name > second.name > first.name
    assert not first.exists()  # the oldest beyond --keep 2
    assert added[2].removed == (first,)
    assert sorted(p.name for p in folder.iterdir()) == sorted(["mine.json", second.name, third.name])
    assert json.loads(third.read_text(encoding="utf-8"))["summary"]["gpu_idle_fraction"] == 0.32
    assert (third.stat().st_mode & 0o777) == 0o644


def test_add_never_replaces_a_file_with_the_same_name(tmp_path: Path) -> None:
    folder = tmp_path / "b"
    a = write(tmp_path, "a", make_report(0.30))
    b = write(tmp_path, "b2", make_report(0.31))
    same_time = _clock(5, 5)
    one = add_to_history(a, folder, keep=5, now=same_time).path
    two = add_to_history(b, folder, keep=5, now=same_time).path
    assert one != two
    assert one.exists()
    assert two.exists()


def test_add_refuses_a_report_already_there(tmp_path: Path) -> None:
    a = write(tmp_path, "a", make_report(0.30))
    add_to_history(a, tmp_path / "b", keep=5)
    with pytest.raises(ReportError, match="already in"):
        add_to_history(a, tmp_path / "b", keep=5)


def test_baseline_add_command(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    folder = str(tmp_path / "ci" / "baselines")
    for i, idle in enumerate((0.30, 0.32, 0.34, 0.31)):
        src = write(tmp_path, f"run{i}", make_report(idle))
        assert main(["baseline", "add", src, "--dir", folder, "--keep", "3"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith(f"added {folder}/report-")
    assert out[0].endswith(f"(1 report in {folder})")
    assert "(3 reports in" in out[3]
    assert "removed the oldest: report-" in out[3]
    assert len(list(Path(folder).iterdir())) == 3
    current = write(tmp_path, "current", make_report(0.33))
    assert main(["check", current, "--baseline", folder]) == 0
    assert "mean of 3 runs" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (["baseline", "add", "{missing}", "--dir", "{dir}"], "no such file"),
        (["baseline", "add", "{good}", "--dir", "{dir}", "--keep", "0"], "must be >= 1"),
        (["baseline", "add", "{good}", "--dir", "{good}"], "not a folder"),
        (["baseline", "add", "{gpu}", "--dir", "{dir}"], "does not belong in"),
        (["baseline", "add", "{good}"], "required: --dir"),
        (["check", "{good}", "--baseline", "{empty}"], "no reports in this folder"),
    ],
)
def test_bad_input_exits_2_with_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str], words: str
) -> None:
    good = write(tmp_path, "good", make_report(0.3))
    gpu = write(tmp_path, "gpu", make_report(0.3, device="cuda", idle_source="cuda_events"))
    folder = tmp_path / "dir"
    assert main(["baseline", "add", good, "--dir", str(folder)]) == 0
    (tmp_path / "empty").mkdir()
    names = {"missing": str(tmp_path / "nope.json"), "dir": str(folder), "good": good, "gpu": gpu}
    names["empty"] = str(tmp_path / "empty")
    capsys.readouterr()
    assert main([a.format(**names) for a in argv]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert len(err.splitlines()) == 1
    assert err.startswith("stallscope: error: ")
    assert words in err
