"""``validation.frequency``: validation runs take a large share; validate less often.

The suggestion uses Lightning's ``val_check_interval``: an int is a number of training batches,
a float a fraction of the epoch (1.0 = once per epoch). When even once per epoch is too often,
it is ``val_check_interval=1.0`` plus ``check_val_every_n_epoch``.
"""

from __future__ import annotations

import math
from typing import Any

from stallscope.analysis.context import Context
from stallscope.analysis.finding import Finding, speedup_for
from stallscope.analysis.numbers import frac
from stallscope.analysis.rules._frequency import estimate
from stallscope.timeline.phases import VALIDATION

ID = "validation.frequency"


def _duration(seconds: float) -> str:
    return f"{seconds:.2f} s" if seconds >= 1 else f"{seconds * 1e3:.0f} ms"


def rule(ctx: Context) -> Finding | None:
    est = estimate(ctx, VALIDATION, ctx.config.validation_target_share)
    if est is None:
        return None
    span = ctx.span
    per_epoch = ctx.batches_per_epoch or (span.steps // span.epochs if span.epochs else None)
    suggestion: dict[str, Any]
    saving = est.saving
    if per_epoch and est.interval >= per_epoch:
        runs_per_epoch_now = est.count / max(1, span.epochs)
        epochs_between = max(1, math.ceil(est.interval / per_epoch))
        if epochs_between == 1 and runs_per_epoch_now <= 1.0:
            return None
        if epochs_between == 1:
            suggestion = {"val_check_interval": 1.0}
            what = "once per epoch (val_check_interval=1.0)"
        else:
            # val_check_interval (SPEC's key) stays: once per epoch, on every n-th epoch
            suggestion = {"val_check_interval": 1.0, "check_val_every_n_epoch": epochs_between}
            what = f"every {epochs_between} epochs (val_check_interval=1.0, check_val_every_n_epoch={epochs_between})"
        after_s = span.steps / (per_epoch * epochs_between) * est.each_s
        saving = frac((span.phase_s(VALIDATION) - after_s) / span.wall_s)
    else:
        suggestion = {"val_check_interval": est.interval}
        what = f"every {est.interval} training batches (val_check_interval={est.interval})"
    if saving <= 0:
        return None
    if ctx.config.framework == "lightning":
        snippet = "Trainer(" + ", ".join(f"{k}={v!r}" for k, v in suggestion.items()) + ")"
    elif "check_val_every_n_epoch" in suggestion:
        snippet = f"if (epoch + 1) % {suggestion['check_val_every_n_epoch']} == 0:\n    validate()"
    elif suggestion["val_check_interval"] == 1.0:
        snippet = "# once, after the epoch's last batch\nvalidate()"
    else:
        snippet = f"if step % {suggestion['val_check_interval']} == 0:\n    validate()"
    return Finding(
        id=ID,
        title=f"Validation takes {est.share_now:.0%} of the time ({_duration(est.each_s)} per run)",
        est_saving_fraction=saving,
        est_speedup=round(speedup_for(saving), 3),
        confidence="high",
        evidence={**est.evidence(), "batches_per_epoch": per_epoch or 0},
        fix=f"Validate {what} instead of every {est.interval_now:.0f} batches.",
        suggestion=suggestion,
        snippet=snippet,
    )
