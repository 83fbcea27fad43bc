from __future__ import annotations

import random
from array import array
from collections.abc import Mapping

import pytest

from stallscope.report.build import phase_fractions, summarize
from stallscope.timeline.phases import BUILTIN_PHASES
from stallscope.timeline.stats import Distribution, IdleWindow, SpanSnapshot, SpanStats

MS = 1_000_000


def _span(wall_ns: int, phase_ns: Mapping[str, int], steps: int = 4, windows: tuple[IdleWindow, ...] = ()) -> SpanStats:
    full = dict.fromkeys(BUILTIN_PHASES, 0) | dict(phase_ns)
    return SpanStats(
        wall_ns=wall_ns,
        steps=steps,
        epochs=1,
        phase_ns=full,
        phase_counts=dict.fromkeys(full, 1),
        step_total_ns=wall_ns,
        step=Distribution.of([10 * MS, 10 * MS, 20 * MS, 0]),
        data_wait=Distribution.of([2 * MS]),
        data_cpu_ns=None,
        process_cpu_ns=0,
        windows=windows,
    )


def test_fractions_are_shares_of_wall_time() -> None:
    span = _span(40 * MS, {"data": 8 * MS, "compute": 20 * MS, "logging": 8 * MS, "other": 4 * MS})
    assert phase_fractions(span) == {
        "data": 0.2,
        "h2d": 0.0,
        "compute": 0.5,
        "logging": 0.2,
        "checkpoint": 0.0,
        "validation": 0.0,
        "other": 0.1,
    }


def test_rounded_fractions_still_sum_to_one() -> None:
    fractions = phase_fractions(_span(3, {"data": 1, "compute": 1, "other": 1}))
    assert sum(fractions.values()) == pytest.approx(1.0, abs=1e-6)
    # each third rounds to 0.333333; the residue goes to one of them, not lost
    assert sorted(v for v in fractions.values() if v) == [0.333333, 0.333333, 0.333334]


def test_many_custom_phases_still_sum_to_one() -> None:
    custom = {f"custom_{i}": 1_000_003 + 7919 * i for i in range(40)}
    wall = sum(custom.values()) + 123_456_789
    fractions = phase_fractions(_span(wall, {"compute": 123_456_789, **custom}))
    assert set(custom) <= fractions.keys()
    assert sum(fractions.values()) == pytest.approx(1.0, abs=1e-6)
    assert all(0.0 <= v <= 1.0 for v in fractions.values())
    assert fractions["custom_0"] == pytest.approx(1_000_003 / wall, abs=1e-6)


def test_an_empty_span_has_zero_fractions() -> None:
    fractions = phase_fractions(_span(0, {}))
    assert set(fractions) == set(BUILTIN_PHASES)
    assert set(fractions.values()) == {0.0}


def test_summary_without_a_device_measurement_uses_host_phases() -> None:
    windows = (IdleWindow(steps=16, wall_ns=400 * MS, busy_ns=100 * MS),)
    span = _span(2_000 * MS, {"data": 1_200 * MS, "compute": 500 * MS, "other": 300 * MS}, steps=100, windows=windows)
    summary = summarize(span)
    assert summary.idle_source == "host_phases"
    assert summary.gpu_idle_fraction == pytest.approx(0.75)  # 1 - 500 / 2000
    assert summary.gpu_idle_fraction == pytest.approx(1.0 - summary.phase_fractions["compute"])
    assert summary.wall_s == 2.0
    assert summary.steps == 100
    assert summary.steps_per_s == 50.0
    assert summary.phase_seconds["data"] == 1.2
    assert summary.phase_seconds["compute"] == 0.5
    assert summary.step_time_s == {"mean": 0.01, "p10": 0.003, "p50": 0.01, "p90": 0.017, "max": 0.02}
    assert summary.data_wait_s["p50"] == 0.002
    assert summary.nvml is None
    assert summary.idle_windows == ({"steps": 16, "wall_s": 0.4, "idle_fraction": 0.75},)
    assert sum(summary.phase_fractions.values()) == pytest.approx(1.0, abs=1e-6)


def test_summary_with_a_device_measurement_keeps_its_source() -> None:
    span = _span(1_000 * MS, {"compute": 900 * MS, "data": 100 * MS})
    nvml = {"util_mean": 0.37}
    summary = summarize(span, idle_fraction=0.63, idle_source="nvml", nvml=nvml)
    assert summary.idle_source == "nvml"
    assert summary.gpu_idle_fraction == 0.63  # not 1 - compute share (0.1)
    assert summary.nvml == nvml


@pytest.mark.parametrize(("given", "clamped"), [(1.3, 1.0), (-0.2, 0.0)])
def test_summary_clamps_a_measured_idle_fraction(given: float, clamped: float) -> None:
    summary = summarize(_span(10, {"compute": 10}), idle_fraction=given, idle_source="cuda_events")
    assert summary.gpu_idle_fraction == clamped


def test_summary_of_an_empty_span() -> None:
    summary = summarize(_span(0, {}, steps=0))
    assert summary.gpu_idle_fraction == 0.0
    assert summary.steps_per_s == 0.0
    assert summary.wall_s == 0.0


@pytest.mark.parametrize("seed", range(20))
def test_an_epochs_summary_from_its_snapshot_is_the_summary_of_its_stats(seed: int) -> None:
    """What a report of many short epochs makes for each (``summarize`` of its snapshot, no
    ``SpanStats``) is what the epoch's statistics give, to the last digit, with or without a
    device measurement; a snapshot of a span with idle windows keeps them."""
    rng = random.Random(seed)
    steps = rng.randrange(0, 60)
    step = array("q", (rng.randrange(0, 5 * MS) for _ in range(steps)))
    wait = array("q", (rng.choice([0, 0, rng.randrange(0, MS)]) for _ in range(steps)))
    phases = {name: rng.choice([0, rng.randrange(0, 50 * MS)]) for name in (*BUILTIN_PHASES, "custom")}
    wall = sum(phases.values()) if rng.random() < 0.9 else 0
    windows = (IdleWindow(steps=3, wall_ns=7 * MS, busy_ns=1_234_567),) if seed % 4 == 0 else ()

    def make() -> SpanStats:
        return _span(wall, phases, steps, windows)  # its distributions: stats() makes the snapshot's

    made_first = seed % 2 == 0
    snapshot = SpanSnapshot(make() if made_first else make, step, wait, steps=steps, wall_ns=wall, phase_ns=phases)
    device = {} if seed % 3 else {"idle_fraction": rng.random(), "idle_source": "nvml", "nvml": {"util_mean": 0.5}}
    got = summarize(snapshot, **device)
    want = summarize(snapshot.stats(), **device)
    assert got == want
    assert got.idle_windows == (want.idle_windows if made_first else ())
    assert bool(got.idle_windows) == (made_first and bool(windows))
