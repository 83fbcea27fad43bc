"""``dist.straggler``: one rank sets a distributed job's pace and the others wait for it.

The model that finds the rank and its slow phase is ``analysis/job.py`` (``find_pace``); this
module states what it found as a finding: the pace-setter's own finding for the slow phase,
restated for the job (``restate_for_job``), or ``dist.straggler`` naming the rank and the phase
when the rank's own diagnosis has no fix for it (``straggler_finding``).
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping
from dataclasses import replace
from typing import TYPE_CHECKING

from stallscope.analysis.finding import Finding
from stallscope.timeline.phases import COMPUTE

if TYPE_CHECKING:
    from stallscope.analysis.job import Pace

ID = "dist.straggler"


def restate_for_job(cause: Finding, pace: Pace, rank_step_s: float) -> Finding:
    """The pace-setter's finding (``cause``, from its own diagnosis, where its step took
    ``rank_step_s``), stated for the job: its saving counted in the job's step."""
    step = rank_step_s
    speedup = pace.speedup(cause.est_saving_fraction * step)
    saving = 1.0 - 1.0 / speedup
    evidence = dict(cause.evidence)
    evidence.update(
        rank=pace.rank,
        phase=pace.phase,
        rank_finding_saving_fraction=round(cause.est_saving_fraction, 4),
        **_pace_evidence(pace),
    )
    return replace(
        cause,
        title=f"Rank {pace.rank} sets the job's pace: {cause.title}",
        est_saving_fraction=round(min(1.0, max(0.0, saving)), 4),
        est_speedup=round(speedup, 3),
        evidence=evidence,
        fix=f"On rank {pace.rank}: {cause.fix} The other ranks wait for it in every step's collective.",
        suggestion={**cause.suggestion, "rank": pace.rank},
    )


def _pace_evidence(pace: Pace) -> dict[str, float | int]:
    others = [k for k in pace.wait_s if k != pace.rank]
    return {
        "job_step_ms": round(pace.job_step_s * 1e3, 3),
        "others_own_step_ms": round(pace.others_step_s * 1e3, 3),
        "phase_excess_ms": round(pace.excess_s * 1e3, 3),
        "others_wait_ms": round(statistics.mean(pace.wait_s[k] for k in others) * 1e3, 3) if others else 0.0,
        "ranks": len(pace.own_s),
    }


def straggler_finding(pace: Pace) -> Finding:
    """``dist.straggler``: the pace-setter and its slow phase, when no finding of its own names a
    fix; the prediction assumes the phase comes down to the other ranks' level (for its compute:
    its extra work removed)."""
    speedup = pace.speedup(pace.excess_s)
    saving = 1.0 - 1.0 / speedup
    evidence: dict[str, object] = {"rank": pace.rank, "phase": pace.phase, **_pace_evidence(pace)}
    if pace.forward_s:
        evidence["forward_ms"] = {str(k): round(v * 1e3, 3) for k, v in sorted(pace.forward_s.items())}
        evidence["forward_spread_ms"] = round((max(pace.forward_s.values()) - min(pace.forward_s.values())) * 1e3, 3)
    if pace.cycle_s:  # the training thread's own work per step (CPU), which the prediction takes
        evidence["own_work_ms"] = {str(k): round(v * 1e3, 3) for k, v in sorted(pace.cycle_s.items())}
        if any(round(v, 3) > 1.0 for v in pace.stretch.values()):  # ... in wall time at these (a busy machine)
            evidence["stretch"] = {str(k): round(v, 3) for k, v in sorted(pace.stretch.items())}
    return Finding(
        id=ID,
        title=_title(pace),
        est_saving_fraction=round(min(1.0, max(0.0, saving)), 4),
        est_speedup=round(speedup, 3),
        confidence="medium",
        evidence=evidence,
        fix=_fix(pace),
        suggestion={"rank": pace.rank},
    )


def _others_median(seconds: Mapping[int, float], rank: int) -> float:
    """The median of the other ranks' per-step seconds (0 when there are none)."""
    others = [v for k, v in seconds.items() if k != rank]
    return statistics.median(others) if others else 0.0


def _title(pace: Pace) -> str:
    if pace.phase == COMPUTE and pace.outside_forward and pace.cycle_s:
        mine, others = pace.cycle_s[pace.rank], _others_median(pace.cycle_s, pace.rank)
        ratio = f"{mine / others:.1f}x the other ranks' " if others > 0 else ""
        return (
            f"Rank {pace.rank} sets the job's pace: its own work takes {ratio}({mine * 1e3:.1f} ms of CPU time a"
            f" step against {others * 1e3:.1f} ms, outside its forward pass, which is like theirs), and the others"
            " wait for it"
        )
    if pace.phase == COMPUTE and pace.forward_s:
        mine, others = pace.forward_s[pace.rank], _others_median(pace.forward_s, pace.rank)
        ratio = f"{mine / others:.1f}x the other ranks' " if others > 0 else ""
        return (
            f"Rank {pace.rank} sets the job's pace: its forward takes {ratio}({mine * 1e3:.1f} ms a step against "
            f"{others * 1e3:.1f} ms), and the others wait for it"
        )
    return (
        f"Rank {pace.rank} sets the job's pace: its {pace.phase} takes {pace.excess_s * 1e3:.1f} ms a step more "
        "than the other ranks'"
    )


#: why a phase is slower on one rank, by phase, in the fix text
_CAUSES = {
    "data": "its data shard, its storage or its loader",
    "h2d": "its batches' size or its host memory (pinned or not)",
    "checkpoint": "saves that only it makes",
    "logging": "logging that only it does (rank-0-only metrics, prints)",
    "validation": "validation that only it runs",
}

_WAIT = "the other ranks wait for it in every step's collective."


def _fix(pace: Pace) -> str:
    rank, phase = pace.rank, pace.phase
    if phase == COMPUTE and pace.outside_forward:
        return (
            f"Rank {rank} does more work per step than the others outside its forward pass (its forward is like"
            f" theirs): look for work that only rank {rank} does in the step (an extra loss or backward, a metric,"
            " a rank check around code), or a slower core on that rank, and even it out or move it out"
            f" of the step; {_WAIT}"
        )
    if phase == COMPUTE:
        return (
            f"Rank {rank} has more compute per step than the others: look for uneven shapes or sequence "
            f"lengths across the ranks (bucket or pad them alike), work that only rank {rank} does inside the "
            "step (an extra forward or backward, a metric), or a slower or shared device on that rank (its clocks, "
            f"other processes on it), and even it out; {_WAIT}"
        )
    if phase in _CAUSES:
        return (
            f"Find why {phase} is slower on rank {rank} than on the others ({_CAUSES[phase]}) and even it out; {_WAIT}"
        )
    # ``other`` (time outside the marked phases) or a phase of the user's own: host code
    return (
        f"Rank {rank} spends {pace.excess_s * 1e3:.1f} ms a step more than the others in host code ({phase}): code "
        f"that only it runs in the step (under a rank check), or a busier host; move that work out of the step or "
        f"spread it across the ranks; {_WAIT}"
    )
