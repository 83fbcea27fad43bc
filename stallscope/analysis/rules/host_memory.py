"""``host.memory``: host memory is close to its limit and tasks stall on it.

Evidence (host sampler): the least memory still available to the process tree (the machine's
available memory, capped by the cgroup limit minus its working set), and the time tasks stalled
waiting for memory (Linux pressure stall information, "some" tasks stalled).

Model: the stall time is time training did not run; freeing memory recovers it. Memory close to
the limit without stalls costs no time yet but risks the process being killed; the session adds
a note for that (``memory_risk_note``), since a finding ranks by the time it saves.
"""

from __future__ import annotations

from stallscope.analysis.context import Context
from stallscope.analysis.finding import Finding, speedup_for
from stallscope.analysis.numbers import frac

ID = "host.memory"


def rule(ctx: Context) -> Finding | None:
    host = ctx.host_signals
    if host is None or host.wall_s <= 0 or host.mem_stall_some_s is None:
        return None
    saving = frac(host.mem_stall_some_s / host.wall_s)
    if saving <= 0:
        return None
    used = host.mem_used_fraction
    gib = 1024**3
    limit = f" of {host.mem_limit_bytes / gib:.1f} GiB" if host.mem_limit_bytes else ""
    workers = ctx.loader.num_workers if ctx.loader is not None else 0
    return Finding(
        id=ID,
        title=(
            f"Tasks stalled waiting for memory {saving:.0%} of the time"
            + (f" (up to {used:.0%}{limit} in use)" if used is not None else "")
        ),
        est_saving_fraction=saving,
        est_speedup=round(speedup_for(saving), 3),
        confidence="low",
        evidence={
            "memory_stall_fraction": saving,
            "memory_full_stall_fraction": frac(host.mem_stall_full_s / host.wall_s)
            if host.mem_stall_full_s is not None
            else None,
            "mem_used_max_fraction": frac(used) if used is not None else None,
            "mem_available_min_bytes": host.mem_available_min_bytes,
            "mem_limit_bytes": host.mem_limit_bytes,
            "rss_max_bytes": host.rss_max_bytes,
            "num_workers": workers,
        },
        fix=(
            "Use less host memory: fewer DataLoader workers or a lower prefetch_factor (each worker holds "
            "prefetch_factor batches), keep the dataset in numpy arrays or tensors rather than Python lists "
            "and dicts (forked workers copy those as they touch them), or raise the memory limit."
        ),
        suggestion={},
        snippet="DataLoader(dataset, num_workers=..., prefetch_factor=1)",
    )
