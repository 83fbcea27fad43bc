"""Planted bottleneck (Lightning): a logger whose every call blocks, flushed on every step.

The logger stands in for an experiment tracker that waits for its server's answer (~3 ms per
call), and the Trainer hands it the metrics on every step (``log_every_n_steps=1``). Expected top
finding: ``logging.frequency``. Its suggestion for a logger that blocks, ``async_logging=True``,
wraps the logger in ``BackgroundLogger`` (the finding's snippet): ``log_metrics`` puts the
metrics on a queue that a thread drains, so training goes on while the logger waits.

    python examples/lightning_slow_logger.py
"""

from __future__ import annotations

import queue
import sys
import threading
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


def background_logger(namespace: str, inner: Any) -> Any:
    """``inner`` behind a queue: ``log_metrics`` returns at once, a thread makes the calls."""
    pl = import_lightning(namespace)

    class BackgroundLogger(pl.loggers.Logger):  # type: ignore[misc,name-defined]
        def __init__(self) -> None:
            super().__init__()
            self.inner = inner
            self.queue: queue.Queue[tuple[dict[str, float], int | None] | None] = queue.Queue()
            self.thread = threading.Thread(target=self._drain, daemon=True)
            self.thread.start()

        @property
        def name(self) -> str:
            return str(self.inner.name)

        @property
        def version(self) -> str:
            return str(self.inner.version)

        def log_hyperparams(self, *args: Any, **kwargs: Any) -> None:
            self.inner.log_hyperparams(*args, **kwargs)

        def log_metrics(self, metrics: dict[str, float], step: int | None = None) -> None:
            self.queue.put((dict(metrics), step))  # the training thread waits no more

        def _drain(self) -> None:
            while (item := self.queue.get()) is not None:
                self.inner.log_metrics(*item)

        def finalize(self, status: str) -> None:
            if self.thread.is_alive():
                self.queue.put(None)
                self.thread.join()  # everything is logged before the fit ends
            self.inner.finalize(status)

    return BackgroundLogger()


def run(
    *,
    report_dir: str = f"runs/{NAME}",
    console: Any = True,
    namespace: str = "lightning",
    epochs: int = 2,
    batches: int = 80,
    log_every_n_steps: int = 1,
    async_logging: bool = False,
    latency_ms: float = 3.0,
    batch_size: int = 16,
) -> Report | None:
    emulate_accelerator()
    train = loader(SyntheticDataset(batches * batch_size), batch_size=batch_size)
    model = module_class(namespace)(repeat=4)
    logger = blocking_logger(namespace, latency_ms)
    if async_logging:
        logger = background_logger(namespace, logger)
    return fit(
        namespace,
        report_dir=report_dir,
        console=console,
        model=model,
        train=train,
        epochs=epochs,
        logger=logger,
        log_every_n_steps=log_every_n_steps,
    )


if __name__ == "__main__":
    cli(run, __doc__ or NAME, NAME)
