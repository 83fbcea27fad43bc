"""``dist.dataparallel``: ``nn.DataParallel`` drives several GPUs from one process; DDP is the fix.

``DataParallel`` runs one Python process for all its GPUs: every step it loads the whole batch,
scatters it, copies the model to each GPU, runs the replicas in threads that share one
interpreter, and gathers the outputs on the first GPU. ``DistributedDataParallel`` runs one
process per GPU, each loading and driving only its share.

Model, per step, with ``n`` GPUs: the host's work outside compute (data, h2d, logging, ...) is
done once for all GPUs and would be split ``n`` ways; inside compute, the time the first GPU was
idle (CUDA events: the phase's wall time less the device's busy time) is the single process's
scatter, replicate and gather, which each DDP rank would do for its share only. The device's busy
time stays. Without CUDA events compute counts as all busy, so the prediction then only counts
the host's work outside compute. DDP adds a gradient all-reduce that this does not count:
confidence is low.
"""

from __future__ import annotations

from stallscope.analysis.context import Context
from stallscope.analysis.finding import Finding, speedup_for
from stallscope.analysis.numbers import frac
from stallscope.timeline.phases import COMPUTE

ID = "dist.dataparallel"


def rule(ctx: Context) -> Finding | None:
    n = ctx.data_parallel_devices
    span = ctx.span
    if n is None or n < 2 or span.wall_ns <= 0 or span.steps <= 0:
        return None
    compute = max(0, span.phase_ns.get(COMPUTE, 0))
    outside = max(0, span.wall_ns - compute)
    busy = compute
    if ctx.cuda is not None and ctx.cuda.timed:
        busy = min(compute, max(0, ctx.cuda.busy_ns))
    idle_in_compute = compute - busy
    predicted = busy + (outside + idle_in_compute) / n
    saving = frac(1.0 - predicted / span.wall_ns)
    if saving <= 0:
        return None
    launch = "torchrun --nproc-per-node " + str(n) + " train.py"
    return Finding(
        id=ID,
        title=f"nn.DataParallel drives {n} GPUs from one process",
        est_saving_fraction=saving,
        est_speedup=round(speedup_for(saving), 3),
        confidence="low",
        evidence={
            "devices": n,
            "outside_compute_fraction": frac(outside / span.wall_ns),
            "gpu_idle_in_compute_fraction": frac(idle_in_compute / span.wall_ns),
            "cuda_events": ctx.cuda is not None and ctx.cuda.timed,
        },
        fix=(
            f"Replace nn.DataParallel by DistributedDataParallel, one process per GPU ({launch}; "
            'Lightning: strategy="ddp"), so each GPU has its own process to load and drive its share.'
        ),
        suggestion={"strategy": "ddp", "devices": n},
        snippet=(
            "torch.distributed.init_process_group('nccl')\n"
            "model = DistributedDataParallel(model.to(local_rank), device_ids=[local_rank])"
        ),
    )
