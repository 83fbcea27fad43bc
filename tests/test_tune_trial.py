"""The trial's side (``tune.plan``, ``tune.trial``, ``tune.loaders``), in this process."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from store_fakes import DictStore
from torch.utils.data import DataLoader, TensorDataset

from stallscope.tune import trial as trial_module
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


def test_the_thread_count_is_set_at_the_first_step_after_the_users_own(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``data.workers`` on a CPU also sets torch's intra-op threads: the trial sets them at its
    first step boundary (a ``torch.set_num_threads`` in the user's set-up comes before it and
    is overridden), and says so; with a ``"rank"``, on that rank only."""
    calls: list[int] = []
    monkeypatch.setattr(torch, "set_num_threads", calls.append)
    trial = Trial(TrialPlan(1, tmp_path, {"num_workers": 1, "torch_num_threads": 1}, warmup_steps=0, steps=2))
    assert calls == []  # not when the trial is made: the user's script has not set up yet
    items = list(trial.counted(iter([1])))
    assert items == [1]
    assert calls == [1]
    assert trial.applied["torch_num_threads"] == 1
    trial.step_begin()
    assert calls == [1]  # once
    monkeypatch.setattr(trial_module, "_job_place", lambda: (0, 2, None))
    other = Trial(TrialPlan(2, tmp_path, {"num_workers": 1, "torch_num_threads": 1, "rank": 1}, steps=5))
    other.step_begin()
    assert calls == [1]
    assert "torch_num_threads" not in other.applied


def test_the_ranks_of_a_job_stop_at_the_boundary_rank_0_posts(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Rank 1's clock runs fast (its own seconds budget is spent first): it stops where rank 0
    says, two boundaries after rank 0's budget is spent, as rank 0 does."""
    store, clocks = DictStore(), [Clock(), Clock()]
    ranks = [Trial(TrialPlan(2, tmp_path, warmup_steps=1, steps=None, seconds=2.0), clock) for clock in clocks]
    stopped_at: list[int | None] = [None, None]
    for step in range(12):  # the ranks in step, as a collective keeps them
        clocks[0].now, clocks[1].now = step * 0.5, step * 2.0
        for rank, trial in enumerate(ranks):
            monkeypatch.setattr(trial_module, "_job_place", lambda r=rank: (r, 2, store))
            trial._steps = step
            if stopped_at[rank] is None and trial._spent():
                stopped_at[rank] = step
    # rank 0's window opens at boundary 1 (0.5 s); its 2 s are spent at boundary 5 (2.5 s), and
    # both ranks stop 2 boundaries later; rank 1's own budget (spent at boundary 2) stops nothing
    assert stopped_at == [7, 7]
    assert store.checks > 0


def test_a_rank_of_a_job_without_a_store_stops_by_the_step_budget(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = Clock()
    trial = Trial(TrialPlan(2, tmp_path, warmup_steps=1, steps=4, seconds=1.0), clock)
    monkeypatch.setattr(trial_module, "_job_place", lambda: (1, 2, None))
    stops = []
    for step in range(10):
        clock.now = step * 10.0  # the seconds budget is spent at once: not a job's stop
        trial._steps = step
        stops.append(trial._spent())
    assert stops.index(True) == 5  # 4 steps after the window opened at boundary 1


def test_rank_n_writes_its_own_measurement(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(trial_module, "_job_place", lambda: (1, 2, None))
    trial = Trial(TrialPlan(1, tmp_path, warmup_steps=0, steps=2, seconds=None))
    with pytest.raises(TrialStop):
        list(trial.plain_pass(range(10)))
    assert (tmp_path / "trial-rank-1.json").exists()
    assert not (tmp_path / "trial.json").exists()


def test_a_setting_for_one_rank_rebuilds_that_ranks_loader_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    plan = TrialPlan(1, tmp_path, {"num_workers": 1, "rank": 1}, steps=2)
    loader = _loader()
    monkeypatch.setattr(trial_module, "_job_place", lambda: (0, 2, None))
    other = Trial(plan)
    assert other.loader(loader) is loader
    assert other.applied == {}
    monkeypatch.setattr(trial_module, "_job_place", lambda: (1, 2, None))
    mine = Trial(plan)
    assert mine.loader(loader).num_workers == 1
    assert mine.applied == {"num_workers": 1, "rank": 1}


def test_the_driver_reads_what_every_rank_applied(tmp_path: Path) -> None:
    from stallscope.tune.runner import with_ranks

    (tmp_path / "trial-rank-1.json").write_text(json.dumps({"applied": {"num_workers": 1, "rank": 1}}))
    (tmp_path / "trial-rank-2.json").write_text(json.dumps({"not_applied": {"x": "why"}, "applied": {}}))
    merged = with_ranks({"applied": {}, "not_applied": {}, "steps_per_s": 3.0}, tmp_path / "trial.json")
    assert merged == {
        "applied": {"num_workers": 1, "rank": 1},
        "not_applied": {"x": "why"},
        "steps_per_s": 3.0,
        "ranks": 3,  # rank 0 and the two files beside its own: a job's output is not read for losses
    }
    assert with_ranks({"applied": {}}, tmp_path / "other.json") == {"applied": {}}  # one process: no count
