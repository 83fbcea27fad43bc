"""report.html without a browser: what reaches the page is escaped, the page asks for nothing
from the network, it stays small, and writing it never costs the run or its report.json
(tests/browser/ opens the pages in Chromium)."""

from __future__ import annotations

import dataclasses
import json
import re
import time
from pathlib import Path

import pytest

from stallscope import StallScope
from stallscope.cli import main
from stallscope.report import html as html_module
from stallscope.report.html import _json_for_script, render_report, render_verdict
from stallscope.report.io import load_report
from stallscope.report.schema import Report

EVIL = "</script><script>alert(1)</script><img src=x onerror=alert(2)>\u2028\u2029&\"'"


def _run(folder: Path, **kwargs: object) -> Report:
    with StallScope(report_dir=folder, console=False, **kwargs) as scope:  # type: ignore[arg-type]
        for _ in scope.iter(range(30)):
            with scope.phase("compute"):
                time.sleep(0.0005)
    report = scope.report
    assert report is not None
    return report


def test_json_in_a_script_block_cannot_end_it_or_start_markup() -> None:
    text = _json_for_script({"k": EVIL, EVIL: [EVIL]})
    for raw in ("<", ">", "&", "\u2028", "\u2029"):
        assert raw not in text
    assert json.loads(text) == {"k": EVIL, EVIL: [EVIL]}


def test_a_hostile_reports_strings_reach_the_page_escaped(tmp_path: Path) -> None:
    report = _run(tmp_path)
    record = dataclasses.replace(
        report.recent[0],
        host=EVIL,
        phases_us={**report.recent[0].phases_us, EVIL: report.recent[0].phases_us["compute"]},
    )
    hostile = dataclasses.replace(
        report,
        notes=(EVIL,),
        run=dataclasses.replace(report.run, host=EVIL),
        summary=dataclasses.replace(report.summary, phase_fractions={**report.summary.phase_fractions, EVIL: 0.0}),
        recent=(record,),
    )
    page = render_report(hostile)
    assert "<img" not in page
    assert page.count("<script") == 2  # the data block and ours
    assert "alert(" not in page.split("<script>")[-1]  # our script is ours
    assert "\u2028" not in page
    assert "&lt;/script&gt;&lt;script&gt;alert(1)" in page  # shown, as text


def test_the_page_loads_nothing_and_says_so(tmp_path: Path) -> None:
    page = render_report(_run(tmp_path))
    csp = re.search(r'http-equiv="Content-Security-Policy" content="([^"]*)"', page)
    assert csp is not None
    assert "default-src 'none'" in csp.group(1)
    assert "'unsafe-inline'" not in csp.group(1).split("script-src")[1].split(";")[0]
    assert not re.search(r"""(?:src|href)\s*=\s*["']?(?:https?:|//)""", page)
    assert "@import" not in page
    assert "url(" not in page


def test_the_script_hash_in_the_policy_is_the_scripts() -> None:
    import base64
    import hashlib

    digest = base64.b64encode(hashlib.sha256(html_module._JS.encode()).digest()).decode()
    assert f"sha256-{digest}" == html_module._JS_HASH


def test_eight_ranks_of_4096_steps_make_a_page_under_500_kb(tmp_path: Path) -> None:
    import sys

    sys.path.insert(0, str(Path(__file__).parent))
    from test_report_recent import _record

    report = dataclasses.replace(_run(tmp_path), recent=tuple(_record(4096, rank, seed=rank) for rank in range(8)))
    page = render_report(report)
    assert len(page.encode()) < 500_000, len(page.encode())
    assert page.count('class="row"') == 8


def test_a_run_writes_report_html_beside_report_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with StallScope(report_dir=tmp_path / "run") as scope:
        for _ in scope.iter(range(10)):
            pass
    out = capsys.readouterr().out
    assert out.rstrip().splitlines()[-1].endswith("report.html")  # the last line names the page
    page = (tmp_path / "run" / "report.html").read_text()
    assert page.startswith("<!DOCTYPE html>")
    assert 'id="timeline"' in page


def test_html_false_writes_no_page(tmp_path: Path) -> None:
    _run(tmp_path, html=False)
    assert (tmp_path / "report.json").exists()
    assert not (tmp_path / "report.html").exists()


def test_a_failing_page_costs_the_page_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The page's renderer raises: training ends normally, report.json is whole, one line says so."""

    def broken(report: Report) -> str:
        raise RuntimeError("the renderer broke")

    monkeypatch.setattr("stallscope.hooks.session.render_report", broken)
    report = _run(tmp_path)
    assert report.summary.steps == 30
    assert load_report(tmp_path).summary.steps == 30
    assert not (tmp_path / "report.html").exists()
    err = capsys.readouterr().err
    assert err.count("report.html could not be written (RuntimeError: the renderer broke)") == 1


def test_html_cli_writes_the_page_and_reads_old_reports(tmp_path: Path) -> None:
    _run(tmp_path / "run")
    doc = json.loads((tmp_path / "run" / "report.json").read_text())
    del doc["recent_steps"]  # a report from before the record
    (tmp_path / "old.json").write_text(json.dumps(doc))
    assert main(["html", str(tmp_path / "old.json"), "-o", str(tmp_path / "old.html")]) == 0
    page = (tmp_path / "old.html").read_text()
    assert 'id="epochs"' in page
    assert 'id="timeline"' not in page


def test_the_gate_page_says_the_verdict() -> None:
    verdict = {
        "verdict": "regression",
        "summary": EVIL,
        "baseline": {"gpu_idle_fraction": 0.1, "runs": [{"name": EVIL, "gpu_idle_fraction": 0.1}]},
        "current": {"gpu_idle_fraction": 0.5, "runs": [{"name": "head", "gpu_idle_fraction": 0.5}]},
        "increase": 0.4,
        "allowed_increase": 0.02,
        "max_increase": 0.02,
        "phase_deltas": [{"phase": "data", "baseline": 0.1, "current": 0.5, "delta": 0.4}],
        "findings": [],
        "notes": [],
    }
    page = render_verdict(verdict)
    assert 'id="verdict">REGRESSION<' in page
    assert "<img" not in page
    assert 'data-limit="threshold"' in page
