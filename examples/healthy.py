"""A healthy, compute-bound loop: data is in memory, logging is rare. No data, checkpoint,
logging or validation finding should be worth 5% or more.

    python examples/healthy.py
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import SyntheticDataset, Trainer, cli, emulate_accelerator, loader  # noqa: E402

from stallscope import Report, StallScope  # noqa: E402

NAME = "healthy"
EXPECTED = None
SMALL = {"epochs": 1, "batches": 30}


def run(
    *,
    report_dir: str = f"runs/{NAME}",
    console: Any = True,
    epochs: int = 2,
    batches: int = 60,
    batch_size: int = 64,
    log_every_n_steps: int = 50,
    batch_sampler: bool = False,
) -> Report | None:
    emulate_accelerator()
    data = loader(SyntheticDataset(batches * batch_size), batch_size=batch_size, batch_sampler=batch_sampler)
    trainer = Trainer(hidden=512)
    history: list[float] = []
    step = 0
    with StallScope(report_dir, console=console) as scope:
        for _ in range(epochs):
            for batch in scope.iter(data):
                with scope.phase("compute"):
                    loss = trainer.step(batch, repeat=4)
                step += 1
                if step % log_every_n_steps == 0:
                    with scope.phase("logging"):
                        history.append(loss.item())
    return scope.report


if __name__ == "__main__":
    cli(run, __doc__ or NAME, NAME)
