"""``too_short``: a span too short to judge says which threshold it missed."""

from __future__ import annotations

from stallscope.analysis.diagnose import MIN_JUDGED_STEPS, MIN_JUDGED_WALL_S, too_short
from stallscope.timeline.stats import Distribution, SpanStats

MS = 1_000_000


def _span(steps: int, wall_ms: int) -> SpanStats:
    each = wall_ms * MS // steps
    return SpanStats(
        wall_ns=wall_ms * MS,
        steps=steps,
        epochs=1,
        step_total_ns=each * steps,
        phase_ns={"data": 0, "compute": each * steps, "other": 0},
        phase_counts={"data": steps, "compute": steps},
        step=Distribution.of([each] * steps),
        data_wait=Distribution.of([0] * steps),
        data_cpu_ns=0,
        process_cpu_ns=each * steps,
    )


def test_a_long_enough_span_is_judged() -> None:
    assert too_short(_span(MIN_JUDGED_STEPS, int(MIN_JUDGED_WALL_S * 1000))) is None


def test_a_short_span_names_only_what_it_lacks() -> None:
    few_steps = too_short(_span(10, 5000))
    assert few_steps is not None
    assert "10 steps, fewer than 30" in few_steps
    assert " s, under " not in few_steps
    brief = too_short(_span(80, 470))
    assert brief is not None
    assert "0.47 s, under 1 s" in brief
    assert "steps" not in brief
    both = too_short(_span(5, 100))
    assert both is not None
    assert "5 steps, fewer than 30 and 0.1 s, under 1 s" in both


def test_a_short_runs_time_reads_in_plain_numbers() -> None:
    """A run of 45 us reads "0.045 ms", never "4.5e-05 s"."""
    from stallscope.analysis.diagnose import too_short_for

    text = too_short_for(3, 45e-6)
    assert text is not None
    assert "0.045 ms, under 1 s" in text
    assert "e-" not in text
