"""The trial in a transformers ``Trainer``: its settings on ``TrainingArguments``, its outputs in
the trial's scratch folder. (The stop on budget is in the hook's ``on_step_end``, through
``control.should_training_stop``.)

``attach`` is called at the start of ``Trainer.__init__`` (``before_init``: ``__init__`` makes
``output_dir``, so the folders must be the trial's before it runs), and again from StallScope's
``on_init_end``, before ``train()`` builds its loader from the arguments and reads its
intervals (for a script that imports transformers only after making its scope). A scope added
later (``trainer.add_callback``) sees no ``on_init_end``: the trial then applies nothing, and
says so.
"""

from __future__ import annotations

import functools
import inspect
import sys
from collections.abc import Callable
from typing import Any

from stallscope.tune.applicable import TRANSFORMERS_KEYS
from stallscope.tune.trial import Trial, current


def attach(trial: Trial, args: Any) -> None:
    """Set ``trial``'s settings on ``args``; point ``output_dir`` and ``logging_dir`` at the
    trial's folder. Never raises: what could not be set is noted."""
    trial.framework = "transformers"
    root = trial.plan.root_dir
    for name in ("output_dir", "logging_dir"):
        try:
            if hasattr(args, name):
                setattr(args, name, str(root / name))
        except Exception as exc:
            trial.not_applied[name] = f"{type(exc).__name__}: {exc}"
    for key, value in trial.plan.settings.items():
        if key not in TRANSFORMERS_KEYS:
            continue
        try:
            setattr(args, key, value)  # read by train(): its loader, its intervals
            trial.applied[key] = value
        except Exception as exc:
            trial.not_applied[key] = f"{type(exc).__name__}: {exc}"


def before_init() -> None:
    """Wrap ``transformers.Trainer.__init__`` (once, where transformers is imported) so that a
    Trainer made in a trial with a StallScope among its ``callbacks`` (by name or by place) gets
    the trial's settings and folders on its ``args`` before ``__init__`` makes ``output_dir``: a
    trial makes no folder among the user's. A Trainer made without ``args`` gets what
    ``__init__`` would make (``TrainingArguments`` with their defaults), its folders the trial's.
    Subclasses (``Seq2SeqTrainer``, TRL's) reach it through ``super().__init__``. The trial is
    looked up at each call. Called when a scope is made in a trial."""
    module: Any = sys.modules.get("transformers")
    trainer: Any = getattr(module, "Trainer", None) if module is not None else None
    if not isinstance(trainer, type):
        return  # transformers not imported (yet): ``on_init_end`` applies the settings
    original: Callable[..., None] | None = vars(trainer).get("__init__")
    if original is None or getattr(original, "_stallscope_trial", False):
        return
    try:
        signature = inspect.signature(original)
    except (TypeError, ValueError):
        return  # not a function we can read: ``on_init_end`` applies the settings

    @functools.wraps(original)
    def init(self: Any, *args: Any, **kwargs: Any) -> None:
        trial = current()
        if trial is not None:
            args, kwargs = _in_trial(trial, module, signature, self, args, kwargs)
        original(self, *args, **kwargs)

    init._stallscope_trial = True  # type: ignore[attr-defined]
    setattr(trainer, "__init__", init)  # noqa: B010


def _in_trial(
    trial: Trial, module: Any, signature: inspect.Signature, this: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """The arguments of a Trainer made in ``trial``: its ``args`` the trial's (``attach``) when a
    StallScope is among its callbacks; the call's own arguments otherwise, or when they do not
    bind (``__init__`` then raises its own error)."""
    from stallscope.hooks.scope import StallScope

    try:
        bound = signature.bind(this, *args, **kwargs)
    except TypeError:
        return args, kwargs
    callbacks = bound.arguments.get("callbacks") or ()
    if not any(isinstance(c, StallScope) for c in callbacks):
        return args, kwargs
    arguments = bound.arguments.get("args")
    if arguments is None:
        try:  # what ``__init__`` makes for a Trainer without ``args``, in the trial's folder
            arguments = bound.arguments["args"] = module.TrainingArguments(output_dir=str(trial.plan.root_dir))
        except Exception as exc:
            trial.not_applied["args"] = f"{type(exc).__name__}: {exc}"
            return args, kwargs
    attach(trial, arguments)
    return bound.args[1:], bound.kwargs
