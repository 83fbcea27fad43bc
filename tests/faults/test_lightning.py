"""Faults in a Lightning fit: an exception or an interrupt in the training step, a train loader
whose ``next()`` raises (in process, or a worker killed), and two StallScope callbacks in one
Trainer. The fit sees the same steps and the same exception as without StallScope, and the
report counts exactly the training steps that ran."""

from __future__ import annotations

import importlib
import os
import signal
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

from faults.harness import dead_worker_teardown, same_error, valid_report
from stallscope import StallScope

#: Lightning 2.6 builds torch's ``LeafSpec``, which torch 2.13 deprecates; harmless here
pytestmark = pytest.mark.filterwarnings(r"ignore:.isinstance.treespec, LeafSpec.. is deprecated:FutureWarning")


@pytest.fixture(params=["lightning", "pytorch_lightning"])
def pl(request: pytest.FixtureRequest) -> ModuleType:
    return importlib.import_module("lightning.pytorch" if request.param == "lightning" else "pytorch_lightning")


class _Samples(Dataset[torch.Tensor]):
    """16 samples; sample ``at`` raises ("raise") or kills its worker ("kill")."""

    def __init__(self, fault: str = "", at: int = -1) -> None:
        self.fault = fault
        self.at = at

    def __len__(self) -> int:
        return 16

    def __getitem__(self, i: int) -> torch.Tensor:
        if i == self.at:
            if self.fault == "raise":
                raise ValueError(f"sample {i} is unreadable")
            if self.fault == "kill" and torch.utils.data.get_worker_info() is not None:
                os.kill(os.getpid(), signal.SIGKILL)
        return torch.full((4,), float(i))


def _fit(
    pl: ModuleType,
    tmp_path: Path,
    callbacks: list[Any],
    *,
    loader: DataLoader[Any],
    step_fault: BaseException | None = None,
    fail_at: int = -1,
) -> tuple[list[int], tuple[str, str] | None]:
    """Fit a tiny model for two epochs; returns the training steps that ran (global indices) and
    the exception that ended the fit."""
    steps: list[int] = []

    class Tiny(pl.LightningModule):  # type: ignore[misc,name-defined]
        def __init__(self) -> None:
            super().__init__()
            self.layer = nn.Linear(4, 1)

        def training_step(self, batch: torch.Tensor, batch_idx: int) -> torch.Tensor:
            steps.append(len(steps))
            if len(steps) == fail_at and step_fault is not None:
                raise step_fault
            return self.layer(batch).sum()

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.SGD(self.parameters(), lr=0.01)

    trainer = pl.Trainer(
        callbacks=callbacks,
        max_epochs=2,
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=False,
        num_sanity_val_steps=0,
        default_root_dir=tmp_path / "root",
    )
    error: tuple[str, str] | None = None
    try:
        trainer.fit(Tiny(), loader)
    except BaseException as exc:  # what ended the fit is what we compare
        error = (type(exc).__name__, same_error(str(exc)))
    return steps, error


@pytest.mark.parametrize(
    "fault", [ValueError("planted in training_step"), KeyboardInterrupt(), SystemExit(0)], ids=type
)
def test_an_exception_or_interrupt_in_the_training_step(pl: ModuleType, tmp_path: Path, fault: BaseException) -> None:
    def loader() -> DataLoader[Any]:
        return DataLoader(_Samples(), batch_size=2)

    bare = _fit(pl, tmp_path / "bare", [], loader=loader(), step_fault=fault, fail_at=11)
    scoped = _fit(
        pl, tmp_path, [StallScope(tmp_path / "r", console=False)], loader=loader(), step_fault=fault, fail_at=11
    )
    assert scoped == bare
    report = valid_report(tmp_path / "r")
    assert report.complete
    assert report.summary.steps == len(bare[0]) == 11


def test_a_train_loader_whose_next_raises(pl: ModuleType, tmp_path: Path) -> None:
    """The loader raises at its third batch: 2 steps ran, and the report says 2, not 3 (the
    probe after ``next()`` runs even when it raised)."""

    def loader() -> DataLoader[Any]:
        return DataLoader(_Samples("raise", at=5), batch_size=2)

    bare = _fit(pl, tmp_path / "bare", [], loader=loader())
    scoped = _fit(pl, tmp_path, [StallScope(tmp_path / "r", console=False)], loader=loader())
    assert scoped == bare
    assert bare[1] is not None
    assert bare[1][0] == "ValueError"
    report = valid_report(tmp_path / "r")
    assert report.summary.steps == len(bare[0]) == 2
    assert any("the fit ended with an exception (ValueError: sample 5 is unreadable)" in n for n in report.notes)


def test_a_killed_train_loader_worker(pl: ModuleType, tmp_path: Path) -> None:
    def loader() -> DataLoader[Any]:
        return DataLoader(_Samples("kill", at=5), batch_size=2, num_workers=1, timeout=60)

    with dead_worker_teardown():
        bare = _fit(pl, tmp_path / "bare", [], loader=loader())
    with dead_worker_teardown():
        scoped = _fit(pl, tmp_path, [StallScope(tmp_path / "r", console=False)], loader=loader())
    assert bare[1] is not None
    assert scoped[1] is not None
    assert {bare[1][0], scoped[1][0]} <= {"RuntimeError", "ConnectionResetError", "EOFError"}  # torch's timing picks
    report = valid_report(tmp_path / "r")
    assert report.summary.steps == len(scoped[0])  # no step for the batch that never came


def test_two_scopes_in_one_trainer(pl: ModuleType, tmp_path: Path) -> None:
    """A shared configuration's scope plus one added by hand, writing to two folders."""
    a, b = StallScope(tmp_path / "a", console=False), StallScope(tmp_path / "b", console=False)
    steps, error = _fit(pl, tmp_path, [a, b], loader=DataLoader(_Samples(), batch_size=2))
    assert error is None
    assert len(steps) == 16
    for folder in ("a", "b"):
        report = valid_report(tmp_path / folder)
        assert report.complete
        assert report.summary.steps == 16
        assert len(report.epochs) == 2
    assert a.state_key != b.state_key


@pytest.mark.parametrize(
    "folders",
    [("default", "default"), (None, None), ("stallscope", "./stallscope")],
    ids=["both default", "both None", "one folder, two spellings"],
)
def test_two_scopes_of_one_folder_in_one_trainer(
    pl: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, folders: tuple[str | None, str | None]
) -> None:
    """Two scopes that would write one folder: the fit runs as bare, the first scope records it,
    the second turns itself off and the first one's report says so."""
    monkeypatch.chdir(tmp_path)

    def scope(folder: str | None) -> StallScope:
        return StallScope(console=False) if folder == "default" else StallScope(folder, console=False)

    a, b = scope(folders[0]), scope(folders[1])
    steps, error = _fit(pl, tmp_path, [a, b], loader=DataLoader(_Samples(), batch_size=2))
    assert error is None
    assert len(steps) == 16
    assert a.state_key != b.state_key
    assert not b.enabled
    assert a.report is not None
    assert a.report.summary.steps == 16
    assert any("a second StallScope callback" in n and "turned itself off" in n for n in a.report.notes)
    if folders[0] is not None:
        report = valid_report(tmp_path / "stallscope")
        assert report.complete
        assert report.summary.steps == 16
