"""Planted bottleneck (Lightning): CPU-heavy preprocessing in the training process (``num_workers=0``).

Every sample costs ~0.6 ms of CPU in ``__getitem__``; with no workers the training step waits for
each batch to be built. Expected top finding: ``data.workers``, naming the train DataLoader's
``num_workers``.

    python examples/lightning_starved_loader.py
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import SyntheticDataset, cli, emulate_accelerator, loader  # noqa: E402
from lightning_common import fit, module_class  # noqa: E402

from stallscope import Report  # noqa: E402

NAME = "lightning_starved_loader"
EXPECTED = "data.workers"
SMALL = {"epochs": 1, "batches": 24}


def run(
    *,
    report_dir: str = f"runs/{NAME}",
    console: Any = True,
    namespace: str = "lightning",
    epochs: int = 2,
    batches: int = 40,
    num_workers: int = 0,
    persistent_workers: bool = False,
    batch_size: int = 16,
    cpu_ms_per_sample: float = 0.6,
    **loader_kwargs: Any,
) -> Report | None:
    emulate_accelerator()
    dataset = SyntheticDataset(batches * batch_size, cpu_ms=cpu_ms_per_sample)
    train = loader(
        dataset, batch_size=batch_size, num_workers=num_workers, persistent_workers=persistent_workers, **loader_kwargs
    )
    model = module_class(namespace)(repeat=4)
    return fit(namespace, report_dir=report_dir, console=console, model=model, train=train, epochs=epochs)


if __name__ == "__main__":
    cli(run, __doc__ or NAME, NAME)
