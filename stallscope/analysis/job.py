"""A distributed job's diagnosis (SPEC §3a): which rank sets the pace, and why.

The model
    Ranks of a data-parallel job meet in a collective every step (DDP's gradient all-reduce,
    inside backward). A rank that reaches it first waits there for the last one, and that wait
    is recorded inside its own ``compute`` phase: a fast rank looks compute-bound while it is
    really waiting. So per step and per rank ``r``::

        step_r    = wall_r / steps_r
        wait_r    = compute_r - min_q compute_q        (the fastest compute is the pure one)
        own_r     = step_r - wait_r                    (the rank's own work: what it would take alone)

    The job steps at ``max_r own_r``; the rank ``s`` that reaches it is the pace-setter. Its slow
    phase is the non-compute phase where it spends the most time per step above the other ranks'
    median. Fixing it lowers ``own_s`` and the job steps at the larger of that and the next
    rank's ``own``: that ratio is the job's predicted speedup.

    A rank that is slow in its compute itself (more work a step, a slower GPU) cannot be told from
    one that waits with this model: both show the same ``compute`` per step. Its forward passes can
    (``signals/forward.py``: no collective in them): ``_compute_pace``. Ranks that ran uneven
    shares of the steps in the same epochs (DDP's ``Join``) name no pace-setter (``uneven_steps``).

What is emitted
    When the pace-setter's own diagnosis has a finding for the slow phase (``data.workers`` for
    ``data``, ``data.pin_memory`` for ``h2d``, ``checkpoint.frequency`` for ``checkpoint``, ...),
    that finding, restated for the job: ``evidence.rank`` and ``evidence.phase``, the rank in its
    ``suggestion`` and the job's speedup (``rules/dist_straggler.py``). Else ``dist.straggler``
    with the phase. When no rank stands out, the job's findings are those every rank has, with
    the smallest rank's saving (a fix applied to every rank speeds the job up as much as it
    speeds up its slowest rank).
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from stallscope.analysis.finding import Finding
from stallscope.analysis.rules.dist_straggler import restate_for_job, straggler_finding
from stallscope.timeline.phases import COMPUTE

#: a rank sets the pace when its own work per step exceeds every other rank's by this share of
#: the job's step
MIN_STRAGGLER_SHARE = 0.20

#: a rank's forward pass per step must exceed the other ranks' median by this share for its
#: compute to be called slow: alike ranks of a healthy job on the loaded 2-core development
#: machine once differed by 30% (forwards of 0.3 ms, scaled by a compute 20 times as long)
MIN_FORWARD_EXCESS = 0.50
#: ... and by this much a step (seconds): the CPU time of forwards of a fraction of a millisecond
#: differed by 1.7x between alike ranks of a healthy job there (0.3 ms against 0.2 ms)
MIN_FORWARD_EXCESS_S = 0.001

#: the ranks ran uneven shares of the data when one ran fewer than this share of another's steps
#: (in the same epochs): the ones with fewer wait for the others (DDP's ``Join``), which is not a
#: straggler
EVEN_STEPS_SHARE = 0.9

#: the findings that name the cause of a slow phase, by phase
CAUSES_BY_PHASE: Mapping[str, tuple[str, ...]] = {
    "data": (
        "data.workers",
        "data.batch_indexing",
        "data.prefetch",
        "data.persistent_workers",
        "data.cpu_bound",
        "data.io_bound",
    ),
    "h2d": ("data.pin_memory",),
    "checkpoint": ("checkpoint.frequency",),
    "logging": ("logging.frequency",),
    "validation": ("validation.frequency",),
    "other": ("host.sync", "host.overhead"),
}


@dataclass(frozen=True)
class RankWork:
    """What one rank recorded over a span (an epoch or the run)."""

    rank: int
    steps: int
    wall_s: float
    #: seconds per phase
    phase_seconds: Mapping[str, float]
    #: the rank's own diagnosis of the span, best first
    findings: tuple[Finding, ...] = ()
    host: str = ""
    #: epochs the rank closed in the span (0: not counted, as for an epoch)
    epochs: int = 0
    #: seconds of forward pass per step (``signals/forward.py``); None when not timed
    forward_s: float | None = None
    #: the training thread's own work per step, CPU seconds from one forward to the next
    #: (``signals/forward.py``, CPU runs); None when not measured
    cycle_s: float | None = None
    #: the wall time its forwards took over their CPU time (1: a quiet machine); a busy machine
    #: stretches the rank's own work in wall time by about as much
    stretch: float = 1.0


def uneven_steps(ranks: Sequence[RankWork]) -> str | None:
    """The note for ranks that ran different numbers of steps per epoch (uneven shards), or
    None. Over a run, steps are compared per epoch the rank closed: a rank that died after two
    epochs, or whose latest summary is older than the others', ran as many steps an epoch."""
    active = [r for r in ranks if r.wall_s > 0]
    if len(active) < 2:
        return None
    per_epoch = all(r.epochs > 0 for r in active) and len({r.epochs for r in active}) > 1

    def steps(r: RankWork) -> float:
        return r.steps / r.epochs if per_epoch else float(r.steps)

    fewest = min(active, key=lambda r: (steps(r), r.rank))
    most = max(active, key=lambda r: (steps(r), -r.rank))
    if steps(most) <= 0 or steps(fewest) >= EVEN_STEPS_SHARE * steps(most):
        return None
    unit = " an epoch" if per_epoch else ""
    return (
        f"rank {fewest.rank} ran {steps(fewest):.0f} steps{unit}, rank {most.rank} {steps(most):.0f}: uneven shards, "
        "and the ranks with fewer steps wait for the others (DDP's Join); a DistributedSampler (drop_last=True "
        "for an exact split) or data balanced across the ranks gives each the same steps"
    )


@dataclass(frozen=True)
class Pace:
    """The straggler model's result for a span."""

    #: the pace-setting rank
    rank: int
    #: its slowest phase compared with the other ranks
    phase: str
    #: seconds per step: the job's step (the pace-setter's own work) and the next rank's own work
    job_step_s: float
    others_step_s: float
    #: how much longer the pace-setter spends in ``phase`` per step than the other ranks' median
    excess_s: float
    #: each rank's own work and time waiting for the others, per step
    own_s: Mapping[int, float] = field(default_factory=dict)
    wait_s: Mapping[int, float] = field(default_factory=dict)
    #: each rank's forward pass per step, where timed (a compute straggler's evidence)
    forward_s: Mapping[int, float] = field(default_factory=dict)
    #: each rank's own work per step (``RankWork.cycle_s``, CPU seconds), where every rank's was
    #: measured, and the stretch of each (``RankWork.stretch``) that turns it into wall time
    cycle_s: Mapping[int, float] = field(default_factory=dict)
    stretch: Mapping[int, float] = field(default_factory=dict)
    #: a compute straggler found by its own work per step (``cycle_s``) where its forward passes
    #: are like the others' (its extra work lies outside its forward)
    outside_forward: bool = False

    def speedup(self, saved_per_step_s: float) -> float:
        """The job's speedup when the pace-setter's step shrinks by ``saved_per_step_s``."""
        if self.job_step_s <= 0:
            return 1.0
        new_step = max(self.job_step_s - max(0.0, saved_per_step_s), self.others_step_s, 1e-12)
        return self.job_step_s / new_step


def _per_step(work: RankWork) -> dict[str, float]:
    return {name: max(0.0, s) / work.steps for name, s in work.phase_seconds.items()}


def find_pace(ranks: Sequence[RankWork]) -> Pace | None:
    """The rank that sets the job's pace and its slow phase (``_phase_pace``), or, when the ranks'
    phases look alike, the rank whose own compute is slower (``_compute_pace``: its forward
    passes, or its own work a step where the forwards are alike); None when neither stands out."""
    return _phase_pace(ranks) or _compute_pace(ranks)


def _compute_pace(ranks: Sequence[RankWork]) -> Pace | None:
    """A compute straggler, from the ranks' forward passes (no collective in them, unlike the
    backward, where the fast ranks wait for the slow one inside ``compute``).

    The slowest forward's rank ``s`` is the candidate; where no forward stands out and every
    rank's cycle was measured, the rank with the most own work a step (CPU time) is, when that
    stands out by the same thresholds (its extra work lies outside its forward:
    ``Pace.outside_forward``). Its extra work per step is, where every rank's training thread was
    clocked from one forward to the next (``RankWork.cycle_s``, CPU runs), its own work beyond the
    others' median: the forward, backward, optimizer and anything else the rank does alone, and
    not the all-reduce's time, which every rank spends; in wall time at the slow rank's own
    stretch (it is the slow rank that would do without it). The others' stretches do not enter
    it: on a busy machine the fast rank's short forwards, which run beside the slow rank's, read
    stretched twice as much (4.6 against 2.2 on the loaded 2-core machine), and the difference of
    the two ranks' stretched cycles hid a slow rank with 2.4 times the others' work. A rank
    ``o``'s wait is the slow rank's own work beyond its own, at the slow rank's stretch too (the
    slow rank does that work while ``o`` waits; its compute at most). Otherwise (CUDA) its compute
    is taken to scale with its forward, ``k = compute_s / forward_s``, and the extra is
    ``k * (forward_s - median of the others')``: a bound that counts the collective's time as
    work when the all-reduce is a large part of the step; a rank ``o``'s wait is its compute
    beyond ``k`` times its forward. The job then steps at the larger of the slow rank's step less
    its extra and the others' own work (their step less their wait); a slow rank whose extra
    work would leave the job no faster than the others' own work sets no pace (the measures
    disagree). It sets the pace when its forward exceeds the others' median by
    ``MIN_FORWARD_EXCESS`` and by ``MIN_FORWARD_EXCESS_S``, and its extra work is
    ``MIN_STRAGGLER_SHARE`` of the job's step."""
    active = [r for r in ranks if r.steps > 0 and r.wall_s > 0]
    if len(active) < 2 or uneven_steps(active) is not None:
        return None
    if any(r.forward_s is None or r.forward_s <= 0 for r in active):
        return None
    forward = {r.rank: float(r.forward_s or 0.0) for r in active}
    compute = {r.rank: _per_step(r).get(COMPUTE, 0.0) for r in active}
    step = {r.rank: r.wall_s / r.steps for r in active}
    # each rank's own work a step (CPU time), where every rank's training thread was clocked
    cycle: dict[int, float] = {}
    stretch: dict[int, float] = {}
    if all(r.cycle_s is not None and r.cycle_s > 0 for r in active):
        cycle = {r.rank: float(r.cycle_s or 0.0) for r in active}
        stretch = {r.rank: max(1.0, r.stretch) for r in active}
    slow = max(forward, key=lambda k: (forward[k], -k))
    outside = False
    if not _stands_out(forward, slow):
        # its forward is like the others': the rank with the most own work a step, if that stands
        # out (work outside the forward: an extra loss, a metric)
        if not cycle:
            return None
        from stallscope.analysis.diagnose import MIN_JUDGED_STEPS  # (here: it imports the rules)

        if any(r.steps < MIN_JUDGED_STEPS for r in active):
            # 24 cycles (then in wall time) on a very busy machine differed by 2.5x between two
            # healthy ranks
            return None
        slow = max(cycle, key=lambda k: (cycle[k], -k))
        if not _stands_out(cycle, slow):
            return None
        outside = True
    others = [k for k in forward if k != slow]
    typical = statistics.median(forward[k] for k in others)
    if cycle:
        beyond = cycle[slow] - statistics.median(cycle[k] for k in others)
        extra = min(compute[slow], max(0.0, beyond * stretch[slow]))
        wait = {k: min(compute[k], max(0.0, (cycle[slow] - cycle[k]) * stretch[slow])) for k in others}
    else:
        scale = max(1.0, compute[slow] / forward[slow])
        extra = scale * (forward[slow] - typical)
        wait = {k: max(0.0, compute[k] - scale * forward[k]) for k in others}
    wait[slow] = 0.0
    own = {k: max(0.0, step[k] - wait[k]) for k in forward}
    job_step = step[slow]
    others_step = max(own[k] for k in others)
    if job_step <= 0 or extra < MIN_STRAGGLER_SHARE * job_step or others_step >= job_step:
        return None
    return Pace(
        rank=slow,
        phase=COMPUTE,
        job_step_s=job_step,
        others_step_s=others_step,
        excess_s=extra,
        own_s=own,
        wait_s=wait,
        forward_s=forward,
        cycle_s=cycle,
        stretch=stretch,
        outside_forward=outside,
    )


def _stands_out(seconds: Mapping[int, float], slow: int) -> bool:
    """Whether rank ``slow``'s per-step time exceeds the other ranks' median by
    ``MIN_FORWARD_EXCESS`` and by ``MIN_FORWARD_EXCESS_S``."""
    typical = statistics.median(v for k, v in seconds.items() if k != slow)
    return seconds[slow] >= (1.0 + MIN_FORWARD_EXCESS) * typical and seconds[slow] - typical >= MIN_FORWARD_EXCESS_S


def _phase_pace(ranks: Sequence[RankWork]) -> Pace | None:
    """The rank whose own work sets the job's pace and its slow phase; None when the ranks are
    alike (within ``MIN_STRAGGLER_SHARE`` of the job's step), fewer than two ranks ran steps, or
    the ranks ran uneven shares of the steps (``uneven_steps``: per step, a rank that waits for
    the others at its shard's end looks slow)."""
    active = [r for r in ranks if r.steps > 0 and r.wall_s > 0]
    if len(active) < 2 or uneven_steps(active) is not None:
        return None
    phases = {r.rank: _per_step(r) for r in active}
    step = {r.rank: r.wall_s / r.steps for r in active}
    pure = min(p.get(COMPUTE, 0.0) for p in phases.values())
    wait = {k: max(0.0, phases[k].get(COMPUTE, 0.0) - pure) for k in phases}
    own = {k: max(0.0, step[k] - wait[k]) for k in phases}
    pacer = max(own, key=lambda k: (own[k], -k))
    others = [k for k in own if k != pacer]
    others_step = max(own[k] for k in others)
    job_step = own[pacer]
    if job_step <= 0 or (job_step - others_step) / job_step < MIN_STRAGGLER_SHARE:
        return None
    names = {n for p in phases.values() for n in p} - {COMPUTE}
    excess = {n: phases[pacer].get(n, 0.0) - statistics.median(phases[k].get(n, 0.0) for k in others) for n in names}
    if not excess:
        return None
    phase = max(sorted(excess), key=lambda n: excess[n])
    if excess[phase] <= 0:
        return None
    return Pace(
        rank=pacer,
        phase=phase,
        job_step_s=job_step,
        others_step_s=others_step,
        excess_s=excess[phase],
        own_s=own,
        wait_s=wait,
    )


#: the job's compute share (or its ranks' estimated wait) above which a job with no pace-setter
#: is said to wait where StallScope cannot see who for
UNSEEN_WAIT_SHARE = 0.15
UNTIMED_COMPUTE_SHARE = 0.50


def unseen_wait_note(ranks: Sequence[RankWork]) -> str | None:
    """A note for a job whose ranks wait for each other where no rank can be named (no
    pace-setter): with forward passes timed, the ranks' wait estimated as their compute beyond
    the least-waiting rank's compute-to-forward ratio; without (no DDP module), the compute share
    as an upper bound. None when the job names a pace-setter or the share is small."""
    active = [r for r in ranks if r.steps > 0 and r.wall_s > 0]
    if len(active) < 2 or find_pace(active) is not None or uneven_steps(active) is not None:
        return None
    compute = {r.rank: _per_step(r).get(COMPUTE, 0.0) for r in active}
    step = {r.rank: r.wall_s / r.steps for r in active}
    if all(r.forward_s for r in active):
        scale = min(compute[r.rank] / float(r.forward_s or 1.0) for r in active)
        waits = [max(0.0, compute[r.rank] - scale * float(r.forward_s or 0.0)) / step[r.rank] for r in active]
        share = statistics.mean(waits)
        if share < UNSEEN_WAIT_SHARE:
            return None
        return (
            f"the ranks wait for each other about {share:.0%} of the step, and StallScope cannot tell which rank is "
            "slow (the slow one changes from step to step, or its extra work lies outside its forward pass)"
        )
    if any(r.forward_s for r in active):
        return None
    share = statistics.mean(compute[k] / step[k] for k in compute)
    if share < UNTIMED_COMPUTE_SHARE:
        return None
    return (
        f"the ranks may wait for each other inside compute (up to {share:.0%} of the step): with no DDP module's "
        "forward pass to time, StallScope cannot tell a rank's own compute from its wait for the others, nor "
        "which rank is slow"
    )


def cause_of(pace: Pace, work: RankWork) -> Finding | None:
    """The pace-setter's own finding that names the cause of its slow phase, if it has one."""
    ids = CAUSES_BY_PHASE.get(pace.phase, ())
    candidates = [f for f in work.findings if f.id in ids]
    return max(candidates, key=lambda f: f.est_saving_fraction) if candidates else None


def common_findings(ranks: Sequence[RankWork]) -> list[Finding]:
    """Findings every rank that ran steps has: the one with the smallest saving stands for the
    job (a fix applied to every rank gains the job what it gains its least-helped rank)."""
    active = [r for r in ranks if r.steps > 0]
    if not active:
        return []
    out: list[Finding] = []
    for f in active[0].findings:
        same = [next((g for g in r.findings if g.id == f.id), None) for r in active]
        if any(g is None for g in same):
            continue
        least = min((g for g in same if g is not None), key=lambda g: g.est_saving_fraction)
        out.append(least)
    return out


def diagnose_job(ranks: Sequence[RankWork], *, min_saving: float = 0.02) -> list[Finding]:
    """The job's findings, best first: the pace-setter's cause (or ``dist.straggler``) when one
    rank sets the pace, and the findings every rank shares."""
    found: list[Finding] = []
    pace = find_pace(ranks)
    if pace is not None:
        work = next(r for r in ranks if r.rank == pace.rank)
        cause = cause_of(pace, work)
        if cause is not None:
            found.append(restate_for_job(cause, pace, work.wall_s / work.steps))
        else:
            found.append(straggler_finding(pace))
    taken = {f.id for f in found}
    found.extend(f for f in common_findings(ranks) if f.id not in taken)
    kept = [f for f in found if f.est_saving_fraction >= min_saving]
    return sorted(kept, key=lambda f: (-f.est_saving_fraction, f.id))
