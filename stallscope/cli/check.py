"""``stallscope check REPORT --baseline BASELINE``: the CI gate (SPEC §5)."""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable
from typing import Any

from rich.console import Console

from stallscope.analysis.regression import (
    DEFAULT_FALSE_ALARM,
    DEFAULT_MAX_INCREASE,
    MIN_WINDOWS,
    GateSettings,
    Verdict,
    compare,
    compare_paired,
)
from stallscope.cli import check_html, github
from stallscope.cli.verdict import Paths, print_verdict, verdict_to_dict
from stallscope.report.history import load_reports
from stallscope.report.safe import plain

HELP = "exit 1 when the accelerator's idle fraction regressed against a baseline report"

DESCRIPTION = """\
Compare a run's report with healthy baseline runs of the same reference job (or a fixed
ceiling) and exit 1 when the accelerator's idle fraction regressed, printing the numbers, the
baseline runs' spread, the bound that was crossed, the phases that grew and the current run's
findings that explain it."""

EPILOG = f"""\
how the verdict is made:
  increase     current idle fraction minus the mean of the baseline runs' (the reports'
               headline numbers, gpu_idle_fraction).
  threshold    a regression needs increase > --max-increase (default {DEFAULT_MAX_INCREASE}, i.e. 2
               percentage points): the size of change that matters to you.
  bound        with 3 or more baseline runs (--baseline repeated, or a folder of reports), a
               regression also needs the current idle fraction above the healthy runs'
               one-sided prediction bound, mean + t x sd x sqrt(1 + 1/n), t being Student's t
               quantile at 1 - --false-alarm (default {DEFAULT_FALSE_ALARM:.0%}) with n - 1 degrees of freedom:
               a healthy rerun crosses it only that often. With 1 or 2 baseline runs the
               between-run noise is unknown, the threshold alone decides and the output says so.
  paired       --paired: REPORT... are runs of the head commit and the baselines runs of the
               base commit, made in pairs on the same machine (the i-th of each together). The
               mean of the pairs' differences must exceed the threshold and, with 3 or more
               pairs, t x sd / sqrt(n) (a one-sided paired t-test at --false-alarm).
  windows      within-run evidence, shown but never deciding: a moving-block bootstrap (2000
               resamples, fixed seed, blocks of about n^(1/3) neighbouring windows) of the
               increase from the runs' idle windows (each needs --min-windows, default {MIN_WINDOWS}).
  ceiling      --max-idle X fails whenever the current idle fraction is above X, with or
               without a baseline.

runs that cannot be compared (CPU vs GPU, a different idle measurement, step counts more than
2x apart, no steps) are an error (exit 2) unless --allow-mismatch is given.

exit status:
  0  no regression
  1  regression
  2  usage error, missing / unreadable / wrong-schema report, or runs that cannot be compared
     (a one-line message on stderr)

examples:
  stallscope check runs/ci/report.json --baseline ci/baselines/
  stallscope check runs/ci --baseline b1.json --baseline b2.json --baseline b3.json --github
  stallscope check --paired head-1 head-2 head-3 --baseline base-1 --baseline base-2 --baseline base-3
  stallscope check runs/ci/report.json --max-idle 0.30 --format json"""


def fraction(text: str) -> float:
    """An argparse type: ``0.02`` or ``2%``."""
    raw = text.strip()
    try:
        value = float(raw[:-1]) / 100 if raw.endswith("%") else float(raw)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not 0.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError(f"must be a fraction in [0, 1], like 0.3 or 30%, got {text!r}")
    return value


def false_alarm(text: str) -> float:
    value = fraction(text)
    if not 0.0 < value <= 0.5:
        raise argparse.ArgumentTypeError(f"must be above 0 and at most 0.5, like 0.01 or 1%, got {text!r}")
    return value


def int_at_least(minimum: int) -> Callable[[str], int]:
    """An argparse type: a whole number >= ``minimum``."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be >= {minimum}, got {text!r}")
        return value

    return parse


def add_parser(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser(
        "check",
        help=HELP,
        description=DESCRIPTION,
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "report", nargs="+", help="the current run's report.json (or its folder); with --paired, the head runs'"
    )
    p.add_argument(
        "--baseline",
        metavar="BASELINE",
        action="append",
        help="a healthy run's report.json, the folder of one, or a folder of several runs' reports; repeatable",
    )
    p.add_argument(
        "--paired",
        action="store_true",
        help="the reports are head-commit runs, each made next to the baseline (base-commit run) of the same rank",
    )
    p.add_argument(
        "--false-alarm",
        type=false_alarm,
        default=DEFAULT_FALSE_ALARM,
        metavar="FRACTION",
        help=f"how often a healthy run may fail, with 3+ baseline runs or pairs (default {DEFAULT_FALSE_ALARM:.0%}%)",
    )
    p.add_argument(
        "--max-increase",
        type=fraction,
        default=DEFAULT_MAX_INCREASE,
        metavar="FRACTION",
        help=f"largest allowed increase of the idle fraction (default {DEFAULT_MAX_INCREASE} = 2 points)",
    )
    p.add_argument(
        "--max-idle", type=fraction, metavar="FRACTION", help="fail when the current idle fraction is above this"
    )
    p.add_argument(
        "--min-windows",
        type=int_at_least(2),
        default=MIN_WINDOWS,
        metavar="N",
        help=f"idle windows each report needs for the within-run evidence (default {MIN_WINDOWS})",
    )
    p.add_argument("--format", choices=("text", "json"), default="text", help="output format (default text)")
    p.add_argument(
        "--github",
        action="store_true",
        help="also append markdown to $GITHUB_STEP_SUMMARY and print an ::error annotation on failure",
    )
    p.add_argument("--allow-mismatch", action="store_true", help="compare runs even when they do not look comparable")
    check_html.add_argument(p)
    p.set_defaults(run=run, parser=p)


def run(args: argparse.Namespace, console: Console) -> int:
    if args.baseline is None and args.max_idle is None:
        args.parser.error("give --baseline BASELINE, --max-idle FRACTION, or both")
    if args.paired and args.baseline is None:
        args.parser.error("--paired needs the base commit's runs as --baseline")
    if len(args.report) > 1 and not args.paired:
        args.parser.error(f"one REPORT to check, got {len(args.report)} (several are head runs only with --paired)")
    settings = GateSettings(
        max_increase=args.max_increase,
        max_idle=args.max_idle,
        false_alarm=args.false_alarm,
        min_windows=args.min_windows,
    )
    current_names, currents = load_reports(args.report)
    base_names, bases = load_reports(args.baseline) if args.baseline is not None else ([], [])
    verdict: Verdict
    if args.paired:
        if len(currents) != len(bases):
            args.parser.error(f"--paired needs as many head runs as base runs, got {len(currents)} and {len(bases)}")
        verdict = compare_paired(
            currents,
            bases,
            settings,
            allow_mismatch=args.allow_mismatch,
            head_names=[f"head run {p}" for p in current_names],
            base_names=[f"base run {p}" for p in base_names],
        )
    else:
        if len(currents) != 1:
            args.parser.error(f"{args.report[0]} holds {len(currents)} reports; give one run to check")
        verdict = compare(
            currents[0],
            bases or None,
            settings,
            allow_mismatch=args.allow_mismatch,
            baseline_names=None if len(base_names) < 2 else [f"baseline run {p}" for p in base_names],
        )
    paths: dict[str, Paths] = {
        "current_path": args.report[0] if len(args.report) == 1 else args.report,
        "baseline_path": None
        if args.baseline is None
        else args.baseline[0]
        if len(args.baseline) == 1
        else args.baseline,
    }
    check_html.write(args, verdict_to_dict(verdict, **paths))
    if args.format == "json":
        sys.stdout.write(json.dumps(verdict_to_dict(verdict, **paths), indent=2) + "\n")
    elif args.github:  # the verdict quotes the reports: no workflow command inside it
        stop, resume = github.stop_commands()
        sys.stdout.write(stop + "\n")
        sys.stdout.flush()
        print_verdict(console, verdict, **paths)
        console.file.flush()
        sys.stdout.write(resume + "\n")
    else:
        print_verdict(console, verdict, **paths)
    if args.github:
        append_step_summary(github.format_step_summary(verdict, **paths))
        if (line := github.verdict_annotation(verdict)) is not None:
            sys.stdout.write(line + "\n")
    return verdict.exit_code


def report_error(args: argparse.Namespace, message: str) -> None:
    """The machine-facing side of an exit-2 failure (the one-line stderr message is main's)."""
    if args.format == "json":
        sys.stdout.write(json.dumps({"verdict": "error", "exit_code": 2, "error": message}, indent=2) + "\n")
    if args.github:
        append_step_summary(github.format_error_summary(message))
        sys.stdout.write(github.error_annotation(message) + "\n")


def append_step_summary(markdown: str) -> None:
    """Append to ``$GITHUB_STEP_SUMMARY`` when it is set; a failure to write is only a warning."""
    path = os.environ.get("GITHUB_STEP_SUMMARY")
    if not path:
        return
    try:
        with open(path, "a", encoding="utf-8") as fh:
            fh.write(markdown)
    except OSError as exc:
        why = plain(f"cannot write GITHUB_STEP_SUMMARY {path}: {exc.strerror or exc}")
        print(f"stallscope: warning: {why}", file=sys.stderr)
