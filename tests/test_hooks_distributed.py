"""Rank awareness and rank 0's gather (``hooks/distributed.py``), in one process.

A dict stands in for the job's store; a fake clock for time. ``test_distributed_runs.py`` runs
real multi-process jobs.
"""

from __future__ import annotations

import functools
import json
import sys
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from store_fakes import DictStore

from stallscope import StallScope
from stallscope.config import ScopeConfig
from stallscope.hooks import distributed, session
from stallscope.hooks.distributed import Exchange, Job, RankInfo, load_notes_once, rank_info
from stallscope.report.schema import RankEntry, Report


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


def exchange(store: DictStore, rank: int, clock: Clock, world: int = 2, timeout_s: float = 5.0) -> Exchange:
    return Exchange(store, prefix="t", rank=rank, world_size=world, timeout_s=timeout_s, clock=clock, sleep=clock.sleep)


def payload(rank: int, name: str) -> dict[str, Any]:
    return {"v": distributed.PAYLOAD_VERSION, "rank": rank, "name": name}


# -- rank_info -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1"}, RankInfo(1, 2, 1)),
        ({"RANK": "3", "WORLD_SIZE": "4"}, RankInfo(3, 4, None)),
        ({"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2"}, RankInfo(3, 4, 1, 2)),
        ({"RANK": "1", "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "8"}, RankInfo(1, 2, None, None)),
        ({"RANK": "0", "WORLD_SIZE": "1"}, None),
        ({"RANK": "2", "WORLD_SIZE": "2"}, None),
        ({"RANK": "x", "WORLD_SIZE": "2"}, None),
        ({}, None),
    ],
)
def test_rank_info_from_the_launcher_environment(
    monkeypatch: pytest.MonkeyPatch, env: dict[str, str], expected: RankInfo | None
) -> None:
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert rank_info() == expected


@pytest.mark.parametrize(
    ("local_world", "local_ranks", "expected"), [(None, None, 8), (2, None, 4), (None, 4, 2), (16, None, 1)]
)
def test_ranks_on_one_host_share_its_cores(
    tmp_path: Path, local_world: int | None, local_ranks: int | None, expected: int
) -> None:
    """Each rank's data advice counts only its share of the host's cores: two ranks and their
    workers on 2 cores do not each get 2."""
    sess = session.Session(ScopeConfig.create(tmp_path, console=False))
    sess.host = replace(sess.host, usable_cores=8)
    assert sess.rank_cores == 8  # alone
    sess.job = Job(RankInfo(1, 16, 1, local_world), "host", None, min_saving=0.02, note=sess.note)
    sess.local_ranks = local_ranks
    assert sess.rank_cores == expected
    assert sess.context(_span_for_cores()).cores == expected


def test_the_private_store_accessor_exists_in_this_torch() -> None:
    """``default_store``'s one private touch point: fails loudly when torch moves it."""
    from torch.distributed import distributed_c10d

    assert callable(distributed_c10d._get_default_store)
    assert distributed.default_store() is None  # not initialised here: no store, no error


# -- Exchange --------------------------------------------------------------------------------


@pytest.mark.parametrize("queues", [True, False], ids=["queues", "keys"])
def test_collect_takes_each_rank_once_and_deletes_its_key(queues: bool) -> None:
    store, clock = DictStore(queues=queues), Clock()
    exchange(store, 1, clock).post("epoch0", payload(1, "epoch0"))
    got = exchange(store, 0, clock).collect("epoch0")
    assert got == {1: payload(1, "epoch0")}
    assert store.empty()
    assert clock.now == 0.0  # it was there: no wait


def test_a_payload_in_a_queue_is_taken_in_one_round_trip() -> None:
    """Where the store has queues (TCPStore): one pop, where a key took a check, a get and a
    delete."""
    trips = {}
    for queues in (True, False):
        store, clock = DictStore(queues=queues), Clock()
        rank1, leader = exchange(store, 1, clock), exchange(store, 0, clock)
        for epoch in ("epoch0", "epoch1"):  # the first call finds out a store without queues
            rank1.post(epoch, payload(1, epoch))
            before = store.trips
            assert leader.collect(epoch) == {1: payload(1, epoch)}
            trips[queues] = store.trips - before
        assert leader.queues is rank1.queues is queues
    assert trips == {True: 1, False: 3}


def test_collect_waits_until_the_deadline_then_stops_waiting_for_that_rank() -> None:
    store, clock = DictStore(), Clock()
    leader = exchange(store, 0, clock, timeout_s=5.0)
    assert leader.collect("epoch0") == {}
    assert 5.0 <= clock.now < 5.1
    assert leader.late == {1}
    before = clock.now
    assert leader.collect("epoch1") == {}  # late: checked, not waited for
    assert clock.now == before
    exchange(store, 1, clock).post("epoch2", payload(1, "epoch2"))
    assert leader.collect("epoch2") == {1: payload(1, "epoch2")}  # back in step
    assert leader.late == set()


def test_a_rank_that_ended_is_not_waited_for() -> None:
    store, clock = DictStore(), Clock()
    exchange(store, 1, clock).post("final", payload(1, "final"))
    leader = exchange(store, 0, clock)
    assert leader.collect("epoch3") == {1: payload(1, "final")}
    assert leader.done == {1}
    assert leader.collect("epoch4") == {}
    assert clock.now == 0.0


def test_collect_polls_with_backoff_not_a_busy_loop() -> None:
    store, clock = DictStore(), Clock()
    exchange(store, 0, clock, timeout_s=1.0).collect("epoch0")
    # 0.1 ms doubling up to 20 ms: about 60 polls in a second, two keys each
    assert 2 * 40 < store.trips < 2 * 70


def test_payloads_of_another_version_are_ignored() -> None:
    store, clock = DictStore(), Clock()
    exchange(store, 1, clock).post("epoch0", {"v": 999, "rank": 1})
    assert exchange(store, 0, clock, timeout_s=0.0).collect("epoch0") == {}


# -- the whole path, two ranks in turn -------------------------------------------------------


@pytest.fixture
def two_ranks(monkeypatch: pytest.MonkeyPatch) -> Callable[[int], None]:
    """``become(rank)``: scopes started from now on are that rank of a 2-rank job sharing a store."""
    store = DictStore()
    current = {"rank": 0}

    def join(host: str, *, min_saving: float, note: Callable[[str], None]) -> Job:
        rank = current["rank"]
        ex = Exchange(store, prefix="job", rank=rank, world_size=2, timeout_s=0.0)
        return Job(RankInfo(rank, 2, rank), f"host{rank}", ex, min_saving=min_saving, note=note)

    monkeypatch.setattr(session, "join_job", join)

    def become(rank: int) -> None:
        current["rank"] = rank

    return become


def train(report_dir: Path, batches: int, epochs: int = 2, console: Any = False) -> Report | None:
    with StallScope(report_dir, console=console) as scope:
        for _ in range(epochs):
            for _batch in scope.iter(range(batches)):
                with scope.phase("compute"):
                    pass
    return scope.report


def test_rank_1_writes_only_its_own_file_and_rank_0_the_job(
    two_ranks: Callable[[int], None], tmp_path: Path, console: Any
) -> None:
    two_ranks(1)
    own = train(tmp_path / "node1", batches=12, console=console)
    assert console.file.getvalue() == ""  # rank 1 prints nothing
    assert sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*.json")) == ["node1/ranks/rank-1.json"]
    assert own is not None
    assert own.run.rank == 1
    assert own.run.world_size == 2
    assert not own.ranks

    two_ranks(0)
    job = train(tmp_path / "node0", batches=5, console=console)
    files = sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*.json"))
    assert files == ["node0/ranks/rank-0.json", "node0/report.json", "node1/ranks/rank-1.json"]
    on_disk = json.loads((tmp_path / "node0" / "report.json").read_text(encoding="utf-8"))
    assert [(r["rank"], r["host"], r["steps"], r["epochs"]) for r in on_disk["ranks"]] == [
        (0, "host0", 10, 2),
        (1, "host1", 24, 2),
    ]
    assert on_disk["run"]["rank"] == 0
    assert on_disk["summary"]["steps"] == 24  # the longest rank's
    assert job is not None
    assert len(job.epochs) == 2
    own0 = json.loads((tmp_path / "node0" / "ranks" / "rank-0.json").read_text(encoding="utf-8"))
    assert "ranks" not in own0
    assert own0["summary"]["steps"] == 10
    printed = console.file.getvalue()
    assert "job of 2 ranks" in printed
    assert "rank  host" in printed
    assert "host1" in printed


def test_a_rank_that_raised_is_noted_and_the_leader_goes_on(two_ranks: Callable[[int], None], tmp_path: Path) -> None:
    two_ranks(1)

    def fail_at_4th_step() -> None:
        with StallScope(tmp_path, console=False) as scope:
            for i in scope.iter(range(10)):
                if i == 3:
                    raise RuntimeError("planted")

    with pytest.raises(RuntimeError, match="planted"):
        fail_at_4th_step()
    two_ranks(0)
    job = train(tmp_path, batches=6, epochs=3)
    assert job is not None
    assert [(r.rank, r.steps) for r in job.ranks] == [(0, 18), (1, 4)]  # the step that raised counts
    assert any("rank 1: the run ended with an exception (RuntimeError: planted)" in n for n in job.notes)
    assert any("ended its run before epoch 1" in n for n in job.notes)
    assert any("different numbers of epochs (rank 0 3, rank 1 1)" in n for n in job.notes)


def test_a_malformed_summary_is_a_note_not_a_failure(
    two_ranks: Callable[[int], None], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    two_ranks(1)
    train(tmp_path, batches=4, epochs=1)
    two_ranks(0)
    job = train(tmp_path, batches=4, epochs=1)
    assert job is not None
    assert [r.rank for r in job.ranks] == [0, 1]

    # the same, with rank 1's payloads broken on the way
    broken = tmp_path / "broken"
    two_ranks(1)
    real_post = Exchange.post

    def post_broken(self: Exchange, name: str, payload: dict[str, Any]) -> None:
        real_post(self, name, {**payload, "run": {"summary": {"steps": "many"}}})

    with monkeypatch.context() as patch:
        patch.setattr(Exchange, "post", post_broken)
        train(broken, batches=4, epochs=1)
    two_ranks(0)
    job = train(broken, batches=4, epochs=1)
    assert job is not None
    assert job.run.rank == 0
    assert [r.rank for r in job.ranks] == [0]
    assert any("rank 1's summary could not be read" in n for n in job.notes)


def test_a_ranks_forward_figures_are_read_as_input() -> None:
    """A rank's ``forward_ms`` comes from another process: a figure that is not a finite number
    (at least 0; a cycle and a stretch above 0) is left out, never carried into a finding or the
    report's JSON, where an infinity cannot be written."""
    good = {"per_step": 2.0, "p50": 1.0, "calls": 20, "cycle_per_step": 9.0, "stretch": 2.5}
    assert distributed._per_step_s(good, 10) == pytest.approx(0.002)  # the p50 times the calls a step
    assert distributed._cycle_per_step_s(good) == pytest.approx(0.009)
    assert distributed._stretch(good) == pytest.approx(2.5)
    assert distributed._per_step_s({**good, "p50": float("inf")}, 10) == pytest.approx(0.002)  # per_step
    assert distributed._per_step_s({**good, "p50": 1e308, "calls": 1e308}, 10) is None
    assert distributed._per_step_s({"per_step": float("nan")}, 10) is None
    assert distributed._per_step_s({"per_step": True}, 10) is None
    for bad in (float("inf"), float("nan"), 0, -1.0, True, "9"):
        assert distributed._cycle_per_step_s({**good, "cycle_per_step": bad}) is None, bad
        assert distributed._stretch({**good, "stretch": bad}) == 1.0, bad
    assert distributed._stretch({**good, "stretch": 0.5}) == 1.0  # never below 1
    assert distributed._stretch({}) == 1.0


def test_ranks_in_step_cost_one_check() -> None:
    store, clock = DictStore(), Clock()
    for r in (1, 2, 3):
        exchange(store, r, clock, world=4).post("epoch0", payload(r, "epoch0"))
    got = exchange(store, 0, clock, world=4).collect("epoch0")
    assert sorted(got) == [1, 2, 3]
    assert store.checks == 1
    assert store.empty()


def _span_for_cores() -> Any:
    from stallscope.timeline.stats import Distribution, SpanStats

    return SpanStats(
        wall_ns=10**9,
        steps=10,
        epochs=1,
        step_total_ns=10**9,
        phase_ns={"data": 0, "compute": 10**9, "other": 0},
        phase_counts={"data": 10, "compute": 10},
        step=Distribution.of([10**8] * 10),
        data_wait=Distribution.of([0] * 10),
        data_cpu_ns=0,
        process_cpu_ns=10**9,
    )


# -- in proportion: many short epochs --------------------------------------------------------


def test_run_every_is_the_smallest_power_of_two_within_the_share() -> None:
    job = Job(RankInfo(1, 2), "host", None)
    job.note_run_cost(0.001, 1.0)  # 0.1% of a 1 s epoch: every epoch
    assert job.run_every == 1
    job.note_run_cost(0.003, 0.05)  # 3 ms a report, 50 ms epochs: 0.25% needs 24 epochs
    assert job.run_every == 32
    job.note_run_cost(0.01, 0.001)  # 1 ms epochs: no staler than MAX_RUN_INTERVAL_S (5 s)
    assert job.run_every == 4096
    assert job.run_every * 0.001 <= distributed.MAX_RUN_INTERVAL_S
    assert [i for i in range(10_000) if job.run_due(i)] == [0, 4096, 8192]
    job.note_epoch(0.001)
    assert job.run_every == 4096
    job.note_epoch(2.0)  # the epochs grew long: within 5 s again at once, on the same multiples
    assert job.run_every == 2


def test_a_ranks_epoch_waits_only_where_it_owes_rank_0_nothing() -> None:
    """``Job.may_wait`` on a rank other than 0 (``run_every`` 32: it posts every 16th epoch): not
    at the epoch it said it posts at, nor where its batch would be full, nor where the epoch would
    bring ``run_every`` down (a run summary made later would be of a later moment), nor where a
    logger wants the job's numbers at each epoch end; rank 0 may wait wherever those allow."""
    job = Job(RankInfo(1, 2), "host", None)
    job.note_run_cost(0.003, 0.05)
    assert (job.run_every, job.post_every) == (32, 16)
    job._next_post = 16
    assert job.may_wait(5, 0, 0.05)
    assert not job.may_wait(16, 0, 0.05)  # its word: it posts here
    assert not job.may_wait(5, 15, 0.05)  # the batch would be full (MAX_BATCH)
    assert not job.may_wait(5, 0, 0.2)  # 32 epochs of 0.2 s: past 5 s, run_every comes down here
    job.each_epoch = True
    assert not job.may_wait(5, 0, 0.05)
    leader = Job(RankInfo(0, 2), "host", None)
    assert leader.may_wait(16, 15, 0.2)
    leader.each_epoch = True
    assert not leader.may_wait(5, 0, 0.05)


def test_rank_0_counts_on_the_ranks_run_summaries_at_the_multiples_of_the_largest_run_every() -> None:
    store, clock = DictStore(), Clock()
    leader = Job(RankInfo(0, 3), "host0", exchange(store, 0, clock, world=3))
    assert leader.run_due(1)  # nothing heard yet: every epoch end
    for r, every in ((1, 4), (2, 8)):
        exchange(store, r, clock, world=3).post("post0", {**payload(r, "post0"), "every": every, "next": every})
    leader.close_epoch(_epoch(0), None)
    leader.settle()
    assert [i for i in range(33) if leader.run_due(i)] == [0, 8, 16, 24, 32]


def test_rank_0s_epochs_wait_where_no_other_rank_posts() -> None:
    """Rank 0 closes its waiting epochs where another rank posts (a pause of either rank holds the
    other at the next collective): at the multiples of ``MAX_BATCH`` before it heard from them,
    then of the smallest ``post_every`` they said, and at the epoch each said it posts next."""
    store, clock = DictStore(), Clock()
    leader = Job(RankInfo(0, 3), "host0", exchange(store, 0, clock, world=3))
    batch = distributed.MAX_BATCH
    assert [i for i in range(40) if not leader.may_wait(i, 0, 0.05)] == [0, batch, 2 * batch]
    for r, every, said in ((1, 8, 8), (2, 64, 6)):  # rank 2: its word given before its every went up
        exchange(store, r, clock, world=3).post("post0", {**payload(r, "post0"), "every": every, "next": said})
    leader.close_epoch(_epoch(0), None)
    leader.settle()
    assert [i for i in range(40) if not leader.may_wait(i, 0, 0.05)] == [0, 6, 8, 16, 24, 32]
    assert leader.exchange is not None
    leader.exchange.done.add(1)  # rank 1 ended: rank 2 alone posts (at most MAX_BATCH apart)
    assert [i for i in range(40) if not leader.may_wait(i, 0, 0.05)] == [0, 6, batch, 2 * batch]
    leader.each_epoch = True  # a logger takes the job's numbers at each epoch end
    assert not any(leader.may_wait(i, 0, 0.05) for i in range(40))


def test_rank_0_takes_an_epoch_at_its_next_epoch_end_unless_it_is_needed_sooner() -> None:
    """Waiting at each epoch end for the ranks to post would add their epoch end's work to rank
    0's; in a job in step their summaries of the previous epoch are there already."""
    store, clock = DictStore(), Clock()
    leader = Job(RankInfo(0, 2), "host0", exchange(store, 0, clock))
    other = Job(RankInfo(1, 2), "host1", exchange(store, 1, clock))
    other.close_epoch(_epoch(0, steps=7), None)
    leader.close_epoch(_epoch(0, steps=5), None)
    assert leader.epochs == []  # left for the next epoch end
    assert store.checks == 0
    other.close_epoch(_epoch(1, steps=7), None)
    leader.close_epoch(_epoch(1, steps=5), None)
    assert [e.index for e in leader.epochs] == [0]
    made = leader.job_epoch(1)  # a panel or a logger needs it now
    assert made is not None
    job_epoch, rows = made
    assert job_epoch.summary.steps == 7  # rank 1's epoch is in it
    assert [r.rank for r in rows] == [0, 1]
    assert [e.index for e in leader.epochs] == [0, 1]
    assert clock.now == 0.0  # nothing was waited for
    assert store.empty()


@pytest.mark.parametrize("queues", [True, False])
def test_a_rank_posts_its_epochs_in_batches_and_rank_0_never_waits_for_one_not_made(queues: bool) -> None:
    """Ranks in step, rank 0 closing each epoch before rank 1 (its worst case): rank 1 posts its
    epochs at the multiples of its ``post_every`` (its run summary's, at most ``MAX_BATCH``
    apart), keeps its word when its ``run_every`` goes up (the next post at the epoch it said),
    posts sooner when it comes down; rank 0 never waits (a wait would move the clock) and ends
    with every epoch of the job holding rank 1's numbers."""
    store, clock = DictStore(queues=queues), Clock()
    leader = Job(RankInfo(0, 2), "host0", exchange(store, 0, clock))
    other = Job(RankInfo(1, 2), "host1", exchange(store, 1, clock))
    notes: list[str] = []
    leader._note = notes.append
    posted: list[int] = []
    real_post = other._post

    def post(report: Any, *, final: bool = False) -> None:
        posted.append(other._unsent[-1][0].index if other._unsent else -1)
        real_post(report, final=final)

    other._post = post  # type: ignore[method-assign]
    for i in range(70):
        if i == 50:  # its epochs grew longer (``note_epoch``, before the epoch's post)
            other.run_every = 4
        leader.close_epoch(_epoch(i, steps=5), None)
        other.close_epoch(_epoch(i, steps=7), None)
        if i == 3:  # its run report cost more than thought (``note_run_cost``, after the post)
            other.run_every = 64  # 16 epochs a post
        assert clock.now == 0.0, i
    assert posted == [0, 1, 2, 3, 4, 16, 32, 48, 52, 56, 60, 64, 68]
    # the word given at epoch 3 (next at 4) kept after run_every went up; 52 once it came down
    report = session.Session(ScopeConfig.create(None, console=False)).build_report(complete=True)
    other.finish(report)
    leader.finish(report)
    assert clock.now == 0.0
    assert [e.index for e in leader.epochs] == list(range(70))
    assert {e.summary.steps for e in leader.epochs} == {7}  # rank 1's (the longer) in every one
    assert not any("sent no summary" in n or "could not" in n for n in notes), notes
    assert store.empty()


def test_where_a_logger_takes_the_jobs_numbers_at_each_epoch_end_every_epoch_is_posted(
    two_ranks: Callable[[int], None], tmp_path: Path
) -> None:
    """Lightning's and transformers' loggers get the job's numbers at each epoch's end
    (``Session.end_epoch(may_wait=False)``): rank 0 then takes each epoch of the other ranks at
    once, so a rank posts every epoch, however short (its run summary still goes out rarely)."""
    two_ranks(1)
    with StallScope(tmp_path, console=False) as scope:
        job = scope._session.job
        assert job is not None
        for _batch in scope.iter(range(4)):
            pass
        assert not job.each_epoch
        assert job.post_every == min(job.run_every, distributed.MAX_BATCH)
        for _batch in scope.iter(range(4)):
            pass
        scope._session.end_epoch(may_wait=False)  # as a logger's epoch end
        assert job.each_epoch
        assert job.post_every == 1
    store, clock = DictStore(), Clock()
    leader = Job(RankInfo(0, 2), "host0", exchange(store, 0, clock))
    other = Job(RankInfo(1, 2), "host1", exchange(store, 1, clock))
    other.each_epoch, other.run_every = True, 64
    for i in range(5):
        other.close_epoch(_epoch(i, steps=7), None)
        leader.close_epoch(_epoch(i, steps=5), None)
        made = leader.job_epoch(i)  # the logger's, at rank 0's epoch end
        assert made is not None
        assert made[0].summary.steps == 7  # rank 1's in it
    assert clock.now == 0.0


def test_groups_closed_in_one_batch_keep_their_numbers_for_their_panels() -> None:
    """Rank 1's epochs 1 to 16 come in one post: the two groups of epochs they close (0-7, 8-15)
    are made at one epoch end of rank 0, and each held panel reads its own group's numbers."""
    store, clock = DictStore(), Clock()
    leader = Job(RankInfo(0, 2), "host0", exchange(store, 0, clock))
    other = Job(RankInfo(1, 2), "host1", exchange(store, 1, clock))
    other.run_every = 16
    for i in range(18):
        group = {7: (0, 7), 15: (8, 15)}.get(i)
        leader.close_epoch(_epoch(i, steps=5), None, group=group)
        other.close_epoch(_epoch(i, steps=7), None, group=group)
        if i < 17:
            assert not leader.made(7), i
    assert leader.made(16)
    for last in (7, 15):
        summary = leader.group_summary(last)
        assert summary is not None, last
        assert summary.steps == 8 * 7  # rank 1's eight epochs
        made = leader.job_epoch(last)
        assert made is not None
        assert made[0].covers_epochs == (last - 7, last)
        assert [r.rank for r in made[1]] == [0, 1]


def test_rank_0_waits_at_its_epoch_end_for_a_post_a_rank_said_it_makes_there() -> None:
    """What something needs now (a job report, a long epoch's panel: ``settle``) waits for the
    posts the ranks said they make at this epoch end, and only those."""
    store, clock = DictStore(), Clock()
    leader = Job(RankInfo(0, 2), "host0", exchange(store, 0, clock, timeout_s=5.0))
    other = Job(RankInfo(1, 2), "host1", exchange(store, 1, clock))
    notes: list[str] = []
    leader._note = notes.append
    other.run_every = 4
    for i in range(3):
        other.close_epoch(_epoch(i, steps=7), None)
        leader.close_epoch(_epoch(i, steps=5), None)
    leader.settle()  # rank 1 posts next at epoch 4's end: nothing to wait for
    assert clock.now == 0.0
    assert not leader.made(1)
    leader.close_epoch(_epoch(3, steps=5), None)
    leader.close_epoch(_epoch(4, steps=5), None)  # before rank 1 closed its epochs 3 and 4
    leader.settle()  # rank 1 said it posts at epoch 4's end: waited for, 5 s, then noted late
    waited = clock.now
    assert 5.0 <= waited < 5.1
    assert any("rank 1 sent no summary within 5 s at the end of epoch 4" in n for n in notes), notes
    assert leader.made(4)  # with what is in: rank 0's own
    assert [e.summary.steps for e in leader.epochs] == [7, 5, 5, 5, 5]  # its epochs 1 to 4 were to come at 4
    for i in range(5, 9):  # rank 1 still behind (noted late): looked for, not waited for
        leader.close_epoch(_epoch(i, steps=5), None)
    assert clock.now == waited
    for i in range(3, 6):  # rank 1 posts its epochs 3 and 4, still behind: late all the same
        other.close_epoch(_epoch(i, steps=7), None)
    leader.close_epoch(_epoch(9, steps=5), None)
    assert leader.exchange is not None
    assert leader.exchange.late == {1}  # its post at 4 found, its post at 8 owed
    for i in range(6, 13):  # rank 1 catches up (posts at 8 and 12): in step once it owes nothing
        other.close_epoch(_epoch(i, steps=7), None)
    for i in range(10, 13):
        leader.close_epoch(_epoch(i, steps=5), None)
    leader.settle()
    assert not leader.exchange.late
    assert clock.now == waited
    made = leader.job_epoch(10)
    assert made is not None
    assert made[0].summary.steps == 7
    assert [r.rank for r in made[1]] == [0, 1]


def test_at_the_end_rank_0_takes_what_a_late_rank_sent_while_it_waited_for_another() -> None:
    """Three ranks: rank 2 noted late; at the end rank 0 waits for rank 1's final payload, and rank
    2 catches up meanwhile: its posts and final payload are taken, in order (none left behind)."""
    store, clock = DictStore(), Clock()
    leader = Job(RankInfo(0, 3), "host0", exchange(store, 0, clock, world=3))
    ranks = {r: Job(RankInfo(r, 3), f"host{r}", exchange(store, r, clock, world=3)) for r in (1, 2)}
    report = session.Session(ScopeConfig.create(None, console=False)).build_report(complete=True)
    leader.close_epoch(_epoch(0, steps=5), None)
    ranks[1].close_epoch(_epoch(0, steps=7), None)
    leader.close_epoch(_epoch(1, steps=5), None)  # rank 2 sent nothing by the deadline: late
    assert leader.exchange is not None
    assert leader.exchange.late == {2}
    ranks[1].close_epoch(_epoch(1, steps=7), None)
    real_sleep, slept = clock.sleep, []

    def sleep(seconds: float) -> None:  # while rank 0 waits for rank 1's final payload
        real_sleep(seconds)
        slept.append(seconds)
        if len(slept) == 2:
            for i in range(2):
                ranks[2].close_epoch(_epoch(i, steps=9), None)
            ranks[2].finish(report)
        if len(slept) == 5:
            ranks[1].finish(report)

    leader.exchange._sleep = sleep
    leader.finish(report)
    assert leader.exchange.done == {1, 2}
    assert store.empty()
    assert sorted(leader._latest) == [1, 2]


def test_a_rank_whose_posts_rank_0_cannot_read_is_never_waited_for() -> None:
    """A rank of another StallScope version: its word (when it posts next) is unknown, so rank 0
    neither waits for its posts nor holds the job's epochs for them."""
    store, clock = DictStore(), Clock()
    leader = Job(RankInfo(0, 2), "host0", exchange(store, 0, clock))
    other = Job(RankInfo(1, 2), "host1", exchange(store, 1, clock))
    other.run_every = 16
    real_post = other.exchange.post if other.exchange is not None else None
    assert real_post is not None

    def post_other_version(name: str, payload: dict[str, Any]) -> None:
        real_post(name, {**payload, "v": 999})

    other.exchange.post = post_other_version  # type: ignore[assignment,union-attr]
    for i in range(40):
        leader.close_epoch(_epoch(i, steps=5), None)
        other.close_epoch(_epoch(i, steps=7), None)
        assert clock.now == 0.0, i
        assert len(leader.epochs) >= i - 1, i  # made at once, with rank 0's numbers
    assert {e.summary.steps for e in leader.epochs} == {5}


def test_many_short_epochs_of_a_job_keep_to_the_budget(
    two_ranks: Callable[[int], None], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """400 epochs of three 1 ms steps on each rank, where a rank's run report costs 2 ms to make
    and a write 2 ms: each rank made its run report and wrote its file at every epoch end (more
    time than the training). Now a rank makes its run report a few times, each file is written a
    few times, and the job's report still has every epoch with every rank's numbers."""
    from conftest import FakeClock

    from stallscope.hooks import scope as scope_module
    from stallscope.report import writer as writer_module

    clock = FakeClock()
    monkeypatch.setattr(scope_module, "Session", functools.partial(session.Session, clock=clock, cpu_clock=clock))
    made: dict[int, int] = {}
    written: dict[str, int] = {}
    real_job, real_write = session.Session._report_job, writer_module.write_report

    def report_job(self: session.Session, *, complete: bool) -> Any:
        clock.advance_ms(2)
        rank = self.job.info.rank if self.job is not None else -1
        made[rank] = made.get(rank, 0) + 1
        return real_job(self, complete=complete)

    def write(report: Report, path: Path, *, durable: bool) -> None:
        clock.advance_ms(2)
        written[path.name] = written.get(path.name, 0) + 1
        real_write(report, path, durable=durable)

    monkeypatch.setattr(session.Session, "_report_job", report_job)
    monkeypatch.setattr(writer_module, "write_report", write)

    def train_steps(report_dir: Path, batches: int) -> Report | None:
        with StallScope(report_dir, console=False) as scope:
            for _ in range(400):
                for _batch in scope.iter(range(batches)):
                    with scope.phase("compute"):
                        clock.advance_ms(1)
        return scope.report

    two_ranks(1)
    train_steps(tmp_path / "node1", batches=3)
    two_ranks(0)
    job = train_steps(tmp_path / "node0", batches=2)
    assert job is not None
    assert made[1] <= 4  # instead of 401
    assert written["rank-1.json"] <= 4
    assert written["rank-0.json"] <= 4
    assert written["report.json"] <= 4
    assert made[0] <= 2 * written["report.json"] + written["rank-0.json"] + 2
    assert len(job.epochs) == 400
    assert {e.summary.steps for e in job.epochs} == {3}  # rank 1's (the longer) epoch in every one
    assert [(r.rank, r.steps, r.epochs) for r in job.ranks] == [(0, 800, 400), (1, 1200, 400)]
    assert not any("sent no summary" in n for n in job.notes)


def test_rank_0s_two_files_share_one_write_budget(
    two_ranks: Callable[[int], None], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Rank 0 writes the job's report.json and its own rank-0.json, 2 ms a write on a fake clock,
    over 8 s of 20-step epochs: their mid-run writes together keep to one budget (0.25% of the
    run, and a write's worth for each file's first), not one each."""
    from conftest import FakeClock

    from stallscope.hooks import scope as scope_module
    from stallscope.report import writer as writer_module
    from stallscope.report.writer import WRITE_SHARE

    clock = FakeClock()
    monkeypatch.setattr(scope_module, "Session", functools.partial(session.Session, clock=clock, cpu_clock=clock))
    mid_run: dict[str, int] = {}
    real_write = writer_module.write_report

    def write(report: Report, path: Path, *, durable: bool) -> None:
        clock.advance_ms(2)
        if not durable:
            mid_run[f"{path.parent.name}/{path.name}"] = mid_run.get(f"{path.parent.name}/{path.name}", 0) + 1
        real_write(report, path, durable=durable)

    monkeypatch.setattr(writer_module, "write_report", write)

    def train_steps(report_dir: Path) -> None:
        with StallScope(report_dir, console=False) as scope:
            for _ in range(400):
                for _batch in scope.iter(range(20)):
                    with scope.phase("compute"):
                        clock.advance_ms(1)

    two_ranks(1)
    train_steps(tmp_path / "node1")
    mid_run.clear()
    two_ranks(0)
    start = clock()
    train_steps(tmp_path / "node0")
    run_s = (clock() - start) / 1e9
    rank0 = mid_run.get("node0/report.json", 0) + mid_run.get("ranks/rank-0.json", 0)
    assert mid_run.get("node0/report.json", 0) >= 1
    assert mid_run.get("ranks/rank-0.json", 0) >= 1
    assert rank0 * 2e-3 <= WRITE_SHARE * run_s + 2 * 2e-3


def _epoch(index: int, steps: int = 4) -> Any:
    from stallscope.report.schema import EpochReport
    from stallscope.timeline.stats import Distribution

    span = replace(_span_for_cores(), steps=steps, step=Distribution.of([10**8] * steps))
    sess = session.Session(ScopeConfig.create(None, console=False))
    return EpochReport(index=index, summary=sess.summarize(span), findings=())


def _fake_clocked_ranks(monkeypatch: pytest.MonkeyPatch) -> Any:
    """Scopes made from now on read a fake clock (returned)."""
    from conftest import FakeClock

    from stallscope.hooks import scope as scope_module

    clock = FakeClock()
    monkeypatch.setattr(scope_module, "Session", functools.partial(session.Session, clock=clock, cpu_clock=clock))
    return clock


def test_the_jobs_report_adds_up_run_summaries_of_one_epoch_end(
    two_ranks: Callable[[int], None], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Rank 1's run report costs 8 ms with 1 s epochs: after its first epoch it sends it every 4th
    epoch. Rank 0, which heard of that only later, wrote a report.json with its own run as of
    epoch 2 beside rank 1's as of epoch 0 (found in review). Every report.json now has each rank's
    run as of the same epoch end."""
    from stallscope.report import writer as writer_module

    clock = _fake_clocked_ranks(monkeypatch)
    # rank 0's writes on its training thread, each when due: a first write held back (2 s of the
    # fake clock) went to the writer's thread, which timed it on the clock the training thread
    # was advancing meanwhile, and a busy machine then saw no mid-run write after it
    monkeypatch.setattr(session, "FIRST_WRITE_S", 0.0)
    real_job, real_write = session.Session._report_job, writer_module.write_report

    def report_job(self: session.Session, *, complete: bool) -> Any:
        if self.job is not None and not self.job.leader:
            clock.advance_ms(8)
        return real_job(self, complete=complete)

    written: list[list[tuple[int, int]]] = []

    def write(report: Report, path: Path, *, durable: bool) -> None:
        if path.name == "report.json":
            written.append([(r.steps, r.epochs) for r in report.ranks])
        real_write(report, path, durable=durable)

    monkeypatch.setattr(session.Session, "_report_job", report_job)
    monkeypatch.setattr(writer_module, "write_report", write)

    def train_slowly(report_dir: Path) -> Report | None:
        with StallScope(report_dir, console=False) as scope:
            for _ in range(10):
                for _batch in scope.iter(range(4)):
                    with scope.phase("compute"):
                        clock.advance_ms(250)
        return scope.report

    two_ranks(1)
    train_slowly(tmp_path / "node1")
    two_ranks(0)
    train_slowly(tmp_path / "node0")
    assert len(written) >= 3  # mid-run writes, and the final one
    for ranks in written:
        assert len(set(ranks)) == 1, ranks  # both ranks as of the same epoch end
    assert written[-1] == [(40, 10), (40, 10)]


def test_a_ranks_notes_are_in_scope_report_mid_run(
    two_ranks: Callable[[int], None], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A rank's notes come with its run summary (here every epoch: 1 s epochs); rank 0's
    ``scope.report`` takes the ranks' summaries before its own notes (found in review)."""
    clock = _fake_clocked_ranks(monkeypatch)
    two_ranks(1)
    with StallScope(tmp_path / "node1", console=False) as scope:
        for index in range(3):
            if index == 2:
                scope._session.note("hello from rank 1")
            for _batch in scope.iter(range(4)):
                with scope.phase("compute"):
                    clock.advance_ms(250)
    two_ranks(0)
    with StallScope(None, console=False) as scope:
        for _ in range(3):
            for _batch in scope.iter(range(4)):
                with scope.phase("compute"):
                    clock.advance_ms(250)
        mid_run = scope.report  # the last epoch ended; the run has not
        assert mid_run is not None
        assert not mid_run.complete
        assert "rank 1: hello from rank 1" in mid_run.notes


def test_a_load_note_is_said_once_per_machine() -> None:
    """Four ranks on one machine each saw the machine's load: the job's report says it once."""
    note = "other processes kept 1.6 of the machine's 2 cores busy during the run: ..."
    ranks = [
        RankEntry(r, "vm", 10, 1.0, 10.0, 0.1, {"compute": 1.0}, host_id="vm/a" if r < 4 else "vm/b") for r in range(5)
    ]
    notes = [note, *(f"rank {r}: {note}" for r in range(1, 5)), "rank 2: something else"]
    assert load_notes_once(notes, ranks) == (note, f"rank 4: {note}", "rank 2: something else")


def test_sibling_ranks_are_the_jobs_load_not_other_processes() -> None:
    """Two ranks on one 2-core machine: each one's sampler counted the other among the "other
    processes". The job's report counts them as the job's, and says once that they (with their
    workers) oversubscribe the machine."""
    job = Job(RankInfo(0, 2, 0), "vm", None, host_id=lambda: "vm/a")
    job.cores = 1
    job.load = {"own": 1.2, "others": 1.5, "machine": 2.0, "wall_s": 10.0}
    job._take({"v": 1, "rank": 1, "load": {"own": 1.0, "others": 1.6, "machine": 2, "wall_s": 10.0}})
    ranks = [RankEntry(r, "vm", 10, 1.0, 10.0, 0.1, {"compute": 1.0}, host_id="vm/a") for r in range(2)]
    note = "other processes kept 1.5 of the machine's 2 cores busy during the run: ..."
    notes = job.load_notes([note, f"rank 1: {note}", "something else"], ranks)
    assert notes == (
        "something else",
        "the job's 2 ranks on rank 0's machine and their workers kept 2.2 of its 2 cores busy on average: "
        "they oversubscribe it (each rank's diagnosis counts on 1 core)",
    )
    # a machine truly busy with others still says so, once, the job's own ranks aside
    job.load = {"own": 0.5, "others": 2.5, "machine": 4.0, "wall_s": 10.0}
    job._loads[1] = {"own": 0.4, "others": 2.6, "machine": 4.0, "wall_s": 10.0}
    (said,) = job.load_notes([note, f"rank 1: {note}"], ranks)
    assert said.startswith("other processes kept 2.1 of rank 0's machine's 4 cores busy")


def test_a_ranks_siblings_on_its_machine_are_the_jobs_not_other_processes() -> None:
    """Two ranks on a 2-core machine, each with one core busy: the sampler of each sees the other
    as "other processes" (one core of two, a disturbed run); the rank's diagnosis counts it as the
    job's. Processes beyond the job still count."""
    from types import SimpleNamespace

    from signal_fakes import host

    from stallscope.analysis.disturbance import disturbed

    def job(on_host: int | None, local_world: int | None) -> Any:
        return SimpleNamespace(ranks_on_host=lambda: on_host, info=SimpleNamespace(local_world_size=local_world))

    # the store told, torchrun's LOCAL_WORLD_SIZE, Lightning's devices, two nodes on two machines
    assert (
        session.ranks_here(job(2, 2)) == session.ranks_here(job(None, 2)) == session.ranks_here(job(None, None), 2) == 2
    )
    assert session.ranks_here(job(1, 2)) == session.ranks_here(None, 2) == 1
    quiet = host(wall_s=10.0, main_cpu_s=9.0, workers_cpu_s=1.0, cores=2, others_cores=1.0, machine_cores=2)
    assert disturbed(quiet)  # as the sampler saw it
    mine = session.without_siblings(quiet, 2)
    assert mine is not None
    assert mine.others_cores == pytest.approx(0.0)
    assert not disturbed(mine)
    busy = replace(quiet, others_cores=2.0)  # the sibling and a core of other work
    assert session.without_siblings(busy, 2).others_cores == pytest.approx(1.0)  # type: ignore[union-attr]
    assert session.without_siblings(quiet, 1) is quiet


def test_a_jobs_short_epochs_are_diagnosed_in_groups_and_name_the_slow_rank(
    two_ranks: Callable[[int], None], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """100 epochs of 30 steps of 1 ms compute on each rank, rank 1 waiting 2 ms a step for its
    data: every epoch keeps the job's summary (what the gather needs), and the job is diagnosed
    per group of epochs long enough together (34 epochs of 30 ms: 1.02 s), at each group's last
    epoch, with the cause on rank 1 ranked first; the run's end diagnoses the epochs left."""
    clock = _fake_clocked_ranks(monkeypatch)

    def train_steps(report_dir: Path, wait_ms: float) -> Report | None:
        with StallScope(report_dir, console=False) as scope:
            for _ in range(100):
                for _batch in scope.iter(_Waits(30, clock, wait_ms)):
                    with scope.phase("compute"):
                        clock.advance_ms(1)
        return scope.report

    two_ranks(1)
    train_steps(tmp_path / "node1", wait_ms=2.0)
    two_ranks(0)
    job = train_steps(tmp_path / "node0", wait_ms=0.0)
    assert job is not None
    assert len(job.epochs) == 100
    assert {e.summary.steps for e in job.epochs} == {30}
    closing = [e for e in job.epochs if e.diagnosed_with is None]
    assert [(e.index, e.covers_epochs) for e in closing] == [(33, (0, 33)), (67, (34, 67)), (99, (68, 99))]
    for e in job.epochs:
        if e.diagnosed_with is not None:
            assert not e.findings
            assert e.diagnosed_with == next(c.index for c in closing if c.index >= e.index)
    for e in closing[:2]:  # long enough to judge: rank 1's data first
        assert e.findings, e
        assert e.findings[0].evidence.get("rank") == 1, e.findings[0]
    assert job.findings[0].evidence.get("rank") == 1


class _Waits:
    """``n`` items, each after ``wait_ms`` on the fake clock."""

    def __init__(self, n: int, clock: Any, wait_ms: float) -> None:
        self.n, self.clock, self.wait_ms = n, clock, wait_ms

    def __iter__(self) -> Any:
        for i in range(self.n):
            self.clock.advance_ms(self.wait_ms)
            yield i


@pytest.fixture
def ddp_model() -> Any:
    """A real DDP module in a process group of one rank (gloo), for the forward-pass probe."""
    from datetime import timedelta

    import torch.distributed as dist
    from torch import nn

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1, timeout=timedelta(seconds=30))
    try:
        yield nn.parallel.DistributedDataParallel(nn.Linear(4, 2))
    finally:
        dist.destroy_process_group()


def test_a_jobs_short_epochs_wait_for_a_later_epoch_end_and_each_rank_keeps_its_word(
    two_ranks: Callable[[int], None], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, ddp_model: Any
) -> None:
    """60 epochs of 30 steps of 1 ms on each rank (a run report costs 2 ms to make), epoch k
    with 1 + k % 3 forward passes of the DDP model a step. Most epoch ends on both ranks only mark
    where the epoch ends (``Session._wait``) and close it at a later one; rank 1 still posts at
    every epoch end it said it would, its posts carry every epoch once and in order, each with
    its own forward passes (cut at its end), and the job's report has every epoch."""
    import torch

    from stallscope.timeline.recorder import Timeline

    clock = _fake_clocked_ranks(monkeypatch)
    real_job, real_mark, real_post = session.Session._report_job, Timeline.mark_epoch, Exchange.post
    current = {"rank": 1, "epoch": 0}
    marked: dict[int, int] = {}
    waited_on_0: set[int] = set()  # rank 0's epochs whose end only marked where it ends
    posts: list[dict[str, Any]] = []

    def report_job(self: session.Session, *, complete: bool) -> Any:
        clock.advance_ms(2)
        return real_job(self, complete=complete)

    def mark_epoch(self: Timeline, *args: Any, **kwargs: Any) -> Any:
        marked[current["rank"]] = marked.get(current["rank"], 0) + 1
        if current["rank"] == 0:
            waited_on_0.add(current["epoch"])
        return real_mark(self, *args, **kwargs)

    def post(self: Exchange, name: str, payload: dict[str, Any]) -> None:
        posts.append({**json.loads(json.dumps(payload)), "at": current["epoch"]})
        real_post(self, name, payload)

    monkeypatch.setattr(session.Session, "_report_job", report_job)
    monkeypatch.setattr(Timeline, "mark_epoch", mark_epoch)
    monkeypatch.setattr(Exchange, "post", post)
    x = torch.zeros(2, 4)

    def train_steps(report_dir: Path) -> Report | None:
        with StallScope(report_dir, console=False) as scope:
            for k in range(60):
                current["epoch"] = k  # the epoch whose end runs at the end of this loop
                for _batch in scope.iter(range(30)):
                    with scope.phase("compute"):
                        for _ in range(1 + k % 3):
                            ddp_model(x).sum().backward()
                        clock.advance_ms(1)
        return scope.report

    two_ranks(1)
    train_steps(tmp_path / "node1")
    sent_by_1 = list(posts)
    current["rank"] = 0
    two_ranks(0)
    job = train_steps(tmp_path / "node0")
    assert marked.get(1, 0) >= 30, marked  # most epoch ends waited, on both ranks
    assert marked.get(0, 0) >= 30, marked
    sent: list[int] = []
    promised: int | None = None
    for p in sent_by_1:
        batch = [item["index"] for item in p.get("batch", [])]
        if promised is not None and p["name"] != "final":  # at the end of the epoch it said, with it
            assert batch[-1] == p["at"] <= promised, (p["name"], batch, p["at"], promised)
        promised = p.get("next")
        sent += batch
        for item in p.get("batch", []):
            assert item["forward"]["calls"] == 30 * (1 + item["index"] % 3), item
    assert sent == list(range(60))
    assert 3 <= len(sent_by_1) <= 8  # in batches: not one post an epoch
    assert job is not None
    assert len(job.epochs) == 60
    assert {e.summary.steps for e in job.epochs} == {30}
    assert [(r.rank, r.steps, r.epochs) for r in job.ranks] == [(0, 1800, 60), (1, 1800, 60)]
    closing = [e for e in job.epochs if e.diagnosed_with is None]
    assert [(e.index, e.covers_epochs) for e in closing] == [(33, (0, 33)), (59, (34, 59))]
    assert not any("sent no summary" in n for n in job.notes)
    # rank 0's epoch ends that do work are rank 1's: where it posted, where both close a group
    # (and the first): a pause of either rank holds the other at the next all-reduce
    closed_on_0 = set(range(60)) - waited_on_0
    assert closed_on_0 <= {p["at"] for p in sent_by_1} | {0, 33, 59}, sorted(closed_on_0)
    assert len(closed_on_0) >= 4, sorted(closed_on_0)


def test_a_signal_in_the_users_code_is_told_from_one_in_stallscopes() -> None:
    """A SIGTERM's handler closes the epochs still waiting only where the signal interrupted the
    user's code (``Session._write_on_term``): a frame called from StallScope's own code, at any
    depth, is its; no frame to tell by counts as its too."""
    assert not session.in_own_code(sys._getframe())
    assert session.Later(lambda: session.in_own_code(sys._getframe())).get()
    assert session.Later(lambda: (lambda: session.in_own_code(sys._getframe()))()).get()
    assert session.in_own_code(None)
