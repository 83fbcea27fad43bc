"""The trial in a transformers ``Trainer``: its settings on ``TrainingArguments``, its outputs in
the trial's scratch folder. (The stop on budget is in the hook's ``on_step_end``, through
``control.should_training_stop``.)

``attach`` is called from StallScope's ``on_init_end``: the end of ``Trainer.__init__``, before
``train()`` builds its loader from the arguments and reads its intervals. A scope added later
(``trainer.add_callback``) sees no ``on_init_end``: the trial then applies nothing, and says so.
"""

from __future__ import annotations

from typing import Any

from stallscope.tune.applicable import TRANSFORMERS_KEYS
from stallscope.tune.trial import Trial


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
