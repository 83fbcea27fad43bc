"""Aligning utilization with the timeline: segments from probes, shares per sample, the fit."""

from __future__ import annotations

import pytest

from stallscope.signals.correlate import PhaseCorrelator, UtilTally, split
from stallscope.timeline.recorder import PhaseProbe

MS = 1_000_000
DATA, COMPUTE, OTHER = 0, 2, 6


def probe(now_ms: float, phase: int, since_ms: float, totals_ms: dict[int, float]) -> PhaseProbe:
    totals = [0] * 7
    for p, v in totals_ms.items():
        totals[p] = round(v * MS)
    return PhaseProbe(round(now_ms * MS), phase, round(since_ms * MS), tuple(totals))


def test_no_change_of_phase_gives_one_pure_segment() -> None:
    a = probe(100, COMPUTE, 50, {OTHER: 50})
    b = probe(300, COMPUTE, 50, {OTHER: 50})
    (seg,) = split(a, b)
    assert (seg.start_ns, seg.end_ns, seg.shares) == (100 * MS, 300 * MS, ((COMPUTE, 1.0),))


def test_a_change_splits_into_known_totals_and_the_pure_tail() -> None:
    # compute from 50 (probe a at 100), data from 180, compute again from 260, probe b at 300
    a = probe(100, COMPUTE, 50, {OTHER: 50})
    b = probe(300, COMPUTE, 260, {OTHER: 50, COMPUTE: 130, DATA: 80})
    mixed, tail = split(a, b)
    assert (mixed.start_ns, mixed.end_ns) == (100 * MS, 260 * MS)
    assert dict(mixed.shares) == pytest.approx({COMPUTE: 80 / 160, DATA: 80 / 160})
    assert (tail.start_ns, tail.end_ns, tail.shares) == (260 * MS, 300 * MS, ((COMPUTE, 1.0),))


def test_a_mark_moved_without_a_change_stays_pure() -> None:
    """An epoch end credits the current phase and moves the mark: still one phase."""
    a = probe(100, DATA, 40, {OTHER: 40})
    b = probe(200, DATA, 150, {OTHER: 40, DATA: 110})
    segments = split(a, b)
    assert [s.shares for s in segments] == [((DATA, 1.0),), ((DATA, 1.0),)]


def test_custom_phases_registered_later_are_padded() -> None:
    a = probe(100, OTHER, 0, {})
    b = PhaseProbe(200 * MS, 7, 150 * MS, (0, 0, 0, 0, 0, 0, 125 * MS, 25 * MS))
    mixed, _ = split(a, b)
    assert dict(mixed.shares) == {OTHER: 0.5, 7: 0.5}


def test_shares_of_a_sample_across_segments() -> None:
    corr = PhaseCorrelator()
    corr.observe(probe(0, DATA, 0, {}))
    corr.observe(probe(100, DATA, 0, {}))  # (0, 100] data
    corr.observe(probe(200, COMPUTE, 100, {DATA: 100}))  # (100, 200] compute
    shares, covered, exact = corr.shares(50 * MS, 150 * MS)
    assert shares == pytest.approx({DATA: 0.5, COMPUTE: 0.5})
    assert (covered, exact) == (100 * MS, 1.0)
    # later samples drop segments they can no longer reach
    corr.shares(150 * MS, 200 * MS)
    assert corr.segments == 1
    # time beyond the last probe is not covered
    _, covered, _ = corr.shares(180 * MS, 260 * MS)
    assert covered == 20 * MS


def test_tally_mean_and_percentiles() -> None:
    tally = UtilTally()
    for u in (0.0, 0.1, 0.5, 0.9, 1.0):
        tally.add_sample(u, 10 * MS)
    tally.add_sample(1.7, 10 * MS)  # clamped
    assert tally.mean() == pytest.approx((0.0 + 0.1 + 0.5 + 0.9 + 1.0 + 1.0) / 6)
    assert tally.quantile(0.5) == 0.5  # lower median of 0, .1, .5, .9, 1, 1
    assert tally.quantile(0.0) == 0.0
    assert UtilTally().mean() is None
    assert UtilTally().quantile(0.5) is None


def test_pure_samples_give_plain_means_per_phase() -> None:
    tally = UtilTally()
    for _ in range(20):
        tally.add_row({DATA: 1.0}, 10 * MS, 0.02)
        tally.add_row({COMPUTE: 1.0}, 10 * MS, 0.95)
    assert tally.by_phase() == pytest.approx({DATA: 0.02, COMPUTE: 0.95}, abs=1e-3)
    assert tally.resolution() == 1.0


def test_mixed_samples_are_separated_by_least_squares() -> None:
    tally = UtilTally()
    for i in range(40):
        x = 0.1 + 0.8 * (i % 9) / 8  # the mix varies from sample to sample
        tally.add_row({DATA: 1 - x, COMPUTE: x}, 10 * MS, 0.02 * (1 - x) + 0.95 * x)
    assert tally.by_phase() == pytest.approx({DATA: 0.02, COMPUTE: 0.95}, abs=0.01)
    assert tally.resolution() == 0.0


def test_a_mix_that_never_varies_is_left_out_rather_than_blended() -> None:
    tally = UtilTally()
    for i in range(40):
        x = 0.6 + 0.002 * (i % 3)
        tally.add_row({DATA: 1 - x, COMPUTE: x}, 10 * MS, round(0.02 * (1 - x) + 0.95 * x, 2))
    assert tally.by_phase() == {}


def test_samples_with_uncertain_shares_are_left_out() -> None:
    tally = UtilTally()
    tally.add_row({DATA: 0.5, COMPUTE: 0.5}, 10 * MS, 0.5, exact=0.2)
    assert tally.rows == 0
    assert tally.by_phase() == {}


def test_rarely_seen_phases_get_no_number() -> None:
    tally = UtilTally()
    for _ in range(400):
        tally.add_row({COMPUTE: 1.0}, 10 * MS, 0.9)
    tally.add_row({DATA: 1.0}, 10 * MS, 0.0)
    assert set(tally.by_phase()) == {COMPUTE}
