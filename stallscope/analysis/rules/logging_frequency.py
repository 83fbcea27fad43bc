"""``logging.frequency``: logging or metric syncing blocks training; log less often."""

from __future__ import annotations

from stallscope.analysis.context import Context
from stallscope.analysis.finding import Finding, speedup_for
from stallscope.analysis.rules._frequency import estimate
from stallscope.timeline.phases import LOGGING

ID = "logging.frequency"


def rule(ctx: Context) -> Finding | None:
    est = estimate(ctx, LOGGING, ctx.config.logging_target_share)
    if est is None:
        return None
    k = est.interval
    if ctx.config.framework == "lightning":
        fix = f"Log every {k} steps instead of every {est.interval_now:.0f}: Trainer(log_every_n_steps={k})."
        snippet = f"Trainer(log_every_n_steps={k})"
    else:
        fix = f"Log every {k} steps instead of every {est.interval_now:.0f}."
        snippet = f"if step % {k} == 0:\n    log(loss.item())"
    return Finding(
        id=ID,
        title=f"Logging blocks training {est.share_now:.0%} of the time ({est.each_s * 1e3:.1f} ms per call)",
        est_saving_fraction=est.saving,
        est_speedup=round(speedup_for(est.saving), 3),
        confidence="high",
        evidence=est.evidence(),
        fix=fix,
        suggestion={"log_every_n_steps": k},
        snippet=snippet,
    )
