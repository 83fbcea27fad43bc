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

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent), str(HERE.parents[1])]  # step_calls, overhead, the package

from overhead import lightning_fit  # noqa: E402
from step_calls import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main(lightning_fit, __doc__ or "", "steps"))
