"""Turn timeline statistics into report summaries."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from stallscope.report.schema import Summary
from stallscope.timeline.phases import COMPUTE
from stallscope.timeline.stats import Distribution, SpanStats


def _dist(d: Distribution) -> dict[str, float]:
    return {k: round(getattr(d, k), 6) for k in ("mean", "p10", "p50", "p90", "max")}


def phase_fractions(span: SpanStats) -> dict[str, float]:
    """Fractions of wall time per phase, rounded so that they still sum to 1."""
    if span.wall_ns <= 0:
        return dict.fromkeys(span.phase_ns, 0.0)
    raw = {name: max(0, ns) / span.wall_ns for name, ns in span.phase_ns.items()}
    rounded = {name: round(v, 6) for name, v in raw.items()}
    # put the rounding residue on the largest phase so the sum is 1 to 6 decimals
    largest = max(rounded, key=lambda n: rounded[n])
    rounded[largest] = round(min(1.0, max(0.0, rounded[largest] + 1.0 - sum(rounded.values()))), 6)
    return rounded


def summarize(
    span: SpanStats,
    *,
    idle_fraction: float | None = None,
    idle_source: str = "host_phases",
    nvml: Mapping[str, Any] | None = None,
) -> Summary:
    """A report summary of ``span``. Without a device measurement the idle fraction is
    ``1 - compute share`` (``host_phases``)."""
    fractions = phase_fractions(span)
    if idle_fraction is None:
        idle_fraction = 1.0 - span.phase_fraction(COMPUTE) if span.wall_ns > 0 else 0.0
        idle_source = "host_phases"
    windows = tuple(
        {
            "steps": w.steps,
            "wall_s": round(w.wall_ns / 1e9, 6),
            "idle_fraction": round(w.idle_fraction, 6),
        }
        for w in span.windows
    )
    return Summary(
        wall_s=round(span.wall_s, 6),
        steps=span.steps,
        steps_per_s=round(span.steps / span.wall_s, 4) if span.wall_ns > 0 else 0.0,
        gpu_idle_fraction=round(min(1.0, max(0.0, idle_fraction)), 6),
        idle_source=idle_source,
        phase_fractions=fractions,
        phase_seconds={name: round(ns / 1e9, 6) for name, ns in span.phase_ns.items()},
        step_time_s=_dist(span.step),
        data_wait_s=_dist(span.data_wait),
        nvml=nvml,
        idle_windows=windows,
    )
