"""``tune.stats``: the realized speedup's interval from interleaved pairs, and the verdict."""

from __future__ import annotations

import math

import pytest

from stallscope.tune.stats import decide, paired_speedup, t95


def test_identical_pairs_give_an_exact_speedup() -> None:
    s = paired_speedup([(10.0, 15.0)] * 3)
    assert s.median == pytest.approx(1.5)
    assert s.low == pytest.approx(1.5)
    assert s.high == pytest.approx(1.5)
    assert s.pairs == 3
    assert decide(s, 0.02) == "keep"


def test_the_interval_is_students_t_on_the_log_ratios() -> None:
    s = paired_speedup([(10.0, 12.0), (10.0, 15.0), (10.0, 13.0)])
    logs = [math.log(1.2), math.log(1.5), math.log(1.3)]
    mean = sum(logs) / 3
    sd = math.sqrt(sum((x - mean) ** 2 for x in logs) / 2)
    half = 2.920 * sd / math.sqrt(3)
    assert s.low == pytest.approx(math.exp(mean - half))
    assert s.high == pytest.approx(math.exp(mean + half))
    assert s.median == pytest.approx(1.3)


def test_a_wide_interval_across_the_threshold_is_undecided_and_one_below_is_dropped() -> None:
    wide = paired_speedup([(10.0, 8.0), (10.0, 14.0), (10.0, 11.0)])
    assert wide.low < 1.02 < wide.high
    assert decide(wide, 0.02) == "undecided"
    slower = paired_speedup([(10.0, 8.0), (10.0, 8.2), (10.0, 7.9)])
    assert decide(slower, 0.02) == "drop"
    assert decide(paired_speedup([(10.0, 20.0)]), 0.02) == "undecided"  # one pair: no interval


def test_a_saving_below_min_saving_is_not_kept() -> None:
    s = paired_speedup([(10.0, 10.1)] * 4)  # surely faster, by 1%
    assert decide(s, 0.02) == "drop"
    assert decide(s, 0.0) == "keep"


def test_bad_input_is_refused() -> None:
    with pytest.raises(ValueError, match="no pairs"):
        paired_speedup([])
    with pytest.raises(ValueError, match="must be > 0"):
        paired_speedup([(0.0, 1.0)])
    with pytest.raises(ValueError, match="df must be"):
        t95(0)
    assert t95(100) == pytest.approx(1.645)
