"""How a diagnosis looks: a rich panel for terminals, plain lines for logs and files.

``render_panel`` and ``format_text`` build output; only the hooks' epoch-end print and the CLI
write it anywhere (``print_diagnosis``).
"""

from __future__ import annotations

from collections.abc import Sequence

from rich.console import Console, Group, RenderableType
from rich.padding import Padding
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from stallscope.analysis.finding import Finding
from stallscope.report.safe import plain
from stallscope.report.schema import RankEntry, Summary

_BAR = 28
_MAX_FINDINGS = 5


def _phases_by_share(summary: Summary) -> list[tuple[str, float]]:
    items = [(n, f) for n, f in summary.phase_fractions.items() if f >= 0.0005]
    return sorted(items, key=lambda kv: -kv[1])


def _headline(summary: Summary, device: str | None) -> str:
    # on a CPU-only run the CPU computes: its idle time is the training's, not an accelerator's
    what = "CPU (no GPU): training idle" if device == "cpu" else "accelerator idle"
    return (
        f"{what} {summary.gpu_idle_fraction:.0%} ({plain(summary.idle_source)})  ·  "
        f"{summary.steps} steps in {summary.wall_s:.2f} s ({summary.steps_per_s:.1f} steps/s)"
    )


def speedup_text(f: Finding) -> str:
    """``x2.10``, or ``at least x2.10`` for a floor (SPEC §3), wherever a prediction is shown."""
    floor = "at least " if f.est_speedup_bound == "lower" else ""
    return f"{floor}x{f.est_speedup:.2f}"


def gain_text(f: Finding) -> str:
    return f"{speedup_text(f)} faster (saves {f.est_saving_fraction:.0%} of wall time)"


#: columns of the per-rank table of a distributed job (SPEC §3a)
RANK_COLUMNS = ("rank", "host", "steps", "steps/s", "idle", "data", "compute", "largest phase")
#: the columns of numbers (right-justified)
_RANK_NUMBERS = range(2, 7)

#: most ranks listed in the table; a larger job shows the slowest ones
_MAX_RANKS = 16


def rank_rows(ranks: Sequence[RankEntry]) -> list[tuple[str, ...]]:
    """The per-rank table's rows as text: rank, host, steps, steps/s, idle, data %, compute %, and
    the rank's largest phase. Jobs of more than 16 ranks list the 16 slowest (fewest steps/s)."""
    shown = list(ranks)
    if len(shown) > _MAX_RANKS:
        shown = sorted(sorted(shown, key=lambda e: e.steps_per_s)[:_MAX_RANKS], key=lambda e: e.rank)
    rows: list[tuple[str, ...]] = []
    for e in shown:
        fractions = e.phase_fractions
        largest = max(sorted(fractions), key=lambda n: fractions[n]) if fractions else "-"
        rows.append(
            (
                str(e.rank),
                plain(e.host),
                str(e.steps),
                f"{e.steps_per_s:.1f}",
                f"{e.gpu_idle_fraction:.0%}",
                f"{fractions.get('data', 0.0):.0%}",
                f"{fractions.get('compute', 0.0):.0%}",
                f"{plain(largest)} {fractions.get(largest, 0.0):.0%}" if fractions else "-",
            )
        )
    return rows


def render_ranks(ranks: Sequence[RankEntry]) -> Table:
    """The per-rank table as a rich table."""
    table = Table(box=None, padding=(0, 1), show_edge=False)
    for i, name in enumerate(RANK_COLUMNS):
        table.add_column(name, justify="right" if i in _RANK_NUMBERS else "left", no_wrap=True)
    for row in rank_rows(ranks):
        table.add_row(*row)
    return table


def format_ranks(ranks: Sequence[RankEntry]) -> list[str]:
    """The per-rank table as plain lines."""
    rows = [RANK_COLUMNS, *rank_rows(ranks)]
    widths = [max(len(r[i]) for r in rows) for i in range(len(RANK_COLUMNS))]
    return [
        "  ".join(
            cell.rjust(w) if i in _RANK_NUMBERS else cell.ljust(w)
            for i, (cell, w) in enumerate(zip(row, widths, strict=True))
        ).rstrip()
        for row in rows
    ]


def render_panel(
    title: str,
    summary: Summary,
    findings: Sequence[Finding],
    notes: Sequence[str] = (),
    min_saving: float = 0.02,
    *,
    device: str | None = None,
    ranks: Sequence[RankEntry] = (),
) -> RenderableType:
    """A rich panel: headline, where the time went (bars), ranked fixes with snippets. ``device``:
    the run's device kind (``RunInfo.device.kind``), which names what was idle."""
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
        Text(_headline(summary, device), style="bold"),
        Text(""),
        Text("Where the time went"),
        bars,
        Text(""),
    ]
    if ranks:
        parts += [Text("Ranks"), render_ranks(ranks), Text("")]
    if findings:
        parts.append(Text("Fixes, best first"))
        for rank, f in enumerate(findings[:_MAX_FINDINGS], start=1):
            parts.append(
                Text.assemble(
                    f" {rank}. ",
                    (plain(f.id), "bold cyan"),
                    f"  {gain_text(f)}",
                )
            )
            # the confidence goes with the evidence line, so the headline fits 80 columns; padded
            # blocks keep their indent when a long line wraps
            parts.append(Padding(Text(f"{plain(f.title)} · confidence {f.confidence}", style="dim"), (0, 0, 0, 4)))
            parts.append(Padding(Text(plain(f.fix)), (0, 0, 0, 4)))
            if f.snippet:
                for line in f.snippet.splitlines():  # each line of the snippet on its own
                    parts.append(Text(f"      {plain(line)}", style="magenta"))
    else:
        parts.append(Text(f"No fix predicted to save {min_saving:.0%} or more of wall time.", style="green"))
    for note in notes:
        parts.append(Text(f"note: {plain(note)}", style="dim"))
    # the title may quote the user's text (an exception's message): not rich markup
    return Panel(Group(*parts), title=Text(f"StallScope · {plain(title)}"), title_align="left", expand=False)


def format_text(
    title: str,
    summary: Summary,
    findings: Sequence[Finding],
    notes: Sequence[str] = (),
    min_saving: float = 0.02,
    *,
    device: str | None = None,
    ranks: Sequence[RankEntry] = (),
) -> str:
    """The same diagnosis as plain lines, for logs and non-terminals."""
    lines = [f"StallScope · {plain(title)}: {_headline(summary, device)}", "  where the time went:"]
    for name, share in _phases_by_share(summary):
        filled = round(share * _BAR)
        lines.append(f"    {plain(name):<12} {'#' * filled}{'.' * (_BAR - filled)} {share:6.1%}")
    if ranks:
        lines.append("  ranks:")
        lines.extend(f"    {line}" for line in format_ranks(ranks))
    if findings:
        lines.append("  fixes, best first:")
        for rank, f in enumerate(findings[:_MAX_FINDINGS], start=1):
            lines.append(f"    {rank}. {plain(f.id)}  {gain_text(f)}  confidence {f.confidence}")
            lines.append(f"       {plain(f.title)}")
            lines.append(f"       {plain(f.fix)}")
            lines.extend(f"         {plain(line)}" for line in f.snippet.splitlines())
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
    *,
    device: str | None = None,
    ranks: Sequence[RankEntry] = (),
) -> None:
    """Print a panel on a terminal, plain text anywhere else; a job's report also has its ranks."""
    if console.is_terminal:
        console.print(render_panel(title, summary, findings, notes, min_saving, device=device, ranks=ranks))
    else:
        console.print(
            format_text(title, summary, findings, notes, min_saving, device=device, ranks=ranks),
            markup=False,
            highlight=False,
            soft_wrap=True,
        )
