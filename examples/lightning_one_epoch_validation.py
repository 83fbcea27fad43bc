"""Planted bottleneck (Lightning): a one-epoch fit that validates a large set every 10 batches.

Any interval longer than the epoch would never validate in this fit: the advice must keep one
validation (``val_check_interval=1.0``) and, since that one run is still a large share, validate
on part of the set (``limit_val_batches``). Expected top finding: ``validation.frequency``.

    python examples/lightning_one_epoch_validation.py
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import lightning_frequent_validation  # noqa: E402
from common import cli  # noqa: E402

from stallscope import Report  # noqa: E402

NAME = "lightning_one_epoch_validation"
EXPECTED = "validation.frequency"
SMALL = {"epochs": 1, "batches": 60}


def run(
    *,
    report_dir: str = f"runs/{NAME}",
    console: Any = True,
    namespace: str = "lightning",
    epochs: int = 1,
    batches: int = 120,
    val_check_interval: int | float = 10,
    check_val_every_n_epoch: int = 1,
    limit_val_batches: int | float = 1.0,
    val_batches: int = 40,
) -> Report | None:
    return lightning_frequent_validation.run(
        report_dir=report_dir,
        console=console,
        namespace=namespace,
        epochs=epochs,
        batches=batches,
        val_check_interval=val_check_interval,
        check_val_every_n_epoch=check_val_every_n_epoch,
        limit_val_batches=limit_val_batches,
        val_batches=val_batches,
    )


if __name__ == "__main__":
    cli(run, __doc__ or NAME, NAME)
