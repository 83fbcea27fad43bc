"""Planted bottleneck: a full pass over a large validation set every few training batches.

Expected top finding: ``validation.frequency``, suggesting to validate less often in the plain
loop's own keys (``every_n_steps``, or ``every_n_epochs`` and ``at_end``).

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
    every_n_steps: int | None = None,
    every_n_epochs: int | None = None,
    at_end: bool = False,
    val_fraction: float = 1.0,
    val_batches: int = 20,
    batch_size: int = 16,
) -> Report | None:
    """The suggestion's keys (a plain loop's, SPEC §3): validate at every ``every_n_steps``-th step
    of the run, or after every ``every_n_epochs``-th epoch; ``at_end`` also after the last step;
    ``val_fraction``: on that first part of the validation set. Neither interval given: the
    planted one, every 5 steps."""
    if every_n_steps is None and every_n_epochs is None:
        every_n_steps = 5
    emulate_accelerator()
    train = loader(SyntheticDataset(batches * batch_size), batch_size=batch_size)
    val = loader(SyntheticDataset(val_batches * 64, seed=1), batch_size=64)
    limit = max(1, int(val_batches * val_fraction))
    trainer = Trainer()

    def validate() -> None:
        with scope.phase("validation"), torch.no_grad():
            for _, (x, y) in zip(range(limit), val, strict=False):
                trainer.loss_fn(trainer.model(x), y)

    step = 0
    with StallScope(report_dir, console=console) as scope:
        for epoch in range(epochs):
            for i, batch in enumerate(scope.iter(train), start=1):
                step += 1
                with scope.phase("compute"):
                    trainer.step(batch, repeat=4)
                by_steps = every_n_steps is not None and step % every_n_steps == 0
                by_epochs = every_n_epochs is not None and i == batches and (epoch + 1) % every_n_epochs == 0
                last = at_end and epoch + 1 == epochs and i == batches
                if by_steps or by_epochs or last:
                    validate()
    return scope.report


if __name__ == "__main__":
    cli(run, __doc__ or NAME, NAME)
