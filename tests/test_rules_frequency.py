"""The three frequency rules as users read them: SPEC suggestion keys, wording per framework."""

from __future__ import annotations

from stallscope.analysis.context import AnalysisConfig, Context
from stallscope.analysis.rules import checkpoint_frequency, validation_frequency
from stallscope.timeline.stats import Distribution, SpanStats

MS = 1_000_000


def _span(*, steps: int, epochs: int, phase: str, count: int, each_ms: int, step_ms: int = 2) -> SpanStats:
    total = count * each_ms * MS
    wall = steps * step_ms * MS + total
    return SpanStats(
        wall_ns=wall,
        steps=steps,
        epochs=epochs,
        step_total_ns=steps * step_ms * MS,
        phase_ns={"data": 0, "compute": steps * step_ms * MS, phase: total, "other": 0},
        phase_counts={"data": steps, "compute": steps, phase: count},
        step=Distribution.of([step_ms * MS] * steps),
        data_wait=Distribution.of([0] * steps),
        data_cpu_ns=0,
        process_cpu_ns=wall,
    )


def _ctx(span: SpanStats, framework: str = "plain", batches: int | None = None) -> Context:
    return Context(
        span=span, loader=None, cores=2, config=AnalysisConfig(framework=framework), batches_per_epoch=batches
    )


def test_validation_once_per_epoch_too_often_keeps_the_spec_key() -> None:
    """Validating once per epoch (80 batches x 2 ms) for 100 ms: target 5% -> every 2+ epochs."""
    span = _span(steps=160, epochs=2, phase="validation", count=2, each_ms=100)
    finding = validation_frequency.rule(_ctx(span, batches=80))
    assert finding is not None
    assert finding.suggestion["val_check_interval"] == 1.0
    # 100 ms each must be <= 5% of the time between runs: >= 2000 ms / 2 ms = 1000 batches -> 13 epochs
    assert finding.suggestion["check_val_every_n_epoch"] == 13
    assert "validate()" in finding.snippet
    assert "Trainer(" not in finding.snippet  # a plain loop has no Trainer
    lightning = validation_frequency.rule(_ctx(span, "lightning", batches=80))
    assert lightning is not None
    assert lightning.snippet == "Trainer(val_check_interval=1.0, check_val_every_n_epoch=13)"


def test_validation_every_few_batches_suggests_a_batch_interval() -> None:
    """Every 5 of 400 batches, 20 ms each, 2 ms steps: >= 20 / (0.05 x 2) = 200 batches."""
    span = _span(steps=400, epochs=1, phase="validation", count=80, each_ms=20)
    finding = validation_frequency.rule(_ctx(span, batches=400))
    assert finding is not None
    assert finding.suggestion == {"val_check_interval": 200}


def test_checkpoint_wording_gives_training_time_in_readable_units() -> None:
    """Every 5 steps, 40 ms each, 2 ms steps: 2% target -> >= 1000 steps = 2 s of training."""
    span = _span(steps=100, epochs=1, phase="checkpoint", count=20, each_ms=40)
    finding = checkpoint_frequency.rule(_ctx(span))
    assert finding is not None
    assert finding.suggestion == {"every_n_steps": 1000}
    assert "about 2 s of training" in finding.fix
