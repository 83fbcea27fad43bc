"""Planted bottleneck: short epochs whose workers start slowly and are re-spawned every epoch.

Each worker opens its shard index when it starts (``worker_init_fn``, ~0.3 s); without
``persistent_workers`` that happens again at every epoch. Expected top finding:
``data.persistent_workers``.

    python examples/respawned_workers.py
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import SyntheticDataset, Trainer, cli, emulate_accelerator, loader  # noqa: E402

from stallscope import Report, StallScope  # noqa: E402

NAME = "respawned_workers"
EXPECTED = "data.persistent_workers"
SMALL = {"epochs": 3, "batches": 16}

#: seconds each worker spends opening its shard index at start-up
WORKER_START_S = 0.3


def open_shard_index(worker_id: int) -> None:
    time.sleep(WORKER_START_S)


def run(
    *,
    report_dir: str = f"runs/{NAME}",
    console: Any = True,
    epochs: int = 4,
    batches: int = 30,
    num_workers: int = 2,
    persistent_workers: bool = False,
    batch_size: int = 16,
    **loader_kwargs: Any,
) -> Report | None:
    emulate_accelerator()
    data = loader(
        SyntheticDataset(batches * batch_size, cpu_ms=0.05),
        batch_size=batch_size,
        num_workers=num_workers,
        persistent_workers=persistent_workers,
        worker_init_fn=open_shard_index,
        **loader_kwargs,
    )
    trainer = Trainer()
    with StallScope(report_dir, console=console) as scope:
        for _ in range(epochs):
            for batch in scope.iter(data):
                with scope.phase("compute"):
                    trainer.step(batch, repeat=8)
    return scope.report


if __name__ == "__main__":
    cli(run, __doc__ or NAME, NAME)
