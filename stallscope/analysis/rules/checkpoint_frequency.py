"""``checkpoint.frequency``: blocking checkpoint saves take a large share of the run."""

from __future__ import annotations

from stallscope.analysis.context import Context
from stallscope.analysis.finding import Finding, speedup_for
from stallscope.analysis.rules._frequency import estimate
from stallscope.timeline.phases import CHECKPOINT

ID = "checkpoint.frequency"


def _training_time(seconds: float) -> str:
    if seconds >= 120:
        return f"{seconds / 60:.0f} min"
    if seconds >= 1:
        return f"{seconds:.0f} s"
    return f"{seconds * 1e3:.0f} ms"


def rule(ctx: Context) -> Finding | None:
    est = estimate(ctx, CHECKPOINT, ctx.config.checkpoint_target_share)
    if est is None:
        return None
    k = est.interval
    span_text = _training_time(k * est.step_without_s)
    if ctx.config.framework == "lightning":
        fix = (
            f"Save checkpoints every {k} steps (about {span_text} of training at the current speed) "
            f"instead of every {est.interval_now:.0f}."
        )
        snippet = f"ModelCheckpoint(every_n_train_steps={k})"
    else:
        fix = (
            f"Save a checkpoint every {k} steps (about {span_text} of training at the current speed) instead of every "
            f"{est.interval_now:.0f}, or save from a background thread."
        )
        snippet = f"if step % {k} == 0:\n    torch.save(state, path)"
    return Finding(
        id=ID,
        title=f"Checkpoint saves block training {est.share_now:.0%} of the time ({est.each_s * 1e3:.0f} ms each)",
        est_saving_fraction=est.saving,
        est_speedup=round(speedup_for(est.saving), 3),
        confidence="high",
        evidence=est.evidence(),
        fix=fix,
        suggestion={"every_n_steps": k},
        snippet=snippet,
    )
