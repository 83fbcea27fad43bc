"""``data.persistent_workers``: worker processes are re-spawned every epoch.

Each pass over a DataLoader without ``persistent_workers`` starts its workers in ``iter()``,
waits for their first batch, and shuts them down at the end. With persistent workers the second
and later passes only wait for one batch. The saving per re-spawn is the measured start-up and
tear-down minus the time to make one batch; the first pass is never counted (its spawn stays).

Lightning's validation loader does the same at every validation run: its set-up and worker
start-up (``Context.val_starts``: from the start of the run to ``on_validation_start``) are
measured apart. The saving is that start-up for each run in the span but the fit's first (a
floor: the first batch's wait and the shutdown go too, uncounted). Where it saves more than the
train loader's re-spawns, the finding is about the validation loader (``"loader": "val"``).
"""

from __future__ import annotations

from stallscope.analysis.context import Context
from stallscope.analysis.finding import Finding, speedup_for
from stallscope.analysis.numbers import count, frac, ms
from stallscope.timeline.phases import VALIDATION

ID = "data.persistent_workers"


def rule(ctx: Context) -> Finding | None:
    train, val = _train_finding(ctx), _val_finding(ctx)
    if train is None or val is None:
        return train or val
    return train if train.est_saving_fraction >= val.est_saving_fraction else val


def _val_finding(ctx: Context) -> Finding | None:
    """Lightning's validation loader, re-spawning its workers at every validation run."""
    loader, starts = ctx.val_loader, ctx.val_starts
    if loader is None or loader.num_workers == 0 or loader.persistent_workers or starts is None:
        return None
    runs = ctx.span.phase_counts.get(VALIDATION, 0)
    respawns = runs - (1 if ctx.steps_before == 0 else 0)  # the fit's first run keeps its spawn
    if respawns <= 0 or ctx.span.wall_ns <= 0:
        return None
    saving = frac(respawns * starts.each_s / ctx.span.wall_s)
    if saving <= 0:
        return None
    n = loader.num_workers
    fix = (
        f"Set persistent_workers=True on the validation DataLoader so {_its_workers(n)} each validation run"
        f" (now {n} worker{'s' if n != 1 else ''} start{'' if n != 1 else 's'} at every run,"
        f" {starts.each_s * 1e3:.0f} ms each time)."
    )
    if n > ctx.cores:
        fix += (
            f" Or give it fewer workers: {n} on {count(ctx.cores, 'usable core')} start up and compete for "
            f"{'it' if ctx.cores == 1 else 'them'}."
        )
    return Finding(
        id=ID,
        title=f"The validation loader's workers are started at every validation run, {starts.each_s:.2f} s each time",
        est_saving_fraction=saving,
        est_speedup=round(speedup_for(saving), 3),
        confidence="high",
        evidence={
            "loader": "val",
            "num_workers": n,
            "respawns": respawns,
            "startup_per_run_ms": ms(starts.each_s),
            "runs_measured": starts.runs,
            "usable_cores": ctx.cores,
        },
        fix=fix,
        suggestion={"persistent_workers": True, "loader": "val"},
        snippet=f"def val_dataloader(self):\n    return DataLoader(dataset, num_workers={n}, persistent_workers=True)",
        est_speedup_bound="lower",  # the fix only removes the start-ups
    )


def _train_finding(ctx: Context) -> Finding | None:
    loader = ctx.loader
    if loader is None or loader.num_workers == 0 or loader.persistent_workers:
        return None
    respawns = [b for b in ctx.span.boundaries if b.index >= 1]
    if not respawns or ctx.span.wall_ns <= 0:
        return None
    model = ctx.loop_model
    # time to make one batch: with persistent workers the first batch of a pass still costs this
    one_batch_ns = int((model.load_s + model.transfer_s) * 1e9) if model is not None else 0
    excess = [max(0, b.iter_ns + b.first_wait_ns + b.last_wait_ns - one_batch_ns) for b in respawns]
    saving = frac(sum(excess) / ctx.span.wall_ns)
    if saving <= 0:
        return None
    per_epoch_s = sum(excess) / len(excess) / 1e9
    lightning = ctx.config.framework == "lightning"
    where = "the train DataLoader" if lightning else "the DataLoader"
    return Finding(
        id=ID,
        title=f"Workers are re-spawned every epoch, {per_epoch_s:.2f} s each time",
        est_saving_fraction=saving,
        est_speedup=round(speedup_for(saving), 3),
        confidence="high",
        evidence={
            "num_workers": loader.num_workers,
            "respawns": len(respawns),
            "startup_per_epoch_ms": ms(per_epoch_s),
            "iter_ms": ms(sum(b.iter_ns for b in respawns) / len(respawns) / 1e9),
            "first_batch_ms": ms(sum(b.first_wait_ns for b in respawns) / len(respawns) / 1e9),
            "shutdown_ms": ms(sum(b.last_wait_ns for b in respawns) / len(respawns) / 1e9),
            "one_batch_ms": ms(one_batch_ns / 1e9),
        },
        fix=f"Set persistent_workers=True on {where} so {_its_workers(loader.num_workers)} the epoch.",
        suggestion={"persistent_workers": True},
        snippet=f"DataLoader(dataset, num_workers={loader.num_workers}, persistent_workers=True)",
        est_speedup_bound="lower",  # the fix only removes the re-spawns
    )


def _its_workers(n: int) -> str:
    return "its worker outlives" if n == 1 else f"its {n} workers outlive"
