"""Shared model of the three "do it less often" rules (checkpoint, logging, validation).

A phase that runs ``n`` times in a span and takes ``d`` seconds each costs ``n * d`` of its wall
time. ``needed`` is the interval, in steps, at which the phase would take ``target_share`` of a
step's time (``d / (target_share * step)``); each rule turns it into a setting the run can take
(a round number of steps, whole epochs, never longer than the run where its length is known),
counts the whole runs of the phase the span would really have with that setting, and predicts the
difference. ``d`` and the step time come from the run so far when the span is one of its epochs,
so an epoch's finding and the run's give the same setting unless the data differ.

A run of the phase can also slow the steps right after it (a 64 MB write evicts the caches and
the page cache, an fsync competes with the next steps): ``after_s``, measured from the recent
steps one by one (``SpanStats.recent``), is what the first half of the steps between two runs
took beyond the second half, the median over all such stretches. A run removed by
the fix takes that with it, so the saving counts it too. The second half may still pay some of
it, so the measure is short of the whole, and a floor stays a floor. See docs/predictions.md.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from stallscope.analysis.context import Context
from stallscope.analysis.numbers import frac, ms, nice_ceil
from stallscope.timeline.phases import BUILTIN_PHASES
from stallscope.timeline.stats import RecentSteps

#: a setting is good enough when the phase's share after it is within this factor of the target
#: (intervals are rounded; a lever beyond the interval is offered only when it is clearly needed)
TARGET_SLACK = 1.5
#: the steps after a run are compared only over stretches of at least this many steps between runs
MIN_STRETCH = 4
#: ... and only when at least this many such stretches were recorded
MIN_STRETCHES = 3


@dataclass(frozen=True)
class FrequencyEstimate:
    """The numbers behind a frequency finding."""

    phase: str
    #: times the phase ran in the span
    count: int
    #: mean duration of one run of the phase, seconds (over the run so far)
    each_s: float
    #: steps between runs now
    interval_now: float
    #: suggested steps between runs: ``needed`` rounded up to 1, 2, 5, 10, 20, 50, ...
    interval: int
    #: fraction of the span's wall time recovered at ``interval`` (whole runs, span's position)
    saving: float
    #: share of wall time the phase takes now
    share_now: float
    #: mean step time without the phase, seconds (over the run so far)
    step_without_s: float
    #: steps between runs at which the phase would take the target share
    needed: float = 0.0
    #: wall time of the span and the phase's time in it, seconds
    wall_s: float = 0.0
    phase_s: float = 0.0
    #: how much longer the steps right after one run take than the steps before the next, seconds
    #: (``after_run_s``); 0 when not seen
    after_s: float = 0.0
    #: runs of the phase that ``each_s`` and ``step_without_s`` were taken over (the run so far,
    #: or the span)
    runs_seen: int = 0

    def evidence(self) -> dict[str, float | int | str]:
        return {
            "phase": self.phase,
            "count": self.count,
            "each_ms": ms(self.each_s),
            "share_of_wall": frac(self.share_now),
            "every_n_steps_now": round(self.interval_now, 2),
            "step_without_ms": ms(self.step_without_s),
            "slower_after_each_ms": ms(self.after_s),
        }

    def saving_for(self, runs_after: int, each_after_s: float | None = None) -> float:
        """Fraction of the span's wall time recovered when the phase runs ``runs_after`` times,
        ``each_after_s`` seconds each (default: as long as now), with the slowdown after each
        run removed."""
        each = self.each_s if each_after_s is None else each_after_s
        if self.wall_s <= 0:
            return 0.0
        removed = max(0, self.count - runs_after) * self.after_s
        return frac((self.phase_s - runs_after * each + removed) / self.wall_s)

    def share_for(self, steps: int, runs: int, each_after_s: float | None = None) -> float:
        """Share of the time the phase would take over ``steps`` training steps with ``runs`` runs."""
        each = self.each_s if each_after_s is None else each_after_s
        phase = runs * each
        total = steps * self.step_without_s + phase
        return phase / total if total > 0 else 0.0


def runs_every(steps_before: int, steps: int, k: int) -> int:
    """Runs of ``if step % k == 0`` (steps counted from 1) among steps ``steps_before + 1`` ..
    ``steps_before + steps``."""
    if k <= 0 or steps <= 0:
        return 0
    return (steps_before + steps) // k - steps_before // k


def epoch_pieces(steps_before: int, steps: int, per_epoch: int) -> list[tuple[int, int, int]]:
    """The span's steps cut at epoch ends, all epochs ``per_epoch`` steps long:
    ``(epoch index, steps of the epoch before the piece, steps in the piece)``."""
    pieces: list[tuple[int, int, int]] = []
    if per_epoch <= 0 or steps <= 0:
        return pieces
    at, end = steps_before, steps_before + steps
    while at < end:
        epoch, into = divmod(at, per_epoch)
        n = min(per_epoch - into, end - at)
        pieces.append((epoch, into, n))
        at += n
    return pieces


def after_run_s(recent: RecentSteps | None, phase: str) -> float:
    """How much longer, in seconds, the steps right after a run of ``phase`` take than the steps
    before the next run: over each stretch of at least ``MIN_STRETCH`` steps between two runs,
    what its first half took beyond as many steps of its second half, on average (means of both:
    a step's time is skewed, slow outliers are more common than fast ones, and a median
    would count that skew as a slowdown); the median of that over the
    stretches, 0 when fewer than ``MIN_STRETCHES`` were recorded or it is not positive. A step's
    time is its wall time less its wait for data (the loader's own wobble is not the phase's)."""
    if recent is None or phase not in BUILTIN_PHASES:
        return 0.0
    bit = 1 << BUILTIN_PHASES.index(phase)
    work = recent.work_ns
    runs = [i for i, kind in enumerate(recent.kinds) if kind & bit]
    extras = []
    for a, b in zip(runs, runs[1:], strict=False):
        stretch = work[a + 1 : b]
        if len(stretch) < MIN_STRETCH:
            continue
        half = len(stretch) // 2
        base = statistics.fmean(stretch[half:])
        extras.append(sum(stretch[:half]) - half * base)
    if len(extras) < MIN_STRETCHES:
        return 0.0
    return max(0.0, statistics.median(extras) / 1e9)


def steps_between(recent: RecentSteps | None, phase: str) -> int | None:
    """The steps from one run of ``phase`` to the next, as the loop spaces them (the median gap
    between the recent steps that ran it: a loop validating at steps 0, 25, 50, ... is "every 25
    steps", where the count over the steps would say 22); None when fewer than two runs were
    among the recent steps."""
    if recent is None or phase not in BUILTIN_PHASES:
        return None
    bit = 1 << BUILTIN_PHASES.index(phase)
    runs = [i for i, kind in enumerate(recent.kinds) if kind & bit]
    gaps = [b - a for a, b in zip(runs, runs[1:], strict=False)]
    return round(statistics.median(gaps)) if gaps else None


def span_steps(ctx: Context) -> tuple[int, int]:
    """(steps before the span, steps in it)."""
    return ctx.steps_before, ctx.span.steps


def estimate(ctx: Context, phase: str, target_share: float) -> FrequencyEstimate | None:
    """How much running ``phase`` less often would save, or None when it would not."""
    span = ctx.span
    count = span.phase_counts.get(phase, 0)
    total_ns = span.phase_ns.get(phase, 0)
    if count == 0 or span.steps == 0 or total_ns <= 0 or span.wall_ns <= 0 or target_share <= 0:
        return None
    # the cost of one run and of a step: from the run so far when it has more of them
    pool = span
    run = ctx.run_span
    if run is not None and run.phase_counts.get(phase, 0) >= count and run.steps >= span.steps:
        pool = run
    pool_ns = pool.phase_ns.get(phase, 0)
    each_s = pool_ns / pool.phase_counts[phase] / 1e9
    step_without_s = max(1e-9, (pool.wall_ns - pool_ns) / pool.steps / 1e9)
    interval_now = span.steps / count
    needed = each_s / (target_share * step_without_s)
    interval = nice_ceil(needed)
    if interval <= interval_now:
        return None
    est = FrequencyEstimate(
        phase=phase,
        count=count,
        each_s=each_s,
        interval_now=interval_now,
        interval=interval,
        saving=0.0,
        share_now=total_ns / span.wall_ns,
        step_without_s=step_without_s,
        needed=needed,
        wall_s=span.wall_s,
        phase_s=total_ns / 1e9,
        after_s=after_run_s(pool.recent, phase),
        runs_seen=pool.phase_counts[phase],
    )
    before, steps = span_steps(ctx)
    return FrequencyEstimate(
        **{**vars(est), "saving": est.saving_for(runs_every(before, steps, interval))},
    )


def training_time(seconds: float) -> str:
    """A stretch of training time in readable units: "6 s", "4 min", "250 ms"."""
    if seconds >= 120:
        return f"{seconds / 60:.0f} min"
    if seconds >= 1:
        return f"{seconds:.0f} s"
    return f"{seconds * 1e3:.0f} ms"
