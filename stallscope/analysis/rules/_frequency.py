"""Shared model of the three "do it less often" rules (checkpoint, logging, validation).

A phase that happens ``n`` times in ``S`` steps and takes ``d`` seconds each costs ``n * d`` of
the wall time. Done every ``K`` steps instead, it costs ``S / K * d``. ``K`` is the smallest
round interval (1, 2, 5, 10, 20, 50, ...) at which the phase takes at most ``target_share`` of a
step's time; the prediction is the difference.
"""

from __future__ import annotations

from dataclasses import dataclass

from stallscope.analysis.context import Context
from stallscope.analysis.numbers import frac, ms, nice_ceil


@dataclass(frozen=True)
class FrequencyEstimate:
    """The numbers behind a frequency finding."""

    phase: str
    #: times the phase ran in the span
    count: int
    #: mean duration of one run of the phase, seconds
    each_s: float
    #: steps between runs now
    interval_now: float
    #: suggested steps between runs
    interval: int
    #: fraction of wall time recovered
    saving: float
    #: share of wall time the phase takes now
    share_now: float
    #: mean step time without the phase, seconds
    step_without_s: float

    def evidence(self) -> dict[str, float | int | str]:
        return {
            "phase": self.phase,
            "count": self.count,
            "each_ms": ms(self.each_s),
            "share_of_wall": frac(self.share_now),
            "every_n_steps_now": round(self.interval_now, 2),
            "step_without_ms": ms(self.step_without_s),
        }


def estimate(ctx: Context, phase: str, target_share: float) -> FrequencyEstimate | None:
    """How much running ``phase`` less often would save, or None when it would not."""
    span = ctx.span
    count = span.phase_counts.get(phase, 0)
    total_ns = span.phase_ns.get(phase, 0)
    if count == 0 or span.steps == 0 or total_ns <= 0 or span.wall_ns <= 0 or target_share <= 0:
        return None
    each_s = total_ns / count / 1e9
    step_without_s = max(1e-9, (span.wall_ns - total_ns) / span.steps / 1e9)
    interval_now = span.steps / count
    interval = nice_ceil(each_s / (target_share * step_without_s))
    if interval <= interval_now:
        return None
    after_s = span.steps / interval * each_s
    saving = frac((total_ns / 1e9 - after_s) / span.wall_s)
    return FrequencyEstimate(
        phase=phase,
        count=count,
        each_s=each_s,
        interval_now=interval_now,
        interval=interval,
        saving=saving,
        share_now=total_ns / span.wall_ns,
        step_without_s=step_without_s,
    )
