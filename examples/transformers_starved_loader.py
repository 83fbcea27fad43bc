"""Planted bottleneck (transformers): a ``data_collator`` that costs 40 ms of CPU a batch (think
tokenizing on the fly) with ``dataloader_num_workers=0``, so every step waits for its batch.

Expected top finding: ``data.workers``, naming ``TrainingArguments(dataloader_num_workers=...)``.

    python examples/transformers_starved_loader.py
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import cli  # noqa: E402
from transformers_common import CostlyCollator, train  # noqa: E402

from stallscope import Report  # noqa: E402

NAME = "transformers_starved_loader"
EXPECTED = "data.workers"
SMALL = {"epochs": 1, "batches": 30}


def run(
    *,
    report_dir: str = f"runs/{NAME}",
    console: Any = True,
    epochs: int = 2,
    batches: int = 60,
    collate_ms: float = 40.0,
    dataloader_num_workers: int = 0,
    dataloader_prefetch_factor: int | None = None,
    dataloader_persistent_workers: bool = False,
    torch_num_threads: int | None = None,
) -> Report | None:
    """``torch_num_threads``: the intra-op threads, where a suggestion names them (the default
    is one, as on a GPU host)."""
    return train(
        report_dir=report_dir,
        console=console,
        epochs=epochs,
        batches=batches,
        collator=CostlyCollator(cpu_ms=collate_ms),
        dataloader_num_workers=dataloader_num_workers,
        dataloader_prefetch_factor=dataloader_prefetch_factor if dataloader_num_workers else None,
        dataloader_persistent_workers=dataloader_persistent_workers and dataloader_num_workers > 0,
        threads=torch_num_threads,
    )


if __name__ == "__main__":
    cli(run, __doc__ or NAME, NAME)
