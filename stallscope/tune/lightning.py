"""The trial in a Lightning fit: its settings on the Trainer, its loader and its checkpoints, and
a callback that stops the fit through ``trainer.should_stop`` once the budget is spent.

``attach`` is called from StallScope's ``setup`` hook (stage ``fit``), before Lightning asks for
the train loader and before ``ModelCheckpoint`` resolves its folder (Lightning sorts checkpoint
callbacks last). Lightning has no public way to change these once the Trainer is built, so the
private touch points are here, one function each, and a trial that cannot apply a setting says
so in ``not_applied`` (the driver then reports the suggestion as not applied, never measured as
if it were).
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import math
import sys
from collections.abc import Callable
from typing import Any

from stallscope.tune.applicable import LIGHTNING_CHECKPOINT_KEYS, LIGHTNING_TRAINER_KEYS
from stallscope.tune.loaders import LOADER_KEYS, is_loader
from stallscope.tune.trial import MAX_LOSSES, Trial


def attach(trial: Trial, trainer: Any) -> None:
    """Apply ``trial``'s settings to ``trainer`` and have it stop on budget. Never raises: what
    could not be applied is noted in the trial's result."""
    trial.framework = "lightning"
    settings = trial.plan.settings
    for name, step in (
        ("scratch folders", _scratch_folders),
        ("trainer settings", _trainer_settings),
        ("checkpoint interval", _checkpoint_interval),
        ("asynchronous saves", _async_save),
        ("train loader", _train_loader),
        ("stop callback", _stop_callback),
    ):
        try:
            step(trial, trainer)
        except Exception as exc:  # a Lightning release that moved a touch point
            trial.not_applied[name] = f"{type(exc).__name__}: {exc}"
    if "non_blocking" in settings:  # Lightning copies batches with non_blocking=True itself
        trial.applied["non_blocking"] = settings["non_blocking"]


#: Lightning's modules whose ``_call_setup_hook`` makes the loggers' folders, by namespace
_SETUP_MODULES = ("lightning.pytorch.trainer.call", "pytorch_lightning.trainer.call")


def before_setup(trial: Trial) -> None:
    """Lightning makes its loggers' folders (their ``experiment``) in ``_call_setup_hook``, before
    any callback's ``setup``: in a trial, that function of each Lightning namespace imported is
    wrapped (once) so that, for a fit with StallScope among its callbacks, every logger with a
    folder (CSV, TensorBoard) writes to the trial's folder instead (``trial-N/root/logs``): a
    trial adds no version to the user's logs. Called when a scope is made in a trial."""
    for name in _SETUP_MODULES:
        module: Any = sys.modules.get(name)
        original = getattr(module, "_call_setup_hook", None)
        if original is None or getattr(original, "_stallscope_trial", False):
            continue

        def wrapped(trainer: Any, _original: Callable[[Any], None] = original) -> None:
            fitting = getattr(getattr(trainer, "state", None), "fn", None) == "fit"  # a str enum
            if fitting and any(type(c).__name__ == "StallScope" for c in getattr(trainer, "callbacks", [])):
                try:
                    _logger_folders(trial, trainer)
                except Exception as exc:  # a Lightning release that moved a touch point
                    trial.not_applied["logger folders"] = f"{type(exc).__name__}: {exc}"
            _original(trainer)

        wrapped._stallscope_trial = True  # type: ignore[attr-defined]
        module._call_setup_hook = wrapped


def _logger_folders(trial: Trial, trainer: Any) -> None:
    """Every logger that keeps its folder in ``_root_dir`` (Lightning's CSV and TensorBoard
    loggers; the CSV logger also in ``_save_dir``) and has not made it yet, to the trial's folder;
    one that has is said in ``not_applied``."""
    logs = trial.plan.root_dir / "logs"
    for logger in getattr(trainer, "loggers", None) or []:
        if not hasattr(logger, "_root_dir"):
            continue
        if getattr(logger, "_experiment", None) is not None:
            trial.not_applied["logger folders"] = f"{type(logger).__name__} had made its folder already"
            continue
        logger._root_dir = str(logs)  # private: where the logger makes its versions
        if hasattr(logger, "_save_dir"):
            logger._save_dir = str(logs)


def _scratch_folders(trial: Trial, trainer: Any) -> None:
    """``default_root_dir`` and every ModelCheckpoint's folder in the trial's scratch folder."""
    root = trial.plan.root_dir
    root.mkdir(parents=True, exist_ok=True)
    trainer._default_root_dir = str(root)  # private: the Trainer's only copy of default_root_dir
    for callback in getattr(trainer, "checkpoint_callbacks", None) or []:
        if hasattr(callback, "dirpath"):
            callback.dirpath = str(root / "checkpoints")


def _trainer_settings(trial: Trial, trainer: Any) -> None:
    for key, value in trial.plan.settings.items():
        if key in LIGHTNING_TRAINER_KEYS:
            setattr(trainer, key, value)  # read by the fit loop's set-up, after ``setup``
            trial.applied[key] = value


def _checkpoint_interval(trial: Trial, trainer: Any) -> None:
    keys = {k: v for k, v in trial.plan.settings.items() if k in LIGHTNING_CHECKPOINT_KEYS}
    if not keys:
        return
    found = [c for c in getattr(trainer, "checkpoint_callbacks", None) or [] if hasattr(c, "_every_n_train_steps")]
    if not found:
        trial.not_applied["every_n_train_steps"] = "the Trainer has no ModelCheckpoint"
        return
    for callback in found:
        callback._every_n_train_steps = int(keys["every_n_train_steps"])  # private: no setter
    trial.applied.update(keys)


def _async_save(trial: Trial, trainer: Any) -> None:
    """``async_save``: the strategy's checkpoint IO wrapped in Lightning's ``AsyncCheckpointIO``
    (the plugin the finding's fix names), which the strategy's teardown waits for."""
    if not trial.plan.settings.get("async_save"):
        return
    wrapper: type[Any] = importlib.import_module(f"{_namespace(trainer)}.plugins.io").AsyncCheckpointIO
    strategy = trainer.strategy
    if not isinstance(strategy.checkpoint_io, wrapper):
        strategy.checkpoint_io = wrapper(strategy.checkpoint_io)
    trial.applied["async_save"] = True


def _train_loader(trial: Trial, trainer: Any) -> None:
    """The fit loop's train loader source asks the trial for the loader it hands over."""
    if not any(k in LOADER_KEYS for k in trial.plan.settings):
        return
    source = trainer.fit_loop._data_source  # private: where Lightning asks for the train loader
    original: Callable[[], Any] = source.dataloader

    def dataloader() -> Any:
        return _each_loader(original(), trial.loader)

    source.dataloader = dataloader


def _each_loader(loaders: Any, fn: Callable[[Any], Any]) -> Any:
    """``fn`` on a loader, or on each loader of a list, tuple or dict of them."""
    if is_loader(loaders):
        return fn(loaders)
    if isinstance(loaders, (list, tuple)):
        return type(loaders)(_each_loader(item, fn) for item in loaders)
    if isinstance(loaders, dict):
        return {key: _each_loader(item, fn) for key, item in loaders.items()}
    return loaders


def _stop_callback(trial: Trial, trainer: Any) -> None:
    if not any(type(c).__name__ == "_TrialStopper" for c in trainer.callbacks):
        trainer.callbacks.append(_stopper_class(_namespace(trainer))(trial))


def _namespace(trainer: Any) -> str:
    """``lightning.pytorch`` or ``pytorch_lightning``: the package the Trainer comes from."""
    module = type(trainer).__module__
    return "pytorch_lightning" if module.startswith("pytorch_lightning") else "lightning.pytorch"


@functools.cache
def _stopper_class(namespace: str) -> type[Any]:
    """The stop callback, a ``Callback`` of the Trainer's own package (its checkpoint hooks)."""
    base: type[Any] = importlib.import_module(namespace).Callback

    class _TrialStopper(base):  # type: ignore[misc]
        """Counts the fit's steps for the trial; stops the fit once its budget is spent."""

        def __init__(self, trial: Trial) -> None:
            super().__init__()
            self.trial = trial

        def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
            loss = _loss(outputs) if len(self.trial.losses) < MAX_LOSSES else None
            if self.trial.step_end(loss):
                trainer.should_stop = True

    return _TrialStopper


def _loss(outputs: Any) -> float | None:
    """The step's loss from ``training_step``'s output (a tensor or a dict with ``loss``)."""
    value: Any = outputs.get("loss") if isinstance(outputs, dict) else outputs
    with contextlib.suppress(Exception):
        number = float(value.detach().float().cpu())
        return number if math.isfinite(number) else None
    return None
