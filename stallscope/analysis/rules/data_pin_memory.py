"""``data.pin_memory``: host-to-device copies come from pageable memory.

Evidence: torch runs on CUDA, the loop spends time in the ``h2d`` phase, and the loader does not
pin its batches (``pin_memory=False``, or a checked batch held pageable CPU tensors).

Model. A copy from pageable memory is a host copy into a pinned staging buffer plus the transfer;
with ``pin_memory=True`` the loader makes that host copy itself, and with ``non_blocking=True`` the
training thread only enqueues the transfer. What the step gains depends on where the copy goes:

- ``num_workers=0``: the loader pins in the training process, inside ``next()``: the host copy
  stays on the training thread, nothing is gained, no finding;
- with workers, a pin-memory thread receives each batch from the workers (the hand-over the
  training thread paid inside ``next()``, ``x_m``) and copies it into pinned memory (taken as long
  as the ``h2d`` time per step). The step becomes the slowest of: the training thread without its
  copies and hand-overs, the pin thread (``x_m`` + the copy, a batch), and, when the loop already
  waits for its workers (or their batch was timed), the workers' production rate and the CPU of
  the cores (the loop model's terms; a loop that does not wait has workers to spare, and its model
  bounds their cost only from above).

Measured on an H100 host with 32 MB batches from 4 workers: the pin thread took 19.8 ms a batch
where the training thread had spent 4.9 ms receiving and 13.5 ms copying one (18.4 ms).

Then the device makes the transfer at the pinned speed (``PINNED_SPEEDUP`` times the pageable
one), which costs wall time only beyond the idle time the device already had.
"""

from __future__ import annotations

from stallscope.analysis.context import Context
from stallscope.analysis.device_model import device_view
from stallscope.analysis.finding import Finding, speedup_for
from stallscope.analysis.loop_model import LoopModel
from stallscope.analysis.numbers import fmt_ms, frac, ms
from stallscope.timeline.phases import COMPUTE, H2D

ID = "data.pin_memory"

#: how much faster a copy from pinned memory is than one from pageable memory (assumed)
PINNED_SPEEDUP = 2.0


def pinned_step_s(model: LoopModel, h2d_s: float) -> float:
    """The loop's steady step time with pinned batches and non-blocking copies (module doc);
    ``h2d_s`` is the pageable copy's time per step."""
    if model.workers <= 0:
        return model.predict_step_s(0)  # pinned in next(), on the training thread
    limits = [max(0.0, model.consumer_s - h2d_s), model.transfer_main_s + h2d_s]
    if model.starved or model.load_source == "probe":
        # the workers' cost is known (not only bounded by their rate): their pace and the cores'
        limits += [(model.load_s + model.transfer_worker_s) / model.workers, model.cores_step_s]
    return max(limits)


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
    per_step = span.phase_s(H2D) / span.steps
    host_share = h2d  # of the wall time, what the training thread gets back
    after_ms: float | None = None
    model = ctx.loop_model if ctx.loader is not None else None
    if model is not None and per_step > 0:
        now = model.predict_step_s(model.workers)
        after = pinned_step_s(model, per_step)
        after_ms = after * 1e3
        host_share = h2d * min(1.0, max(0.0, now - after) / per_step)
    view = device_view(ctx)
    idle = 1.0 - view.busy if view is not None else 1.0 - span.phase_fraction(COMPUTE)
    device_copy = h2d / PINNED_SPEEDUP
    saving = frac(host_share - max(0.0, device_copy - idle))
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
            "predicted_step_ms": round(after_ms, 3) if after_ms is not None else None,
        },
        fix=fix,
        suggestion={"pin_memory": True, "non_blocking": True},
        snippet=snippet,
    )
