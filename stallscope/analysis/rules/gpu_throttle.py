"""``gpu.throttle``: the GPU's clocks are held down by power or thermal limits.

Evidence (NVML): while the GPU was busy, clock-event reasons showed a thermal or a hardware
slowdown, an external power brake, or a power limit lowered below the board's default, for a share
``f`` of the time, with the SM clock at ``r`` of its maximum (or of the busy, unthrottled clock)
meanwhile.

A power cap at the board's own default limit is not counted: a data-center GPU under full load
runs at its power limit by design, below its maximum boost clock (an H100 running bf16 matmuls:
capped 91% of its busy time at 74% of the maximum clock, drawing its 700 W). Nothing the user can
set gives that clock back, so it is no finding. When the default limit is unknown, the cap is taken
to be the default.

Model: throttled work runs ``1 / r`` times slower, so the device's busy time ``B`` would shrink by
``B f (1 - r)`` at full clocks; the saving assumes the GPU is the bottleneck for that share.
"""

from __future__ import annotations

from stallscope.analysis.context import Context
from stallscope.analysis.finding import Finding, speedup_for
from stallscope.analysis.numbers import frac

ID = "gpu.throttle"

#: throttled for at least this share of the busy time before it is worth a finding
MIN_THROTTLED = 0.05
#: an enforced power limit below this share of the board's default was lowered on purpose
LOWERED_LIMIT = 0.99

_WHAT = {
    "power": "a lowered power limit",
    "power_brake": "an external power brake",
    "thermal": "temperature",
    "hw_slowdown": "a hardware slowdown (power brake or overheating)",
}


def rule(ctx: Context) -> Finding | None:
    nvml = ctx.nvml
    if nvml is None or not nvml.throttle or nvml.util_mean is None:
        return None
    lowered = (
        nvml.power_limit_w is not None
        and nvml.power_default_limit_w is not None
        and nvml.power_limit_w < LOWERED_LIMIT * nvml.power_default_limit_w
    )
    counted = {k: v for k, v in nvml.throttle.items() if k in _WHAT and (k != "power" or lowered)}
    # "any" is the union of the reasons; without the power cap, the largest counted reason stands in
    f = nvml.throttle.get("any", 0.0) if lowered else max(counted.values(), default=0.0)
    throttled = nvml.sm_clock_throttled_mhz
    full = nvml.sm_clock_max_mhz or nvml.sm_clock_unthrottled_mhz
    if f < MIN_THROTTLED or throttled is None or not full or throttled >= full:
        return None
    r = throttled / full
    saving = frac(nvml.util_mean * f * (1.0 - r))
    if saving <= 0:
        return None
    reason = max(counted, key=lambda k: counted[k])
    temp = f", {nvml.temperature_max_c:.0f} C max" if nvml.temperature_max_c is not None else ""
    power = ""
    if nvml.power_max_w is not None and nvml.power_limit_w:
        power = f", {nvml.power_max_w:.0f} of {nvml.power_limit_w:.0f} W"
        if lowered:
            power += f", board default {nvml.power_default_limit_w:.0f} W"
    return Finding(
        id=ID,
        title=f"GPU clocks held down by {_WHAT[reason]} {f:.0%} of the busy time ({r:.0%} of full clock{temp}{power})",
        est_saving_fraction=saving,
        est_speedup=round(speedup_for(saving), 3),
        confidence="medium",
        evidence={
            "throttled_fraction": frac(f),
            "reason": reason,
            "by_reason": {k: frac(v) for k, v in nvml.throttle.items()},
            "sm_clock_throttled_mhz": round(throttled, 1),
            "sm_clock_full_mhz": round(full, 1),
            "gpu_util_mean": frac(nvml.util_mean),
            "temperature_max_c": nvml.temperature_max_c,
            "power_max_w": nvml.power_max_w,
            "power_limit_w": nvml.power_limit_w,
            "power_default_limit_w": nvml.power_default_limit_w,
        },
        fix=_fix(reason, nvml.power_default_limit_w),
        suggestion={},
        snippet="nvidia-smi -q -d PERFORMANCE,POWER,TEMPERATURE",
    )


def _fix(reason: str, default_w: float | None) -> str:
    if reason == "power" and default_w is not None:
        return (
            f"The GPU's power limit was lowered below its default of {default_w:.0f} W: restore it "
            f"(nvidia-smi -pl {default_w:.0f}, as root) or ask whoever runs the machine."
        )
    return (
        f"The GPU slows itself down because of {_WHAT[reason]}: check cooling and airflow, the power limit "
        "(nvidia-smi -q -d PERFORMANCE,POWER,TEMPERATURE) and whether other jobs share the board."
    )
