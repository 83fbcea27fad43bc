"""Planted bottleneck: a blocking checkpoint (``torch.save`` + ``fsync``) every few steps.

Expected top finding: ``checkpoint.frequency``, suggesting ``{"every_n_steps": K}``.

    python examples/blocking_checkpoint.py
"""

from __future__ import annotations

import os
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402
from common import SyntheticDataset, Trainer, cli, emulate_accelerator, loader  # noqa: E402

from stallscope import Report, StallScope  # noqa: E402

NAME = "blocking_checkpoint"
EXPECTED = "checkpoint.frequency"
SMALL = {"epochs": 1, "batches": 30}


def save_checkpoint(state: dict[str, Any], path: Path) -> None:
    """Write ``state`` and wait until it is on disk, as a careful checkpointer does."""
    with open(path, "wb") as fh:
        torch.save(state, fh)
        fh.flush()
        os.fsync(fh.fileno())


def run(
    *,
    report_dir: str = f"runs/{NAME}",
    console: Any = True,
    epochs: int = 2,
    batches: int = 60,
    every_n_steps: int = 5,
    at_end: bool = False,
    async_save: bool = False,
    state_mb: float = 8.0,
    batch_size: int = 16,
) -> Report | None:
    """``at_end``: also save after the last step; ``async_save``: copy the state, then write it
    from a background thread (the wait for the last write is a ``checkpoint`` phase too)."""
    emulate_accelerator()
    data = loader(SyntheticDataset(batches * batch_size), batch_size=batch_size)
    trainer = Trainer()
    # optimizer state, EMA weights, ... : the bulk of a real checkpoint
    extra = torch.zeros(int(state_mb * 2**20 / 4))
    step = 0
    last_step = epochs * batches
    writer = ThreadPoolExecutor(max_workers=1) if async_save else None
    with tempfile.TemporaryDirectory() as tmp, StallScope(report_dir, console=console) as scope:
        path = Path(tmp) / "last.ckpt"
        for _ in range(epochs):
            for batch in scope.iter(data):
                with scope.phase("compute"):
                    trainer.step(batch, repeat=4)
                step += 1
                if step % every_n_steps == 0 or (at_end and step == last_step):
                    with scope.phase("checkpoint"):
                        state = {"model": trainer.model.state_dict(), "extra": extra, "step": step}
                        if writer is None:
                            save_checkpoint(state, path)
                        else:
                            copy = {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in state.items()}
                            copy["model"] = {k: v.clone() for k, v in state["model"].items()}
                            writer.submit(save_checkpoint, copy, path)
        if writer is not None:
            with scope.phase("checkpoint"):
                writer.shutdown(wait=True)  # the last write is on disk before the run ends
    return scope.report


if __name__ == "__main__":
    cli(run, __doc__ or NAME, NAME)
