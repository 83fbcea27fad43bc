"""Planted bottleneck (Lightning): a pass over a large validation set every few training batches.

``Trainer(val_check_interval=5)`` runs the whole validation loop every 5 training batches.
Expected top finding: ``validation.frequency``, naming a larger ``val_check_interval`` (or
``check_val_every_n_epoch`` when even once per epoch is too often).

    python examples/lightning_frequent_validation.py
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import SyntheticDataset, cli, emulate_accelerator, loader  # noqa: E402
from lightning_common import fit, module_class  # noqa: E402

from stallscope import Report  # noqa: E402

NAME = "lightning_frequent_validation"
EXPECTED = "validation.frequency"
SMALL = {"epochs": 1, "batches": 40}


def run(
    *,
    report_dir: str = f"runs/{NAME}",
    console: Any = True,
    namespace: str = "lightning",
    epochs: int = 2,
    batches: int = 80,
    val_check_interval: int | float = 5,
    check_val_every_n_epoch: int = 1,
    limit_val_batches: int | float = 1.0,
    max_steps: int = -1,
    max_time: dict[str, float] | None = None,
    val_batches: int = 20,
    batch_size: int = 16,
) -> Report | None:
    emulate_accelerator()
    train = loader(SyntheticDataset(batches * batch_size), batch_size=batch_size)
    val = loader(SyntheticDataset(val_batches * 64, seed=1), batch_size=64)
    model = module_class(namespace)(repeat=4)
    return fit(
        namespace,
        report_dir=report_dir,
        console=console,
        model=model,
        train=train,
        val=val,
        epochs=epochs,
        val_check_interval=val_check_interval,
        check_val_every_n_epoch=check_val_every_n_epoch,
        limit_val_batches=limit_val_batches,
        max_steps=max_steps,
        max_time=max_time,
    )


if __name__ == "__main__":
    cli(run, __doc__ or NAME, NAME)
