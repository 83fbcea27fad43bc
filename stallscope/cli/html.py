"""``stallscope html REPORT_OR_DIR -o FILE``: the self-contained HTML report (the one a run writes
as ``report.html`` beside its ``report.json``)."""

from __future__ import annotations

import argparse
from typing import Any

from rich.console import Console

from stallscope.report.html import render_report
from stallscope.report.html_io import write_html
from stallscope.report.safe import plain
from stallscope.report.trace import load_recent

HELP = "write the report as one self-contained HTML file (charts, the last steps, the fixes)"


def add_parser(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser("html", help=HELP, description=HELP)
    p.add_argument("report", help="path to report.json, or its folder (the ranks' own files there are read too)")
    p.add_argument("-o", "--output", required=True, help="the HTML file to write")
    p.set_defaults(run=run, parser=p)


def run(args: argparse.Namespace, console: Console) -> int:
    report, records = load_recent(args.report, required=False)
    path = write_html(render_report(report, records), args.output)
    console.print(plain(f"wrote {path}"), markup=False, highlight=False, soft_wrap=True)
    return 0
