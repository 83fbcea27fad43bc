"""Run every rule over a span and rank what they find."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace

from stallscope.analysis.context import Context
from stallscope.analysis.disturbance import disturbed, lowered
from stallscope.analysis.finding import Finding
from stallscope.analysis.numbers import fmt_ms
from stallscope.analysis.rules import ALL_RULES, Rule
from stallscope.analysis.transformers_words import in_trainer_words
from stallscope.timeline.stats import SpanStats

#: a span shorter than this, or with fewer steps, is too short to judge: start-up, first-batch and
#: sampler noise are a large part of it, so its findings are marked low confidence
MIN_JUDGED_WALL_S = 1.0
MIN_JUDGED_STEPS = 30


def too_short(span: SpanStats) -> str | None:
    """What to tell the user when ``span`` is too short to judge; None when it is long enough."""
    return too_short_for(span.steps, span.wall_s)


def too_short_for(steps: int, wall_s: float) -> str | None:
    """``too_short`` of a span of ``steps`` steps and ``wall_s`` seconds (a report's summary)."""
    if steps >= MIN_JUDGED_STEPS and wall_s >= MIN_JUDGED_WALL_S:
        return None
    lacking = []
    if steps < MIN_JUDGED_STEPS:
        lacking.append(f"{steps} steps, fewer than {MIN_JUDGED_STEPS}")
    if wall_s < MIN_JUDGED_WALL_S:
        # plain numbers: "0.47 s", "0.045 ms" (never "4.5e-05 s")
        took = f"{wall_s:.2g} s" if wall_s >= 1e-3 else fmt_ms(wall_s)
        lacking.append(f"{took}, under {MIN_JUDGED_WALL_S:g} s")
    return f"too short to judge ({' and '.join(lacking)}): every finding is low confidence"


def diagnose(ctx: Context, rules: Iterable[Rule] = ALL_RULES) -> list[Finding]:
    """Findings worth at least ``min_saving`` of wall time, best first (SPEC §3 ordering); all of
    them low confidence when the span is too short to judge."""
    found = [f for rule in rules if (f := rule(ctx)) is not None]
    if ctx.config.framework == "transformers":
        found = [in_trainer_words(f, ctx) for f in found]
    kept = [f for f in found if f.est_saving_fraction >= ctx.config.min_saving]
    if disturbed(ctx.host_signals, ctx.span):  # other processes' work moved the numbers
        kept = [lowered(f) for f in kept]
    if too_short(ctx.span) is not None:
        kept = [replace(f, confidence="low") for f in kept]
    return sorted(kept, key=lambda f: (-f.est_saving_fraction, f.id))
