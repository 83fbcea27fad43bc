"""Findings in ``transformers.TrainingArguments`` words (``analysis/transformers_words.py``), and
the frequency rules sized to a Trainer run's shape."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from stallscope.analysis.context import AnalysisConfig, Context, RunShape
from stallscope.analysis.diagnose import diagnose
from stallscope.analysis.finding import Finding
from stallscope.analysis.rules import checkpoint_frequency, logging_frequency, validation_frequency
from stallscope.analysis.transformers_words import in_trainer_words
from stallscope.signals.loader import LoaderConfig
from stallscope.timeline.stats import Distribution, SpanStats

MS = 1_000_000


def _span(*, steps: int, phase: str, count: int, each_ms: float, step_ms: float = 2) -> SpanStats:
    """``steps`` steps of ``step_ms`` of CPU work and ``count`` runs of ``phase``, CPU work too."""
    total = int(count * each_ms * MS)
    train = int(steps * step_ms * MS)
    return SpanStats(
        wall_ns=train + total,
        steps=steps,
        epochs=1,
        step_total_ns=train,
        phase_ns={"data": 0, "compute": train, phase: total, "other": 0},
        phase_counts={"data": steps, "compute": steps, phase: count},
        step=Distribution.of([int(step_ms * MS)] * steps),
        data_wait=Distribution.of([0] * steps),
        data_cpu_ns=0,
        process_cpu_ns=train + total,
    )


def _ctx(span: SpanStats, *, max_steps: int | None = None, **extra: Any) -> Context:
    return Context(
        span=span,
        loader=None,
        cores=2,
        config=AnalysisConfig(framework="transformers"),
        shape=RunShape(max_steps=max_steps, batches_per_epoch=span.steps),
        **extra,
    )


def test_saves_every_two_steps_become_save_steps_within_the_run() -> None:
    """60 saves of 20 ms in a 120-step run: ``save_steps`` is at most the run's 120 steps (the
    Trainer also saves at the last step), in ``TrainingArguments`` words."""
    ctx = _ctx(_span(steps=120, phase="checkpoint", count=60, each_ms=20), max_steps=120)
    found = diagnose(ctx, [checkpoint_frequency.rule])
    assert [f.id for f in found] == ["checkpoint.frequency"]
    top = found[0]
    assert top.suggestion["save_strategy"] == "steps"
    assert 2 < top.suggestion["save_steps"] <= 120
    assert "TrainingArguments(..., save_strategy='steps', save_steps=" in top.snippet
    assert "save_only_model=True" in top.fix
    assert top.evidence["saves_in_fit_after"] >= 1  # the run still saves


def test_an_evaluation_every_two_steps_becomes_eval_steps_within_the_run() -> None:
    """Evaluations of 200 ms every 2 steps of a 60-step run: at most one evaluation per run is
    left (``eval_steps=60``), and as that is still too much, a part of the evaluation set."""
    ctx = _ctx(_span(steps=60, phase="validation", count=30, each_ms=200), max_steps=60)
    (top,) = diagnose(ctx, [validation_frequency.rule])
    assert top.suggestion["eval_strategy"] == "steps"
    assert top.suggestion["eval_steps"] == 60
    assert 0 < top.suggestion["eval_dataset_fraction"] < 1
    assert top.evidence["runs_in_fit_after"] == 1
    assert 'TrainingArguments(..., eval_strategy="steps", eval_steps=60)' in top.fix
    assert "\n" not in top.fix


def test_eval_steps_count_across_epochs_and_at_the_last_step() -> None:
    """A longer run: ``eval_steps`` below the run's steps, and the prediction counts the runs at
    its multiples plus the one at the last step."""
    ctx = _ctx(_span(steps=1000, phase="validation", count=500, each_ms=2), max_steps=1000)
    (top,) = diagnose(ctx, [validation_frequency.rule])
    k = top.suggestion["eval_steps"]
    assert k < 1000
    assert top.evidence["runs_in_fit_after"] == 1000 // k + (1 if 1000 % k else 0)
    assert "eval_dataset_fraction" not in top.suggestion


def test_logging_steps_are_at_most_the_run() -> None:
    ctx = _ctx(_span(steps=50, phase="logging", count=50, each_ms=0.5), max_steps=50)
    (top,) = diagnose(ctx, [logging_frequency.rule])
    assert top.suggestion == {"logging_strategy": "steps", "logging_steps": top.suggestion["logging_steps"]}
    assert 1 <= top.suggestion["logging_steps"] <= 50
    assert "TrainingArguments(..., logging_strategy='steps', logging_steps=" in top.snippet


def _finding(id: str, suggestion: dict[str, Any]) -> Finding:
    return Finding(
        id=id,
        title="t",
        est_saving_fraction=0.3,
        est_speedup=1.43,
        confidence="high",
        evidence={},
        fix="neutral words",
        suggestion=suggestion,
        snippet="DataLoader(...)",
    )


def test_loader_keys_become_dataloader_fields() -> None:
    ctx = _ctx(_span(steps=10, phase="logging", count=0, each_ms=0))
    workers = in_trainer_words(_finding("data.workers", {"num_workers": 4, "torch_num_threads": 1}), ctx)
    assert workers.suggestion == {"dataloader_num_workers": 4, "torch_num_threads": 1}
    assert workers.snippet == "torch.set_num_threads(1)\nTrainingArguments(..., dataloader_num_workers=4)"
    pin = in_trainer_words(_finding("data.pin_memory", {"pin_memory": True, "non_blocking": True}), ctx)
    assert pin.suggestion == {"dataloader_pin_memory": True, "accelerator_config": {"non_blocking": True}}
    prefetch = in_trainer_words(_finding("data.prefetch", {"prefetch_factor": 4}), ctx)
    assert prefetch.suggestion == {"dataloader_prefetch_factor": 4}
    persistent = in_trainer_words(_finding("data.persistent_workers", {"persistent_workers": True}), ctx)
    assert persistent.suggestion == {"dataloader_persistent_workers": True}
    assert persistent.est_saving_fraction == 0.3  # the prediction is the rule's


def test_precision_and_batch_size_become_trainer_fields() -> None:
    ctx = _ctx(_span(steps=10, phase="logging", count=0, each_ms=0))
    assert in_trainer_words(_finding("compute.amp", {"precision": "bf16-mixed"}), ctx).suggestion == {"bf16": True}
    assert in_trainer_words(_finding("compute.amp", {"precision": "16-mixed"}), ctx).suggestion == {"fp16": True}
    batch = in_trainer_words(_finding("compute.batch_size", {"batch_size": 64}), ctx)
    assert batch.suggestion == {"per_device_train_batch_size": 64}
    untouched = _finding("host.sync", {})
    assert in_trainer_words(untouched, ctx) is untouched


def test_workers_kept_for_the_run_are_both_fields_in_the_fix() -> None:
    loader = LoaderConfig(num_workers=0, pin_memory=True, prefetch_factor=None, persistent_workers=False, batch_size=8)
    ctx = replace(_ctx(_span(steps=10, phase="logging", count=0, each_ms=0)), loader=loader)
    workers = in_trainer_words(_finding("data.workers", {"num_workers": 3, "persistent_workers": True}), ctx)
    assert workers.suggestion == {"dataloader_num_workers": 3, "dataloader_persistent_workers": True}
    assert "dataloader_num_workers=3 (now 0) and dataloader_persistent_workers=True" in workers.fix
    assert workers.snippet == "TrainingArguments(..., dataloader_num_workers=3, dataloader_persistent_workers=True)"


def test_the_workers_fix_keeps_what_its_prediction_counts_and_how_far_it_may_be_off() -> None:
    """The rule's last sentences (cores shared, colder caches, the range) say how far the
    prediction may be off: in TrainingArguments words they stay, after the settings."""
    caveat = (
        " The workers share the 2 usable cores with the training process: about 1.4 cores of work now, 3.0 with"
        " the change, so the training step itself may run slower. The realized speedup may land anywhere from"
        " x1.56 to x2.36."
    )
    finding = replace(
        _finding("data.workers", {"num_workers": 2, "torch_num_threads": 1}),
        fix="Raise num_workers of the DataLoader from 0 to 2. Training runs on the CPU with 2 intra-op threads."
        + caveat,
    )
    loader = LoaderConfig(num_workers=0, pin_memory=True, prefetch_factor=None, persistent_workers=False, batch_size=8)
    ctx = replace(_ctx(_span(steps=10, phase="logging", count=0, each_ms=0)), loader=loader)
    words = in_trainer_words(finding, ctx)
    assert words.fix.startswith("Set dataloader_num_workers=2 in TrainingArguments (now 0).")
    assert words.fix.endswith(caveat)
    assert "DataLoader" not in words.fix
    plain = in_trainer_words(_finding("data.workers", {"num_workers": 2}), ctx)
    assert plain.fix == "Set dataloader_num_workers=2 in TrainingArguments (now 0)."  # none to keep
