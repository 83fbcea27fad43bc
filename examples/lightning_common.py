"""Shared pieces of the Lightning scenarios: a LightningModule around the common tiny model, and
``fit()``, which trains it with ``StallScope`` in the Trainer's callbacks.

``namespace`` picks the package each scenario runs on: ``"lightning"`` (``lightning.pytorch``)
or ``"pytorch_lightning"``; StallScope is the same object in both.
"""

from __future__ import annotations

import functools
import importlib
import tempfile
from collections.abc import Sequence
from types import ModuleType
from typing import Any

import torch
from common import make_model
from torch import nn
from torch.utils.data import DataLoader

from stallscope import Report, StallScope

NAMESPACES = ("lightning", "pytorch_lightning")


def import_lightning(namespace: str) -> ModuleType:
    """``lightning.pytorch`` or ``pytorch_lightning``."""
    if namespace not in NAMESPACES:
        raise ValueError(f"namespace must be one of {NAMESPACES}, got {namespace!r}")
    return importlib.import_module("lightning.pytorch" if namespace == "lightning" else "pytorch_lightning")


@functools.cache
def module_class(namespace: str) -> type[Any]:
    """The scenarios' LightningModule, subclassing the ``namespace``'s ``LightningModule``."""
    pl = import_lightning(namespace)

    class ScenarioModule(pl.LightningModule):  # type: ignore[misc,name-defined]
        """The common MLP. ``repeat`` forward passes per step stand in for a bigger model;
        ``state_mb`` of buffers stand in for the bulk of a real checkpoint (EMA weights, ...)."""

        def __init__(self, hidden: int = 256, repeat: int = 1, state_mb: float = 0.0, lr: float = 0.01) -> None:
            super().__init__()
            torch.manual_seed(0)
            self.model = make_model(hidden)
            self.loss_fn = nn.CrossEntropyLoss()
            self.repeat = repeat
            self.lr = lr
            if state_mb > 0:
                self.register_buffer("extra", torch.zeros(int(state_mb * 2**20 / 4)))

        def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
            x, y = batch
            loss = sum(self.loss_fn(self.model(x), y) for _ in range(self.repeat)) / self.repeat
            self.log("train_loss", loss)
            return loss

        def validation_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> None:
            x, y = batch
            self.log("val_loss", self.loss_fn(self.model(x), y))

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.SGD(self.parameters(), lr=self.lr)

    return ScenarioModule


def fit(
    namespace: str,
    *,
    report_dir: str,
    console: Any,
    model: Any,
    train: DataLoader[Any],
    val: DataLoader[Any] | None = None,
    epochs: int,
    callbacks: Sequence[Any] = (),
    logger: Any = False,
    **trainer_kwargs: Any,
) -> Report | None:
    """Train ``model`` for ``epochs`` with ``StallScope(report_dir, console=console)`` watching."""
    pl = import_lightning(namespace)
    scope = StallScope(report_dir, console=console)
    quiet = console is False
    with tempfile.TemporaryDirectory() as root:
        trainer = pl.Trainer(
            max_epochs=epochs,
            accelerator="cpu",
            devices=1,
            callbacks=[scope, *callbacks],
            logger=logger,
            enable_progress_bar=not quiet,
            enable_model_summary=False,
            enable_checkpointing=any(type(c).__name__ == "ModelCheckpoint" for c in callbacks),
            default_root_dir=root,
            **trainer_kwargs,
        )
        trainer.fit(model, train, val)
    return scope.report
