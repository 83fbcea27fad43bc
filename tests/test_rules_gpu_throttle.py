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
        "power_max_w": 500.0,
        "power_limit_w": 500.0,
        "power_default_limit_w": 700.0,
    }
    base.update(fields)
    return nvml(**base)


def test_clocks_capped_by_a_lowered_power_limit() -> None:
    f = gpu_throttle.rule(context(SPAN, nvml=throttled()))  # type: ignore[arg-type]
    assert f is not None
    assert f.est_saving_fraction == pytest.approx(0.9 * 0.5 * (1 - 1400 / 1980), abs=1e-3)
    assert f.evidence["reason"] == "power"
    assert "lowered power limit" in f.title
    assert "500 of 500 W, board default 700 W" in f.title
    assert "nvidia-smi -pl 700" in f.fix
    assert f.suggestion == {}


@pytest.mark.parametrize("default_w", [700.0, None])
def test_a_power_cap_at_the_default_limit_is_how_the_gpu_runs(default_w: float | None) -> None:
    """An H100 running bf16 matmuls was capped 91% of its busy time at 74% of its maximum clock,
    drawing its default 700 W: the board working as designed, nothing to fix (a limit not known
    to be lowered counts as the default)."""
    capped = throttled(
        throttle={"power": 0.91, "any": 0.91},
        sm_clock_throttled_mhz=1465.0,
        power_max_w=706.0,
        power_limit_w=700.0,
        power_default_limit_w=default_w,
    )
    assert gpu_throttle.rule(context(SPAN, nvml=capped)) is None  # type: ignore[arg-type]


def test_thermal_slowdown_counts_beside_a_power_cap_at_the_default() -> None:
    both = throttled(
        throttle={"power": 0.6, "thermal": 0.2, "any": 0.7},
        power_limit_w=700.0,
        power_default_limit_w=700.0,
    )
    f = gpu_throttle.rule(context(SPAN, nvml=both))  # type: ignore[arg-type]
    assert f is not None
    assert f.evidence["reason"] == "thermal"
    assert f.est_saving_fraction == pytest.approx(0.9 * 0.2 * (1 - 1400 / 1980), abs=1e-3)
    assert "temperature" in f.title


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
