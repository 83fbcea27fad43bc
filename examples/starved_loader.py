"""Planted bottleneck: CPU-heavy preprocessing in the training process (``num_workers=0``).

Every sample costs ~0.6 ms of CPU in ``__getitem__``; with no workers the model waits for each
batch to be built. Expected top finding: ``data.workers``.

    python examples/starved_loader.py
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import SyntheticDataset, Trainer, cli, emulate_accelerator, loader  # noqa: E402

from stallscope import Report, StallScope  # noqa: E402

NAME = "starved_loader"
EXPECTED = "data.workers"
#: quick settings for tests
SMALL = {"epochs": 1, "batches": 24}


def run(
    *,
    report_dir: str = f"runs/{NAME}",
    console: Any = True,
    epochs: int = 2,
    batches: int = 100,
    num_workers: int = 0,
    batch_size: int = 16,
    cpu_ms_per_sample: float = 0.6,
    **loader_kwargs: Any,
) -> Report | None:
    emulate_accelerator()
    dataset = SyntheticDataset(batches * batch_size, cpu_ms=cpu_ms_per_sample)
    data = loader(dataset, batch_size=batch_size, num_workers=num_workers, **loader_kwargs)
    trainer = Trainer()
    with StallScope(report_dir, console=console) as scope:
        for _ in range(epochs):
            for batch in scope.iter(data):
                with scope.phase("compute"):
                    trainer.step(batch, repeat=4)
    return scope.report


if __name__ == "__main__":
    cli(run, __doc__ or NAME, NAME)
