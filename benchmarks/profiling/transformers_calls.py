"""What StallScope adds to each step of a transformers ``Trainer.train()``, counted in calls.

The same count as ``lightning_calls.py``, for loop (f) of ``overhead.py`` (a one-layer model, a
tiny ``Trainer`` fit): cProfile over a bare and a watched fit, and the calls a watched step adds,
per function, with the total and the Python-level part. The Trainer's own calls made on
StallScope's behalf (``CallbackHandler.call_event`` calling one more callback for each event)
count too.

    .venv/bin/python benchmarks/profiling/transformers_calls.py [--steps 1000]
"""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent), str(HERE.parents[1])]  # step_calls, overhead, the package

from overhead import transformers_fit  # noqa: E402
from step_calls import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main(transformers_fit, __doc__ or "", "optimizer steps"))
