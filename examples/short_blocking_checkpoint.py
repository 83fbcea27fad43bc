"""Planted bottleneck: a short plain loop that saves a large checkpoint every 10 steps.

The interval the target share needs is longer than the whole run: the advice saves every ``K``
steps and once at the end, so a run this long still saves once. Expected top finding:
``checkpoint.frequency``.

    python examples/short_blocking_checkpoint.py
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import blocking_checkpoint  # noqa: E402
from common import cli  # noqa: E402

from stallscope import Report  # noqa: E402

NAME = "short_blocking_checkpoint"
EXPECTED = "checkpoint.frequency"
SMALL = {"epochs": 1, "batches": 100}


def run(
    *,
    report_dir: str = f"runs/{NAME}",
    console: Any = True,
    epochs: int = 1,
    batches: int = 200,
    every_n_steps: int = 10,
    at_end: bool = False,
    async_save: bool = False,
    state_mb: float = 32.0,
) -> Report | None:
    return blocking_checkpoint.run(
        report_dir=report_dir,
        console=console,
        epochs=epochs,
        batches=batches,
        every_n_steps=every_n_steps,
        at_end=at_end,
        async_save=async_save,
        state_mb=state_mb,
    )


if __name__ == "__main__":
    cli(run, __doc__ or NAME, NAME)
