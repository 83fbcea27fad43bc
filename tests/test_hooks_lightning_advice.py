"""Lightning as people write it: real tiny fits whose advice must not make the run worse.

Logging from ``validation_step``, ``max_time``, mid-epoch resumes, iterable datasets, epoch
labels after a resume. Each fit runs on a fake clock where a number matters (costs planted in
milliseconds, ``Costs``), so the tests hold on a busy host.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import queue
import sys
import threading
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import torch
from conftest import FakeClock
from test_hooks_lightning import NAMESPACES, Costs, Samples, import_pl
from torch import nn
from torch.utils.data import DataLoader, IterableDataset

from stallscope import StallScope
from stallscope.analysis.rules import logging_frequency
from stallscope.hooks import lightning as lightning_hooks
from stallscope.hooks.session import Session
from stallscope.report.schema import Report

#: Lightning 2.6 builds torch's ``LeafSpec``, which torch 2.13 deprecates; harmless here
pytestmark = pytest.mark.filterwarnings(r"ignore:.isinstance.treespec, LeafSpec.. is deprecated:FutureWarning")

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


@pytest.fixture(params=NAMESPACES)
def pl(request: pytest.FixtureRequest) -> ModuleType:
    """The Lightning package under test (``lightning.pytorch`` or ``pytorch_lightning``)."""
    return import_pl(request.param)


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch, clock: FakeClock, cpu_clock: FakeClock) -> FakeClock:
    """Every fit's session reads ``clock`` (and ``cpu_clock``) instead of real time."""
    monkeypatch.setattr(lightning_hooks, "Session", functools.partial(Session, clock=clock, cpu_clock=cpu_clock))
    return clock


class Stream(IterableDataset[tuple[torch.Tensor, torch.Tensor]]):
    """An iterable dataset without ``__len__``: ``n`` samples a pass."""

    def __init__(self, n: int, costs: Costs) -> None:
        self.samples = Samples(n, costs)

    def __iter__(self) -> Any:
        return (self.samples[i] for i in range(len(self.samples)))


def loader(n: int, costs: Costs, *, what: str = "sample", **kwargs: Any) -> DataLoader[Any]:
    return DataLoader(Samples(n, costs, what), batch_size=4, **kwargs)


@functools.cache
def model_class(pl: ModuleType) -> type[Any]:
    class Tiny(pl.LightningModule):  # type: ignore[misc,name-defined]
        """A linear model; ``validation_step`` logs on each step as Lightning's autoencoder does."""

        def __init__(self, costs: Costs) -> None:
            super().__init__()
            self.layer = nn.Linear(8, 2)
            self.costs = costs

        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            self.costs.spend("step")
            x, y = batch
            loss = nn.functional.cross_entropy(self.layer(x), y)
            self.log("train_loss", loss)
            return loss

        def validation_step(self, batch: Any, batch_idx: int) -> None:
            self.costs.spend("val_step")
            x, y = batch
            self.log("val_loss", nn.functional.cross_entropy(self.layer(x), y), on_step=True)

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.SGD(self.parameters(), lr=0.1)

    return Tiny


@functools.cache
def logger_class(pl: ModuleType) -> type[Any]:
    class CostlyLogger(pl.loggers.Logger):  # type: ignore[misc,name-defined]
        """A logger whose ``log_metrics`` costs ``log`` ms; it keeps what it was given."""

        def __init__(self, costs: Costs) -> None:
            super().__init__()
            self.costs = costs
            self.metrics: list[dict[str, float]] = []

        @property
        def name(self) -> str:
            return "costly"

        @property
        def version(self) -> str:
            return "0"

        def log_hyperparams(self, params: Any, *args: Any, **kwargs: Any) -> None:
            return None

        def log_metrics(self, metrics: dict[str, float], step: int | None = None) -> None:
            self.costs.spend("log")
            self.metrics.append(dict(metrics))

        def finalize(self, status: str) -> None:
            return None

    return CostlyLogger


def trainer(pl: ModuleType, tmp_path: Path, callbacks: list[Any], **overrides: Any) -> Any:
    settings: dict[str, Any] = {
        "max_epochs": 1,
        "accelerator": "cpu",
        "devices": 1,
        "logger": False,
        "enable_progress_bar": False,
        "enable_model_summary": False,
        "enable_checkpointing": False,
        "num_sanity_val_steps": 0,
        "default_root_dir": tmp_path / "root",
    }
    settings.update(overrides)
    return pl.Trainer(callbacks=callbacks, **settings)


def scope_for(tmp_path: Path, **kwargs: Any) -> StallScope:
    return StallScope(tmp_path / "scope", console=kwargs.pop("console", False), **kwargs)


def finding(report: Report | None, fid: str) -> Any:
    assert report is not None
    found = [f for f in report.findings if f.id == fid]
    return found[0] if found else None


# -- 1. logger calls belong to the loop that made them ---------------------------------------


def test_validation_step_logging_counts_as_validation_not_training_logging(
    pl: ModuleType, tmp_path: Path, clock: FakeClock
) -> None:
    """``self.log(..., on_step=True)`` in ``validation_step``: a logger call per validation batch.
    With the default ``log_every_n_steps=50`` the training loop logs at step 50 and at each epoch's
    end; advising a shorter interval would log training more often, not less."""
    costs = Costs(clock, sample=0.25, step=2, val_step=1, log=2)
    scope = scope_for(tmp_path)
    logger = logger_class(pl)(costs)
    tr = trainer(pl, tmp_path, [scope], logger=logger, max_epochs=2, val_check_interval=6)
    tr.fit(model_class(pl)(costs), loader(96, costs), loader(32, costs, what="val_sample"))  # 24 train, 8 val

    report = scope.report
    assert report is not None
    val_calls = sum(1 for m in logger.metrics if any(k.startswith("val_loss") for k in m))
    train_calls = len(logger.metrics) - val_calls
    assert val_calls >= 4 * 2 * 8, "each validation batch logs"
    assert train_calls <= 4
    seconds = report.summary.phase_seconds
    assert seconds["logging"] == pytest.approx(2e-3 * train_calls, abs=1e-6)
    # the validation runs hold their own logger calls
    assert seconds["validation"] == pytest.approx(8 * 8 * 1e-3 + 2e-3 * val_calls, abs=1e-6)
    logging = finding(report, "logging.frequency")
    assert logging is None or logging.suggestion.get("log_every_n_steps", 0) > 50
    assert report.findings[0].id == "validation.frequency"


# -- 3. max_time is part of the fit's length -------------------------------------------------


def test_a_max_time_fit_is_advised_to_validate_within_its_time(tmp_path: Path, clock: FakeClock) -> None:
    """``Trainer(max_time)`` stops the fit at whatever step its clock says: about 33 steps here
    (a step of 1 s and validation runs of 4 s every 5 steps, in 60 s), long before ``max_epochs``.
    Validating "every 2 epochs" would never validate; the suggestion validates within the steps
    the time allows. (The fit runs on the fake clock; the Timer, on real time, never stops it.)"""
    pl = import_pl("lightning")
    costs = Costs(clock, step=1000, val_step=1000)
    scope = scope_for(tmp_path)
    tr = trainer(pl, tmp_path, [scope], max_epochs=2, max_time={"seconds": 60}, val_check_interval=5)
    tr.fit(model_class(pl)(costs), loader(160, costs), loader(16, costs, what="val_sample"))  # 40 train, 4 val

    report = scope.report
    validation = finding(report, "validation.frequency")
    assert validation is not None
    interval = validation.suggestion["val_check_interval"]
    step_s = report.summary.wall_s / report.summary.steps  # about 1.8 s all in
    assert isinstance(interval, int)
    assert interval <= 60 / step_s, f"validates after the time runs out: {validation.suggestion}"
    assert validation.suggestion.get("check_val_every_n_epoch", 1) == 1
    assert validation.evidence["fit_steps"] <= 60 / step_s


# -- 2. a saving is capped by what the fix removes -----------------------------------------


@functools.cache
def every_fifth_class(pl: ModuleType) -> type[Any]:
    class EveryFifthBatch(pl.Callback):  # type: ignore[misc,name-defined]
        """A user's callback whose work every 5 batches falls right after Lightning's logging."""

        def __init__(self, costs: Costs) -> None:
            self.costs = costs

        def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int) -> None:
            if batch_idx % 5 == 0:
                self.costs.spend("callback")

    return EveryFifthBatch


def test_another_sources_slowness_is_not_billed_to_logging(pl: ModuleType, tmp_path: Path, clock: FakeClock) -> None:
    """Logging every 5 steps takes about 1% of the time; a callback's 30 ms job lands in the step
    right after each logging call. Billing it to logging made a floor of a 1% phase ("at least
    x1.2"); removing the calls does not remove the job."""
    costs = Costs(clock, step=10, log=1, callback=30)
    scope = scope_for(tmp_path)
    logger = logger_class(pl)(costs)
    tr = trainer(pl, tmp_path, [scope, every_fifth_class(pl)(costs)], logger=logger, max_epochs=2, log_every_n_steps=5)
    tr.fit(model_class(pl)(costs), loader(160, costs))  # 40 batches an epoch

    report = scope.report
    assert report is not None
    assert report.summary.phase_fractions["logging"] < 0.02
    found = [*report.findings, *(f for e in report.epochs for f in e.findings)]
    for f in (f for f in found if f.id == "logging.frequency"):
        share = f.evidence["share_of_wall"]
        assert f.est_saving_fraction <= 2 * share, f"saves more than the calls and as much again: {f.evidence}"
        assert f.est_speedup_bound == "estimate" or f.evidence["slower_after_each_ms"] == 0


# -- 4 and 7. a resumed fit: its epochs, its steps, its labels ---------------------------------


@functools.cache
def stop_class(pl: ModuleType) -> type[Any]:
    class StopAfter(pl.Callback):  # type: ignore[misc,name-defined]
        """Saves a checkpoint after ``at`` batches and stops the fit there (a job cut off mid-epoch)."""

        def __init__(self, at: int, path: Path) -> None:
            self.at = at
            self.path = path

        def on_train_batch_end(self, trainer: Any, *args: Any) -> None:
            if trainer.global_step == self.at:
                trainer.save_checkpoint(self.path)
                trainer.should_stop = True

    return StopAfter


def test_a_fit_resumed_mid_epoch_prints_its_epoch_and_counts_every_step(
    pl: ModuleType, tmp_path: Path, capsys: pytest.CaptureFixture[str], clock: FakeClock
) -> None:
    """Resumed at batch 10 of 50 with ``ckpt_path=``: Lightning skips ``on_train_epoch_start``.
    The resumed epoch still gets its panel, named as Lightning numbers it, with its 40 steps
    (steps of 40 ms on the fake clock: epochs long enough to be judged alone)."""
    costs = Costs(clock, step=40)
    path = tmp_path / "mid.ckpt"
    first = trainer(pl, tmp_path, [stop_class(pl)(10, path)], max_epochs=2)
    first.fit(model_class(pl)(costs), loader(200, costs))
    assert path.exists()
    capsys.readouterr()

    scope = StallScope(tmp_path / "scope", console=True, print_interval_s=0)
    tr = trainer(pl, tmp_path, [scope], max_epochs=2)
    tr.fit(model_class(pl)(costs), loader(200, costs), ckpt_path=path)

    report = scope.report
    assert report is not None
    assert costs.counts["step"] == 10 + 40 + 50
    assert [e.summary.steps for e in report.epochs] == [40, 50]
    assert report.summary.steps == 90
    out = capsys.readouterr().out
    assert "StallScope · epoch 0" in out
    assert "StallScope · epoch 1" in out
    # every step of the run is in an epoch (the fake clock moves only in steps: no tail)
    tail = report.tail.wall_s if report.tail is not None else 0.0
    assert sum(e.summary.wall_s for e in report.epochs) + tail == pytest.approx(report.summary.wall_s, abs=1e-6)


def test_a_second_fit_names_its_epochs_as_lightning_does(
    pl: ModuleType, tmp_path: Path, capsys: pytest.CaptureFixture[str], clock: FakeClock
) -> None:
    """Epochs of 32 steps of 40 ms on the fake clock: each long enough for a panel of its own."""
    costs = Costs(clock, step=40)
    scope = StallScope(tmp_path / "scope", console=True, print_interval_s=0)
    tr = trainer(pl, tmp_path, [scope], max_epochs=1)
    model = model_class(pl)(costs)
    tr.fit(model, loader(128, costs))
    assert "StallScope · epoch 0" in capsys.readouterr().out
    tr.fit_loop.max_epochs = 3
    tr.fit(model, loader(128, costs))  # Lightning's epochs 1 and 2
    out = capsys.readouterr().out
    assert "StallScope · epoch 1" in out
    assert "StallScope · epoch 2" in out
    assert "StallScope · epoch 0" not in out


# -- 5. an iterable dataset without a length ---------------------------------------------------


def test_an_iterable_dataset_without_a_length_counts_its_steps(pl: ModuleType, tmp_path: Path) -> None:
    """Lightning fetches one batch ahead to see the end of a loader without ``__len__``: the
    ``next()`` that finds it is no step of the next epoch."""
    costs = Costs()
    scope = scope_for(tmp_path)
    tr = trainer(pl, tmp_path, [scope], max_epochs=3)
    tr.fit(model_class(pl)(costs), DataLoader(Stream(40, costs), batch_size=4))
    report = scope.report
    assert report is not None
    assert costs.counts["step"] == 30
    assert [e.summary.steps for e in report.epochs] == [10, 10, 10]
    assert report.summary.steps == 30


# -- 9. the smaller items ----------------------------------------------------------------------


def test_the_suggested_background_logger_keeps_what_lightning_reads_from_a_logger(
    pl: ModuleType, tmp_path: Path
) -> None:
    """The ``logging.frequency`` snippet, as a user pastes it, around a ``CSVLogger``: the
    Trainer's ``log_dir`` and the checkpoints' folder come from the logger as before, and every
    metric still reaches the CSV file."""
    snippet = logging_frequency._LIGHTNING_SNIPPET.split("\nTrainer(")[0]
    namespace: dict[str, Any] = {"Logger": pl.loggers.Logger, "queue": queue, "threading": threading}
    exec(snippet, namespace)  # the class the user is told to write
    inner = pl.loggers.CSVLogger(tmp_path / "logs", name="run")
    costs = Costs()
    checkpoint = pl.callbacks.ModelCheckpoint()
    logger = namespace["BackgroundLogger"](inner)
    tr = trainer(pl, tmp_path, [checkpoint], logger=logger, enable_checkpointing=True, log_every_n_steps=1)
    assert tr.log_dir == str(tmp_path / "logs")
    tr.fit(model_class(pl)(costs), loader(32, costs))
    assert Path(checkpoint.best_model_path).parent == Path(inner.log_dir) / "checkpoints"
    rows = (Path(inner.log_dir) / "metrics.csv").read_text(encoding="utf-8").splitlines()
    assert "train_loss" in rows[0]
    assert len(rows) == 1 + 8, "the header and each step's row"


def test_a_checkpoint_saved_at_an_epochs_end_says_which_panel_it_went_to(pl: ModuleType, tmp_path: Path) -> None:
    """Without validation, ``ModelCheckpoint`` saves at each epoch's end, after StallScope's end of
    that epoch: the save is in the next epoch's numbers and the last one in the tail, and the
    report says so."""
    costs = Costs()
    scope = scope_for(tmp_path)
    checkpoint = pl.callbacks.ModelCheckpoint(dirpath=tmp_path / "ckpt")
    tr = trainer(pl, tmp_path, [scope, checkpoint], max_epochs=2, enable_checkpointing=True)
    tr.fit(model_class(pl)(costs), loader(32, costs))
    report = scope.report
    assert report is not None
    assert [e.summary.phase_seconds["checkpoint"] > 0 for e in report.epochs] == [False, True]
    assert report.tail is not None
    assert report.tail.phase_seconds["checkpoint"] > 0
    assert lightning_hooks.EPOCH_END_SAVE in report.notes


# -- the advice applied: benchmarks/whatif.py's Lightning rows, once each ---------------------


def _scenario(name: str) -> ModuleType:
    sys.path.insert(0, str(EXAMPLES))
    try:
        return importlib.import_module(name)
    finally:
        sys.path.remove(str(EXAMPLES))


@pytest.mark.scenario
def test_validation_that_logs_each_step_is_not_advised_to_log_training_more(tmp_path: Path) -> None:
    module = _scenario("lightning_validation_logging")
    report = module.run(report_dir=str(tmp_path / "before"), console=False, **module.SMALL)
    assert report is not None
    assert report.findings[0].id == "validation.frequency"
    for f in report.findings:
        assert f.suggestion.get("log_every_n_steps", 51) > 50, f"logs training more often: {f.suggestion}"


@pytest.mark.scenario
def test_a_max_time_fit_still_validates_with_the_advice_applied(tmp_path: Path) -> None:
    module = _scenario("lightning_max_time_validation")
    settings = dict(module.SMALL)
    before = module.run(report_dir=str(tmp_path / "before"), console=False, **settings)
    assert before is not None
    top = before.findings[0]
    assert top.id == "validation.frequency"
    assert set(top.suggestion) <= set(inspect.signature(module.run).parameters)
    after = module.run(report_dir=str(tmp_path / "after"), console=False, **settings, **top.suggestion)
    assert after is not None
    assert after.summary.phase_seconds["validation"] > 0, f"{top.suggestion} validated nothing"


# -- 6. the validation loader's worker start-up ------------------------------------------------


def test_validation_worker_start_up_is_validation_and_advised_on_the_validation_loader(
    pl: ModuleType, tmp_path: Path
) -> None:
    """Two workers on the validation loader, started at each of its 3 runs (before
    ``on_validation_start``): their start-up is validation's time, not ``other``, and the advice
    names the validation loader."""
    costs = Costs()
    scope = scope_for(tmp_path)
    tr = trainer(pl, tmp_path, [scope], val_check_interval=4)
    tr.fit(model_class(pl)(costs), loader(48, costs), loader(8, costs, what="val_sample", num_workers=2))
    report = scope.report
    assert report is not None
    seconds = report.summary.phase_seconds
    assert seconds["other"] < seconds["validation"]
    starts = scope._session.val_starts.summary()
    assert starts is not None
    assert starts.runs == 3
    assert seconds["validation"] >= starts.total_ns / 1e9
    finding = report.finding("data.persistent_workers")
    assert finding is not None, [f.id for f in report.findings]
    assert finding.suggestion == {"persistent_workers": True, "loader": "val"}
    assert "validation DataLoader" in finding.fix
    assert finding.evidence["respawns"] == 2


def test_the_validation_probe_touch_point(pl: ModuleType, tmp_path: Path) -> None:
    """``attach_validation_probe`` finds the validation loop's ``run`` of the installed Lightning
    (a release that moves it fails here), and a fit leaves nothing behind."""
    tr = trainer(pl, tmp_path, [scope_for(tmp_path)])
    loop = tr.fit_loop.epoch_loop.val_loop
    calls: list[str] = []

    def wrap(original: Any) -> Any:
        def run(*args: Any, **kwargs: Any) -> Any:
            calls.append("run")
            return original(*args, **kwargs)

        return run

    undo = lightning_hooks.attach_validation_probe(tr, wrap)
    assert "run" in vars(loop), "trainer.fit_loop.epoch_loop.val_loop.run moved: StallScope needs an update"
    undo()
    assert "run" not in vars(loop)
    costs = Costs()
    tr.fit(model_class(pl)(costs), loader(16, costs), loader(8, costs, what="val_sample"))
    assert "run" not in vars(loop)
    assert costs.counts["val_step"] == 2
