"""``host.sync``: the host waits for the device every step, so the two never overlap.

Evidence (NVML per phase): the GPU is busy while the loop is in compute (``u_c`` high) and idle
while it is anywhere else (``u_o`` low). A host that queued work and moved on would leave the GPU
working into the next data wait; a GPU that stops whenever the compute phase ends was drained by
a synchronisation in it (``loss.item()``, ``print(tensor)``, ``.cpu()``, ``torch.cuda.synchronize``).
CUDA events, when available, corroborate it: the device span of each compute phase about as long
as the phase itself.

Model, in shares of wall time: the device's work is ``B = c u_c + (1 - c) u_o``; the host's own
time is everything but its wait inside compute, ``(1 - c) + c (1 - u_c)`` (assuming it launched
work while the GPU idled). Without the sync they overlap: ``wall' = max(B, host)``.
"""

from __future__ import annotations

from stallscope.analysis.context import Context
from stallscope.analysis.device_model import device_view
from stallscope.analysis.finding import Confidence, Finding, speedup_for
from stallscope.analysis.numbers import frac
from stallscope.timeline.phases import COMPUTE

ID = "host.sync"

#: the GPU counts as busy in compute above this utilization, and as idle elsewhere below the other
BUSY_IN_COMPUTE = 0.7
IDLE_ELSEWHERE = 0.25


def rule(ctx: Context) -> Finding | None:
    view = device_view(ctx)
    if view is None or not view.on_cuda or view.util_compute is None:
        return None
    c = view.compute_share
    u_c = view.util_compute
    u_o = view.util_outside_compute
    if u_o is None or c < 0.1 or 1.0 - c < 0.1 or u_c < BUSY_IN_COMPUTE or u_o > IDLE_ELSEWHERE:
        return None
    device = c * u_c + (1.0 - c) * u_o
    host = (1.0 - c) + c * (1.0 - u_c)
    saving = frac(1.0 - max(device, host))
    if saving <= 0:
        return None
    span_ratio = None
    confidence: Confidence = "low"
    if ctx.cuda is not None and ctx.cuda.timed and ctx.span.phase_ns.get(COMPUTE, 0) > 0:
        span_ratio = ctx.cuda.busy_ns / ctx.span.phase_ns[COMPUTE]
        if span_ratio >= 0.8:
            confidence = "medium"
    return Finding(
        id=ID,
        title=(
            f"The GPU stops whenever the step's compute ends: {u_c:.0%} busy during compute, "
            f"{u_o:.0%} the rest of the time"
        ),
        est_saving_fraction=saving,
        est_speedup=round(speedup_for(saving), 3),
        confidence=confidence,
        evidence={
            "compute_fraction": frac(c),
            "gpu_util_in_compute": frac(u_c),
            "gpu_util_elsewhere": frac(u_o),
            "device_busy_fraction": frac(device),
            "host_busy_fraction": frac(host),
            "device_span_over_compute": round(span_ratio, 3) if span_ratio is not None else None,
        },
        fix=(
            "Remove host-device synchronisations from the step: do not call .item(), .cpu(), print(tensor) "
            "or torch.cuda.synchronize() every step; keep running metrics on the GPU and read them every N steps."
        ),
        suggestion={},
        snippet=(
            'running = torch.zeros((), device="cuda")\n'
            "running += loss.detach()  # no sync\n"
            "if step % 50 == 0:\n"
            "    log(running.item() / 50)\n"
            "    running.zero_()"
        ),
    )
