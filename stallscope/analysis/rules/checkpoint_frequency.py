"""``checkpoint.frequency``: blocking checkpoint saves take a large share of the run.

The setting: save every ``K`` steps, ``K`` the round interval at which saves take the target
share. In Lightning, where the fit's length is known, ``K`` is at most the fit's steps, so it
still saves at least once. A plain loop's length is not known: it saves every ``K`` steps and once
at the end (``"at_end": true``). When even that leaves saves above the target share of the fit,
the next lever is an asynchronous save (``"async_save": true``): Lightning's ``AsyncCheckpointIO``
plugin, a background writer in a plain loop. The prediction counts only the saves removed (a
floor); what the asynchronous write also recovers is not counted.
"""

from __future__ import annotations

from typing import Any

from stallscope.analysis.context import Context
from stallscope.analysis.finding import Finding, speedup_for
from stallscope.analysis.rules._frequency import TARGET_SLACK, estimate, runs_every, training_time
from stallscope.timeline.phases import CHECKPOINT

ID = "checkpoint.frequency"


def _runs(before: int, steps: int, k: int, *, at_end: bool) -> int:
    """Saves among the steps with ``if step % k == 0`` (and one at the end, ``at_end``, unless the
    last step already saved)."""
    runs = runs_every(before, steps, k)
    if at_end and (before + steps) % k:
        runs += 1
    return runs


def rule(ctx: Context) -> Finding | None:
    target = ctx.config.checkpoint_target_share
    est = estimate(ctx, CHECKPOINT, target)
    if est is None:
        return None
    lightning = ctx.config.framework == "lightning"
    total = ctx.shape.total_steps if lightning and ctx.shape is not None else None
    k = est.interval
    capped = total is not None and k > total
    if capped and total is not None:
        k = total  # once per fit, at its last step
    at_end = not lightning
    before, steps = ctx.steps_before, ctx.span.steps
    # the save at the end is in the run's prediction; an epoch's counts its own saves
    runs_after = _runs(before, steps, k, at_end=at_end and ctx.run_span is None)
    # the fit the decision is about: the known one, else the run as observed so far
    fit_steps = total if total is not None else (ctx.run_span or ctx.span).steps
    fit_runs = _runs(0, fit_steps, k, at_end=at_end)
    async_save = (capped or k > fit_steps) and est.share_for(fit_steps, fit_runs) > target * TARGET_SLACK
    saving = est.saving_for(runs_after)
    if saving <= 0:
        return None
    suggestion: dict[str, Any] = {"every_n_steps": k}
    if at_end:
        suggestion["at_end"] = True
    if async_save:
        suggestion["async_save"] = True
    every = f"every {k} steps (about every {training_time(k * est.step_without_s)} of training)"
    if lightning:
        fix = f"Save checkpoints {every} instead of every {est.interval_now:.0f}"
        if capped:
            fix += f": once in this fit of {total} steps (the round interval, {est.interval}, is longer than the fit)"
        snippet = f"ModelCheckpoint(every_n_train_steps={k})"
        if async_save:
            fix += ", and asynchronously: Trainer(plugins=[AsyncCheckpointIO()]) writes in a background thread"
            snippet += "\nTrainer(plugins=[AsyncCheckpointIO()])  # from lightning.pytorch.plugins.io"
        fix += "."
    else:
        fix = f"Save a checkpoint {every} and once at the end, instead of every {est.interval_now:.0f}."
        observed = (ctx.run_span or ctx.span).steps
        if k > observed:
            fix += (
                f" The {observed} steps seen so far are fewer than {k}: a run this long would save once, at the end,"
                " and the prediction counts that one save."
            )
        snippet = f"if step % {k} == 0 or step == last_step:\n    save(state, path)"
        if async_save:
            fix += (
                " Write it in the background as well (torch.distributed.checkpoint.async_save, or a thread"
                " that saves a copy of the state), so training does not wait for the disk."
            )
            snippet = (
                f"if step % {k} == 0 or step == last_step:\n"
                "    writer.submit(torch.save, copy_of(state), path)  # a one-thread ThreadPoolExecutor"
            )
    if async_save:
        fix += " The prediction counts only the saves removed, not the write moved off the training thread."
    return Finding(
        id=ID,
        title=f"Checkpoint saves block training {est.share_now:.0%} of the time ({est.each_s * 1e3:.0f} ms each)",
        est_saving_fraction=saving,
        est_speedup=round(speedup_for(saving), 3),
        confidence="high",
        evidence={**est.evidence(), "saves_after": runs_after, "fit_steps": fit_steps, "saves_in_fit_after": fit_runs},
        fix=fix,
        suggestion=suggestion,
        snippet=snippet,
        est_speedup_bound="lower",  # the fix only removes saves
    )
