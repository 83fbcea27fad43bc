"""The fit's shape as the Lightning callback reads it from a real Trainer (both namespaces)."""

from __future__ import annotations

import importlib
from typing import Any

import pytest

from stallscope.hooks.lightning import run_shape, time_budget_s


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


def test_max_time_min_epochs_early_stopping_and_the_logging_interval_are_read(pl: Any) -> None:
    stop = pl.callbacks.EarlyStopping(monitor="val_loss", patience=2)
    trainer = _trainer(pl, max_time={"seconds": 60}, min_epochs=2, log_every_n_steps=7, callbacks=[stop])
    budget = time_budget_s(trainer)
    assert budget == pytest.approx(60.0)
    shape = run_shape(trainer, batches=40, max_time_s=budget)
    assert shape.max_epochs is None  # max_time alone bounds the fit
    assert shape.min_epochs == 2
    assert shape.early_stopping_patience == 2
    assert shape.log_every_n_steps == 7
    assert shape.total_steps is None
    assert shape.fit_steps(1.0) == 80, "min_epochs whole epochs before max_time may stop the fit"
    assert shape.fit_steps(0.1) == 480, "80% of the time, at 0.1 s a step"
    assert time_budget_s(_trainer(pl, max_epochs=1)) is None


def test_a_fit_bounded_by_epochs_and_time_ends_at_the_sooner(pl: Any) -> None:
    trainer = _trainer(pl, max_epochs=3, max_time={"seconds": 60})
    shape = run_shape(trainer, batches=40, max_time_s=time_budget_s(trainer))
    assert shape.total_steps == 120
    assert shape.fit_steps(1.0) == 48
    assert shape.fit_steps(0.01) == 120
    assert shape.fit_steps(None) == 120  # no step timed yet: the epochs' bound


def test_a_resumed_fit_counts_only_the_steps_left(pl: Any) -> None:
    shape = run_shape(_trainer(pl, max_epochs=1), batches=100, steps_before=50)
    assert shape.total_steps == 50, "a fit resumed at step 50 of 100 has 50 steps left"
    shape = run_shape(_trainer(pl, max_steps=120), batches=100, steps_before=150)
    assert shape.total_steps == 0


def test_the_model_checkpoints_are_counted(pl: Any, tmp_path: Any) -> None:
    """0 with enable_checkpointing=False (the fit's saves are its own calls), one by default,
    two when the user adds a second."""
    assert run_shape(_trainer(pl, max_steps=5)).model_checkpoints == 0
    default = pl.Trainer(accelerator="cpu", logger=False, enable_progress_bar=False, default_root_dir=tmp_path)
    assert run_shape(default).model_checkpoints == 1
    two = pl.Trainer(
        accelerator="cpu",
        logger=False,
        enable_progress_bar=False,
        default_root_dir=tmp_path,
        callbacks=[
            pl.callbacks.ModelCheckpoint(dirpath=tmp_path, monitor="a"),
            pl.callbacks.ModelCheckpoint(dirpath=tmp_path, monitor="b"),
        ],
    )
    assert run_shape(two).model_checkpoints == 2
