"""Planted bottleneck: a synchronous experiment-tracker call on every step.

The logger blocks ~3 ms per call (a network round trip to a tracking server) and the loss is read
with ``.item()`` each step. Expected top finding: ``logging.frequency``.

    python examples/chatty_logging.py
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import SyntheticDataset, Trainer, cli, emulate_accelerator, loader  # noqa: E402

from stallscope import Report, StallScope  # noqa: E402

NAME = "chatty_logging"
EXPECTED = "logging.frequency"
SMALL = {"epochs": 1, "batches": 40}


class BlockingTracker:
    """Stands in for a tracker client whose ``log`` waits for the server's answer."""

    def __init__(self, latency_ms: float) -> None:
        self.latency_s = latency_ms / 1e3
        self.rows: list[tuple[int, float]] = []

    def log(self, step: int, loss: float) -> None:
        time.sleep(self.latency_s)
        self.rows.append((step, loss))


def run(
    *,
    report_dir: str = f"runs/{NAME}",
    console: Any = True,
    epochs: int = 2,
    batches: int = 80,
    log_every_n_steps: int = 1,
    latency_ms: float = 3.0,
    batch_size: int = 16,
) -> Report | None:
    emulate_accelerator()
    data = loader(SyntheticDataset(batches * batch_size), batch_size=batch_size)
    trainer = Trainer()
    tracker = BlockingTracker(latency_ms)
    step = 0
    with StallScope(report_dir, console=console) as scope:
        for _ in range(epochs):
            for batch in scope.iter(data):
                with scope.phase("compute"):
                    loss = trainer.step(batch, repeat=4)
                step += 1
                if step % log_every_n_steps == 0:
                    with scope.phase("logging"):
                        tracker.log(step, loss.item())
    return scope.report


if __name__ == "__main__":
    cli(run, __doc__ or NAME, NAME)
