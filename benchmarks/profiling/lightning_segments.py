"""Where a watched Lightning fit (``overhead.py``'s loop (c)) spends its extra time: before the
first step, in steady steps, and after the last step.

``overhead.py`` gives one ratio per fit. This script splits each fit at timestamps the module's
own ``training_step`` takes (it runs in every configuration alike) and reports, per segment, the
median difference to the bare fit over interleaved rounds:

  start      ``trainer.fit`` called -> the first training step (set-up, sanity, first fetch)
  early      steps 0 -> 500
  steady     steps 500 -> 2500 (also shown per step)
  late       steps 2500 -> the last
  end        the last step -> ``trainer.fit`` returned (epoch-end diagnosis, report writes)

Configurations: ``bare`` (no callback), ``watched`` (StallScope), ``empty`` (a ``pl.Callback()``
that overrides nothing), and with ``--ablate`` two diagnostic ones: ``noprobes`` (StallScope with
its fetch and compute probes not installed: it records no steps) and ``nosampler`` (StallScope
whose host sampler never samples during the fit). An ablation that runs faster than ``bare``
measures the host's noise, not StallScope.

    .venv/bin/python benchmarks/profiling/lightning_segments.py [--rounds 8] [--ablate]
"""

from __future__ import annotations

import argparse
import gc
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from stallscope import StallScope  # noqa: E402
from stallscope.hooks import lightning as hooks  # noqa: E402

sys.path.insert(0, str(ROOT / "benchmarks"))
from overhead import LIGHTNING_STEPS, lightning_parts, null_console  # noqa: E402

#: training steps whose start is timestamped
MARKS = (0, 500, 2500, LIGHTNING_STEPS - 1)
SEGMENTS = ("start", "early", "steady", "late", "end")
_PROBES = (hooks.attach_fetch_probe, hooks.attach_step_probe)


def _no_probe(*args: object, **kwargs: object) -> Callable[[], None]:
    return lambda: None


def fit(mode: str, report_dir: str) -> list[float]:
    """One fit of loop (c) in configuration ``mode``; its segments in ms."""
    import lightning.pytorch as pl

    marks: dict[int, int] = {}

    def mark(batch_idx: int) -> None:
        if batch_idx in MARKS:
            marks[batch_idx] = time.perf_counter_ns()

    hooks.attach_fetch_probe, hooks.attach_step_probe = _PROBES
    if mode == "noprobes":
        hooks.attach_fetch_probe = hooks.attach_step_probe = _no_probe
    callbacks: list[Any] = []
    if mode in ("watched", "noprobes"):
        callbacks = [StallScope(report_dir, console=null_console())]
    elif mode == "nosampler":
        callbacks = [StallScope(report_dir, console=null_console(), sample_interval_s=3600)]
    elif mode == "empty":
        callbacks = [pl.Callback()]
    trainer, model, data = lightning_parts(LIGHTNING_STEPS, callbacks, on_step=mark)
    try:
        t0 = time.perf_counter_ns()
        trainer.fit(model, data)
        t1 = time.perf_counter_ns()
    finally:
        hooks.attach_fetch_probe, hooks.attach_step_probe = _PROBES
    points = [t0, *(marks[i] for i in MARKS), t1]
    return [(b - a) / 1e6 for a, b in zip(points, points[1:], strict=False)]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=8, help="interleaved fits of each configuration")
    parser.add_argument("--ablate", action="store_true", help="add the noprobes and nosampler configurations")
    args = parser.parse_args()
    if args.rounds < 1:
        parser.error("--rounds must be >= 1")
    torch.set_num_threads(1)
    modes = ["bare", "watched", "empty"] + (["noprobes", "nosampler"] if args.ablate else [])
    tmp = tempfile.mkdtemp(prefix="stallscope-segments-")
    for mode in modes:
        fit(mode, tmp)  # warm-up: imports and first-use costs
    runs: dict[str, list[list[float]]] = {mode: [] for mode in modes}
    rng = random.Random(0)
    for i in range(args.rounds):
        print(f"round {i + 1}/{args.rounds} ...", file=sys.stderr, flush=True)
        for mode in rng.sample(modes, len(modes)):
            gc.collect()
            runs[mode].append(fit(mode, tmp))
    steady_steps = MARKS[2] - MARKS[1]
    print(f"{LIGHTNING_STEPS} steps a fit, {args.rounds} rounds; medians, ms over bare (steady: us a step)")
    print("| segment | bare ms | " + " | ".join(modes[1:]) + " |")
    print("|---|---|" + "---|" * (len(modes) - 1))
    for k, name in enumerate(SEGMENTS):
        base = statistics.median(run[k] for run in runs["bare"])
        cells = []
        for mode in modes[1:]:
            extra = statistics.median(run[k] for run in runs[mode]) - base
            cells.append(
                f"{extra:+.1f} ({extra * 1e3 / steady_steps:+.1f} us)" if name == "steady" else f"{extra:+.1f}"
            )
        print(f"| {name} | {base:.1f} | " + " | ".join(cells) + " |")
    total = statistics.median(sum(run) for run in runs["bare"])
    ratios = [f"{statistics.median(sum(run) for run in runs[mode]) / total:.3f}" for mode in modes[1:]]
    print("| whole fit / bare | - | " + " | ".join(ratios) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
