"""``stallscope diff A B``: phase fractions and findings side by side."""

from __future__ import annotations

import io
import json
from dataclasses import replace
from pathlib import Path

import pytest
from gate_reports import data_workers, logging_frequency, make_report, write
from rich.console import Console

from stallscope.analysis.regression import compare
from stallscope.cli import main
from stallscope.cli.diff import diff_rows, format_diff, render_diff
from stallscope.cli.verdict import format_verdict

A = make_report(0.2, phases={"data": 0.15, "compute": 0.8, "logging": 0.05}, findings=[logging_frequency()])
B = make_report(0.6, phases={"data": 0.55, "compute": 0.4, "logging": 0.05}, findings=[data_workers(0.4)])


def test_rows() -> None:
    rows = {r.label: r for r in diff_rows(A, B) if not r.section}
    assert (rows["accelerator idle"].a, rows["accelerator idle"].b, rows["accelerator idle"].change) == (
        "20.0%",
        "60.0%",
        "+40.0 pp",
    )
    assert (rows["data"].a, rows["data"].b, rows["data"].change) == ("15.0%", "55.0%", "+40.0 pp")
    assert rows["compute"].change == "-40.0 pp"
    assert rows["logging"].change == "+0.0 pp"
    assert (rows["data.workers"].a, rows["data.workers"].b, rows["data.workers"].change) == (
        "-",
        "x1.67 (40%)",
        "new in B",
    )
    assert rows["logging.frequency"].change == "gone in B"


def test_format_diff_plain() -> None:
    text = format_diff(A, B, "base.json", "cur.json")
    lines = text.splitlines()
    assert lines[0] == "StallScope diff  A: base.json  B: cur.json"
    assert any(line.split() == ["data", "15.0%", "55.0%", "+40.0", "pp"] for line in lines)
    assert "  phases (share of wall time):" in lines
    assert "note:" not in text


def test_render_diff_into_a_console() -> None:
    console = Console(file=io.StringIO(), width=100)
    console.print(render_diff(A, B, "base.json", "cur.json"))
    text = console.file.getvalue()  # type: ignore[attr-defined]
    assert "A: base.json  B: cur.json" in text
    assert "data.workers" in text
    assert "+40.0 pp" in text
    assert max(len(line) for line in text.splitlines()) <= 100


def test_diff_command(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    a, b = write(tmp_path, "a", A), write(tmp_path, "b", B)
    assert main(["diff", a, b]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"StallScope diff  A: {a}  B: {b}")
    assert "new in B" in out


def test_diff_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    a, b = write(tmp_path, "a", A), write(tmp_path, "b", B)
    assert main(["diff", a, b, "--format", "json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["idle_change"] == pytest.approx(0.4)
    assert data["phases"][0] == {"phase": "data", "a": 0.15, "b": 0.55, "change": pytest.approx(0.4)}
    assert data["findings"][0]["id"] == "data.workers"
    assert data["findings"][0]["a"] is None
    assert data["notes"] == []


def test_diff_json_changes_carry_no_float_noise(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    a = write(tmp_path, "a", make_report(0.2, phases={"data": 0.2, "compute": 0.8}))
    b = write(tmp_path, "b", make_report(0.200372, phases={"data": 0.200372, "compute": 0.799628}))
    assert 0.200372 - 0.2 != 0.000372  # the noise this test is about
    assert main(["diff", a, b, "--format", "json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["idle_change"] == 0.000372
    assert {p["phase"]: p["change"] for p in data["phases"]} == {"data": 0.000372, "compute": -0.000372}


def test_a_fall_too_small_to_show_keeps_its_sign() -> None:
    a = make_report(0.2004, phases={"data": 0.2004, "compute": 0.7996})
    b = make_report(0.2, phases={"data": 0.2, "compute": 0.8})
    rows = {r.label: r for r in diff_rows(a, b) if not r.section}
    assert rows["accelerator idle"].change == "-0.0 pp"
    assert rows["compute"].change == "+0.0 pp"


def test_a_floor_reads_at_least_in_diff_and_check() -> None:
    """A fix that only removes work is a floor (SPEC §3): every command shows it as "at least"."""
    floor = replace(logging_frequency(0.6), est_speedup_bound="lower")
    a = make_report(0.2, phases={"data": 0.15, "compute": 0.8, "logging": 0.05})
    b = make_report(0.65, phases={"data": 0.15, "compute": 0.2, "logging": 0.65}, findings=[floor])
    rows = {r.label: r for r in diff_rows(a, b) if not r.section}
    assert rows["logging.frequency"].b == "at least x2.50 (60%)"
    text = format_verdict(compare(b, a))
    assert "1. logging.frequency  at least x2.50 faster (saves 60% of wall time)" in text
