"""The report's note for a run whose time is mostly in no phase (``other``): no rule judges time
it cannot name, so the user is told where such time comes from in their kind of loop and how to
name it."""

from __future__ import annotations

from stallscope.analysis.diagnose import MIN_JUDGED_STEPS, MIN_JUDGED_WALL_S
from stallscope.timeline.phases import OTHER
from stallscope.timeline.stats import SpanStats

#: ``other`` at least this share of the run's wall time gets the note
OTHER_NOTE_SHARE = 0.2

#: where time outside every phase comes from, by the loop's framework
_WHERE = {
    "lightning": "in a Lightning fit, other callbacks' on_train_batch_end and the module's hooks after the step",
    "transformers": "in a transformers Trainer, other callbacks' on_step_end and the Trainer's own work between steps",
}


def other_note(span: SpanStats | None, framework: str) -> str | None:
    """The note for a span long enough to judge whose ``other`` phase is ``OTHER_NOTE_SHARE`` of its
    time or more, else None."""
    if span is None or span.wall_ns <= 0 or span.steps < MIN_JUDGED_STEPS or span.wall_s < MIN_JUDGED_WALL_S:
        return None  # too short to judge (as a diagnosis): a few steps of nothing are mostly "other"
    share = span.phase_ns.get(OTHER, 0) / span.wall_ns
    if share < OTHER_NOTE_SHARE:
        return None
    where = _WHERE.get(framework, "code of the loop that runs outside scope.iter's wait and every scope.phase")
    text = f"{share:.0%} of the run's time is in no phase StallScope names (other: {where}), and no finding judges it"
    if framework in _WHERE:  # a built-in name there is the framework's own: its advice is the Trainer's settings
        return text + (
            ': wrap that code in `with scope.phase("a name"):` (scope: your StallScope callback) and the report'
            " shows its share by that name"
        )
    return text + (
        ': wrap that code in `with scope.phase("compute"):` where it is the training step (forward, backward,'
        ' optimizer), or in "logging", "checkpoint" or "validation", whichever it is, and its findings follow;'
        " any other name shows its share"
    )
