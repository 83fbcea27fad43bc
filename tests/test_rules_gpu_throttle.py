"""``gpu.throttle``: clocks held down by power or thermal limits."""

from __future__ import annotations

import pytest
from signal_fakes import context, nvml, record_span

from stallscope.analysis.rules import gpu_throttle

SPAN = record_span(steps=20, compute_ms=50)


def throttled(**fields: object) -> object:
    base: dict[str, object] = {
        "util_mean": 0.9,
        "throttle": {"power": 0.5, "thermal": 0.1, "hw_slowdown": 0.0, "any": 0.5},
        "sm_clock_throttled_mhz": 1400.0,
        "sm_clock_max_mhz": 1980.0,
        "temperature_max_c": 84.0,
        "power_max_w": 700.0,
        "power_limit_w": 700.0,
    }
    base.update(fields)
    return nvml(**base)


def test_power_capped_clocks() -> None:
    f = gpu_throttle.rule(context(SPAN, nvml=throttled()))  # type: ignore[arg-type]
    assert f is not None
    assert f.est_saving_fraction == pytest.approx(0.9 * 0.5 * (1 - 1400 / 1980), abs=1e-3)
    assert f.evidence["reason"] == "power"
    assert "power cap" in f.title
    assert "700 of 700 W" in f.title
    assert f.suggestion == {}


def test_unthrottled_busy_clock_when_the_maximum_is_unknown() -> None:
    f = gpu_throttle.rule(context(SPAN, nvml=throttled(sm_clock_max_mhz=None, sm_clock_unthrottled_mhz=1750.0)))  # type: ignore[arg-type]
    assert f is not None
    assert f.evidence["sm_clock_full_mhz"] == 1750.0


@pytest.mark.parametrize(
    "fields",
    [
        {"throttle": {"power": 0.01, "any": 0.01}},  # barely
        {"throttle": {}},  # reasons not available
        {"sm_clock_throttled_mhz": None},  # clock not available
    ],
)
def test_no_finding(fields: dict[str, object]) -> None:
    assert gpu_throttle.rule(context(SPAN, nvml=throttled(**fields))) is None  # type: ignore[arg-type]
