"""``tune.lightning``: a trial's settings on a real Trainer, and its stop through ``should_stop``."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from stallscope.tune import lightning as tune_lightning
from stallscope.tune.plan import TrialPlan
from stallscope.tune.trial import Trial

pl = pytest.importorskip("lightning.pytorch")
#: Lightning 2.6 builds torch's ``LeafSpec``, which torch 2.13 deprecates; harmless here
pytestmark = pytest.mark.filterwarnings(r"ignore:.isinstance.treespec, LeafSpec.. is deprecated:FutureWarning")
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))


def _model() -> Any:
    from lightning_common import module_class

    return module_class("lightning")()


def _trainer(tmp_path: Path, **kwargs: Any) -> Any:
    return pl.Trainer(
        max_epochs=1,
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=str(tmp_path / "user"),
        **kwargs,
    )


def test_settings_go_on_the_trainer_its_checkpoints_and_its_folders(tmp_path: Path) -> None:
    checkpoint = pl.callbacks.ModelCheckpoint(every_n_train_steps=5)
    trainer = _trainer(tmp_path, callbacks=[checkpoint], log_every_n_steps=1)
    settings = {"log_every_n_steps": 50, "every_n_train_steps": 100, "val_check_interval": 1.0}
    trial = Trial(TrialPlan(2, tmp_path / "trial", settings, steps=10))
    tune_lightning.attach(trial, trainer)
    assert trainer.log_every_n_steps == 50
    assert trainer.val_check_interval == 1.0
    assert checkpoint._every_n_train_steps == 100
    assert trainer.default_root_dir == str(tmp_path / "trial" / "root")
    assert checkpoint.dirpath == str(tmp_path / "trial" / "root" / "checkpoints")
    assert trial.applied == settings
    assert trial.not_applied == {}
    assert trial.framework == "lightning"


def test_async_save_wraps_the_checkpoint_io(tmp_path: Path) -> None:
    checkpoint = pl.callbacks.ModelCheckpoint(every_n_train_steps=5)
    trainer = _trainer(tmp_path, callbacks=[checkpoint])
    trial = Trial(TrialPlan(2, tmp_path / "trial", {"every_n_train_steps": 60, "async_save": True}, steps=10))
    tune_lightning.attach(trial, trainer)
    assert isinstance(trainer.strategy.checkpoint_io, pl.plugins.io.AsyncCheckpointIO)
    assert trial.applied == {"every_n_train_steps": 60, "async_save": True}


def test_a_checkpoint_interval_without_a_checkpoint_is_not_applied(tmp_path: Path) -> None:
    trial = Trial(TrialPlan(2, tmp_path / "trial", {"every_n_train_steps": 100}, steps=10))
    tune_lightning.attach(trial, _trainer(tmp_path, enable_checkpointing=False))
    assert "every_n_train_steps" in trial.not_applied
    assert "every_n_train_steps" not in trial.applied


def test_the_fit_stops_on_budget_with_the_loader_rebuilt(tmp_path: Path) -> None:
    data = TensorDataset(torch.randn(400, 64), torch.randint(0, 10, (400,)))
    train = DataLoader(data, batch_size=4)
    trial = Trial(TrialPlan(1, tmp_path / "trial", {"batch_sampler": True}, warmup_steps=2, steps=5))
    trainer = _trainer(tmp_path, enable_checkpointing=False)

    class Attach(pl.Callback):  # what StallScope's setup hook does in a trial
        def setup(self, trainer: Any, pl_module: Any, stage: str) -> None:
            tune_lightning.attach(trial, trainer)

    trainer.callbacks.append(Attach())
    trainer.fit(_model(), train)
    assert trainer.global_step == 7  # 2 warm-up steps and 5 measured, of 100
    assert trainer.train_dataloader.batch_size is None  # the loader rebuilt: one index per batch
    result = json.loads((tmp_path / "trial" / "trial.json").read_text())
    assert result["complete"] is True
    assert result["steps"] == 5
    assert result["applied"] == {"batch_sampler": True}
    assert len(result["losses"]) == 7
    assert all(isinstance(x, float) for x in result["losses"])


def test_a_trial_fit_logs_to_the_trials_folder_not_the_users(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Lightning makes its loggers' folders before any callback's ``setup``: in a trial, a scope
    made before the fit moves every logger with a folder (here the user's ``CSVLogger``) to the
    trial's folder first, and the user's log folder gets no new version."""
    from lightning.pytorch.trainer import call

    from stallscope import StallScope
    from stallscope.tune import trial as tune_trial

    monkeypatch.setattr(call, "_call_setup_hook", call._call_setup_hook)  # the wrapper undone after
    trial = Trial(TrialPlan(1, tmp_path / "trial", {}, warmup_steps=2, steps=5))
    monkeypatch.setattr(tune_trial, "_current", [trial])
    data = TensorDataset(torch.randn(400, 64), torch.randint(0, 10, (400,)))
    user_logs = tmp_path / "user-logs"
    trainer = pl.Trainer(
        max_epochs=1,
        accelerator="cpu",
        devices=1,
        logger=pl.loggers.CSVLogger(str(user_logs)),
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=False,
        default_root_dir=str(tmp_path / "user"),
        log_every_n_steps=1,
        callbacks=[StallScope(console=False)],
    )
    trainer.fit(_model(), DataLoader(data, batch_size=4))
    assert not user_logs.exists()
    assert list((tmp_path / "trial" / "root" / "logs").rglob("metrics.csv"))
    assert "logger folders" not in trial.not_applied
