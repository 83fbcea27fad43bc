"""``validation.frequency``: validation runs take a large share; validate less often.

Each loop kind in its own words (SPEC §3). Lightning: ``val_check_interval`` (an int is a number
of training batches, a float a fraction of the epoch: 1.0 = once per epoch, after its last
batch); when even once per epoch is too often, ``val_check_interval=1.0`` plus
``check_val_every_n_epoch``. A plain loop: the neutral keys ``every_n_steps`` (the run's steps,
counted from 1), ``every_n_epochs``, ``at_end`` (once more after the loop) and ``val_fraction``.

Lightning: the fit's length is known (``max_epochs``, ``max_steps``, ``limit_train_batches``), so
the setting still validates at least once in it, and the prediction counts the validation runs
Lightning will really do with it (``_TrainingEpochLoop._should_check_val_fx``: an int interval
counts batches within each checked epoch, with no extra run at the epoch's end). A plain loop's
length is not known: every ``N`` epochs, and after the last one (``"at_end": true``); a loop with
no epochs (``scope.batch`` calls, one pass over a generator) every ``N`` steps and after the
loop. When the interval alone cannot bring validation down to its target share of the fit, the
suggestion also validates on a part of the validation set (``limit_val_batches``,
``val_fraction``). The interval the fix text says the loop uses now is the gap in steps between
its recent validation runs, as the user set it.
"""

from __future__ import annotations

import math
from typing import Any

from stallscope.analysis.context import Context, RunShape
from stallscope.analysis.finding import Finding, SpeedupBound, speedup_for
from stallscope.analysis.numbers import every as every_n
from stallscope.analysis.numbers import nice_floor_fraction
from stallscope.analysis.rules._frequency import (
    TARGET_SLACK,
    FrequencyEstimate,
    epoch_pieces,
    estimate,
    runs_every,
    steps_between,
    steps_in_fit,
    training_time,
)
from stallscope.timeline.phases import VALIDATION

ID = "validation.frequency"


def _duration(seconds: float) -> str:
    return f"{seconds:.2f} s" if seconds >= 1 else f"{seconds * 1e3:.0f} ms"


def lightning_runs(
    before: int, steps: int, *, per_epoch: int, interval: int | float, every_n_epochs: int | None
) -> int:
    """Validation runs Lightning does among training steps ``before + 1`` .. ``before + steps``
    with ``val_check_interval=interval`` and ``check_val_every_n_epoch=every_n_epochs``."""
    batches = interval if isinstance(interval, int) else max(1, int(per_epoch * interval))
    if every_n_epochs is None:  # an int interval counts batches across epochs
        return runs_every(before, steps, batches)
    return sum(
        runs_every(into, n, batches)
        for epoch, into, n in epoch_pieces(before, steps, per_epoch)
        if (epoch + 1) % every_n_epochs == 0
    )


def plain_runs(
    before: int,
    steps: int,
    *,
    per_epoch: int,
    every_n_steps: int | None,
    every_n_epochs: int = 1,
    at_end: bool = True,
) -> int:
    """Validation runs of a plain loop among steps ``before + 1`` .. ``before + steps``: at every
    ``every_n_steps``-th step of the run (``if step % k == 0``, steps counted from 1), or after the
    last batch of every ``every_n_epochs``-th epoch; and, ``at_end`` (the span ends the run), once
    after the last step when that step did not validate already."""
    if every_n_steps is not None:
        runs = runs_every(before, steps, every_n_steps)
        if at_end and (before + steps) % every_n_steps:
            runs += 1  # the run after the last step
        return runs
    pieces = epoch_pieces(before, steps, per_epoch)
    runs = sum(1 for epoch, into, n in pieces if (epoch + 1) % every_n_epochs == 0 and into + n == per_epoch)
    last_epoch = pieces[-1][0] if pieces else 0
    if at_end and (last_epoch + 1) % every_n_epochs:
        runs += 1  # the run after the last epoch
    return runs


class _Plan:
    """A setting and what it does: runs in the span, runs in the fit, each run's length."""

    def __init__(self) -> None:
        self.suggestion: dict[str, Any] = {}
        self.what = ""
        self.snippet = ""
        self.notes: list[str] = []
        self.runs = 0
        self.fit_steps = 0
        self.fit_runs = 0
        self.capped = False
        self.fraction = 1.0


def _limit(est: FrequencyEstimate, plan: _Plan, target: float, shape: RunShape | None) -> float:
    """The fraction of each validation run that brings the fit's validation to the target share;
    1.0 when the interval alone does it."""
    if plan.fit_runs <= 0 or est.share_for(plan.fit_steps, plan.fit_runs) <= target * TARGET_SLACK:
        return 1.0
    allowed_s = target / (1 - target) * plan.fit_steps * est.step_without_s
    fraction = nice_floor_fraction(allowed_s / (plan.fit_runs * est.each_s))
    if shape is not None and shape.val_batches:
        fraction = max(fraction, 1 / shape.val_batches)  # at least one batch
    return min(1.0, fraction)


def _lightning_plan(ctx: Context, est: FrequencyEstimate) -> _Plan:
    shape = ctx.shape or RunShape()
    span = ctx.span
    per_epoch = shape.batches_per_epoch or ctx.batches_per_epoch or ctx.epoch_steps or span.steps
    total = steps_in_fit(ctx)
    now_every = shape.check_val_every_n_epoch
    plan = _Plan()
    interval: int | float
    every: int | None = now_every
    k = est.interval
    if k < per_epoch:
        interval = k
        if total is not None and k > total:  # a fit shorter than the interval
            interval, plan.capped = max(1, total), True
        span_text = training_time(interval * est.step_without_s)
        plan.what = f"every {interval} training batches (about every {span_text} of training)"
    else:
        epochs = max(1, math.ceil(est.needed / per_epoch - 1e-9))
        full = total // per_epoch if total is not None else None
        if full == 0 and total is not None:  # the fit ends before its first epoch does
            interval, every, plan.capped = max(1, total), 1, True
            plan.what = f"once, at the fit's last batch (val_check_interval={interval})"
        else:
            if full is not None and epochs > full:
                epochs, plan.capped = full, True
            interval, every = 1.0, epochs
            plan.what = "once per epoch, after its last batch" if epochs == 1 else f"every {epochs} epochs"
    plan.suggestion = {"val_check_interval": interval}
    if every != now_every:
        plan.suggestion["check_val_every_n_epoch"] = every

    def runs(before: int, steps: int) -> int:
        return lightning_runs(before, steps, per_epoch=per_epoch, interval=interval, every_n_epochs=every)

    plan.runs = runs(ctx.steps_before, span.steps)
    plan.fit_steps = total if total is not None else (ctx.run_span or span).steps
    plan.fit_runs = runs(0, plan.fit_steps)
    if plan.capped and total is not None:
        plan.notes.append(
            f"That is {plan.fit_runs} validation run{'s' if plan.fit_runs != 1 else ''} in this fit of {total} steps;"
            " less often would not validate at all."
        )
    plan.fraction = _limit(est, plan, ctx.config.validation_target_share, shape) if plan.capped else 1.0
    if plan.fraction < 1.0:
        now = shape.limit_val_batches
        plan.suggestion["limit_val_batches"] = (
            max(1, int(now * plan.fraction)) if isinstance(now, int) else round(now * plan.fraction, 4)
        )
    plan.snippet = "Trainer(" + ", ".join(f"{k}={v!r}" for k, v in plan.suggestion.items()) + ")"
    return plan


def has_epochs(ctx: Context) -> bool:
    """Whether a plain loop has epochs to count in: not one fed by ``scope.batch`` calls, nor a
    single pass over a generator (a ``while`` loop's batches wrapped as an iterator)."""
    if ctx.source == "callable":
        return False
    return not (ctx.source == "generator" and max(ctx.span.epochs, (ctx.run_span or ctx.span).epochs) <= 1)


def _plain_plan(ctx: Context, est: FrequencyEstimate) -> _Plan:
    """Neutral keys (SPEC §3): ``every_n_steps`` (the run's steps, counted from 1) or
    ``every_n_epochs``, ``at_end`` (once more after the loop), ``val_fraction`` (validate on the
    first part of the validation batches). A loop with no epochs is told steps alone."""
    span = ctx.span
    run = ctx.run_span or span
    per_epoch = ctx.epoch_steps or (span.steps // span.epochs if span.epochs else span.steps) or 1
    epochs_known = has_epochs(ctx)
    plan = _Plan()
    k = est.interval
    every_n_steps: int | None = None
    epochs = 1
    every_text = training_time(k * est.step_without_s)
    if not epochs_known:
        every_n_steps = k
        plan.suggestion = {"every_n_steps": k, "at_end": True}
        plan.what = f"every {k} steps (about every {every_text} of training) and once after the loop"
        plan.snippet = (
            f"if step % {k} == 0:  # step: the steps so far, from 1\n    validate()\n"
            "# ...and once after the loop\nvalidate()"
        )
        if k > run.steps:
            plan.capped = True
            plan.notes.append(
                f"The {run.steps} steps seen are fewer than {k}: a run this long would validate once, after"
                " the loop, and the prediction counts that run."
            )
    elif k < per_epoch:
        every_n_steps = k
        plan.suggestion = {"every_n_steps": k}
        plan.what = f"every {k} steps (about every {every_text} of training)"
        plan.snippet = f"if step % {k} == 0:  # step: the steps so far, from 1\n    validate()"
    else:
        epochs = max(1, math.ceil(est.needed / per_epoch - 1e-9))
        train_time = training_time(epochs * per_epoch * est.step_without_s)
        if epochs == 1:
            plan.suggestion = {"every_n_epochs": 1}
            plan.what = "once per epoch, after its last batch"
            plan.snippet = "validate()  # once, after the epoch's last batch"
        else:
            plan.suggestion = {"every_n_epochs": epochs, "at_end": True}
            plan.what = f"every {epochs} epochs (about every {train_time} of training) and after the last one"
            plan.snippet = f"if (epoch + 1) % {epochs} == 0 or epoch + 1 == epochs:\n    validate()"
        seen = max(1, run.epochs)
        if epochs > seen:
            plan.capped = True
            seen_text = f"{seen} epochs seen so far are" if seen != 1 else "1 epoch seen so far is"
            plan.notes.append(
                f"The {seen_text} fewer than {epochs}: a run this long would validate once, after its last epoch,"
                " and the prediction counts that run."
            )

    def runs(before: int, steps: int, at_end: bool) -> int:
        return plain_runs(
            before,
            steps,
            per_epoch=per_epoch,
            every_n_steps=every_n_steps,
            every_n_epochs=epochs,
            at_end=at_end and plan.suggestion.get("at_end", False),
        )

    # the run after the loop is in the run's prediction; an epoch's counts its own runs
    plan.runs = runs(ctx.steps_before, span.steps, ctx.run_span is None)
    plan.fit_steps = run.steps
    plan.fit_runs = runs(0, run.steps, True)
    plan.fraction = _limit(est, plan, ctx.config.validation_target_share, None) if plan.capped else 1.0
    if plan.fraction < 1.0:
        plan.suggestion["val_fraction"] = plan.fraction
        plan.snippet += f"  # on the first {plan.fraction:.0%} of the validation batches"
    return plan


def _transformers_plan(ctx: Context, est: FrequencyEstimate) -> _Plan:
    """transformers' ``eval_strategy="steps"``: every ``eval_steps`` optimizer steps, counted
    across epochs, and at the run's last step when that is not one of them. ``eval_steps`` is at
    most the run's steps (``state.max_steps``), so the run still evaluates."""
    shape = ctx.shape or RunShape()
    span = ctx.span
    total = shape.total_steps
    k = est.interval
    plan = _Plan()
    if total is not None and k > total:
        k, plan.capped = max(1, total), True
    plan.suggestion = {"eval_strategy": "steps", "eval_steps": k}
    plan.what = f"every {k} optimizer steps (about every {training_time(k * est.step_without_s)} of training)"
    plan.snippet = f'TrainingArguments(..., eval_strategy="steps", eval_steps={k})'

    def runs(before: int, steps: int, at_end: bool) -> int:
        done = runs_every(before, steps, k)
        return done + (1 if at_end and (before + steps) % k else 0)

    plan.fit_steps = total if total is not None else (ctx.run_span or span).steps
    ends_run = total is not None and ctx.steps_before + span.steps >= total
    plan.runs = runs(ctx.steps_before, span.steps, ends_run or ctx.run_span is None)
    plan.fit_runs = runs(0, plan.fit_steps, True)
    if plan.capped and total is not None:
        plan.notes.append(f"That is one evaluation in this run of {total} steps, at its last step.")
    plan.fraction = _limit(est, plan, ctx.config.validation_target_share, shape) if plan.capped else 1.0
    if plan.fraction < 1.0:
        plan.suggestion["eval_dataset_fraction"] = plan.fraction
        plan.snippet += f"\neval_dataset = eval_dataset.select(range(int(len(eval_dataset) * {plan.fraction})))"
    return plan


def rule(ctx: Context) -> Finding | None:
    est = estimate(ctx, VALIDATION, ctx.config.validation_target_share)
    if est is None:
        return None
    lightning = ctx.config.framework == "lightning"
    if ctx.config.framework == "transformers":
        plan = _transformers_plan(ctx, est)
        lightning = True  # the fix names the setting, as in Lightning
    else:
        plan = _lightning_plan(ctx, est) if lightning else _plain_plan(ctx, est)
    each_after = est.each_s * plan.fraction
    saving = est.saving_for(min(plan.runs, est.count), each_after)
    if saving <= 0:
        return None
    seen = steps_between(ctx.span.recent, VALIDATION)  # the gaps between runs, as the user set them
    unit = "batch" if ctx.config.framework == "lightning" else "step"  # transformers: optimizer steps
    now = every_n(seen if seen is not None else est.interval_now, unit)
    fix = f"Validate {plan.what} instead of {now}"
    fix += f": {plan.snippet.partition(chr(10))[0]}." if lightning else "."
    fix = " ".join([fix, *plan.notes])
    bound: SpeedupBound = "lower"  # fewer runs only removes work
    if plan.fraction < 1.0:
        where = "limit_val_batches" if ctx.config.framework == "lightning" else "a part of the validation set"
        fix += (
            f" Less often alone still leaves validation above {ctx.config.validation_target_share:.0%} of the time,"
            f" so validate on {plan.fraction:.0%} of the validation batches ({where}); the prediction assumes a"
            " run's time shrinks with its batches."
        )
        bound = "estimate"  # a run's fixed costs (loader start-up) do not shrink: not a floor
    patience = ctx.shape.early_stopping_patience if lightning and ctx.shape is not None else None
    if patience is not None and plan.runs < est.count:
        fix += (
            f" EarlyStopping(patience={patience}) counts validation runs: validating less often, it lets more"
            " training steps pass before it stops the fit (its patience in runs may be lowered to keep the"
            " same number of steps)."
        )
    per_epoch = ctx.shape.batches_per_epoch if ctx.shape is not None else None
    return Finding(
        id=ID,
        title=f"Validation takes {est.share_now:.0%} of the time ({_duration(est.each_s)} per validation pass)",
        est_saving_fraction=saving,
        est_speedup=round(speedup_for(saving), 3),
        confidence="high" if patience is None else "medium",  # when the fit ends depends on the runs
        evidence={
            **est.evidence(),
            "batches_per_epoch": per_epoch or ctx.epoch_steps or ctx.batches_per_epoch or 0,
            "every_n_steps_seen": seen if seen is not None else round(est.interval_now, 2),
            "runs_after": plan.runs,
            "fit_steps": plan.fit_steps,
            "runs_in_fit_after": plan.fit_runs,
        },
        fix=fix,
        suggestion=plan.suggestion,
        snippet=plan.snippet,
        est_speedup_bound=bound,
    )
