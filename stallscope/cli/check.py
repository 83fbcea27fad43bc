"""``stallscope check REPORT --baseline BASELINE``: the CI gate (SPEC §5)."""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

from rich.console import Console

from stallscope.analysis.regression import DEFAULT_MAX_INCREASE, MIN_WINDOWS, GateSettings, compare
from stallscope.cli import github
from stallscope.cli.verdict import print_verdict, verdict_to_dict
from stallscope.report.io import load_report
from stallscope.report.schema import Report

HELP = "exit 1 when the accelerator's idle fraction regressed against a baseline report"

DESCRIPTION = """\
Compare a run's report with a baseline report (or a fixed ceiling) and exit 1 when the
accelerator's idle fraction regressed, printing the numbers, the phases that grew and the
current run's findings that explain it."""

EPILOG = f"""\
how the verdict is made:
  increase     current idle fraction minus baseline idle fraction (the reports' headline
               numbers, gpu_idle_fraction).
  threshold    a regression needs increase > --max-increase (default {DEFAULT_MAX_INCREASE}, i.e. 2
               percentage points). This absorbs the noise a single run cannot see: other jobs
               on the machine, clock speeds, caches.
  noise check  every report holds the idle fraction of consecutive windows of steps. When both
               reports have at least --min-windows windows (default {MIN_WINDOWS}), a bootstrap
               resamples each run's windows with replacement 2000 times; the differences of the
               wall-time weighted means of the resamples give a 95% percentile interval (a fixed
               seed, so the same two reports always get the same verdict). A regression then also needs
               the whole interval above zero: an increase that the variation between windows
               explains is noise. With fewer windows the threshold alone decides, and the
               output says so.
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
  stallscope check runs/ci/report.json --baseline ci/baseline.json
  stallscope check runs/ci --baseline ci/baseline.json --max-increase 0.05 --github
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


def min_windows(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if value < 2:
        raise argparse.ArgumentTypeError(f"must be >= 2, got {text!r}")
    return value


def add_parser(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser(
        "check",
        help=HELP,
        description=DESCRIPTION,
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("report", help="the current run's report.json (or its folder)")
    p.add_argument("--baseline", metavar="BASELINE", help="the baseline report.json (or its folder)")
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
        type=min_windows,
        default=MIN_WINDOWS,
        metavar="N",
        help=f"idle windows each report needs for the noise check (default {MIN_WINDOWS})",
    )
    p.add_argument("--format", choices=("text", "json"), default="text", help="output format (default text)")
    p.add_argument(
        "--github",
        action="store_true",
        help="also append markdown to $GITHUB_STEP_SUMMARY and print an ::error annotation on failure",
    )
    p.add_argument("--allow-mismatch", action="store_true", help="compare runs even when they do not look comparable")
    p.set_defaults(run=run, parser=p)


def run(args: argparse.Namespace, console: Console) -> int:
    if args.baseline is None and args.max_idle is None:
        args.parser.error("give --baseline BASELINE, --max-idle FRACTION, or both")
    current: Report = load_report(args.report)
    baseline: Report | None = load_report(args.baseline) if args.baseline is not None else None
    settings = GateSettings(max_increase=args.max_increase, max_idle=args.max_idle, min_windows=args.min_windows)
    verdict = compare(current, baseline, settings, allow_mismatch=args.allow_mismatch)
    paths = {"current_path": str(args.report), "baseline_path": args.baseline}
    if args.format == "json":
        sys.stdout.write(json.dumps(verdict_to_dict(verdict, **paths), indent=2) + "\n")
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
        print(f"stallscope: warning: cannot write GITHUB_STEP_SUMMARY {path}: {exc.strerror or exc}", file=sys.stderr)
