"""``data.io_bound``: the loader's processes wait on storage, not on the CPU.

Evidence: the loop is starved for data while the processes making batches spend under
``WAITING`` of their time on a CPU (per worker from the host sampler, or per in-process
``next()`` from the timeline), also counting the time they were runnable and waited for a core
where that was read (``worker_cpu.demand``), and the cores are not saturated.

Model: with the waiting removed (data cached locally or in memory, read in larger sequential
chunks), a batch costs only its CPU time. More workers hide latency too, and that cheaper fix is
``data.workers``'s; so the saving here is the loop model's step time at the worker count
``data.workers`` would reach (up to ``io_workers_per_core`` per core) minus the step time with
the waiting gone at that count: what faster storage buys beyond more workers. It is capped by
the time the GPU sat idle while the loop waited.
"""

from __future__ import annotations

from dataclasses import replace

from stallscope.analysis.context import Context
from stallscope.analysis.device_model import cap_by_device_idle
from stallscope.analysis.finding import Finding, speedup_for
from stallscope.analysis.loop_model import batches_may_be_ready
from stallscope.analysis.numbers import count, fmt_ms, frac, ms
from stallscope.analysis.worker_cpu import SATURATED

ID = "data.io_bound"

#: loading counts as waiting below this share of its time on a CPU
WAITING = 0.5


def rule(ctx: Context) -> Finding | None:
    got = ctx.refined_model
    if got is None or ctx.span.wall_s <= 0:
        return None
    model, cpu = got
    # CPU work preempted by other processes waits too, but for a core, not for storage
    if not model.starved or cpu.busy >= WAITING or cpu.demand >= WAITING or batches_may_be_ready(ctx, model):
        return None
    if cpu.cores_busy is not None and cpu.cores_busy >= SATURATED:
        return None
    # waiting workers cost little CPU, so more of them hide latency: that is data.workers' advice;
    # this finding is what faster storage buys beyond it
    cap = min(64, ctx.cores * ctx.config.io_workers_per_core)
    workers = max(model.workers, model.best_workers(cap))
    faster = replace(model, load_s=model.load_cpu_s)
    now = model.predict_step_s(workers)
    after = faster.predict_step_s(workers)
    saving = frac(cap_by_device_idle(model.steps * (now - after) / ctx.span.wall_s, ctx))
    if saving <= 0:
        return None
    host = ctx.host_signals
    rate = host.disk_read_bytes_per_s if host is not None else None
    who = f"the {count(model.workers, 'worker')}" if model.workers else "the training process"
    spend = "spend" if model.workers > 1 else "spends"
    return Finding(
        id=ID,
        title=(
            f"Loading waits on storage: {who} {spend} only {cpu.busy:.0%} of the time on a CPU while "
            f"training waits {fmt_ms(model.measured_wait_s)} per step"
        ),
        est_saving_fraction=saving,
        est_speedup=round(speedup_for(saving), 3),
        confidence="medium",
        evidence={
            "num_workers": model.workers,
            "loading_cpu_share": frac(cpu.busy),
            "cpu_measured_in": cpu.source,
            "cpu_busy_fraction": frac(cpu.cores_busy) if cpu.cores_busy is not None else None,
            "load_per_batch_ms": ms(model.load_s),
            "load_cpu_per_batch_ms": ms(model.load_cpu_s),
            "wait_per_step_ms": ms(model.measured_wait_s),
            "disk_read_mb_per_s": round(rate / 1e6, 2) if rate is not None else None,
            "workers_assumed": workers,
            "predicted_step_ms": ms(after),
            "gpu_util_during_data": frac(ctx.nvml.util_by_phase["data"])
            if ctx.nvml is not None and "data" in ctx.nvml.util_by_phase
            else None,
        },
        fix=(
            "Batches wait on reads, not on the CPU: copy the dataset to local SSD or RAM, or store it in "
            "large sequential shards (tar/WebDataset, LMDB) instead of many small files. The prediction is "
            f"for reads that no longer wait, with {count(workers, 'worker')}"
            + (
                f" (now {model.workers}: waiting workers cost little CPU, so more of them hide the reads meanwhile)"
                if workers > model.workers
                else ""
            )
            + "."
        ),
        suggestion={},
        snippet=f"DataLoader(dataset, num_workers={workers})  # the dataset on local SSD or in RAM",
    )
