"""Planted bottleneck (Lightning): a logger whose every call blocks, flushed on every step.

The logger stands in for an experiment tracker that waits for its server's answer (~3 ms per
call), and the Trainer hands it the metrics on every step (``log_every_n_steps=1``). Expected top
finding: ``logging.frequency``, naming ``Trainer(log_every_n_steps=...)``.

    python examples/lightning_slow_logger.py
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import SyntheticDataset, cli, emulate_accelerator, loader  # noqa: E402
from lightning_common import fit, import_lightning, module_class  # noqa: E402

from stallscope import Report  # noqa: E402

NAME = "lightning_slow_logger"
EXPECTED = "logging.frequency"
SMALL = {"epochs": 1, "batches": 40}


def blocking_logger(namespace: str, latency_ms: float) -> Any:
    """A ``Logger`` of ``namespace`` whose ``log_metrics`` waits ``latency_ms`` for a server."""
    pl = import_lightning(namespace)

    class BlockingTrackerLogger(pl.loggers.Logger):  # type: ignore[misc,name-defined]
        def __init__(self) -> None:
            super().__init__()
            self.rows: list[tuple[int | None, dict[str, float]]] = []

        @property
        def name(self) -> str:
            return "tracker"

        @property
        def version(self) -> str:
            return "0"

        def log_hyperparams(self, params: Any, *args: Any, **kwargs: Any) -> None:
            return None

        def log_metrics(self, metrics: dict[str, float], step: int | None = None) -> None:
            time.sleep(latency_ms / 1e3)  # the round trip to the tracking server
            self.rows.append((step, dict(metrics)))

    return BlockingTrackerLogger()


def run(
    *,
    report_dir: str = f"runs/{NAME}",
    console: Any = True,
    namespace: str = "lightning",
    epochs: int = 2,
    batches: int = 80,
    log_every_n_steps: int = 1,
    latency_ms: float = 3.0,
    batch_size: int = 16,
) -> Report | None:
    emulate_accelerator()
    train = loader(SyntheticDataset(batches * batch_size), batch_size=batch_size)
    model = module_class(namespace)(repeat=4)
    return fit(
        namespace,
        report_dir=report_dir,
        console=console,
        model=model,
        train=train,
        epochs=epochs,
        logger=blocking_logger(namespace, latency_ms),
        log_every_n_steps=log_every_n_steps,
    )


if __name__ == "__main__":
    cli(run, __doc__ or NAME, NAME)
