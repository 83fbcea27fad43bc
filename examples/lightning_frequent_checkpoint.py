"""Planted bottleneck (Lightning): ``ModelCheckpoint(every_n_train_steps=5)`` on a model that carries
8 MB of extra state (EMA weights, buffers...), so every fifth step blocks on a save. Saves wait
until the file is on disk (``fsync``), as a careful checkpointer does.

Expected top finding: ``checkpoint.frequency``, naming ``ModelCheckpoint(every_n_train_steps=...)``
(the suggestion's ``every_n_train_steps``).

    python examples/lightning_frequent_checkpoint.py
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import SyntheticDataset, cli, emulate_accelerator, loader  # noqa: E402
from lightning_common import fit, import_lightning, module_class  # noqa: E402

from stallscope import Report  # noqa: E402

NAME = "lightning_frequent_checkpoint"
EXPECTED = "checkpoint.frequency"
SMALL = {"epochs": 1, "batches": 30}


def durable_checkpoint_io(namespace: str) -> Any:
    """Lightning's ``TorchCheckpointIO``, plus an ``fsync`` of each file it writes."""
    pl = import_lightning(namespace)

    class DurableCheckpointIO(pl.plugins.TorchCheckpointIO):  # type: ignore[misc,name-defined]
        def save_checkpoint(self, checkpoint: dict[str, Any], path: Any, storage_options: Any = None) -> None:
            super().save_checkpoint(checkpoint, path, storage_options)
            with open(path, "rb+") as fh:
                os.fsync(fh.fileno())

    return DurableCheckpointIO()


def run(
    *,
    report_dir: str = f"runs/{NAME}",
    console: Any = True,
    namespace: str = "lightning",
    epochs: int = 2,
    batches: int = 60,
    every_n_train_steps: int = 5,
    async_save: bool = False,
    max_steps: int = -1,
    state_mb: float = 8.0,
    batch_size: int = 16,
) -> Report | None:
    """``async_save`` wraps the checkpoint IO in Lightning's ``AsyncCheckpointIO``."""
    emulate_accelerator()
    every = every_n_train_steps
    train = loader(SyntheticDataset(batches * batch_size), batch_size=batch_size)
    model = module_class(namespace)(repeat=8, state_mb=state_mb)
    pl = import_lightning(namespace)
    checkpoint = pl.callbacks.ModelCheckpoint(every_n_train_steps=every, save_top_k=1)
    checkpoint_io = durable_checkpoint_io(namespace)
    if async_save:
        checkpoint_io = pl.plugins.io.AsyncCheckpointIO(checkpoint_io)
    return fit(
        namespace,
        report_dir=report_dir,
        console=console,
        model=model,
        train=train,
        epochs=epochs,
        callbacks=[checkpoint],
        plugins=[checkpoint_io],
        max_steps=max_steps,
    )


if __name__ == "__main__":
    cli(run, __doc__ or NAME, NAME)
