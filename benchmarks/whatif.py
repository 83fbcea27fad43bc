"""Predictions that hold: run each scenario, apply its top finding's suggestion, run it again.

For every scenario in ``examples/scenarios.py`` this runs the planted-bottleneck loop as is
("before"), reads the top finding's ``suggestion`` from the report, re-runs the loop with that
setting ("after"), and compares the predicted speedup (``est_speedup``) with the realized one
(before wall time / after wall time, same number of steps). Runs are interleaved and repeated;
medians are reported.

    .venv/bin/python benchmarks/whatif.py [--repeats 3] [--only NAME ...] [--markdown FILE]
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

#: the prediction must be within this relative error of the realized speedup (issue target)
TARGET = 0.30


def settings_for(module: ModuleType, suggestion: dict[str, Any]) -> dict[str, Any] | None:
    """The ``run()`` keyword arguments that apply ``suggestion``; None when it cannot be applied."""
    custom = getattr(module, "apply_suggestion", None)
    if custom is not None:
        return dict(custom(suggestion))
    accepted = inspect.signature(module.run).parameters
    takes_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in accepted.values())
    out: dict[str, Any] = {}
    for key, value in suggestion.items():
        if key == "non_blocking":
            continue
        if key not in accepted and not takes_any:
            return None
        out[key] = value
    return out or None


def wall(module: ModuleType, report_dir: str, settings: dict[str, Any]) -> tuple[float, Any]:
    report = module.run(report_dir=report_dir, console=False, **getattr(module, "WHATIF", {}), **settings)
    return report.summary.wall_s, report


def measure(name: str, repeats: int, tmp: str) -> dict[str, Any]:
    module = importlib.import_module(name)
    before, predicted, top = [], [], None
    after: list[float] = []
    settings: dict[str, Any] | None = None
    for i in range(repeats):
        seconds, report = wall(module, f"{tmp}/{name}-before-{i}", {})
        before.append(seconds)
        if report.findings:
            top = top or report.findings[0]
            if report.findings[0].id == top.id:
                predicted.append(report.findings[0].est_speedup)
        if top is None:
            continue
        settings = settings if settings is not None else settings_for(module, dict(top.suggestion))
        if settings is None:
            break
        seconds, _ = wall(module, f"{tmp}/{name}-after-{i}", settings)
        after.append(seconds)
    row: dict[str, Any] = {"scenario": name, "expected": module.EXPECTED, "top": top.id if top else None}
    row["suggestion"] = dict(top.suggestion) if top else {}
    row["before_s"] = statistics.median(before)
    if top is not None and after and predicted:
        row["predicted"] = statistics.median(predicted)
        row["realized"] = row["before_s"] / statistics.median(after)
        row["error"] = abs(row["predicted"] - row["realized"]) / row["realized"]
    return row


def markdown(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| scenario | top finding | suggestion | predicted | realized | error |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        if "realized" in r:
            ok = "" if r["error"] <= TARGET else " (over target)"
            cells = [f"x{r['predicted']:.2f}", f"x{r['realized']:.2f}", f"{r['error']:.0%}{ok}"]
        else:
            cells = ["-", "-", "no finding" if r["top"] is None else "not applied"]
        suggestion = ", ".join(f"{k}={v!r}" for k, v in r["suggestion"].items()) or "-"
        lines.append(f"| {r['scenario']} | {r['top'] or '-'} | {suggestion} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=3, help="interleaved before/after pairs per scenario")
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
    misses = [r for r in rows if r["expected"] and r["top"] != r["expected"]]
    for r in misses:
        print(f"{r['scenario']}: top finding {r['top']}, expected {r['expected']}", file=sys.stderr)
    return 1 if misses else 0


if __name__ == "__main__":
    sys.exit(main())
