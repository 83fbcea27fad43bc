"""``compute.batch_size``: device memory headroom allows a larger batch.

Evidence: the loader's batch size is known, and the peak device memory (torch's caching
allocator, else NVML's device-wide figure) leaves room for at least twice the batch.

Model: memory grows at most linearly with the batch, so ``m`` times the batch fits when the peak
is under ``FILL / m`` of the total (``m`` a power of two, at most 4). Per-step costs that do not grow
with the batch — host overhead while the GPU idles in compute (NVML), logging, other host work —
are spread over ``m`` times more samples: the time per sample drops by ``F (1 - 1/m)``, ``F``
their share of the wall time. Data loading, copies and the GPU's work scale with the batch.
"""

from __future__ import annotations

from stallscope.analysis.context import Context
from stallscope.analysis.device_model import device_view
from stallscope.analysis.finding import Finding, speedup_for
from stallscope.analysis.numbers import frac
from stallscope.timeline.phases import BUILTIN_PHASES, COMPUTE, LOGGING, OTHER

ID = "compute.batch_size"

#: share of device memory a larger batch may fill
FILL = 0.9
#: largest batch multiplier suggested
MAX_MULTIPLIER = 4


def rule(ctx: Context) -> Finding | None:
    if ctx.loader is None or not ctx.loader.batch_size:
        return None
    if ctx.cuda_device is not None and ctx.cuda_device.max_reserved_bytes > 0:
        peak, total = ctx.cuda_device.max_reserved_bytes, ctx.cuda_device.total_memory_bytes
        source = "torch.cuda.max_memory_reserved"
    elif (ctx.cuda is not None or ctx.cuda_device is not None) and ctx.nvml is not None:
        peak, total = ctx.nvml.mem_used_max_bytes or 0, ctx.nvml.mem_total_bytes or 0
        source = "nvml (whole device)"
    else:
        return None
    if peak <= 0 or total <= 0:
        return None
    m = 1
    while m * 2 <= MAX_MULTIPLIER and peak * m * 2 <= FILL * total:
        m *= 2
    if m < 2:
        return None
    span = ctx.span
    custom = sum(span.phase_fraction(name) for name in span.phase_ns if name not in BUILTIN_PHASES)
    fixed = span.phase_fraction(LOGGING) + span.phase_fraction(OTHER) + custom
    view = device_view(ctx)
    if view is not None and view.util_compute is not None:
        fixed += view.compute_share * (1.0 - view.util_compute)
    saving = frac(fixed * (1.0 - 1.0 / m))
    if saving <= 0:
        return None
    batch = ctx.loader.batch_size * m
    gib = 1024**3
    return Finding(
        id=ID,
        title=f"GPU memory peaked at {peak / gib:.1f} of {total / gib:.1f} GiB: a {m}x larger batch fits",
        est_saving_fraction=saving,
        est_speedup=round(speedup_for(saving), 3),
        confidence="low",
        evidence={
            "batch_size": ctx.loader.batch_size,
            "memory_peak_bytes": peak,
            "memory_total_bytes": total,
            "memory_peak_fraction": frac(peak / total),
            "memory_source": source,
            "fixed_per_step_fraction": frac(fixed),
            "compute_fraction": frac(span.phase_fraction(COMPUTE)),
        },
        fix=(
            f"Raise batch_size from {ctx.loader.batch_size} to {batch} to spread the fixed per-step cost over "
            f"more samples; scale the learning rate with it (about x{m}) and check the loss curve."
        ),
        suggestion={"batch_size": batch},
        snippet=f"DataLoader(dataset, batch_size={batch}, ...)",
    )
