"""report.html in a real browser (headless Chromium): a healthy run, a starved loader, a 2-rank
job, a gate failure and a hostile report. Each page must load with no console error and no
request but its own file, draw its charts (the SVG elements, with the report's numbers), and
leave a screenshot in the test's tmp folder."""

from __future__ import annotations

import importlib.util
import json
import sys
import time
from pathlib import Path
from types import ModuleType
from typing import Any

from browser.pixels import png_pixels
from stallscope import StallScope
from stallscope.cli import main
from stallscope.report.html import LABEL_W, PHASE_COLOURS

ROOT = Path(__file__).resolve().parents[2]


def _starved_loader() -> ModuleType:
    spec = importlib.util.spec_from_file_location("starved_loader_browser", ROOT / "examples" / "starved_loader.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def _healthy(folder: Path, steps: int = 60) -> Path:
    with StallScope(report_dir=folder, console=False) as scope:
        for _ in range(2):
            for _ in scope.iter(range(steps // 2)):
                with scope.phase("compute"):
                    time.sleep(0.002)
    return folder


def _shot(opened: Any, folder: Path, name: str) -> Path:
    path = folder / f"{name}.png"
    opened.page.screenshot(path=str(path), full_page=True)
    assert path.stat().st_size > 1000
    return path


def _pct(x: float) -> str:
    return f"{100 * x:.1f}%"


def test_a_healthy_runs_page(tmp_path: Path, open_page: Any) -> None:
    folder = _healthy(tmp_path / "run")
    page_path = folder / "report.html"  # written by the run itself, beside report.json
    report = json.loads((folder / "report.json").read_text())
    opened = open_page(page_path)
    opened.assert_clean(page_path)
    page = opened.page
    assert page.inner_text("#idle") == _pct(report["summary"]["gpu_idle_fraction"])
    # the run's and each epoch's stacked bar, compute the widest part of each
    segments = page.eval_on_selector_all(
        "svg#epochs rect.seg", "els => els.map(e => [e.dataset.phase, Number(e.dataset.fraction)])"
    )
    compute = [f for name, f in segments if name == "compute"]
    assert len(compute) == 3
    assert compute[0] == round(report["summary"]["phase_fractions"]["compute"], 6)
    assert page.locator("svg#timeline path[data-phase='compute']").count() == 1
    assert "No fix predicted" in page.inner_text("#fixes")
    _shot(opened, tmp_path, "healthy")
    dark = open_page(page_path, color_scheme="dark")
    dark.assert_clean(page_path)
    background = dark.page.evaluate("getComputedStyle(document.body).backgroundColor")
    assert background == "rgb(20, 20, 20)"
    _shot(dark, tmp_path, "healthy-dark")


def test_a_starved_loaders_page_draws_the_data_wait_where_the_report_says(tmp_path: Path, open_page: Any) -> None:
    """The top fix is data.workers; and on a pixel row of the timeline's screenshot, the middle of
    every step's data wait is red and the middle of every compute slice green, at the x the
    report's recent steps give."""
    folder = tmp_path / "starved"
    _starved_loader().run(report_dir=str(folder), console=False, epochs=1, batches=40)
    page_path = folder / "report.html"
    report = json.loads((folder / "report.json").read_text())
    opened = open_page(page_path)
    opened.assert_clean(page_path)
    page = opened.page
    assert page.get_attribute("#fixes .fix", "data-finding") == "data.workers"
    assert report["findings"][0]["id"] == "data.workers"
    _shot(opened, tmp_path, "starved")

    svg = page.locator("svg#timeline")
    width, _, rows = png_pixels(svg.screenshot())
    box = svg.bounding_box()
    assert abs(box["width"] - width) <= 1
    scale = width / float(page.evaluate("document.getElementById('timeline').viewBox.baseVal.width"))
    plot_w = float(svg.get_attribute("data-plot-width") or 0)
    row = rows[round((4 + 20) * scale)]  # the middle of rank 0's row

    record = report["recent_steps"][0]
    starts, at = [], 0
    for d in record["start_delta_us"]:
        at += d
        starts.append(at)
    n = int(page.get_attribute("g.row[data-row='0']", "data-steps") or 0)
    assert n == min(len(starts), 100)
    first = len(starts) - n
    phases = record["phases_us"]
    order = ["data", "h2d", "compute", "logging", "checkpoint", "validation", "other"]
    names = [p for p in order if p in phases]
    t0 = starts[first]
    end = max(starts[i] + sum(phases[p][i] for p in names) for i in range(first, len(starts)))
    us_per_px = (end - t0) / plot_w

    def pixel(x_svg: float) -> tuple[int, int, int]:
        x = round(x_svg * scale)
        return row[4 * x], row[4 * x + 1], row[4 * x + 2]

    checked = {"data": 0, "compute": 0}
    for i in range(first, len(starts)):
        offset = starts[i] - t0
        for name in names:
            us = phases[name][i]
            if name in checked and us / us_per_px >= 4:
                r, g, b = pixel(LABEL_W + (offset + us / 2) / us_per_px)
                want = PHASE_COLOURS[name]
                wr, wg, wb = int(want[1:3], 16), int(want[3:5], 16), int(want[5:7], 16)
                assert abs(r - wr) + abs(g - wg) + abs(b - wb) < 40, (name, i, (r, g, b))
                checked[name] += 1
            offset += us
    assert checked["data"] >= n // 2  # the starved loader's waits are wide enough to check
    # the share of red along the row is the data wait's share of the drawn time
    # (each pixel counted as the colour it is nearest to: an edge's blend goes to one side or the other)
    palette = {name: PHASE_COLOURS[name] for name in names} | {"background": "#ffffff"}
    red = sum(
        1
        for x in range(round(LABEL_W * scale), round((LABEL_W + plot_w) * scale))
        if min(palette, key=lambda name: _distance(row, x, palette[name])) == "data"
    )
    data_share = sum(phases["data"][first:]) / (end - t0)
    assert abs(red / (plot_w * scale) - data_share) < 0.05


def _distance(row: bytes, x: int, colour: str) -> int:
    wr, wg, wb = int(colour[1:3], 16), int(colour[3:5], 16), int(colour[5:7], 16)
    return abs(row[4 * x] - wr) + abs(row[4 * x + 1] - wg) + abs(row[4 * x + 2] - wb)


def test_a_two_rank_jobs_page(tmp_path: Path, open_page: Any) -> None:
    """A job report with two ranks (rank 1's record in its own file, as ``ranks/rank-1.json``):
    a bar per rank, a row per rank in the table and in the timeline."""
    folder = _healthy(tmp_path / "job")
    doc = json.loads((folder / "report.json").read_text())
    entry = {
        "rank": 0,
        "host": doc["run"]["host"],
        "steps": doc["summary"]["steps"],
        "wall_s": doc["summary"]["wall_s"],
        "steps_per_s": doc["summary"]["steps_per_s"],
        "gpu_idle_fraction": doc["summary"]["gpu_idle_fraction"],
        "phase_fractions": doc["summary"]["phase_fractions"],
    }
    slow = dict(entry, rank=1, host="node-2", gpu_idle_fraction=0.6, phase_fractions={"data": 0.6, "compute": 0.4})
    doc["ranks"] = [entry, slow]
    doc["run"].update(rank=0, world_size=2, local_rank=0)
    doc["recent_steps"][0]["rank"] = 0
    other = json.loads(json.dumps(doc))
    other["recent_steps"][0].update(rank=1, host="node-2")
    other["recent_steps"][0]["phases_us"]["data"] = [3000] * len(other["recent_steps"][0]["start_delta_us"])
    del doc["recent_steps"][0:]  # rank 0's own record is in the rank files too
    doc["recent_steps"] = [json.loads(json.dumps(other["recent_steps"][0]))]
    doc["recent_steps"][0].update(rank=0, host=entry["host"])
    del doc["recent_steps"][0]["phases_us"]["data"]
    (folder / "report.json").write_text(json.dumps(doc))
    (folder / "ranks").mkdir()
    (folder / "ranks" / "rank-1.json").write_text(json.dumps(other))
    out = tmp_path / "job.html"
    assert main(["html", str(folder), "-o", str(out)]) == 0
    opened = open_page(out)
    opened.assert_clean(out)
    page = opened.page
    assert page.locator("svg#ranks text", has_text="rank 1").count() == 1
    assert page.locator("#ranks-table tr").count() == 3
    assert "node-2" in page.inner_text("#ranks-table")
    assert page.locator("svg#timeline g.row").count() == 2
    assert page.locator("svg#timeline path[data-phase='data'][data-row='1']").count() == 1
    assert page.locator("svg#timeline path[data-phase='data'][data-row='0']").count() == 0
    data = page.eval_on_selector_all(
        "svg#ranks rect.seg[data-phase='data']", "els => els.map(e => Number(e.dataset.fraction))"
    )
    assert data == [round(entry["phase_fractions"].get("data", 0.0), 6), 0.6]
    _shot(opened, tmp_path, "job")


def test_a_gate_failures_page(tmp_path: Path, open_page: Any) -> None:
    starved = _starved_loader()
    starved.run(report_dir=str(tmp_path / "base"), console=False, epochs=1, batches=24, cpu_ms_per_sample=0.0)
    starved.run(report_dir=str(tmp_path / "head"), console=False, epochs=1, batches=24)
    out = tmp_path / "gate.html"
    code = main(["check", str(tmp_path / "head"), "--baseline", str(tmp_path / "base"), "--html", str(out)])
    assert code == 1
    opened = open_page(out)
    opened.assert_clean(out)
    page = opened.page
    assert page.inner_text("#verdict") == "REGRESSION"
    kinds = page.eval_on_selector_all(
        "svg#gate rect.run", "els => els.map(e => [e.dataset.kind, Number(e.dataset.idle)])"
    )
    head = json.loads((tmp_path / "head" / "report.json").read_text())["summary"]["gpu_idle_fraction"]
    base = json.loads((tmp_path / "base" / "report.json").read_text())["summary"]["gpu_idle_fraction"]
    assert kinds == [["baseline", base], ["current", head]]
    assert page.locator("svg#gate line[data-limit='threshold']").count() == 1
    assert "data" in page.inner_text("#grown")
    _shot(opened, tmp_path, "gate")


EVIL = '</script><script>window.pwned=1</script><img src=x onerror="window.pwned=2">\u2028<!--&amp;'


def test_a_hostile_reports_strings_stay_text(tmp_path: Path, open_page: Any) -> None:
    """Strings that would close the data block, open markup, or run script, in every place a
    report's string reaches the page: they show as text, and nothing runs or loads."""
    folder = _healthy(tmp_path / "run")
    doc = json.loads((folder / "report.json").read_text())
    doc["notes"] = [EVIL]
    doc["run"]["host"] = EVIL
    doc["run"]["device"]["name"] = EVIL
    for span in [doc["summary"], *(e["summary"] for e in doc["epochs"])]:
        span["phase_fractions"][EVIL] = span["phase_fractions"].pop("other")
    record = doc["recent_steps"][0]
    record["host"] = EVIL
    record["phases_us"][EVIL] = record["phases_us"].pop("other")
    doc["findings"] = [
        {
            "id": "data.workers",
            "title": EVIL,
            "est_saving_fraction": 0.3,
            "est_speedup": 1.4,
            "fix": EVIL,
            "suggestion": {EVIL: EVIL},
            "snippet": EVIL + "\nsecond line",
        }
    ]
    hostile = tmp_path / "hostile.json"
    hostile.write_text(json.dumps(doc))
    out = tmp_path / "hostile.html"
    assert main(["html", str(hostile), "-o", str(out)]) == 0
    opened = open_page(out)
    opened.assert_clean(out)
    page = opened.page
    assert page.evaluate("window.pwned") is None
    assert page.locator("img").count() == 0
    assert page.locator("script").count() == 2
    assert EVIL.replace("\u2028", " ") in page.inner_text("#notes")
    assert (
        page.evaluate("JSON.parse(document.getElementById('stallscope-data').textContent).timeline[0].names")[-1]
        == EVIL
    )
    # hover over the timeline: the tooltip shows the phase name as text
    svg = page.locator("svg#timeline")
    box = svg.bounding_box()
    page.mouse.move(box["x"] + LABEL_W + 5, box["y"] + 20)
    assert page.locator("#tip").is_visible()
    assert page.locator("#tip img").count() == 0
    _shot(opened, tmp_path, "hostile")
