from __future__ import annotations

import pytest

from stallscope.analysis.numbers import count, every, frac, ms, nice_ceil


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (-5.0, 1),
        (0.0, 1),
        (0.3, 1),
        (1.0, 1),
        (1.01, 2),
        (2.0, 2),
        (2.1, 5),
        (5.0, 5),
        (5.5, 10),
        (10.0, 10),
        (11.0, 20),
        (20.0, 20),
        (21.0, 50),
        (50.0, 50),
        (51.0, 100),
        (999.0, 1000),
        (1000.0, 1000),
        (1001.0, 2000),
        (123_456.0, 200_000),
    ],
)
def test_nice_ceil_picks_the_next_round_interval(value: float, expected: int) -> None:
    result = nice_ceil(value)
    assert result == expected
    assert isinstance(result, int)


@pytest.mark.parametrize(("value", "expected"), [(20.000000000000004, 20), (50 + 1e-10, 50), (9.999999999999998, 10)])
def test_nice_ceil_ignores_float_noise_on_a_round_value(value: float, expected: int) -> None:
    assert nice_ceil(value) == expected


def test_ms_rounds_to_microseconds() -> None:
    assert ms(0.0123456) == 12.346
    assert ms(2) == 2000.0


@pytest.mark.parametrize(("value", "expected"), [(0.123456, 0.1235), (-0.3, 0.0), (1.7, 1.0), (1.0, 1.0)])
def test_frac_clamps_and_rounds(value: float, expected: float) -> None:
    assert frac(value) == expected


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (0.0, "0 ms"),
        (0.05e-3, "0.050 ms"),  # never "0.0 ms" for a measured 0.05 ms
        (0.52e-3, "0.52 ms"),
        (3.71e-3, "3.7 ms"),
        (41.2e-3, "41 ms"),
        (1.5, "1500 ms"),
    ],
)
def test_fmt_ms_keeps_two_significant_digits(seconds: float, text: str) -> None:
    from stallscope.analysis.numbers import fmt_ms

    assert fmt_ms(seconds) == text


def test_count_says_one_worker_and_two_workers() -> None:
    assert [count(n, "worker") for n in (0, 1, 2)] == ["0 workers", "1 worker", "2 workers"]


def test_every_says_every_batch_and_every_3_batches() -> None:
    assert [every(n, "batch") for n in (1, 1.2, 3)] == ["every batch", "every batch", "every 3 batches"]
    assert [every(n, "step") for n in (1, 20, 0.25)] == ["every step", "every 20 steps", "4 times a step"]
    assert [every(n, "epoch") for n in (2, 1 / 3)] == ["every 2 epochs", "3 times an epoch"]
    assert [count(2, noun) for noun in ("batch", "pass", "epoch")] == ["2 batches", "2 passes", "2 epochs"]
