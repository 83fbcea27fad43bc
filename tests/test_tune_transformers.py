"""``tune.transformers``: a trial's settings on real ``TrainingArguments``."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

from stallscope.tune import transformers as tune_transformers
from stallscope.tune.applicable import in_place
from stallscope.tune.plan import TrialPlan
from stallscope.tune.trial import Trial

transformers = pytest.importorskip("transformers")


def test_settings_go_on_the_arguments_and_outputs_to_the_scratch_folder(tmp_path: Path) -> None:
    args = transformers.TrainingArguments(output_dir=str(tmp_path / "user"), report_to=[], use_cpu=True)
    settings = {"dataloader_num_workers": 2, "logging_steps": 50, "every_n_steps": 5}
    trial = Trial(TrialPlan(1, tmp_path / "trial", settings, steps=10))
    tune_transformers.attach(trial, args)
    assert args.dataloader_num_workers == 2
    assert args.logging_steps == 50
    assert args.output_dir == str(tmp_path / "trial" / "root" / "output_dir")
    assert trial.applied == {"dataloader_num_workers": 2, "logging_steps": 50}  # a plain loop's key: not here
    assert trial.framework == "transformers"


def test_a_trial_trainer_makes_its_output_dir_in_the_scratch_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``Trainer.__init__`` makes ``output_dir`` before any callback hears of it: in a trial, the
    wrapped ``__init__`` points it at the trial's folder first, for a Trainer with StallScope
    among its callbacks (a Trainer without one is left alone)."""
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[1] / "examples"))
    import transformers_common as common

    from stallscope import StallScope

    monkeypatch.setattr(transformers.Trainer, "__init__", transformers.Trainer.__init__)  # restored after
    trial = Trial(TrialPlan(1, tmp_path / "trial", {"dataloader_num_workers": 1}, steps=10))
    monkeypatch.setattr(tune_transformers, "current", lambda: trial)
    tune_transformers.before_init()
    wrapped = transformers.Trainer.__init__
    tune_transformers.before_init()  # once is enough: not wrapped twice
    assert transformers.Trainer.__init__ is wrapped
    assert getattr(wrapped, "_stallscope_trial", False)

    def make(name: str, callbacks: list[object]) -> object:
        args = transformers.TrainingArguments(output_dir=str(tmp_path / name), report_to=[], use_cpu=True)
        return transformers.Trainer(model=common.tiny_model(), args=args, callbacks=callbacks)

    trainer = make("user", [StallScope(tmp_path / "runs", console=False)])
    assert not (tmp_path / "user").exists()
    assert trainer.args.output_dir == str(tmp_path / "trial" / "root" / "output_dir")  # type: ignore[attr-defined]
    assert trainer.args.dataloader_num_workers == 1  # type: ignore[attr-defined]
    assert trial.applied == {"dataloader_num_workers": 1}
    make("other", [])  # no scope: not a trial's Trainer
    assert (tmp_path / "other").exists()

    # the callbacks by place (the tenth parameter after ``self``)
    args = transformers.TrainingArguments(output_dir=str(tmp_path / "by-place"), report_to=[], use_cpu=True)
    scope = StallScope(tmp_path / "runs", console=False)
    trainer = transformers.Trainer(common.tiny_model(), args, None, None, None, None, None, None, None, [scope])
    assert not (tmp_path / "by-place").exists()
    assert trainer.args.output_dir == str(tmp_path / "trial" / "root" / "output_dir")  # type: ignore[attr-defined]

    # no ``args``: ``__init__`` would make its default folder in the working folder
    monkeypatch.chdir(tmp_path)
    trainer = transformers.Trainer(model=common.tiny_model(), callbacks=[StallScope(tmp_path / "runs", console=False)])
    assert trainer.args.output_dir == str(tmp_path / "trial" / "root" / "output_dir")  # type: ignore[attr-defined]
    assert trainer.args.dataloader_num_workers == 1  # type: ignore[attr-defined]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["other", "trial"]  # no tmp_trainer


def test_a_decorated_init_that_renames_an_argument_still_gets_the_trials_folders(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """transformers 4 decorates ``Trainer.__init__`` to take the old ``tokenizer=`` under its new
    name: a call with ``tokenizer=`` does not bind to the signature the decorator shows
    (``__wrapped__``'s). The trial's folders are set all the same, by name or by place."""
    import functools
    import types

    from stallscope import StallScope

    seen: list[str] = []

    def renaming(init: Any) -> Any:
        @functools.wraps(init)
        def wrapped(self: Any, *args: Any, **kwargs: Any) -> None:
            if "tokenizer" in kwargs:
                kwargs["processing_class"] = kwargs.pop("tokenizer")
            init(self, *args, **kwargs)

        return wrapped

    class TrainingArguments:
        def __init__(self, output_dir: str) -> None:
            self.output_dir = output_dir

    class Trainer:
        @renaming
        def __init__(
            self, model: Any = None, args: Any = None, processing_class: Any = None, callbacks: Any = None
        ) -> None:
            self.args = args or TrainingArguments("tmp_trainer")
            seen.append(self.args.output_dir)  # where __init__ would make its folder

    fake = types.ModuleType("transformers")
    fake.Trainer, fake.TrainingArguments = Trainer, TrainingArguments  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "transformers", fake)
    trial = Trial(TrialPlan(1, tmp_path / "trial", {"dataloader_num_workers": 1}, steps=10))
    monkeypatch.setattr(tune_transformers, "current", lambda: trial)
    tune_transformers.before_init()
    scope = StallScope(tmp_path / "runs", console=False)
    ours = str(tmp_path / "trial" / "root" / "output_dir")
    Trainer(None, args=TrainingArguments("user"), tokenizer="tok", callbacks=[scope])  # type: ignore[call-arg]
    Trainer(None, TrainingArguments("user"), "tok", [scope])
    Trainer(None, None, "tok", [scope])
    Trainer(None, args=TrainingArguments("user"), tokenizer="tok", callbacks=[])  # type: ignore[call-arg]
    assert seen == [ours, ours, ours, "user"]


def test_without_transformers_imported_nothing_is_wrapped(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A plain loop's trial (transformers not imported): the scope is made as usual."""
    import sys

    unwrapped = transformers.Trainer.__init__
    monkeypatch.setattr(transformers.Trainer, "__init__", unwrapped)  # restored after
    monkeypatch.delitem(sys.modules, "transformers")
    tune_transformers.before_init()
    assert transformers.Trainer.__init__ is unwrapped


def test_which_suggestions_a_transformers_trial_applies() -> None:
    assert in_place("transformers", {"dataloader_num_workers": 2})
    assert in_place("transformers", {"save_strategy": "steps", "save_steps": 500})
    assert not in_place("transformers", {"per_device_train_batch_size": 64})
    assert not in_place("transformers", {"num_workers": 2})
    assert not in_place("plain", {"num_workers": 2, "non_blocking": True})
    assert in_place("lightning", {"pin_memory": True, "non_blocking": True})
    assert not in_place("plain", {})


def test_a_trial_of_no_workers_clears_what_a_dataloader_refuses_without_them(tmp_path: Path) -> None:
    """The user's own arguments keep workers alive; a trial of none must not hand
    ``persistent_workers=True`` to a DataLoader of no workers (it raises)."""
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path / "user"),
        report_to=[],
        use_cpu=True,
        dataloader_num_workers=2,
        dataloader_persistent_workers=True,
        dataloader_prefetch_factor=4,
    )
    trial = Trial(TrialPlan(1, tmp_path / "trial", {"dataloader_num_workers": 0}, steps=10))
    tune_transformers.attach(trial, args)
    assert args.dataloader_num_workers == 0
    assert args.dataloader_persistent_workers is False
    assert args.dataloader_prefetch_factor is None
    assert not trial.not_applied
