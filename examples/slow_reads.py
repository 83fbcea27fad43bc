"""Planted bottleneck: every sample is read from slow storage (latency, not CPU), ``num_workers=0``.

Each ``__getitem__`` waits ~0.5 ms as a network file system or object store would; the CPU is
idle meanwhile, so more workers than cores help. Expected top finding: ``data.workers``.

    python examples/slow_reads.py
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import SyntheticDataset, Trainer, cli, emulate_accelerator, loader  # noqa: E402

from stallscope import Report, StallScope  # noqa: E402

NAME = "slow_reads"
EXPECTED = "data.workers"
SMALL = {"epochs": 1, "batches": 24}


def run(
    *,
    report_dir: str = f"runs/{NAME}",
    console: Any = True,
    epochs: int = 2,
    batches: int = 40,
    num_workers: int = 0,
    batch_size: int = 16,
    latency_ms_per_sample: float = 0.5,
    **loader_kwargs: Any,
) -> Report | None:
    emulate_accelerator()
    dataset = SyntheticDataset(batches * batch_size, latency_ms=latency_ms_per_sample)
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
