"""Predictions that hold: run each scenario, apply its top finding's suggestion, run it again.

For every scenario in ``examples/scenarios.py`` this runs the planted-bottleneck loop as is
("before"), reads the top finding's ``suggestion`` from the report, re-runs the loop with that
setting ("after"), and compares the predicted speedup (``est_speedup``) with the realized one
(before wall time / after wall time, same number of steps; for a scenario that runs for a set
time, ``FIXED_TIME``, after steps per second / before). Runs are interleaved and repeated;
medians are reported.

A suggestion is applied whole, every key of it, or not at all ("not applied": the scenario's
``run()`` does not take one of its keys). A row holds when:

* the applied suggestion still validates and still saves checkpoints where the run before it did
  (SPEC §3: no suggestion turns a phase off for the whole run);
* it does not log training more often than the run did (``log_every_n_steps`` below the run's);
* an estimate (``est_speedup_bound == "estimate"``) is within 30% of the realized speedup;
* a floor (``"lower"``) holds: realized / 2 <= predicted <= 1.15 x realized.

    .venv/bin/python benchmarks/whatif.py [--repeats 5] [--only NAME ...] [--markdown FILE]
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import statistics
import sys
import tempfile
import warnings
from pathlib import Path
from types import ModuleType
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "examples"))
sys.path.insert(0, str(ROOT))

import scenarios  # noqa: E402

#: an estimate must be within this relative error of the realized speedup
TARGET = 0.30
#: a floor holds when realized * FLOOR_LOW <= predicted <= realized * FLOOR_HIGH
FLOOR_LOW = 0.5
FLOOR_HIGH = 1.15
#: phases the applied suggestion must not turn off
KEPT_PHASES = ("validation", "checkpoint")


def settings_for(module: ModuleType, suggestion: dict[str, Any]) -> dict[str, Any] | None:
    """The ``run()`` keyword arguments that apply ``suggestion``; None when it cannot be applied."""
    custom = getattr(module, "apply_suggestion", None)
    if custom is not None:
        return dict(custom(suggestion))
    accepted = inspect.signature(module.run).parameters
    takes_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in accepted.values())
    if not takes_any and not set(suggestion) <= set(accepted):
        return None  # applied whole or not at all
    return dict(suggestion) or None


def judge(predicted: float, realized: float, bound: str) -> tuple[bool, str]:
    """Whether a prediction holds, and how far it is from what happened."""
    if bound == "lower":
        ok = realized * FLOOR_LOW <= predicted <= realized * FLOOR_HIGH
        return ok, f"floor at {predicted / realized:.0%} of realized"
    error = abs(predicted - realized) / realized
    return error <= TARGET, f"{error:.0%}"


def _disturbed(report: Any) -> bool:
    """The report says other processes kept most of the machine's cores busy."""
    return any("timings are disturbed" in note for note in report.notes)


def turned_off(before: Any, after: Any) -> list[str]:
    """The phases that ran before the suggestion and not at all after it."""
    return [
        phase
        for phase in KEPT_PHASES
        if before.summary.phase_seconds.get(phase, 0) > 0 and after.summary.phase_seconds.get(phase, 0) <= 0
    ]


def logs_more_often(module: ModuleType, suggestion: dict[str, Any]) -> bool:
    """Whether ``suggestion`` sets ``log_every_n_steps`` below what the scenario's run used."""
    k = suggestion.get("log_every_n_steps")
    parameter = inspect.signature(module.run).parameters.get("log_every_n_steps")
    if not isinstance(k, int) or parameter is None:
        return False
    now = {**{"log_every_n_steps": parameter.default}, **getattr(module, "WHATIF", {})}["log_every_n_steps"]
    return isinstance(now, int) and k < now


def wall(module: ModuleType, report_dir: str, settings: dict[str, Any]) -> tuple[float, Any]:
    """The run's wall time, or for a run of a set time (``FIXED_TIME``) its seconds per step."""
    report = module.run(report_dir=report_dir, console=False, **getattr(module, "WHATIF", {}), **settings)
    if getattr(module, "FIXED_TIME", False):
        return 1 / max(report.summary.steps_per_s, 1e-9), report
    return report.summary.wall_s, report


def measure(name: str, repeats: int, tmp: str) -> dict[str, Any]:
    module = importlib.import_module(name)
    before, predicted, top = [], [], None
    after: list[float] = []
    off: set[str] = set()
    steps_differ = False
    disturbed = False
    settings: dict[str, Any] | None = None
    for i in range(repeats):
        seconds, report = wall(module, f"{tmp}/{name}-before-{i}", {})
        before.append(seconds)
        disturbed = disturbed or _disturbed(report)
        if report.findings:
            top = top or report.findings[0]
            if report.findings[0].id == top.id:
                predicted.append(report.findings[0].est_speedup)
        if top is None:
            continue
        settings = settings if settings is not None else settings_for(module, dict(top.suggestion))
        if settings is None:
            break
        seconds, applied = wall(module, f"{tmp}/{name}-after-{i}", settings)
        after.append(seconds)
        disturbed = disturbed or _disturbed(applied)
        off.update(turned_off(report, applied))
        if not getattr(module, "FIXED_TIME", False):  # a run of a set time runs the steps it has time for
            steps_differ = steps_differ or applied.summary.steps != report.summary.steps
    row: dict[str, Any] = {"scenario": name, "expected": module.EXPECTED, "top": top.id if top else None}
    row["suggestion"] = dict(top.suggestion) if top else {}
    row["bound"] = top.est_speedup_bound if top else "estimate"
    row["before_s"] = statistics.median(before)
    row["turned_off"] = sorted(off)
    row["logs_more"] = logs_more_often(module, row["suggestion"])
    row["steps_differ"] = steps_differ
    row["disturbed"] = disturbed
    if top is not None and after and predicted:
        row["predicted"] = statistics.median(predicted)
        row["realized"] = row["before_s"] / statistics.median(after)
        row["holds"], row["error"] = judge(row["predicted"], row["realized"], row["bound"])
    return row


def problems(row: dict[str, Any]) -> list[str]:
    """Why a row fails the benchmark (empty when it holds)."""
    out = []
    if row["expected"] and row["top"] != row["expected"]:
        out.append(f"top finding {row['top']}, expected {row['expected']}")
    if row["turned_off"]:
        out.append(f"the applied suggestion turns off {', '.join(row['turned_off'])}")
    if row.get("logs_more"):
        out.append("the suggestion logs training more often than the run did")
    if row["steps_differ"]:
        out.append("the applied suggestion ran a different number of steps")
    if "realized" in row and not row["holds"]:
        kind = "floor" if row["bound"] == "lower" else "estimate"
        out.append(f"{kind} x{row['predicted']:.2f} against realized x{row['realized']:.2f} ({row['error']})")
    if row["top"] is not None and "realized" not in row and row["expected"]:
        out.append(f"suggestion {row['suggestion']} not applied: run() does not take all of its keys")
    return out


def markdown(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| scenario | top finding | suggestion | predicted | realized | error | holds |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        if "realized" in r:
            floor = "at least " if r["bound"] == "lower" else ""
            verdict = "yes" if not problems(r) else "no: " + "; ".join(problems(r))
            if r["disturbed"]:
                verdict += " (measured while other processes kept most cores busy)"
            cells = [f"{floor}x{r['predicted']:.2f}", f"x{r['realized']:.2f}", r["error"], verdict]
        else:
            cells = ["-", "-", "no finding" if r["top"] is None else "not applied", "-"]
        suggestion = ", ".join(f"{k}={v!r}" for k, v in r["suggestion"].items()) or "-"
        lines.append(f"| {r['scenario']} | {r['top'] or '-'} | {suggestion} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=5, help="before/after pairs per scenario (default 5)")
    parser.add_argument("--only", nargs="*", help="scenario names (default: all)")
    parser.add_argument("--markdown", type=Path, help="also write the table to this file")
    args = parser.parse_args()
    if args.repeats < 1:
        parser.error(f"--repeats must be >= 1, got {args.repeats}")
    names = args.only or scenarios.ALL
    unknown = sorted(set(names) - set(scenarios.ALL))
    if unknown:
        parser.error(f"unknown scenario(s): {', '.join(unknown)}; known: {', '.join(scenarios.ALL)}")
    rows = []
    with tempfile.TemporaryDirectory() as tmp, warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch's advice on worker counts, Lightning's tips
        for name in names:
            print(f"running {name} ...", file=sys.stderr, flush=True)
            rows.append(measure(name, args.repeats, tmp))
    table = markdown(rows)
    print(table)
    if args.markdown:
        args.markdown.write_text(table + "\n", encoding="utf-8")
    failed = [(r["scenario"], p) for r in rows for p in problems(r)]
    for scenario, problem in failed:
        print(f"{scenario}: {problem}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
