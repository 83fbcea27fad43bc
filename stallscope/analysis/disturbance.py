"""A disturbed measurement: other processes kept a large share of the machine's cores busy, or
the steps' times scattered far beyond their median.

Other processes' work slows the run's steps in ways no fix of the run's own recovers, and it
moves with what they do, so every finding of such a span is trusted one step less, and the
report says why. Two signs, either of which is enough:

* the host sampler saw other processes keep at least half of the machine's cores busy (only
  spans with enough sampled time count: the machine's CPU is read once a second);
* steps that did the same work took very different times: among the recent steps (the last
  ``MAX_SCATTER_STEPS`` at most) of the span's most common kind (the same phases entered: a step
  that also saved a checkpoint, validated or ran the epoch's end is of another kind and is left
  out, and so is the step after it, which may still pay for it: that slowdown is the frequency
  rules' evidence), the 90th percentile of the step's own work (its wall time less its wait for
  data) is ``SCATTER_RATIO`` times the median or more. The work of a step is the same from one to
  the next; a step preempted for another process's time slice is not. Waits for data are left
  out: a loader's bursts are the data rules' evidence.
"""

from __future__ import annotations

import dataclasses
import operator
from collections import Counter
from dataclasses import dataclass
from itertools import compress

from stallscope.analysis.finding import Confidence, Finding
from stallscope.analysis.numbers import count, fmt_ms
from stallscope.signals.host_sampler import HostSummary
from stallscope.timeline.stats import RecentSteps, SpanStats, quantile

#: other processes busy on at least this share of the machine's cores disturb the timings
OTHERS_SHARE = 0.5
#: ... when the host was sampled for at least this long
MIN_SAMPLED_S = 5.0

#: steps of one kind scattered this far disturb the timings: p90 at least this many times the median
SCATTER_RATIO = 3.0
#: ... over at least this many steps of that kind
MIN_SCATTER_STEPS = 50
#: ... with a median of at least this much work (below it, timer and scheduler granularity rule)
MIN_SCATTER_MEDIAN_S = 100e-6
#: the scatter is read from at most this many of the span's most recent steps: plenty for a
#: median and a 90th percentile, and a run's report (rewritten during the run) reads it each time
MAX_SCATTER_STEPS = 1024

_LOWER: dict[Confidence, Confidence] = {"high": "medium", "medium": "low", "low": "low"}


def others_share(host: HostSummary | None) -> float | None:
    """Share of the machine's cores other processes kept busy; None when not measured."""
    if host is None or host.others_cores is None or not host.machine_cores or host.wall_s < MIN_SAMPLED_S:
        return None
    return min(1.0, max(0.0, host.others_cores / host.machine_cores))


@dataclass(frozen=True)
class Scatter:
    """How far the work of a span's ordinary steps scattered."""

    #: steps of the span's most common kind, among the recent ones
    steps: int
    #: median and 90th percentile of their work (wall time less the wait for data), seconds
    p50_s: float
    p90_s: float

    @property
    def ratio(self) -> float:
        return self.p90_s / self.p50_s if self.p50_s > 0 else 0.0


#: the last span's recent steps and their scatter: a run's report asks twice (its diagnosis and
#: its note)
_last: tuple[RecentSteps, Scatter | None] | None = None


def step_scatter(span: SpanStats) -> Scatter | None:
    """The scatter of the work of ``span``'s most common kind of step; None when too few steps
    were recorded to say."""
    global _last
    recent = span.recent
    if recent is None or len(recent) < MIN_SCATTER_STEPS:
        return None
    last = _last
    if last is not None and last[0] is recent:
        return last[1]
    first = max(1, len(recent) - MAX_SCATTER_STEPS)
    kinds = recent.kinds[first - 1 :]  # from the step before the first
    kind, _ = Counter(kinds).most_common(1)[0]
    # a step right after one of another kind (a save, a validation run) may still pay for it: the
    # steps of that kind whose step before is too (with C's iterators: up to 1,024 steps a report)
    same = list(map(kind.__eq__, kinds))
    work = sorted(compress(recent.work_ns[first:], map(operator.and_, same[1:], same)))
    found = (
        Scatter(steps=len(work), p50_s=quantile(work, 0.5) / 1e9, p90_s=quantile(work, 0.9) / 1e9)
        if len(work) >= MIN_SCATTER_STEPS
        else None
    )
    _last = (recent, found)
    return found


def scattered(span: SpanStats | None) -> Scatter | None:
    """The scatter when it disturbs the timings, else None."""
    found = step_scatter(span) if span is not None else None
    if found is None or found.p50_s < MIN_SCATTER_MEDIAN_S or found.ratio < SCATTER_RATIO:
        return None
    return found


def disturbed(host: HostSummary | None, span: SpanStats | None = None) -> bool:
    """Whether the span's timings are disturbed: by other processes on the host, or by steps of
    the same kind that scattered."""
    share = others_share(host)
    return (share is not None and share >= OTHERS_SHARE) or scattered(span) is not None


def lowered(finding: Finding) -> Finding:
    """``finding`` trusted one step less."""
    return dataclasses.replace(finding, confidence=_LOWER[finding.confidence])


def disturbance_note(host: HostSummary | None) -> str | None:
    """The report's note for a run disturbed by other processes, else None."""
    if not disturbed(host) or host is None or host.others_cores is None:
        return None
    cores = count(host.machine_cores, "core") if host.machine_cores else "cores"
    return (
        f"other processes kept {host.others_cores:.1f} of the machine's {cores} busy during the run: the timings"
        " are disturbed, so every finding's confidence is one step lower"
    )


def scatter_note(span: SpanStats | None) -> str | None:
    """The report's note for a run whose steps of the same kind scattered, else None."""
    found = scattered(span)
    if found is None:
        return None
    return (
        f"steps that did the same work took from {fmt_ms(found.p50_s)} (median) to {fmt_ms(found.p90_s)}"
        f" (90th percentile, {found.ratio:.0f}x) over {found.steps} steps: the timings are disturbed (another"
        " process, or the host, took the CPU from the run at times), so every finding's confidence is one step lower"
    )
