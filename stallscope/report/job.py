"""A distributed job's summary and ``ranks[]`` (SPEC §3a), from the summaries its ranks sent.

The job's summary reads like one run's:

* ``wall_s`` and ``steps`` are the longest rank's (the job lasts until its last rank is done);
* ``gpu_idle_fraction`` and ``phase_fractions`` are over all the ranks' time together (wall-time
  weighted means): the share of the job's accelerator time that was idle, and where the ranks'
  time went. A rank that waits for another in a collective counts that wait in ``compute``, as
  its own report does; ``ranks[]`` and the findings say who waited for whom;
* ``phase_seconds`` are per rank on average, ``step_time_s`` and ``data_wait_s`` the slowest
  rank's, ``idle_windows`` the mean over ranks window by window (for the CI gate's noise check).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from stallscope.report.schema import IDLE_SOURCES, RankEntry, Summary


def rank_entry(
    rank: int,
    host: str,
    summary: Summary,
    epochs: int = 0,
    *,
    forward: Mapping[str, Any] | None = None,
    node_rank: int | None = None,
    host_id: str = "",
    cores: int | None = None,
) -> RankEntry:
    """One row of ``ranks[]``: a rank's summary of the run (``forward``: its forward passes, where
    timed; ``node_rank``, ``host_id``: where it ran; ``cores``: the cores its diagnosis counted on)."""
    return RankEntry(
        rank=rank,
        host=host,
        steps=summary.steps,
        wall_s=summary.wall_s,
        steps_per_s=summary.steps_per_s,
        gpu_idle_fraction=summary.gpu_idle_fraction,
        phase_fractions=dict(summary.phase_fractions),
        data_wait_s=dict(summary.data_wait_s),
        phase_seconds=dict(summary.phase_seconds),
        epochs=epochs,
        forward_ms=dict(forward or {}),
        node_rank=node_rank,
        host_id=host_id,
        cores=cores,
    )


def fractions_of(seconds: Mapping[str, float], wall: float) -> dict[str, float]:
    """Seconds per phase as fractions of ``wall``, rounded so that they sum to 1."""
    if wall <= 0 or not seconds:
        return dict.fromkeys(seconds, 0.0)
    rounded = {name: round(min(1.0, max(0.0, s / wall)), 6) for name, s in seconds.items()}
    largest = max(rounded, key=lambda n: rounded[n])
    rounded[largest] = round(min(1.0, max(0.0, rounded[largest] + 1.0 - sum(rounded.values()))), 6)
    return rounded


def consecutive_summary(parts: Sequence[Summary]) -> Summary:
    """One summary of consecutive spans (at least one): the epochs diagnosed together, a rank's
    run and the epochs it closed after it. Steps, wall time, seconds per phase and idle time are
    added up; the step-time statistics and NVML's numbers are the first span's."""
    if not parts:
        raise ValueError("a summary of consecutive spans needs at least one")
    if len(parts) == 1:
        return parts[0]
    wall = sum(p.wall_s for p in parts)
    steps = sum(p.steps for p in parts)
    seconds: dict[str, float] = {}
    for p in parts:
        for name, share in p.phase_fractions.items():
            seconds[name] = seconds.get(name, 0.0) + share * p.wall_s
    first = parts[0]
    idle = sum(p.gpu_idle_fraction * p.wall_s for p in parts) / wall if wall > 0 else first.gpu_idle_fraction
    return replace(
        first,
        wall_s=round(wall, 6),
        steps=steps,
        steps_per_s=round(steps / wall, 4) if wall > 0 else 0.0,
        gpu_idle_fraction=round(min(1.0, max(0.0, idle)), 6),
        phase_fractions=fractions_of(seconds, wall),
        phase_seconds={name: round(s, 6) for name, s in seconds.items()},
    )


def job_summary(summaries: Sequence[Summary]) -> Summary:
    """The job's summary of a span from its ranks' summaries of it (at least one)."""
    if not summaries:
        raise ValueError("a job summary needs at least one rank's summary")
    if len(summaries) == 1:
        return summaries[0]
    total_wall = sum(s.wall_s for s in summaries)
    seconds: dict[str, float] = {}
    for s in summaries:
        for name, share in s.phase_fractions.items():
            seconds[name] = seconds.get(name, 0.0) + share * s.wall_s
    if total_wall > 0:
        idle = sum(s.gpu_idle_fraction * s.wall_s for s in summaries) / total_wall
    else:
        idle = sum(s.gpu_idle_fraction for s in summaries) / len(summaries)
    longest = max(summaries, key=lambda s: s.wall_s)
    slowest = max(summaries, key=lambda s: float(s.step_time_s.get("mean", 0.0)))
    sources = {s.idle_source for s in summaries}
    source = sources.pop() if len(sources) == 1 else "host_phases"
    windows = tuple(
        {
            "steps": max(int(w.get("steps", 0)) for w in group),
            "wall_s": round(max(float(w.get("wall_s", 0.0)) for w in group), 6),
            "idle_fraction": round(sum(float(w["idle_fraction"]) for w in group) / len(group), 6),
        }
        for group in zip(*(s.idle_windows for s in summaries), strict=False)
    )
    steps = max(s.steps for s in summaries)
    return Summary(
        wall_s=longest.wall_s,
        steps=steps,
        steps_per_s=round(steps / longest.wall_s, 4) if longest.wall_s > 0 else 0.0,
        gpu_idle_fraction=round(min(1.0, max(0.0, idle)), 6),
        idle_source=source if source in IDLE_SOURCES else "host_phases",
        phase_fractions=fractions_of(seconds, total_wall),
        phase_seconds={name: round(s / len(summaries), 6) for name, s in seconds.items()},
        step_time_s=dict(slowest.step_time_s),
        data_wait_s=dict(slowest.data_wait_s),
        nvml=None,
        idle_windows=windows,
    )
