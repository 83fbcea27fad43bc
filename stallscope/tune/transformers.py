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
    Trainer made in a trial with a StallScope among its ``callbacks`` (passed by name, as is
    usual) gets the trial's settings and folders on its ``args`` before ``__init__`` makes
    ``output_dir``: a trial makes no folder among the user's. Subclasses (``Seq2SeqTrainer``,
    TRL's) reach it through ``super().__init__``. The trial is looked up at each call. Called when
    a scope is made in a trial. A Trainer made without ``args`` (its defaults) is left to
    ``on_init_end``."""
    module: Any = sys.modules.get("transformers")
    trainer: Any = getattr(module, "Trainer", None) if module is not None else None
    if not isinstance(trainer, type):
        return  # transformers not imported (yet): ``on_init_end`` applies the settings
    original: Callable[..., None] | None = vars(trainer).get("__init__")
    if original is None or getattr(original, "_stallscope_trial", False):
        return

    @functools.wraps(original)
    def init(self: Any, *args: Any, **kwargs: Any) -> None:
        from stallscope.hooks.scope import StallScope

        trial = current()
        arguments = kwargs.get("args", args[1] if len(args) > 1 else None)
        callbacks = kwargs.get("callbacks") or []
        if trial is not None and arguments is not None and any(isinstance(c, StallScope) for c in callbacks):
            attach(trial, arguments)
        original(self, *args, **kwargs)

    init._stallscope_trial = True  # type: ignore[attr-defined]
    setattr(trainer, "__init__", init)  # noqa: B010
