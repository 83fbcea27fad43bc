"""The recent steps as Chrome Trace Event JSON (``stallscope trace``), alone or merged into a
torch.profiler (Kineto) trace.

Made from the report alone (``Report.recent``, ``Report.series``), never from live objects:

* one process per rank (``pid`` = the rank, named ``rank R · host``), one thread (``steps``) in
  it: a slice per step (``step N``) holding a slice per phase, laid out in the order a step runs
  them: the data wait first (a step begins when the loop asks for its batch), then ``h2d``,
  ``compute``, ``logging``, ``checkpoint``, ``validation``, the custom phases and ``other``. A
  step keeps its time per phase, not the order of its phases' entries: within a step the order
  is this canonical one;
* the samplers' series as counters (``ph: C``) on the process of the rank that took them;
* ``ts`` and ``dur`` in microseconds, integers, after the earliest rank's run start (all ranks
  on the unix clock, so the ranks of a job line up as their clocks agree).

Merged (``--merge``): Kineto writes ``ts`` in microseconds after ``baseTimeNanoseconds`` on the
unix clock, so a step that began at unix time ``u`` us goes at ``u - baseTimeNanoseconds / 1000``.
StallScope's processes get pids of their own (``MERGE_PID_BASE + rank``) so they never mix with
the profiled process's threads, and only the steps that overlap the profiled span are kept.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from stallscope._exceptions import ReportError
from stallscope.report.io import load_report
from stallscope.report.recent import RecentSteps, Series
from stallscope.report.schema import Report
from stallscope.timeline.phases import BUILTIN_PHASES, OTHER

#: the pid of rank R's process in a merged trace (far from any real process id)
MERGE_PID_BASE = 2_000_000_000
#: the thread of a rank's steps
STEPS_TID = 1
#: the colours Perfetto and chrome://tracing give the phases (their reserved colour names), the
#: same hues as the HTML report's
PHASE_COLOURS = {
    "data": "terrible",  # red: the accelerator waits for the loader
    "h2d": "yellow",
    "compute": "good",  # green
    "logging": "grey",
    "checkpoint": "olive",
    "validation": "rail_response",
    "other": "generic_work",
}


def phase_order(names: Iterable[str]) -> list[str]:
    """The phases in the order a step runs them: the built-in ones, the custom ones, ``other``."""
    names = list(names)
    builtin = [p for p in BUILTIN_PHASES if p in names and p != OTHER]
    custom = [p for p in names if p not in BUILTIN_PHASES]
    return builtin + custom + ([OTHER] if OTHER in names else [])


def load_recent(path: str | Path, *, required: bool = True) -> tuple[Report, tuple[RecentSteps, ...]]:
    """A report and every rank's recent steps: the report's own, and for a folder, those of the
    ranks' own files (``ranks/rank-<R>.json``) that the report lacks. Raises ``ReportError``
    (also when there are none and ``required``)."""
    report = load_report(path)
    records = {r.rank: r for r in report.recent}
    folder = Path(path)
    ranks = folder / "ranks" if folder.is_dir() else None
    if ranks is not None and ranks.is_dir():
        for file in sorted(ranks.glob("rank-*.json")):
            try:
                own = load_report(file)
            except ReportError:
                continue  # a rank's file half-written or damaged: its steps are missing, no more
            for r in own.recent:
                records.setdefault(r.rank, r)
    if not records and required:
        raise ReportError(f"{path}: the report holds no recent steps (written by an older StallScope, or no step ran)")
    ordered = tuple(records[k] for k in sorted(records, key=lambda rank: -1 if rank is None else rank))
    return report, ordered


def _meta(pid: int, tid: int, name: str, args: Mapping[str, Any]) -> dict[str, Any]:
    return {"ph": "M", "name": name, "pid": pid, "tid": tid, "ts": 0, "args": dict(args)}


def rank_events(
    record: RecentSteps, pid: int, shift_us: int, *, keep: tuple[int, int] | None = None
) -> list[dict[str, Any]]:
    """The slices of one rank's steps; a step starts at ``run_start_unix_us + start_us - shift_us``.
    ``keep``: only the steps that overlap [lo, hi] (in the output's microseconds)."""
    rank = record.rank if record.rank is not None else 0
    label = f"rank {rank}" + (f" · {record.host}" if record.host else "")
    events = [
        _meta(pid, 0, "process_name", {"name": label}),
        _meta(pid, 0, "process_sort_index", {"sort_index": rank}),
        _meta(pid, STEPS_TID, "thread_name", {"name": "steps"}),
    ]
    order = phase_order(record.phases_us)
    columns = [(name, record.phases_us[name]) for name in order]
    base = record.run_start_unix_us - shift_us
    for i, start in enumerate(record.start_us):
        ts = base + start
        dur = sum(values[i] for _, values in columns)
        if keep is not None and (ts + dur < keep[0] or ts > keep[1]):
            continue
        step = record.first_step + i
        events.append(
            {
                "ph": "X",
                "name": f"step {step}",
                "cat": "step",
                "pid": pid,
                "tid": STEPS_TID,
                "ts": ts,
                "dur": dur,
                "args": {"step": step},
            }
        )
        at = ts
        for name, values in columns:
            us = values[i]
            if us <= 0:
                continue
            event: dict[str, Any] = {
                "ph": "X",
                "name": name,
                "cat": "phase",
                "pid": pid,
                "tid": STEPS_TID,
                "ts": at,
                "dur": us,
                "args": {"step": step},
            }
            colour = PHASE_COLOURS.get(name)
            if colour is not None:
                event["cname"] = colour
            events.append(event)
            at += us
    return events


def counter_events(series: Sequence[Series], pid: int, run_start_us: int) -> list[dict[str, Any]]:
    """The samplers' readings as counters; a reading at ``t_ms`` goes at ``run_start_us + t_ms * 1000``."""
    out = []
    for s in series:
        label = f"{s.name} ({s.unit})"
        for t, v in zip(s.t_ms, s.values, strict=False):
            out.append(
                {
                    "ph": "C",
                    "name": label,
                    "pid": pid,
                    "tid": 0,
                    "ts": run_start_us + round(t * 1000),
                    "args": {s.name: v},
                }
            )
    return out


def _series_owner(report: Report, records: Sequence[RecentSteps]) -> RecentSteps | None:
    """The record of the process whose samplers took the report's series (its own rank's)."""
    own = report.run.rank if report.run.rank is not None else None
    return next((r for r in records if r.rank == own), records[0] if records else None)


def trace(report: Report, records: Sequence[RecentSteps]) -> dict[str, Any]:
    """The Chrome trace of ``records`` (one process per rank) and the report's series."""
    shift = min(r.run_start_unix_us for r in records)
    events: list[dict[str, Any]] = []
    for r in records:
        events += rank_events(r, r.rank if r.rank is not None else 0, shift)
    owner = _series_owner(report, records)
    if owner is not None and report.series:
        pid = owner.rank if owner.rank is not None else 0
        events += counter_events(report.series, pid, owner.run_start_unix_us - shift)
    return {
        "displayTimeUnit": "ms",
        "otherData": {"generator": "stallscope", "run_start_unix_us": shift, "host": report.run.host},
        "traceEvents": events,
    }


def merge(kineto: Any, report: Report, records: Sequence[RecentSteps]) -> tuple[dict[str, Any], int]:
    """``kineto`` (a torch.profiler trace's JSON object) with the steps that overlap it added,
    aligned on its ``baseTimeNanoseconds``; and how many steps were added."""
    if not isinstance(kineto, dict) or not isinstance(kineto.get("traceEvents"), list):
        raise ReportError("not a Chrome trace (no traceEvents list)")
    base_ns = kineto.get("baseTimeNanoseconds")
    if type(base_ns) is not int or base_ns < 0:
        raise ReportError("not a torch.profiler trace: no baseTimeNanoseconds to align on")
    shift = base_ns // 1000
    spans = [
        (float(e["ts"]), float(e["ts"]) + float(e.get("dur", 0)))
        for e in kineto["traceEvents"]
        if isinstance(e, dict) and e.get("ph") in ("X", "B", "E", "i") and isinstance(e.get("ts"), (int, float))
    ]
    if not spans:
        raise ReportError("the torch.profiler trace holds no timed events")
    keep = (int(min(a for a, _ in spans)), int(max(b for _, b in spans)) + 1)
    added: list[dict[str, Any]] = []
    steps = 0
    for r in records:
        rank = r.rank if r.rank is not None else 0
        events = rank_events(r, MERGE_PID_BASE + rank, shift, keep=keep)
        steps += sum(1 for e in events if e.get("cat") == "step")
        added += events
    for e in added:
        if e["name"] == "process_name":
            e["args"]["name"] = f"StallScope {e['args']['name']}"
        elif e["name"] == "process_sort_index":
            e["args"]["sort_index"] = -1000 + e["args"]["sort_index"]
    out = dict(kineto)
    out["traceEvents"] = [*kineto["traceEvents"], *added]
    return out, steps


def write_json(obj: Any, path: str | Path) -> Path:
    """Write ``obj`` as compact JSON (a trace is read by tools, not people)."""
    target = Path(path)
    if target.parent != Path():
        target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(
        json.dumps(obj, separators=(",", ":"), ensure_ascii=False, allow_nan=False) + "\n", encoding="utf-8"
    )
    return target
