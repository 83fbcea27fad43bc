"""``data.pin_memory``: host-to-device copies come from pageable memory.

Evidence: torch runs on CUDA, the loop spends time in the ``h2d`` phase, and the loader does not
pin its batches (``pin_memory=False``, or a checked batch held pageable CPU tensors).

Model: a copy from pinned memory runs about ``PINNED_SPEEDUP`` times faster than one staged
through pageable memory, and with ``non_blocking=True`` the host only enqueues it. The host gets
the whole ``h2d`` time back; the device does the copy instead, at the pinned speed, which costs
wall time only beyond the idle time the device already had.
"""

from __future__ import annotations

from stallscope.analysis.context import Context
from stallscope.analysis.device_model import device_view
from stallscope.analysis.finding import Finding, speedup_for
from stallscope.analysis.numbers import fmt_ms, frac, ms
from stallscope.timeline.phases import COMPUTE, H2D

ID = "data.pin_memory"

#: how much faster a copy from pinned memory is than one from pageable memory (assumed)
PINNED_SPEEDUP = 2.0


def rule(ctx: Context) -> Finding | None:
    span = ctx.span
    if ctx.cuda_device is None and ctx.cuda is None:
        return None  # pinning only matters for copies to a GPU
    h2d = span.phase_fraction(H2D)
    if h2d <= 0 or span.steps == 0:
        return None
    loader_unpinned = ctx.loader is not None and not ctx.loader.pin_memory
    checked = ctx.cuda.batches_checked if ctx.cuda is not None else 0
    pageable = ctx.cuda.pageable_batches if ctx.cuda is not None else 0
    if not (loader_unpinned or pageable > 0):
        return None
    if checked > 0 and pageable == 0:
        return None  # the batches were pinned after all (a custom collate or pin step)
    view = device_view(ctx)
    idle = 1.0 - view.busy if view is not None else 1.0 - span.phase_fraction(COMPUTE)
    device_copy = h2d / PINNED_SPEEDUP
    saving = frac(h2d - max(0.0, device_copy - idle))
    if saving <= 0:
        return None
    lightning = ctx.config.framework == "lightning"
    if lightning:
        fix = "Set pin_memory=True on the train DataLoader; Lightning then copies batches with non_blocking=True."
        snippet = "DataLoader(dataset, batch_size=..., num_workers=..., pin_memory=True)"
    else:
        fix = (
            "Set pin_memory=True on the DataLoader and copy with non_blocking=True, so the copy runs "
            "from pinned memory while the host moves on."
        )
        snippet = 'DataLoader(dataset, ..., pin_memory=True)\nx = x.to("cuda", non_blocking=True)'
    per_step = span.phase_s(H2D) / span.steps
    return Finding(
        id=ID,
        title=f"Copies to the GPU from pageable memory take {h2d:.0%} of the time ({fmt_ms(per_step)} per step)",
        est_saving_fraction=saving,
        est_speedup=round(speedup_for(saving), 3),
        confidence="medium" if pageable > 0 else "low",
        evidence={
            "h2d_fraction": frac(h2d),
            "h2d_per_step_ms": ms(per_step),
            "loader_pin_memory": ctx.loader.pin_memory if ctx.loader is not None else None,
            "batches_checked": checked,
            "pageable_batches": pageable,
            "device_idle_fraction": frac(idle),
            "assumed_pinned_speedup": PINNED_SPEEDUP,
        },
        fix=fix,
        suggestion={"pin_memory": True, "non_blocking": True},
        snippet=snippet,
    )
