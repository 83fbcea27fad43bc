"""``data.prefetch``: workers keep up on average, but bursts of slow batches drain the queue.

Signature: most steps find a batch ready (median wait near zero) while a minority wait long
enough to add up. A deeper queue (``prefetch_factor``) rides out the bursts. The estimate assumes
doubling the queue depth absorbs about half of the remaining wait; confidence is low.
"""

from __future__ import annotations

from stallscope.analysis.context import Context
from stallscope.analysis.finding import Finding, speedup_for
from stallscope.analysis.numbers import fmt_ms, frac, ms

ID = "data.prefetch"


def rule(ctx: Context) -> Finding | None:
    loader = ctx.loader
    model = ctx.loop_model
    if loader is None or loader.num_workers == 0 or model is None:
        return None
    dist = ctx.span.data_wait
    bursty = dist.p50 < 0.05 * model.consumer_s and dist.p90 > 0.5 * model.consumer_s
    if not bursty or model.wait_s <= 0.02 * model.consumer_s:
        return None
    current = loader.prefetch_factor or 2
    suggested = min(16, current * 2)
    if suggested <= current:
        return None
    saving = frac(0.5 * model.wait_s * model.steps / ctx.span.wall_s) if ctx.span.wall_s > 0 else 0.0
    return Finding(
        id=ID,
        title=f"Bursts of slow batches drain the loader's queue ({fmt_ms(dist.p90)} p90 wait)",
        est_saving_fraction=saving,
        est_speedup=round(speedup_for(saving), 3),
        confidence="low",
        evidence={
            "num_workers": loader.num_workers,
            "prefetch_factor": current,
            "wait_p50_ms": ms(dist.p50),
            "wait_p90_ms": ms(dist.p90),
            "wait_max_ms": ms(dist.max),
            "wait_per_step_ms": ms(model.wait_s),
            "consumer_per_step_ms": ms(model.consumer_s),
        },
        fix=f"Raise prefetch_factor from {current} to {suggested} so the queue rides out slow batches.",
        suggestion={"prefetch_factor": suggested},
        snippet=f"DataLoader(dataset, num_workers={loader.num_workers}, prefetch_factor={suggested})",
    )
