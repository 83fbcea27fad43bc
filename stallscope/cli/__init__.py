"""The ``stallscope`` command: ``show``, ``check`` (the CI gate), ``diff``, ``baseline``, ``trace``,
``html`` and ``tune``.

One module per command; each has ``add_parser(subparsers)`` and ``run(args, console) -> int``.
``main`` owns the exit status (SPEC §5): 0 no regression, 1 regression, 2 for a usage error or
any failure to read or compare reports, always as one line on stderr, never a traceback. An
unexpected internal error also exits 2, so that a bug can never read as a pass (0) or a
regression (1); ``STALLSCOPE_DEBUG=1`` adds its traceback.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import traceback
from collections.abc import Sequence
from typing import NoReturn

from rich.console import Console

from stallscope._exceptions import StallScopeError
from stallscope._version import __version__
from stallscope.cli import baseline, check, diff, show, tune
from stallscope.cli import html as html_cmd
from stallscope.cli import trace as trace_cmd
from stallscope.report.safe import plain

EXIT_OK = 0
EXIT_REGRESSION = 1
EXIT_ERROR = 2


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line on stderr (SPEC §5), then exit 2."""

    def error(self, message: str) -> NoReturn:
        _error(f"{message} (see '{self.prog} --help')")
        raise SystemExit(EXIT_ERROR)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="stallscope",
        description="Why is the accelerator waiting? Show, compare and gate StallScope reports.",
        epilog="exit status: 0 ok, 1 regression (check), 2 usage error or unreadable report",
    )
    parser.add_argument("--version", action="version", version=f"stallscope {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="{show,check,diff,baseline,trace,html,tune}")
    show.add_parser(sub)
    check.add_parser(sub)
    diff.add_parser(sub)
    baseline.add_parser(sub)
    trace_cmd.add_parser(sub)
    html_cmd.add_parser(sub)
    tune.add_parser(sub)
    return parser


def _error(message: str) -> None:
    # one line, as data: the message may quote a path, a setting or a report's text
    print(f"stallscope: error: {' '.join(plain(message).split())}", file=sys.stderr)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit status."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # --help, --version (0) and usage errors (2)
        return exc.code if isinstance(exc.code, int) else EXIT_ERROR if exc.code else EXIT_OK
    console = Console()
    try:
        code: int = args.run(args, console)
    except SystemExit as exc:  # a command's own usage error (parser.error)
        return exc.code if isinstance(exc.code, int) else EXIT_ERROR
    except StallScopeError as exc:
        _error(str(exc))
        if args.command == "check":
            check.report_error(args, str(exc))
        return EXIT_ERROR
    except KeyboardInterrupt:
        _error("interrupted")
        return 130
    except BrokenPipeError:  # `stallscope diff a b | head`: the reader went away
        with contextlib.suppress(OSError, ValueError, AttributeError):  # keep the final flush quiet
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        # a check whose output was cut short must not read as a pass
        return EXIT_ERROR if args.command == "check" else EXIT_OK
    except Exception as exc:  # a bug: never let it look like a pass or a regression
        _error(f"internal error: {type(exc).__name__}: {exc} (set STALLSCOPE_DEBUG=1 for the traceback)")
        if os.environ.get("STALLSCOPE_DEBUG"):
            traceback.print_exc()
        return EXIT_ERROR
    return code
