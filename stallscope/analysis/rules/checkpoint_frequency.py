"""``checkpoint.frequency``: blocking checkpoint saves take a large share of the run.

The setting: save every ``K`` steps, ``K`` the round interval at which saves take the target
share. In Lightning, where the fit's length is known, ``K`` is at most the fit's steps, so it
still saves at least once. A plain loop's length is not known: it saves every ``K`` steps and once
at the end (``"at_end": true``). The prediction counts the whole saves left, and is a floor.

**The next lever, an asynchronous save** (``"async_save": true``: Lightning's
``AsyncCheckpointIO`` plugin; in a plain loop a background writer), considered when even that
leaves saves above 1.5x the target share of the fit. It is predicted from each save's split,
measured by ``signals.saves`` (``SaveSplit``):

* a save that stays keeps on the training thread what is not the write (in Lightning, building
  the checkpoint; nothing in a plain loop's phase), the copy of the state the asynchronous save
  makes first (the save's bytes times the probed cost of a copy), and the hand-off;
* the write moves to a background thread, but its CPU time still slows training: the part of a
  core the host has no room for while training runs (``no_spare_core``), and at least
  ``WRITER_SHARE`` of it (the GIL), is counted against training for each write during it;
* a save whose write cannot overlap training: in a plain loop the run's last save (the run
  waits for its write before it ends, so it costs what it costs now, written directly); in
  Lightning the save at the fit's last step, whose write Lightning waits for in its teardown,
  after the fit and its report: only its copy is in the fit.

The lever is suggested only when, so modelled, it saves more than the interval alone: never in a
plain loop whose one save left is its last. A finding with it is an estimate (the copy is probed,
the competition for cores modelled), not a floor. Where the split is not known (no
``/proc/self/io``, no torch to probe with), Lightning still gets the lever and the prediction
counts only the saves removed (a floor).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from stallscope.analysis.context import Context
from stallscope.analysis.finding import Finding, SpeedupBound, speedup_for
from stallscope.analysis.numbers import every as every_n
from stallscope.analysis.numbers import fmt_ms, ms
from stallscope.analysis.rules._frequency import (
    TARGET_SLACK,
    FrequencyEstimate,
    estimate,
    runs_every,
    steps_in_fit,
    training_time,
)
from stallscope.timeline.phases import CHECKPOINT

ID = "checkpoint.frequency"

#: what handing the copy to the background thread costs the training thread (a ``submit`` to a
#: one-thread executor: median 8 us, 90th percentile 16 us on the 2-core test host; more here,
#: for slower hosts and a busy thread to wake)
HANDOFF_S = 50e-6

#: at least this share of a background write's CPU time slows training, even with a core to
#: spare: the writer takes the GIL for its Python parts (the pickler, copies into buffers) and
#: shares the memory bus. Measured on the 2-core test host, saves every 20 steps, 3 runs: about
#: 0 for a plain ``torch.save`` into a file, about half for Lightning's ``TorchCheckpointIO``,
#: which serializes into a ``BytesIO`` first (docs/predictions.md)
WRITER_SHARE = 0.5

MB = 1e6


@dataclass(frozen=True)
class SaveSplit:
    """One save (one entry of the phase) as an asynchronous save would split it, seconds."""

    #: the write: what moves to the background thread (a plain loop's whole phase; Lightning's
    #: checkpoint IO call)
    write_s: float
    #: the training thread's CPU time in the write (the rest was waiting: fsync, disk, network)
    write_cpu_s: float
    #: the rest of the save, which stays: building the checkpoint (Lightning's ``dump_checkpoint``)
    prepare_s: float
    #: the copy of the state that the asynchronous save makes on the training thread
    copy_s: float
    #: bytes written by one save
    save_bytes: float

    @property
    def stays_s(self) -> float:
        """What one save that overlaps training still costs the training thread, before the
        competition for cores."""
        return self.prepare_s + self.copy_s + HANDOFF_S


def save_split(ctx: Context, est: FrequencyEstimate) -> SaveSplit | None:
    """The split of one save, from the saves measured over the run so far (``ctx.saves``) and the
    phase's cost per entry (``est``); None where the bytes or the copy's cost are not known."""
    saves = ctx.saves
    if saves is None or not saves.measured or est.runs_seen <= 0 or saves.wall_ns <= 0:
        return None
    assert saves.bytes is not None
    assert saves.copy_s_per_byte is not None
    write_s = min(est.each_s, saves.wall_ns / 1e9 / est.runs_seen)
    save_bytes = saves.bytes / est.runs_seen
    return SaveSplit(
        write_s=write_s,
        write_cpu_s=write_s * min(1.0, saves.cpu_ns / saves.wall_ns),
        prepare_s=est.each_s - write_s,
        copy_s=save_bytes * saves.copy_s_per_byte,
        save_bytes=save_bytes,
    )


def no_spare_core(ctx: Context) -> float:
    """How much of a core the host lacks for a background writer while training runs, in [0, 1]:
    the training process's CPU over the span (all its threads), its workers' and other
    processes' (when the host sampler saw them), plus the writer's one, against the cores the
    process may use. 0 with a whole core to spare, 1 with none."""
    span = ctx.span
    busy = span.process_cpu_ns / span.wall_ns if span.wall_ns > 0 else 0.0
    host = ctx.host_signals
    if host is not None:
        busy += host.workers_cores + (host.others_cores or 0.0)
    return min(1.0, max(0.0, busy + 1.0 - ctx.cores))


def async_cost_s(
    split: SaveSplit, runs: int, each_s: float, charge: float, *, last_waits: bool, last_after_fit: bool
) -> float:
    """What ``runs`` asynchronous saves cost the training thread, seconds: each that overlaps
    training its copy, preparation and hand-off, and ``charge`` of its write's CPU time (the part
    of a core the host cannot spare); ``last_waits``: the last one is the plain run's final save,
    which the run waits for (``each_s``, as now); ``last_after_fit``: the last one is at the
    fit's last step and its write comes after the fit (its copy only)."""
    if runs <= 0:
        return 0.0
    overlapped = runs - (1 if last_waits or last_after_fit else 0)
    cost = overlapped * (split.stays_s + charge * split.write_cpu_s)
    if last_waits:
        cost += each_s
    elif last_after_fit:
        cost += split.stays_s
    return cost


def _runs(before: int, steps: int, k: int, *, at_end: bool) -> int:
    """Saves among the steps with ``if step % k == 0`` (and one at the end, ``at_end``, unless the
    last step already saved)."""
    runs = runs_every(before, steps, k)
    if at_end and (before + steps) % k:
        runs += 1
    return runs


def write_cpu_counted(ctx: Context) -> float:
    """Share of a background write's CPU time counted against training: what the host cannot
    spare of a core, and at least ``WRITER_SHARE``."""
    return max(WRITER_SHARE, no_spare_core(ctx))


def _split_evidence(split: SaveSplit, charge: float, ctx: Context) -> dict[str, float]:
    assert ctx.saves is not None
    assert ctx.saves.copy_s_per_byte is not None
    return {
        "save_mb": round(split.save_bytes / MB, 2),
        "write_ms": ms(split.write_s),
        "write_cpu_ms": ms(split.write_cpu_s),
        "prepare_ms": ms(split.prepare_s),
        "copy_ms": ms(split.copy_s),
        "copy_ms_per_mb": round(ctx.saves.copy_s_per_byte * MB * 1e3, 3),
        "write_cpu_counted": round(charge, 3),
    }


def _split_text(split: SaveSplit, each_s: float, charge: float, *, lightning: bool, overlapped: bool) -> str:
    """How one save splits, in words, for the fix."""
    where = "that thread" if lightning else "the background thread"
    text = (
        f" Of each {fmt_ms(each_s)} save, the write ({fmt_ms(split.write_s)}, {fmt_ms(split.write_cpu_s)} of it CPU)"
        f" moves to {where}; the copy of its {split.save_bytes / MB:.1f} MB of state ({fmt_ms(split.copy_s)},"
        " timed here)"
    )
    if split.prepare_s >= 1e-4:
        text += f" and building the checkpoint ({fmt_ms(split.prepare_s)})"
    text += " stay on the training thread."
    if overlapped and split.write_cpu_s > 0:
        text += (
            f" A write during training still slows it: the prediction counts {charge:.0%} of its CPU time"
            " against training (the writer competes for the GIL"
            + (" and for the cores, which the host has few to spare)." if charge > WRITER_SHARE else ").")
        )
    return text


def rule(ctx: Context) -> Finding | None:
    target = ctx.config.checkpoint_target_share
    est = estimate(ctx, CHECKPOINT, target)
    if est is None:
        return None
    lightning = ctx.config.framework == "lightning"
    # a fit whose Trainer has no ModelCheckpoint saves by the user's own trainer.save_checkpoint
    # calls: no Trainer argument changes them, so the advice is the plain loop's, in the fit's words
    own_saves = lightning and ctx.shape is not None and ctx.shape.model_checkpoints == 0
    if own_saves:
        lightning = False
    total = steps_in_fit(ctx)
    k = est.interval
    capped = total is not None and k > total
    if capped and total is not None:
        k = total  # once per fit, at its last step
    at_end = not lightning
    before, steps = ctx.steps_before, ctx.span.steps
    # the save at the end is in the run's prediction; an epoch's counts its own saves
    last_waits = at_end and ctx.run_span is None
    runs_after = _runs(before, steps, k, at_end=last_waits)
    # the fit the decision is about: the known one, else the run as observed so far
    fit_steps = total if total is not None else (ctx.run_span or ctx.span).steps
    fit_runs = _runs(0, fit_steps, k, at_end=at_end)
    lever = (capped or k > fit_steps) and est.share_for(fit_steps, fit_runs) > target * TARGET_SLACK
    if ctx.saves is not None and ctx.saves.already_async:
        lever = False  # the saves are asynchronous already
    saving = est.saving_for(runs_after)
    split = save_split(ctx, est)
    charge = write_cpu_counted(ctx)
    async_save = False
    bound: SpeedupBound = "lower"  # the interval only removes saves
    ends_fit = total is not None and total % k == 0  # the fit's last save is at its last step
    if lever and split is not None:
        # decided over the whole fit, so that an epoch's finding and the run's agree
        whole = async_cost_s(split, fit_runs, est.each_s, charge, last_waits=at_end, last_after_fit=ends_fit)
        async_save = whole < fit_runs * est.each_s
        if async_save and runs_after:
            last_after_fit = ends_fit and total is not None and before + steps >= total
            cost = async_cost_s(
                split, runs_after, est.each_s, charge, last_waits=last_waits, last_after_fit=last_after_fit
            )
            saving, bound = est.saving_for(runs_after, cost / runs_after), "estimate"  # probed and modelled
    elif lever and lightning:
        async_save = True  # the split is not known: the saves removed alone, a floor
    if saving <= 0:
        return None
    # the loop kind's own word (SPEC §3): ModelCheckpoint's argument in Lightning
    suggestion: dict[str, Any] = {"every_n_train_steps" if lightning else "every_n_steps": k}
    if at_end:
        suggestion["at_end"] = True
    if async_save:
        suggestion["async_save"] = True
    every = f"every {k} steps (about every {training_time(k * est.step_without_s)} of training)"
    if lightning:
        fix = f"Save checkpoints {every} instead of {every_n(est.interval_now, 'step')}"
        if capped:
            fix += f": once in this fit of {total} steps (the round interval, {est.interval}, is longer than the fit)"
        snippet = f"ModelCheckpoint(every_n_train_steps={k})"
        if async_save:
            fix += ", and asynchronously: Trainer(plugins=[AsyncCheckpointIO()]) writes in a background thread"
            snippet += "\nTrainer(plugins=[AsyncCheckpointIO()])  # from lightning.pytorch.plugins.io"
        fix += "."
    else:
        fix = f"Save a checkpoint {every} and once at the end, instead of {every_n(est.interval_now, 'step')}."
        observed = (ctx.run_span or ctx.span).steps
        if k > observed:
            fix += (
                f" The {observed} steps seen so far are fewer than {k}: a run this long would save once, at the end,"
                " and the prediction counts that one save."
            )
        snippet = f"if step % {k} == 0 or step == last_step:\n    save(state, path)"
        if own_saves:
            fix += (
                " The saves are not a ModelCheckpoint's (the Trainer has none): they are this fit's own"
                " trainer.save_checkpoint calls, so change where they are made (trainer.global_step counts"
                " optimizer steps: with accumulate_grad_batches, divide the interval by it)."
            )
            snippet = (
                f"if trainer.global_step % {k} == 0:  # where the fit saves now\n"
                "    trainer.save_checkpoint(path)\n"
                "# and once in on_train_end: trainer.save_checkpoint(path)"
            )
            if async_save:
                fix += " And asynchronously: Trainer(plugins=[AsyncCheckpointIO()]) writes them in a background thread."
                snippet += "\nTrainer(plugins=[AsyncCheckpointIO()])  # from lightning.pytorch.plugins.io"
        elif async_save:
            fix += " Write the other saves in the background (a thread that saves a copy of the state)."
            snippet = (
                f"if step == last_step:\n    writer.shutdown(wait=True)\n    save(state, path)\n"
                f"elif step % {k} == 0:\n"
                "    writer.submit(torch.save, copy_of(state), path)  # a one-thread ThreadPoolExecutor"
            )
    if async_save and split is not None:
        overlapped = fit_runs > (1 if at_end or ends_fit else 0)
        fix += _split_text(split, est.each_s, charge, lightning=lightning, overlapped=overlapped)
        if lightning:
            fix += (
                f" Lightning waits for the last write ({fmt_ms(split.write_s)}) in its teardown, after the fit:"
                " the prediction leaves that wait out."
            )
        else:
            fix += " The last save is written directly: the run waits for it anyway."
    elif async_save:
        fix += " The prediction counts only the saves removed: how a save splits into copy and write was not measured."
    elif lever and not (ctx.saves is not None and ctx.saves.already_async):
        fix += _no_async_text(split, est.each_s, lightning=lightning)
    evidence: dict[str, Any] = {
        **est.evidence(),
        "saves_after": runs_after,
        "fit_steps": fit_steps,
        "saves_in_fit_after": fit_runs,
    }
    if split is not None:
        evidence.update(_split_evidence(split, charge, ctx))
    return Finding(
        id=ID,
        title=f"Checkpoint saves block training {est.share_now:.0%} of the time ({est.each_s * 1e3:.0f} ms each)",
        est_saving_fraction=saving,
        est_speedup=round(speedup_for(saving), 3),
        confidence="high",
        evidence=evidence,
        fix=fix,
        suggestion=suggestion,
        snippet=snippet,
        est_speedup_bound=bound,
    )


def _no_async_text(split: SaveSplit | None, each_s: float, *, lightning: bool) -> str:
    """Why the suggestion does not save asynchronously, though the saves left are above the
    target share."""
    if not lightning:
        text = (
            " Saving in the background would not shorten this run: the one save left is its last, and the run"
            " must wait for its write before it ends."
        )
        if split is not None:
            text += (
                f" (A background save would also copy its {split.save_bytes / MB:.1f} MB of state first,"
                f" {fmt_ms(split.copy_s)}.)"
            )
        return text
    if split is None:
        return ""
    return (
        f" Saving asynchronously would not help: copying the {split.save_bytes / MB:.1f} MB of state for the"
        f" background thread ({fmt_ms(split.copy_s)}) and building the checkpoint ({fmt_ms(split.prepare_s)}) would"
        f" take about as long as the {fmt_ms(each_s)} save."
    )
