"""Run every rule over a span and rank what they find."""

from __future__ import annotations

from collections.abc import Iterable

from stallscope.analysis.context import Context
from stallscope.analysis.disturbance import disturbed, lowered
from stallscope.analysis.finding import Finding
from stallscope.analysis.rules import ALL_RULES, Rule


def diagnose(ctx: Context, rules: Iterable[Rule] = ALL_RULES) -> list[Finding]:
    """Findings worth at least ``min_saving`` of wall time, best first (SPEC §3 ordering)."""
    found = [f for rule in rules if (f := rule(ctx)) is not None]
    kept = [f for f in found if f.est_saving_fraction >= ctx.config.min_saving]
    if disturbed(ctx.host_signals):  # other processes' work moved the numbers
        kept = [lowered(f) for f in kept]
    return sorted(kept, key=lambda f: (-f.est_saving_fraction, f.id))
