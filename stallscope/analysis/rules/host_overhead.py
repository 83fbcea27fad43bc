"""``host.overhead``: the step is launch-bound; the GPU waits for the host to hand it kernels.

Evidence (NVML per phase): a large share of the wall time is the compute phase, yet the GPU is
busy for less than ``LAUNCH_BOUND`` of it: the host spends the phase in Python and kernel launches.

Model: inside compute the GPU idles ``c (1 - u_c)`` of the wall time. Capturing the step in CUDA
graphs (``torch.compile(mode="reduce-overhead")``) or fusing small operations removes a share
``RECOVERED`` of that (assumed; Python-side work such as the optimiser's bookkeeping remains).
"""

from __future__ import annotations

from stallscope.analysis.context import Context
from stallscope.analysis.device_model import device_view
from stallscope.analysis.finding import Finding, speedup_for
from stallscope.analysis.numbers import frac

ID = "host.overhead"

#: the compute phase counts as launch-bound below this GPU utilization
LAUNCH_BOUND = 0.5
#: share of the GPU's idle time inside compute the fix is assumed to recover
RECOVERED = 0.5


def rule(ctx: Context) -> Finding | None:
    view = device_view(ctx)
    if view is None or not view.on_cuda or view.util_compute is None:
        return None
    c, u_c = view.compute_share, view.util_compute
    if c < 0.2 or u_c >= LAUNCH_BOUND:
        return None
    idle_in_compute = c * (1.0 - u_c)
    saving = frac(RECOVERED * idle_in_compute)
    if saving <= 0:
        return None
    return Finding(
        id=ID,
        title=f"The GPU is busy only {u_c:.0%} of the compute phase: the host cannot launch kernels fast enough",
        est_saving_fraction=saving,
        est_speedup=round(speedup_for(saving), 3),
        confidence="low",
        evidence={
            "compute_fraction": frac(c),
            "gpu_util_in_compute": frac(u_c),
            "gpu_idle_in_compute_fraction": frac(idle_in_compute),
            "assumed_recovered": RECOVERED,
        },
        fix=(
            "Cut per-step host overhead: compile the model (torch.compile with mode='reduce-overhead' "
            "replays the step as CUDA graphs), fuse small operations, avoid Python loops over tensors, "
            "or give each launch more work with a larger batch."
        ),
        suggestion={},
        snippet='model = torch.compile(model, mode="reduce-overhead")',
    )
