"""``stallscope show REPORT [--epochs]``: render a report as at epoch end."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import Any

from rich.console import Console

from stallscope.analysis.diagnose import too_short_for
from stallscope.analysis.finding import Finding
from stallscope.report.io import load_report
from stallscope.report.job import consecutive_summary
from stallscope.report.render import print_diagnosis
from stallscope.report.schema import EpochReport, Summary

HELP = "render a report as at epoch end"


def add_parser(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser("show", help=HELP, description=HELP)
    p.add_argument("report", help="path to report.json (or its folder)")
    p.add_argument("--epochs", action="store_true", help="render each epoch's panel too, before the run's")
    p.set_defaults(run=run, parser=p)


def epoch_panels(
    epochs: Sequence[EpochReport],
) -> list[tuple[str, Summary, tuple[Finding, ...], tuple[str, ...]]]:
    """The epoch panels of a report, as the run printed them: one per diagnosis. Epochs diagnosed
    together (SPEC §3: ``covers_epochs``, ``diagnosed_with``) share the panel of the epoch that
    closed their group, "epochs first–last", with their numbers together; an epoch whose group
    had not closed when the report was written has its own, which says so."""
    panels: list[tuple[str, Summary, tuple[Finding, ...], tuple[str, ...]]] = []
    waiting: list[EpochReport] = []  # the epochs of the group being read
    for epoch in epochs:
        if epoch.diagnosed_with is not None:
            waiting.append(epoch)
            continue
        covers = epoch.covers_epochs
        parts = [e for e in waiting if covers is not None and covers[0] <= e.index] + [epoch]
        for e in waiting:
            if e not in parts:  # its group's last epoch is not in the report
                panels.append((f"epoch {e.index}", e.summary, (), (f"diagnosed with epoch {e.diagnosed_with}",)))
        waiting = []
        summary = consecutive_summary([e.summary for e in parts])
        notes: tuple[str, ...] = ()
        if covers is not None:
            title = f"epochs {covers[0]}–{covers[1]}"
            if len(parts) < covers[1] - covers[0] + 1:
                notes = (f"{len(parts)} of the {covers[1] - covers[0] + 1} epochs are in the report",)
        else:
            title = f"epoch {epoch.index}"
            short = too_short_for(summary.steps, summary.wall_s) if summary.steps > 0 else None
            if short is not None:
                notes = (short,)
        panels.append((title, summary, epoch.findings, notes))
    for e in waiting:
        panels.append((f"epoch {e.index}", e.summary, (), (f"diagnosed with epoch {e.diagnosed_with}",)))
    return panels


def run(args: argparse.Namespace, console: Console) -> int:
    report = load_report(args.report)
    device = report.run.device.kind
    if args.epochs:
        for title, summary, findings, notes in epoch_panels(report.epochs):
            print_diagnosis(console, title, summary, findings, notes, device=device)
    epochs = len(report.epochs)
    title = "run" if epochs == 0 else f"run ({epochs} epoch{'s' if epochs > 1 else ''})"
    if report.ranks:
        title = f"{title} · job of {len(report.ranks)} ranks"
    print_diagnosis(console, title, report.summary, report.findings, report.notes, ranks=report.ranks, device=device)
    return 0
