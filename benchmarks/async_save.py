"""Asynchronous saves during training: the model of ``checkpoint.frequency`` against what happens.

``whatif.py`` applies each scenario's suggestion, and a suggestion that fits a short run leaves at
most one save, at its end, which no asynchronous write can overlap. This checks the other part of
the model: saves *during* training. For each checkpoint scenario it runs the loop saving every
``--every`` steps, blocking ("before"), reads the split of a save from the report
(``checkpoint.frequency``'s evidence: the write, its CPU, the building of the checkpoint, the
copy), predicts the run with the same saves made asynchronously (``async_cost_s``: each save
during training keeps its copy, its building and the hand-off, plus the counted share of its
write's CPU; a plain loop's last save is waited for; a Lightning fit's last save writes after
the fit), then runs it ("after", the scenario's ``async_save=True``). Before and after runs are
interleaved; medians are reported. An estimate holds within 30%, as in ``whatif.py``.

    .venv/bin/python benchmarks/async_save.py [--repeats 3] [--every 20] [--only NAME ...]
"""

from __future__ import annotations

import argparse
import importlib
import statistics
import sys
import tempfile
import warnings
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "examples"))
sys.path.insert(0, str(ROOT))

from stallscope.analysis.rules.checkpoint_frequency import ID, SaveSplit, async_cost_s  # noqa: E402

SCENARIOS = ("blocking_checkpoint", "short_blocking_checkpoint", "lightning_frequent_checkpoint")
TARGET = 0.30


def predicted_wall_s(report: Any, *, lightning: bool, every: int) -> tuple[float, dict[str, Any]] | None:
    """The run's wall time with its saves made asynchronously, from the blocking run's report."""
    finding = next((f for f in report.findings if f.id == ID), None)
    if finding is None or "copy_ms" not in finding.evidence:
        return None
    ev = finding.evidence
    split = SaveSplit(
        write_s=ev["write_ms"] / 1e3,
        write_cpu_s=ev["write_cpu_ms"] / 1e3,
        prepare_s=ev["prepare_ms"] / 1e3,
        copy_s=ev["copy_ms"] / 1e3,
        save_bytes=ev["save_mb"] * 1e6,
    )
    each, saves = ev["each_ms"] / 1e3, ev["count"]
    last_after_fit = lightning and report.summary.steps % every == 0
    cost = async_cost_s(
        split, saves, each, ev["write_cpu_counted"], last_waits=not lightning, last_after_fit=last_after_fit
    )
    return report.summary.wall_s - saves * each + cost, ev


def measure(name: str, every: int, repeats: int, tmp: str) -> dict[str, Any]:
    module = importlib.import_module(name)
    lightning = name.startswith("lightning")
    settings: dict[str, Any] = {"every_n_steps": every} | ({} if lightning else {"at_end": True})
    predicted, realized, splits = [], [], []
    for i in range(repeats):
        before = module.run(report_dir=f"{tmp}/{name}-b{i}", console=False, **settings)
        after = module.run(report_dir=f"{tmp}/{name}-a{i}", console=False, async_save=True, **settings)
        model = predicted_wall_s(before, lightning=lightning, every=every)
        if model is None:
            continue
        wall, ev = model
        predicted.append(before.summary.wall_s / wall)
        realized.append(before.summary.wall_s / after.summary.wall_s)
        splits.append(ev)
    row: dict[str, Any] = {"scenario": name, "every": every}
    if predicted:
        row["predicted"] = statistics.median(predicted)
        row["realized"] = statistics.median(realized)
        row["error"] = abs(row["predicted"] - row["realized"]) / row["realized"]
        for key in ("each_ms", "write_ms", "write_cpu_ms", "prepare_ms", "copy_ms", "save_mb", "count"):
            row[key] = statistics.median(ev[key] for ev in splits)
    return row


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=3, help="interleaved blocking/asynchronous pairs")
    parser.add_argument("--every", type=int, default=20, help="steps between saves, in both runs")
    parser.add_argument("--only", nargs="*", choices=SCENARIOS, help="scenario names (default: all)")
    args = parser.parse_args()
    if args.repeats < 1 or args.every < 1:
        parser.error("--repeats and --every must be >= 1")
    rows = []
    with tempfile.TemporaryDirectory() as tmp, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for name in args.only or SCENARIOS:
            print(f"running {name} ...", file=sys.stderr, flush=True)
            rows.append(measure(name, args.every, args.repeats, tmp))
    print("| scenario | saves | each ms | write ms (CPU) | building ms | copy ms (MB) | predicted | realized | error |")
    print("|---|---|---|---|---|---|---|---|---|")
    failed = False
    for r in rows:
        if "predicted" not in r:
            print(f"| {r['scenario']} | - | - | - | - | - | - | - | split not measured |")
            failed = True
            continue
        failed = failed or r["error"] > TARGET
        print(
            f"| {r['scenario']} | {r['count']:.0f} | {r['each_ms']:.1f} | {r['write_ms']:.1f} ({r['write_cpu_ms']:.1f})"
            f" | {r['prepare_ms']:.1f} | {r['copy_ms']:.1f} ({r['save_mb']:.1f}) | x{r['predicted']:.2f}"
            f" | x{r['realized']:.2f} | {r['error']:.0%} |"
        )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
