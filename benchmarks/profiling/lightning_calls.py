"""What StallScope adds to each step of a Lightning fit, counted in function calls.

Whole-run ratios (``overhead.py``) move by several percent on a shared VM. Call counts do not:
this script profiles a tiny fit (loop (c) of ``overhead.py``) bare and watched with cProfile,
and prints the calls a watched step adds, per function, with the total and the Python-level
part (each Python-level call costs about half a microsecond between two training steps here;
a C function a fraction of that). Lightning's own calls made on StallScope's behalf (the
dispatch of a callback hook, with its profiler context) count too. cProfile sees Python functions
and built-in functions only: the C ``StepHook``s Lightning calls at each step are not counted.

    .venv/bin/python benchmarks/profiling/lightning_calls.py [--steps 1000]
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import torch  # noqa: E402
from overhead import hot_path, lightning_fit  # noqa: E402


def calls(mode: str, steps: int, report_dir: str) -> dict[str, int]:
    """Calls per function (``file:line(name)``) during one fit of ``steps`` steps."""
    lightning_fit(mode, 20, report_dir)  # imports and first-use costs
    profile = cProfile.Profile()
    profile.enable()
    lightning_fit(mode, steps, report_dir)
    profile.disable()
    stats = pstats.Stats(profile).stats  # type: ignore[attr-defined]
    out: dict[str, int] = {}
    for (path, line, name), (_, ncalls, *_rest) in stats.items():
        where = path.split("site-packages/")[-1].replace(str(ROOT) + "/", "")
        out[f"{where}:{line}({name})"] = ncalls
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=1000, help="steps of the profiled fits")
    args = parser.parse_args()
    if args.steps < 100:
        parser.error("--steps must be >= 100")
    torch.set_num_threads(1)
    tmp = tempfile.mkdtemp(prefix="stallscope-calls-")
    bare, watched = calls("bare", args.steps, tmp), calls("watched", args.steps, tmp)
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
    print(f"total: {total:.1f} calls a step, {python:.1f} of them to Python functions")
    return 0


if __name__ == "__main__":
    sys.exit(main())
