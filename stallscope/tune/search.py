"""The search: trial 0 as configured, then greedily the top finding's suggestion, measured.

For each candidate (the top finding's suggestion that a trial can apply, and for ``num_workers``
the neighbours of the predicted value, since the prediction is a model), rounds run the baseline
(the settings kept so far) and the candidates once each, in an order that turns every round. After
``min_rounds`` rounds, a candidate is kept when its realized speedup's interval (``stats``) is
above ``1 + min_saving`` and dropped when it is below; rounds go on while one is undecided, up to
``max_rounds`` or the budget. The winner is re-diagnosed from its own report, and the search goes
on from it until no finding predicts a saving worth trying or the budget is spent. A predicted
saving smaller than ``max_rounds`` rounds could show on this job (the trials' scatter so far,
``Tuner._resolvable``) is not tried: its trials would end undecided. A neighbour kept over the
predicted worker count says the best count lies that way: the next step tries one more step on
(``Tuner._onward``), measured like any neighbour, before the re-diagnosis's findings.

The search talks to the child only through ``runner.run_trial`` (its plan in the environment, its
``trial.json`` and report back); an ``Observer`` is told of each step, for the live table.
"""

from __future__ import annotations

import json
import math
import os
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from stallscope._exceptions import ReportError
from stallscope.report.io import load_report
from stallscope.report.schema import Report
from stallscope.tune import runner
from stallscope.tune.applicable import RANK_KEY, THREADS_KEY, in_place
from stallscope.tune.loaders import LOADER_KEYS
from stallscope.tune.plan import TrialPlan
from stallscope.tune.stats import Speedup, decide, paired_speedup, t95

#: trial 0's default budget: this many steps past warm-up, or this many seconds, whichever first
DEFAULT_STEPS = 300
DEFAULT_SECONDS = 30.0
#: the fewest steps a later trial measures (when trial 0 measured fewer in its seconds)
MIN_STEPS = 10
#: trial 0's time to start, on top of its budget, before it counts as hung
START_ALLOWANCE_S = 60.0
#: the worker count's key in each loop kind's vocabulary (its neighbours are tried too)
WORKER_KEYS = ("num_workers", "dataloader_num_workers")
#: settings that only mean something with workers (a DataLoader refuses them without), by the
#: worker count's key: dropped from a candidate of no workers
WITH_WORKERS = {
    "num_workers": ("persistent_workers", "prefetch_factor"),
    "dataloader_num_workers": ("dataloader_persistent_workers", "dataloader_prefetch_factor"),
}
#: a later trial's timeout is at least trial 0's wall time and this much more
TIMEOUT_SLACK_S = 30.0
#: the pairs' scatter is judged from this many degrees of freedom or more (before: every
#: prediction worth trying is tried)
MIN_SCATTER_DF = 4


@dataclass(frozen=True)
class TuneOptions:
    """What ``stallscope tune`` was asked for."""

    #: the whole search's wall time, seconds
    budget_s: float = 600.0
    #: a trial's measured steps and seconds (None: chosen from trial 0)
    steps: int | None = None
    seconds: float | None = None
    warmup_steps: int = 5
    #: a candidate is kept when its realized speedup is surely above 1 + min_saving
    min_saving: float = 0.02
    min_rounds: int = 3
    max_rounds: int = 8
    #: a trial's timeout (None: its budget x2)
    timeout_s: float | None = None
    #: where the trials' folders go
    scratch: Path = Path("stallscope-tune")
    #: try num_workers - 1 and + 1 beside the predicted value
    neighbours: bool = True

    def __post_init__(self) -> None:
        if not self.budget_s > 0:
            raise ValueError(f"budget must be > 0 seconds, got {self.budget_s!r}")
        if self.steps is not None and self.steps < 1:
            raise ValueError(f"steps must be >= 1, got {self.steps!r}")
        if self.seconds is not None and not self.seconds > 0:
            raise ValueError(f"seconds must be > 0, got {self.seconds!r}")
        if self.warmup_steps < 0:
            raise ValueError(f"warmup must be >= 0 steps, got {self.warmup_steps!r}")
        if not 0 <= self.min_saving < 1:
            raise ValueError(f"min_saving must be in [0, 1), got {self.min_saving!r}")
        if not 2 <= self.min_rounds <= self.max_rounds:
            raise ValueError(f"need 2 <= min_rounds <= max_rounds, got {self.min_rounds!r}, {self.max_rounds!r}")


@dataclass
class Candidate:
    """One change tried against the settings kept so far."""

    index: int
    #: the change, as suggestion keys (``{"num_workers": 2}``)
    change: dict[str, Any]
    #: every setting of the trial: the kept ones with the change
    settings: dict[str, Any]
    #: the finding it comes from; for a neighbour, the finding whose value it neighbours
    finding: str | None
    #: the finding's ``est_speedup`` (None for a neighbour: the prediction is for another value)
    predicted: float | None
    bound: str = "estimate"
    neighbour: bool = False
    #: (baseline, candidate) steps per second, one pair per round
    pairs: list[tuple[float, float]] = field(default_factory=list)
    #: the round of each pair (its place in ``Tuner._rounds``, counted over every step)
    pair_rounds: list[int] = field(default_factory=list)
    #: the settings it is measured against (the baseline of its step)
    base: dict[str, Any] = field(default_factory=dict)
    realized: Speedup | None = None
    #: keep / drop / undecided, or why it was not measured through (failed, hung, loss, ...)
    verdict: str = "undecided"
    kept: bool = False
    note: str = ""
    #: losses of its trials and of the baselines beside them (the loss-curve check)
    losses: list[list[float]] = field(default_factory=list)
    base_losses: list[list[float]] = field(default_factory=list)
    #: whether its losses are what the command printed (not one a step, as a framework hands them)
    losses_printed: bool = False
    #: whether it stopped before ``max_rounds`` because the rounds left could not decide it
    futile: bool = False
    #: its first pairs, measured in an earlier step's rounds (``Tuner._reuse``)
    reused: int = 0
    #: its steps per second in rounds that ran no baseline, by round (``Tuner._rounds``): rounds
    #: for a head-to-head with a neighbour, once both are kept against the baseline
    solo: dict[int, float] = field(default_factory=dict)

    @property
    def label(self) -> str:
        return ", ".join(f"{k}={v!r}" for k, v in self.change.items())

    @property
    def active(self) -> bool:
        return self.verdict in ("undecided", "keep", "drop")

    @property
    def by_round(self) -> dict[int, float]:
        """Its steps per second in each round that measured it, with or without the baseline."""
        return {**self.solo, **{r: rate for r, (_, rate) in zip(self.pair_rounds, self.pairs, strict=True)}}


@dataclass
class TrialRecord:
    """One trial the search ran."""

    number: int
    label: str
    settings: dict[str, Any]
    #: the candidate it measured (None: trial 0 or a baseline)
    candidate: int | None
    round: int | None
    outcome: runner.TrialOutcome | None = None


@dataclass(frozen=True)
class ByHand:
    """A suggestion a trial cannot apply in place: the user applies it (with its prediction)."""

    finding: str
    suggestion: Mapping[str, Any]
    predicted: float
    bound: str
    fix: str


@dataclass
class TuneResult:
    """What the search found (``record.to_json`` writes it as ``tune.json``)."""

    command: list[str]
    options: TuneOptions
    framework: str = "plain"
    trials: list[TrialRecord] = field(default_factory=list)
    candidates: list[Candidate] = field(default_factory=list)
    by_hand: list[ByHand] = field(default_factory=list)
    #: every kept change, merged
    best: dict[str, Any] = field(default_factory=dict)
    #: the kept changes' realized medians, multiplied: the speedup over trial 0
    speedup: float = 1.0
    #: the measured trial budget (``TrialPlan`` fields)
    trial_steps: int | None = None
    trial_seconds: float | None = None
    stopped_because: str = ""
    interrupted: bool = False
    wall_s: float = 0.0
    baseline_steps_per_s: float | None = None

    @property
    def prediction_errors(self) -> list[float]:
        """How far each suggestion measured through missed: |predicted - realized| / realized for
        an estimate; for a floor (``bound == "lower"``), how far realized fell below it (0 when
        the floor held)."""
        errors = []
        for c in self.candidates:
            r = c.realized
            if c.predicted is None or r is None or r.pairs < 2 or not c.active:
                continue
            miss = c.predicted - r.median if c.bound == "lower" else abs(c.predicted - r.median)
            errors.append(max(0.0, miss) / r.median)
        return errors


class Observer(Protocol):
    """Told of the search's progress (the live table)."""

    def trial_started(self, record: TrialRecord, planned: int) -> None: ...

    def trial_ended(self, record: TrialRecord) -> None: ...

    def candidate_done(self, candidate: Candidate) -> None: ...

    def note(self, text: str) -> None: ...


class SilentObserver:
    def trial_started(self, record: TrialRecord, planned: int) -> None:
        return None

    def trial_ended(self, record: TrialRecord) -> None:
        return None

    def candidate_done(self, candidate: Candidate) -> None:
        return None

    def note(self, text: str) -> None:
        return None


RunTrial = Callable[..., runner.TrialOutcome]


class Tuner:
    """One ``stallscope tune`` search over ``command``."""

    def __init__(
        self,
        command: Sequence[str],
        options: TuneOptions,
        *,
        observer: Observer | None = None,
        run_trial: RunTrial = runner.run_trial,
        clock: Callable[[], float] = time.monotonic,
        cores: int | None = None,
    ) -> None:
        if not command:
            raise ValueError("no command to tune: give it after '--'")
        self.command = list(command)
        self.options = options
        self.observer: Observer = observer or SilentObserver()
        self._run_trial = run_trial
        self._clock = clock
        self._cores = cores or os.cpu_count() or 1
        self.result = TuneResult(command=self.command, options=options)
        self._started = 0.0
        self._timeout_s = 0.0
        self._walls: list[float] = []
        self._planned = 1
        #: the worker count one step past a neighbour kept over the predicted value, for the
        #: next step (``_onward``)
        self._onward: tuple[str, dict[str, Any]] | None = None
        #: (finding id, change) pairs tried from a baseline: not tried again from it
        self._tried: set[tuple[str, str]] = set()
        #: each round so far: the settings measured in it (``_key``) and their throughput,
        #: losses and whether those were printed (``_reuse``)
        self._rounds: list[dict[str, tuple[float, list[float], bool]]] = []

    # -- the search ----------------------------------------------------------------------

    def run(self) -> TuneResult:
        """Search until done, out of budget, or interrupted (Ctrl-C: the result so far)."""
        self._started = self._clock()
        try:
            self._search()
        except KeyboardInterrupt:
            self.result.interrupted = True
            self.result.stopped_because = "interrupted (Ctrl-C or SIGTERM): what was measured so far"
        self.result.wall_s = self._clock() - self._started
        return self.result

    def _search(self) -> None:
        opts = self.options
        first = self._trial(
            {},
            None,
            None,
            steps=opts.steps or DEFAULT_STEPS,
            seconds=opts.seconds or DEFAULT_SECONDS,
            timeout_s=opts.timeout_s or 2 * ((opts.seconds or DEFAULT_SECONDS) + START_ALLOWANCE_S),
        )
        outcome = first.outcome
        assert outcome is not None
        if outcome.status not in ("ok", "short") or outcome.steps_per_s is None:
            self.result.stopped_because = f"trial 0 (the command as configured) {outcome.status}: {outcome.message}"
            return
        measured = int((outcome.result or {}).get("steps", 0))
        self.result.trial_steps = opts.steps or max(MIN_STEPS, min(DEFAULT_STEPS, measured))
        self.result.trial_seconds = opts.seconds or DEFAULT_SECONDS
        self.result.baseline_steps_per_s = outcome.steps_per_s
        # budget x2, and on a host busy with other work, time to start and to exit on top
        self._timeout_s = opts.timeout_s or max(2 * outcome.wall_s, outcome.wall_s + TIMEOUT_SLACK_S)
        report = self._report(outcome)
        if report is None:
            self.result.stopped_because = "trial 0 wrote no readable report: nothing to diagnose"
            return
        self.result.framework = str((outcome.result or {}).get("framework") or report.run.framework)
        base: dict[str, Any] = {}
        while True:
            pick = self._next_candidates(report, base)
            if pick is None:
                self.result.stopped_because = (
                    self.result.stopped_because or "no finding that a trial can apply predicts a saving worth trying"
                )
                return
            chosen = self._compare(base, pick)
            if chosen is None:
                if self.result.stopped_because:
                    return
                continue  # the next finding of the same report
            self._onward = self._past(chosen, pick)
            base = dict(chosen.settings)
            self.result.best = dict(base)
            self.result.speedup *= chosen.realized.median if chosen.realized else 1.0
            report = chosen_report if (chosen_report := self._last_report(chosen)) is not None else report

    def _past(self, chosen: Candidate, step: list[Candidate]) -> tuple[str, dict[str, Any]] | None:
        """When ``chosen`` is a neighbour of the step's predicted worker count: its finding and
        its change with the count one more step the same way (within ``0..2 x cores``; a rank's
        change stays that rank's), else None."""
        if not chosen.neighbour or not self.options.neighbours:
            return None
        key = next((k for k in WORKER_KEYS if k in chosen.change), None)
        if key is None or not isinstance(kept := chosen.change[key], int):
            return None
        # the predicted count, or in a step that went one further already, the count it went from
        main = next((c for c in step if not c.neighbour), None)
        start = main.change.get(key) if main is not None else chosen.base.get(key)
        if not isinstance(start, int) or start == kept:
            return None
        value = kept + (1 if kept > start else -1)
        if not 0 <= value <= 2 * self._cores:
            return None
        return chosen.finding or "data.workers", _with_count(chosen.change, key, value)

    def _onward_candidates(self, base: Mapping[str, Any]) -> list[Candidate] | None:
        """The step after a neighbour was kept over the predicted count: the count one step
        further (``_past``), a neighbour with no prediction, once."""
        onward, self._onward = self._onward, None
        if onward is None:
            return None
        finding, change = onward  # its count is one past the base's: never applied already
        if self._measured(base, change):
            return None
        return [self._candidate(change, base, finding, None, "estimate", neighbour=True)]

    def _measured(self, base: Mapping[str, Any], change: Mapping[str, Any]) -> bool:
        """Whether a candidate of these settings ran against ``base`` already (not one skipped)."""
        settings = _without_idle_keys({**base, **change})
        return any(
            c.settings == settings and c.base == dict(base) and c.verdict != "skipped" for c in self.result.candidates
        )

    def _next_candidates(self, report: Report, base: Mapping[str, Any]) -> list[Candidate] | None:
        """The top finding worth trying from ``report``, as candidates (with neighbours); first,
        after a neighbour was kept over the predicted count, the count one step further."""
        onward = self._onward_candidates(base)
        if onward is not None:
            return onward
        threshold = 1.0 + self.options.min_saving
        for finding in report.findings:
            suggestion = dict(finding.suggestion)
            if finding.est_speedup < threshold or not suggestion:
                continue
            if not in_place(self.result.framework, suggestion) or not combinable(base, suggestion):
                if all(b.finding != finding.id for b in self.result.by_hand):
                    self.result.by_hand.append(
                        ByHand(finding.id, suggestion, finding.est_speedup, finding.est_speedup_bound, finding.fix)
                    )
                continue
            if all(base.get(k) == v for k, v in suggestion.items()) or self._measured(base, suggestion):
                continue  # applied already, or measured from this baseline (a step one further)
            key = (finding.id, repr(sorted(suggestion.items())) + repr(sorted(base.items())))
            if key in self._tried:
                continue
            self._tried.add(key)
            made = [self._candidate(suggestion, base, finding.id, finding.est_speedup, finding.est_speedup_bound)]
            workers_key = next((k for k in WORKER_KEYS if k in suggestion), "num_workers")
            workers = suggestion.get(workers_key)
            if self.options.neighbours and isinstance(workers, int):
                now = base.get(workers_key)
                for value in (workers - 1, workers + 1):
                    change = _with_count(suggestion, workers_key, value)
                    if (
                        0 <= value <= 2 * self._cores
                        and value not in (now, workers)
                        and not self._measured(base, change)
                    ):
                        made.append(self._candidate(change, base, finding.id, None, "estimate", neighbour=True))
            return made
        return None

    def _candidate(
        self,
        change: dict[str, Any],
        base: Mapping[str, Any],
        finding: str,
        predicted: float | None,
        bound: str,
        *,
        neighbour: bool = False,
    ) -> Candidate:
        settings = _without_idle_keys({**base, **change})
        candidate = Candidate(
            index=len(self.result.candidates),
            change={k: v for k, v in change.items() if k in settings},
            settings=settings,
            finding=finding,
            predicted=predicted,
            bound=bound,
            neighbour=neighbour,
            base=dict(base),
        )
        self.result.candidates.append(candidate)
        return candidate

    def _scatter(self, base: Mapping[str, Any]) -> tuple[float, int] | None:
        """How much a pair's log ratio scatters against ``base``: the pooled standard deviation of
        the log ratios of each candidate measured against it, about their own mean, and the pairs
        it is judged from; None before ``MIN_SCATTER_DF`` degrees of freedom. Against this
        baseline only: how much a trial's throughput moves depends on its settings (two busy
        workers on two cores scatter by 40%, none by a few percent), so pairs measured against
        an earlier step's baseline say little about this one's."""
        squares, df, pairs = 0.0, 0, 0
        wanted = _key(base)
        for c in self.result.candidates:  # (pairs reused from an earlier step counted there)
            if _key(c.base) != wanted:
                continue
            logs = [math.log(b / a) for a, b in c.pairs[c.reused :] if a > 0 and b > 0]
            if len(logs) >= 2:
                mean = statistics.fmean(logs)
                squares += sum((x - mean) ** 2 for x in logs)
                df += len(logs) - 1
                pairs += len(logs)
        return (math.sqrt(squares / df), pairs) if df >= MIN_SCATTER_DF else None

    def _showable(self, base: Mapping[str, Any]) -> tuple[float, float, int] | None:
        """The smallest speedup ``max_rounds`` rounds against ``base`` can show (were it exactly
        that, its interval would clear ``1 + min_saving``), with the pairs' scatter and how many
        pairs it is judged from; None before the scatter is known (``_scatter``)."""
        scatter = self._scatter(base)
        if scatter is None:
            return None
        sd, pairs = scatter
        rounds = self.options.max_rounds
        half = t95(rounds - 1) * sd / math.sqrt(rounds)
        return (1.0 + self.options.min_saving) * math.exp(half), sd, pairs

    def _resolvable(self, candidate: Candidate) -> str | None:
        """Why ``candidate``'s predicted speedup is too small to show on this job, or None: were it
        exactly as predicted, ``max_rounds`` rounds with the scatter of the pairs measured against
        its baseline so far would still leave its interval across ``1 + min_saving``. A floor
        (``>=``) is always tried: the speedup may be larger."""
        predicted = candidate.predicted
        showable = self._showable(candidate.base)
        if predicted is None or candidate.bound == "lower" or showable is None:
            return None
        smallest, sd, pairs = showable
        if predicted > smallest:
            return None
        return (
            f"not tried: x{predicted:.2f} predicted, and {self.options.max_rounds} rounds on this job show "
            f"x{smallest:.2f} or more (its pairs scatter by {100 * (math.exp(sd) - 1):.0f}%, over {pairs} pairs so "
            "far); apply it by hand, or tune with more --steps"
        )

    def _out_of_reach(self, speedup: Speedup, base: Mapping[str, Any]) -> float | None:
        """The smallest speedup ``max_rounds`` rounds against ``base`` can show (``_showable``),
        when ``speedup`` so far, even one standard error up (the scatter against ``base`` over its
        pairs), is below it: the rounds left would not decide it. None otherwise, or before the
        scatter is known."""
        showable = self._showable(base)
        if showable is None or speedup.pairs <= 0:
            return None
        smallest, sd, _ = showable
        return smallest if speedup.median * math.exp(sd / math.sqrt(speedup.pairs)) < smallest else None

    def _futile(self, live: list[Candidate], base: Mapping[str, Any]) -> list[Candidate]:
        """After ``min_rounds``: an undecided candidate stops, dropped with why, when its speedup
        against the baseline is out of reach of the rounds left (``_out_of_reach``). A change that
        does nothing, on a job whose pairs scatter, would otherwise run them all. Returns the
        others."""
        going = []
        for c in live:
            speedup = c.realized
            if c.verdict != "undecided" or speedup is None or (smallest := self._out_of_reach(speedup, base)) is None:
                going.append(c)
                continue
            c.verdict, c.futile = "drop", True
            c.note = (
                f"x{speedup.median:.2f} over {speedup.pairs} rounds, and {self.options.max_rounds} rounds on "
                f"this job show x{smallest:.2f} or more: the rounds left would not decide it"
            )
        return going

    def _reuse(self, base: Mapping[str, Any], candidates: list[Candidate]) -> None:
        """A candidate whose settings an earlier step measured in the same rounds as this step's
        baseline (a neighbour of the value kept then, say) starts from those pairs, the latest
        ``min_rounds`` of them: measured interleaved like its own, they count as its first
        rounds, and it may be decided (or stopped: ``_futile``) before a trial runs. Else it
        joins this step's rounds once they caught up, and runs the rest as any candidate."""
        for c in candidates:
            prior = self._prior(base, c)
            if not prior:
                continue
            c.pair_rounds = [i for i, _, _ in prior]
            c.pairs = [(b[0], m[0]) for _, b, m in prior]
            c.base_losses = [b[1] for _, b, _ in prior]
            c.losses = [m[1] for _, _, m in prior]
            c.losses_printed = prior[-1][2][2]
            c.reused = len(prior)
            c.realized = paired_speedup(c.pairs)
            c.verdict = decide(c.realized, self.options.min_saving)
            loss_note = loss_changed(c.base_losses, c.losses, printed=c.losses_printed)
            if loss_note:
                c.verdict, c.note = "loss changed", loss_note

    def _prior(
        self, base: Mapping[str, Any], candidate: Candidate
    ) -> list[tuple[int, tuple[float, list[float], bool], tuple[float, list[float], bool]]]:
        """The latest ``min_rounds`` earlier rounds that measured ``base`` and ``candidate``'s
        settings: (round, the baseline's trial, the candidate's) each (``_reuse``)."""
        wanted, mine = _key(base), _key(candidate.settings)
        prior = [(i, r[wanted], r[mine]) for i, r in enumerate(self._rounds) if wanted in r and mine in r]
        return prior[-self.options.min_rounds :]

    def _first_trials(self, base: Mapping[str, Any], candidates: list[Candidate]) -> int:
        """The trials the first ``min_rounds`` rounds of ``candidates`` take: a candidate's pairs
        from earlier rounds (``_reuse``) need none, and the baseline runs in the rounds where one
        of them does."""
        done = [len(self._prior(base, c)) for c in candidates]
        rounds = self.options.min_rounds
        needed = sum(rounds - n for n in done)
        return needed + (rounds - min(done) if needed else 0)

    def _compare(self, base: dict[str, Any], candidates: list[Candidate]) -> Candidate | None:
        """Rounds of the baseline and ``candidates``, interleaved; the one kept, or None."""
        opts = self.options
        main = next((c for c in candidates if not c.neighbour), None)
        too_small = self._resolvable(main) if main is not None else None
        if too_small is not None:
            for candidate in candidates:
                candidate.verdict, candidate.note = "skipped", too_small
                self.observer.candidate_done(candidate)
            return None
        per_trial = statistics.median(self._walls) if self._walls else 0.0
        while len(candidates) > 1 and self._left() < per_trial * self._first_trials(base, candidates):
            # the neighbours first, the last one that needs trials (one measured already costs none)
            paid = [i for i in range(1, len(candidates)) if self._first_trials(base, [candidates[i]])]
            if not paid:
                break
            dropped = candidates.pop(paid[-1])
            dropped.verdict, dropped.note = "skipped", "not tried: the budget would not allow it"
            self.observer.candidate_done(dropped)
        if self._left() < per_trial * self._first_trials(base, candidates):
            for candidate in candidates:
                candidate.verdict, candidate.note = "skipped", "not tried: the budget would not allow it"
                self.observer.candidate_done(candidate)
            self.result.stopped_because = "the budget is spent"
            return None
        self._reuse(base, candidates)
        running = list(candidates)
        for rnd in range(min(len(c.pairs) for c in candidates), opts.max_rounds):
            live = [c for c in running if c.active]
            if not live:
                break
            if rnd >= opts.min_rounds:
                live = running = self._narrowed(self._futile(live, base), rnd)
                if all(c.verdict != "undecided" for c in live) and self._rival(live, base) is None:
                    break
                if self._left() < per_trial * (len(live) + (0 if _head_only(live) else 1)):
                    self.result.stopped_because = "the budget is spent"
                    break
            # a candidate with pairs from an earlier step's rounds joins once this step caught up
            due = [c for c in live if len(c.pairs) + len(c.solo) <= rnd]
            if not due:
                continue
            # rounds for a head-to-head only (both kept against the baseline: ``_rival``) run no
            # baseline: the verdicts against it stand as they are
            head_only = rnd >= opts.min_rounds and _head_only(due)
            self._planned = len(self.result.trials) + len(due) + (0 if head_only else 1)
            order: list[Candidate | None] = list(due) if head_only else [None, *due]
            shift = rnd % len(order)
            order = order[shift:] + order[:shift]
            base_rate: float | None = None
            rates: dict[int, float] = {}
            base_losses: list[float] = []
            measured: dict[str, tuple[float, list[float], bool]] = {}
            self._rounds.append(measured)
            for item in order:
                if item is None:
                    record = self._trial(base, None, rnd)
                    out = record.outcome
                    assert out is not None
                    if out.status not in ("ok", "short") or out.steps_per_s is None:
                        self.result.stopped_because = f"the baseline's trial {out.status}: {out.message}"
                        self._finish(candidates, "undecided")
                        return None
                    base_rate = out.steps_per_s
                    base_losses = out.losses
                    measured[_key(base)] = (out.steps_per_s, out.losses, out.losses_printed)
                else:
                    record = self._trial(item.settings, item, rnd)
                    out = record.outcome
                    assert out is not None
                    if out.status not in ("ok", "short") or out.steps_per_s is None:
                        item.verdict, item.note = out.status, out.message
                        self.observer.candidate_done(item)
                        continue
                    missing = set(item.change) - set((out.result or {}).get("applied") or {}) - {"non_blocking"}
                    if missing:
                        reasons = (out.result or {}).get("not_applied") or {}
                        why = "; ".join(str(v) for v in reasons.values()) or "the trial saw no object to apply it to"
                        item.verdict, item.note = "not applied", f"{', '.join(sorted(missing))} not applied: {why}"
                        self.observer.candidate_done(item)
                        continue
                    rates[item.index] = out.steps_per_s
                    item.losses.append(out.losses)
                    item.losses_printed = out.losses_printed
                    measured[_key(item.settings)] = (out.steps_per_s, out.losses, out.losses_printed)
            this_round = len(self._rounds) - 1
            for item in live:
                if item.index not in rates or not item.active:
                    continue
                if base_rate is None:  # a head-to-head's round: the verdicts stand
                    item.solo[this_round] = rates[item.index]
                else:
                    item.pairs.append((base_rate, rates[item.index]))
                    item.pair_rounds.append(this_round)
                    item.base_losses.append(base_losses)
                    item.realized = paired_speedup(item.pairs)
                    item.verdict = decide(item.realized, opts.min_saving)
                loss_note = loss_changed(item.base_losses, item.losses, printed=item.losses_printed)
                if loss_note:
                    item.verdict, item.note = "loss changed", loss_note
            if self._left() <= 0:
                self.result.stopped_because = "the budget is spent"
                break
        return self._finish(candidates, "drop")

    def _rival(self, live: list[Candidate], base: Mapping[str, Any]) -> Candidate | None:
        """A neighbour kept, ahead of the predicted value (kept too) so far, but not yet surely
        faster than it: the rounds go on for their head-to-head (``_finish`` keeps the predicted
        value unless a neighbour is surely faster). Not when the head-to-head is out of reach of
        the rounds left (``_out_of_reach``, as ``_futile`` judges a candidate against the
        baseline). None when there is none."""
        main = next((c for c in live if not c.neighbour and c.verdict == "keep" and c.realized), None)
        if main is None or main.realized is None:
            return None
        for other in live:
            if not other.neighbour or other.verdict != "keep" or other.realized is None:
                continue
            if other.realized.median <= main.realized.median:
                continue
            head = head_to_head(main, other)
            if head is None or head.pairs < 2:
                return other  # measured in different rounds so far (``_reuse``): the rounds go on
            if decide(head, self.options.min_saving) != "undecided":
                continue
            smallest = self._out_of_reach(head, base)
            if smallest is None:
                return other
            other.note = (
                f"x{head.median:.2f} against {main.label} over {head.pairs} rounds, and "
                f"{self.options.max_rounds} rounds on this job show x{smallest:.2f} or more: the rounds "
                "left would not decide which is faster"
            )
        return None

    def _narrowed(self, live: list[Candidate], rnd: int) -> list[Candidate]:
        """After ``min_rounds``, the rounds go on for the fastest candidate only (and the
        predicted value beside a neighbour that leads, for their head-to-head): the others,
        slower so far, stop here, dropped. So does a predicted value still undecided beside a
        neighbour that leads and is kept: the neighbour is kept on its lead. A trade-off: more
        rounds might show the predicted value kept too, and ``_finish`` prefers it to a
        neighbour not surely faster; rounds that would favour a value measured slower so far."""
        measured = [c for c in live if c.realized is not None]
        if not measured:
            return live
        leader = max(measured, key=lambda c: c.realized.median if c.realized else 0.0)
        settled = leader.verdict == "keep"
        keep = [
            c
            for c in live
            if c is leader or (leader.neighbour and not c.neighbour and not (settled and c.verdict == "undecided"))
        ]
        for c in live:
            if c not in keep and c.verdict == "undecided":
                c.verdict = "drop"
                c.note = f"slower than {leader.label} after {rnd} rounds"
        return keep

    def _finish(self, candidates: list[Candidate], undecided_as: str) -> Candidate | None:
        """Close the comparison: the kept candidate (the predicted value unless a neighbour is
        surely better than it), each one's verdict told to the observer."""
        for c in candidates:
            if c.verdict == "undecided":
                c.verdict = undecided_as
                c.note = c.note or "the interval stayed across the threshold"
        kept = [c for c in candidates if c.verdict == "keep"]
        chosen: Candidate | None = None
        main = [c for c in kept if not c.neighbour]
        if main:
            chosen = main[0]
            for other in kept:
                if other is chosen or other.realized is None or chosen.realized is None:
                    continue
                head = head_to_head(chosen, other)
                if head is not None and head.pairs >= 2 and decide(head, self.options.min_saving) == "keep":
                    chosen = other
        elif kept:
            chosen = max(kept, key=lambda c: c.realized.median if c.realized else 0.0)
        for c in candidates:
            c.kept = c is chosen
            if c.verdict == "keep" and not c.kept:
                c.note = c.note or "faster than the baseline, but not surely faster than the one kept"
            self.observer.candidate_done(c)
        return chosen

    # -- trials --------------------------------------------------------------------------

    def _trial(
        self,
        settings: Mapping[str, Any],
        candidate: Candidate | None,
        rnd: int | None,
        *,
        steps: int | None = None,
        seconds: float | None = None,
        timeout_s: float | None = None,
    ) -> TrialRecord:
        number = len(self.result.trials)
        label = candidate.label if candidate is not None else ("as configured" if number == 0 else "baseline")
        plan = TrialPlan(
            number=number,
            folder=(self.options.scratch / f"trial-{number}").resolve(),
            settings=dict(settings),
            warmup_steps=self.options.warmup_steps,
            steps=steps if steps is not None else self.result.trial_steps,
            seconds=seconds if seconds is not None else self.result.trial_seconds,
        )
        record = TrialRecord(number, label, dict(settings), candidate.index if candidate else None, rnd)
        self.result.trials.append(record)
        self.observer.trial_started(record, max(self._planned, number + 1))
        record.outcome = self._run_trial(self.command, plan, timeout_s=timeout_s or self._timeout_s)
        self._walls.append(record.outcome.wall_s)
        self.observer.trial_ended(record)
        return record

    def _report(self, outcome: runner.TrialOutcome) -> Report | None:
        try:
            return load_report(outcome.report)
        except ReportError:
            return None

    def _last_report(self, candidate: Candidate) -> Report | None:
        """The report of the latest trial of ``candidate``'s settings (one of an earlier step's
        rounds, where its pairs were all measured there)."""
        for record in reversed(self.result.trials):
            if record.settings == candidate.settings and record.round is not None and record.outcome is not None:
                return self._report(record.outcome)
        return None

    def _left(self) -> float:
        return self.options.budget_s - (self._clock() - self._started)


def _key(settings: Mapping[str, Any]) -> str:
    """A trial's settings as a key: the same settings, the same key."""
    return json.dumps(settings, sort_keys=True, default=repr)


def head_to_head(first: Candidate, second: Candidate) -> Speedup | None:
    """``second`` against ``first``, over the rounds that measured both (with the baseline or
    without it); None when no round measured both."""
    mine, theirs = first.by_round, second.by_round
    both = [(mine[r], theirs[r]) for r in sorted(mine) if r in theirs]
    return paired_speedup(both) if both else None


def _head_only(due: Sequence[Candidate]) -> bool:
    """Whether a round of ``due`` (after the first ``min_rounds``) is for a head-to-head only:
    two or more candidates, all kept against the baseline already."""
    return len(due) >= 2 and all(c.verdict == "keep" for c in due)


def combinable(base: Mapping[str, Any], suggestion: Mapping[str, Any]) -> bool:
    """Whether ``suggestion`` merges into the settings kept so far (``base``) without undoing one
    of them: a trial's DataLoader settings are for every rank or for one (``"rank"``), so a
    suggestion for another rank than the loader settings kept, or for every rank where those are
    one rank's, is applied by hand."""
    if base.get(RANK_KEY) == suggestion.get(RANK_KEY):
        return True
    return not any(key in LOADER_KEYS for key in base)


#: losses further apart than this, relative, beyond the baselines' own spread, read as changed
LOSS_TOLERANCE = 0.05


def loss_changed(base: Sequence[Sequence[float]], cand: Sequence[Sequence[float]], *, printed: bool = False) -> str:
    """Why the candidate's first logged losses differ from the baseline's beyond noise, or ``""``.

    Noise is how far the baselines' own losses are apart at each step (same seed: often 0), plus
    ``LOSS_TOLERANCE`` of the loss. Where the script hands over no loss, there is nothing to check.
    ``printed``: the losses are the ones the command printed, in order (not one a step)."""
    runs = [list(b) for b in base if b]
    others = [list(c) for c in cand if c]
    if not runs or not others:
        return ""
    length = min(len(r) for r in runs + others)
    for i in range(length):
        values = [r[i] for r in runs]
        if not all(math.isfinite(v) for v in values):
            continue
        middle = statistics.median(values)
        spread = max(values) - min(values)
        allowed = 3 * spread + LOSS_TOLERANCE * abs(middle) + 1e-6
        for c in others:
            if not math.isfinite(c[i]) or abs(c[i] - middle) > allowed:
                where = f"{_ordinal(i + 1)} loss the command printed" if printed else f"loss at step {i}"
                return f"the {where} was {c[i]:.4g} against {middle:.4g} in the baseline"
    return ""


def _ordinal(n: int) -> str:
    """``1st``, ``2nd``, ``3rd``, ``4th``, ``11th``, ``21st``..."""
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


def scratch_for(out: Path, clock: Callable[[], float] = time.time) -> Path:
    """A fresh scratch folder beside ``tune.json``: ``stallscope-tune/<time>``."""
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(clock()))
    return out.resolve().parent / "stallscope-tune" / stamp


def _with_count(settings: Mapping[str, Any], key: str, value: int) -> dict[str, Any]:
    """``settings`` with the worker count ``key`` at ``value``; a thread count that goes with it
    (``data.workers`` on a CPU: the workers and torch's threads share the cores) moves the other
    way, so that a neighbour is the rule's advice for its own count (at least one thread)."""
    out = {**settings, key: value}
    threads, count = settings.get(THREADS_KEY), settings.get(key)
    if isinstance(threads, int) and isinstance(count, int):
        out[THREADS_KEY] = max(1, threads + count - value)
    return out


def _without_idle_keys(settings: dict[str, Any]) -> dict[str, Any]:
    """``settings`` less what only means something with workers, where they set none (a
    neighbour of one worker, a step down to none from persistent workers): a DataLoader refuses
    ``persistent_workers`` without workers."""
    for key, idle in WITH_WORKERS.items():
        if settings.get(key) == 0:
            settings = {k: v for k, v in settings.items() if k not in idle}
    return settings
