"""Planted bottleneck: a synchronous experiment-tracker call on every step.

The logger blocks ~3 ms per call (a network round trip to a tracking server) and the loss is read
with ``.item()`` each step. Expected top finding: ``logging.frequency``. ``async_logging=True``
applies its suggestion for a logger that blocks: each call is handed to a background thread
through a queue, so training goes on while the tracker waits, and every step is still logged.

    python examples/chatty_logging.py
"""

from __future__ import annotations

import queue
import sys
import threading
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
    async_logging: bool = False,
    latency_ms: float = 3.0,
    batch_size: int = 16,
) -> Report | None:
    emulate_accelerator()
    data = loader(SyntheticDataset(batches * batch_size), batch_size=batch_size)
    trainer = Trainer()
    tracker = BlockingTracker(latency_ms)
    calls: queue.Queue[tuple[int, float] | None] = queue.Queue()

    def drain() -> None:
        while (item := calls.get()) is not None:
            tracker.log(*item)

    writer = threading.Thread(target=drain, daemon=True)
    if async_logging:
        writer.start()
    log = (lambda step, loss: calls.put((step, loss))) if async_logging else tracker.log
    step = 0
    with StallScope(report_dir, console=console) as scope:
        for _ in range(epochs):
            for batch in scope.iter(data):
                with scope.phase("compute"):
                    loss = trainer.step(batch, repeat=4)
                step += 1
                if step % log_every_n_steps == 0:
                    with scope.phase("logging"):
                        log(step, loss.item())
        if async_logging:  # the last calls are logged before the run ends
            calls.put(None)
            writer.join()
    if len(tracker.rows) != step // log_every_n_steps:
        raise RuntimeError(f"{len(tracker.rows)} steps logged, expected {step // log_every_n_steps}")
    return scope.report


if __name__ == "__main__":
    cli(run, __doc__ or NAME, NAME)
