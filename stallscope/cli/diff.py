"""``stallscope diff A B``: two reports side by side (headline, phase fractions, findings)."""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from typing import Any

from rich.console import Console, Group, RenderableType
from rich.table import Table
from rich.text import Text

from stallscope.analysis.finding import Finding
from stallscope.analysis.regression import comparison_problem
from stallscope.cli.verdict import pct, points, rounded
from stallscope.report.io import load_report
from stallscope.report.render import speedup_text
from stallscope.report.safe import plain
from stallscope.report.schema import Report

HELP = "show two reports side by side: idle fraction, phase fractions, findings"

#: phases below this share in both runs are left out of the table
_MIN_SHARE = 0.0005


@dataclass(frozen=True)
class Row:
    """One line of the comparison; ``section`` rows are headings."""

    label: str
    a: str = ""
    b: str = ""
    change: str = ""
    section: bool = False


def _finding_cell(f: Finding | None) -> str:
    return "-" if f is None else f"{speedup_text(f)} ({f.est_saving_fraction:.0%})"


def diff_rows(a: Report, b: Report) -> list[Row]:
    """The comparison's rows; every string from a report is already ``plain``."""
    sa, sb = a.summary, b.summary
    speed = f"x{sb.steps_per_s / sa.steps_per_s:.2f}" if sa.steps_per_s > 0 else ""
    rows = [
        Row(
            "accelerator idle",
            pct(sa.gpu_idle_fraction),
            pct(sb.gpu_idle_fraction),
            points(sb.gpu_idle_fraction - sa.gpu_idle_fraction),
        ),
        Row("idle measured by", plain(sa.idle_source), plain(sb.idle_source)),
        Row("device", plain(a.run.device.kind), plain(b.run.device.kind)),
        Row("steps", str(sa.steps), str(sb.steps)),
        Row("steps/s", f"{sa.steps_per_s:.2f}", f"{sb.steps_per_s:.2f}", speed),
        Row("wall time", f"{sa.wall_s:.2f} s", f"{sb.wall_s:.2f} s"),
        Row("idle windows", str(len(sa.idle_windows)), str(len(sb.idle_windows))),
        Row("phases (share of wall time)", section=True),
    ]
    names = list(dict.fromkeys([*sa.phase_fractions, *sb.phase_fractions]))
    for name in names:
        fa, fb = sa.phase_fractions.get(name, 0.0), sb.phase_fractions.get(name, 0.0)
        if fa >= _MIN_SHARE or fb >= _MIN_SHARE:
            rows.append(Row(plain(name), pct(fa), pct(fb), points(fb - fa)))
    rows.append(Row("findings (speedup, time saved)", section=True))
    ids = list(dict.fromkeys([*(f.id for f in b.findings), *(f.id for f in a.findings)]))
    if not ids:
        rows.append(Row("none", "-", "-"))
    for fid in ids:
        fa_, fb_ = a.finding(fid), b.finding(fid)
        change = "new in B" if fa_ is None else "gone in B" if fb_ is None else ""
        rows.append(Row(plain(fid), _finding_cell(fa_), _finding_cell(fb_), change))
    return rows


def diff_notes(a: Report, b: Report) -> list[str]:
    problem = comparison_problem(b, a, names=("B", "A"))
    return [] if problem is None else [f"these runs may not be comparable: {problem}"]


def format_diff(a: Report, b: Report, a_path: str = "A", b_path: str = "B") -> str:
    """Plain aligned columns, for logs and non-terminals."""
    rows = diff_rows(a, b)
    width = max(len(r.label) for r in rows if not r.section)
    cols = [max([len(getattr(r, c)) for r in rows] + [1]) for c in ("a", "b")]
    lines = [
        f"StallScope diff  A: {plain(a_path)}  B: {plain(b_path)}",
        f"  {'':<{width}}  {'A':>{cols[0]}}  {'B':>{cols[1]}}",
    ]
    for r in rows:
        if r.section:
            lines.append(f"  {r.label}:")
        else:
            lines.append(f"  {r.label:<{width}}  {r.a:>{cols[0]}}  {r.b:>{cols[1]}}  {r.change}".rstrip())
    lines.extend(f"  note: {plain(n)}" for n in diff_notes(a, b))
    return "\n".join(lines)


def render_diff(a: Report, b: Report, a_path: str = "A", b_path: str = "B") -> RenderableType:
    """A rich table of the same rows."""
    table = Table(title=Text(f"StallScope diff  A: {plain(a_path)}  B: {plain(b_path)}"), title_justify="left")
    table.add_column("")
    table.add_column("A", justify="right")
    table.add_column("B", justify="right")
    table.add_column("change", justify="right")
    for r in diff_rows(a, b):  # Text, not str: a phase name from a report is not rich markup
        if r.section:
            table.add_section()
            table.add_row(Text(r.label, style="bold"))
        else:
            style = "red" if r.change.startswith("+") and r.label == "accelerator idle" else ""
            table.add_row(Text(r.label), Text(r.a), Text(r.b), Text(r.change, style=style))
    notes = [Text(f"note: {plain(n)}", style="yellow") for n in diff_notes(a, b)]
    return Group(table, *notes)


def print_diff(console: Console, a: Report, b: Report, a_path: str = "A", b_path: str = "B") -> None:
    if console.is_terminal:
        console.print(render_diff(a, b, a_path, b_path))
    else:
        console.print(format_diff(a, b, a_path, b_path), markup=False, highlight=False, soft_wrap=True)


def diff_to_dict(a: Report, b: Report, a_path: str, b_path: str) -> dict[str, Any]:
    sa, sb = a.summary, b.summary
    names = list(dict.fromkeys([*sa.phase_fractions, *sb.phase_fractions]))
    ids = list(dict.fromkeys([*(f.id for f in b.findings), *(f.id for f in a.findings)]))

    def finding(f: Finding | None) -> dict[str, Any] | None:
        if f is None:
            return None
        return {"est_speedup": f.est_speedup, "est_saving_fraction": f.est_saving_fraction, "fix": f.fix}

    return {
        "a": {"path": a_path, "gpu_idle_fraction": sa.gpu_idle_fraction, "steps": sa.steps},
        "b": {"path": b_path, "gpu_idle_fraction": sb.gpu_idle_fraction, "steps": sb.steps},
        "idle_change": rounded(sb.gpu_idle_fraction - sa.gpu_idle_fraction),
        "phases": [
            {
                "phase": n,
                "a": sa.phase_fractions.get(n, 0.0),
                "b": sb.phase_fractions.get(n, 0.0),
                "change": rounded(sb.phase_fractions.get(n, 0.0) - sa.phase_fractions.get(n, 0.0)),
            }
            for n in names
        ],
        "findings": [{"id": i, "a": finding(a.finding(i)), "b": finding(b.finding(i))} for i in ids],
        "notes": diff_notes(a, b),
    }


def add_parser(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser("diff", help=HELP, description=HELP)
    p.add_argument("a", metavar="A", help="a report.json (or its folder), e.g. the baseline")
    p.add_argument("b", metavar="B", help="another report.json (or its folder), e.g. the current run")
    p.add_argument("--format", choices=("text", "json"), default="text", help="output format (default text)")
    p.set_defaults(run=run, parser=p)


def run(args: argparse.Namespace, console: Console) -> int:
    a = load_report(args.a)
    b = load_report(args.b)
    if args.format == "json":
        sys.stdout.write(json.dumps(diff_to_dict(a, b, args.a, args.b), indent=2) + "\n")
    else:
        print_diff(console, a, b, args.a, args.b)
    return 0
