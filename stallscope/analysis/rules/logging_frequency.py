"""``logging.frequency``: logging or metric syncing blocks training; log less often.

Every ``K`` steps, ``K`` the round interval at which logging takes the target share; in Lightning
at most the fit's steps (``log_every_n_steps`` longer than the fit logs no step at all). Lightning
also logs at each epoch's end whatever the interval: those calls stay in the prediction. The
prediction counts only the calls removed (a floor).
"""

from __future__ import annotations

from stallscope.analysis.context import Context
from stallscope.analysis.finding import Finding, speedup_for
from stallscope.analysis.rules._frequency import estimate, runs_every, training_time
from stallscope.timeline.phases import LOGGING

ID = "logging.frequency"


def rule(ctx: Context) -> Finding | None:
    est = estimate(ctx, LOGGING, ctx.config.logging_target_share)
    if est is None:
        return None
    lightning = ctx.config.framework == "lightning"
    total = ctx.shape.total_steps if lightning and ctx.shape is not None else None
    k = est.interval if total is None else max(1, min(est.interval, total))
    runs_after = runs_every(ctx.steps_before, ctx.span.steps, k)
    if lightning:
        runs_after += ctx.span.epochs  # the epoch-end logging, which log_every_n_steps does not change
    saving = est.saving_for(min(runs_after, est.count))
    if saving <= 0:
        return None
    every = f"every {k} steps (about every {training_time(k * est.step_without_s)} of training)"
    if lightning:
        fix = f"Log {every} instead of every {est.interval_now:.0f}: Trainer(log_every_n_steps={k})."
        snippet = f"Trainer(log_every_n_steps={k})"
    else:
        fix = f"Log {every} instead of every {est.interval_now:.0f}."
        observed = (ctx.run_span or ctx.span).steps
        if k > observed:
            fix += f" The {observed} steps seen so far are fewer than {k}: a run this long would log no step."
        snippet = f"if step % {k} == 0:\n    log(loss.item())"
    return Finding(
        id=ID,
        title=f"Logging blocks training {est.share_now:.0%} of the time ({est.each_s * 1e3:.1f} ms per call)",
        est_saving_fraction=saving,
        est_speedup=round(speedup_for(saving), 3),
        confidence="high",
        evidence={**est.evidence(), "calls_after": runs_after},
        fix=fix,
        suggestion={"log_every_n_steps": k},
        snippet=snippet,
        est_speedup_bound="lower",  # the fix only removes calls
    )
