"""How a diagnosis looks: a rich panel for terminals, plain lines for logs and files.

``render_panel`` and ``format_text`` build output; only the hooks' epoch-end print and the CLI
write it anywhere (``print_diagnosis``).
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from rich.console import Console, Group, RenderableType
from rich.padding import Padding
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from stallscope.analysis.finding import Finding
from stallscope.report.schema import Summary

_BAR = 28
_MAX_FINDINGS = 5

#: terminal escape sequences (CSI, OSC) and the other control characters but tab and newline
_CONTROL = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)?|[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def plain(text: str) -> str:
    """``text`` safe to print: escape sequences and control characters (a report's strings come
    from the user's code, or from a file) removed, and a lone surrogate (``os.fsdecode`` of a
    file name that is not UTF-8) written as its escape, which any terminal encoding can print."""
    text = _CONTROL.sub("", text)
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        text = text.encode("utf-8", "backslashreplace").decode("utf-8")
    return text


def _phases_by_share(summary: Summary) -> list[tuple[str, float]]:
    items = [(n, f) for n, f in summary.phase_fractions.items() if f >= 0.0005]
    return sorted(items, key=lambda kv: -kv[1])


def _headline(summary: Summary) -> str:
    return (
        f"accelerator idle {summary.gpu_idle_fraction:.0%} ({plain(summary.idle_source)})  ·  "
        f"{summary.steps} steps in {summary.wall_s:.2f} s ({summary.steps_per_s:.1f} steps/s)"
    )


def _gain(f: Finding) -> str:
    return f"x{f.est_speedup:.2f} faster (saves {f.est_saving_fraction:.0%} of wall time)"


def render_panel(
    title: str, summary: Summary, findings: Sequence[Finding], notes: Sequence[str] = (), min_saving: float = 0.02
) -> RenderableType:
    """A rich panel: headline, where the time went (bars), ranked fixes with snippets."""
    bars = Table.grid(padding=(0, 1))
    bars.add_column(no_wrap=True)
    bars.add_column(no_wrap=True)
    bars.add_column(justify="right", no_wrap=True)
    for name, share in _phases_by_share(summary):
        filled = round(share * _BAR)
        style = "red" if name == "data" else "green" if name == "compute" else "yellow"
        bars.add_row(
            Text(plain(name)),  # not rich markup: a phase name is the user's text
            Text("█" * filled, style=style) + Text("░" * (_BAR - filled), style="dim"),
            f"{share:6.1%}",
        )
    parts: list[RenderableType] = [
        Text(_headline(summary), style="bold"),
        Text(""),
        Text("Where the time went"),
        bars,
        Text(""),
    ]
    if findings:
        parts.append(Text("Fixes, best first"))
        for rank, f in enumerate(findings[:_MAX_FINDINGS], start=1):
            parts.append(
                Text.assemble(
                    f" {rank}. ",
                    (plain(f.id), "bold cyan"),
                    f"  {_gain(f)}",
                )
            )
            # the confidence goes with the evidence line, so the headline fits 80 columns; padded
            # blocks keep their indent when a long line wraps
            parts.append(Padding(Text(f"{plain(f.title)} · confidence {f.confidence}", style="dim"), (0, 0, 0, 4)))
            parts.append(Padding(Text(plain(f.fix)), (0, 0, 0, 4)))
            if f.snippet:
                for line in plain(f.snippet).splitlines():
                    parts.append(Text(f"      {line}", style="magenta"))
    else:
        parts.append(Text(f"No fix predicted to save {min_saving:.0%} or more of wall time.", style="green"))
    for note in notes:
        parts.append(Text(f"note: {plain(note)}", style="dim"))
    return Panel(Group(*parts), title=f"StallScope · {title}", title_align="left", expand=False)


def format_text(
    title: str, summary: Summary, findings: Sequence[Finding], notes: Sequence[str] = (), min_saving: float = 0.02
) -> str:
    """The same diagnosis as plain lines, for logs and non-terminals."""
    lines = [f"StallScope · {title}: {_headline(summary)}", "  where the time went:"]
    for name, share in _phases_by_share(summary):
        filled = round(share * _BAR)
        lines.append(f"    {plain(name):<12} {'#' * filled}{'.' * (_BAR - filled)} {share:6.1%}")
    if findings:
        lines.append("  fixes, best first:")
        for rank, f in enumerate(findings[:_MAX_FINDINGS], start=1):
            lines.append(f"    {rank}. {plain(f.id)}  {_gain(f)}  confidence {f.confidence}")
            lines.append(f"       {plain(f.title)}")
            lines.append(f"       {plain(f.fix)}")
            lines.extend(f"         {line}" for line in plain(f.snippet).splitlines())
    else:
        lines.append(f"  no fix predicted to save {min_saving:.0%} or more of wall time")
    lines.extend(f"  note: {plain(note)}" for note in notes)
    return "\n".join(lines)


def print_diagnosis(
    console: Console,
    title: str,
    summary: Summary,
    findings: Sequence[Finding],
    notes: Sequence[str] = (),
    min_saving: float = 0.02,
) -> None:
    """Print a panel on a terminal, plain text anywhere else."""
    if console.is_terminal:
        console.print(render_panel(title, summary, findings, notes, min_saving))
    else:
        console.print(
            format_text(title, summary, findings, notes, min_saving),
            markup=False,
            highlight=False,
            soft_wrap=True,
        )
