"""``tune.search``: the greedy, interleaved search, driven by scripted trials (no processes).

The scripted job runs at a throughput set by its settings; its reports carry the findings a
real diagnosis would give at those settings. What the search tries, keeps and writes is then
exact.
"""

from __future__ import annotations

import dataclasses
import io
import json
import math
import statistics
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from stallscope.analysis.finding import Finding
from stallscope.report.io import write_report
from stallscope.report.schema import Report
from stallscope.tune import record, render
from stallscope.tune.plan import TrialPlan
from stallscope.tune.runner import TrialOutcome, printed_losses
from stallscope.tune.search import Candidate, TuneOptions, Tuner, _key, head_to_head, loss_changed

#: steps per second by num_workers, and with persistent workers
RATES = {0: 10.0, 1: 14.0, 2: 20.0, 3: 19.5, 4: 19.0}


class Job:
    """A scripted job: each trial takes one second of a fake clock."""

    def __init__(self, make_report: Callable[..., Report], make_finding: Callable[..., Finding]) -> None:
        self.make_report = make_report
        self.make_finding = make_finding
        self.now = 0.0
        self.plans: list[TrialPlan] = []
        self.fail: Callable[[TrialPlan], str | None] = lambda plan: None
        self.noise: Callable[[TrialPlan], float] = lambda plan: 1 + 0.01 * (plan.number % 3)
        self.rates = dict(RATES)
        #: what a trial prints, from its settings (a plain loop's own log lines)
        self.output: Callable[[dict[str, Any]], str] = lambda settings: ""

    def clock(self) -> float:
        return self.now

    def findings(self, settings: dict[str, Any]) -> tuple[Finding, ...]:
        save = self.make_finding(
            id="checkpoint.frequency",
            est_speedup=1.3,
            est_saving_fraction=0.23,
            suggestion={"every_n_steps": 500},
            fix="Save every 500 steps",
            est_speedup_bound="lower",
        )
        if settings.get("num_workers", 0) < 2:
            return (self.make_finding(est_speedup=2.2, est_saving_fraction=0.55, suggestion={"num_workers": 2}), save)
        if not settings.get("persistent_workers"):
            persistent = self.make_finding(
                id="data.persistent_workers",
                est_speedup=1.1,
                est_saving_fraction=0.09,
                suggestion={"persistent_workers": True},
            )
            return (persistent, save)
        return (save,)

    def __call__(self, command: Sequence[str], plan: TrialPlan, *, timeout_s: float) -> TrialOutcome:
        self.plans.append(plan)
        self.now += 1.0
        settings = dict(plan.settings)
        rate = self.rates[settings.get("num_workers", 0)] * self.noise(plan)
        plan.report_dir.mkdir(parents=True)
        write_report(
            dataclasses.replace(self.make_report(), findings=self.findings(settings)), plan.report_dir / "report.json"
        )
        result = {"steps_per_s": rate, "steps": 50, "complete": True, "applied": settings, "framework": "plain"}
        plan.folder.mkdir(parents=True, exist_ok=True)
        (plan.folder / "output.log").write_text(self.output(settings))
        why = self.fail(plan)
        status = "hung" if why else "ok"
        return TrialOutcome(plan, status, 0, 1.0, result, plan.folder / "output.log", why or "")  # type: ignore[arg-type]


@pytest.fixture
def job(make_report: Callable[..., Report], make_finding: Callable[..., Finding]) -> Job:
    return Job(make_report, make_finding)


def _tuner(job: Job, tmp_path: Path, *, cores: int = 2, **options: Any) -> Tuner:
    return Tuner(
        ["python", "train.py"], TuneOptions(scratch=tmp_path, **options), run_trial=job, clock=job.clock, cores=cores
    )


def tune(job: Job, tmp_path: Path, *, cores: int = 2, **options: Any) -> Tuner:
    tuner = _tuner(job, tmp_path, cores=cores, **options)
    tuner.run()
    return tuner


def test_the_search_keeps_the_workers_and_drops_what_does_not_pay(job: Job, tmp_path: Path) -> None:
    result = tune(job, tmp_path).result
    assert job.plans[0].settings == {}
    assert job.plans[0].steps == 300
    assert all(p.steps == 50 for p in job.plans[1:])  # later trials: what trial 0 measured
    labels = [c.label for c in result.candidates]
    assert labels[:3] == ["num_workers=2", "num_workers=1", "num_workers=3"]  # the prediction, then its neighbours
    workers, one, three, persistent = result.candidates
    assert workers.kept
    assert workers.verdict == "keep"
    assert workers.realized is not None
    assert workers.realized.median == pytest.approx(2.0, rel=0.03)
    assert not one.kept
    assert not three.kept
    assert persistent.change == {"persistent_workers": True}
    assert persistent.settings == {
        "num_workers": 2,
        "persistent_workers": True,
    }
    assert persistent.verdict == "drop"
    assert not persistent.kept
    assert result.best == {"num_workers": 2}
    assert result.speedup == pytest.approx(2.0, rel=0.03)
    assert [b.finding for b in result.by_hand] == ["checkpoint.frequency"]  # a torch.save in a plain loop
    assert result.stopped_because == "no finding that a trial can apply predicts a saving worth trying"
    # the prediction x2.2 against x2.0 realized: within 10%; x1.1 against x1.0: within 10%
    assert max(result.prediction_errors) == pytest.approx(0.1, abs=0.03)


#: a busy host's scatter: each trial's throughput off by up to a quarter, in a fixed cycle
BUSY = (1.0, 1.25, 0.8, 1.15, 0.9, 1.2, 0.85)


def test_a_saving_smaller_than_the_rounds_can_show_here_is_not_tried(job: Job, tmp_path: Path) -> None:
    """From 2 workers the diagnosis suggests ``persistent_workers`` (x1.5) and ``pin_memory``
    (x1.10). On a job whose trials scatter by about 20%, the first one's pairs against 2 workers
    (it does not pay) show that eight rounds cannot show x1.10 there: ``pin_memory`` is listed as
    not tried, with why, and no trial runs it. On a steady job (the other tests' 1 to 3%) the
    same prediction is tried."""

    def findings(settings: dict[str, Any]) -> tuple[Finding, ...]:
        if settings.get("num_workers", 0) < 2:
            return (job.make_finding(est_speedup=2.2, est_saving_fraction=0.55, suggestion={"num_workers": 2}),)
        if "persistent_workers" in settings or "pin_memory" in settings:
            return ()
        return (
            job.make_finding(id="data.persistent_workers", est_speedup=1.5, suggestion={"persistent_workers": True}),
            job.make_finding(id="data.pin_memory", est_speedup=1.1, suggestion={"pin_memory": True}),
        )

    job.findings = findings  # type: ignore[method-assign]
    job.noise = lambda plan: BUSY[plan.number % len(BUSY)]
    result = tune(job, tmp_path).result
    workers = result.candidates[0]
    assert workers.kept  # x2 shows through the scatter
    persistent = next(c for c in result.candidates if c.change == {"persistent_workers": True})
    assert not persistent.kept
    assert len(persistent.pairs) >= 5  # enough to judge the scatter against 2 workers
    pin = next(c for c in result.candidates if c.change == {"pin_memory": True})
    assert pin.verdict == "skipped"
    assert pin.note.startswith("not tried: x1.10 predicted, and 8 rounds on this job show x1.")
    assert f"over {len(persistent.pairs)} pairs so far" in pin.note  # persistent's: the same baseline
    assert "apply it by hand, or tune with more --steps" in pin.note
    assert not any(plan.settings.get("pin_memory") for plan in job.plans)
    out = io.StringIO()
    Console(file=out, width=200).print(render.summary(result, "tune.json"))
    assert f"pin_memory=True (data.pin_memory): {pin.note}" in " ".join(out.getvalue().split())
    steady_job = Job(job.make_report, job.make_finding)
    steady_job.findings = findings  # type: ignore[method-assign]
    steady = tune(steady_job, tmp_path / "steady").result
    tried = next(c for c in steady.candidates if c.change == {"pin_memory": True})
    assert tried.verdict == "drop"
    assert len(tried.pairs) >= 3


def test_the_scatter_is_judged_against_the_baseline_of_the_step(job: Job, tmp_path: Path) -> None:
    """Two workers scatter by about 20% against none; from 2 workers on, the trials are steady.
    ``persistent_workers`` (x1.10 predicted) is the first suggestion from 2 workers: no pair was
    measured against 2 workers yet, and the first step's scatter says nothing of them, so it is
    tried."""
    job.noise = lambda plan: BUSY[plan.number % len(BUSY)] if dict(plan.settings).get("num_workers", 0) < 2 else 1.0
    result = tune(job, tmp_path).result
    assert result.candidates[0].kept
    persistent = next(c for c in result.candidates if c.change == {"persistent_workers": True})
    assert persistent.verdict != "skipped"
    assert len(persistent.pairs) >= 3


#: a job whose trials scatter by about 5%, in a fixed cycle
SCATTERED = (1.0, 1.06, 0.95, 1.04, 0.97, 1.05, 0.94)


def test_a_change_that_does_not_pay_stops_when_the_rounds_left_could_not_decide_it(job: Job, tmp_path: Path) -> None:
    """``persistent_workers`` (x1.10 predicted, x0.95 in truth, about x1.0 as this job's
    scatter measures it) on a job whose pairs scatter by about 5%: the first suggestion from 2
    workers, so tried. Once its own pairs give the scatter against 2 workers (5 rounds: 4
    degrees of freedom), its speedup, even one standard error up, is below what 8 rounds could
    show, and it stops there instead of running all 8 rounds undecided (its interval would
    still hold 1.02). The workers' x2 is kept."""

    def noise(plan: TrialPlan) -> float:
        costs = 0.95 if dict(plan.settings).get("persistent_workers") else 1.0
        return SCATTERED[plan.number % len(SCATTERED)] * costs

    job.noise = noise
    result = tune(job, tmp_path).result
    assert result.candidates[0].kept
    persistent = next(c for c in result.candidates if c.change == {"persistent_workers": True})
    assert persistent.realized is not None
    assert len(persistent.pairs) == 5
    assert persistent.verdict == "drop"
    assert not persistent.kept
    so_far = f"x{persistent.realized.median:.2f} over 5 rounds"
    assert persistent.note.startswith(f"{so_far}, and 8 rounds on this job show x1.")
    assert persistent.note.endswith("the rounds left would not decide it")
    shown = float(persistent.note.split(" show x")[1].split()[0])
    assert persistent.realized.median < shown < 1.10  # tried: the prediction could have shown
    assert sum(1 for plan in job.plans if plan.settings.get("persistent_workers")) == 5
    out = io.StringIO()
    Console(file=out, width=200).print(render.summary(result, "tune.json"))
    assert f"persistent_workers=True (data.persistent_workers): {persistent.note}" in " ".join(out.getvalue().split())


def _three_after_two(job: Job) -> None:
    """The job's diagnosis predicts 2 workers from fewer, then 3 from 2 (x1.1); 4 workers are
    slower than 2."""
    job.rates[4] = 18.0

    def findings(settings: dict[str, Any]) -> tuple[Finding, ...]:
        workers = settings.get("num_workers", 0)
        more = 2 if workers < 2 else 3
        return (job.make_finding(est_speedup=1.1 if workers else 2.2, suggestion={"num_workers": more}),)

    job.findings = findings  # type: ignore[method-assign]


def _bare_tuner(job: Job, tmp_path: Path, **options: Any) -> Tuner:
    """A tuner past trial 0 (1 s trials of 50 steps), for ``_compare`` called directly."""
    tuner = _tuner(job, tmp_path, cores=3, **options)
    tuner._started = job.clock()
    tuner._timeout_s = 60.0
    tuner.result.trial_steps = 50
    return tuner


def test_a_value_measured_beside_the_one_kept_starts_from_those_rounds(job: Job, tmp_path: Path) -> None:
    """The first step keeps ``num_workers=2`` and measured its neighbour 3 in the same rounds.
    When the next diagnosis, from 2, predicts 3, those rounds are its first pairs: 3 of them
    decide it (slower), and no trial runs 3 workers again; its new neighbour 4 runs its own."""
    _three_after_two(job)
    result = tune(job, tmp_path).result
    first, *_ = result.candidates
    assert first.kept
    assert first.settings == {"num_workers": 2}
    again = next(c for c in result.candidates if c.change == {"num_workers": 3} and not c.neighbour)
    step1 = next(c for c in result.candidates if c.change == {"num_workers": 3} and c.neighbour)
    assert again.reused == 3
    assert again.pairs == [(a[1], b[1]) for a, b in zip(first.pairs, step1.pairs, strict=True)]
    assert again.verdict == "drop"
    assert not again.kept
    assert sum(1 for plan in job.plans if dict(plan.settings) == {"num_workers": 3}) == 3  # step 1's only
    four = next(c for c in result.candidates if c.change == {"num_workers": 4})
    assert four.reused == 0
    assert len(four.pairs) == 3
    assert result.best == {"num_workers": 2}
    out = io.StringIO()
    Console(file=out, width=200).print(render.summary(result, "tune.json"))
    assert "num_workers=3: 3 of its 3 pairs measured in an earlier step" in out.getvalue()


def test_the_budget_counts_the_rounds_a_candidate_brings_from_earlier(job: Job, tmp_path: Path) -> None:
    """As above, with a budget that leaves room, after the first step, for 6 trials: 3 rounds
    of the baseline and 4 workers. 3 workers, predicted, brings its 3 rounds from the first
    step and needs none, so 4 workers is tried (counted as needing trials, 3 workers would have
    left 4 out: 9 trials)."""
    _three_after_two(job)
    first_step = 1 + 3 * 4  # trial 0, then 3 rounds of the baseline, 2 workers and its neighbours
    result = tune(job, tmp_path, budget_s=first_step + 6.5).result
    four = next(c for c in result.candidates if c.change == {"num_workers": 4})
    assert four.verdict == "drop"  # measured (slower), not skipped
    assert len(four.pairs) == 3
    assert len(job.plans) == first_step + 6
    assert result.best == {"num_workers": 2}


def test_a_candidate_from_earlier_rounds_takes_the_latest_and_runs_on_while_undecided(job: Job, tmp_path: Path) -> None:
    """Eight earlier rounds measured 3 workers beside 2: the candidate starts from the latest
    three (undecided: x1.00, x1.20, x0.90), joins this step's rounds at the fourth and runs on,
    undecided, to the eighth (3 workers x1.10 here, the three first rounds' scatter in it)."""
    job.rates[3] = 22.0
    tuner = _bare_tuner(job, tmp_path)
    base, three = {"num_workers": 2}, {"num_workers": 3}
    earlier = (30.0, 30.0, 30.0, 30.0, 30.0, 20.0, 24.0, 18.0)  # 3 workers' rate beside 2's 20
    tuner._rounds = [{_key(base): (20.0, [], False), _key(three): (rate, [], False)} for rate in earlier]
    candidate = tuner._candidate(three, base, "data.workers", 1.1, "estimate")
    chosen = tuner._compare(dict(base), [candidate])
    assert candidate.reused == 3
    assert candidate.pairs[:3] == [(20.0, 20.0), (20.0, 24.0), (20.0, 18.0)]
    assert candidate.pair_rounds[:3] == [5, 6, 7]
    assert candidate.pair_rounds[3:] == [8, 9, 10, 11, 12]  # this step's rounds, up to 8 pairs in all
    assert sum(1 for plan in job.plans if dict(plan.settings) == three) == 5
    assert candidate.realized is not None
    assert candidate.realized.pairs == 8
    assert chosen is None
    assert candidate.verdict == "drop"
    assert candidate.note == "the interval stayed across the threshold"


def test_a_neighbour_from_earlier_rounds_gets_its_head_to_head_in_this_steps(job: Job, tmp_path: Path) -> None:
    """From 2 workers, 4 is predicted; its neighbour 3 was measured beside 2 in three earlier
    rounds (x1.5), and 4 runs its first three (x1.3): both kept, the neighbour ahead, but no round
    measured the two together yet. The rounds go on for them, without the baseline, until their
    head-to-head decides: 3 is kept."""
    job.rates.update({3: 30.0, 4: 26.0})
    tuner = _bare_tuner(job, tmp_path)
    base, three = {"num_workers": 2}, {"num_workers": 3}
    tuner._rounds = [{_key(base): (20.0, [], False), _key(three): (30.0, [], False)} for _ in range(3)]
    four = tuner._candidate({"num_workers": 4}, base, "data.workers", 1.3, "estimate")
    neighbour = tuner._candidate(three, base, "data.workers", None, "estimate", neighbour=True)
    chosen = tuner._compare(dict(base), [four, neighbour])
    assert chosen is neighbour
    assert (four.verdict, neighbour.verdict) == ("keep", "keep")
    assert neighbour.reused == 3
    assert len(four.pairs) == 3
    assert sorted(four.solo) == sorted(neighbour.solo) != []
    head = head_to_head(four, neighbour)
    assert head is not None
    assert head.pairs == len(neighbour.solo)
    assert sum(1 for plan in job.plans if dict(plan.settings) == base) == 3  # the first rounds' only


def test_a_short_budget_drops_a_neighbour_that_needs_trials_not_one_measured_already(job: Job, tmp_path: Path) -> None:
    """Room for 6 trials of 1 s: the predicted 4 workers and the baseline, 3 rounds. Of the two
    neighbours, 5 would need 3 trials and 3 none (measured beside 2 in earlier rounds): 5 is not
    tried, 3 is judged from its rounds."""
    job.rates.update({3: 30.0, 4: 26.0, 5: 26.0})
    tuner = _bare_tuner(job, tmp_path, budget_s=6.5)
    tuner._walls = [1.0]
    base, three = {"num_workers": 2}, {"num_workers": 3}
    tuner._rounds = [{_key(base): (20.0, [], False), _key(three): (30.0, [], False)} for _ in range(3)]
    four = tuner._candidate({"num_workers": 4}, base, "data.workers", 1.3, "estimate")
    five = tuner._candidate({"num_workers": 5}, base, "data.workers", None, "estimate", neighbour=True)
    neighbour = tuner._candidate(three, base, "data.workers", None, "estimate", neighbour=True)
    tuner._compare(dict(base), [four, five, neighbour])
    assert five.verdict == "skipped"
    assert neighbour.reused == 3
    assert neighbour.verdict == "keep"
    assert len(four.pairs) == 3


def test_a_head_to_head_pairs_two_candidates_by_the_rounds_that_measured_both() -> None:
    """One candidate started from earlier rounds 0 to 2 and ran 5 and 6; the other ran 3 to 6:
    they meet in rounds 5 and 6 only."""
    first = Candidate(0, {}, {}, None, None, pairs=[(1.0, v) for v in (1, 2, 3, 50, 60)], pair_rounds=[0, 1, 2, 5, 6])
    second = Candidate(1, {}, {}, None, None, pairs=[(1.0, v) for v in (30, 40, 55, 66)], pair_rounds=[3, 4, 5, 6])
    head = head_to_head(first, second)
    assert head is not None
    assert head.pairs == 2
    assert head.median == pytest.approx(statistics.median((55 / 50, 66 / 60)))


def test_rounds_are_interleaved_and_turn(job: Job, tmp_path: Path) -> None:
    result = tune(job, tmp_path, neighbours=False).result
    first = [(t.round, t.label) for t in result.trials[1:7]]
    assert first == [
        (0, "baseline"),
        (0, "num_workers=2"),
        (1, "num_workers=2"),
        (1, "baseline"),
        (2, "baseline"),
        (2, "num_workers=2"),
    ]


def test_after_the_first_rounds_only_the_fastest_candidate_goes_on(job: Job, tmp_path: Path) -> None:
    job.noise = lambda plan: 1 + 0.8 * ((plan.number * 7) % 5 - 2) / 2  # a busy host: +-80%
    result = tune(job, tmp_path).result
    first = result.candidates[:3]
    later = [t for t in result.trials if t.round is not None and t.round >= 3 and t.candidate is not None]
    assert later  # the intervals stayed wide: more rounds ran
    ran = {t.candidate for t in later if t.candidate is not None and t.candidate < 3}
    leader = max(first, key=lambda c: c.realized.median if c.realized else 0)
    assert leader.index in ran
    assert ran <= {leader.index, 0}  # with the predicted value beside a leading neighbour
    for c in first:
        if c.index not in ran and c.verdict == "drop":
            assert c.note.startswith(f"slower than {leader.label}")


def test_a_neighbour_ahead_of_the_prediction_gets_the_rounds_to_show_it(job: Job, tmp_path: Path) -> None:
    """3 workers run 20% faster than the predicted 2, on a host whose noise leaves the two within
    each other's interval after the first 3 rounds: rounds go on for their head-to-head until
    it is decided, and the faster neighbour is kept. Both are kept against the baseline by
    then, so those rounds run the two of them only, not the baseline."""
    job.rates[3] = 24.0
    # the first three trials of each: 3 workers slow, fast, even; 2 workers fast, slow, even
    first = {2: [1.1, 0.9, 1.0], 3: [0.85, 1.15, 1.0]}
    seen: dict[int, int] = {}

    def noise(plan: TrialPlan) -> float:
        workers = dict(plan.settings).get("num_workers", 0)
        n = seen[workers] = seen.get(workers, 0) + 1
        factors = first.get(workers, [])
        return factors[n - 1] if n <= len(factors) else 1.0

    job.noise = noise
    result = tune(job, tmp_path).result
    two, _one, three = result.candidates[:3]
    assert three.kept
    assert not two.kept
    assert two.verdict == "keep"  # faster than the baseline, but not as fast as its neighbour
    assert len(three.pairs) == len(two.pairs) == 3  # against the baseline: the first rounds
    assert len(three.solo) == len(two.solo) > 0  # the head-to-head needed more
    assert sorted(three.solo) == sorted(two.solo)
    first_step = [t for t in result.trials if t.round is not None and t.settings.keys() <= {"num_workers"}]
    assert [t.round for t in first_step if not t.settings] == [0, 1, 2]  # the baseline's trials
    assert max(t.round or 0 for t in first_step) == 2 + len(three.solo)
    assert result.best.get("num_workers") == 3
    head = head_to_head(two, three)
    assert head is not None
    assert head.pairs == 3 + len(three.solo)
    assert head.low > 1.02  # decided: 3 surely faster than 2
    out = io.StringIO()
    Console(file=out, width=200).print(render.summary(result, "tune.json"))
    said = (
        f"num_workers=3 against num_workers=2: x{head.median:.2f} [{head.low:.2f}-{head.high:.2f}] over "
        f"{head.pairs} rounds, the last {len(three.solo)} without the baseline"
    )
    assert said in out.getvalue()
    written = record.to_json(result)["candidates"]
    assert [c["head_to_head_rounds"] for c in written[:3]] == [len(two.solo), 0, len(three.solo)]


def test_a_neighbour_a_little_ahead_gets_no_rounds_that_could_not_decide_it(job: Job, tmp_path: Path) -> None:
    """3 workers run as fast as the predicted 2, and the host's noise puts them about 2% ahead,
    on a job whose pairs scatter by about 5%: both are kept against the baseline after 3 rounds,
    and their head-to-head, even one standard error up, is below what 8 rounds could show there,
    so the rounds stop (they would run all 8 for it): the predicted value is kept and the
    neighbour says why."""
    job.rates[3] = job.rates[2]
    cycles = {0: (1.0, 1.05, 0.95), 1: (1.0, 1.0, 1.0), 2: (1.0, 1.0, 1.0), 3: (1.02, 0.98, 1.03)}
    seen: dict[int, int] = {}

    def noise(plan: TrialPlan) -> float:
        workers = dict(plan.settings).get("num_workers", 0)
        n = seen[workers] = seen.get(workers, 0) + 1
        return cycles[workers][(n - 1) % 3]

    job.noise = noise
    result = tune(job, tmp_path).result
    two, _one, three = result.candidates[:3]
    assert (two.verdict, three.verdict) == ("keep", "keep")
    assert two.realized is not None
    assert three.realized is not None
    assert three.realized.median > two.realized.median  # the neighbour leads
    assert two.kept
    assert not three.kept
    assert len(two.pairs) == len(three.pairs) == 3
    assert three.note.startswith("x1.02 against num_workers=2 over 3 rounds, and 8 rounds on this job show x1.")
    assert three.note.endswith("the rounds left would not decide which is faster")


def test_a_hung_candidate_is_reported_and_never_kept(job: Job, tmp_path: Path) -> None:
    job.fail = lambda plan: "stopped after 10 s" if plan.settings.get("num_workers") == 2 else None
    result = tune(job, tmp_path).result
    workers = result.candidates[0]
    assert workers.verdict == "hung"
    assert not workers.kept
    assert workers.note == "stopped after 10 s"
    assert result.best.get("num_workers") != 2


def test_the_budget_drops_neighbours_first_then_stops(job: Job, tmp_path: Path) -> None:
    result = tune(job, tmp_path, budget_s=9.0).result  # trial 0, then room for 2 configs x 3 rounds
    assert [c.verdict for c in result.candidates] == ["keep", "skipped", "skipped", "skipped"]
    assert result.stopped_because == "the budget is spent"
    assert len(result.trials) == 7


def test_tune_json_holds_trials_and_best(job: Job, tmp_path: Path) -> None:
    result = tune(job, tmp_path, neighbours=False).result
    record.write(result, tmp_path / "tune.json")
    data = json.loads((tmp_path / "tune.json").read_text())
    assert data["best"]["settings"] == {"num_workers": 2}
    assert data["best"]["speedup"] == pytest.approx(2.0, rel=0.03)
    trial = data["trials"][2]
    assert set(trial) >= {"settings", "predicted", "realized", "kept", "report"}
    assert trial["settings"] == {"num_workers": 2}
    assert trial["predicted"] == 2.2
    assert trial["kept"] is True
    assert trial["report"].endswith("trial-2/report/report.json")
    assert data["by_hand"][0]["suggestion"] == {"every_n_steps": 500}


def test_the_summary_prints_settings_as_data(job: Job, tmp_path: Path) -> None:
    result = tune(job, tmp_path, neighbours=False).result
    result.candidates[0].change = {"num_workers\x1b[31m::warning::": 2}
    out = io.StringIO()
    Console(file=out, width=120).print(render.summary(result, "tune.json\x1b]0;x\x07"))
    text = out.getvalue()
    assert "\x1b" not in text
    assert "::warning" not in text
    assert "best: x2.0" in text or "best: x1.9" in text or "best: x2.1" in text
    assert "DataLoader(..., num_workers=2)" in text
    assert "apply by hand: checkpoint.frequency" in text
    assert "predictions were within" in text


def test_the_loss_check_allows_noise_and_flags_a_changed_curve() -> None:
    base = [[2.3, 2.1, 1.9], [2.3, 2.12, 1.91]]
    assert loss_changed(base, [[2.3, 2.11, 1.9]]) == ""
    assert "step 1" in loss_changed(base, [[2.3, 3.0, 1.9]])
    assert loss_changed([[]], [[1.0]]) == ""  # nothing logged: nothing to check
    printed = [[2.0] * 23, [2.0] * 23]
    assert "the 12th loss the command printed" in loss_changed(printed, [[2.0] * 11 + [9.0]], printed=True)
    assert "the 22nd loss" in loss_changed(printed, [[2.0] * 21 + [9.0]], printed=True)
    assert "the 3rd loss" in loss_changed(printed, [[2.0] * 2 + [9.0]], printed=True)


def test_a_plain_loops_printed_losses_are_checked(job: Job, tmp_path: Path) -> None:
    """A plain loop hands StallScope no loss, but prints it: with 2 workers (a seeding bug, say)
    its curve changes, and the candidate is reported, not kept; the neighbours' are unchanged."""

    def output(settings: dict[str, Any]) -> str:
        shift = 1.0 if settings.get("num_workers") == 2 else 0.0
        bar = "epoch 0:  40%|####   | 4/10 [00:01<00:01, 3.9it/s, loss=9.99]\r"  # by the clock: not read
        return bar + "".join(f"step {i} loss {2.5 - 0.1 * i + shift:.4f}\n" for i in range(5))

    job.output = output
    result = tune(job, tmp_path).result
    two, one, three = result.candidates[:3]
    assert two.verdict == "loss changed"
    assert two.note == "the 1st loss the command printed was 3.5 against 2.5 in the baseline"
    assert not two.kept
    assert two.losses[0] == [3.5, 3.4, 3.3, 3.2, 3.1]
    assert one.verdict != "loss changed"
    assert three.verdict != "loss changed"
    assert result.best.get("num_workers") != 2
    # the summary says why it was set aside, in full (the table's column is narrow)
    out = io.StringIO()
    Console(file=out, width=80).print(render.summary(result, "tune.json"))
    text = " ".join(out.getvalue().split())
    assert "not kept, the loss changed: the 1st loss the command printed was 3.5 against 2.5" in text
    table = io.StringIO()
    Console(file=table, width=80).print(render.table(result))
    assert "loss changed" in table.getvalue()  # the table's verdict, whole at 80 columns


def test_printed_losses_are_read_as_scripts_print_them(tmp_path: Path) -> None:
    log = tmp_path / "output.log"
    log.write_text(
        "step 1 loss 2.31\n"
        "step 2: loss=2.2, val_loss 3.0\n"  # val_loss is another curve
        "{'loss': 2.1, 'grad_norm': 1.0, 'learning_rate': 5e-05, 'epoch': 0.1}\n"  # transformers
        " 50%|#####     | 5/10 [00:01<00:01, 4.2it/s, loss=1.9]\r 60%|######    | 6/10 loss=1.8\n"
        " 70%|#######   | 7/10 [00:02<00:01, 3.90it/s]step 7 loss 1.7\n"  # a print after the bar's update
        "{'eval_loss': 2.5, 'train_loss': 9.0} Loss: 1e-3\n"
        "{'loss': '1.6', 'grad_norm': '0.9'}\n"  # transformers 5 prints its values as strings
        "loss: tensor(1.5000, grad_fn=<NllLossBackward0>)\n"
        "step 9 loss nan\n"
    )
    losses = printed_losses(log)
    assert losses[:7] == [2.31, 2.2, 2.1, 1.7, 0.001, 1.6, 1.5]
    assert len(losses) == 8
    assert math.isnan(losses[7])  # a diverged loss is read, and never matches a finite one
    assert printed_losses(log, limit=2) == [2.31, 2.2]
    assert printed_losses(tmp_path / "missing.log") == []


def test_a_jobs_printed_losses_are_not_read(tmp_path: Path) -> None:
    """The ranks of a torchrun job print into one output, in an order that changes from run to
    run: their printed losses cannot be compared position by position."""
    log = tmp_path / "output.log"
    log.write_text("rank 0 loss 2.3\nrank 1 loss 2.4\n")
    plan = TrialPlan(1, tmp_path / "trial", {}, steps=10)

    def outcome(result: dict[str, Any]) -> TrialOutcome:
        return TrialOutcome(plan, "ok", 0, 1.0, result, log)

    assert outcome({"steps_per_s": 1.0}).losses == [2.3, 2.4]
    assert outcome({"steps_per_s": 1.0, "ranks": 2}).losses == []
    assert outcome({"losses": [1.0, 0.9], "ranks": 2}).losses == [1.0, 0.9]  # handed over by rank 0
    assert not outcome({"losses": [1.0]}).losses_printed


def test_a_setting_for_one_rank_is_tried_as_such_and_kept_for_that_rank(job: Job, tmp_path: Path) -> None:
    """A job's finding names the rank its fix is for (``{"num_workers": 2, "rank": 1}``): the
    candidate carries the rank, the trial's settings name it, and the winning settings read as
    that rank's loader; a later suggestion for every rank would undo it and is listed by hand."""
    everyone = job.make_finding(id="data.prefetch", est_speedup=1.5, suggestion={"prefetch_factor": 4})

    def findings(settings: dict[str, Any]) -> tuple[Finding, ...]:
        if settings.get("num_workers", 0) < 2:
            return (job.make_finding(est_speedup=2.2, suggestion={"num_workers": 2, "rank": 1}),)
        return (everyone,)

    job.findings = findings  # type: ignore[method-assign]
    result = tune(job, tmp_path, neighbours=False).result
    (workers,) = result.candidates
    assert workers.change == {"num_workers": 2, "rank": 1}
    assert any(p.settings == {"num_workers": 2, "rank": 1} for p in job.plans)
    assert workers.kept
    assert result.best == {"num_workers": 2, "rank": 1}
    assert render.snippet("plain", result.best) == "on rank 1: DataLoader(..., num_workers=2)"
    assert [b.finding for b in result.by_hand] == ["data.prefetch"]


def test_a_neighbour_count_takes_the_thread_count_that_goes_with_it(job: Job, tmp_path: Path) -> None:
    """data.workers on a CPU: 2 workers and 1 of torch's threads on 2 cores (the rule's
    ``cores - workers``). Its neighbours keep workers and threads sharing the cores alike: 1
    worker with 2 threads, 3 workers with 1 (at least one), not the prediction's thread count."""

    def findings(settings: dict[str, Any]) -> tuple[Finding, ...]:
        if settings.get("num_workers", 0) >= 1:
            return ()
        suggestion = {"num_workers": 2, "torch_num_threads": 1}
        return (job.make_finding(est_speedup=2.2, est_saving_fraction=0.55, suggestion=suggestion),)

    job.findings = findings  # type: ignore[method-assign]
    result = tune(job, tmp_path).result
    changes = [c.change for c in result.candidates[:3]]
    assert changes == [
        {"num_workers": 2, "torch_num_threads": 1},
        {"num_workers": 1, "torch_num_threads": 2},
        {"num_workers": 3, "torch_num_threads": 1},
    ]


def test_which_suggestions_a_trial_applies_and_merges() -> None:
    from stallscope.tune.applicable import in_place
    from stallscope.tune.search import combinable

    assert in_place("plain", {"num_workers": 2, "rank": 1})
    assert in_place("lightning", {"num_workers": 2, "rank": 1})
    assert not in_place("lightning", {"every_n_train_steps": 50, "rank": 1})  # a Trainer's, every rank's
    assert not in_place("plain", {"rank": 1})  # a compute straggler's: nothing to set
    # data.workers on a CPU: the trial sets torch's threads too, in every framework's trial
    for framework, workers in (
        ("plain", "num_workers"),
        ("lightning", "num_workers"),
        ("transformers", "dataloader_num_workers"),
    ):
        assert in_place(framework, {workers: 3, "torch_num_threads": 1})
    assert in_place("plain", {"num_workers": 2, "torch_num_threads": 1, "rank": 1})
    # and the snippet of the kept settings says it
    assert render.snippet("plain", {"num_workers": 3, "torch_num_threads": 1}) == (
        "torch.set_num_threads(1)\nDataLoader(..., num_workers=3)"
    )
    assert combinable({}, {"num_workers": 2, "rank": 1})
    assert combinable({"num_workers": 2, "rank": 1}, {"prefetch_factor": 4, "rank": 1})
    assert not combinable({"num_workers": 2, "rank": 1}, {"num_workers": 2, "rank": 0})
    assert not combinable({"num_workers": 2}, {"num_workers": 3, "rank": 1})
    assert combinable({"every_n_train_steps": 50}, {"num_workers": 3, "rank": 1})


def test_a_neighbour_kept_ahead_of_an_undecided_prediction_ends_the_rounds(job: Job, tmp_path: Path) -> None:
    """The predicted 2 workers run 3% faster than the baseline, on trials that scatter by 7%
    either way (undecided for all 8 rounds), and the neighbour 3 runs 50% faster, kept after the
    first 3 rounds: the rounds stop there, the neighbour is kept and the prediction says why."""
    job.rates.update({2: 10.3, 3: 15.0, 4: 15.0})
    seen: dict[int, int] = {}

    def noise(plan: TrialPlan) -> float:
        workers = dict(plan.settings).get("num_workers", 0)
        n = seen[workers] = seen.get(workers, 0) + 1
        return (0.93, 1.07)[n % 2] if workers == 2 else 1.0

    job.noise = noise
    result = tune(job, tmp_path).result
    two, _one, three = result.candidates[:3]
    assert three.kept
    assert three.verdict == "keep"
    assert two.verdict == "drop"
    assert two.note == "slower than num_workers=3 after 3 rounds"
    assert len(two.pairs) == len(three.pairs) == 3
    first_step = [t for t in result.trials if t.round is not None and t.settings.keys() <= {"num_workers"}]
    assert max(t.round or 0 for t in first_step) == 2  # no rounds after the first three
    assert result.best.get("num_workers") == 3


@pytest.mark.parametrize("four", [24.0, 16.0])
def test_a_neighbour_kept_over_the_prediction_is_followed_one_step_further(
    job: Job, tmp_path: Path, four: float
) -> None:
    """3 workers, the neighbour above the predicted 2, are kept: the next step tries 4 against
    3 before the re-diagnosis's findings, and keeps it only when it is surely faster. 2 x cores
    (4 on this 2-core job) is as far as it goes."""
    job.rates.update({3: 22.0, 4: four})
    result = tune(job, tmp_path).result
    three = result.candidates[2]
    assert three.change == {"num_workers": 3}
    assert three.kept
    onward = result.candidates[3]
    assert onward.change == {"num_workers": 4}
    assert onward.base == {"num_workers": 3}
    assert onward.neighbour
    assert onward.predicted is None
    assert onward.kept is (four > 22.0)
    assert result.best.get("num_workers") == (4 if four > 22.0 else 3)
    assert not any(c.change.get("num_workers", 0) > 4 for c in result.candidates)


def test_a_neighbour_of_no_workers_drops_what_needs_workers(job: Job, tmp_path: Path) -> None:
    """A suggestion of 1 worker kept for the run: its neighbour of none is tried without
    persistent_workers (a DataLoader refuses it without workers), the other with it."""

    def findings(settings: dict[str, Any]) -> tuple[Finding, ...]:
        if settings.get("num_workers", 0) == 0 and "num_workers" not in settings:
            suggestion = {"num_workers": 1, "persistent_workers": True}
            return (job.make_finding(est_speedup=1.4, est_saving_fraction=0.3, suggestion=suggestion),)
        return ()

    job.findings = findings  # type: ignore[method-assign]
    result = tune(job, tmp_path).result
    one, none, two = result.candidates[:3]
    assert one.change == {"num_workers": 1, "persistent_workers": True}
    assert none.change == {"num_workers": 0}
    assert none.settings == {"num_workers": 0}
    assert two.change == {"num_workers": 2, "persistent_workers": True}


def test_a_count_one_further_that_wins_is_followed_again(job: Job, tmp_path: Path) -> None:
    """On 3 cores (up to 6 workers): 3 kept over the predicted 2, then 4 and 5 each kept one
    step further, and 6, slower than 5, is not."""
    job.rates.update({3: 22.0, 4: 26.0, 5: 30.0, 6: 28.0})
    job.findings = lambda settings: (  # type: ignore[method-assign]
        (job.make_finding(est_speedup=2.2, est_saving_fraction=0.55, suggestion={"num_workers": 2}),)
        if settings.get("num_workers", 0) < 2
        else ()
    )
    result = tune(job, tmp_path, cores=3).result
    onward = result.candidates[3:]
    assert [(c.base, c.change) for c in onward] == [
        ({"num_workers": 3}, {"num_workers": 4}),
        ({"num_workers": 4}, {"num_workers": 5}),
        ({"num_workers": 5}, {"num_workers": 6}),
    ]
    assert [c.kept for c in onward] == [True, True, False]
    assert result.best == {"num_workers": 5}


def test_a_count_measured_one_further_is_not_measured_again_from_the_same_baseline(job: Job, tmp_path: Path) -> None:
    """4 workers, tried one step past the 3 kept, did not pay; the diagnosis from 3 then
    predicts 4: it is not tried again."""
    job.rates.update({3: 22.0, 4: 22.0})

    def findings(settings: dict[str, Any]) -> tuple[Finding, ...]:
        workers = settings.get("num_workers", 0)
        if workers < 2:
            return (job.make_finding(est_speedup=2.2, est_saving_fraction=0.55, suggestion={"num_workers": 2}),)
        if workers == 3:
            return (job.make_finding(est_speedup=1.3, est_saving_fraction=0.23, suggestion={"num_workers": 4}),)
        return ()

    job.findings = findings  # type: ignore[method-assign]
    result = tune(job, tmp_path).result
    from_three = [c for c in result.candidates if c.base == {"num_workers": 3}]
    assert [c.change for c in from_three] == [{"num_workers": 4}]
    assert not from_three[0].kept
    assert result.best == {"num_workers": 3}
