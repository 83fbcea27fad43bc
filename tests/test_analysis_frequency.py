from __future__ import annotations

import pytest

from stallscope.analysis.context import AnalysisConfig, Context
from stallscope.analysis.rules._frequency import estimate
from stallscope.timeline.phases import BUILTIN_PHASES
from stallscope.timeline.stats import Distribution, SpanStats

S = 1_000_000_000  # ns per second


def _ctx(*, wall_ns: int, steps: int, phase: str, count: int, total_ns: int) -> Context:
    phase_ns = dict.fromkeys(BUILTIN_PHASES, 0)
    phase_ns[phase] = total_ns
    phase_ns["compute"] = wall_ns - total_ns
    counts = dict.fromkeys(BUILTIN_PHASES, 0)
    counts[phase] = count
    span = SpanStats(
        wall_ns=wall_ns,
        steps=steps,
        epochs=1,
        phase_ns=phase_ns,
        phase_counts=counts,
        step_total_ns=wall_ns,
        step=Distribution.of([wall_ns // max(steps, 1)]),
        data_wait=Distribution.of([0]),
        data_cpu_ns=None,
        process_cpu_ns=0,
    )
    return Context(span=span, loader=None, cores=2, config=AnalysisConfig())


def test_checkpoint_every_100_steps_should_be_every_500() -> None:
    # 1000 steps of 0.1 s of work, plus 10 saves of 1 s each: 110 s of wall time
    ctx = _ctx(wall_ns=110 * S, steps=1000, phase="checkpoint", count=10, total_ns=10 * S)
    est = estimate(ctx, "checkpoint", target_share=0.02)
    assert est is not None
    assert est.count == 10
    assert est.each_s == pytest.approx(1.0)
    assert est.step_without_s == pytest.approx(0.1)
    assert est.interval_now == pytest.approx(100.0)
    # 1 s / (0.02 * 0.1 s) = 500 steps between saves
    assert est.interval == 500
    # after: 1000 / 500 = 2 saves = 2 s instead of 10 s; (10 - 2) / 110 of the wall time
    assert est.saving == pytest.approx(8 / 110, abs=5e-5)
    assert est.share_now == pytest.approx(10 / 110)
    assert est.evidence() == {
        "phase": "checkpoint",
        "count": 10,
        "each_ms": 1000.0,
        "share_of_wall": 0.0909,
        "every_n_steps_now": 100.0,
        "step_without_ms": 100.0,
        "slower_after_each_ms": 0.0,  # no steps recorded one by one
    }


def test_logging_every_step_rounds_up_to_a_nice_interval() -> None:
    # 1000 steps of 50 ms of work, each followed by 7 ms of logging
    ctx = _ctx(wall_ns=57 * S, steps=1000, phase="logging", count=1000, total_ns=7 * S)
    est = estimate(ctx, "logging", target_share=0.01)
    assert est is not None
    # 7 ms / (0.01 * 50 ms) = 14 -> the next round interval is 20
    assert est.interval == 20
    assert est.interval_now == pytest.approx(1.0)
    # after: 1000 / 20 = 50 logs of 7 ms = 0.35 s instead of 7 s
    assert est.saving == pytest.approx((7 - 0.35) / 57, abs=5e-5)
    # at that interval the phase costs at most the target share of a step's work
    assert est.each_s / est.interval <= 0.01 * est.step_without_s


def test_several_runs_per_step_count_too() -> None:
    # validation-like: run 3 times per step, 10 ms each, over 100 steps of 20 ms
    ctx = _ctx(wall_ns=5 * S, steps=100, phase="validation", count=300, total_ns=3 * S)
    est = estimate(ctx, "validation", target_share=0.05)
    assert est is not None
    assert est.interval_now == pytest.approx(1 / 3)
    assert est.interval == 10  # 10 ms / (0.05 * 20 ms) = 10
    assert est.saving == pytest.approx((3 - 100 / 10 * 0.01) / 5, abs=5e-5)


def test_already_infrequent_enough_gives_nothing() -> None:
    # one 1 s save in 1000 steps of 0.1 s: the suggested interval (500) is not above the current one
    ctx = _ctx(wall_ns=101 * S, steps=1000, phase="checkpoint", count=1, total_ns=1 * S)
    assert estimate(ctx, "checkpoint", target_share=0.02) is None


@pytest.mark.parametrize(
    ("wall_ns", "steps", "count", "total_ns", "target"),
    [
        (10 * S, 100, 0, 0, 0.02),  # the phase never ran
        (10 * S, 0, 5, 1 * S, 0.02),  # no steps
        (10 * S, 100, 5, 0, 0.02),  # ran but took no time
        (0, 100, 5, 0, 0.02),  # empty span
        (10 * S, 100, 5, 1 * S, 0.0),  # no target
    ],
)
def test_nothing_to_estimate(wall_ns: int, steps: int, count: int, total_ns: int, target: float) -> None:
    ctx = _ctx(wall_ns=wall_ns, steps=steps, phase="checkpoint", count=count, total_ns=total_ns)
    assert estimate(ctx, "checkpoint", target_share=target) is None


def test_a_phase_that_is_all_of_the_wall_time_stays_finite() -> None:
    ctx = _ctx(wall_ns=10 * S, steps=10, phase="checkpoint", count=10, total_ns=10 * S)
    est = estimate(ctx, "checkpoint", target_share=0.02)
    assert est is not None
    assert 0.0 <= est.saving <= 1.0
    assert est.step_without_s > 0
