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
    if trial.applied.get("dataloader_num_workers") == 0:
        # the Trainer hands these to its DataLoader, which refuses them without workers
        for name, off in (("dataloader_persistent_workers", False), ("dataloader_prefetch_factor", None)):
            try:
                if getattr(args, name, off) != off:
                    setattr(args, name, off)
            except Exception as exc:
                trial.not_applied[name] = f"{type(exc).__name__}: {exc}"


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
    places = _places(original)

    @functools.wraps(original)
    def init(self: Any, *args: Any, **kwargs: Any) -> None:
        trial = current()
        if trial is not None:
            try:
                args, kwargs = _in_trial(trial, module, places, args, kwargs)
            except Exception as exc:  # the user's Trainer is made as asked all the same
                trial.not_applied["args"] = f"{type(exc).__name__}: {exc}"
        original(self, *args, **kwargs)

    init._stallscope_trial = True  # type: ignore[attr-defined]
    setattr(trainer, "__init__", init)  # noqa: B010


#: where ``Trainer.__init__`` takes them by place (after ``self``), when its signature says nothing
TRAINER_PLACES = {"args": 1, "callbacks": 9}


def _places(init: Callable[..., None]) -> dict[str, int]:
    """Where ``init`` takes ``args`` and ``callbacks`` by place (after ``self``), from its
    signature (through a decorator's ``__wrapped__``; transformers 4 wraps ``__init__`` to rename
    its ``tokenizer`` argument). A signature that names neither (``*args, **kwargs``): the
    Trainer's own places."""
    try:
        parameters = list(inspect.signature(init).parameters.values())
    except (TypeError, ValueError):
        return dict(TRAINER_PLACES)
    positional = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    places: dict[str, int] = {}
    for i, p in enumerate(parameters[1:]):
        if p.kind not in positional:
            break
        places[p.name] = i
    if "args" not in places and "callbacks" not in places:
        return dict(TRAINER_PLACES)
    return {name: places[name] for name in TRAINER_PLACES if name in places}


def _argument(args: tuple[Any, ...], kwargs: dict[str, Any], name: str, places: dict[str, int]) -> Any:
    """The call's argument ``name``, given by name or by place; None when not given."""
    if name in kwargs:
        return kwargs[name]
    place = places.get(name)
    return args[place] if place is not None and place < len(args) else None


def _in_trial(
    trial: Trial, module: Any, places: dict[str, int], args: tuple[Any, ...], kwargs: dict[str, Any]
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """The arguments of a Trainer made in ``trial``: its ``args`` the trial's (``attach``) when a
    StallScope is among its callbacks; the call's own arguments otherwise."""
    from stallscope.hooks.scope import StallScope

    callbacks = _argument(args, kwargs, "callbacks", places)
    try:
        ours = any(isinstance(c, StallScope) for c in callbacks or ())
    except TypeError:  # not a list of callbacks: ``__init__`` says so itself
        return args, kwargs
    if not ours:
        return args, kwargs
    arguments = _argument(args, kwargs, "args", places)
    if arguments is None:
        try:  # what ``__init__`` makes for a Trainer without ``args``, in the trial's folder
            arguments = module.TrainingArguments(output_dir=str(trial.plan.root_dir))
        except Exception as exc:
            trial.not_applied["args"] = f"{type(exc).__name__}: {exc}"
            return args, kwargs
        place = places.get("args")
        if "args" not in kwargs and place is not None and place < len(args):  # ``None`` by place
            args = (*args[:place], arguments, *args[place + 1 :])
        else:
            kwargs = {**kwargs, "args": arguments}
    attach(trial, arguments)
    return args, kwargs
