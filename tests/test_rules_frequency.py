"""The three frequency rules as users read them: SPEC suggestion keys, wording per framework,
settings that fit the run (never off for a whole fit), whole runs counted, floors."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from signal_fakes import cuda_device, host

from stallscope.analysis.context import AnalysisConfig, Context, RunShape
from stallscope.analysis.rules import checkpoint_frequency, logging_frequency, validation_frequency
from stallscope.analysis.rules._frequency import after_run_s, epoch_pieces, runs_every
from stallscope.analysis.rules.validation_frequency import lightning_runs, plain_runs
from stallscope.signals.calls import CallSummary
from stallscope.signals.saves import SaveSummary
from stallscope.timeline.phases import BUILTIN_PHASES
from stallscope.timeline.stats import Distribution, RecentSteps, SpanStats

MS = 1_000_000


def _span(
    *, steps: int, epochs: int, phase: str, count: int, each_ms: float, step_ms: float = 2, waits: bool = False
) -> SpanStats:
    """``steps`` steps of ``step_ms`` of CPU work, and ``count`` runs of ``phase``: CPU work too,
    or, ``waits``, the process idle in them (a sleep, a socket)."""
    total = int(count * each_ms * MS)
    train = int(steps * step_ms * MS)
    return SpanStats(
        wall_ns=train + total,
        steps=steps,
        epochs=epochs,
        step_total_ns=train,
        phase_ns={"data": 0, "compute": train, phase: total, "other": 0},
        phase_counts={"data": steps, "compute": steps, phase: count},
        step=Distribution.of([int(step_ms * MS)] * steps),
        data_wait=Distribution.of([0] * steps),
        data_cpu_ns=0,
        process_cpu_ns=train + (0 if waits else total),
    )


def _ctx(span: SpanStats, framework: str = "plain", batches: int | None = None, **extra: Any) -> Context:
    return Context(
        span=span,
        loader=None,
        cores=2,
        config=AnalysisConfig(framework=framework),  # type: ignore[arg-type]
        batches_per_epoch=batches,
        **extra,
    )


# -- counting whole runs ---------------------------------------------------------------------


def test_runs_every_counts_the_multiples_in_a_stretch_of_steps() -> None:
    assert runs_every(0, 400, 2000) == 0
    assert runs_every(0, 400, 400) == 1
    assert runs_every(95, 10, 50) == 1  # step 100
    assert runs_every(101, 48, 50) == 0  # steps 102..149


def test_epoch_pieces_cut_a_span_at_epoch_ends() -> None:
    assert epoch_pieces(70, 100, 80) == [(0, 70, 10), (1, 0, 80), (2, 0, 10)]


def test_lightning_validates_at_multiples_of_an_int_interval_and_not_again_at_the_epochs_end() -> None:
    # val_check_interval=30 in 80-batch epochs: batches 30 and 60 of each epoch, not 80
    assert lightning_runs(0, 160, per_epoch=80, interval=30, every_n_epochs=1) == 4
    # 1.0: after each epoch's last batch; on every 2nd epoch only
    assert lightning_runs(0, 240, per_epoch=80, interval=1.0, every_n_epochs=2) == 1
    # check_val_every_n_epoch=None: an int interval counts batches across epochs
    assert lightning_runs(0, 160, per_epoch=80, interval=50, every_n_epochs=None) == 3


def test_plain_every_n_epochs_counts_the_run_after_the_last_epoch() -> None:
    # 2 epochs of 80, every 13 epochs and after the last: only the run after epoch 1
    assert plain_runs(0, 160, per_epoch=80, every_n_steps=None, every_n_epochs=13) == 1
    # every 2 epochs over 4 epochs: after epochs 1 and 3, the last already validates
    assert plain_runs(0, 320, per_epoch=80, every_n_steps=None, every_n_epochs=2) == 2


# -- validation ------------------------------------------------------------------------------


def test_a_one_epoch_lightning_fit_keeps_its_validation_and_limits_its_batches() -> None:
    """80 batches of 2 ms, validating every 5 (16 runs of 100 ms), max_epochs=1. The target needs
    1000 batches between runs, more than the fit: once per fit (val_check_interval=1.0), and
    even that one run is 38% of the fit, so also a part of the validation set."""
    span = _span(steps=80, epochs=1, phase="validation", count=16, each_ms=100)
    shape = RunShape(max_epochs=1, batches_per_epoch=80, val_check_interval=5)
    finding = validation_frequency.rule(_ctx(span, "lightning", batches=80, shape=shape))
    assert finding is not None
    # 5% of 160 ms of training / 0.95 = 8.4 ms of validation allowed: 8.4% of a run -> 5%
    assert finding.suggestion == {"val_check_interval": 1.0, "limit_val_batches": 0.05}
    assert "check_val_every_n_epoch" not in finding.suggestion  # 25 epochs would never validate
    assert finding.evidence["runs_in_fit_after"] == 1
    # one run of 5 ms instead of 16 of 100 ms, out of 1760 ms
    assert finding.est_saving_fraction == pytest.approx((1600 - 5) / 1760, abs=1e-4)
    assert finding.est_speedup_bound == "estimate"  # a run's fixed costs do not shrink with its batches
    assert "limit_val_batches" in finding.fix


def test_a_two_epoch_fit_is_told_every_two_epochs_at_most() -> None:
    """Once per epoch for 100 ms in 2 epochs of 80 x 2 ms: the target needs 13 epochs; the fit has 2."""
    span = _span(steps=160, epochs=2, phase="validation", count=2, each_ms=100)
    shape = RunShape(max_epochs=2, batches_per_epoch=80)
    finding = validation_frequency.rule(_ctx(span, "lightning", batches=80, shape=shape))
    assert finding is not None
    assert finding.suggestion["val_check_interval"] == 1.0
    assert finding.suggestion["check_val_every_n_epoch"] == 2
    assert finding.evidence["runs_after"] == 1
    assert "Trainer(val_check_interval=1.0, check_val_every_n_epoch=2" in finding.snippet


def test_a_fit_shorter_than_an_epoch_validates_at_its_last_batch() -> None:
    """max_steps=30 of an 80-batch epoch: val_check_interval=1.0 would never come; 30 does."""
    span = _span(steps=30, epochs=1, phase="validation", count=6, each_ms=100)
    shape = RunShape(max_steps=30, batches_per_epoch=80, val_check_interval=5)
    finding = validation_frequency.rule(_ctx(span, "lightning", batches=80, shape=shape))
    assert finding is not None
    assert finding.suggestion["val_check_interval"] == 30
    assert finding.evidence["runs_in_fit_after"] == 1


def test_early_stopping_counts_validation_runs_and_the_fix_says_so() -> None:
    """The two-epoch fit above with an EarlyStopping: validating less often lets more steps pass
    before it stops the fit, so the finding says so and is less sure of when the fit ends."""
    span = _span(steps=160, epochs=2, phase="validation", count=2, each_ms=100)
    shape = RunShape(max_epochs=2, batches_per_epoch=80, early_stopping_patience=3)
    finding = validation_frequency.rule(_ctx(span, "lightning", batches=80, shape=shape))
    assert finding is not None
    assert finding.suggestion["check_val_every_n_epoch"] == 2
    assert "EarlyStopping(patience=3) counts validation runs" in finding.fix
    assert finding.confidence == "medium"


def test_validation_every_few_batches_suggests_a_batch_interval() -> None:
    """Every 5 of 400 batches, 20 ms each, 2 ms steps: >= 20 / (0.05 x 2) = 200 batches."""
    span = _span(steps=400, epochs=1, phase="validation", count=80, each_ms=20)
    finding = validation_frequency.rule(_ctx(span, batches=400, epoch_steps=400))
    assert finding is not None
    assert finding.suggestion == {"every_n_steps": 200}
    assert finding.est_speedup_bound == "lower"
    assert finding.evidence["runs_after"] == 2


def test_plain_loops_get_plain_words_and_a_run_after_the_last_epoch() -> None:
    """Once per epoch (80 batches x 2 ms) for 100 ms, 2 epochs: 13 epochs needed, 2 seen."""
    span = _span(steps=160, epochs=2, phase="validation", count=2, each_ms=100)
    finding = validation_frequency.rule(_ctx(span, batches=80, epoch_steps=80))
    assert finding is not None
    assert finding.suggestion == {"every_n_epochs": 13, "at_end": True, "val_fraction": 0.1}
    assert "or epoch + 1 == epochs" in finding.snippet
    for lightning_word in ("Trainer", "val_check_interval", "check_val_every_n_epoch", "limit_val_batches"):
        assert lightning_word not in finding.fix
        assert lightning_word not in finding.snippet
    assert "every 13 epochs" in finding.fix
    assert "validate once, after its last epoch" in finding.fix
    assert finding.evidence["runs_in_fit_after"] == 1


def test_a_plain_epoch_is_the_steps_that_ran_not_the_loaders_length() -> None:
    """A loop that breaks after 51 of 311 batches: 51 x 2 ms epochs, 30 ms validations. The
    target needs 300 steps: 6 epochs of 51 (311-batch epochs would have made it 1)."""
    span = _span(steps=51, epochs=1, phase="validation", count=1, each_ms=30)
    finding = validation_frequency.rule(_ctx(span, batches=311, epoch_steps=51))
    assert finding is not None
    assert finding.suggestion["every_n_epochs"] == 6
    assert finding.evidence["batches_per_epoch"] == 51


def test_epochs_and_the_run_agree_when_the_cost_wobbles_across_a_round_value() -> None:
    """311-step epochs of 100 ms, validation 9.995 s then 10.005 s: the target (5%) needs 1999
    then 2001 steps, which used to round to 2000 and 5000 steps, 7 and 17 epochs."""
    epochs = [
        _span(steps=311, epochs=1, phase="validation", count=1, each_ms=each, step_ms=100) for each in (9995, 10005)
    ]
    run = _span(steps=622, epochs=2, phase="validation", count=2, each_ms=10000, step_ms=100)
    shape = RunShape(max_epochs=40, batches_per_epoch=311)
    found = [
        validation_frequency.rule(
            _ctx(e, "lightning", batches=311, shape=shape, steps_before=311 * i, first_epoch=i, run_span=run)
        )
        for i, e in enumerate(epochs)
    ]
    found.append(validation_frequency.rule(_ctx(run, "lightning", batches=311, shape=shape)))
    settings = [f.suggestion if f is not None else None for f in found]
    assert settings == [{"val_check_interval": 1.0, "check_val_every_n_epoch": 7}] * 3
    # even without the run to pool from, the epochs' own numbers give neighbours, not 7 and 17
    alone = [validation_frequency.rule(_ctx(e, "lightning", batches=311, shape=shape)) for e in epochs]
    assert [f.suggestion["check_val_every_n_epoch"] for f in alone if f is not None] == [7, 7]


#: what a plain loop's validation suggestion may say (SPEC §3: neutral keys for plain loops)
PLAIN_VALIDATION_KEYS = {"every_n_steps", "every_n_epochs", "at_end", "val_fraction"}
LIGHTNING_WORDS = ("Trainer", "val_check_interval", "check_val_every_n_epoch", "limit_val_batches")


@pytest.mark.parametrize("source", ["callable", "generator"])
def test_a_loop_with_no_epochs_is_told_steps_in_its_own_terms(source: str) -> None:
    """nanoGPT's shape: a ``while`` loop of 300 steps of 2 ms (``scope.batch``, or one pass over a
    generator), a 40 ms evaluation every 30 steps. The target needs 400 steps (500, rounded), more
    than the run: every 500 steps and once after the loop, never "every 2 epochs" nor an ``epoch``
    variable."""
    span = _span(steps=300, epochs=1, phase="validation", count=10, each_ms=40)
    finding = validation_frequency.rule(_ctx(span, epoch_steps=300, source=source))
    assert finding is not None
    assert finding.suggestion == {"every_n_steps": 500, "at_end": True}
    assert "epoch" not in finding.fix
    assert "epoch" not in finding.snippet
    assert "step % 500 == 0" in finding.snippet
    assert "once after the loop" in finding.fix
    assert "The 300 steps seen are fewer than 500" in finding.fix
    assert finding.evidence["runs_after"] == 1
    assert finding.est_speedup_bound == "lower"


def test_a_generator_over_several_epochs_keeps_its_epochs() -> None:
    span = _span(steps=160, epochs=2, phase="validation", count=2, each_ms=100)
    finding = validation_frequency.rule(_ctx(span, batches=None, epoch_steps=80, source="generator"))
    assert finding is not None
    assert finding.suggestion["every_n_epochs"] == 13


@pytest.mark.parametrize(
    ("steps", "count", "epochs", "source"),
    [(400, 80, 1, None), (160, 2, 2, None), (300, 10, 1, "callable"), (80, 16, 1, "iterable")],
)
def test_plain_validation_suggestions_use_the_neutral_keys_alone(
    steps: int, count: int, epochs: int, source: str | None
) -> None:
    span = _span(steps=steps, epochs=epochs, phase="validation", count=count, each_ms=100)
    finding = validation_frequency.rule(_ctx(span, epoch_steps=steps // epochs, source=source))
    assert finding is not None
    assert set(finding.suggestion) <= PLAIN_VALIDATION_KEYS, finding.suggestion
    for word in LIGHTNING_WORDS:
        assert word not in finding.fix
        assert word not in finding.snippet


def test_plain_runs_every_n_steps_count_the_run_after_the_loop() -> None:
    # steps 1..300, every 1000: none on the way, one after the loop
    assert plain_runs(0, 300, per_epoch=300, every_n_steps=1000) == 1
    # every 100 over 300 steps: 100, 200, 300; step 300 validated already, no extra run
    assert plain_runs(0, 300, per_epoch=300, every_n_steps=100) == 3
    assert plain_runs(0, 300, per_epoch=300, every_n_steps=100, at_end=False) == 3
    # the run's steps, not the epoch's: every 50 over two 80-step epochs is 50, 100, 150
    assert plain_runs(0, 160, per_epoch=80, every_n_steps=50, at_end=False) == 3


def _validating_span(every: int, steps: int, *, each_ms: float = 20) -> SpanStats:
    """2 ms steps validating (``each_ms``) at steps 0, ``every``, 2 x ``every``, ... as a loop with
    ``if step % every == 0: validate()`` does, its recent steps recorded one by one."""
    bit = 1 << BUILTIN_PHASES.index("validation")
    runs = [i for i in range(steps) if i % every == 0]
    span = _span(steps=steps, epochs=1, phase="validation", count=len(runs), each_ms=each_ms)
    durations = [int((2 + (each_ms if i in runs else 0)) * MS) for i in range(steps)]
    kinds = [_COMPUTE_BIT | (bit if i in runs else 0) for i in range(steps)]
    recent = RecentSteps(durations, [0] * steps, [int(2 * MS)] * steps, kinds)
    return dataclasses.replace(span, recent=recent)


def test_the_interval_now_is_the_gap_between_validations_as_the_user_set_it() -> None:
    """Every 25 steps over 110 steps: runs at steps 0, 25, 50, 75, 100, so 110 / 5 = 22 steps a
    run; the loop's own setting, 25, is what it is told."""
    span = _validating_span(25, 110)
    finding = validation_frequency.rule(_ctx(span, epoch_steps=110, source="callable"))
    assert finding is not None
    assert "instead of every 25 steps" in finding.fix
    assert finding.evidence["every_n_steps_seen"] == 25
    lightning = validation_frequency.rule(_ctx(span, "lightning", batches=110, shape=RunShape(max_epochs=3)))
    assert lightning is not None
    assert "instead of every 25 batches" in lightning.fix


def test_a_validation_pass_is_called_a_validation_pass() -> None:
    span = _span(steps=400, epochs=1, phase="validation", count=80, each_ms=20)
    finding = validation_frequency.rule(_ctx(span, batches=400, epoch_steps=400))
    assert finding is not None
    assert finding.title.endswith("(20 ms per validation pass)")
    assert "per run" not in finding.title


# -- checkpoints -----------------------------------------------------------------------------


def test_a_max_steps_fit_saves_once_and_asynchronously() -> None:
    """max_steps=300, a 40 ms save every 5 steps of 2 ms: the target needs 1000 steps, more than
    the fit: every 300 (once), and that one save is still 6% of the fit: save asynchronously."""
    span = _span(steps=300, epochs=1, phase="checkpoint", count=60, each_ms=40)
    shape = RunShape(max_steps=300, batches_per_epoch=1000)
    finding = checkpoint_frequency.rule(_ctx(span, "lightning", shape=shape))
    assert finding is not None
    assert finding.suggestion == {"every_n_train_steps": 300, "async_save": True}
    assert finding.evidence["saves_in_fit_after"] == 1
    assert "AsyncCheckpointIO" in finding.snippet
    assert finding.est_speedup_bound == "lower"
    assert finding.est_saving_fraction == pytest.approx((2400 - 40) / 3000, abs=1e-4)


def test_a_fit_that_saves_by_its_own_calls_is_not_told_of_a_model_checkpoint() -> None:
    """A Trainer without ModelCheckpoint whose callback calls trainer.save_checkpoint every 5
    steps: no Trainer argument changes those saves, so the advice is about the fit's own call
    (the plain loop's keys), and a Trainer that has one is still told of its argument."""
    span = _span(steps=300, epochs=1, phase="checkpoint", count=60, each_ms=40)
    own = checkpoint_frequency.rule(
        _ctx(span, "lightning", shape=RunShape(max_steps=300, batches_per_epoch=1000, model_checkpoints=0))
    )
    assert own is not None
    assert "every_n_steps" in own.suggestion
    assert "every_n_train_steps" not in own.suggestion
    assert "ModelCheckpoint(" not in own.snippet
    assert "trainer.save_checkpoint(path)" in own.snippet
    assert "the Trainer has none" in own.fix
    theirs = checkpoint_frequency.rule(
        _ctx(span, "lightning", shape=RunShape(max_steps=300, batches_per_epoch=1000, model_checkpoints=1))
    )
    assert theirs is not None
    assert "every_n_train_steps" in theirs.suggestion
    assert "ModelCheckpoint(every_n_train_steps=" in theirs.snippet


def test_a_plain_loop_saves_at_the_end_when_the_interval_is_longer_than_the_run() -> None:
    """400 steps of 2 ms, a 150 ms save every 10: 3750 needed -> every 5000 steps and at the end."""
    span = _span(steps=400, epochs=1, phase="checkpoint", count=40, each_ms=150)
    finding = checkpoint_frequency.rule(_ctx(span))
    assert finding is not None
    # the one save left is the run's last: the run waits for its write, a background one would not help
    assert finding.suggestion == {"every_n_steps": 5000, "at_end": True}
    assert finding.est_speedup_bound == "lower"
    assert "Saving in the background would not shorten this run" in finding.fix
    assert finding.evidence["saves_after"] == 1  # the save at the end
    assert "The 400 steps seen so far are fewer than 5000" in finding.fix
    assert "about every 10 s of training" in finding.fix
    assert "step == last_step" in finding.snippet
    assert "ModelCheckpoint" not in finding.fix + finding.snippet
    assert finding.est_saving_fraction == pytest.approx((6000 - 150) / 6800, abs=1e-4)


def _saves(
    *, saves: int, write_ms: float, cpu_ms: float, mb: float, copy_ms_per_mb: float, already_async: bool = False
) -> SaveSummary:
    """``saves`` measured saves, each ``write_ms`` long (``cpu_ms`` of it CPU) writing ``mb`` MB;
    a copy costs ``copy_ms_per_mb``."""
    return SaveSummary(
        saves=saves,
        wall_ns=round(saves * write_ms * MS),
        cpu_ns=round(saves * cpu_ms * MS),
        bytes=round(saves * mb * 1e6),
        copy_s_per_byte=copy_ms_per_mb / 1e3 / 1e6,
        already_async=already_async,
    )


def test_an_asynchronous_save_keeps_the_copy_and_the_preparation_on_the_training_thread() -> None:
    """max_steps=300, a 40 ms save every 5 steps of 2 ms: 30 ms of it the IO's write (15 ms of
    CPU), 10 ms building the checkpoint; 10 MB a save, a copy at 0.5 ms/MB (5 ms). Every 300
    steps (once, at the fit's last step) asynchronously: the save left costs the fit 10 + 5 ms and
    the hand-off; its write comes after the fit. An estimate."""
    span = _span(steps=300, epochs=1, phase="checkpoint", count=60, each_ms=40)
    shape = RunShape(max_steps=300, batches_per_epoch=1000)
    saves = _saves(saves=60, write_ms=30, cpu_ms=15, mb=10, copy_ms_per_mb=0.5)
    finding = checkpoint_frequency.rule(_ctx(span, "lightning", shape=shape, saves=saves))
    assert finding is not None
    assert finding.suggestion == {"every_n_train_steps": 300, "async_save": True}
    assert finding.est_speedup_bound == "estimate"
    stays_ms = 10 + 5 + checkpoint_frequency.HANDOFF_S * 1e3
    assert finding.est_saving_fraction == pytest.approx((2400 - stays_ms) / 3000, abs=1e-4)
    ev = finding.evidence
    assert (ev["write_ms"], ev["write_cpu_ms"], ev["prepare_ms"], ev["copy_ms"]) == pytest.approx((30, 15, 10, 5))
    assert (ev["save_mb"], ev["copy_ms_per_mb"]) == pytest.approx((10, 0.5))
    assert "the write (30 ms, 15 ms of it CPU) moves to that thread" in finding.fix
    assert "the copy of its 10.0 MB of state (5.0 ms, timed here)" in finding.fix
    assert "and building the checkpoint (10" in finding.fix
    assert "in its teardown, after the fit" in finding.fix
    assert "GIL" not in finding.fix  # no write during the fit


def test_an_asynchronous_save_is_not_suggested_when_its_copy_costs_as_much_as_the_save() -> None:
    """The same fit, but copying the 10 MB costs 4 ms/MB: 40 ms, as long as the save itself."""
    span = _span(steps=300, epochs=1, phase="checkpoint", count=60, each_ms=40)
    shape = RunShape(max_steps=300, batches_per_epoch=1000)
    saves = _saves(saves=60, write_ms=30, cpu_ms=15, mb=10, copy_ms_per_mb=4)
    finding = checkpoint_frequency.rule(_ctx(span, "lightning", shape=shape, saves=saves))
    assert finding is not None
    assert finding.suggestion == {"every_n_train_steps": 300}
    assert finding.est_speedup_bound == "lower"
    assert finding.est_saving_fraction == pytest.approx((2400 - 40) / 3000, abs=1e-4)
    assert "Saving asynchronously would not help" in finding.fix
    assert finding.evidence["copy_ms"] == pytest.approx(40)


def test_saves_already_asynchronous_get_no_second_async_lever() -> None:
    span = _span(steps=300, epochs=1, phase="checkpoint", count=60, each_ms=40)
    shape = RunShape(max_steps=300, batches_per_epoch=1000)
    saves = _saves(saves=60, write_ms=30, cpu_ms=15, mb=10, copy_ms_per_mb=0.5, already_async=True)
    finding = checkpoint_frequency.rule(_ctx(span, "lightning", shape=shape, saves=saves))
    assert finding is not None
    assert finding.suggestion == {"every_n_train_steps": 300}
    assert "asynchronously" not in finding.fix


def test_a_plain_loops_last_save_is_waited_for_so_a_background_writer_does_not_help() -> None:
    span = _span(steps=400, epochs=1, phase="checkpoint", count=40, each_ms=150)
    saves = _saves(saves=40, write_ms=150, cpu_ms=60, mb=30, copy_ms_per_mb=0.4)
    finding = checkpoint_frequency.rule(_ctx(span, saves=saves))
    assert finding is not None
    assert finding.suggestion == {"every_n_steps": 5000, "at_end": True}
    assert finding.est_speedup_bound == "lower"
    assert "copy its 30.0 MB of state first, 12 ms" in finding.fix
    assert finding.evidence["write_ms"] == pytest.approx(150)
    assert finding.est_saving_fraction == pytest.approx((6000 - 150) / 6800, abs=1e-4)


def test_an_epoch_and_the_run_agree_on_the_asynchronous_save() -> None:
    """A 2-epoch fit of 150 steps each, max_steps 300: the first epoch saves nothing with the
    setting (its finding is the saves removed), the run's keeps the copy of the one at the end;
    both name the same setting."""
    shape = RunShape(max_steps=300, max_epochs=2, batches_per_epoch=150)
    saves = _saves(saves=60, write_ms=30, cpu_ms=15, mb=10, copy_ms_per_mb=0.5)
    run = _span(steps=300, epochs=2, phase="checkpoint", count=60, each_ms=40)
    epoch = _span(steps=150, epochs=1, phase="checkpoint", count=30, each_ms=40)
    first = checkpoint_frequency.rule(_ctx(epoch, "lightning", shape=shape, saves=saves, run_span=run))
    whole = checkpoint_frequency.rule(_ctx(run, "lightning", shape=shape, saves=saves))
    assert first is not None
    assert whole is not None
    assert first.suggestion == whole.suggestion == {"every_n_train_steps": 300, "async_save": True}
    assert first.evidence["saves_after"] == 0
    assert first.est_saving_fraction == pytest.approx(1200 / 1500, abs=1e-4)


def test_the_async_cost_counts_overlapped_writes_against_training() -> None:
    split = checkpoint_frequency.SaveSplit(
        write_s=0.030, write_cpu_s=0.020, prepare_s=0.0, copy_s=0.005, save_bytes=1e7
    )
    stays = 0.005 + checkpoint_frequency.HANDOFF_S
    cost = checkpoint_frequency.async_cost_s
    # three saves during training, a core to spare: the copies alone
    assert cost(split, 3, 0.030, 0.0, last_waits=False, last_after_fit=False) == pytest.approx(3 * stays)
    # half a core missing: half of each write's CPU too
    assert cost(split, 3, 0.030, 0.5, last_waits=False, last_after_fit=False) == pytest.approx(3 * (stays + 0.010))
    # a plain run's last save is waited for: it costs the whole save
    assert cost(split, 3, 0.030, 1.0, last_waits=True, last_after_fit=False) == pytest.approx(
        2 * (stays + 0.020) + 0.030
    )
    # a fit's last save writes after the fit: its copy only
    assert cost(split, 1, 0.030, 1.0, last_waits=False, last_after_fit=True) == pytest.approx(stays)
    assert cost(split, 0, 0.030, 1.0, last_waits=True, last_after_fit=False) == 0.0


def test_no_spare_core_counts_the_process_its_workers_and_other_processes() -> None:
    span = _span(steps=300, epochs=1, phase="checkpoint", count=60, each_ms=40)  # CPU-busy: 1 core
    assert checkpoint_frequency.no_spare_core(_ctx(span)) == pytest.approx(0.0)  # 2 cores: 1 spare
    assert checkpoint_frequency.no_spare_core(_ctx(span, host_signals=host(others_cores=0.6))) == pytest.approx(0.6)
    assert checkpoint_frequency.no_spare_core(
        _ctx(span, host_signals=host(workers_cpu_s=5.0, others_cores=0.6))
    ) == pytest.approx(1.0)
    idle = _span(steps=300, epochs=1, phase="checkpoint", count=60, each_ms=40, waits=True)
    assert checkpoint_frequency.no_spare_core(dataclasses.replace(_ctx(idle), cores=1)) < 1.0
    # a write's CPU is counted at least in part: the writer takes the GIL for its Python work
    assert checkpoint_frequency.write_cpu_counted(_ctx(span)) == checkpoint_frequency.WRITER_SHARE
    busy = _ctx(span, host_signals=host(others_cores=0.8))
    assert checkpoint_frequency.write_cpu_counted(busy) == pytest.approx(0.8)


def test_saves_during_a_fit_count_part_of_their_writes_cpu() -> None:
    """max_steps=300, saves every 5 steps; an interval of 100 keeps 3 saves: 2 during the fit,
    which each keep their copy and preparation (15 ms) and half their write's 15 ms of CPU, and
    the last, at the fit's last step, its 15 ms. Reached by a target share that needs 100 steps."""
    span = _span(steps=300, epochs=1, phase="checkpoint", count=60, each_ms=40)
    shape = RunShape(max_steps=300, batches_per_epoch=1000)
    saves = _saves(saves=60, write_ms=30, cpu_ms=15, mb=10, copy_ms_per_mb=0.5)
    ctx = _ctx(span, "lightning", shape=shape, saves=saves)
    est = checkpoint_frequency.estimate(ctx, "checkpoint", 0.02)
    assert est is not None
    split = checkpoint_frequency.save_split(ctx, est)
    assert split is not None
    cost = checkpoint_frequency.async_cost_s(split, 3, est.each_s, 0.5, last_waits=False, last_after_fit=True)
    stays = 0.015 + checkpoint_frequency.HANDOFF_S
    assert cost == pytest.approx(2 * (stays + 0.0075) + stays)


def test_checkpoint_wording_gives_training_time_in_readable_units() -> None:
    """Every 5 steps, 40 ms each, 2 ms steps: 2% target -> >= 1000 steps = 2 s of training."""
    span = _span(steps=2000, epochs=1, phase="checkpoint", count=400, each_ms=40)
    finding = checkpoint_frequency.rule(_ctx(span))
    assert finding is not None
    assert finding.suggestion == {"every_n_steps": 1000, "at_end": True}
    assert "about every 2 s of training" in finding.fix
    assert finding.evidence["saves_after"] == 2


# -- logging ---------------------------------------------------------------------------------


def test_lightning_logging_is_at_most_the_fits_length_and_keeps_the_epoch_end_call() -> None:
    """0.5 ms per call (cheap, many) on each of 40 steps of 2 ms: 25 needed, 50 rounded, fit of
    40 -> every 40."""
    span = _span(steps=40, epochs=1, phase="logging", count=41, each_ms=0.5)
    shape = RunShape(max_epochs=1, batches_per_epoch=40)
    finding = logging_frequency.rule(_ctx(span, "lightning", shape=shape))
    assert finding is not None
    assert finding.suggestion == {"log_every_n_steps": 40}
    assert finding.evidence["calls_after"] == 2  # step 40 and the epoch's end
    assert finding.est_speedup_bound == "lower"


def test_a_fit_that_logs_every_step_is_told_so_in_words() -> None:
    """Trainer(log_every_n_steps=1): "instead of every step", not "every 1 steps"."""
    span = _span(steps=40, epochs=1, phase="logging", count=41, each_ms=0.5)
    shape = RunShape(max_epochs=1, batches_per_epoch=40, log_every_n_steps=1)
    finding = logging_frequency.rule(_ctx(span, "lightning", shape=shape))
    assert finding is not None
    assert "instead of every step:" in finding.fix
    assert "every 1 steps" not in finding.fix


def test_a_logger_that_blocks_is_moved_off_the_training_thread_and_keeps_every_step() -> None:
    """3 ms per call on each of 400 steps of 4 ms: a wait, not work. A background thread takes
    it, and keeps up (a call is shorter than a step); the training thread keeps the hand-off
    (20 us) of each of the 401 calls."""
    span = _span(steps=400, epochs=1, phase="logging", count=401, each_ms=3, step_ms=4, waits=True)
    shape = RunShape(max_epochs=1, batches_per_epoch=400)
    finding = logging_frequency.rule(_ctx(span, "lightning", shape=shape))
    assert finding is not None
    assert finding.suggestion == {"async_logging": True}
    assert finding.est_speedup_bound == "estimate"
    assert finding.evidence["calls_after"] == 401
    assert finding.evidence["blocking_calls"] is True
    wall = 400 * 0.004 + 401 * 0.003
    assert finding.est_saving_fraction == pytest.approx(401 * (0.003 - 20e-6) / wall, abs=1e-4)
    assert "BackgroundLogger(your_logger)" in (finding.snippet or "")
    assert "log_every_n_steps" not in (finding.snippet or "")
    plain = logging_frequency.rule(_ctx(span))
    assert plain is not None
    assert plain.suggestion == {"async_logging": True}
    assert "QueueHandler" in plain.fix
    assert "queue.Queue()" in (plain.snippet or "")


def test_a_logger_slower_than_the_steps_is_also_called_less_often_so_its_thread_keeps_up() -> None:
    """20 ms calls on 2 ms steps: a thread making every call would fall 18 ms behind each step;
    one call every 10 steps would keep it busy all the time, and behind at the least jitter; every
    20 keeps it busy half of the time (at most THREAD_BUSY_MAX). Lightning also logs at the
    epoch's end."""
    span = _span(steps=400, epochs=1, phase="logging", count=401, each_ms=20, waits=True)
    shape = RunShape(max_epochs=1, batches_per_epoch=400)
    finding = logging_frequency.rule(_ctx(span, "lightning", shape=shape))
    assert finding is not None
    assert finding.suggestion == {"async_logging": True, "log_every_n_steps": 20}
    assert finding.evidence["calls_after"] == 21
    wall = 400 * 0.002 + 401 * 0.020
    assert finding.est_saving_fraction == pytest.approx((401 * 0.020 - 21 * 20e-6) / wall, abs=1e-4)
    assert "log_every_n_steps=20" in (finding.snippet or "")
    plain = logging_frequency.rule(_ctx(span))
    assert plain is not None
    assert plain.suggestion == {"async_logging": True, "log_every_n_steps": 20}
    assert plain.evidence["calls_after"] == 20
    assert "if step % 20 == 0:" in (plain.snippet or "")


def test_a_logger_almost_as_slow_as_the_steps_is_called_every_other_step() -> None:
    """3 ms calls on 3.2 ms steps: every call on the thread would keep it busy 94% of the time
    (it fell behind on this VM, and the run waited for it); every other step, 47%."""
    span = _span(steps=400, epochs=1, phase="logging", count=400, each_ms=3, waits=True, step_ms=3.2)
    finding = logging_frequency.rule(_ctx(span))
    assert finding is not None
    assert finding.suggestion == {"async_logging": True, "log_every_n_steps": 2}


def test_a_blocking_logger_on_tiny_steps_keeps_its_hand_offs_under_the_target() -> None:
    """0.5 ms steps, 0.2 ms calls would be cheap; 1.2 ms calls that wait on 20 ms steps: the
    hand-off is 0.1% of a step, every step stays logged. On 1 ms steps a 20 us hand-off is 2%
    of a step: every 2 steps (and a 1.2 ms call then fits in the 2 ms between calls)."""
    slow_steps = _span(steps=400, epochs=1, phase="logging", count=400, each_ms=1.2, step_ms=20, waits=True)
    slow = logging_frequency.rule(_ctx(slow_steps))
    assert slow is not None
    assert slow.suggestion == {"async_logging": True}
    fast_steps = _span(steps=400, epochs=1, phase="logging", count=400, each_ms=1.2, step_ms=1, waits=True)
    fast = logging_frequency.rule(_ctx(fast_steps))
    assert fast is not None
    assert fast.suggestion == {"async_logging": True, "log_every_n_steps": 2}
    assert fast.evidence["calls_after"] == 200
    wall = 400 * 0.001 + 400 * 0.0012
    assert fast.est_saving_fraction == pytest.approx((400 * 0.0012 - 200 * 20e-6) / wall, abs=1e-4)


def test_measured_logger_calls_keep_their_cpu_on_the_training_thread_and_give_a_floor() -> None:
    """3 ms calls of which 10% was the process's CPU, on a host with cores to spare: the wait
    moves to the thread, the CPU (0.3 ms) and the hand-off stay, and only waiting is removed: a
    floor. Calls measured as 70% CPU are work, not waits: fewer calls instead."""
    span = _span(steps=400, epochs=1, phase="logging", count=401, each_ms=3, step_ms=4, waits=True)
    shape = RunShape(max_epochs=1, batches_per_epoch=400)
    calls = CallSummary(calls=401, wall_ns=401 * 3 * MS, cpu_ns=401 * 3 * MS // 10)
    spare = host(main_cpu_s=5.0, cores=2, others_cores=0.2, machine_cores=2)  # 0.7 of 2 cores busy
    finding = logging_frequency.rule(_ctx(span, "lightning", shape=shape, logging_calls=calls, host_signals=spare))
    assert finding is not None
    assert finding.suggestion == {"async_logging": True}
    assert finding.est_speedup_bound == "lower"
    assert finding.evidence["call_cpu_share"] == pytest.approx(0.1)
    wall = 400 * 0.004 + 401 * 0.003
    stays = 20e-6 + 0.0003
    assert finding.est_saving_fraction == pytest.approx(401 * (0.003 - stays) / wall, abs=1e-4)
    assert "0.30 ms a call, measured" in finding.fix
    # the same calls, measured as mostly CPU (the process-wide idle time says nothing then)
    busy = CallSummary(calls=401, wall_ns=401 * 3 * MS, cpu_ns=401 * 3 * MS * 7 // 10)
    fewer = logging_frequency.rule(_ctx(span, "lightning", shape=shape, logging_calls=busy, host_signals=spare))
    assert fewer is not None
    assert set(fewer.suggestion) == {"log_every_n_steps"}
    assert fewer.evidence["blocking_calls"] is False


@pytest.mark.parametrize(
    ("why", "extra"),
    [
        ("on a GPU the wait may overlap the device's work", {"cuda_device": cuda_device()}),
        ("saturated cores: waiting for a core looks like waiting", {"others_cores": 1.4}),
        ("no host samples: saturation unknown", {"host_signals": None}),
    ],
)
def test_a_measured_wait_is_a_floor_only_where_it_is_surely_the_loops_to_lose(why: str, extra: dict[str, Any]) -> None:
    """The same 3 ms calls, 10% CPU: on a GPU, on a machine whose cores were saturated, or
    without host samples, the prediction (the same number) is an estimate."""
    span = _span(steps=400, epochs=1, phase="logging", count=401, each_ms=3, step_ms=4, waits=True)
    calls = CallSummary(calls=401, wall_ns=401 * 3 * MS, cpu_ns=401 * 3 * MS // 10)
    others = extra.pop("others_cores", 0.2)
    signals = host(main_cpu_s=5.0, cores=2, others_cores=others, machine_cores=2)
    context: dict[str, Any] = {"logging_calls": calls, "host_signals": signals, **extra}
    floor = logging_frequency.rule(
        _ctx(span, logging_calls=calls, host_signals=host(main_cpu_s=5.0, cores=2, others_cores=0.2, machine_cores=2))
    )
    finding = logging_frequency.rule(_ctx(span, **context))
    assert floor is not None
    assert finding is not None, why
    assert floor.est_speedup_bound == "lower"
    assert finding.est_speedup_bound == "estimate", why
    assert finding.suggestion == floor.suggestion == {"async_logging": True}
    assert finding.est_saving_fraction == floor.est_saving_fraction


def test_long_logging_calls_that_compute_are_made_fewer_not_moved() -> None:
    """20 ms calls during which the process stays busy: work, which a thread would not take off
    the training thread (the GIL); fewer calls is the lever, and a floor."""
    span = _span(steps=400, epochs=1, phase="logging", count=400, each_ms=20)
    finding = logging_frequency.rule(_ctx(span))
    assert finding is not None
    assert set(finding.suggestion) == {"log_every_n_steps"}
    assert finding.est_speedup_bound == "lower"
    assert finding.evidence["blocking_calls"] is False


def test_many_cheap_logging_calls_are_made_fewer_not_moved() -> None:
    span = _span(steps=400, epochs=1, phase="logging", count=400, each_ms=0.4)
    finding = logging_frequency.rule(_ctx(span))
    assert finding is not None
    assert finding.suggestion == {"log_every_n_steps": 20}  # 0.4 / (0.01 * 2) = 20
    assert finding.est_speedup_bound == "lower"
    assert finding.evidence["blocking_calls"] is False


def test_a_plain_epochs_finding_counts_its_own_runs_and_the_run_counts_the_last_one() -> None:
    """A loop validating (100 ms) once per 80-step epoch of 2 ms, four epochs: 13 epochs needed.
    An epoch cannot know it is the last, so its finding counts its own run away; the run's
    finding keeps the run after the last epoch."""
    run = _span(steps=320, epochs=4, phase="validation", count=4, each_ms=100)
    epoch = _span(steps=80, epochs=1, phase="validation", count=1, each_ms=100)
    at_epoch = validation_frequency.rule(
        _ctx(epoch, batches=80, epoch_steps=80, steps_before=160, first_epoch=2, run_span=run)
    )
    at_end = validation_frequency.rule(_ctx(run, batches=80, epoch_steps=80))
    assert at_epoch is not None
    assert at_end is not None
    assert at_epoch.suggestion == at_end.suggestion
    assert at_epoch.evidence["runs_after"] == 0
    assert at_end.evidence["runs_after"] == 1
    # one run is still 13.5% of the run: a quarter of the batches brings it near 5% (33.7 ms allowed)
    assert at_end.suggestion["val_fraction"] == 0.25
    assert at_end.est_saving_fraction == pytest.approx((400 - 25) / 1040, abs=1e-4)


# -- the steps after a run -------------------------------------------------------------------

_COMPUTE_BIT = 1 << BUILTIN_PHASES.index("compute")
_SAVE_BIT = _COMPUTE_BIT | 1 << BUILTIN_PHASES.index("checkpoint")


def _saving_span(after_ms: list[float], *, steps: int = 400, every: int = 10, each_ms: float = 150) -> SpanStats:
    """A plain loop of 2 ms steps saving every ``every`` steps (``each_ms`` each); the steps right
    after each save take ``after_ms`` longer (the first one ``after_ms[0]``, ...)."""
    durations, kinds = [], []
    since = None
    for i in range(steps):
        extra = after_ms[since] if since is not None and since < len(after_ms) else 0.0
        save = (i + 1) % every == 0
        durations.append(round((2.0 + extra + (each_ms if save else 0.0)) * MS))
        kinds.append(_SAVE_BIT if save else _COMPUTE_BIT)
        since = 0 if save else (since + 1 if since is not None else None)
    count = steps // every
    total = round(count * each_ms * MS)
    wall = sum(durations)
    return SpanStats(
        wall_ns=wall,
        steps=steps,
        epochs=1,
        step_total_ns=wall,
        phase_ns={"data": 0, "compute": wall - total, "checkpoint": total, "other": 0},
        phase_counts={"data": steps, "compute": steps, "checkpoint": count},
        step=Distribution.of(durations),
        data_wait=Distribution.of([0] * steps),
        data_cpu_ns=0,
        process_cpu_ns=wall,
        recent=RecentSteps(durations, [0] * steps, list(durations), kinds),
    )


def test_the_slowdown_after_each_save_is_measured_from_the_steps_between_saves() -> None:
    # 9 steps between saves: the first half (4 steps) took 3 + 1 ms beyond the second half's 2 ms
    assert after_run_s(_saving_span([3.0, 1.0]).recent, "checkpoint") == pytest.approx(0.004)
    assert after_run_s(_saving_span([]).recent, "checkpoint") == 0.0
    # a speed-up after the save is not a negative cost
    assert after_run_s(_saving_span([-1.0]).recent, "checkpoint") == 0.0
    # saves every 4 steps leave stretches of 3: too short to tell the steps apart
    assert after_run_s(_saving_span([3.0], every=4).recent, "checkpoint") == 0.0
    # fewer than three stretches between saves: nothing said
    assert after_run_s(_saving_span([3.0], steps=30).recent, "checkpoint") == 0.0
    assert after_run_s(None, "checkpoint") == 0.0


def test_one_slow_stretch_does_not_make_a_slowdown() -> None:
    # the host took the CPU once, in one stretch: the median over the stretches stays at 0
    span = _saving_span([])
    assert span.recent is not None
    durations = list(span.recent.duration_ns)
    durations[101] += 30 * MS
    recent = RecentSteps(durations, span.recent.wait_ns, span.recent.compute_ns, span.recent.kinds)
    assert after_run_s(recent, "checkpoint") == 0.0


def test_a_save_removed_takes_the_slowdown_after_it_with_it() -> None:
    slowed = _saving_span([3.0, 1.0])
    flat = dataclasses.replace(slowed, recent=None)
    with_after = checkpoint_frequency.rule(_ctx(slowed))
    without = checkpoint_frequency.rule(_ctx(flat))
    assert with_after is not None
    assert without is not None
    assert with_after.suggestion == without.suggestion
    assert with_after.est_speedup_bound == "lower"
    removed = 40 - with_after.evidence["saves_after"]
    assert removed > 0
    # each save removed also removes the 4 ms its next steps lost
    assert with_after.est_saving_fraction - without.est_saving_fraction == pytest.approx(
        removed * 0.004 / slowed.wall_s, abs=1e-3
    )
    assert with_after.evidence["slower_after_each_ms"] == pytest.approx(4.0)
