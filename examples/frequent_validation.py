"""Planted bottleneck: a full pass over a large validation set every few training batches.

Expected top finding: ``validation.frequency``, suggesting a larger ``val_check_interval``
(in batches, as Lightning means it for an int).

    python examples/frequent_validation.py
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402
from common import SyntheticDataset, Trainer, cli, emulate_accelerator, loader  # noqa: E402

from stallscope import Report, StallScope  # noqa: E402

NAME = "frequent_validation"
EXPECTED = "validation.frequency"
SMALL = {"epochs": 1, "batches": 40}


def run(
    *,
    report_dir: str = f"runs/{NAME}",
    console: Any = True,
    epochs: int = 2,
    batches: int = 80,
    val_check_interval: int | float = 5,
    check_val_every_n_epoch: int = 1,
    at_end: bool = False,
    limit_val_batches: int | float = 1.0,
    val_batches: int = 20,
    batch_size: int = 16,
) -> Report | None:
    """The suggestion's keys: ``at_end`` also validates after the last epoch; ``limit_val_batches``
    validates on the first part of the validation set (a fraction, or a number of batches)."""
    emulate_accelerator()
    train = loader(SyntheticDataset(batches * batch_size), batch_size=batch_size)
    val = loader(SyntheticDataset(val_batches * 64, seed=1), batch_size=64)
    # Lightning's meaning: a float is a fraction of the epoch, an int a number of batches
    every = max(1, round(val_check_interval * batches)) if isinstance(val_check_interval, float) else val_check_interval
    if check_val_every_n_epoch > 1:
        every = batches  # once, at the end of every n-th epoch (and of the last, ``at_end``)
    limit = limit_val_batches if isinstance(limit_val_batches, int) else max(1, int(val_batches * limit_val_batches))
    trainer = Trainer()
    with StallScope(report_dir, console=console) as scope:
        for epoch in range(epochs):
            validate_this_epoch = (epoch + 1) % check_val_every_n_epoch == 0 or (at_end and epoch + 1 == epochs)
            for i, batch in enumerate(scope.iter(train), start=1):
                with scope.phase("compute"):
                    trainer.step(batch, repeat=4)
                if validate_this_epoch and i % every == 0:
                    with scope.phase("validation"), torch.no_grad():
                        for _, (x, y) in zip(range(limit), val, strict=False):
                            trainer.loss_fn(trainer.model(x), y)
    return scope.report


if __name__ == "__main__":
    cli(run, __doc__ or NAME, NAME)
