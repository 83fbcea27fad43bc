"""``stallscope baseline add REPORT --dir DIR [--keep N]``: a rolling history of healthy runs.

``check --baseline DIR`` then compares against every run in the folder, so the gate learns how
much healthy runs of the reference job differ from each other.
"""

from __future__ import annotations

import argparse
from typing import Any

from rich.console import Console

from stallscope.analysis.regression import comparison_problem
from stallscope.cli.check import int_at_least
from stallscope.report.history import add_to_history
from stallscope.report.safe import plain
from stallscope.report.schema import Report

HELP = "keep a rolling history of healthy reports, the baseline folder that check compares against"

DEFAULT_KEEP = 10

EPILOG = f"""\
add copies REPORT into DIR as report-<UTC time>-<hash>.json (atomically: a gate reading DIR at the
same time never sees half a file), then removes the oldest such files beyond the newest --keep
(default {DEFAULT_KEEP}); other files in DIR are left alone. It refuses, with exit 2, a report already in
DIR and one that cannot be compared with the newest run there (another device kind or idle
measurement, step counts more than 2x apart) unless --allow-mismatch is given.

Add a report only after its build passed the gate, e.g. on the main branch:
  stallscope check runs/ci/report.json --baseline ci/baselines && \\
      stallscope baseline add runs/ci/report.json --dir ci/baselines --keep 10"""


def add_parser(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser(
        "baseline",
        help=HELP,
        description=HELP[0].upper() + HELP[1:] + ".",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    actions = p.add_subparsers(dest="action", required=True, metavar="{add}", parser_class=type(p))
    add = actions.add_parser(
        "add",
        help="add a healthy report to a baseline folder, keeping the newest N",
        description="Add a healthy report to a baseline folder, keeping the newest N.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add.add_argument("report", help="the healthy run's report.json (or its folder)")
    add.add_argument("--dir", required=True, metavar="DIR", help="the baseline folder (created when missing)")
    add.add_argument(
        "--keep",
        type=int_at_least(1),
        default=DEFAULT_KEEP,
        metavar="N",
        help=f"reports to keep (default {DEFAULT_KEEP})",
    )
    add.add_argument("--allow-mismatch", action="store_true", help="add it even when it does not match the folder")
    add.set_defaults(run=run, parser=add)


def _mismatch(new: Report, newest: Report) -> str | None:
    return comparison_problem(new, newest, names=("this report", "the newest run there"))


def run(args: argparse.Namespace, console: Console) -> int:
    added = add_to_history(args.report, args.dir, keep=args.keep, mismatch=None if args.allow_mismatch else _mismatch)
    line = f"added {added.path} ({added.reports} report{'s' if added.reports != 1 else ''} in {args.dir}"
    if added.removed:
        line += f"; removed the oldest: {', '.join(p.name for p in added.removed)}"
    console.print(plain(line + ")"), soft_wrap=True, highlight=False, markup=False)
    return 0
