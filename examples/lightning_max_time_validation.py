"""Planted bottleneck (Lightning): a fit bounded by ``max_time`` that validates every few batches.

``Trainer(max_time=...)`` stops the fit at whatever step its clock says, with ``max_epochs``
unbounded. Validating once per epoch or every few epochs would then never validate: the advice
must validate within the steps the time allows (SPEC §3). Expected top finding:
``validation.frequency``. The fit's length is its time, so ``benchmarks/whatif.py`` compares
throughput (steps per second) before and after (``FIXED_TIME``).

    python examples/lightning_max_time_validation.py
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import lightning_frequent_validation  # noqa: E402
from common import cli  # noqa: E402

from stallscope import Report  # noqa: E402

NAME = "lightning_max_time_validation"
EXPECTED = "validation.frequency"
SMALL = {"max_time_s": 2.0, "batches": 40}
#: the run lasts a set time: predictions are of steps per second
FIXED_TIME = True


def run(
    *,
    report_dir: str = f"runs/{NAME}",
    console: Any = True,
    namespace: str = "lightning",
    max_time_s: float = 6.0,
    batches: int = 60,
    val_check_interval: int | float = 2,
    check_val_every_n_epoch: int = 1,
    limit_val_batches: int | float = 1.0,
    val_batches: int = 40,
) -> Report | None:
    return lightning_frequent_validation.run(
        report_dir=report_dir,
        console=console,
        namespace=namespace,
        epochs=-1,
        batches=batches,
        val_check_interval=val_check_interval,
        check_val_every_n_epoch=check_val_every_n_epoch,
        limit_val_batches=limit_val_batches,
        val_batches=val_batches,
        max_time={"seconds": max_time_s},
    )


if __name__ == "__main__":
    cli(run, __doc__ or NAME, NAME)
