"""``stallscope tune [options] -- COMMAND...``: try the findings' fixes on the user's own job.

Runs short trials of COMMAND (``stallscope.tune.search``), shows them as a table as they finish
(live, with a progress bar, on a terminal; a line per trial otherwise), then the settings that
won and ``tune.json``. Ctrl-C (or SIGTERM) stops the trial running, and what was measured is
still printed and written (exit status 130). Exit status 0 otherwise, 2 when trial 0, the command
as configured, could not be measured.
"""

from __future__ import annotations

import argparse
import signal
import time
from pathlib import Path
from types import FrameType
from typing import Any

from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.progress_bar import ProgressBar
from rich.table import Table
from rich.text import Text

from stallscope.report.safe import plain
from stallscope.tune import record, render
from stallscope.tune.search import Candidate, TrialRecord, TuneOptions, Tuner, scratch_for

EXIT_INTERRUPTED = 130
EXIT_NOT_MEASURED = 2


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "tune",
        help="try the suggested fixes on your own command, measured, and keep the ones that win",
        description="Run short trials of COMMAND with StallScope's suggestions applied (DataLoader "
        "settings, Lightning intervals), interleaved against the settings they replace, and hand "
        "back the settings that won (tune.json). Trials set STALLSCOPE_TRIAL; their reports and "
        "Lightning's checkpoints go to a scratch folder.",
    )
    p.add_argument("--budget", type=float, default=600.0, help="the whole search's wall time, seconds (default 600)")
    p.add_argument("--steps", type=int, default=None, help="steps measured per trial (default: from trial 0, <= 300)")
    p.add_argument("--seconds", type=float, default=None, help="longest measured time per trial (default 30)")
    p.add_argument("--warmup", type=int, default=5, help="steps before a trial's measurement starts (default 5)")
    p.add_argument(
        "--min-saving", type=float, default=0.02, help="keep a change when surely faster than 1+this (default 0.02)"
    )
    p.add_argument("--rounds", type=int, default=3, help="interleaved rounds per comparison, at least (default 3)")
    p.add_argument("--max-rounds", type=int, default=8, help="rounds while the interval is wide, at most (default 8)")
    p.add_argument(
        "--timeout", type=float, default=None, help="stop a trial after this many seconds (default: its budget x2)"
    )
    p.add_argument("--no-neighbours", action="store_true", help="do not try num_workers +-1 beside the predicted value")
    p.add_argument("--out", type=Path, default=Path("tune.json"), help="where tune.json goes (default ./tune.json)")
    p.add_argument(
        "--scratch", type=Path, default=None, help="the trials' folder (default stallscope-tune/<time> beside --out)"
    )
    p.add_argument("command", nargs=argparse.REMAINDER, help="the training command, after '--'")
    p.set_defaults(run=run)


class _Screen:
    """The search's observer: a live table on a terminal, else a line per event."""

    def __init__(self, console: Console, tuner: Tuner, live: Live | None) -> None:
        self.console = console
        self.tuner = tuner
        self.live = live
        self.started = time.monotonic()
        self.current = ""

    def renderable(self) -> RenderableType:
        budget = self.tuner.options.budget_s
        spent = min(budget, time.monotonic() - self.started)
        line = Table.grid(padding=(0, 1))
        line.add_row(
            ProgressBar(total=budget, completed=spent, width=30),
            Text(f"{spent:.0f}/{budget:.0f} s  {plain(self.current)}"),
        )
        return Group(render.table(self.tuner.result), line)

    def _refresh(self) -> None:
        if self.live is not None:
            self.live.update(self.renderable(), refresh=True)

    def trial_started(self, record: TrialRecord, planned: int) -> None:
        self.current = f"trial {record.number}: {record.label}"
        self._refresh()

    def trial_ended(self, record: TrialRecord) -> None:
        out = record.outcome
        if self.live is None and out is not None:
            rate = f"{out.steps_per_s:.1f} steps/s" if out.steps_per_s else "-"
            extra = f" ({out.message})" if out.message else ""
            self.console.print(Text(plain(f"trial {record.number} [{record.label}]: {out.status}, {rate}{extra}")))
        self._refresh()

    def candidate_done(self, candidate: Candidate) -> None:
        self._refresh()

    def note(self, text: str) -> None:
        if self.live is None:
            self.console.print(Text(plain(text)))


class _Terminated(KeyboardInterrupt):
    """SIGTERM: stop as for Ctrl-C."""


def _on_sigterm(signum: int, frame: FrameType | None) -> None:
    raise _Terminated


def run(args: argparse.Namespace, console: Console) -> int:
    command = list(args.command)
    if command and command[0] == "--":
        command = command[1:]
    if not command:
        raise SystemExit(_usage("no command to tune: stallscope tune [options] -- python train.py ..."))
    try:
        options = TuneOptions(
            budget_s=args.budget,
            steps=args.steps,
            seconds=args.seconds,
            warmup_steps=args.warmup,
            min_saving=args.min_saving,
            min_rounds=args.rounds,
            max_rounds=max(args.max_rounds, args.rounds),
            timeout_s=args.timeout,
            neighbours=not args.no_neighbours,
            scratch=args.scratch if args.scratch is not None else scratch_for(args.out),
        )
    except ValueError as exc:
        raise SystemExit(_usage(str(exc))) from None
    tuner = Tuner(command, options)
    live = Live(console=console, refresh_per_second=2, transient=True) if console.is_terminal else None
    screen = _Screen(console, tuner, live)
    tuner.observer = screen
    console.print(
        Text(plain(f"tuning: {' '.join(command)} (budget {options.budget_s:.0f} s; trials in {options.scratch})"))
    )
    previous = signal.signal(signal.SIGTERM, _on_sigterm)
    try:
        if live is not None:
            with live:
                live.update(screen.renderable())
                result = tuner.run()
        else:
            result = tuner.run()
    finally:
        signal.signal(signal.SIGTERM, previous)
    record.write(result, args.out)
    console.print(render.summary(result, str(args.out)))
    if result.interrupted:
        return EXIT_INTERRUPTED
    if result.baseline_steps_per_s is None:
        return EXIT_NOT_MEASURED
    return 0


def _usage(message: str) -> int:
    from stallscope.cli import _error

    _error(message)
    return 2
