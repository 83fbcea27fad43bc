"""GitHub Actions output for ``check --github``: a markdown step summary and an annotation.

Pure formatting; ``stallscope.cli.check`` decides where it goes (``$GITHUB_STEP_SUMMARY``, stdout).
Workflow commands are documented at
https://docs.github.com/actions/reference/workflow-commands-for-github-actions
"""

from __future__ import annotations

import secrets

from stallscope.analysis.regression import Verdict
from stallscope.cli.verdict import Paths, close_line, headline, noise_line, pct, points, spread_lines
from stallscope.report.render import speedup_text
from stallscope.report.safe import plain

TITLE = "StallScope: accelerator idle time regressed"
ERROR_TITLE = "StallScope check could not run"


def escape_data(text: str) -> str:
    """Escape a workflow command's message (``%``, CR, LF)."""
    return text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def escape_property(text: str) -> str:
    """Escape a workflow command's property value (the message's escapes plus ``:`` and ``,``)."""
    return escape_data(text).replace(":", "%3A").replace(",", "%2C")


def annotation(level: str, title: str, message: str) -> str:
    """``::error title=...::message``, escaped: the message may quote a report or a path, so it is
    ``plain`` first (no control characters, no line of its own), then escaped as GitHub documents."""
    return f"::{level} title={escape_property(plain(title))}::{escape_data(plain(message))}"


def stop_commands() -> tuple[str, str]:
    """The lines around untrusted text printed to a GitHub runner's log: ``::stop-commands::TOKEN``
    turns workflow commands off until ``::TOKEN::``; the token is new and random each time, so the
    text cannot know it. A second guard beside ``plain``, which already keeps ``::`` out."""
    token = secrets.token_hex(16)
    return f"::stop-commands::{token}", f"::{token}::"


def verdict_annotation(verdict: Verdict) -> str | None:
    """An error annotation for a regression (None when the check passed)."""
    if not verdict.regressed:
        return None
    message = headline(verdict)
    if verdict.explanations:
        top = verdict.explanations[0].finding
        message += f". Top fix: {top.id} ({speedup_text(top)} faster): {top.fix}"
    return annotation("error", TITLE, message)


def error_annotation(message: str) -> str:
    return annotation("error", ERROR_TITLE, message)


def _cell(text: str) -> str:
    """A report's or a path's text in a markdown table cell or line."""
    return plain(text).replace("|", "\\|").replace("`", "'")


def _paths(paths: Paths) -> str | None:
    if paths is None or isinstance(paths, str):
        return paths
    return ", ".join(paths)


def format_step_summary(verdict: Verdict, *, current_path: Paths = None, baseline_path: Paths = None) -> str:
    """Markdown for ``$GITHUB_STEP_SUMMARY``."""
    mark = "❌ regression" if verdict.regressed else "✅ passed"
    lines = [f"### StallScope check: {mark}", "", _cell(headline(verdict)), ""]
    if verdict.baseline_idle is not None and verdict.increase is not None:
        lines += [
            "| | baseline | current | change |",
            "|---|---:|---:|---:|",
            f"| **accelerator idle** | {pct(verdict.baseline_idle)} | "
            f"{pct(verdict.current_idle)} | {points(verdict.increase)} |",
        ]
        lines += [
            f"| {_cell(d.phase)} | {pct(d.baseline)} | {pct(d.current)} | {points(d.delta)} |"
            for d in verdict.phase_deltas
            if d.baseline >= 0.0005 or d.current >= 0.0005
        ]
        lines.append("")
    if spread := spread_lines(verdict):
        lines += [*(f"{_cell(line)}  " for line in spread), ""]
    if (close := close_line(verdict)) is not None:
        lines += [f"**{_cell(close)}**", ""]
    if (noise := noise_line(verdict)) is not None:
        lines += [f"Windows (within-run evidence): {_cell(noise)}.", ""]
    if verdict.explanations and verdict.regressed:
        lines += ["**Findings in the current run** (about a phase that grew first, then best first)", ""]
        for rank, e in enumerate(verdict.explanations, start=1):
            f = e.finding
            new = " (new since the baseline)" if e.new else ""
            lines.append(f"{rank}. `{f.id}`: {speedup_text(f)} faster{new}. {_cell(f.fix)}")
        lines.append("")
    lines += [f"> {_cell(n)}" for n in verdict.notes]
    cur, base = (None if p is None else _cell(p) for p in (_paths(current_path), _paths(baseline_path)))
    where = [f"current `{cur}`"] if cur else []
    if base:
        where.append(f"baseline `{base}`")
    if where:
        lines += ["", "Reports: " + ", ".join(where)]
    return "\n".join(lines).rstrip() + "\n\n"


def format_error_summary(message: str) -> str:
    return f"### StallScope check: ⚠️ could not run\n\n{_cell(message)}\n\n"
