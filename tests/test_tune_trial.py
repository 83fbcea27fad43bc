"""The trial's side (``tune.plan``, ``tune.trial``, ``tune.loaders``), in this process."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from stallscope.tune.loaders import rebuild
from stallscope.tune.plan import TrialPlan
from stallscope.tune.trial import Meter, Trial, TrialStop


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_the_plan_travels_through_the_environment(tmp_path: Path) -> None:
    plan = TrialPlan(3, tmp_path, {"num_workers": 2}, warmup_steps=4, steps=20, seconds=None)
    env = plan.environ()
    assert env["STALLSCOPE_TRIAL"] == "3"
    assert TrialPlan.from_environ(env) == plan
    assert TrialPlan.from_environ({}) is None
    with pytest.raises(ValueError, match="not readable"):
        TrialPlan.from_environ({"STALLSCOPE_TRIAL": "x"})
    with pytest.raises(ValueError, match="needs a budget"):
        TrialPlan(0, tmp_path, steps=None, seconds=None)


def test_the_window_opens_after_warmup_and_closes_on_steps(tmp_path: Path) -> None:
    clock = Clock()
    meter = Meter(TrialPlan(0, tmp_path, warmup_steps=2, steps=3, seconds=None), clock)
    for done in range(5):
        assert not meter.boundary(done)
        clock.now += 1.0
    assert meter.boundary(5)  # steps 2, 3, 4 measured
    assert meter.last == (3, 3.0)


def test_the_window_closes_on_seconds_at_a_step_boundary(tmp_path: Path) -> None:
    clock = Clock()
    meter = Meter(TrialPlan(0, tmp_path, warmup_steps=0, steps=100, seconds=2.5), clock)
    assert not meter.boundary(0)
    clock.now = 2.0
    assert not meter.boundary(1)
    clock.now = 3.0
    assert meter.boundary(2)
    assert meter.last == (2, 3.0)


def test_a_plain_pass_stops_with_trial_stop_and_writes_its_measurement(tmp_path: Path) -> None:
    trial = Trial(TrialPlan(1, tmp_path, warmup_steps=1, steps=2, seconds=None))
    seen: list[int] = []
    with pytest.raises(TrialStop) as stop:
        seen.extend(trial.plain_pass(range(10)))  # the items before the stop stay in ``seen``
    assert stop.value.code == 0
    assert seen == [0, 1, 2]
    result = json.loads((tmp_path / "trial.json").read_text())
    assert result["steps"] == 2
    assert result["complete"] is True
    assert result["steps_per_s"] > 0


def _loader(**kwargs: object) -> DataLoader[tuple[torch.Tensor, ...]]:
    data = TensorDataset(torch.arange(20.0).reshape(10, 2), torch.arange(10))
    return DataLoader(data, batch_size=4, **kwargs)  # type: ignore[arg-type]


def test_a_loader_is_rebuilt_with_the_settings_and_yields_the_same_batches() -> None:
    user = _loader()
    made = rebuild(user, {"num_workers": 1, "persistent_workers": True, "prefetch_factor": 4})
    assert made is not user
    assert (made.num_workers, made.persistent_workers, made.prefetch_factor) == (1, True, 4)
    assert made.batch_size == 4
    assert made.dataset is user.dataset
    for a, b in zip(user, made, strict=True):
        assert torch.equal(a[0], b[0])
        assert torch.equal(a[1], b[1])
    back = rebuild(made, {"num_workers": 0})
    assert back.num_workers == 0
    assert back.prefetch_factor is None
    assert not back.persistent_workers
    assert rebuild(user, {"every_n_steps": 5}) is user  # nothing of the loader's


def test_batch_sampler_indexes_once_per_batch() -> None:
    user = _loader()
    made = rebuild(user, {"batch_sampler": True})
    assert made.batch_size is None
    for a, b in zip(user, made, strict=True):
        assert torch.equal(a[0], b[0])
    with pytest.raises(ValueError, match="collate_fn"):
        rebuild(_loader(collate_fn=lambda batch: batch), {"batch_sampler": True})


def test_the_trial_rebuilds_a_loader_once_and_says_what_it_applied(tmp_path: Path) -> None:
    trial = Trial(TrialPlan(1, tmp_path, {"num_workers": 1}, steps=100))
    user = _loader()
    first = trial.loader(user)
    assert first is not user
    assert first.num_workers == 1
    assert trial.loader(user) is first  # the same one every epoch: persistent workers persist
    assert trial.applied == {"num_workers": 1}
    assert trial.loader([1, 2, 3]) == [1, 2, 3]  # not a DataLoader: nothing to apply
