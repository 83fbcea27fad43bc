"""``stallscope trace REPORT_OR_DIR -o trace.json [--merge KINETO.json]``: the recent steps as a
Chrome trace (Perfetto, chrome://tracing), alone or written into a torch.profiler trace."""

from __future__ import annotations

import argparse
import json
from typing import Any

from rich.console import Console

from stallscope._exceptions import ReportError
from stallscope.report.safe import plain
from stallscope.report.trace import load_recent, merge, trace, write_json

HELP = "write the recent steps as a Chrome trace (one process per rank) for ui.perfetto.dev"


def add_parser(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser("trace", help=HELP, description=HELP)
    p.add_argument("report", help="path to report.json, or its folder (the ranks' own files there are read too)")
    p.add_argument("-o", "--output", required=True, help="the trace file to write (JSON)")
    p.add_argument(
        "--merge",
        metavar="KINETO.json",
        help="a torch.profiler trace of the same run: write it to --output with StallScope's phases beside its events",
    )
    p.set_defaults(run=run, parser=p)


def run(args: argparse.Namespace, console: Console) -> int:
    report, records = load_recent(args.report)
    if args.merge:
        try:
            with open(args.merge, encoding="utf-8") as fh:
                kineto = json.load(fh)
        except (OSError, UnicodeDecodeError, ValueError) as exc:
            raise ReportError(f"{args.merge}: cannot read the torch.profiler trace ({exc})") from exc
        out, steps = merge(kineto, report, records)
        if steps == 0:
            console.print(
                plain(f"note: no recent step of the report overlaps {args.merge}'s time span; nothing was added"),
                markup=False,
                highlight=False,
            )
    else:
        out = trace(report, records)
        steps = sum(r.steps for r in records)
    path = write_json(out, args.output)
    ranks = len(records)
    console.print(
        plain(f"wrote {path}: {steps} steps of {ranks} rank{'s' if ranks != 1 else ''} (open it in ui.perfetto.dev)"),
        markup=False,
        highlight=False,
        soft_wrap=True,
    )
    return 0
