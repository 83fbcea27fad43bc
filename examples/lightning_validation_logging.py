"""Planted bottleneck (Lightning): frequent validation whose ``validation_step`` logs every batch.

``self.log("val_loss", ..., on_step=True)`` in ``validation_step`` (as Lightning's autoencoder
example does) calls the logger once per validation batch; the Trainer's ``log_every_n_steps``
does not control those calls, validation's schedule does. Expected top finding:
``validation.frequency``; no advice may lower ``log_every_n_steps`` (that would log training
more often, not less: ``benchmarks/whatif.py`` checks it).

    python examples/lightning_validation_logging.py
"""

from __future__ import annotations

import functools
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import SyntheticDataset, cli, emulate_accelerator, loader  # noqa: E402
from lightning_common import fit, import_lightning, module_class  # noqa: E402

from stallscope import Report  # noqa: E402

NAME = "lightning_validation_logging"
EXPECTED = "validation.frequency"
SMALL = {"epochs": 1, "batches": 40}


@functools.cache
def logging_module_class(namespace: str) -> type[Any]:
    """The scenarios' module, its validation logging on every step."""

    class StepLoggingModule(module_class(namespace)):  # type: ignore[misc]
        def validation_step(self, batch: Any, batch_idx: int) -> None:
            x, y = batch
            self.log("val_loss", self.loss_fn(self.model(x), y), on_step=True)

    return StepLoggingModule


def run(
    *,
    report_dir: str = f"runs/{NAME}",
    console: Any = True,
    namespace: str = "lightning",
    epochs: int = 2,
    batches: int = 80,
    val_check_interval: int | float = 5,
    check_val_every_n_epoch: int = 1,
    limit_val_batches: int | float = 1.0,
    log_every_n_steps: int = 50,
    val_batches: int = 20,
    batch_size: int = 16,
) -> Report | None:
    emulate_accelerator()
    pl = import_lightning(namespace)
    train = loader(SyntheticDataset(batches * batch_size), batch_size=batch_size)
    val = loader(SyntheticDataset(val_batches * 16, seed=1), batch_size=16)
    model = logging_module_class(namespace)(repeat=4)
    with tempfile.TemporaryDirectory() as logs:
        return fit(
            namespace,
            report_dir=report_dir,
            console=console,
            model=model,
            train=train,
            val=val,
            epochs=epochs,
            logger=pl.loggers.CSVLogger(logs),
            log_every_n_steps=log_every_n_steps,
            val_check_interval=val_check_interval,
            check_val_every_n_epoch=check_val_every_n_epoch,
            limit_val_batches=limit_val_batches,
        )


if __name__ == "__main__":
    cli(run, __doc__ or NAME, NAME)
