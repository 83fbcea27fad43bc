"""The count that ``lightning_calls.py`` and ``transformers_calls.py`` make, for a fit of either
(``overhead.py``'s ``lightning_fit`` or ``transformers_fit``): cProfile over a bare and a watched
fit, and the calls a watched step adds, per function, with the total and the Python-level part."""

from __future__ import annotations

import argparse
import cProfile
import pstats
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import torch  # noqa: E402
from overhead import hot_path  # noqa: E402

#: a fit: ``fit(mode, steps, report_dir)`` with ``mode`` "bare" or "watched"
Fit = Callable[[str, int, str], object]


def calls(fit: Fit, mode: str, steps: int, report_dir: str) -> dict[str, int]:
    """Calls per function (``file:line(name)``) during one fit of ``steps`` steps."""
    fit(mode, 20, report_dir)  # imports and first-use costs
    profile = cProfile.Profile()
    profile.enable()
    fit(mode, steps, report_dir)
    profile.disable()
    stats = pstats.Stats(profile).stats  # type: ignore[attr-defined]
    out: dict[str, int] = {}
    for (path, line, name), (_, ncalls, *_rest) in stats.items():
        where = path.split("site-packages/")[-1].replace(str(ROOT) + "/", "")
        out[f"{where}:{line}({name})"] = ncalls
    return out


def main(fit: Fit, doc: str, steps_are: str = "steps") -> int:
    """Count and print; ``doc`` is the calling script's, ``steps_are`` what its steps are."""
    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=1000, help=f"{steps_are} of the profiled fits")
    args = parser.parse_args()
    if args.steps < 100:
        parser.error("--steps must be >= 100")
    torch.set_num_threads(1)
    tmp = tempfile.mkdtemp(prefix="stallscope-calls-")
    bare, watched = calls(fit, "bare", args.steps, tmp), calls(fit, "watched", args.steps, tmp)
    rows = []
    for key in set(bare) | set(watched):
        per_step = (watched.get(key, 0) - bare.get(key, 0)) / args.steps
        if abs(per_step) >= 0.9:  # per step, not per epoch or per run
            rows.append((per_step, key))
    rows.sort(reverse=True)
    print(f"hot path: {hot_path()}")
    print(f"calls a watched step adds to a bare one ({args.steps} steps):")
    for per_step, key in rows:
        print(f"  {per_step:5.1f}  {key}")
    total = sum(per_step for per_step, _ in rows)
    python = sum(per_step for per_step, key in rows if not key.startswith("~"))  # "~": built-in functions
    bare_total = sum(bare.values()) / args.steps
    print(f"total: {total:.1f} calls a step, {python:.1f} of them to Python functions (a bare step: {bare_total:.0f})")
    return 0
