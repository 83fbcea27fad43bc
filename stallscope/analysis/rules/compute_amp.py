"""``compute.amp``: device-bound in float32; mixed precision (or TF32) would speed the compute up.

Evidence: torch runs on CUDA, the GPU is busy most of the wall time (``DEVICE_BOUND``) and during
compute (NVML per phase, when it can tell), the training precision is not already mixed (Lightning
says so; a plain loop cannot be seen using autocast, hence low confidence there) and the GPU has
tensor cores (compute capability 7.0 or later).

Model: the device's work in the compute phase, ``c u_c`` of the wall time (the CUDA-event busy
share when NVML cannot tell), runs ``AMP_SPEEDUP`` times faster (assumed for models that mix
matrix math with memory-bound work); the loop being device-bound, the wall time shrinks by the
difference. A model that is all matrix math gains far more (an 8192-wide float32 MLP ran 7.7 to
10.7x faster in bf16 on an H100): the fix text says so.
"""

from __future__ import annotations

from stallscope.analysis.context import Context
from stallscope.analysis.device_model import device_view
from stallscope.analysis.finding import Finding, speedup_for
from stallscope.analysis.numbers import frac

ID = "compute.amp"

#: the GPU counts as the bottleneck above this busy share of the wall time
DEVICE_BOUND = 0.6
#: assumed speedup of the device's compute work under mixed precision
AMP_SPEEDUP = 1.6


def _mixed(precision: str | None) -> bool | None:
    if precision is None:
        return None
    return "16" in precision or "mixed" in precision or "8" in precision


def rule(ctx: Context) -> Finding | None:
    view = device_view(ctx)
    if view is None or not view.on_cuda or view.busy < DEVICE_BOUND:
        return None
    if _mixed(ctx.precision):
        return None
    cap = ctx.cuda_device.capability if ctx.cuda_device is not None else None
    if cap is not None and cap < (7, 0):
        return None  # no tensor cores: mixed precision gains little
    if view.util_compute is not None:
        if view.util_compute < 0.8:
            return None
        device_compute = view.compute_share * view.util_compute
    else:
        device_compute = min(view.busy, view.compute_share)
    saving = frac(device_compute * (1.0 - 1.0 / AMP_SPEEDUP))
    if saving <= 0:
        return None
    bf16 = cap is None or cap >= (8, 0)
    precision = "bf16-mixed" if bf16 else "16-mixed"
    dtype = "torch.bfloat16" if bf16 else "torch.float16"
    tf32_hint = ""
    if ctx.cuda_device is not None and cap is not None and cap >= (8, 0) and not ctx.cuda_device.tf32_matmul:
        tf32_hint = ' At least allow TF32 matmuls: torch.set_float32_matmul_precision("high").'
    scope = f" The estimate takes the compute {AMP_SPEEDUP}x faster; a model that is mostly matrix math gains more."
    if ctx.config.framework == "lightning":
        fix = f'Train in mixed precision: Trainer(precision="{precision}").{tf32_hint}{scope}'
        snippet = f'Trainer(precision="{precision}")'
    else:
        fix = f"If the step does not use autocast yet, run the forward pass and loss in {dtype}.{tf32_hint}{scope}"
        snippet = f'with torch.autocast("cuda", dtype={dtype}):\n    loss = loss_fn(model(x), y)'
        if not bf16:
            snippet += "\n# with float16, scale the loss: torch.amp.GradScaler()"
    return Finding(
        id=ID,
        title=f"The GPU is the bottleneck ({view.busy:.0%} busy) and computes in float32",
        est_saving_fraction=saving,
        est_speedup=round(speedup_for(saving), 3),
        confidence="medium" if ctx.precision is not None else "low",
        evidence={
            "device_busy_fraction": frac(view.busy),
            "busy_source": view.source,
            "compute_fraction": frac(view.compute_share),
            "gpu_util_in_compute": frac(view.util_compute) if view.util_compute is not None else None,
            "precision": ctx.precision,
            "compute_capability": ".".join(map(str, cap)) if cap is not None else None,
            "tf32_matmul": ctx.cuda_device.tf32_matmul if ctx.cuda_device is not None else None,
            "assumed_amp_speedup": AMP_SPEEDUP,
        },
        fix=fix,
        suggestion={"precision": precision},
        snippet=snippet,
    )
