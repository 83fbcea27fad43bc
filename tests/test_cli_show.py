"""``stallscope show REPORT``."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
from gate_reports import data_workers, make_report, write

from stallscope.cli import main
from stallscope.report.schema import EpochReport


def test_show_prints_the_diagnosis(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write(tmp_path, "run", make_report(0.6, findings=[data_workers()]))
    assert main(["show", path]) == 0
    out = capsys.readouterr().out
    assert out.startswith("StallScope · run: CPU (no GPU): training idle 60% (host_phases)")
    assert "data.workers" in out
    assert "Raise num_workers of the DataLoader from 0 to 4." in out


def test_show_accepts_the_folder(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    write(tmp_path, "run", make_report(0.1, device="cuda", idle_source="cuda_events"))
    assert main(["show", str(tmp_path / "run")]) == 0
    assert "StallScope · run: accelerator idle 10% (cuda_events)" in capsys.readouterr().out


def test_show_epochs_renders_each_epochs_panel_before_the_runs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = make_report(0.5, findings=[data_workers()])
    epochs = tuple(
        EpochReport(index=i, summary=make_report(idle).summary, findings=(data_workers(idle),) if idle > 0.3 else ())
        for i, idle in enumerate((0.7, 0.2))
    )
    path = write(tmp_path, "run", replace(run, epochs=epochs))
    assert main(["show", path]) == 0
    assert "StallScope · epoch" not in capsys.readouterr().out
    assert main(["show", path, "--epochs"]) == 0
    out = capsys.readouterr().out
    first = out.index("StallScope · epoch 0: CPU (no GPU): training idle 70%")
    second = out.index("StallScope · epoch 1: CPU (no GPU): training idle 20%")
    last = out.index("StallScope · run (2 epochs): CPU (no GPU): training idle 50%")
    assert first < second < last
    assert "saves 70% of wall time" in out[first:second]
    assert "no fix predicted" in out[second:last]


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    from stallscope import __version__

    assert main(["--version"]) == 0
    assert capsys.readouterr().out.strip() == f"stallscope {__version__}"


def test_show_epochs_prints_a_group_of_short_epochs_as_one_panel(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Epochs 0-2 diagnosed together (epoch 2 holds the findings, ``covers_epochs``), epoch 3
    alone: two epoch panels, "epochs 0–2" with the three epochs' steps and time together."""
    run = make_report(0.5, findings=[data_workers()])
    summary = make_report(0.6).summary
    epochs = (
        EpochReport(index=0, summary=summary, diagnosed_with=2),
        EpochReport(index=1, summary=summary, diagnosed_with=2),
        EpochReport(index=2, summary=summary, findings=(data_workers(0.6),), covers_epochs=(0, 2)),
        EpochReport(index=3, summary=make_report(0.2).summary),
    )
    path = write(tmp_path, "run", replace(run, epochs=epochs))
    assert main(["show", path, "--epochs"]) == 0
    out = capsys.readouterr().out
    titles = [line.split(":")[0] for line in out.splitlines() if line.startswith("StallScope · ")]
    assert titles == ["StallScope · epochs 0–2", "StallScope · epoch 3", "StallScope · run (4 epochs)"]
    group = out[: out.index("StallScope · epoch 3")]
    assert f"{3 * summary.steps} steps in {3 * summary.wall_s:.2f} s" in group
    assert "training idle 60%" in group
    assert "saves 60% of wall time" in group
