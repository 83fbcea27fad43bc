"""Did the accelerator's idle fraction regress? The CI gate's verdict, as pure functions.

Reports in, a ``Verdict`` out; nothing here reads files or prints (``stallscope.cli`` and
``stallscope.testing`` do). The statistics live in ``stallscope.analysis.gate_stats``;
docs/ci-gate.md explains the choices.

How the verdict is made
-----------------------
Run-level numbers decide; a run's headline is ``gpu_idle_fraction``.

*Increase*: the current idle fraction minus the mean of the baseline runs' (0.02 = 2 points).

*Threshold*: a regression needs ``increase > max_increase``: the size of change that matters.

*Healthy runs' bound* (three or more baseline runs): a regression also needs the current idle
fraction above the one-sided ``1 - false_alarm`` prediction bound of the baseline runs,
``mean + t(1 - false_alarm, n - 1) * sd * sqrt(1 + 1/n)``: a healthy rerun crosses it with
probability ``false_alarm`` (1%) when healthy runs scatter normally. With one or two baseline
runs the between-run noise is unknown: the threshold alone decides and the verdict says so.

*Paired* (``compare_paired``): runs of the base and the head commit, interleaved on one machine.
The increase is the mean of the pairs' differences; with three or more pairs it must also be
above ``t(1 - false_alarm, n - 1) * sd / sqrt(n)`` (a one-sided paired t-test).

*Within-run evidence*: a moving-block bootstrap interval of the increase from the runs' idle
windows. It is reported, never decides: windows cannot see a whole run shifted by a busier
machine, and idle time that comes in bursts (a validation run once an epoch) makes resampled
windows so variable that a real regression would look like noise.

*Ceiling*: ``max_idle`` fails a run whose idle fraction is above it, with or without a baseline.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

from stallscope._exceptions import ComparisonError, ReportError
from stallscope.analysis.finding import Finding
from stallscope.analysis.gate_stats import (
    CONFIDENCE,
    RESAMPLES,
    SEED,
    Interval,
    Spread,
    Window,
    bootstrap_increase,
    paired_spread,
    prediction_spread,
    weighted_mean,
)
from stallscope.report.schema import Report, Summary

__all__ = [
    "DEFAULT_FALSE_ALARM",
    "DEFAULT_MAX_INCREASE",
    "MIN_BASELINE_RUNS",
    "MIN_WINDOWS",
    "Explanation",
    "GateSettings",
    "Interval",
    "PhaseDelta",
    "RunFacts",
    "Spread",
    "Verdict",
    "Window",
    "bootstrap_increase",
    "compare",
    "compare_paired",
    "comparison_problem",
    "explaining_findings",
    "phase_deltas",
    "phase_of",
    "weighted_mean",
    "windows_of",
]

DEFAULT_MAX_INCREASE = 0.02
#: the chance that a healthy run fails the bound of three or more baseline runs
DEFAULT_FALSE_ALARM = 0.01
#: baseline runs (or pairs) needed before their spread is used
MIN_BASELINE_RUNS = 3
#: fewest idle windows per run for the within-run evidence
MIN_WINDOWS = 8
#: runs whose step counts differ by more than this factor are different reference runs
MAX_STEP_RATIO = 2.0
#: a phase "grew" when its share of wall time rose by at least this much (half a point)
PHASE_GROWTH = 0.005
#: findings listed as the explanation of a regression
MAX_EXPLAINING = 3
#: a pass is close when the increase used more than this share of what was allowed
CLOSE_SHARE = 0.75
#: an allowance wider than this makes the gate too blunt to be useful: the verdict says so
WIDE_ALLOWANCE = 0.10

Method = Literal["prediction", "paired", "threshold", "ceiling"]


@dataclass(frozen=True)
class GateSettings:
    """What counts as a regression. Fractions are in [0, 1]."""

    #: largest allowed increase of the idle fraction over the baseline
    max_increase: float = DEFAULT_MAX_INCREASE
    #: largest allowed idle fraction of the current run, whatever the baseline; None: no ceiling
    max_idle: float | None = None
    #: the chance a healthy run fails against three or more baseline runs (the bound's 1 - quantile)
    false_alarm: float = DEFAULT_FALSE_ALARM
    #: fewest idle windows each run needs for the within-run evidence
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
        if not 0.0 < self.false_alarm <= 0.5:
            raise ValueError(f"false_alarm must be in (0, 0.5], got {self.false_alarm!r}")
        if self.min_windows < 2:
            raise ValueError(f"min_windows must be >= 2, got {self.min_windows!r}")
        if self.resamples < 100:
            raise ValueError(f"resamples must be >= 100, got {self.resamples!r}")
        if not 0.5 <= self.confidence < 1.0:
            raise ValueError(f"confidence must be in [0.5, 1), got {self.confidence!r}")
        if not self.max_step_ratio >= 1.0:
            raise ValueError(f"max_step_ratio must be >= 1, got {self.max_step_ratio!r}")


@dataclass(frozen=True)
class RunFacts:
    """The numbers of one report the verdict was made from."""

    idle_fraction: float
    idle_source: str
    device_kind: str
    steps: int
    windows: int
    complete: bool
    #: how the caller named the report (its path), if it did
    name: str | None = None

    @classmethod
    def of(cls, report: Report, name: str | None = None) -> RunFacts:
        s = report.summary
        return cls(
            idle_fraction=s.gpu_idle_fraction,
            idle_source=s.idle_source,
            device_kind=report.run.device.kind,
            steps=s.steps,
            windows=len(s.idle_windows),
            complete=report.complete,
            name=name,
        )


@dataclass(frozen=True)
class PhaseDelta:
    """One phase's share of wall time in both runs (means, when there are several)."""

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
    #: no baseline run has a finding with this id
    new: bool
    #: the phase whose growth this finding is about, when that phase grew
    grown_phase: str | None = None


@dataclass(frozen=True)
class Verdict:
    """The gate's decision and everything needed to explain it."""

    regressed: bool
    #: ``prediction``: threshold and the bound of 3+ baseline runs; ``paired``: interleaved base
    #: and head runs; ``threshold``: 1-2 baseline runs (or pairs), between-run noise unknown;
    #: ``ceiling``: no baseline, only ``max_idle``
    method: Method
    settings: GateSettings
    #: the current run (``paired``: the head commit's runs)
    current: tuple[RunFacts, ...]
    #: the baseline runs (``paired``: the base commit's runs); empty for ``ceiling``
    baseline: tuple[RunFacts, ...]
    #: the idle fraction that was judged: the current run's, or the mean of the head runs
    current_idle: float
    #: mean idle fraction of the baseline runs; None without a baseline
    baseline_idle: float | None
    #: current_idle - baseline_idle (``paired``: the mean of the pairs' differences)
    increase: float | None
    #: the increase a regression has to exceed: max(max_increase, the spread's bound over the mean)
    allowed_increase: float | None
    #: the increase is above ``max_increase``
    over_threshold: bool
    #: the baseline runs' (or the pairs') spread and bound; None for ``ceiling``
    spread: Spread | None
    #: the increase is beyond the spread's bound; None when there is no bound (fewer than 3)
    over_bound: bool | None
    #: the within-run evidence; None when there were too few windows
    interval: Interval | None
    #: the current idle fraction is above ``max_idle``
    over_max_idle: bool
    #: every phase of either side, largest growth first
    phase_deltas: tuple[PhaseDelta, ...] = ()
    #: the current run's findings that explain the idle time, most relevant first
    explanations: tuple[Explanation, ...] = ()
    #: what the reader should know about how the decision was made
    notes: tuple[str, ...] = field(default=())
    #: head and base runs compared in pairs (``compare_paired``)
    paired: bool = False

    @property
    def exit_code(self) -> int:
        """SPEC §5: 0 no regression, 1 regression."""
        return 1 if self.regressed else 0

    @property
    def within_noise(self) -> bool:
        """The increase passed the threshold but stayed within the healthy runs' bound."""
        return self.over_threshold and self.over_bound is False

    @property
    def close(self) -> bool:
        """A pass whose increase used more than ``CLOSE_SHARE`` of what was allowed."""
        if self.regressed or self.increase is None or self.allowed_increase is None:
            return False
        return self.increase > 0 and self.increase >= CLOSE_SHARE * self.allowed_increase

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


def _mean_phases(summaries: Sequence[Summary]) -> dict[str, float]:
    names = list(dict.fromkeys(name for s in summaries for name in s.phase_fractions))
    return {name: sum(s.phase_fractions.get(name, 0.0) for s in summaries) / len(summaries) for name in names}


def phase_deltas(current: Summary | Sequence[Summary], baseline: Summary | Sequence[Summary]) -> tuple[PhaseDelta, ...]:
    """Every phase's share of wall time on both sides (means over several runs), largest growth first."""
    cur = _mean_phases([current] if isinstance(current, Summary) else current)
    base = _mean_phases([baseline] if isinstance(baseline, Summary) else baseline)
    names = list(dict.fromkeys([*base, *cur]))
    deltas = [PhaseDelta(name, base.get(name, 0.0), cur.get(name, 0.0)) for name in names]
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
    baseline: Report | Sequence[Report] | None,
    grown: Sequence[PhaseDelta],
    *,
    limit: int = MAX_EXPLAINING,
) -> tuple[Explanation, ...]:
    """The current run's findings, those about a phase that grew first, each group best first."""
    bases = [] if baseline is None else [baseline] if isinstance(baseline, Report) else list(baseline)
    grown_names = {d.phase for d in grown}
    known = {f.id for b in bases for f in b.findings}
    out = [
        Explanation(
            finding=f,
            new=bool(bases) and f.id not in known,
            grown_phase=phase if (phase := phase_of(f.id)) in grown_names else None,
        )
        for f in current.findings
    ]
    out.sort(key=lambda e: e.grown_phase is None)  # stable: keeps best-first inside each group
    return tuple(out[:limit])


def _within_run_evidence(
    current: Sequence[Report], baseline: Sequence[Report], settings: GateSettings, notes: list[str]
) -> Interval | None:
    cur = [windows_of(r.summary, "current.summary") for r in current]
    base = [windows_of(r.summary, "baseline.summary") for r in baseline]
    fewest = min(len(w) for w in [*cur, *base])
    if fewest < settings.min_windows:
        notes.append(
            f"too few idle windows for the within-run evidence (a run has {fewest}; "
            f"{settings.min_windows} each needed); the run-level numbers decide either way"
        )
        return None
    return bootstrap_increase(
        cur, base, resamples=settings.resamples, confidence=settings.confidence, seed=settings.seed
    )


def _unique(reports: Sequence[Report], names: Sequence[str], notes: list[str]) -> tuple[list[Report], list[str]]:
    """Baseline runs without repeats: the same report given twice would fake a small spread."""
    kept: list[Report] = []
    kept_names: list[str] = []
    for report, name in zip(reports, names, strict=True):
        twin = next((i for i, k in enumerate(kept) if k == report), None)
        if twin is not None:
            notes.append(f"{name} is the same run as {kept_names[twin]}: counted once")
            continue
        kept.append(report)
        kept_names.append(name)
    return kept, kept_names


def _check_comparable(
    current: Report,
    others: Sequence[Report],
    names: Sequence[str],
    settings: GateSettings,
    allow_mismatch: bool,
    notes: list[str],
    current_name: str = "the current run",
) -> None:
    for other, name in zip(others, names, strict=True):
        problem = comparison_problem(current, other, max_step_ratio=settings.max_step_ratio, names=(current_name, name))
        if problem is None:
            continue
        if not allow_mismatch:
            raise ComparisonError(f"runs not comparable: {problem}")
        notes.append(f"compared although {problem}")


def _noise_notes(spread: Spread, settings: GateSettings, notes: list[str], *, paired: bool) -> None:
    n = spread.n
    runs = "pair" if paired else "baseline run"
    if spread.bound is None:
        what = f"only {n} {runs}{'s' if n != 1 else ''}"
        if not paired and spread.sd is not None:
            what += f" ({spread.values[0]:.1%} and {spread.values[1]:.1%} idle)"
        todo = (
            "run 3 or more pairs (STALLSCOPE_PAIRS)"
            if paired
            else "record 3 or more healthy runs of the reference job (stallscope baseline add REPORT --dir DIR) "
            "and pass the folder as --baseline"
        )
        notes.append(
            f"between-run noise unknown: {what}, so a healthy rerun on a busier machine, which can move the idle "
            f"fraction by more than {settings.max_increase * 100:.1f} points, would fail too; {todo}"
        )
        return
    reach = spread.bound - (0.0 if paired else spread.mean)
    if reach > WIDE_ALLOWANCE:
        more = "pairs" if paired else "baseline runs"
        notes.append(
            f"the {'pairs' if paired else 'healthy runs'} scatter so much that only an increase above "
            f"{reach * 100:+.1f} points can fail; more {more} narrow the bound (its factor on the spread is "
            f"{spread.factor:.2f} with {n})"
            + ("" if paired else ", or use the paired mode, which cancels a busy machine")
        )


# -- the verdicts ----------------------------------------------------------------------------


def compare(
    current: Report,
    baseline: Report | Sequence[Report] | None,
    settings: GateSettings | None = None,
    *,
    allow_mismatch: bool = False,
    current_name: str | None = None,
    baseline_names: Sequence[str] | None = None,
) -> Verdict:
    """The gate's verdict on ``current`` against one or several healthy baseline runs (None: only
    ``max_idle`` applies). ``current_name`` and ``baseline_names`` (e.g. paths) label the runs in
    messages.

    Raises ``ComparisonError`` when the runs cannot be compared fairly (unless
    ``allow_mismatch``) or the current run has no steps, and ``ValueError`` when there is
    neither a baseline nor a ``max_idle``.
    """
    settings = settings or GateSettings()
    bases = [] if baseline is None else [baseline] if isinstance(baseline, Report) else list(baseline)
    if not bases and settings.max_idle is None:
        raise ValueError("compare needs a baseline or a max_idle")
    if baseline_names is not None and len(baseline_names) != len(bases):
        raise ValueError(f"baseline_names has {len(baseline_names)} names for {len(bases)} baselines")
    if current.summary.steps <= 0:
        raise ComparisonError("the current run has no steps: nothing to check")
    notes: list[str] = []
    if not current.complete:
        notes.append("the current report was written at an epoch end, not at the end of the run")
    cur_facts = RunFacts.of(current, current_name)
    over_max_idle = settings.max_idle is not None and cur_facts.idle_fraction > settings.max_idle

    if not bases:
        return Verdict(
            regressed=over_max_idle,
            method="ceiling",
            settings=settings,
            current=(cur_facts,),
            baseline=(),
            current_idle=cur_facts.idle_fraction,
            baseline_idle=None,
            increase=None,
            allowed_increase=None,
            over_threshold=False,
            spread=None,
            over_bound=None,
            interval=None,
            over_max_idle=over_max_idle,
            explanations=explaining_findings(current, None, ()),
            notes=tuple(notes),
        )

    if baseline_names is None:
        names = ["the baseline"] if len(bases) == 1 else [f"baseline run {i}" for i in range(1, len(bases) + 1)]
    else:
        names = list(baseline_names)
    bases, names = _unique(bases, names, notes)
    _check_comparable(current, bases, names, settings, allow_mismatch, notes)
    incomplete = [name for b, name in zip(bases, names, strict=True) if not b.complete]
    if incomplete:
        notes.append(f"{', '.join(incomplete)}: written at an epoch end, not at the end of the run")

    spread = prediction_spread([b.summary.gpu_idle_fraction for b in bases], 1.0 - settings.false_alarm)
    increase = cur_facts.idle_fraction - spread.mean
    over_threshold = increase > settings.max_increase
    if spread.bound is None:
        method: Method = "threshold"
        over_bound = None
        allowed = settings.max_increase
    else:
        method = "prediction"
        over_bound = cur_facts.idle_fraction > spread.bound
        allowed = max(settings.max_increase, spread.bound - spread.mean)
    _noise_notes(spread, settings, notes, paired=False)
    regressed_vs_baseline = over_threshold and over_bound is not False
    interval = _within_run_evidence([current], bases, settings, notes)
    deltas = phase_deltas(current.summary, [b.summary for b in bases])
    grown = [d for d in deltas if d.delta >= PHASE_GROWTH]
    return Verdict(
        regressed=regressed_vs_baseline or over_max_idle,
        method=method,
        settings=settings,
        current=(cur_facts,),
        baseline=tuple(RunFacts.of(b, n) for b, n in zip(bases, names, strict=True)),
        current_idle=cur_facts.idle_fraction,
        baseline_idle=spread.mean,
        increase=increase,
        allowed_increase=allowed,
        over_threshold=over_threshold,
        spread=spread,
        over_bound=over_bound,
        interval=interval,
        over_max_idle=over_max_idle,
        phase_deltas=deltas,
        explanations=explaining_findings(current, bases, grown),
        notes=tuple(notes),
    )


def compare_paired(
    head: Sequence[Report],
    base: Sequence[Report],
    settings: GateSettings | None = None,
    *,
    allow_mismatch: bool = False,
    head_names: Sequence[str] | None = None,
    base_names: Sequence[str] | None = None,
) -> Verdict:
    """The verdict on runs of the head commit against runs of the base commit, made in pairs
    (``head[i]`` ran next to ``base[i]`` on the same machine), so that what the machine was doing
    cancels out of each pair's difference.

    Raises ``ValueError`` unless both sides have the same number (>= 1) of runs, and
    ``ComparisonError`` as ``compare`` does.
    """
    settings = settings or GateSettings()
    if not head or len(head) != len(base):
        raise ValueError(f"compare_paired needs as many head runs as base runs (>= 1), got {len(head)} and {len(base)}")
    n = len(head)
    h_names = list(head_names) if head_names is not None else [f"head run {i}" for i in range(1, n + 1)]
    b_names = list(base_names) if base_names is not None else [f"base run {i}" for i in range(1, n + 1)]
    if len(h_names) != n or len(b_names) != n:
        raise ValueError("compare_paired needs one name per run")
    notes: list[str] = []
    first = head[0]
    _check_comparable(first, [*head[1:], *base], [*h_names[1:], *b_names], settings, allow_mismatch, notes, h_names[0])
    for report in (*head, *base):
        if report.summary.steps <= 0:
            raise ComparisonError("a run has no steps: nothing to check")
    incomplete = [name for r, name in zip([*head, *base], [*h_names, *b_names], strict=True) if not r.complete]
    if incomplete:
        notes.append(f"{', '.join(incomplete)}: written at an epoch end, not at the end of the run")

    diffs = [h.summary.gpu_idle_fraction - b.summary.gpu_idle_fraction for h, b in zip(head, base, strict=True)]
    spread = paired_spread(diffs, 1.0 - settings.false_alarm)
    increase = spread.mean
    current_idle = sum(h.summary.gpu_idle_fraction for h in head) / n
    baseline_idle = sum(b.summary.gpu_idle_fraction for b in base) / n
    over_threshold = increase > settings.max_increase
    if spread.bound is None:
        method: Method = "threshold"
        over_bound = None
        allowed = settings.max_increase
    else:
        method = "paired"
        over_bound = increase > spread.bound
        allowed = max(settings.max_increase, spread.bound)
    _noise_notes(spread, settings, notes, paired=True)
    over_max_idle = settings.max_idle is not None and current_idle > settings.max_idle
    interval = _within_run_evidence(head, base, settings, notes)
    deltas = phase_deltas([h.summary for h in head], [b.summary for b in base])
    grown = [d for d in deltas if d.delta >= PHASE_GROWTH]
    median_head = sorted(head, key=lambda r: r.summary.gpu_idle_fraction)[(n - 1) // 2]
    return Verdict(
        regressed=(over_threshold and over_bound is not False) or over_max_idle,
        method=method,
        settings=settings,
        current=tuple(RunFacts.of(r, name) for r, name in zip(head, h_names, strict=True)),
        baseline=tuple(RunFacts.of(r, name) for r, name in zip(base, b_names, strict=True)),
        current_idle=current_idle,
        baseline_idle=baseline_idle,
        increase=increase,
        allowed_increase=allowed,
        over_threshold=over_threshold,
        spread=spread,
        over_bound=over_bound,
        interval=interval,
        over_max_idle=over_max_idle,
        phase_deltas=deltas,
        explanations=explaining_findings(median_head, base, grown),
        notes=tuple(notes),
        paired=True,
    )
