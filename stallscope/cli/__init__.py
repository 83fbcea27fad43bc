"""Command line: ``stallscope show REPORT`` (``check`` and ``diff`` arrive with the CI gate)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from rich.console import Console

from stallscope._exceptions import ReportError
from stallscope.report.io import load_report
from stallscope.report.render import print_diagnosis


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="stallscope", description="Why is the accelerator waiting?")
    sub = parser.add_subparsers(dest="command", required=True)
    show = sub.add_parser("show", help="render a report as at epoch end")
    show.add_argument("report", help="path to report.json (or its folder)")
    args = parser.parse_args(argv)
    try:
        report = load_report(args.report)
    except ReportError as exc:
        print(f"stallscope: error: {exc}", file=sys.stderr)
        return 2
    print_diagnosis(Console(), "run", report.summary, report.findings, report.notes)
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
