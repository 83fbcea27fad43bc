"""The job's diagnosis (``analysis/job.py``, ``rules/dist_straggler.py``) on hand-made ranks.

The numbers are per step: a rank of 100 steps over 1.0 s steps at 10 ms. A fast rank's wait for
the slow one is inside its compute.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import pytest

from stallscope.analysis.finding import Finding
from stallscope.analysis.job import (
    RankWork,
    _compute_pace,
    common_findings,
    diagnose_job,
    find_pace,
    uneven_steps,
    unseen_wait_note,
)

MakeFinding = Callable[..., Finding]


def work(
    rank: int, *, data_ms: float, compute_ms: float, other_ms: float = 0.0, steps: int = 100, **kw: object
) -> RankWork:
    seconds = {"data": data_ms * steps / 1e3, "compute": compute_ms * steps / 1e3, "other": other_ms * steps / 1e3}
    return RankWork(rank=rank, steps=steps, wall_s=sum(seconds.values()), phase_seconds=seconds, **kw)  # type: ignore[arg-type]


def straggling_job(findings: tuple[Finding, ...] = ()) -> list[RankWork]:
    """Rank 1 reads for 8 ms a step; both compute 4 ms; rank 0 waits 8 ms inside its compute."""
    return [
        work(0, data_ms=0.5, compute_ms=12.0),
        work(1, data_ms=8.5, compute_ms=4.0, findings=findings),
    ]


def test_the_pace_setter_is_the_rank_whose_own_work_is_longest() -> None:
    pace = find_pace(straggling_job())
    assert pace is not None
    assert (pace.rank, pace.phase) == (1, "data")
    assert pace.wait_s[0] == pytest.approx(0.008)  # rank 0's compute beyond the purest one
    assert pace.wait_s[1] == pytest.approx(0.0)
    assert pace.job_step_s == pytest.approx(0.0125)
    assert pace.others_step_s == pytest.approx(0.0045)
    assert pace.excess_s == pytest.approx(0.008)


def test_a_fix_cannot_make_the_job_faster_than_its_next_rank() -> None:
    pace = find_pace(straggling_job())
    assert pace is not None
    assert pace.speedup(0.002) == pytest.approx(0.0125 / 0.0105)
    assert pace.speedup(1.0) == pytest.approx(0.0125 / 0.0045)


def test_alike_ranks_have_no_pace_setter() -> None:
    ranks = [work(0, data_ms=1.0, compute_ms=9.0), work(1, data_ms=1.3, compute_ms=8.8)]
    assert find_pace(ranks) is None
    assert find_pace(ranks[:1]) is None


def test_the_rank_own_finding_for_the_slow_phase_is_restated_for_the_job(make_finding: MakeFinding) -> None:
    # rank 1's own diagnosis: 4 workers save 60% of its 12.5 ms step (7.5 ms)
    cause = make_finding(est_saving_fraction=0.6, est_speedup=2.5, suggestion={"num_workers": 4})
    findings = diagnose_job(straggling_job((cause,)))
    top = findings[0]
    assert top.id == "data.workers"
    assert top.suggestion == {"num_workers": 4, "rank": 1}
    assert top.evidence["rank"] == 1
    assert top.evidence["phase"] == "data"
    # the job's step goes from 12.5 ms to max(12.5 - 7.5, 4.5) = 5 ms
    assert top.est_speedup == pytest.approx(2.5, abs=1e-3)
    assert top.est_saving_fraction == pytest.approx(0.6, abs=1e-3)
    assert "rank 1" in top.fix.lower()


def test_the_job_speedup_is_capped_by_the_other_ranks(make_finding: MakeFinding) -> None:
    cause = make_finding(est_saving_fraction=0.9, est_speedup=10.0)
    top = diagnose_job(straggling_job((cause,)))[0]
    assert top.est_speedup == pytest.approx(12.5 / 4.5, abs=1e-3)


def test_without_a_cause_the_finding_is_dist_straggler() -> None:
    top = diagnose_job(straggling_job())[0]
    assert top.id == "dist.straggler"
    assert top.evidence["rank"] == 1
    assert top.evidence["phase"] == "data"
    assert top.suggestion == {"rank": 1}
    # the data phase comes down to the others' 0.5 ms: 12.5 -> 4.5 ms
    assert top.est_speedup == pytest.approx(12.5 / 4.5, abs=1e-3)


def test_a_cause_of_another_phase_is_not_taken(make_finding: MakeFinding) -> None:
    unrelated = make_finding(id="checkpoint.frequency", suggestion={"every_n_steps": 500})
    top = diagnose_job(straggling_job((unrelated,)))[0]
    assert top.id == "dist.straggler"


def test_the_slow_phase_can_be_any_phase() -> None:
    ranks = [work(0, data_ms=1.0, compute_ms=12.0), work(1, data_ms=1.0, compute_ms=4.0, other_ms=8.0)]
    pace = find_pace(ranks)
    assert pace is not None
    assert (pace.rank, pace.phase) == (1, "other")


def test_ranks_of_different_epochs_are_compared_per_step() -> None:
    ranks = [
        work(0, data_ms=0.5, compute_ms=12.0, steps=50, epochs=1),
        work(1, data_ms=8.5, compute_ms=4.0, steps=200, epochs=4),
    ]
    pace = find_pace(ranks)
    assert pace is not None
    assert pace.rank == 1
    assert pace.excess_s == pytest.approx(0.008)


def test_alike_ranks_get_the_findings_they_all_have_with_the_smallest_saving(make_finding: MakeFinding) -> None:
    ranks = [
        work(
            0,
            data_ms=5.0,
            compute_ms=5.0,
            findings=(make_finding(est_saving_fraction=0.4), make_finding(id="host.sync")),
        ),
        work(1, data_ms=5.0, compute_ms=5.0, findings=(make_finding(est_saving_fraction=0.3),)),
    ]
    common = common_findings(ranks)
    assert [(f.id, f.est_saving_fraction) for f in common] == [("data.workers", 0.3)]
    assert [f.id for f in diagnose_job(ranks)] == ["data.workers"]
    assert not any(f.id == "dist.straggler" for f in diagnose_job(ranks))


def test_the_job_findings_respect_min_saving(make_finding: MakeFinding) -> None:
    ranks = [
        work(0, data_ms=5.0, compute_ms=5.0, findings=(make_finding(est_saving_fraction=0.01),)),
        work(1, data_ms=5.0, compute_ms=5.0, findings=(make_finding(est_saving_fraction=0.01),)),
    ]
    assert diagnose_job(ranks, min_saving=0.02) == []


def test_a_gap_below_a_fifth_of_the_step_is_noise_not_a_straggler() -> None:
    # rank 1's own work is 10 ms + 1.5 ms of data: 13% more than rank 0's 10 ms
    assert find_pace([work(0, data_ms=0.0, compute_ms=11.5), work(1, data_ms=1.5, compute_ms=10.0)]) is None
    # 3 ms: 23% of the 13 ms job step
    pace = find_pace([work(0, data_ms=0.0, compute_ms=13.0), work(1, data_ms=3.0, compute_ms=10.0)])
    assert pace is not None
    assert pace.rank == 1


def test_uneven_shards_are_no_straggler() -> None:
    """Rank 1 ran half the steps and waited for rank 0 at its shard's end (DDP's Join): per step
    it looks twice as slow, but the ranks ran uneven shares of the data."""
    ranks = [
        work(0, data_ms=1.0, compute_ms=9.0, steps=60),
        work(1, data_ms=1.0, compute_ms=9.0, other_ms=10.0, steps=30),
    ]
    assert find_pace(ranks) is None
    assert diagnose_job(ranks) == []
    assert uneven_steps(ranks) is not None
    assert str(uneven_steps(ranks)).startswith("rank 1 ran 30 steps, rank 0 60: uneven shards")


def test_ranks_that_closed_different_epochs_are_compared_per_epoch() -> None:
    ranks = [
        RankWork(0, 60, 0.6, {"compute": 0.6}, epochs=3),
        RankWork(1, 20, 0.2, {"compute": 0.2}, epochs=1),  # it died after its first epoch
    ]
    assert uneven_steps(ranks) is None
    # its latest summary is older than rank 0's, and it runs half the steps an epoch
    late = [ranks[0], RankWork(1, 10, 0.2, {"compute": 0.2}, epochs=1)]
    assert str(uneven_steps(late)).startswith("rank 1 ran 10 steps an epoch, rank 0 20: uneven shards")
    assert find_pace(late) is None
    assert uneven_steps([*ranks[:1], RankWork(1, 56, 0.6, {"compute": 0.6}, epochs=3)]) is None  # within 10%


def compute_straggling_job(forward_1_ms: float, forward_0_ms: float = 1.0) -> list[RankWork]:
    """Both ranks' compute reads 9 ms a step (rank 0 waits inside its backward); rank 1's forward
    takes ``forward_1_ms`` against rank 0's ``forward_0_ms``."""
    return [
        work(0, data_ms=1.0, compute_ms=9.0, forward_s=forward_0_ms / 1e3),
        work(1, data_ms=1.0, compute_ms=9.0, forward_s=forward_1_ms / 1e3),
    ]


def test_a_compute_straggler_is_found_by_its_forward() -> None:
    pace = find_pace(compute_straggling_job(2.0))
    assert pace is not None
    assert (pace.rank, pace.phase) == (1, "compute")
    # rank 1's compute scales with its forward (9 ms for 2 ms): its extra work is 4.5 ms a step
    assert pace.excess_s == pytest.approx(0.0045)
    assert pace.wait_s[0] == pytest.approx(0.0045)
    assert pace.speedup(pace.excess_s) == pytest.approx(10.0 / 5.5)
    (top,) = diagnose_job(compute_straggling_job(2.0))
    assert top.id == "dist.straggler"
    assert (top.evidence["rank"], top.evidence["phase"]) == (1, "compute")
    assert top.evidence["forward_ms"] == {"0": 1.0, "1": 2.0}
    assert "forward takes 2.0x" in top.title
    assert "uneven shapes or sequence lengths" in top.fix


def test_a_compute_stragglers_extra_work_is_its_own_work_beyond_the_others_where_measured() -> None:
    """Steps of 9 ms, most of it the all-reduce: the ranks' own work is 2 ms (rank 0) and 4 ms
    (rank 1) a step. The compute-to-forward scale would bill the collective to rank 1's forward
    (4.5 ms of extra work); its own work beyond rank 0's is 2 ms."""
    ranks = [
        work(0, data_ms=1.0, compute_ms=9.0, forward_s=0.001, cycle_s=0.002),
        work(1, data_ms=1.0, compute_ms=9.0, forward_s=0.002, cycle_s=0.004),
    ]
    pace = find_pace(ranks)
    assert pace is not None
    assert (pace.rank, pace.phase) == (1, "compute")
    assert pace.excess_s == pytest.approx(0.002)
    assert pace.wait_s[0] == pytest.approx(0.002)
    assert pace.speedup(pace.excess_s) == pytest.approx(10.0 / 8.0)
    (top,) = diagnose_job(ranks)
    assert top.est_speedup == pytest.approx(1.25)
    assert top.evidence["own_work_ms"] == {"0": 2.0, "1": 4.0}
    # a rank without the measure: the scale it was before, for every rank
    ranks[0] = work(0, data_ms=1.0, compute_ms=9.0, forward_s=0.001)
    pace = find_pace(ranks)
    assert pace is not None
    assert pace.excess_s == pytest.approx(0.0045)


def test_a_compute_stragglers_extra_work_is_in_wall_time_at_its_own_stretch() -> None:
    """What the Lightning job read beside two CPU spinners on the 2-core machine (24 steps; CI saw
    the same failure, its figures cut from the log): rank 1 runs the model
    four times, 22.3 ms of its own CPU work a step against rank 0's 9.1 ms. Rank 0's short
    forwards, beside rank 1's, took 4.6 times their CPU time in wall time, rank 1's 2.2 times:
    the difference of the two stretched cycles (6 ms, 11% of the step) named no one. Rank 1 would
    do without 13.1 ms of CPU work, which takes 2.2 times as long there: 28.9 ms a step, and rank
    0 waits as long (taking its own stretch there left it 7 ms of wait and the job x1.12)."""
    ranks = [
        work(0, data_ms=3.4, compute_ms=49.3, other_ms=4.3, steps=24, forward_s=0.00155, cycle_s=0.00915, stretch=4.6),
        work(1, data_ms=2.3, compute_ms=49.7, other_ms=4.0, steps=24, forward_s=0.0054, cycle_s=0.0223, stretch=2.2),
    ]
    pace = find_pace(ranks)
    assert pace is not None
    assert (pace.rank, pace.phase, pace.outside_forward) == (1, "compute", False)
    assert pace.excess_s == pytest.approx((0.0223 - 0.00915) * 2.2)
    assert pace.wait_s[0] == pytest.approx(pace.excess_s)
    step = (3.4 + 49.3 + 4.3) / 1e3
    assert pace.others_step_s == pytest.approx(step - pace.excess_s)
    (top,) = diagnose_job(ranks)
    assert top.est_speedup == pytest.approx((2.3 + 49.7 + 4.0) / 1e3 / (step - pace.excess_s), abs=1e-3)
    assert top.est_speedup > 1.9
    assert top.evidence["own_work_ms"] == {"0": 9.15, "1": 22.3}
    assert top.evidence["stretch"] == {"0": 4.6, "1": 2.2}
    # quiet machine: no stretch said
    quiet = [replace(r, stretch=1.0) for r in ranks]
    (top,) = diagnose_job(quiet)
    assert "stretch" not in top.evidence
    assert find_pace(quiet).excess_s == pytest.approx(0.0223 - 0.00915)  # type: ignore[union-attr]


def test_a_slow_rank_whose_extra_work_leaves_the_job_no_faster_sets_no_pace() -> None:
    """Rank 1's forward and own work stand out, but rank 0's step less its wait (its compute is
    5 ms, all it can wait in) is still longer than rank 1's: the measures disagree, and rank 1 is
    not named by its compute, rather than in a finding of no speedup that the report drops
    without a word (no pace-setter: the job's note says it cannot tell)."""
    ranks = [
        work(0, data_ms=50.0, compute_ms=5.0, forward_s=0.001, cycle_s=0.005),
        work(1, data_ms=5.0, compute_ms=40.0, forward_s=0.004, cycle_s=0.020),
    ]
    assert _compute_pace(ranks) is None
    faster = work(0, data_ms=30.0, compute_ms=5.0, forward_s=0.001, cycle_s=0.005)  # a step of 35 ms
    assert _compute_pace([faster, ranks[1]]) is not None


def test_a_compute_straggler_whose_extra_work_is_outside_its_forward_is_found_by_its_own_work() -> None:
    """Rank 1 does 2.5 ms of its own work a step before its forward (an extra loss, a metric):
    the forwards are alike, both ranks' compute reads 3.8 ms (rank 0 waits inside its backward),
    and the training threads' own work a step (CPU from one forward to the next) is 1.3 against
    3.7 ms. The helper's torchrun job read just that, and was told "no fix"."""
    ranks = [
        work(0, data_ms=0.2, compute_ms=3.8, steps=100, forward_s=0.0003, cycle_s=0.0013),
        work(1, data_ms=0.2, compute_ms=3.8, steps=100, forward_s=0.0003, cycle_s=0.0037),
    ]
    pace = find_pace(ranks)
    assert pace is not None
    assert (pace.rank, pace.phase, pace.outside_forward) == (1, "compute", True)
    assert pace.excess_s == pytest.approx(0.0024)
    assert pace.wait_s[0] == pytest.approx(0.0024)
    (top,) = diagnose_job(ranks)
    assert top.id == "dist.straggler"
    assert top.evidence["rank"] == 1
    assert "its own work takes 2.8x the other ranks' (3.7 ms of CPU time a step against 1.3 ms, outside" in top.title
    assert "outside its forward pass" in top.fix
    assert unseen_wait_note(ranks) is None  # named, so not an unseen wait
    # the same own work on both ranks: nobody stands out
    alike = [ranks[0], work(1, data_ms=0.2, compute_ms=3.8, steps=100, forward_s=0.0003, cycle_s=0.0014)]
    assert find_pace(alike) is None
    # a job of fewer steps than a diagnosis judges (24): 24 cycles on a very busy machine differed
    # by 2.5x between two healthy ranks (CI's twin pass), so its own work names no one
    short = [
        work(r, data_ms=0.2, compute_ms=3.8, steps=24, forward_s=0.0003, cycle_s=c)
        for r, c in ((0, 0.0013), (1, 0.0037))
    ]
    assert find_pace(short) is None


def test_own_work_alike_is_too_little_extra_for_a_straggler() -> None:
    """The forwards differ (rank 1 runs a cheap second pass), but its own work a step does not:
    no straggler to name, rather than a guess scaled from the forward."""
    ranks = [
        work(0, data_ms=1.0, compute_ms=9.0, forward_s=0.001, cycle_s=0.0050),
        work(1, data_ms=1.0, compute_ms=9.0, forward_s=0.002, cycle_s=0.0055),
    ]
    assert find_pace(ranks) is None


def test_forwards_alike_or_untimed_name_no_compute_straggler() -> None:
    assert find_pace(compute_straggling_job(1.4)) is None  # within the noise of alike ranks
    assert find_pace(compute_straggling_job(0.5, forward_0_ms=0.25)) is None  # 2x, but 0.25 ms: noise
    untimed = [work(0, data_ms=1.0, compute_ms=9.0), work(1, data_ms=1.0, compute_ms=9.0, forward_s=0.002)]
    assert find_pace(untimed) is None


def test_extra_host_work_on_one_rank_is_told_as_host_code() -> None:
    ranks = [work(0, data_ms=1.0, compute_ms=9.0), work(1, data_ms=1.0, compute_ms=4.0, other_ms=5.0)]
    (top,) = diagnose_job(ranks)
    assert (top.evidence["rank"], top.evidence["phase"]) == (1, "other")
    assert "host code" in top.fix
    assert "storage" not in top.fix


def test_a_wait_no_rank_can_be_named_for_is_said_not_hidden() -> None:
    # forward passes timed and alike, but rank 0's compute holds 4 ms more than its forward explains
    timed = [
        work(0, data_ms=1.0, compute_ms=9.0, forward_s=0.001),
        work(1, data_ms=1.5, compute_ms=5.0, forward_s=0.001),
    ]
    assert find_pace(timed) is None
    note = unseen_wait_note(timed)
    assert note is not None
    assert note.startswith("the ranks wait for each other about 20% of the step, and StallScope cannot tell which rank")
    # no forward timed (no DDP module): the compute share bounds the wait
    untimed = [work(0, data_ms=1.0, compute_ms=9.0), work(1, data_ms=1.0, compute_ms=9.0)]
    assert str(unseen_wait_note(untimed)).startswith("the ranks may wait for each other inside compute (up to 90%")
    alike = [
        work(0, data_ms=1.0, compute_ms=9.0, forward_s=0.001),
        work(1, data_ms=1.0, compute_ms=9.0, forward_s=0.001),
    ]
    assert unseen_wait_note(alike) is None
    assert unseen_wait_note(compute_straggling_job(2.0)) is None  # a pace-setter is named instead
