"""How a gate verdict reads: plain lines (logs, ``AssertionError``), rich text, JSON.

``format_verdict`` and ``render_verdict`` build output from a ``Verdict``; ``print_verdict`` is
the only function here that writes.
"""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.text import Text

from stallscope.analysis.regression import Explanation, Verdict
from stallscope.report.render import plain

#: version of the ``--format json`` object; bumped when a field changes meaning or goes away
VERDICT_FORMAT_VERSION = 1


def pct(fraction: float) -> str:
    return f"{fraction:.1%}"


def points(delta: float) -> str:
    """A difference of fractions in percentage points: ``+4.4 pp``."""
    value = round(delta * 100, 1)
    return f"{value + 0.0:+.1f} pp"  # + 0.0 turns -0.0 into 0.0


def headline(verdict: Verdict) -> str:
    """One line: the decision and the numbers behind it."""
    word = "REGRESSION" if verdict.regressed else "OK"
    cur = verdict.current.idle_fraction
    if verdict.baseline is not None and verdict.increase is not None:
        text = (
            f"{word}: accelerator idle {pct(cur)} vs baseline {pct(verdict.baseline.idle_fraction)} "
            f"({points(verdict.increase)}, allowed {points(verdict.settings.max_increase)})"
        )
        if verdict.over_max_idle and verdict.settings.max_idle is not None:
            text += f"; above the {pct(verdict.settings.max_idle)} maximum"
        return text
    limit = verdict.settings.max_idle if verdict.settings.max_idle is not None else 1.0
    relation = "above" if verdict.over_max_idle else "within"
    return f"{word}: accelerator idle {pct(cur)}, {relation} the allowed maximum {pct(limit)}"


def noise_line(verdict: Verdict) -> str | None:
    """The noise check in one sentence, when it ran."""
    iv = verdict.interval
    if iv is None:
        return None
    where = f"{iv.confidence:.0%} bootstrap interval of the increase {points(iv.low)} to {points(iv.high)}"
    where += f" ({iv.current_windows} vs {iv.baseline_windows} windows)"
    if iv.above_zero:
        return f"{where}: above zero, not run-to-run noise"
    if verdict.over_threshold:
        return f"{where}: includes zero, so the increase is within run-to-run noise"
    if iv.high < 0:
        return f"{where}: below zero, idle time went down"
    return f"{where}: includes zero"


def _finding_line(rank: int, e: Explanation) -> str:
    f = e.finding
    extra = []
    if e.grown_phase is not None:
        extra.append(f"about the {e.grown_phase} phase, which grew")
    if e.new:
        extra.append("new since the baseline")
    tail = f"  [{'; '.join(extra)}]" if extra else ""
    return f"{rank}. {f.id}  x{f.est_speedup:.2f} faster (saves {f.est_saving_fraction:.0%} of wall time){tail}"


def _facts(label: str, path: str | None, verdict: Verdict) -> str | None:
    facts = verdict.current if label == "current" else verdict.baseline
    if facts is None:
        return None
    where = f" {path}" if path else ""
    return (
        f"{label:<8}{where}: {facts.steps} steps, {facts.device_kind}, idle from {facts.idle_source}, "
        f"{facts.windows} idle windows"
    )


def verdict_lines(verdict: Verdict, *, current_path: str | None = None, baseline_path: str | None = None) -> list[str]:
    lines = [headline(verdict)]
    if (noise := noise_line(verdict)) is not None:
        lines.append(f"  noise check: {noise}")
    if verdict.baseline is not None and verdict.settings.max_idle is not None and not verdict.over_max_idle:
        lines.append(
            f"  ceiling: idle {pct(verdict.current.idle_fraction)} is within the allowed maximum "
            f"{pct(verdict.settings.max_idle)}"
        )
    if verdict.regressed:
        grown = verdict.grown_phases
        if grown:
            lines.append("  phases that grew (share of wall time, baseline -> current):")
            lines.extend(
                f"    {d.phase:<12} {pct(d.baseline):>6} -> {pct(d.current):>6}  {points(d.delta)}" for d in grown
            )
        if verdict.explanations:
            lines.append("  findings in the current run that explain it, best first:")
            for rank, e in enumerate(verdict.explanations, start=1):
                lines.append(f"    {_finding_line(rank, e)}")
                if e.finding.fix:
                    lines.append(f"       fix: {e.finding.fix}")
        else:
            lines.append("  the current run has no finding that predicts a saving of 2% or more")
    lines.extend(f"  note: {n}" for n in verdict.notes)
    for label, path in (("current", current_path), ("baseline", baseline_path)):
        if (facts := _facts(label, path, verdict)) is not None:
            lines.append(f"  {facts}")
    return lines


def format_verdict(verdict: Verdict, *, current_path: str | None = None, baseline_path: str | None = None) -> str:
    """The verdict as plain lines: what ``check`` prints and what ``stallscope.testing`` raises."""
    return "\n".join(verdict_lines(verdict, current_path=current_path, baseline_path=baseline_path))


def render_verdict(verdict: Verdict, *, current_path: str | None = None, baseline_path: str | None = None) -> Text:
    """The same lines, the headline coloured for terminals."""
    lines = [plain(line) for line in verdict_lines(verdict, current_path=current_path, baseline_path=baseline_path)]
    text = Text(lines[0], style="bold red" if verdict.regressed else "bold green")
    for line in lines[1:]:
        text.append("\n")
        text.append(line, style="dim" if line.lstrip().startswith(("note:", "current", "baseline")) else "")
    return text


def print_verdict(
    console: Console, verdict: Verdict, *, current_path: str | None = None, baseline_path: str | None = None
) -> None:
    console.print(
        render_verdict(verdict, current_path=current_path, baseline_path=baseline_path),
        soft_wrap=True,
        highlight=False,
    )


def verdict_to_dict(
    verdict: Verdict, *, current_path: str | None = None, baseline_path: str | None = None
) -> dict[str, Any]:
    """The machine-readable verdict that ``check --format json`` prints."""

    def facts(which: str, path: str | None) -> dict[str, Any] | None:
        f = verdict.current if which == "current" else verdict.baseline
        if f is None:
            return None
        return {
            "path": path,
            "gpu_idle_fraction": f.idle_fraction,
            "idle_source": f.idle_source,
            "device_kind": f.device_kind,
            "steps": f.steps,
            "idle_windows": f.windows,
            "complete": f.complete,
        }

    iv = verdict.interval
    s = verdict.settings
    return {
        "verdict": "regression" if verdict.regressed else "pass",
        "exit_code": verdict.exit_code,
        "summary": headline(verdict),
        "method": verdict.method,
        "current": facts("current", current_path),
        "baseline": facts("baseline", baseline_path),
        "increase": verdict.increase,
        "max_increase": s.max_increase,
        "over_threshold": verdict.over_threshold,
        "max_idle": s.max_idle,
        "over_max_idle": verdict.over_max_idle,
        "interval": None
        if iv is None
        else {
            "low": iv.low,
            "high": iv.high,
            "confidence": iv.confidence,
            "resamples": iv.resamples,
            "seed": iv.seed,
            "above_zero": iv.above_zero,
        },
        "phase_deltas": [
            {"phase": d.phase, "baseline": d.baseline, "current": d.current, "delta": d.delta}
            for d in verdict.phase_deltas
        ],
        "findings": [
            {
                "id": e.finding.id,
                "title": e.finding.title,
                "est_speedup": e.finding.est_speedup,
                "est_saving_fraction": e.finding.est_saving_fraction,
                "fix": e.finding.fix,
                "suggestion": dict(e.finding.suggestion),
                "new": e.new,
                "grown_phase": e.grown_phase,
            }
            for e in verdict.explanations
        ],
        "notes": list(verdict.notes),
        "format_version": VERDICT_FORMAT_VERSION,
    }
