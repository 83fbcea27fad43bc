"""``StallScope`` as a Lightning callback (``stallscope/hooks/lightning.py``), with real Trainers.

Attribution tests drive StallScope's clock by hand: every planted cost (a sample's loading, the
batch transfer, the step, a validation batch, a checkpoint save, a logger call, another callback)
advances a ``FakeClock`` by a known amount and nothing else moves it, so each phase's total must
equal what was planted in it, exactly. The cross-check with Lightning's SimpleProfiler uses real
time. Both namespaces (``lightning.pytorch`` and ``pytorch_lightning``) run where it matters.
"""

from __future__ import annotations

import csv
import functools
import gc
import importlib
import io
import json
import subprocess
import sys
import textwrap
from collections import Counter
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import torch
from conftest import FakeClock, notes_but_the_hosts
from rich.console import Console
from torch import nn
from torch.utils.data import DataLoader, Dataset

from stallscope import StallScope
from stallscope.hooks import lightning as lightning_hooks
from stallscope.hooks.lightning import attach_fetch_probe, attach_step_probe, call_after, call_before
from stallscope.hooks.session import Session
from stallscope.report.io import REPORT_NAME
from stallscope.report.writer import ReportWriter
from stallscope.timeline import recorder
from stallscope.timeline.recorder import Timeline

NAMESPACES = ["lightning", "pytorch_lightning"]

#: Lightning 2.6 builds torch's ``LeafSpec``, which torch 2.13 deprecates; harmless here
LEAFSPEC_DEPRECATION = r"ignore:.isinstance.treespec, LeafSpec.. is deprecated:FutureWarning"
pytestmark = pytest.mark.filterwarnings(LEAFSPEC_DEPRECATION)
MS = 1_000_000
FETCH_NEXT = "[_TrainingEpochLoop].train_dataloader_next"


def import_pl(namespace: str) -> ModuleType:
    return importlib.import_module("lightning.pytorch" if namespace == "lightning" else "pytorch_lightning")


@pytest.fixture(params=NAMESPACES)
def pl(request: pytest.FixtureRequest) -> ModuleType:
    """The Lightning package under test (``lightning.pytorch`` or ``pytorch_lightning``)."""
    return import_pl(request.param)


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch, clock: FakeClock, cpu_clock: FakeClock) -> FakeClock:
    """Every fit's session reads ``clock`` (and ``cpu_clock``) instead of real time."""
    monkeypatch.setattr(lightning_hooks, "Session", functools.partial(Session, clock=clock, cpu_clock=cpu_clock))
    return clock


# -- a tiny model whose costs are planted -------------------------------------------------------


class Costs:
    """Milliseconds each planted cost advances ``clock`` by (None: no fake clock, no cost)."""

    def __init__(self, clock: FakeClock | None = None, **ms: float) -> None:
        self.clock = clock
        self.ms = ms
        self.counts: Counter[str] = Counter()

    def spend(self, what: str) -> None:
        self.counts[what] += 1
        if self.clock is not None:
            self.clock.advance_ms(self.ms.get(what, 0.0))


class Samples(Dataset[tuple[torch.Tensor, torch.Tensor]]):
    def __init__(self, n: int, costs: Costs, what: str = "sample") -> None:
        gen = torch.Generator().manual_seed(0)
        self.x = torch.randn(n, 8, generator=gen)
        self.y = torch.randint(0, 2, (n,), generator=gen)
        self.costs = costs
        self.what = what

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        self.costs.spend(self.what)
        return self.x[i], self.y[i]


@functools.cache
def tiny_class(pl: ModuleType) -> type[Any]:
    class Tiny(pl.LightningModule):  # type: ignore[misc,name-defined]
        def __init__(self, costs: Costs, fail_at: int | None = None) -> None:
            super().__init__()
            self.layer = nn.Linear(8, 2)
            self.costs = costs
            self.fail_at = fail_at
            self.failure = ValueError("planted failure in training_step")

        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            if batch_idx == self.fail_at:
                raise self.failure
            self.costs.spend("step")
            x, y = batch
            loss = nn.functional.cross_entropy(self.layer(x), y)
            self.log("train_loss", loss)
            return loss

        def validation_step(self, batch: Any, batch_idx: int) -> None:
            self.costs.spend("val_step")
            x, y = batch
            self.log("val_loss", nn.functional.cross_entropy(self.layer(x), y))

        def transfer_batch_to_device(self, batch: Any, device: torch.device, dataloader_idx: int) -> Any:
            self.costs.spend("transfer")
            return super().transfer_batch_to_device(batch, device, dataloader_idx)

        def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
            self.costs.spend("save")

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.SGD(self.parameters(), lr=0.1)

    return Tiny


@functools.cache
def logger_class(pl: ModuleType) -> type[Any]:
    class CostlyLogger(pl.loggers.Logger):  # type: ignore[misc,name-defined]
        """A logger whose ``log_metrics`` costs ``log`` ms; it records what it was given."""

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
            self.costs.spend("hparams")

        def log_metrics(self, metrics: dict[str, float], step: int | None = None) -> None:
            self.costs.spend("log")
            self.metrics.append(dict(metrics))

        def save(self) -> None:
            self.costs.spend("logger_save")

        def finalize(self, status: str) -> None:
            return None  # the base class saves once more here, after the fit (and its report) ended

    return CostlyLogger


@functools.cache
def after_class(pl: ModuleType) -> type[Any]:
    class AfterEachBatch(pl.Callback):  # type: ignore[misc,name-defined]
        """Another user callback, listed after StallScope: its batch-end work is ``other``."""

        def __init__(self, costs: Costs) -> None:
            self.costs = costs

        def on_train_batch_end(self, *args: Any) -> None:
            self.costs.spend("callback")

    return AfterEachBatch


def loader(n: int, costs: Costs, *, batch_size: int = 4, what: str = "sample", **kwargs: Any) -> DataLoader[Any]:
    return DataLoader(Samples(n, costs, what), batch_size=batch_size, **kwargs)


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


def on_disk(tmp_path: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((tmp_path / "scope" / REPORT_NAME).read_text(encoding="utf-8"))
    return data


def probes_left(tr: Any) -> list[str]:
    """Wrappers StallScope left on the trainer's objects (there must be none after a fit)."""
    probed = ("_on_before_fetch", "_on_after_fetch", "update_lr_schedulers")
    left = [name for name in probed if name in vars(tr.fit_loop.epoch_loop)]
    left += ["on_batch_start"] if "on_batch_start" in vars(tr._logger_connector) else []
    left += ["save_checkpoint"] if "save_checkpoint" in vars(tr) else []
    left += ["checkpoint_io.save_checkpoint"] if "save_checkpoint" in vars(tr.strategy.checkpoint_io) else []
    for logger in tr.loggers:
        left += [f"{type(logger).__name__}.{n}" for n in lightning_hooks.LOGGER_METHODS if n in vars(logger)]
    for callback in tr.callbacks:  # a fit's own step hooks on the scope
        if isinstance(callback, StallScope):
            left += [n for n in ("on_train_batch_start", "on_train_batch_end") if n in vars(callback)]
    return left


# -- one object, both namespaces, no import -----------------------------------------------------


def test_import_and_plain_loop_work_without_lightning() -> None:
    code = textwrap.dedent(
        """
        import sys
        class Block:
            def find_spec(self, name, path=None, target=None):
                if name.split(".")[0] in ("lightning", "pytorch_lightning", "lightning_fabric"):
                    raise ImportError(f"blocked {name}")
        sys.meta_path.insert(0, Block())
        import stallscope
        assert not any(m.split(".")[0] in ("lightning", "pytorch_lightning") for m in sys.modules)
        with stallscope.StallScope(None, console=False) as scope:
            for item in scope.iter(range(8)):
                with scope.phase("compute"):
                    pass
        assert scope.report.summary.steps == 8
        print("ok")
        """
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"


#: hooks Lightning calls without checking ``callable()`` first: they must be real methods
DIRECT_HOOKS = {"on_save_checkpoint", "on_load_checkpoint"}


def test_callback_interface_matches_installed_callback(pl: ModuleType) -> None:
    """Every member of the installed ``Callback`` is either implemented with parameters Lightning
    can pass, or an ``on_*`` hook StallScope does not need, which reads as None so that Lightning's
    dispatcher skips it (it calls a hook only when ``callable``). A hook Lightning calls directly
    must be implemented; a change in how Lightning dispatches fails here first."""
    import inspect

    gc.collect()  # an earlier test's scope of the same folder, not collected yet, would hold its key
    scope = StallScope(None, console=False)
    skipped = []
    for name, member in vars(pl.Callback).items():
        if name.startswith("__"):
            continue
        ours = inspect.getattr_static(StallScope, name, None)
        if ours is None or (name.startswith("on_") and not callable(ours)):
            assert name.startswith("on_"), f"StallScope lacks Callback.{name} of {pl.__name__} {pl.__version__}"
            assert name not in DIRECT_HOOKS
            assert getattr(scope, name) is None
            skipped.append(name)
            continue
        if callable(member):
            theirs = list(inspect.signature(member).parameters)
            mine = list(inspect.signature(ours).parameters)
            assert mine[: len(theirs)] == theirs, f"{name}: {mine} vs {theirs}"
    assert "on_before_backward" in skipped  # per-step hooks we do not need are not called
    assert "on_train_batch_start" not in skipped
    # Lightning's dispatcher still looks hooks up with callable(): skipping relies on it
    source = inspect.getsource(pl.trainer.call._call_callback_hooks)
    assert "callable(fn)" in source
    for hook in DIRECT_HOOKS:
        assert f"callback.{hook}(" in inspect.getsource(pl.trainer.call), hook
    assert scope.state_key == "StallScope{'report_dir': None}"  # one per report folder
    assert StallScope(console=False).state_key == "StallScope"  # the default folder: the class name

    class MyScope(StallScope):
        pass

    assert MyScope(None, console=False).state_key.endswith("<locals>.MyScope{'report_dir': None}")
    assert scope.state_dict() == {}
    with pytest.raises(AttributeError, match="no_such_attribute"):
        _ = scope.no_such_attribute
    # no Python class in the MRO turns every attribute read (Lightning's dispatcher reads six
    # hooks a step) into a call: the C base's reads are tested in test_native.py
    for cls in type(scope).__mro__:
        if cls is object or cls.__module__.endswith("._native"):
            continue
        assert "__getattr__" not in vars(cls), cls
        assert "__getattribute__" not in vars(cls), cls


def test_a_hook_a_later_lightning_adds_reads_as_none(pl: ModuleType, tmp_path: Path, monkeypatch: Any) -> None:
    """A hook a later release adds to ``Callback`` must not break a fit: Lightning's dispatcher
    reads every callback's hook with a plain ``getattr``. A scope made after the release is
    imported has it as None; one made before gets it at ``setup``, the first hook of a fit."""
    early = StallScope(tmp_path / "early", console=False)
    calls: list[str] = []

    def on_some_future_hook(self: Any, trainer: Any, pl_module: Any) -> None:
        calls.append(type(self).__name__)

    monkeypatch.setattr(pl.Callback, "on_some_future_hook", on_some_future_hook, raising=False)
    assert StallScope(None, console=False).on_some_future_hook is None
    with pytest.raises(AttributeError):
        _ = early.on_some_future_hook
    tr = trainer(pl, tmp_path, [early, pl.Callback()], max_epochs=1)
    original = tr.fit_loop.on_run_start

    def on_run_start(*args: Any, **kwargs: Any) -> Any:  # where a release would call it
        pl.trainer.call._call_callback_hooks(tr, "on_some_future_hook")
        return original(*args, **kwargs)

    monkeypatch.setattr(tr.fit_loop, "on_run_start", on_run_start)
    costs = Costs()
    tr.fit(tiny_class(pl)(costs), train_dataloaders=loader(32, costs))
    assert calls == ["Callback"]  # the other callback's hook ran; StallScope's was skipped
    assert early.on_some_future_hook is None
    assert early.report.summary.steps == 8


def test_a_mixed_in_callbacks_hooks_are_kept(pl: ModuleType) -> None:
    """Hooks StallScope does not need read as None only where no class of the object defines
    them: a callback mixed in after StallScope keeps its own (a prediction writer's, here)."""

    class Writer(pl.callbacks.BasePredictionWriter):  # type: ignore[misc,name-defined]
        def write_on_batch_end(self, *args: Any) -> None:
            return None

    class WritingScope(StallScope, Writer):
        def __init__(self) -> None:
            StallScope.__init__(self, None, console=False)
            Writer.__init__(self, write_interval="batch")

    scope = WritingScope()
    assert scope.on_predict_batch_end.__func__ is pl.callbacks.BasePredictionWriter.on_predict_batch_end
    assert "on_predict_batch_end" not in vars(scope)
    assert scope.on_before_backward is None  # StallScope's own, ahead of the mixin in the MRO


def test_fetch_probe_touch_point(pl: ModuleType, tmp_path: Path) -> None:
    """The one private touch point: ``attach_fetch_probe`` must see every train ``next()`` exactly
    once, inside the profiler's own interval, and leave nothing behind. If a Lightning release
    moves ``_TrainingEpochLoop._on_before_fetch``/``_on_after_fetch``, this fails loudly."""
    events: list[str] = []
    detachers: list[Any] = []

    def make(start_profiler: Any, stop_profiler: Any) -> tuple[Any, Any]:
        def before() -> None:
            start_profiler()
            events.append("<")

        def after() -> None:
            try:
                events.append(">")
            finally:
                stop_profiler()

        return before, after

    class Probe(pl.Callback):  # type: ignore[misc,name-defined]
        def on_fit_start(self, trainer: Any, pl_module: Any) -> None:
            detachers.append(attach_fetch_probe(trainer, make))

    costs = Costs()
    tr = trainer(pl, tmp_path, [Probe()], max_epochs=2, profiler="simple")
    tr.fit(tiny_class(pl)(costs), loader(20, costs))
    assert events == ["<", ">"] * 10, f"{pl.__name__} {pl.__version__}: the fetch hooks moved ({events[:6]}...)"
    assert len(tr.profiler.recorded_durations[FETCH_NEXT]) == 10  # the profiler still times each next()
    detachers[0]()
    assert "_on_before_fetch" not in vars(tr.fit_loop.epoch_loop)
    assert "_on_after_fetch" not in vars(tr.fit_loop.epoch_loop)


def test_fetch_probe_names_what_moved() -> None:
    class NotATrainer:
        fit_loop = None

    with pytest.raises(RuntimeError, match=r"fit_loop\.epoch_loop\._on_before_fetch"):
        attach_fetch_probe(NotATrainer(), lambda start, stop: (start, stop))


def test_step_probe_touch_points(pl: ModuleType, tmp_path: Path) -> None:
    """Two more private touch points: ``attach_step_probe`` must see where each training step's
    compute begins (after ``batch_to_device``, before the batch-start hooks) and ends (after the
    optimizer step, before the batch-end hooks), once each per training batch, validation
    batches only at the begin point, and leave nothing behind. If a Lightning release moves
    ``_LoggerConnector.on_batch_start`` or ``_TrainingEpochLoop.update_lr_schedulers``, this
    fails loudly."""
    events: list[str] = []
    detachers: list[Any] = []

    class Probe(pl.Callback):  # type: ignore[misc,name-defined]
        def on_fit_start(self, trainer: Any, pl_module: Any) -> None:
            begin = lambda batch: events.append("begin" if trainer.training else "begin(val)")  # noqa: E731
            detachers.append(attach_step_probe(trainer, call_after(begin), call_before(lambda: events.append("end"))))

        def on_train_batch_start(self, *args: Any) -> None:
            events.append("batch_start")

        def on_train_batch_end(self, *args: Any) -> None:
            events.append("batch_end")

        def on_before_optimizer_step(self, *args: Any) -> None:
            events.append("optimizer")

    costs = Costs()
    tr = trainer(pl, tmp_path, [Probe()], limit_val_batches=1, num_sanity_val_steps=0)
    tr.fit(tiny_class(pl)(costs), loader(8, costs), loader(4, costs))
    train = [e for e in events if e != "begin(val)"]
    # each step: begin, the hooks, the optimizer, end (once or more: Lightning steps the schedulers
    # at several points; only the first after a step matters), then the batch-end hooks
    first_step = train[: train.index("batch_end") + 1]
    assert [e for e in first_step if e != "end"] == ["begin", "batch_start", "optimizer", "batch_end"], events
    assert first_step.index("end") > first_step.index("optimizer"), events
    assert train.count("begin") == 2, events
    assert train.count("batch_end") == 2, events
    assert events.count("begin(val)") == 1, events
    detachers[0]()
    assert probes_left(tr) == []


def test_step_probe_names_what_moved() -> None:
    class NotATrainer:
        fit_loop = None

    with pytest.raises(RuntimeError, match=r"_logger_connector\.on_batch_start or .*update_lr_schedulers"):
        attach_step_probe(NotATrainer(), lambda batch: None, lambda: None)


def test_the_c_hooks_take_each_steps_usual_case_alone(
    pl: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where the C module is built, Lightning calls ``_native.StepHook``s, which call the run's
    Python methods only outside the usual case: a few times an epoch, not at every step."""
    if recorder.NATIVE_MODULE is None:
        pytest.skip("the Python twin is in use")
    calls: Counter[str] = Counter()
    for name in ("_fetch_began", "_fetch_ended", "_on_compute_begin", "_on_compute_end"):
        method = getattr(lightning_hooks._FitRun, name)

        def counted(run: Any, *args: Any, _method: Any = method, _name: str = name, **kwargs: Any) -> None:
            calls[_name] += 1
            _method(run, *args, **kwargs)

        monkeypatch.setattr(lightning_hooks._FitRun, name, counted)
    costs = Costs()
    scope = scope_for(tmp_path)
    tr = trainer(pl, tmp_path, [scope], max_epochs=2)
    tr.fit(tiny_class(pl)(costs), loader(64, costs))
    assert scope.report is not None
    assert notes_but_the_hosts(scope.report.notes) == []  # nothing went wrong
    assert scope.report.summary.steps == 32
    # per epoch: its first fetch and step, the loader's end (a fetch that gets nothing)
    assert all(n <= 2 * 2 for n in calls.values()), calls


def test_lightning_does_not_dispatch_the_batch_hooks(tmp_path: Path) -> None:
    """Compute is read at the step probe, so Lightning skips the scope's batch hooks: no profiler
    context is opened for them (SimpleProfiler lists every hook it timed)."""
    pl = import_pl("lightning")
    costs = Costs()
    scope = scope_for(tmp_path)
    tr = trainer(pl, tmp_path, [scope], profiler="simple")
    tr.fit(tiny_class(pl)(costs), loader(16, costs))
    timed = set(tr.profiler.recorded_durations)
    assert f"[Callback]{scope.state_key}.on_train_epoch_start" in timed  # the profiler sees our other hooks
    assert not {name for name in timed if "StallScope.on_train_batch" in name}


def test_compute_is_timed_by_the_batch_hooks_where_the_step_probe_moved(
    pl: ModuleType, tmp_path: Path, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    def moved(trainer: Any, begin: Any, end: Any) -> Any:
        raise RuntimeError("this Lightning (9.9) has no trainer._logger_connector.on_batch_start")

    monkeypatch.setattr(lightning_hooks, "attach_step_probe", moved)
    costs = Costs(clock, step=3)
    scope = scope_for(tmp_path)
    tr = trainer(pl, tmp_path, [scope], profiler="simple")
    tr.fit(tiny_class(pl)(costs), loader(16, costs))
    assert scope.report is not None
    assert scope.report.summary.phase_seconds["compute"] == pytest.approx(4 * 0.003)
    assert any("timed by the batch hooks" in note and "9.9" in note for note in scope.report.notes)
    assert f"[Callback]{scope.state_key}.on_train_batch_start" in tr.profiler.recorded_durations
    assert probes_left(tr) == []


# -- exact attribution --------------------------------------------------------------------------


def test_every_phase_gets_exactly_its_planted_time(pl: ModuleType, tmp_path: Path, clock: FakeClock) -> None:
    costs = Costs(
        clock, sample=1, transfer=2, step=3, val_sample=0.5, val_step=5, save=7, log=11, logger_save=0.25, callback=13
    )
    scope = scope_for(tmp_path)
    checkpoint = pl.callbacks.ModelCheckpoint(dirpath=tmp_path / "ckpt", every_n_train_steps=2, save_top_k=-1)
    logger = logger_class(pl)(costs)
    tr = trainer(
        pl,
        tmp_path,
        [scope, checkpoint, after_class(pl)(costs)],
        logger=logger,
        log_every_n_steps=1,
        val_check_interval=3,
        enable_checkpointing=True,
    )
    tr.fit(tiny_class(pl)(costs), loader(24, costs), loader(8, costs, what="val_sample"))  # 6 train, 2 val batches

    report = scope.report
    assert report is not None
    assert report.complete
    n = costs.counts
    assert n["step"] == 6
    assert n["val_step"] == 4
    assert n["save"] == 3  # steps 2, 4 and 6
    assert n["log"] >= 6
    # a validation run's logger calls (``val_loss`` at its end, then ``save``) are the run's
    val_logs = sum(1 for metrics in logger.metrics if "val_loss" in metrics)
    assert val_logs == 2
    expected_ms = {
        "data": 4 * 1 * 6,  # four samples per train batch
        "h2d": 2 * 6,
        "compute": 3 * 6,
        # its steps, transfers, its own loader and its logger calls
        "validation": n["val_step"] * (5 + 2 + 4 * 0.5) + val_logs * (11 + 0.25),
        "checkpoint": 7 * n["save"],
        "logging": 11 * (n["log"] - val_logs) + 0.25 * (n["logger_save"] - val_logs),
        "other": 13 * 6,
    }
    got_ms = {name: round(s * 1e3, 3) for name, s in report.summary.phase_seconds.items() if s}
    assert got_ms == pytest.approx(expected_ms, abs=1e-3)
    assert sum(report.summary.phase_fractions.values()) == pytest.approx(1.0, abs=1e-5)
    assert report.summary.steps == 6
    assert report.summary.data_wait_s["p10"] == pytest.approx(0.004)

    counts = scope._session.timeline.run_stats().phase_counts
    assert counts["logging"] == n["logger_save"] - val_logs, "one logging entry per burst (log_metrics, then save)"
    assert counts["checkpoint"] == n["save"]
    assert report.run.dataloader == {
        "num_workers": 0,
        "pin_memory": False,
        "prefetch_factor": None,
        "persistent_workers": False,
        "batch_size": 4,
    }
    assert probes_left(tr) == []


def test_sanity_check_is_its_own_phase(tmp_path: Path, clock: FakeClock) -> None:
    pl = import_pl("lightning")
    costs = Costs(clock, val_step=5)
    scope = scope_for(tmp_path)
    tr = trainer(pl, tmp_path, [scope], num_sanity_val_steps=2, check_val_every_n_epoch=2)
    tr.fit(tiny_class(pl)(costs), loader(16, costs), loader(16, costs))
    report = scope.report
    assert report is not None
    assert report.summary.phase_seconds["sanity_check"] == pytest.approx(0.010)
    assert report.summary.phase_seconds["validation"] == 0
    assert not [f for f in report.findings if f.id == "validation.frequency"]


def test_loader_set_up_and_worker_spawn_are_data(tmp_path: Path, clock: FakeClock) -> None:
    """``iter()`` of the train loader (worker start-up) at each epoch start is ``data``, and is the
    epoch boundary the persistent-workers rule reads."""
    pl = import_pl("lightning")
    costs = Costs(clock, iter=40)

    class SlowStart(DataLoader[Any]):
        def __iter__(self) -> Any:
            costs.spend("iter")
            return super().__iter__()

    scope = scope_for(tmp_path)
    tr = trainer(pl, tmp_path, [scope], max_epochs=3)
    tr.fit(tiny_class(pl)(costs), SlowStart(Samples(16, costs), batch_size=4))
    report = scope.report
    assert report is not None
    assert costs.counts["iter"] == 3
    assert report.summary.phase_seconds["data"] == pytest.approx(0.120)
    boundaries = scope._session.timeline.run_stats().boundaries
    assert [b.iter_ns for b in boundaries] == [40 * MS] * 3
    assert [e.summary.steps for e in report.epochs] == [4, 4, 4]


def test_training_step_reading_dataloader_iter(tmp_path: Path, clock: FakeClock) -> None:
    """When ``training_step`` takes ``dataloader_iter``, its ``next()`` calls are data waits inside the step."""
    pl = import_pl("lightning")
    costs = Costs(clock, sample=1, step=3)

    class ReadsItself(tiny_class(pl)):  # type: ignore[misc]
        def training_step(self, dataloader_iter: Any) -> torch.Tensor:
            (x, y), _, _ = next(dataloader_iter)
            self.costs.spend("step")
            return nn.functional.cross_entropy(self.layer(x), y)

    scope = scope_for(tmp_path)
    tr = trainer(pl, tmp_path, [scope])
    tr.fit(ReadsItself(costs), loader(20, costs))
    report = scope.report
    assert report is not None
    assert report.summary.steps == 5
    assert report.summary.phase_seconds["data"] == pytest.approx(0.020)
    assert report.summary.phase_seconds["compute"] == pytest.approx(0.015)


# -- cross-check with the user's profiler -------------------------------------------------------


def _profiled_fit(pl: ModuleType, tmp_path: Path, callbacks: list[Any]) -> Any:
    costs = Costs()

    class Starved(Samples):
        def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
            end = __import__("time").perf_counter() + 0.0005  # preprocessing: 0.5 ms of CPU per sample
            while __import__("time").perf_counter() < end:
                pass
            return super().__getitem__(i)

    tr = trainer(pl, tmp_path, callbacks, max_epochs=2, profiler="simple")
    tr.fit(tiny_class(pl)(costs), DataLoader(Starved(96, costs), batch_size=8))
    return tr


def test_data_wait_agrees_with_simple_profiler(pl: ModuleType, tmp_path: Path) -> None:
    scope = scope_for(tmp_path)
    tr = _profiled_fit(pl, tmp_path, [scope])
    report = scope.report
    assert report is not None
    ours = sum(e.summary.data_wait_s["mean"] * e.summary.steps for e in report.epochs)
    theirs = sum(tr.profiler.recorded_durations[FETCH_NEXT])
    assert len(tr.profiler.recorded_durations[FETCH_NEXT]) == report.summary.steps == 24
    assert abs(ours - theirs) <= 0.10 * theirs, f"StallScope {ours:.4f} s vs SimpleProfiler {theirs:.4f} s"


def test_simple_profiler_output_is_unchanged(tmp_path: Path) -> None:
    pl = import_pl("lightning")
    without = _profiled_fit(pl, tmp_path / "a", [])
    with_scope = _profiled_fit(pl, tmp_path / "b", [scope_for(tmp_path)])
    ours = {k: len(v) for k, v in with_scope.profiler.recorded_durations.items() if "StallScope" not in k}
    theirs = {k: len(v) for k, v in without.profiler.recorded_durations.items()}
    assert ours == theirs
    assert FETCH_NEXT in with_scope.profiler.summary()


# -- diagnosis, printing, reports, loggers ------------------------------------------------------


def test_prints_each_epoch_and_writes_reports(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """With ``print_interval_s=0`` every diagnosis's panel is printed: these epochs are too short
    to judge, so they are diagnosed together at the fit's end, in its panel; with no wait between
    writes (``max_interval_s=0``) every epoch's report is on disk when the next callback's epoch
    end runs."""
    from stallscope.hooks import session as session_module

    monkeypatch.setattr(session_module, "ReportWriter", functools.partial(ReportWriter, max_interval_s=0.0))
    pl = import_pl("lightning")
    out = Console(file=io.StringIO(), width=100)
    seen: list[tuple[int, bool, int]] = []

    class ReadsReport(pl.Callback):  # listed after StallScope: sees the report of the epoch that just ended
        def on_train_epoch_end(self, trainer: Any, pl_module: Any) -> None:
            data = on_disk(tmp_path)
            seen.append((trainer.current_epoch, data["complete"], len(data["epochs"])))

    costs = Costs()
    scope = scope_for(tmp_path, console=out, print_interval_s=0)
    tr = trainer(pl, tmp_path, [scope, ReadsReport()], max_epochs=2)
    tr.fit(tiny_class(pl)(costs), loader(16, costs))
    text = out.file.getvalue()
    assert "StallScope · epoch" not in text
    assert "StallScope · run (2 epochs)" in text
    assert seen == [(0, False, 1), (1, False, 2)]
    final = on_disk(tmp_path)
    assert final["complete"] is True
    assert final["run"]["framework"] == "lightning"
    assert [(e.get("diagnosed_with"), e.get("covers_epochs")) for e in final["epochs"]] == [(1, None), (None, [0, 1])]


def test_epochs_long_enough_are_printed_each_at_its_end(tmp_path: Path, clock: FakeClock) -> None:
    """Epochs of 40 steps of 30 ms on the fake clock: each is long enough to judge alone, so each
    has its findings and its panel at its end, as it always had."""
    pl = import_pl("lightning")
    out = Console(file=io.StringIO(), width=100)
    costs = Costs(clock, step=30)
    scope = scope_for(tmp_path, console=out, print_interval_s=0)
    tr = trainer(pl, tmp_path, [scope], max_epochs=2)
    tr.fit(tiny_class(pl)(costs), loader(160, costs))
    text = out.file.getvalue()
    assert "StallScope · epoch 0" in text
    assert "StallScope · epoch 1" in text
    final = on_disk(tmp_path)
    assert [(e.get("diagnosed_with"), e.get("covers_epochs")) for e in final["epochs"]] == [(None, None)] * 2


@pytest.mark.parametrize("bar", ["TQDMProgressBar", "RichProgressBar"])
def test_prints_through_progress_bars(tmp_path: Path, capsys: pytest.CaptureFixture[str], bar: str) -> None:
    pl = import_pl("lightning")
    costs = Costs()
    scope = scope_for(tmp_path, console=True, print_interval_s=0)
    tr = trainer(pl, tmp_path, [scope, getattr(pl.callbacks, bar)()], enable_progress_bar=True, max_epochs=2)
    tr.fit(tiny_class(pl)(costs), loader(16, costs))
    out = capsys.readouterr().out
    assert "StallScope · run (2 epochs)" in out  # its epochs too short to judge: one panel, at the end
    assert tr.global_step == 8


def test_diagnosis_names_lightning_arguments(tmp_path: Path, clock: FakeClock) -> None:
    """Logging every step with a costly logger: the fix names Trainer arguments
    (``Trainer(log_every_n_steps=...)``, or ``Trainer(logger=BackgroundLogger(...), log_every_n_steps=...)``
    for a logger that waits: on the fake clock the process is idle while it does)."""
    pl = import_pl("lightning")
    costs = Costs(clock, sample=0.25, step=2, log=6)
    scope = scope_for(tmp_path)
    tr = trainer(pl, tmp_path, [scope], logger=logger_class(pl)(costs), log_every_n_steps=1)
    tr.fit(tiny_class(pl)(costs), loader(80, costs))
    report = scope.report
    assert report is not None
    top = report.findings[0]
    assert top.id == "logging.frequency"
    assert "Trainer(" in top.snippet
    assert f"log_every_n_steps={top.suggestion['log_every_n_steps']})" in top.snippet
    assert top.suggestion["log_every_n_steps"] > 1
    assert report.run.framework == "lightning"


def test_headline_numbers_reach_the_loggers(pl: ModuleType, tmp_path: Path) -> None:
    costs = Costs()
    scope = scope_for(tmp_path)
    csv_logger = pl.loggers.CSVLogger(tmp_path / "logs", name="run")
    tr = trainer(pl, tmp_path, [scope], max_epochs=2, logger=csv_logger, log_every_n_steps=1)
    tr.fit(tiny_class(pl)(costs), loader(16, costs))
    with open(Path(csv_logger.log_dir) / "metrics.csv", encoding="utf-8") as fh:
        rows = list(csv.DictReader(fh))
    headline = [r for r in rows if r.get("stallscope/gpu_idle_fraction")]
    assert len(headline) == 2  # one per epoch
    for row in headline:
        for name in ("gpu_idle_fraction", "data_fraction", "compute_fraction"):
            assert 0.0 <= float(row[f"stallscope/{name}"]) <= 1.0
        assert float(row["stallscope/steps_per_s"]) > 0
    assert len([r for r in rows if r.get("train_loss")]) == 8  # the user's own metrics still arrive
    assert tr.callback_metrics["stallscope/gpu_idle_fraction"] == pytest.approx(
        scope.report.epochs[-1].summary.gpu_idle_fraction, abs=1e-6
    )


def test_many_short_epochs_keep_every_epoch_and_log_once_per_epoch(pl: ModuleType, tmp_path: Path) -> None:
    """Thirty epochs of four tiny steps with the default budget: whatever was printed or written
    mid-run, the loggers get the headline numbers once per epoch and the final report has every
    epoch, each with its summary."""
    epochs = 30
    costs = Costs()
    scope = scope_for(tmp_path)
    csv_logger = pl.loggers.CSVLogger(tmp_path / "logs", name="run")
    tr = trainer(pl, tmp_path, [scope], max_epochs=epochs, logger=csv_logger, log_every_n_steps=50)
    tr.fit(tiny_class(pl)(costs), loader(16, costs))
    with open(Path(csv_logger.log_dir) / "metrics.csv", encoding="utf-8") as fh:
        rows = list(csv.DictReader(fh))
    headline = [r for r in rows if r.get("stallscope/gpu_idle_fraction")]
    assert [int(r["epoch"]) for r in headline] == list(range(epochs))
    final = on_disk(tmp_path)
    assert final["complete"] is True
    assert [e["index"] for e in final["epochs"]] == list(range(epochs))
    assert all(e["summary"]["steps"] == 4 for e in final["epochs"])
    assert final["summary"]["steps"] == 4 * epochs


@pytest.mark.parametrize("logged", [False, True])
def test_short_epochs_wait_only_when_no_headline_is_logged(
    pl: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, clock: FakeClock, logged: bool
) -> None:
    """Without a logger the ends of short epochs mark them and a later end closes them (the
    final report still has every epoch, in order, each with its steps); with one, each epoch's
    headline numbers are logged at its end, so every epoch is closed at its end. Epochs of 4 ms
    on the fake clock: short whatever the machine's load (on real time, a busy machine made them
    long enough that their ends did not wait)."""
    marked: list[bool] = []
    real = Timeline.mark_epoch

    def counting(self: Timeline, *args: Any, **kwargs: Any) -> bool:
        marked.append(real(self, *args, **kwargs))
        return marked[-1]

    monkeypatch.setattr(Timeline, "mark_epoch", counting)
    epochs = 12
    costs = Costs(clock, step=1)
    scope = scope_for(tmp_path)
    logger = pl.loggers.CSVLogger(tmp_path / "logs", name="run") if logged else False
    tr = trainer(pl, tmp_path, [scope], max_epochs=epochs, logger=logger, log_every_n_steps=50)
    tr.fit(tiny_class(pl)(costs), loader(16, costs))
    final = on_disk(tmp_path)
    assert [e["index"] for e in final["epochs"]] == list(range(epochs))
    assert all(e["summary"]["steps"] == 4 for e in final["epochs"])
    assert final["summary"]["steps"] == 4 * epochs
    if logged:
        assert marked == []
    else:
        assert sum(marked) >= epochs // 2


def test_each_logger_call_is_measured_and_a_failing_one_still_ends(
    pl: ModuleType, tmp_path: Path, clock: FakeClock
) -> None:
    """Every call to the Trainer's logger is measured: 3 ms of wall time each on the fake clock,
    no CPU (the fake CPU clock stands still), so the calls read as waiting. A logger that raises
    is measured too, and its exception reaches the caller unchanged."""
    costs = Costs(clock, log=3)
    scope = scope_for(tmp_path)
    logger = logger_class(pl)(costs)
    tr = trainer(pl, tmp_path, [scope], logger=logger, log_every_n_steps=1)
    tr.fit(tiny_class(pl)(costs), loader(16, costs))
    measured = scope._session.logging_calls.summary()
    assert measured is not None
    assert costs.counts["log"] >= 4  # one a step
    assert measured.wall_ns == costs.counts["log"] * 3_000_000  # save and hyperparameters: no time
    assert measured.calls >= costs.counts["log"]
    assert measured.cpu_ns == 0

    class Down(logger_class(pl)):  # type: ignore[misc]
        def log_metrics(self, metrics: dict[str, float], step: int | None = None) -> None:
            super().log_metrics(metrics, step)
            raise ConnectionError("tracker down")

    failing = scope_for(tmp_path / "down")
    tr = trainer(pl, tmp_path / "down", [failing], logger=Down(costs), log_every_n_steps=1)
    with pytest.raises(ConnectionError, match="tracker down"):
        tr.fit(tiny_class(pl)(costs), loader(16, costs))
    down = failing._session.logging_calls.summary()
    assert down is not None
    assert down.wall_ns == 3_000_000  # the one call, ended although it raised


def test_the_train_loader_is_read_at_the_first_epoch_not_at_every_one(
    pl: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Six short epochs over one train loader: its settings and first batch are read once (an
    epoch start of many short epochs need not pay for them again); the report still has them."""
    counted: list[object] = []
    real = lightning_hooks.count_tensors

    def counting(batch: object) -> int | None:
        counted.append(batch)
        return real(batch)

    monkeypatch.setattr(lightning_hooks, "count_tensors", counting)
    costs = Costs()
    scope = scope_for(tmp_path)
    tr = trainer(pl, tmp_path, [scope], max_epochs=6)
    tr.fit(tiny_class(pl)(costs), loader(16, costs))
    assert len(counted) == 1
    final = on_disk(tmp_path)
    assert len(final["epochs"]) == 6
    assert final["run"]["dataloader"]["batch_size"] is not None


def test_a_subclass_hook_still_runs_and_the_step_is_still_timed(
    pl: ModuleType, tmp_path: Path, clock: FakeClock
) -> None:
    """During a fit the per-step hooks are the run's own methods, set on the scope; a subclass
    that overrides one keeps it, and reaches the run through ``super()``."""
    seen: list[int] = []

    class Counting(StallScope):
        def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
            seen.append(batch_idx)
            super().on_train_batch_end(trainer, pl_module, outputs, batch, batch_idx)

    costs = Costs(clock, step=3)
    scope = Counting(tmp_path / "scope", console=False)
    tr = trainer(pl, tmp_path, [scope])
    tr.fit(tiny_class(pl)(costs), loader(16, costs))
    assert seen == [0, 1, 2, 3]
    assert "on_train_batch_end" not in vars(scope)
    assert probes_left(tr) == []
    assert scope.report is not None
    assert scope.report.summary.phase_seconds["compute"] == pytest.approx(4 * 0.003)


def test_a_hook_set_on_the_instance_is_kept(pl: ModuleType, tmp_path: Path) -> None:
    seen: list[int] = []
    scope = scope_for(tmp_path)
    scope.on_train_batch_end = lambda trainer, pl_module, outputs, batch, batch_idx: seen.append(batch_idx)
    tr = trainer(pl, tmp_path, [scope])
    tr.fit(tiny_class(pl)(Costs()), loader(16, Costs()))
    assert seen == [0, 1, 2, 3]
    assert "on_train_batch_end" in vars(scope)  # still the user's
    assert "on_train_batch_start" not in vars(scope)


def test_a_monitor_on_a_headline_number_works_without_loggers(pl: ModuleType, tmp_path: Path) -> None:
    """No logger, but EarlyStopping watches ``stallscope/steps_per_s``: the numbers are logged
    (the monitor reads ``callback_metrics``), so the fit runs instead of failing on a missing
    metric."""
    scope = scope_for(tmp_path)
    stop = pl.callbacks.EarlyStopping(monitor="stallscope/steps_per_s", mode="max", patience=5)
    tr = trainer(pl, tmp_path, [scope, stop], max_epochs=2)
    tr.fit(tiny_class(pl)(Costs()), loader(16, Costs()))
    assert tr.current_epoch == 2
    assert float(tr.callback_metrics["stallscope/steps_per_s"]) > 0


def test_no_headline_numbers_without_loggers(pl: ModuleType, tmp_path: Path) -> None:
    """``logger=False``: nothing to send the headline numbers to, so ``self.log`` (about a
    millisecond per new key in Lightning) is not called; the report still has them."""
    scope = scope_for(tmp_path)
    tr = trainer(pl, tmp_path, [scope], max_epochs=2)
    tr.fit(tiny_class(pl)(Costs()), loader(16, Costs()))
    assert not [key for key in tr.callback_metrics if key.startswith("stallscope/")]
    assert scope.report is not None
    assert len(scope.report.epochs) == 2


# -- plays well with others ---------------------------------------------------------------------


def test_other_callbacks_see_the_same_hooks(tmp_path: Path) -> None:
    pl = import_pl("lightning")
    calls: list[Counter[str]] = []

    def run(with_scope: bool) -> None:
        seen: Counter[str] = Counter()

        class Counting(pl.Callback):  # type: ignore[misc,name-defined]
            def __getattribute__(self, name: str) -> Any:
                if name.startswith("on_") or name in ("setup", "teardown"):
                    seen[name] += 1
                return super().__getattribute__(name)

        costs = Costs()
        callbacks = [scope_for(tmp_path)] if with_scope else []
        tr = trainer(pl, tmp_path, [*callbacks, Counting()], max_epochs=2)
        tr.fit(tiny_class(pl)(costs), loader(16, costs), loader(8, costs))
        calls.append(seen)

    run(False)
    run(True)
    assert calls[0] == calls[1]


def test_fast_dev_run(tmp_path: Path) -> None:
    pl = import_pl("lightning")
    costs = Costs()
    scope = scope_for(tmp_path)
    tr = trainer(pl, tmp_path, [scope], fast_dev_run=True)
    tr.fit(tiny_class(pl)(costs), loader(40, costs), loader(8, costs))
    report = scope.report
    assert report is not None
    assert report.complete
    assert report.summary.steps == 1
    assert any("fast_dev_run" in note for note in report.notes)


def test_limit_train_batches(tmp_path: Path) -> None:
    pl = import_pl("lightning")
    costs = Costs()
    scope = scope_for(tmp_path)
    tr = trainer(pl, tmp_path, [scope], max_epochs=2, limit_train_batches=3)
    tr.fit(tiny_class(pl)(costs), loader(40, costs))
    report = scope.report
    assert report is not None
    assert [e.summary.steps for e in report.epochs] == [3, 3]
    assert scope._session.batches_per_epoch == 3


def test_repeated_fit_on_the_same_trainer_and_scope(pl: ModuleType, tmp_path: Path) -> None:
    costs = Costs()
    scope = scope_for(tmp_path)
    tr = trainer(pl, tmp_path, [scope], logger=pl.loggers.CSVLogger(tmp_path / "logs"))
    model = tiny_class(pl)(costs)
    tr.fit(model, loader(16, costs))
    assert scope.report is not None
    assert scope.report.summary.steps == 4
    assert probes_left(tr) == []
    tr.fit_loop.max_epochs = 3
    tr.fit(model, loader(16, costs))  # continues: epochs 1 and 2
    report = scope.report
    assert report is not None
    assert report.complete
    assert [e.summary.steps for e in report.epochs] == [4, 4]
    assert probes_left(tr) == []
    assert on_disk(tmp_path)["summary"]["steps"] == 8
    assert not [note for note in report.notes if "turned itself off" in note]


def test_resume_from_checkpoint(tmp_path: Path) -> None:
    pl = import_pl("lightning")
    costs = Costs()
    checkpoint = pl.callbacks.ModelCheckpoint(dirpath=tmp_path / "ckpt", save_last=True)
    tr = trainer(pl, tmp_path, [scope_for(tmp_path), checkpoint], enable_checkpointing=True)
    tr.fit(tiny_class(pl)(costs), loader(16, costs))
    scope = scope_for(tmp_path)
    tr = trainer(pl, tmp_path, [scope], max_epochs=3)
    tr.fit(tiny_class(pl)(costs), loader(16, costs), ckpt_path=checkpoint.last_model_path)
    report = scope.report
    assert report is not None
    assert report.complete
    assert [e.summary.steps for e in report.epochs] == [4, 4]
    assert tr.current_epoch == 3


def test_validate_outside_fit_is_not_observed(tmp_path: Path) -> None:
    pl = import_pl("lightning")
    costs = Costs()
    scope = scope_for(tmp_path)
    tr = trainer(pl, tmp_path, [scope])
    tr.validate(tiny_class(pl)(costs), loader(8, costs), verbose=False)
    assert not (tmp_path / "scope" / REPORT_NAME).exists()
    assert scope.report is None


# -- never hurt the run -------------------------------------------------------------------------


def test_user_exception_propagates_unchanged_and_report_is_written(pl: ModuleType, tmp_path: Path) -> None:
    costs = Costs()
    scope = scope_for(tmp_path)
    tr = trainer(pl, tmp_path, [scope], logger=pl.loggers.CSVLogger(tmp_path / "logs"))
    model = tiny_class(pl)(costs, fail_at=2)
    with pytest.raises(ValueError, match="planted failure") as raised:
        tr.fit(model, loader(40, costs))
    assert raised.value is model.failure
    assert scope.report is not None
    assert scope.report.complete
    data = on_disk(tmp_path)
    assert data["complete"] is True
    assert data["summary"]["steps"] == 3  # two finished steps and the one that raised
    assert any("ValueError: planted failure" in note for note in data["notes"])
    assert probes_left(tr) == []


#: the per-step fast paths, by the hook Lightning calls: where the C module is built, a
#: ``_native.StepHook`` takes the usual case (its kind); else a ``_FitRun`` method makes the
#: timeline call
_FAST_PATHS = {
    "_on_fetch_begin": ("FETCH_BEGIN", "_fetch_began", "Timeline.data_begin"),
    "_on_fetch_end": ("FETCH_END", "_fetch_ended", "Timeline.data_end"),
    "_on_compute_begin": ("COMPUTE_BEGIN", "_on_compute_begin", "Timeline.switch"),
    "_on_compute_end": ("COMPUTE_END", "_on_compute_end", "Timeline.leave"),
}


def _break_fast_path(monkeypatch: pytest.MonkeyPatch, caller: str, failed: list[str | None]) -> str:
    """Make the usual case of Lightning's hook ``caller`` fail once; returns where it fails."""
    kind, method, where = _FAST_PATHS[caller]
    native = recorder.NATIVE_MODULE
    if native is None:  # the Python method: the timeline call fails when it makes it
        name = where.split(".")[1]
        original = getattr(Timeline, name)

        def broken(*args: Any, **kwargs: Any) -> Any:
            if sys._getframe(1).f_code.co_name == method:
                failed.append(caller)
                raise RuntimeError(f"injected in {where}")
            return original(*args, **kwargs)

        monkeypatch.setattr(Timeline, name, broken)
        return where
    # the StepHook: the clock it reads in the usual case fails (the slow path reads the timeline's)
    make = lightning_hooks._FitRun._native_hook
    where = f"StepHook {kind}"

    def hook(run: Any, hook_kind: int, inner: Any, slow: Any) -> Any:
        if hook_kind != getattr(native, kind):
            return make(run, hook_kind, inner, slow)
        real = run.timeline._clock

        def clock() -> int:
            if not failed:
                failed.append(caller)
                raise RuntimeError(f"injected in {where}")
            return int(real())

        run.timeline._clock = clock  # the hook keeps the clock it was built with
        try:
            return make(run, hook_kind, inner, slow)
        finally:
            run.timeline._clock = real

    monkeypatch.setattr(lightning_hooks._FitRun, "_native_hook", hook)
    return where


@pytest.mark.parametrize(
    ("where", "caller"),
    [
        ("_FitRun.fetch_begin", None),  # an epoch's first fetch
        # the per-step fast paths: they fail only in their usual case
        ("", "_on_fetch_end"),
        ("", "_on_compute_begin"),
        ("", "_on_compute_end"),
        ("", "_on_fetch_begin"),
        ("_FitRun.lazy_begin", None),
        ("_FitRun.epoch_end", None),
        ("_FitRun.fit_start", None),
    ],
)
def test_internal_error_turns_the_scope_off_and_training_goes_on(
    pl: ModuleType,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    where: str,
    caller: str | None,
) -> None:
    failed: list[str | None] = []
    if caller is not None:
        where = _break_fast_path(monkeypatch, caller, failed)
    else:
        name = where.split(".")[1]

        def broken(*args: Any, **kwargs: Any) -> Any:
            failed.append(caller)
            raise RuntimeError(f"injected in {where}")

        monkeypatch.setattr(lightning_hooks._FitRun, name, broken)
    costs = Costs()
    scope = scope_for(tmp_path)
    csv_logger = pl.loggers.CSVLogger(tmp_path / "logs", name="run")
    # SimpleProfiler raises on a stop without its start: the fetch hooks must keep them paired
    tr = trainer(pl, tmp_path, [scope], max_epochs=2, logger=csv_logger, log_every_n_steps=1, profiler="simple")
    tr.fit(tiny_class(pl)(costs), loader(16, costs))
    assert failed == [caller]  # it failed once, where meant to, and the scope was off after
    assert tr.global_step == 8
    assert costs.counts["step"] == 8
    assert len(tr.profiler.recorded_durations[FETCH_NEXT]) == 8  # each batch's next(), timed as before
    assert not scope.enabled
    assert "turned itself off" in capsys.readouterr().err
    data = on_disk(tmp_path)
    assert any(f"injected in {where}" in note for note in data["notes"])
    assert probes_left(tr) == []
    with open(Path(csv_logger.log_dir) / "metrics.csv", encoding="utf-8") as fh:
        assert len([r for r in csv.DictReader(fh) if r.get("train_loss")]) == 8


def test_loader_exception_propagates_unchanged(tmp_path: Path) -> None:
    pl = import_pl("lightning")
    failure = OSError("planted read error")

    class Breaks(Samples):
        def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
            if i == 9:
                raise failure
            return super().__getitem__(i)

    costs = Costs()
    scope = scope_for(tmp_path)
    tr = trainer(pl, tmp_path, [scope])
    with pytest.raises(OSError, match="planted read error") as raised:
        tr.fit(tiny_class(pl)(costs), DataLoader(Breaks(40, costs), batch_size=4))
    assert raised.value is failure
    data = on_disk(tmp_path)
    assert data["complete"] is True
    assert any("OSError: planted read error" in note for note in data["notes"])
    assert probes_left(tr) == []


def test_each_write_of_the_checkpoint_io_is_measured(tmp_path: Path, clock: FakeClock) -> None:
    """The checkpoint IO's ``save_checkpoint`` (what ``AsyncCheckpointIO`` would move to its
    thread) is metered: one measurement per file written, its bytes, and the copy probed once
    with the timeline paused (the checkpoint phase keeps exactly its planted time)."""
    pl = import_pl("lightning")
    costs = Costs(clock, save=7)
    scope = scope_for(tmp_path)
    checkpoint = pl.callbacks.ModelCheckpoint(dirpath=tmp_path / "ckpt", every_n_train_steps=2, save_top_k=-1)
    tr = trainer(pl, tmp_path, [scope, checkpoint], enable_checkpointing=True)
    tr.fit(tiny_class(pl)(costs), loader(24, costs))
    assert costs.counts["save"] == 3
    summary = scope._session.saves.summary()
    assert summary is not None
    assert summary.saves == 3
    assert not summary.already_async
    if Path("/proc/self/io").exists():
        files = sorted((tmp_path / "ckpt").iterdir())
        assert len(files) == 3
        assert summary.bytes is not None
        assert summary.bytes >= sum(f.stat().st_size for f in files)
        assert summary.copy_s_per_byte is not None
    assert scope.report is not None
    assert scope.report.summary.phase_seconds["checkpoint"] == pytest.approx(0.021)
    assert probes_left(tr) == []


def test_an_asynchronous_checkpoint_io_is_noted(tmp_path: Path, clock: FakeClock) -> None:
    pl = import_pl("lightning")
    costs = Costs(clock)
    scope = scope_for(tmp_path)
    checkpoint = pl.callbacks.ModelCheckpoint(dirpath=tmp_path / "ckpt", every_n_train_steps=2, save_top_k=-1)
    io_plugin = pl.plugins.io.AsyncCheckpointIO()
    tr = trainer(pl, tmp_path, [scope, checkpoint], enable_checkpointing=True, plugins=[io_plugin])
    tr.fit(tiny_class(pl)(costs), loader(16, costs))
    summary = scope._session.saves.summary()
    assert summary is not None
    assert summary.already_async
    assert len(list((tmp_path / "ckpt").iterdir())) == 2
    assert probes_left(tr) == []


def test_saves_from_another_thread_pass_untimed(tmp_path: Path, clock: FakeClock) -> None:
    """The timeline belongs to the training thread: a save started elsewhere is not recorded."""
    import threading

    pl = import_pl("lightning")
    costs = Costs(clock, save=7)

    class SavesInThread(pl.Callback):  # type: ignore[misc,name-defined]
        def on_train_batch_end(self, trainer: Any, *args: Any) -> None:
            if trainer.global_step == 2:
                worker = threading.Thread(target=trainer.save_checkpoint, args=(tmp_path / "side.ckpt",))
                worker.start()
                worker.join()

    scope = scope_for(tmp_path)
    tr = trainer(pl, tmp_path, [scope, SavesInThread()])
    tr.fit(tiny_class(pl)(costs), loader(16, costs))
    assert (tmp_path / "side.ckpt").exists()
    assert costs.counts["save"] == 1
    assert scope._session.timeline.run_stats().phase_counts["checkpoint"] == 0
    assert scope.report is not None
    assert scope.report.summary.phase_seconds["other"] == pytest.approx(0.007)  # the main thread waited
