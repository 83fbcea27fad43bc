"""``gpu.throttle``: the GPU's clocks are held down by power or thermal limits.

Evidence (NVML): while the GPU was busy, clock-event reasons showed a power cap, a thermal or a
hardware slowdown for a share ``f`` of the time, with the SM clock at ``r`` of its maximum (or of
the busy, unthrottled clock) meanwhile.

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

_WHAT = {
    "power": "the power cap",
    "thermal": "temperature",
    "hw_slowdown": "a hardware slowdown (power brake or overheating)",
}


def rule(ctx: Context) -> Finding | None:
    nvml = ctx.nvml
    if nvml is None or not nvml.throttle or nvml.util_mean is None:
        return None
    f = nvml.throttle.get("any", 0.0)
    throttled = nvml.sm_clock_throttled_mhz
    full = nvml.sm_clock_max_mhz or nvml.sm_clock_unthrottled_mhz
    if f < MIN_THROTTLED or throttled is None or not full or throttled >= full:
        return None
    r = throttled / full
    saving = frac(nvml.util_mean * f * (1.0 - r))
    if saving <= 0:
        return None
    reason = max(_WHAT, key=lambda k: nvml.throttle.get(k, 0.0))
    temp = f", {nvml.temperature_max_c:.0f} C max" if nvml.temperature_max_c is not None else ""
    power = ""
    if nvml.power_max_w is not None and nvml.power_limit_w:
        power = f", {nvml.power_max_w:.0f} of {nvml.power_limit_w:.0f} W"
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
        },
        fix=(
            f"The GPU slows itself down because of {_WHAT[reason]}: check cooling and airflow, the power limit "
            "(nvidia-smi -q -d PERFORMANCE,POWER,TEMPERATURE) and whether other jobs share the board."
        ),
        suggestion={},
        snippet="nvidia-smi -q -d PERFORMANCE,POWER,TEMPERATURE",
    )
