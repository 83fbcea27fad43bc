"""Did the accelerator's idle fraction regress? The CI gate's verdict, as pure functions.

Two reports in, a ``Verdict`` out; nothing here reads files or prints (``stallscope.cli`` and
``stallscope.testing`` do).

The statistics
--------------
*Increase*: ``current.gpu_idle_fraction - baseline.gpu_idle_fraction``, the two headline numbers, in
fraction units (0.02 = 2 percentage points).

*Threshold*: a regression needs ``increase > max_increase``. This absorbs the run-to-run noise a
single run cannot see (another job on the machine, clocks, caches).

*Noise check*: every run summary carries ``idle_windows``, the idle fraction of consecutive windows
of steps. When both reports have at least ``min_windows`` windows, the windows of each run are
resampled with replacement (``resamples`` times, ``random.Random(seed)``, so the same two reports
always get the same verdict), the wall-time-weighted mean idle fraction of each resample is taken,
and the differences (current minus baseline) give a percentile interval at ``confidence``. A
regression then also needs that interval to lie above zero: an increase the windows cannot tell
apart from the variation inside the runs is noise, not a regression. With too few windows the
threshold alone decides, and the verdict says so.

*Ceiling*: ``max_idle`` fails a run whose idle fraction is above it, with or without a baseline.
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

from stallscope._exceptions import ComparisonError, ReportError
from stallscope.analysis.finding import Finding
from stallscope.report.schema import Report, Summary

DEFAULT_MAX_INCREASE = 0.02
#: fewest idle windows per report for the noise check
MIN_WINDOWS = 8
RESAMPLES = 2000
CONFIDENCE = 0.95
SEED = 0
#: runs whose step counts differ by more than this factor are different reference runs
MAX_STEP_RATIO = 2.0
#: a phase "grew" when its share of wall time rose by at least this much (half a point)
PHASE_GROWTH = 0.005
#: findings listed as the explanation of a regression
MAX_EXPLAINING = 3

Method = Literal["bootstrap", "threshold", "ceiling"]


@dataclass(frozen=True)
class GateSettings:
    """What counts as a regression. Fractions are in [0, 1]."""

    #: largest allowed increase of the idle fraction over the baseline
    max_increase: float = DEFAULT_MAX_INCREASE
    #: largest allowed idle fraction of the current run, whatever the baseline; None: no ceiling
    max_idle: float | None = None
    #: fewest idle windows each report needs for the noise check
    min_windows: int = MIN_WINDOWS
    #: bootstrap resamples
    resamples: int = RESAMPLES
    #: coverage of the bootstrap interval
    confidence: float = CONFIDENCE
    #: seed of the bootstrap's random numbers
    seed: int = SEED
    #: step counts further apart than this factor make the runs incomparable
    max_step_ratio: float = MAX_STEP_RATIO

    def __post_init__(self) -> None:
        if not 0.0 <= self.max_increase <= 1.0:
            raise ValueError(f"max_increase must be a fraction in [0, 1], got {self.max_increase!r}")
        if self.max_idle is not None and not 0.0 <= self.max_idle <= 1.0:
            raise ValueError(f"max_idle must be a fraction in [0, 1], got {self.max_idle!r}")
        if self.min_windows < 2:
            raise ValueError(f"min_windows must be >= 2, got {self.min_windows!r}")
        if self.resamples < 100:
            raise ValueError(f"resamples must be >= 100, got {self.resamples!r}")
        if not 0.5 <= self.confidence < 1.0:
            raise ValueError(f"confidence must be in [0.5, 1), got {self.confidence!r}")
        if not self.max_step_ratio >= 1.0:
            raise ValueError(f"max_step_ratio must be >= 1, got {self.max_step_ratio!r}")


@dataclass(frozen=True)
class Window:
    """One idle window as the bootstrap sees it."""

    idle_fraction: float
    #: the window's weight in a run's mean: its wall time (or 1 when unknown)
    weight: float


@dataclass(frozen=True)
class Interval:
    """A bootstrap percentile interval of the increase (current minus baseline)."""

    low: float
    high: float
    confidence: float
    resamples: int
    seed: int
    #: windows in the current run and in the baseline
    current_windows: int
    baseline_windows: int

    @property
    def above_zero(self) -> bool:
        return self.low > 0.0


@dataclass(frozen=True)
class RunFacts:
    """The numbers of one report the verdict was made from."""

    idle_fraction: float
    idle_source: str
    device_kind: str
    steps: int
    windows: int
    complete: bool

    @classmethod
    def of(cls, report: Report) -> RunFacts:
        s = report.summary
        return cls(
            idle_fraction=s.gpu_idle_fraction,
            idle_source=s.idle_source,
            device_kind=report.run.device.kind,
            steps=s.steps,
            windows=len(s.idle_windows),
            complete=report.complete,
        )


@dataclass(frozen=True)
class PhaseDelta:
    """One phase's share of wall time in both runs."""

    phase: str
    baseline: float
    current: float

    @property
    def delta(self) -> float:
        return self.current - self.baseline


@dataclass(frozen=True)
class Explanation:
    """A finding of the current run offered as the cause of the regression."""

    finding: Finding
    #: the baseline has no finding with this id
    new: bool
    #: the phase whose growth this finding is about, when that phase grew
    grown_phase: str | None = None


@dataclass(frozen=True)
class Verdict:
    """The gate's decision and everything needed to explain it."""

    regressed: bool
    #: ``bootstrap``: threshold and noise check; ``threshold``: too few windows for the noise
    #: check; ``ceiling``: no baseline, only ``max_idle``
    method: Method
    settings: GateSettings
    current: RunFacts
    baseline: RunFacts | None
    #: current minus baseline idle fraction; None without a baseline
    increase: float | None
    #: the increase is above ``max_increase``
    over_threshold: bool
    #: the noise check's interval; None when it did not run
    interval: Interval | None
    #: the current idle fraction is above ``max_idle``
    over_max_idle: bool
    #: every phase of either run, largest growth first
    phase_deltas: tuple[PhaseDelta, ...] = ()
    #: the current run's findings that explain the idle time, most relevant first
    explanations: tuple[Explanation, ...] = ()
    #: what the reader should know about how the decision was made
    notes: tuple[str, ...] = field(default=())

    @property
    def exit_code(self) -> int:
        """SPEC §5: 0 no regression, 1 regression."""
        return 1 if self.regressed else 0

    @property
    def within_noise(self) -> bool:
        """The increase passed the threshold but the noise check called it noise."""
        return self.over_threshold and self.interval is not None and not self.interval.above_zero

    @property
    def grown_phases(self) -> tuple[PhaseDelta, ...]:
        return tuple(d for d in self.phase_deltas if d.delta >= PHASE_GROWTH)


# -- the pieces ------------------------------------------------------------------------------


def windows_of(summary: Summary, where: str = "summary") -> tuple[Window, ...]:
    """The summary's idle windows, checked. Raises ``ReportError`` on a malformed window."""
    idle: list[float] = []
    walls: list[float] = []
    for i, w in enumerate(summary.idle_windows):
        value = w.get("idle_fraction") if isinstance(w, Mapping) else None
        if not isinstance(value, (int, float)) or isinstance(value, bool) or not 0.0 <= value <= 1.0:
            raise ReportError(f"{where}.idle_windows[{i}].idle_fraction must be a fraction in [0, 1]")
        wall = w.get("wall_s")
        known = isinstance(wall, (int, float)) and not isinstance(wall, bool) and math.isfinite(wall) and wall > 0
        idle.append(float(value))
        walls.append(float(wall) if known and isinstance(wall, (int, float)) else -1.0)
    if any(x <= 0 for x in walls):  # unknown wall time anywhere: weigh every window alike
        walls = [1.0] * len(idle)
    return tuple(Window(v, w) for v, w in zip(idle, walls, strict=True))


def weighted_mean(windows: Sequence[Window]) -> float:
    total = sum(w.weight for w in windows)
    return sum(w.idle_fraction * w.weight for w in windows) / total if total > 0 else 0.0


def bootstrap_increase(
    current: Sequence[Window],
    baseline: Sequence[Window],
    *,
    resamples: int = RESAMPLES,
    confidence: float = CONFIDENCE,
    seed: int = SEED,
) -> Interval:
    """Percentile bootstrap interval of ``mean(current) - mean(baseline)`` (weighted window means).

    Each run's windows are resampled independently, with replacement, at their own count.
    """
    if not current or not baseline:
        raise ValueError("bootstrap_increase needs at least one window in each run")
    rng = random.Random(seed)
    cur = [(w.idle_fraction * w.weight, w.weight) for w in current]
    base = [(w.idle_fraction * w.weight, w.weight) for w in baseline]

    def mean_of_resample(pairs: list[tuple[float, float]]) -> float:
        drawn = rng.choices(pairs, k=len(pairs))
        weight = sum(p[1] for p in drawn)
        return sum(p[0] for p in drawn) / weight

    diffs = sorted(mean_of_resample(cur) - mean_of_resample(base) for _ in range(resamples))
    tail = (1.0 - confidence) / 2.0
    low = diffs[max(0, math.floor(tail * resamples))]
    high = diffs[min(resamples - 1, math.ceil((1.0 - tail) * resamples) - 1)]
    return Interval(
        low=low,
        high=high,
        confidence=confidence,
        resamples=resamples,
        seed=seed,
        current_windows=len(current),
        baseline_windows=len(baseline),
    )


def comparison_problem(
    current: Report,
    baseline: Report,
    *,
    max_step_ratio: float = MAX_STEP_RATIO,
    names: tuple[str, str] = ("the current run", "the baseline"),
) -> str | None:
    """Why the two runs cannot be compared fairly, or None when they can.

    ``names`` are how the message calls the current run and the baseline.
    """
    cur_name, base_name = names
    cur, base = current.run.device.kind, baseline.run.device.kind
    if _accelerator(cur) != _accelerator(base):
        return f"{base_name} ran on {base} and {cur_name} on {cur}"
    cs, bs = current.summary, baseline.summary
    if cs.idle_source != bs.idle_source:
        return f"idle was measured with {bs.idle_source} in {base_name} and with {cs.idle_source} in {cur_name}"
    if bs.steps <= 0:
        return f"{base_name} has no steps"
    if cs.steps <= 0:
        return f"{cur_name} has no steps"
    ratio = max(cs.steps, bs.steps) / min(cs.steps, bs.steps)
    if ratio > max_step_ratio:
        return (
            f"{base_name} has {bs.steps} steps and {cur_name} {cs.steps} "
            f"(more than x{max_step_ratio:g} apart): not the same reference run"
        )
    return None


def _accelerator(kind: str) -> str:
    """``cpu`` or the accelerator family: runs on cuda:0 and cuda:1 compare, cpu and cuda do not."""
    return kind.split(":", 1)[0].lower()


def phase_deltas(current: Summary, baseline: Summary) -> tuple[PhaseDelta, ...]:
    names = list(dict.fromkeys([*baseline.phase_fractions, *current.phase_fractions]))
    deltas = [
        PhaseDelta(name, baseline.phase_fractions.get(name, 0.0), current.phase_fractions.get(name, 0.0))
        for name in names
    ]
    return tuple(sorted(deltas, key=lambda d: -d.delta))


#: finding id -> the phase its idle time shows up in
_PHASE_OF_FINDING = {
    "data.pin_memory": "h2d",
    "host.sync": "compute",
    "host.overhead": "compute",
}
_PHASE_OF_PREFIX = {
    "data": "data",
    "checkpoint": "checkpoint",
    "logging": "logging",
    "validation": "validation",
    "compute": "compute",
    "gpu": "compute",
}


def phase_of(finding_id: str) -> str | None:
    """The phase whose time a finding is about (``data.workers`` -> ``data``), if one."""
    if finding_id in _PHASE_OF_FINDING:
        return _PHASE_OF_FINDING[finding_id]
    return _PHASE_OF_PREFIX.get(finding_id.split(".", 1)[0])


def explaining_findings(
    current: Report,
    baseline: Report | None,
    grown: Sequence[PhaseDelta],
    *,
    limit: int = MAX_EXPLAINING,
) -> tuple[Explanation, ...]:
    """The current run's findings, those about a phase that grew first, each group best first."""
    grown_names = {d.phase for d in grown}
    known = {f.id for f in baseline.findings} if baseline is not None else set()
    out = [
        Explanation(
            finding=f,
            new=baseline is not None and f.id not in known,
            grown_phase=phase if (phase := phase_of(f.id)) in grown_names else None,
        )
        for f in current.findings
    ]
    out.sort(key=lambda e: e.grown_phase is None)  # stable: keeps best-first inside each group
    return tuple(out[:limit])


# -- the verdict -----------------------------------------------------------------------------


def compare(
    current: Report,
    baseline: Report | None,
    settings: GateSettings | None = None,
    *,
    allow_mismatch: bool = False,
) -> Verdict:
    """The gate's verdict on ``current`` against ``baseline`` (None: only ``max_idle`` applies).

    Raises ``ComparisonError`` when the runs cannot be compared fairly (unless
    ``allow_mismatch``) or the current run has no steps, and ``ValueError`` when there is
    neither a baseline nor a ``max_idle``.
    """
    settings = settings or GateSettings()
    if baseline is None and settings.max_idle is None:
        raise ValueError("compare needs a baseline or a max_idle")
    if current.summary.steps <= 0:
        raise ComparisonError("the current run has no steps: nothing to check")
    notes: list[str] = []
    if not current.complete:
        notes.append("the current report was written at an epoch end, not at the end of the run")
    cur_facts = RunFacts.of(current)
    over_max_idle = settings.max_idle is not None and cur_facts.idle_fraction > settings.max_idle

    if baseline is None:
        return Verdict(
            regressed=over_max_idle,
            method="ceiling",
            settings=settings,
            current=cur_facts,
            baseline=None,
            increase=None,
            over_threshold=False,
            interval=None,
            over_max_idle=over_max_idle,
            explanations=explaining_findings(current, None, ()),
            notes=tuple(notes),
        )

    problem = comparison_problem(current, baseline, max_step_ratio=settings.max_step_ratio)
    if problem is not None:
        if not allow_mismatch:
            raise ComparisonError(f"runs not comparable: {problem}")
        notes.append(f"compared although {problem}")
    if not baseline.complete:
        notes.append("the baseline report was written at an epoch end, not at the end of the run")

    base_facts = RunFacts.of(baseline)
    increase = cur_facts.idle_fraction - base_facts.idle_fraction
    over_threshold = increase > settings.max_increase
    cur_w = windows_of(current.summary, "current.summary")
    base_w = windows_of(baseline.summary, "baseline.summary")
    interval: Interval | None = None
    if len(cur_w) >= settings.min_windows and len(base_w) >= settings.min_windows:
        method: Method = "bootstrap"
        interval = bootstrap_increase(
            cur_w, base_w, resamples=settings.resamples, confidence=settings.confidence, seed=settings.seed
        )
        regressed_vs_baseline = over_threshold and interval.above_zero
    else:
        method = "threshold"
        notes.append(
            f"too few idle windows for the noise check ({len(cur_w)} in the current run, {len(base_w)} in "
            f"the baseline; {settings.min_windows} each needed): decided on the threshold alone"
        )
        regressed_vs_baseline = over_threshold

    deltas = phase_deltas(current.summary, baseline.summary)
    grown = [d for d in deltas if d.delta >= PHASE_GROWTH]
    return Verdict(
        regressed=regressed_vs_baseline or over_max_idle,
        method=method,
        settings=settings,
        current=cur_facts,
        baseline=base_facts,
        increase=increase,
        over_threshold=over_threshold,
        interval=interval,
        over_max_idle=over_max_idle,
        phase_deltas=deltas,
        explanations=explaining_findings(current, baseline, grown),
        notes=tuple(notes),
    )
