"""Does ``stallscope tune`` find settings as good as a brute-force sweep, in less time?

For each planted scenario in ``examples/`` (its script run as the user would, ``python
examples/<name>.py --quiet``), this

1. runs ``tune`` on it (the library behind ``stallscope tune``, same trials);
2. sweeps the same knobs by brute force: every combination (``num_workers`` 0..2x cores,
   ``pin_memory``, ``prefetch_factor`` 2/4/8, or the checkpoint interval 5/10/20/50/100 and
   ``async_save``), each measured with the same trials as tune's (same steps and warm-up: 40
   measured steps, or ``SCENARIO_STEPS`` where 40 cannot tell the knobs apart), in
   ``--passes`` interleaved passes (3: as many as tune's rounds; a sweep of single runs on a
   busy host picks noise), best = highest median;
3. runs tune's final settings against the sweep's best, interleaved (``--pairs`` pairs, 5: on
   this 2-core VM three pairs of the same settings read from 87% to 113%), for the throughput
   ratio (the median of the pairs, with its 90% interval).

A row holds when tune's settings reach at least 90% of the sweep's best throughput (the median
of the pairs) in less than a third of the sweep's wall time. The load (``/proc/loadavg``) before
and after each scenario is printed beside its numbers: other processes disturb both sides alike.

    .venv/bin/python benchmarks/tune_check.py [--only NAME ...] [--steps N] [--markdown FILE]
"""

from __future__ import annotations

import argparse
import itertools
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from stallscope.tune.plan import TrialPlan  # noqa: E402
from stallscope.tune.runner import run_trial  # noqa: E402
from stallscope.tune.search import TuneOptions, Tuner, TuneResult  # noqa: E402
from stallscope.tune.stats import Speedup, paired_speedup  # noqa: E402

CORES = os.cpu_count() or 1
#: the loader knobs of the issue's sweep
LOADER_KNOBS: dict[str, list[Any]] = {
    "num_workers": list(range(2 * CORES + 1)),
    "pin_memory": [False, True],
    "prefetch_factor": [2, 4, 8],
}
SCENARIOS: dict[str, dict[str, list[Any]] | None] = {
    "starved_loader": LOADER_KNOBS,
    "slow_reads": LOADER_KNOBS,
    "in_memory_two_workers": LOADER_KNOBS,
    # the two knobs a Lightning trial applies for ``checkpoint.frequency``: the interval and
    # ``async_save`` (the checkpoint IO in ``AsyncCheckpointIO``)
    "lightning_frequent_checkpoint": {"every_n_train_steps": [5, 10, 20, 50, 100], "async_save": [False, True]},
    # its fix (a logger call in the user's loop) is applied by hand: tune lists it, nothing to sweep
    "chatty_logging": None,
}
#: measured steps per trial by scenario, where the default is too few to tell its knobs apart:
#: the checkpoint intervals swept (up to 100 steps, tune's up to the run's 120) save nothing in
#: 40 steps, so 40-step trials compare every interval above 45 as the same run; 110 of the
#: run's 120 steps (5 of warm-up before them) hold a save at 50 and at 100
SCENARIO_STEPS = {"lightning_frequent_checkpoint": 110}
#: measured steps per trial elsewhere
DEFAULT_STEPS = 40
TARGET_THROUGHPUT = 0.90
TARGET_TIME = 1 / 3
#: a trial's timeout (seconds)
TIMEOUT_S = 180.0


def grid(knobs: dict[str, list[Any]]) -> Iterator[dict[str, Any]]:
    """Every combination; with no workers, one config (prefetch_factor means nothing there)."""
    names = list(knobs)
    seen: set[str] = set()
    for values in itertools.product(*(knobs[n] for n in names)):
        config = dict(zip(names, values, strict=True))
        if config.get("num_workers") == 0:
            config.pop("prefetch_factor", None)
        key = repr(sorted(config.items()))
        if key not in seen:
            seen.add(key)
            yield config


class Trials:
    """Numbered trials of one command under one scratch folder."""

    def __init__(self, command: list[str], scratch: Path, steps: int, warmup: int) -> None:
        self.command, self.scratch, self.steps, self.warmup = command, scratch, steps, warmup
        self.count = 0

    def rate(self, settings: dict[str, Any]) -> tuple[float | None, float]:
        """Steps per second of one trial with ``settings`` (None when it failed), and its wall time."""
        self.count += 1
        plan = TrialPlan(self.count, self.scratch / f"t{self.count}", settings, self.warmup, self.steps, None)
        out = run_trial(self.command, plan, timeout_s=TIMEOUT_S)
        return (out.steps_per_s if out.status in ("ok", "short") else None), out.wall_s


def sweep(trials: Trials, configs: list[dict[str, Any]], passes: int) -> tuple[dict[str, Any], float, float]:
    """The config with the highest median throughput over ``passes`` passes, that median, and
    the sweep's wall time."""
    rates: list[list[float]] = [[] for _ in configs]
    started = time.monotonic()
    for _ in range(passes):
        for i, config in enumerate(configs):
            rate, _ = trials.rate(config)
            if rate is not None:
                rates[i].append(rate)
    wall = time.monotonic() - started
    medians = [statistics.median(r) if r else 0.0 for r in rates]
    best = max(range(len(configs)), key=lambda i: medians[i])
    return configs[best], medians[best], wall


def head_to_head(trials: Trials, a: dict[str, Any], b: dict[str, Any], pairs: int) -> Speedup | None:
    """``b``'s throughput over ``a``'s over interleaved pairs (median and 90% interval); None
    when no pair measured both."""
    measured = []
    for i in range(pairs):
        order = [a, b] if i % 2 == 0 else [b, a]
        got = {id(c): trials.rate(c)[0] for c in order}
        ra, rb = got[id(a)], got[id(b)]
        if ra and rb:
            measured.append((ra, rb))
    return paired_speedup(measured) if measured else None


def load() -> str:
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "?"


def check(name: str, knobs: dict[str, list[Any]] | None, args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    command = [sys.executable, str(ROOT / "examples" / f"{name}.py"), "--quiet"]
    row: dict[str, Any] = {"scenario": name, "load_before": load()}
    steps = args.steps or SCENARIO_STEPS.get(name, DEFAULT_STEPS)
    row["steps"] = steps
    options = TuneOptions(
        budget_s=args.budget, steps=steps, seconds=None, warmup_steps=args.warmup, scratch=tmp / name / "tune"
    )
    started = time.monotonic()
    result: TuneResult = Tuner(command, options).run()
    row["tune_wall_s"] = time.monotonic() - started
    row["tune_trials"] = len(result.trials)
    for c in result.candidates:  # the path tune took (its table, on stderr)
        realized = f"x{c.realized.median:.2f} [{c.realized.low:.2f}-{c.realized.high:.2f}]" if c.realized else "-"
        predicted = f"x{c.predicted:.2f}" if c.predicted is not None else "-"
        print(
            f"  {c.label}{' (neighbour)' if c.neighbour else ''}: predicted {predicted}, realized {realized}, "
            f"{len(c.pairs)} pairs, {'kept' if c.kept else c.verdict}{': ' + c.note if c.note else ''}",
            file=sys.stderr,
            flush=True,
        )
    row["tune_settings"] = result.best
    row["by_hand"] = [b.finding for b in result.by_hand]
    if knobs is None:
        row["load_after"] = load()
        return row
    trials = Trials(command, tmp / name / "sweep", steps, args.warmup)
    configs = list(grid(knobs))
    best, best_rate, wall = sweep(trials, configs, args.passes)
    row.update(sweep_configs=len(configs), sweep_trials=trials.count, sweep_wall_s=wall, sweep_best=best)
    row["sweep_best_rate"] = best_rate
    versus = Trials(command, tmp / name / "versus", steps, args.warmup)
    head = head_to_head(versus, best, dict(result.best), args.pairs)
    row["throughput"] = head.median if head else 0.0
    row["throughput_interval"] = (head.low, head.high) if head else None
    row["time"] = row["tune_wall_s"] / wall
    row["holds"] = row["throughput"] >= TARGET_THROUGHPUT and row["time"] < TARGET_TIME
    row["load_after"] = load()
    return row


def _settings(s: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v!r}" for k, v in s.items()) or "as configured"


def markdown(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| scenario | tune: settings (trials, wall) | sweep: best (configs x passes, wall) "
        "| tune / sweep best throughput | tune / sweep wall | holds | load before / after |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        tune = f"{_settings(r['tune_settings'])} ({r['tune_trials']}, {r['tune_wall_s']:.0f} s)"
        if r["by_hand"]:
            tune += f"; by hand: {', '.join(r['by_hand'])}"
        if "sweep_best" in r:
            passes = r["sweep_trials"] // max(1, r["sweep_configs"])
            sweep = f"{_settings(r['sweep_best'])} ({r['sweep_configs']} x {passes}, {r['sweep_wall_s']:.0f} s)"
            low_high = r.get("throughput_interval")
            spread = f" [{low_high[0]:.0%}-{low_high[1]:.0%}]" if low_high else ""
            cells = [sweep, f"{r['throughput']:.0%}{spread}", f"{r['time']:.2f}", "yes" if r["holds"] else "no"]
        else:
            cells = ["nothing tune can apply in place", "-", "-", "-"]
        load = f"{r['load_before']} / {r['load_after']}"
        lines.append(f"| {r['scenario']} ({r['steps']} steps) | {tune} | " + " | ".join(cells) + f" | {load} |")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", nargs="*", help="scenario names (default: all)")
    parser.add_argument(
        "--steps",
        type=int,
        default=None,
        help=f"measured steps per trial (default {DEFAULT_STEPS}; {SCENARIO_STEPS} where set)",
    )
    parser.add_argument("--warmup", type=int, default=5, help="warm-up steps per trial (default 5)")
    parser.add_argument("--passes", type=int, default=3, help="sweep passes (default 3)")
    parser.add_argument("--pairs", type=int, default=5, help="tune-vs-sweep pairs (default 5)")
    parser.add_argument("--budget", type=float, default=600.0, help="tune's budget, seconds (default 600)")
    parser.add_argument("--markdown", type=Path, help="also write the table to this file")
    args = parser.parse_args()
    names = args.only or list(SCENARIOS)
    unknown = sorted(set(names) - set(SCENARIOS))
    if unknown:
        parser.error(f"unknown scenario(s): {', '.join(unknown)}; known: {', '.join(SCENARIOS)}")
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in names:
            print(f"running {name} ...", file=sys.stderr, flush=True)
            rows.append(check(name, SCENARIOS[name], args, Path(tmp)))
            print(markdown(rows[-1:]).splitlines()[-1], file=sys.stderr, flush=True)
    table = markdown(rows)
    print(table)
    if args.markdown:
        args.markdown.write_text(table + "\n", encoding="utf-8")
    return 0 if all(r.get("holds", True) for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
