"""``stallscope show REPORT [--epochs]``: render a report as at epoch end."""

from __future__ import annotations

import argparse
from typing import Any

from rich.console import Console

from stallscope.report.io import load_report
from stallscope.report.render import print_diagnosis

HELP = "render a report as at epoch end"


def add_parser(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser("show", help=HELP, description=HELP)
    p.add_argument("report", help="path to report.json (or its folder)")
    p.add_argument("--epochs", action="store_true", help="render each epoch's panel too, before the run's")
    p.set_defaults(run=run, parser=p)


def run(args: argparse.Namespace, console: Console) -> int:
    report = load_report(args.report)
    device = report.run.device.kind
    if args.epochs:
        for epoch in report.epochs:
            print_diagnosis(console, f"epoch {epoch.index}", epoch.summary, epoch.findings, device=device)
    epochs = len(report.epochs)
    title = "run" if epochs == 0 else f"run ({epochs} epoch{'s' if epochs > 1 else ''})"
    if report.ranks:
        title = f"{title} · job of {len(report.ranks)} ranks"
    print_diagnosis(console, title, report.summary, report.findings, report.notes, ranks=report.ranks, device=device)
    return 0
