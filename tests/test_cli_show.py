"""``stallscope show REPORT``."""

from __future__ import annotations

from pathlib import Path

import pytest
from gate_reports import data_workers, make_report, write

from stallscope.cli import main


def test_show_prints_the_diagnosis(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write(tmp_path, "run", make_report(0.6, findings=[data_workers()]))
    assert main(["show", path]) == 0
    out = capsys.readouterr().out
    assert out.startswith("StallScope · run: accelerator idle 60% (host_phases)")
    assert "data.workers" in out
    assert "Raise num_workers of the DataLoader from 0 to 4." in out


def test_show_accepts_the_folder(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    write(tmp_path, "run", make_report(0.1))
    assert main(["show", str(tmp_path / "run")]) == 0
    assert "accelerator idle 10%" in capsys.readouterr().out


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    from stallscope import __version__

    assert main(["--version"]) == 0
    assert capsys.readouterr().out.strip() == f"stallscope {__version__}"
