"""The fit's shape as the Lightning callback reads it from a real Trainer (both namespaces)."""

from __future__ import annotations

import importlib
from typing import Any

import pytest

from stallscope.hooks.lightning import run_shape


@pytest.fixture(params=["lightning", "pytorch_lightning"])
def pl(request: pytest.FixtureRequest) -> Any:
    return importlib.import_module("lightning.pytorch" if request.param == "lightning" else "pytorch_lightning")


def _trainer(pl: Any, **kwargs: Any) -> Any:
    return pl.Trainer(accelerator="cpu", logger=False, enable_progress_bar=False, enable_checkpointing=False, **kwargs)


def test_a_max_steps_fit_is_as_long_as_its_steps(pl: Any) -> None:
    shape = run_shape(_trainer(pl, max_steps=50, limit_train_batches=0.5, val_check_interval=10), batches=40)
    assert shape.max_steps == 50
    assert shape.max_epochs is None
    assert shape.limit_train_batches == 0.5
    assert shape.val_check_interval == 10
    assert shape.check_val_every_n_epoch == 1
    assert shape.batches_per_epoch == 40
    assert shape.total_steps == 50


def test_an_epoch_bound_fit_counts_whole_epochs(pl: Any) -> None:
    trainer = _trainer(pl, max_epochs=3, check_val_every_n_epoch=None, val_check_interval=25, limit_val_batches=5)
    shape = run_shape(trainer, batches=40)
    assert shape.max_steps is None  # Lightning's -1: unbounded
    assert shape.check_val_every_n_epoch is None  # validation counted across epochs
    assert shape.limit_val_batches == 5
    assert shape.total_steps == 120
    assert run_shape(trainer).total_steps is None  # batches per epoch not known before the first epoch
