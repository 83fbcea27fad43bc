"""The gate's statistics (stallscope.analysis.gate_stats) against numbers worked out by hand or
read from printed tables."""

from __future__ import annotations

import math

import pytest
from gate_reports import windows

from stallscope.analysis.gate_stats import (
    Window,
    block_length,
    bootstrap_increase,
    paired_spread,
    prediction_spread,
    t_central,
    t_quantile,
    weighted_mean,
)


def _w(values: list[float]) -> list[Window]:
    return [Window(v, 1.0) for v in values]


# -- Student's t: values from a printed t table ------------------------------------------------


@pytest.mark.parametrize(
    ("q", "df", "table"),
    [
        (0.99, 1, 31.821),
        (0.99, 2, 6.965),
        (0.99, 4, 3.747),
        (0.99, 9, 2.821),
        (0.975, 10, 2.228),
        (0.95, 3, 2.353),
        (0.995, 2, 9.925),
        (0.99, 120, 2.358),
    ],
)
def test_t_quantile_matches_the_table(q: float, df: int, table: float) -> None:
    assert t_quantile(q, df) == pytest.approx(table, abs=1e-3)


def test_t_central_closed_forms() -> None:
    # df = 1 is the Cauchy distribution: P(|T| < 1) = 2 atan(1) / pi = 1/2
    assert t_central(1.0, 1) == pytest.approx(0.5)
    # df = 2: P(|T| < t) = t / sqrt(2 + t^2); t = 2 gives 2 / sqrt(6)
    assert t_central(2.0, 2) == pytest.approx(2 / math.sqrt(6))
    assert t_central(0.0, 7) == 0.0


@pytest.mark.parametrize(("q", "df"), [(0.4, 3), (1.0, 3), (0.99, 0)])
def test_t_quantile_rejects_bad_arguments(q: float, df: int) -> None:
    with pytest.raises(ValueError, match="must be"):
        t_quantile(q, df)


# -- the runs' spread --------------------------------------------------------------------------


def test_prediction_bound_of_three_runs() -> None:
    """30%, 32%, 34%: mean 32%, sd 2 points; 99% bound = 0.32 + 6.9646 * 0.02 * sqrt(4/3) = 0.48084."""
    sp = prediction_spread([0.30, 0.32, 0.34], 0.99)
    assert sp.n == 3
    assert sp.mean == pytest.approx(0.32)
    assert sp.sd == pytest.approx(0.02)
    assert sp.t == pytest.approx(6.9646, abs=1e-4)
    assert sp.factor == pytest.approx(8.0420, abs=1e-3)
    assert sp.bound == pytest.approx(0.48084, abs=1e-4)


def test_prediction_bound_needs_three_runs() -> None:
    two = prediction_spread([0.30, 0.34], 0.99)
    assert two.sd == pytest.approx(math.sqrt(0.0008))  # deviations of 2 points, n - 1 = 1
    assert two.bound is None
    assert two.t is None
    one = prediction_spread([0.30], 0.99)
    assert one.sd is None
    assert one.bound is None
    with pytest.raises(ValueError, match="at least one"):
        prediction_spread([], 0.99)


def test_paired_bound() -> None:
    """Differences 10, 12, 14 points: mean 12, sd 2; bound = 6.9646 * 0.02 / sqrt(3) = 0.080420."""
    sp = paired_spread([0.10, 0.12, 0.14], 0.99)
    assert sp.mean == pytest.approx(0.12)
    assert sp.factor == pytest.approx(4.0210, abs=1e-3)
    assert sp.bound == pytest.approx(0.080420, abs=1e-4)


# -- the block bootstrap -----------------------------------------------------------------------


@pytest.mark.parametrize(("k", "block"), [(1, 1), (8, 2), (10, 2), (27, 3), (64, 4), (256, 6)])
def test_block_length_is_the_cube_root(k: int, block: int) -> None:
    assert block_length(k) == block


def test_one_block_of_the_whole_run_returns_its_mean() -> None:
    """A block as long as the run is a rotation of it: every resample has the run's own mean."""
    cur, base = [0.2, 0.4, 0.9, 0.1], [0.1, 0.1, 0.3, 0.3]  # means 0.4 and 0.2
    iv = bootstrap_increase([_w(cur)], [_w(base)], block=4, resamples=200)
    assert iv.low == pytest.approx(0.2)
    assert iv.high == pytest.approx(0.2)
    assert iv.block_windows == 4


def test_periodic_bursts_are_structure_not_noise_with_blocks_of_their_period() -> None:
    """One burst every 5 windows: any 5 neighbours (circularly) hold exactly one burst, so the
    resampled mean is always (0.9 + 4 * 0.3) / 5 = 0.42; against a flat 0.30 baseline, +12 points."""
    bursty = [0.9, 0.3, 0.3, 0.3, 0.3] * 4
    flat = [0.3] * 20
    blocks = bootstrap_increase([_w(bursty)], [_w(flat)], block=5, resamples=300)
    assert blocks.low == pytest.approx(0.12)
    assert blocks.high == pytest.approx(0.12)
    single = bootstrap_increase([_w(bursty)], [_w(flat)], block=1, resamples=300)
    assert single.high - single.low > 0.1  # resampling single windows scatters the bursts


def test_blocks_widen_the_interval_of_a_slow_stretch() -> None:
    """Neighbouring windows alike (a slow stretch): single-window resampling is too confident."""
    run = [0.2] * 16 + [0.6] * 16
    flat = [0.4] * 32
    single = bootstrap_increase([_w(run)], [_w(flat)], block=1, resamples=500)
    blocks = bootstrap_increase([_w(run)], [_w(flat)], block=8, resamples=500)
    assert blocks.high - blocks.low > single.high - single.low


def test_several_runs_per_side_average_their_means() -> None:
    iv = bootstrap_increase([_w([0.5] * 8)], [_w([0.2] * 8), _w([0.4] * 8)], resamples=100)
    assert iv.low == pytest.approx(0.2)
    assert iv.high == pytest.approx(0.2)
    assert (iv.current_windows, iv.baseline_windows) == (8, 16)


def test_bootstrap_is_deterministic_for_a_seed() -> None:
    cur, base = [_w(windows(0.45, 12, seed=3))], [_w(windows(0.4, 12, seed=4))]
    assert bootstrap_increase(cur, base, seed=7) == bootstrap_increase(cur, base, seed=7)
    assert bootstrap_increase(cur, base, seed=7) != bootstrap_increase(cur, base, seed=8)


def test_bootstrap_needs_windows() -> None:
    with pytest.raises(ValueError, match="at least one window"):
        bootstrap_increase([[]], [_w([0.1])])
    with pytest.raises(ValueError, match="block must be"):
        bootstrap_increase([_w([0.1])], [_w([0.1])], block=0)


def test_weighted_mean_uses_wall_time() -> None:
    assert weighted_mean([Window(1.0, 3.0), Window(0.0, 1.0)]) == pytest.approx(0.75)
    assert weighted_mean([]) == 0.0
