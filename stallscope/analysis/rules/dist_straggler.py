"""``dist.straggler``: one rank sets a distributed job's pace and the others wait for it.

The model that finds the rank and its slow phase is ``analysis/job.py`` (``find_pace``); this
module states what it found as a finding: the pace-setter's own finding for the slow phase,
restated for the job (``restate_for_job``), or ``dist.straggler`` naming the rank and the phase
when the rank's own diagnosis has no fix for it (``straggler_finding``).
"""

from __future__ import annotations

import statistics
from dataclasses import replace
from typing import TYPE_CHECKING

from stallscope.analysis.finding import Finding

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
    fix; the prediction assumes the phase comes down to the other ranks' level."""
    speedup = pace.speedup(pace.excess_s)
    saving = 1.0 - 1.0 / speedup
    excess_ms = pace.excess_s * 1e3
    return Finding(
        id=ID,
        title=(
            f"Rank {pace.rank} sets the job's pace: its {pace.phase} takes {excess_ms:.1f} ms a step more "
            "than the other ranks'"
        ),
        est_saving_fraction=round(min(1.0, max(0.0, saving)), 4),
        est_speedup=round(speedup, 3),
        confidence="medium",
        evidence={"rank": pace.rank, "phase": pace.phase, **_pace_evidence(pace)},
        fix=(
            f"Find why {pace.phase} is slower on rank {pace.rank} than on the others (its data shard, its "
            "host's load or storage, its share of the work) and even it out; the other ranks wait for it "
            "in every step's collective."
        ),
        suggestion={"rank": pace.rank},
    )
