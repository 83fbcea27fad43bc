from __future__ import annotations

import dataclasses

import pytest

from stallscope.timeline.stats import Distribution, IdleWindow, SpanStats


def test_distribution_of_empty_is_all_zeros() -> None:
    assert Distribution.of([]) == Distribution(n=0, mean=0.0, p10=0.0, p50=0.0, p90=0.0, max=0.0)


def test_distribution_interpolates_quantiles_linearly() -> None:
    # sorted: 10 20 30 40 50 ns; position of q is (n - 1) * q = 4q
    d = Distribution.of([50, 10, 40, 20, 30])
    assert d.n == 5
    assert d.mean == pytest.approx(30e-9)
    assert d.p10 == pytest.approx(14e-9)  # pos 0.4: 10 + 0.4 * 10
    assert d.p50 == pytest.approx(30e-9)  # pos 2
    assert d.p90 == pytest.approx(46e-9)  # pos 3.6: 40 + 0.6 * 10
    assert d.max == pytest.approx(50e-9)


def test_distribution_of_two_values() -> None:
    d = Distribution.of([1_000_000_000, 0])
    assert (d.n, d.mean, d.max) == (2, pytest.approx(0.5), pytest.approx(1.0))
    assert (d.p10, d.p50, d.p90) == (pytest.approx(0.1), pytest.approx(0.5), pytest.approx(0.9))


def test_distribution_of_one_value() -> None:
    d = Distribution.of([3_000_000])
    assert d == Distribution(n=1, mean=0.003, p10=0.003, p50=0.003, p90=0.003, max=0.003)


def test_distribution_is_frozen() -> None:
    d = Distribution.of([1])
    with pytest.raises(dataclasses.FrozenInstanceError):
        d.n = 2  # type: ignore[misc]


@pytest.mark.parametrize(
    ("wall_ns", "busy_ns", "idle"),
    [
        (100, 25, 0.75),
        (100, 100, 0.0),
        (100, 0, 1.0),
        (100, 150, 0.0),  # clamped: busy can never exceed wall
        (100, -5, 1.0),  # clamped
        (0, 0, 0.0),  # empty window
        (-1, 0, 0.0),
    ],
)
def test_idle_window_fraction(wall_ns: int, busy_ns: int, idle: float) -> None:
    assert IdleWindow(steps=4, wall_ns=wall_ns, busy_ns=busy_ns).idle_fraction == pytest.approx(idle)


def _span(wall_ns: int, phase_ns: dict[str, int]) -> SpanStats:
    return SpanStats(
        wall_ns=wall_ns,
        steps=1,
        epochs=1,
        phase_ns=phase_ns,
        phase_counts=dict.fromkeys(phase_ns, 1),
        step_total_ns=wall_ns,
        step=Distribution.of([wall_ns]),
        data_wait=Distribution.of([0]),
        data_cpu_ns=None,
        process_cpu_ns=0,
    )


def test_span_stats_seconds_and_fractions() -> None:
    span = _span(4_000_000_000, {"data": 1_000_000_000, "compute": 3_000_000_000})
    assert span.wall_s == 4.0
    assert span.phase_s("compute") == 3.0
    assert span.phase_s("missing") == 0.0
    assert span.phase_fraction("data") == 0.25
    assert span.phase_fraction("compute") == 0.75
    assert span.phase_fraction("missing") == 0.0
    assert span.windows == ()
    assert span.boundaries == ()


def test_span_stats_fraction_of_empty_span_is_zero() -> None:
    assert _span(0, {"compute": 0}).phase_fraction("compute") == 0.0
