"""``stallscope trace``: the Chrome trace of the recent steps, checked against the Trace Event
Format, and its merge into a real torch.profiler trace made here."""

from __future__ import annotations

import json
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest
import torch

from stallscope import StallScope
from stallscope.cli import main
from stallscope.report.io import load_report
from stallscope.report.trace import MERGE_PID_BASE


def _check_trace_events(events: list[Any]) -> None:
    """The Trace Event Format: required keys and types, ts/dur in microseconds (numbers >= 0),
    and complete slices that nest on each thread (a slice that starts inside another ends in it)."""
    assert isinstance(events, list)
    assert events
    by_thread: dict[tuple[int, int], list[tuple[float, float]]] = defaultdict(list)
    for e in events:
        assert isinstance(e, dict)
        assert e["ph"] in ("X", "C", "M")
        assert isinstance(e["name"], str)
        assert e["name"]
        assert type(e["pid"]) is int
        if e["ph"] != "C":
            assert type(e["tid"]) is int
        assert isinstance(e["ts"], (int, float))
        assert e["ts"] >= 0
        if e["ph"] == "X":
            assert isinstance(e["dur"], (int, float))
            assert e["dur"] >= 0
            by_thread[(e["pid"], e["tid"])].append((e["ts"], e["ts"] + e["dur"]))
        if e["ph"] == "C":
            assert all(isinstance(v, (int, float)) for v in e["args"].values())
        if e["ph"] == "M":
            assert e["name"] in ("process_name", "process_sort_index", "thread_name")
    for slices in by_thread.values():
        stack: list[float] = []
        for start, end in sorted(slices, key=lambda s: (s[0], -s[1])):
            while stack and stack[-1] <= start:
                stack.pop()
            if stack:
                assert end <= stack[-1], "a slice overlaps its parent's end"
            stack.append(end)


def _slow(steps: int) -> Any:
    for i in range(steps):
        time.sleep(0.0003)  # the loader's wait
        yield i


def _run(folder: Path, steps: int = 40, *, profile: Path | None = None) -> None:
    model = torch.nn.Linear(16, 16)
    with StallScope(report_dir=folder, console=False) as scope:
        profiler = torch.profiler.profile() if profile is not None else None
        for i in scope.iter(_slow(steps)):
            if profiler is not None and i == steps // 2:
                profiler.__enter__()
            with scope.phase("compute"):
                model(torch.randn(8, 16)).sum().backward()
            with scope.phase("logging"):
                pass
        if profiler is not None:
            profiler.__exit__(None, None, None)
            profiler.export_chrome_trace(str(profile))


def test_the_trace_is_valid_and_holds_every_recent_step(tmp_path: Path) -> None:
    _run(tmp_path / "run")
    out = tmp_path / "trace.json"
    assert main(["trace", str(tmp_path / "run"), "-o", str(out)]) == 0
    doc = json.loads(out.read_text())
    _check_trace_events(doc["traceEvents"])
    steps = [e for e in doc["traceEvents"] if e.get("cat") == "step"]
    assert [e["name"] for e in steps] == [f"step {i}" for i in range(40)]
    names = {e["args"]["name"] for e in doc["traceEvents"] if e["name"] == "process_name"}
    assert len(names) == 1
    assert names.pop().startswith("rank 0")
    # the phases of a step add up to it, and the data wait comes first
    record = load_report(tmp_path / "run").recent[0]
    phases = [e for e in doc["traceEvents"] if e.get("cat") == "phase" and e["args"]["step"] == 7]
    assert sum(e["dur"] for e in phases) == steps[7]["dur"] == record.duration_us(7)
    assert phases[0]["name"] == "data"
    assert phases[0]["ts"] == steps[7]["ts"]


def test_two_ranks_files_give_one_process_each(tmp_path: Path) -> None:
    _run(tmp_path / "run")
    report = json.loads((tmp_path / "run" / "report.json").read_text())
    other = json.loads(json.dumps(report))
    other["recent_steps"][0]["rank"] = 1
    other["recent_steps"][0]["host"] = "node-2"
    report["recent_steps"][0]["rank"] = 0
    (tmp_path / "run" / "report.json").write_text(json.dumps(report))
    (tmp_path / "run" / "ranks").mkdir()
    (tmp_path / "run" / "ranks" / "rank-1.json").write_text(json.dumps(other))
    out = tmp_path / "trace.json"
    assert main(["trace", str(tmp_path / "run"), "-o", str(out)]) == 0
    doc = json.loads(out.read_text())
    _check_trace_events(doc["traceEvents"])
    names = {e["pid"]: e["args"]["name"] for e in doc["traceEvents"] if e["name"] == "process_name"}
    assert names == {0: f"rank 0 · {report['run']['host']}", 1: "rank 1 · node-2"}


def test_the_merge_puts_the_phases_beside_a_real_profilers_events(tmp_path: Path) -> None:
    """A torch.profiler trace of the run's second half: the merged trace keeps every one of its
    events, adds the steps it covers, aligned (each added step overlaps the profiled span), and
    is still a valid trace that reads back."""
    kineto = tmp_path / "kineto.json"
    _run(tmp_path / "run", steps=60, profile=kineto)
    original = json.loads(kineto.read_text())
    out = tmp_path / "merged.json"
    assert main(["trace", str(tmp_path / "run"), "-o", str(out), "--merge", str(kineto)]) == 0
    merged = json.loads(out.read_text())
    assert merged["baseTimeNanoseconds"] == original["baseTimeNanoseconds"]
    assert merged["traceEvents"][: len(original["traceEvents"])] == original["traceEvents"]
    added = merged["traceEvents"][len(original["traceEvents"]) :]
    _check_trace_events(added)
    assert all(e["pid"] == MERGE_PID_BASE for e in added)
    ops = [e for e in original["traceEvents"] if e.get("ph") == "X" and e.get("cat") == "cpu_op"]
    lo, hi = min(e["ts"] for e in ops), max(e["ts"] + e["dur"] for e in ops)
    steps = [e for e in added if e.get("cat") == "step"]
    # the profiler ran from step 30 to the end: those steps, and none from long before
    numbers = sorted(e["args"]["step"] for e in steps)
    assert 30 <= len(numbers) <= 31
    assert numbers[-1] == 59
    # the model's own ops (aten::linear in compute) fall inside a merged compute slice
    computes = [(e["ts"], e["ts"] + e["dur"]) for e in added if e["name"] == "compute"]
    linears = [e for e in ops if e["name"] == "aten::linear"]
    assert linears
    inside = sum(any(a - 50 <= e["ts"] and e["ts"] + e["dur"] <= b + 50 for a, b in computes) for e in linears)
    assert inside >= len(linears) * 0.9
    assert all(hi >= e["ts"] and e["ts"] + e["dur"] >= lo for e in steps)


def test_a_report_without_recent_steps_is_a_one_line_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _run(tmp_path / "run")
    doc = json.loads((tmp_path / "run" / "report.json").read_text())
    del doc["recent_steps"]
    (tmp_path / "old.json").write_text(json.dumps(doc))
    assert main(["trace", str(tmp_path / "old.json"), "-o", str(tmp_path / "t.json")]) == 2
    err = capsys.readouterr().err
    assert "no recent steps" in err
    assert err.count("\n") == 1


def test_a_file_that_is_not_a_profiler_trace_cannot_be_merged(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _run(tmp_path / "run")
    (tmp_path / "k.json").write_text(json.dumps({"traceEvents": []}))
    assert (
        main(["trace", str(tmp_path / "run"), "-o", str(tmp_path / "t.json"), "--merge", str(tmp_path / "k.json")]) == 2
    )
    assert "baseTimeNanoseconds" in capsys.readouterr().err
