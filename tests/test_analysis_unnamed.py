"""The note for a run whose time is mostly in no phase (``other``)."""

from __future__ import annotations

import dataclasses

from signal_fakes import record_span

from stallscope.analysis.unnamed import OTHER_NOTE_SHARE, other_note


def _with_other(share: float) -> object:
    """100 steps of 10 ms compute, with ``other`` taking ``share`` of the span's wall time."""
    span = record_span(steps=100, compute_ms=10.0)
    compute = span.phase_ns["compute"]
    other = round(compute * share / (1 - share))
    phases = {**span.phase_ns, "other": other}
    return dataclasses.replace(span, wall_ns=compute + other, phase_ns=phases)


def test_a_run_mostly_in_no_phase_is_told_where_such_time_comes_from_and_how_to_name_it() -> None:
    plain = other_note(_with_other(0.65), "plain")  # type: ignore[arg-type]
    assert plain is not None
    assert plain.startswith("65% of the run's time is in no phase")
    assert 'scope.phase("compute")' in plain  # most often the step itself, unmarked
    assert '"logging"' in plain  # a plain loop's own code: a built-in name gets its findings
    lightning = other_note(_with_other(0.65), "lightning")  # type: ignore[arg-type]
    assert lightning is not None
    assert "on_train_batch_end" in lightning
    assert 'scope.phase("a name")' in lightning
    assert '"logging"' not in lightning  # there the built-in names' advice is the Trainer's settings
    hf = other_note(_with_other(0.5), "transformers")  # type: ignore[arg-type]
    assert hf is not None
    assert "on_step_end" in hf


def test_a_run_whose_phases_name_most_of_its_time_gets_no_note() -> None:
    assert other_note(_with_other(OTHER_NOTE_SHARE - 0.02), "plain") is None  # type: ignore[arg-type]
    assert other_note(_with_other(OTHER_NOTE_SHARE + 0.02), "plain") is not None  # type: ignore[arg-type]
    assert other_note(None, "plain") is None
    # a run too short to judge: a few steps of nothing are mostly "other"
    short = record_span(steps=20, compute_ms=1.0)
    idle = dataclasses.replace(
        short, wall_ns=short.wall_ns * 10, phase_ns={**short.phase_ns, "other": short.wall_ns * 9}
    )
    assert other_note(idle, "plain") is None  # type: ignore[arg-type]
