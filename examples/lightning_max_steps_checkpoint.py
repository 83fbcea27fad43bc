"""Planted bottleneck (Lightning): a fit cut short by ``max_steps`` that saves a checkpoint every 5 steps.

The interval the target share needs is longer than the fit: the advice must still save once
(``every_n_train_steps`` at most ``max_steps``) and, since that save is still a large share, save
asynchronously (``AsyncCheckpointIO``). Expected top finding: ``checkpoint.frequency``.

    python examples/lightning_max_steps_checkpoint.py
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import lightning_frequent_checkpoint  # noqa: E402
from common import cli  # noqa: E402

from stallscope import Report  # noqa: E402

NAME = "lightning_max_steps_checkpoint"
EXPECTED = "checkpoint.frequency"
SMALL = {"epochs": 2, "batches": 40, "max_steps": 50}


def run(
    *,
    report_dir: str = f"runs/{NAME}",
    console: Any = True,
    namespace: str = "lightning",
    epochs: int = 3,
    batches: int = 60,
    max_steps: int = 100,
    every_n_train_steps: int = 5,
    async_save: bool = False,
    state_mb: float = 8.0,
) -> Report | None:
    return lightning_frequent_checkpoint.run(
        report_dir=report_dir,
        console=console,
        namespace=namespace,
        epochs=epochs,
        batches=batches,
        max_steps=max_steps,
        every_n_train_steps=every_n_train_steps,
        async_save=async_save,
        state_mb=state_mb,
    )


if __name__ == "__main__":
    cli(run, __doc__ or NAME, NAME)
