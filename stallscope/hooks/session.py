"""One observed run: owns the timeline and turns its statistics into findings and reports.

The hooks (plain loop, Lightning) drive a ``Session``; it is the only place where recording
meets analysis, and it runs only at epoch ends and at the end of the run.

An epoch end costs about the same however short the epoch, so the parts of it that need not
happen every epoch happen in proportion to the run (docs/overhead.md, "Many short epochs"):
every epoch is summarised (``epochs[]`` has them all) and diagnosed, alone when it is long
enough to judge, else with the next ones as a group (``_Group``: SPEC §3); a diagnosis's panel
is printed only while panels take at most 0.25% of the run (or, with ``print_interval_s``, when
that many seconds passed since the previous one), and the report is handed to a
``ReportWriter``, which writes it at once or, while writes would take more than 0.25% of the run,
a little later (and while one waits, later epoch ends skip taking theirs). The end of an epoch
too short to be diagnosed, with no write due, only marks the epoch's end; the epoch is closed
with a few others at a later epoch end (``Session._wait``). The final report and panel are
always written in full.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import io
import os
import sys
import threading
import time
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any, Generic, NamedTuple, TypeVar, cast

from rich.console import Console

from stallscope._version import __version__
from stallscope.analysis.context import AnalysisConfig, Context, DataSource, Framework, RunShape
from stallscope.analysis.diagnose import MIN_JUDGED_STEPS, MIN_JUDGED_WALL_S, diagnose, too_short_for
from stallscope.analysis.disturbance import disturbance_note, scatter_note
from stallscope.analysis.finding import Finding
from stallscope.analysis.numbers import count
from stallscope.analysis.unnamed import other_note
from stallscope.config import ScopeConfig
from stallscope.hooks.distributed import MAX_BATCH, Job, TermGuard, data_parallel_devices, join_job
from stallscope.hooks.environment import compute_threads, current_device, torch_version, utc_now_iso
from stallscope.report.build import device_idle, nvml_fields, summarize
from stallscope.report.html import render_report
from stallscope.report.html_io import HTML_NAME, write_html
from stallscope.report.io import REPORT_NAME, write_report
from stallscope.report.lock import FolderLock
from stallscope.report.recent import RecentSteps, Series, recent_from_record, series_from_samples
from stallscope.report.render import print_diagnosis
from stallscope.report.safe import plain
from stallscope.report.schema import DeviceInfo, EpochReport, RankEntry, Report, RunInfo, Summary
from stallscope.report.writer import FIRST_WRITE_S, WRITE_SHARE, ReportWriter
from stallscope.signals.calls import CallMeter, CallSummary
from stallscope.signals.collector import SignalCollector, Signals, WindowMark
from stallscope.signals.forward import ForwardProbe, ForwardStats, timer_for
from stallscope.signals.host import HostInfo, host_info
from stallscope.signals.host_sampler import HostSummary, memory_risk_note
from stallscope.signals.loader import LoaderConfig, StartMeter, StartSummary, probe_batch_s
from stallscope.signals.saves import SaveMeter, SaveSummary
from stallscope.timeline.phases import CHECKPOINT, LOGGING, VALIDATION
from stallscope.timeline.recorder import Timeline
from stallscope.timeline.stats import SpanSnapshot, SpanStats

#: a tail at least this long (and 1% of the run) gets a note
TAIL_NOTE_NS = 100_000_000

#: by default, epoch panels take at most about this share of the run (``_print_epoch``); the
#: mid-run report writes as much (``report/writer.py``): together 0.5%
PRINT_SHARE = 0.0025
#: what a panel is taken to cost until two have been timed (the first pays for warming up)
PANEL_GUESS_S = 0.001

#: most epochs kept in the report (the first few and the most recent)
MAX_EPOCHS_IN_REPORT = 500
#: an epoch of at least this many steps has its report made at its end: making it costs little
#: next to the epoch, and its snapshot holds 16 bytes a step until then (this bounds what the
#: epochs waiting for a report write hold to 8 MB)
MAKE_AT_ONCE_STEPS = 1024
#: most epochs whose close waits (``Session._wait``) at a time: bounds what they hold until then
#: (their recent steps, at most 128 kB each with the default ``recent_steps``) and the work of
#: the epoch end that closes them
MAX_WAITING = 16
#: only an epoch shorter than this waits: a longer one's end (about 0.15 ms between training
#: steps) is already a small share of it
WAIT_UNDER_NS = 100_000_000
#: an epoch's end sooner than this after its group's start cannot close the group (``_wait``)
GROUP_WALL_NS = round(MIN_JUDGED_WALL_S * 1e9)


T = TypeVar("T")


class Later(Generic[T]):
    """A value made when first asked for (on the training thread, or the report writer's), once:
    an epoch's report, or the run's. ``make`` may only read what the epoch end captured."""

    __slots__ = ("_make", "_lock", "_value")

    def __init__(self, make: Callable[[], T] | None, value: T | None = None) -> None:
        self._make = make
        self._lock = threading.Lock()
        self._value = value

    def get(self) -> T:
        with self._lock:
            if self._value is None:
                assert self._make is not None
                self._value = self._make()
                self._make = None  # what it captured can go
            return self._value

    def made(self) -> T | None:
        """The value if it was made already, else None (makes nothing, waits for nothing)."""
        return self._value


#: rank 0 of a job prints an epoch's panel when the other ranks' summaries of it are in: those of
#: an epoch shorter than this (seconds) at a later epoch end, when the ranks post them (waiting for
#: them at once cost about 2 ms a short epoch on a loaded 2-core machine, 1% of a 200 ms epoch);
#: a longer epoch's waits for the posts the ranks said they made at its end (the wait is then a
#: small share, and an hour-long epoch's panel is not late)
HOLD_PANEL_S = 2.0
#: most panels rank 0 holds for the ranks' summaries (a rank posts at most ``MAX_BATCH`` epochs
#: apart); past it, the oldest is printed with what is in
MAX_HELD_PANELS = MAX_BATCH + 1

#: the note (and the final panel's first words) of a rank stopped by SIGTERM
SIGTERM_ENDING = "the run was stopped by SIGTERM"

#: the longest exception message a note quotes
NOTE_MESSAGE_CHARS = 300


def _ring_copy(sampler: object) -> list[Any]:
    """A sampler's ring of recent readings, copied without its lock (which its thread may hold):
    a copy that meets an append is taken again, and given up after a few tries."""
    ring = getattr(sampler, "_ring", None)
    if ring is None:
        return []
    for _ in range(4):
        try:
            return list(ring)
        except RuntimeError:  # the deque was appended to during the copy
            continue
    return []


def _one_line(message: str) -> str:
    """A message for a one-line note: its first and last lines (an exception raised in a DataLoader
    worker carries the worker's whole traceback, which ends with the original error), shortened."""
    lines = [line.strip() for line in message.splitlines() if line.strip()]
    text = "" if not lines else lines[0] if len(lines) == 1 else f"{lines[0]} ... {lines[-1]}"
    return text if len(text) <= NOTE_MESSAGE_CHARS else text[: NOTE_MESSAGE_CHARS - 3] + "..."


def ending_note(exc: BaseException, what: str = "run") -> str:
    """The report's note on how a run (``what``: ``run``, ``fit``) ended early: an exception,
    ``sys.exit``, or an interrupt. Never raises (``str()`` runs the exception's own code)."""
    if isinstance(exc, SystemExit):
        try:
            code = repr(exc.code)
        except Exception:
            code = "?"
        return f"the {what} stopped at sys.exit({code})"
    try:
        detail = f"{type(exc).__name__}: {_one_line(str(exc))}" if isinstance(exc, Exception) else type(exc).__name__
    except Exception:
        detail = type(exc).__name__
    if isinstance(exc, Exception):
        return f"the {what} ended with an exception ({detail})"
    return f"the {what} was interrupted ({detail})"


#: the note of a run whose loop used phases but never marked a step
NO_STEPS_NOTE = (
    "no training step was seen, so nothing could be diagnosed: the loop used phases only. Mark each step"
    " where it gets its batch: `for batch in scope.iter(loader):`, or `batch = scope.batch(get_batch)` in a"
    " loop with no iterable"
)


def _foreign_thread_note(ident: int) -> str:
    """The note on phases entered on a thread other than the training thread (not counted)."""
    name = next((t.name for t in threading.enumerate() if t.ident == ident), f"thread {ident}")
    return (
        f"phases entered on another thread than the training thread ({name}) were not counted: "
        "only the training thread's phases make up its steps"
    )


def console_for_rank(config: ScopeConfig, rank: object) -> tuple[ScopeConfig, io.StringIO | None]:
    """A framework hook's config for this process: no console on a rank other than 0 (the
    session writes its file, ``hooks/distributed.py``); the default console printed into a buffer
    (as the terminal would show it), which the hook hands to the framework's own printing."""
    if isinstance(rank, int) and rank > 0:
        return dataclasses.replace(config, console=False), None
    if config.console is not True:
        return config, None
    real = Console()
    buffer = io.StringIO()
    console = Console(
        file=buffer,
        force_terminal=real.is_terminal,
        force_jupyter=False,
        color_system="auto" if real.is_terminal else None,
        width=real.width,
    )
    return dataclasses.replace(config, console=console), buffer


class _Group:
    """The epochs diagnosed together (SPEC §3): an epoch too short to judge joins the next ones
    until, together, they are long enough (``Timeline``'s groups: ``SpanSnapshot.group``); the
    epoch that closes the group holds its findings. Shared by the group's epochs' reports
    (``_Grouped``), which take their part from it once it closed."""

    __slots__ = ("first", "latest", "last", "steps_before", "view")

    def __init__(self) -> None:
        #: the first epoch of the group, and the latest one kept in it (None: none yet)
        self.first: int | None = None
        self.latest: int | None = None
        #: the epoch that closed the group; None while it is open
        self.last: int | None = None
        #: the run's steps before the group
        self.steps_before = 0
        #: once closed: the group's summary, findings and whether it was too short to judge (a
        #: group closed by the run's end), made when first asked for
        self.view: Later[tuple[Summary, tuple[Finding, ...], str | None]] | None = None

    def apply(self, epoch: EpochReport) -> EpochReport:
        """``epoch`` (one of the group's, made without findings) with its part of the closed group."""
        last, view = self.last, self.view
        assert last is not None
        assert view is not None
        assert self.first is not None
        # made directly: ``dataclasses.replace`` cost several times more, once per epoch of a run
        # of short epochs at its end
        if epoch.index != last:
            return EpochReport(
                index=epoch.index,
                summary=epoch.summary,
                findings=epoch.findings,
                covers_epochs=epoch.covers_epochs,
                diagnosed_with=last,
            )
        covers = (self.first, last) if self.first < last else None
        return EpochReport(index=epoch.index, summary=epoch.summary, findings=view.get()[1], covers_epochs=covers)


class _Grouped(Later[EpochReport]):
    """An epoch's report, made when first asked for, with its group's part (``_Group.apply``)
    once the group closed: a report written while the group is open has the epoch's summary
    alone, later ones its findings or ``diagnosed_with`` as well."""

    __slots__ = ("_group", "_applied")

    def __init__(self, make: Callable[[], EpochReport], group: _Group) -> None:
        super().__init__(make)
        self._group = group
        self._applied = False

    def get(self) -> EpochReport:
        with self._lock:
            if self._value is None:
                assert self._make is not None
                self._value = self._make()
                self._make = None
            if not self._applied and self._group.last is not None:
                self._value = self._group.apply(self._value)
                self._applied = True
            return self._value


def _whole_groups(epochs: tuple[EpochReport, ...]) -> tuple[EpochReport, ...]:
    """``epochs`` without a ``diagnosed_with`` that names an epoch of theirs which does not hold
    the group's findings (a diagnosis interrupted before it was made)."""
    by_index = {e.index: e for e in epochs}

    def held(e: EpochReport) -> bool:
        last = by_index.get(e.diagnosed_with) if e.diagnosed_with is not None else None
        covers = last.covers_epochs if last is not None else None
        return last is None or (covers is not None and covers[0] <= e.index <= covers[1])

    return tuple(e if held(e) else dataclasses.replace(e, diagnosed_with=None) for e in epochs)


#: a waiting epoch's forward passes (``Session._cut_forward``): its own, and the run's as of its end
_Forward = tuple[Callable[[], ForwardStats | None], Callable[[], ForwardStats | None]]


class _Facts(NamedTuple):
    """What the rules know of the run that may change as it goes (``Session._facts``), read when
    an epoch ends: an epoch whose close waits (``Session._wait``) is diagnosed with these."""

    loader: LoaderConfig | None
    batches_per_epoch: int | None
    batch_tensors: int | None
    batch_bytes: int | None
    in_process_batch_s: float | None
    precision: str | None
    shape: RunShape | None
    data_parallel_devices: int | None
    saves: SaveSummary | None
    logging_calls: CallSummary | None
    source: DataSource | None
    val_loader: LoaderConfig | None
    val_starts: StartSummary | None


class Session:
    """The state of one run between ``start`` and ``finish``."""

    def __init__(
        self,
        config: ScopeConfig,
        *,
        framework: Framework = "plain",
        clock: Callable[[], int] = time.perf_counter_ns,
        cpu_clock: Callable[[], int] = time.process_time_ns,
        switch_clock: Callable[[], int] | None = None,
    ) -> None:
        self.config = config
        self.framework: Framework = framework
        self._clock = clock
        self.timeline = Timeline(
            clock=clock,
            cpu_clock=cpu_clock,
            switch_clock=switch_clock,
            recent_steps=config.recent_steps,
            group_steps=MIN_JUDGED_STEPS,
            group_wall_ns=round(MIN_JUDGED_WALL_S * 1e9),
        )
        self.host: HostInfo = host_info()
        #: the training precision when the framework says (Lightning: ``str(trainer.precision)``)
        self.precision: str | None = None
        #: the background samplers (NVML, host) and CUDA-event timing
        self.signals = SignalCollector(
            self.timeline,
            nvml_device=config.nvml_device,
            interval_s=config.sample_interval_s,
            cores=self.host.usable_cores,
        )
        self.analysis = AnalysisConfig(min_saving=config.min_saving, framework=framework)
        self.loader: LoaderConfig | None = None
        self.batches_per_epoch: int | None = None
        #: where the plain loop's batches come from (``scope.iter`` over a loader, an iterable, a
        #: generator; ``scope.batch`` calls); None until known
        self.source: DataSource | None = None
        #: tensors per batch, counted in the first batch of each pass, and their bytes
        self.batch_tensors: int | None = None
        self.batch_bytes: int | None = None
        #: seconds to build one batch in this process, timed once while workers build them
        self.in_process_batch_s: float | None = None
        #: each checkpoint save, measured as an asynchronous save would split it (the hooks drive it)
        self.saves = SaveMeter(clock=clock)
        #: logging calls measured, their wall time and the process's CPU in them (the Lightning
        #: hooks drive it for the Trainer's loggers, the plain loop's ``logging`` phase for its own)
        self.logging_calls = CallMeter(clock=clock, cpu_clock=cpu_clock)
        #: the validation loader's settings and each validation run's start-up (Lightning)
        self.val_loader: LoaderConfig | None = None
        self.val_starts = StartMeter(clock=clock)
        #: the run's length and validation schedule, where the framework says (Lightning)
        self.shape: RunShape | None = None
        #: steps of the longest epoch that ended (a loop that breaks early runs fewer than its loader)
        self.epoch_steps: int | None = None
        #: the time after the last epoch's end, set when the run finishes
        self.tail: Summary | None = None
        #: this rank's part in a distributed job (``hooks/distributed.py``); None when alone
        self.job: Job | None = None
        #: a rank's SIGTERM handler, which writes the report of what ran (``TermGuard``)
        self._term: TermGuard | None = None
        #: rank 0: the job's panels waiting for the ranks' summaries (``_close_job_epoch``)
        self._held_panels: list[tuple[int, Later[tuple[EpochReport, tuple[RankEntry, ...]]], SpanSnapshot]] = []
        #: a rank's forward passes, timed apart from the collectives (``signals/forward.py``), and
        #: the epoch count when it started looking for the job's DDP module
        self._forward: ForwardProbe | None = None
        self._forward_since = 0
        #: GPUs an ``nn.DataParallel`` in the model drives (``note_model``); None when none seen
        self.data_parallel_devices: int | None = None
        #: ranks of the job on this host, where the framework says (Lightning: processes per node)
        self.local_ranks: int | None = None
        #: each epoch's report, made when first needed (a panel, a logger, a report write): made
        #: together at a report write, a few dozen short epochs cost less than one at a time
        self.epochs: list[Later[EpochReport]] = []
        self.notes: list[str] = []
        #: how this process's run ended early (``end_with``: an exception, ``sys.exit``, an
        #: interrupt); None while it goes on or when it ended normally
        self.ending: str | None = None
        #: the latest report: the last epoch end's, then the final one
        self._latest: Later[Report] | None = None
        self._writer = self._new_writer(config.report_dir / REPORT_NAME) if config.report_dir is not None else None
        #: the lock file of the run that writes ``report.json`` (``_claim_folder``)
        self._folder_lock = FolderLock(config.report_dir, self.host.name) if config.report_dir is not None else None
        #: a rank of a distributed job: its own ``ranks/rank-<R>.json`` (``_join_job``)
        self._rank_writer: ReportWriter | None = None
        self._started_at = ""
        self._cpu_clock = cpu_clock
        self._epoch_index = 0
        #: what a panel adds to an epoch's index to name it as the framework does (Lightning's
        #: ``current_epoch`` after a resume or a second ``fit``)
        self.epoch_label_offset = 0
        #: the steps of the epochs closed so far
        self._steps_ended = 0
        #: the group of epochs being diagnosed together (``_Group``), and a clock reading no later
        #: than the start of its first epoch (None until the run starts): an epoch end sooner than
        #: ``MIN_JUDGED_WALL_S`` after it cannot close the group
        self._group = _Group()
        self._group_since: int | None = None
        #: the group the latest diagnosis was of (its panel's title and numbers)
        self._closed_group: _Group | None = None
        #: when the last epoch end was over (a clock reading)
        self._ended_at = 0
        #: when the last epoch panel was printed (a clock reading), and epochs ended since
        self._last_panel: int | None = None
        self._unprinted = 0
        #: what an epoch panel takes to make and print (ns): the smaller of the last two (before
        #: the second, of the first and ``PANEL_GUESS_S``); and the last one's alone
        self._panel_cost_ns = round(PANEL_GUESS_S * 1e9)
        self._previous_panel_ns = self._panel_cost_ns
        #: the run's device kind (``cpu``, ``cuda``...), read at the first print
        self._device_kind: str | None = None
        #: a write of report.json failed (noted once; later epoch ends try again)
        self._write_failed = False
        #: where the final report.html went (None: not written)
        self._html_path: Path | None = None
        #: the final report was made (``finish``), and written
        self._final_made = False
        self._final_written = False
        #: the other thread whose phases were left out, once noted (``Timeline.foreign_thread``)
        self._foreign_noted = 0
        self._console: Console | None = None
        if config.console is True:
            self._console = Console()
        elif isinstance(config.console, Console):
            self._console = config.console

    # -- lifecycle -----------------------------------------------------------------------

    def start(self, *, clock: bool = True) -> None:
        """Start the run. Without ``clock`` the timeline waits for ``start_clock`` (the plain loop
        starts it at the first ``scope.iter`` or phase, so set-up inside ``with`` is not counted)."""
        self._started_at = utc_now_iso()
        self.timeline.set_owner(threading.get_ident())  # the training thread: its phases make the steps
        if clock:
            self._group_since = self._clock()
            self.timeline.start()
        self._join_job()
        self.signals.start()

    def _join_job(self) -> None:
        """Join the distributed job this process is a rank of, if any: ranks other than 0 print
        nothing. (Again at the first epoch end when ``torch.distributed`` came up after start.)"""
        self.job = join_job(self.host.name, min_saving=self.config.min_saving, note=self.note)
        if self.job is not None and not self.job.leader:
            self._console = None
        report_dir = self.config.report_dir
        if self.job is not None and report_dir is not None and self._rank_writer is None:
            # this rank's own file, on the same budget as report.json
            self._rank_writer = self._new_writer(self.job.rank_path(report_dir))
            if self.job.leader and self._writer is not None:
                # rank 0 writes both: the job's report.json and its own file share one budget (the
                # job's epoch ends are rank 0's, and three budgets of 0.25% with the panels' were
                # most of its cost in short epochs)
                self._writer.share = self._rank_writer.share = WRITE_SHARE / 2
        if self.job is not None and self._term is None:
            self._term = TermGuard(self._write_on_term, self._stop_waiting)
            self._term.install()
        if self.job is not None and self._forward is None:
            probe = ForwardProbe(timer_for)
            if probe.start():
                self._forward, self._forward_since = probe, self._epoch_index

    def _write_due(self, now: int) -> bool:
        """Whether this epoch end would hand a report in to a writer (``_close_epoch``): a job's
        report.json only at the epoch ends where rank 0 counts on the ranks' run summaries
        (``Job.run_due``), rank 0's own file on its own budget, both only where another rank
        posts (``Job.ranks_post_at``: a write due waits for the next such epoch end, so that
        rank 0's pauses fall where the ranks' do); another rank writes its own file where it
        posts its run's summary (``Job.may_wait`` leaves those)."""
        job, writer = self.job, self._writer
        if job is None:
            return writer is not None and writer.wants_report(now)
        if not job.leader or not job.ranks_post_at(self._epoch_index):
            return False
        if writer is not None and job.run_due(self._epoch_index) and writer.wants_report(now):
            return True
        return self._rank_writer is not None and self._rank_writer.wants_report(now)

    def _job_may_wait(self, job: Job, waiting: int, now: int) -> bool:
        """Whether this rank's epoch end (at ``now``) may leave its close to a later one (``_wait``)."""
        probe = self._forward
        if probe is not None and probe.looking:  # the epoch that finds the DDP module, or gives up
            return False
        return job.may_wait(self._epoch_index, waiting, (now - self._ended_at) / 1e9)

    def _cut_forward(self) -> _Forward | None:
        """A waiting epoch's forward passes, cut from the next epoch's (``_note_forward``)."""
        timer = self._forward.timer if self._forward is not None else None
        return (timer.cut_epoch(), timer.run_later()) if timer is not None else None

    def _note_forward(self, steps: int, forward: _Forward | None = None) -> None:
        """An epoch of ``steps`` ended: the job gets this rank's forward passes in it and in the
        run so far (``forward``: as cut at the end of an epoch whose close waited). A first epoch
        without a DDP module ends the search (its global hook costs every module call a little)."""
        probe, job = self._forward, self.job
        if probe is None or job is None:
            return
        if forward is None:
            forward = self._cut_forward()
        if forward is None:  # no DDP module found yet
            if self._epoch_index > self._forward_since:  # a whole epoch looked
                probe.give_up()
            return
        epoch, later, steps_ended = forward[0](), forward[1], self._steps_ended
        job.forward = {"epoch": epoch.to_dict(steps)} if epoch is not None else {}

        def run() -> dict[str, Any] | None:  # summed up only when the run's summary goes out
            stats = later()  # the run's forwards as of this epoch end, over its steps
            return stats.to_dict(steps_ended) if stats is not None else None

        job.forward_run = run

    def _stop_waiting(self, ending: str = SIGTERM_ENDING) -> None:
        """A SIGTERM came while the run ends: say so, and wait for no other rank from now on."""
        self.note(ending)
        if self.ending is None:
            self.ending = ending
        if self.job is not None:
            self.job.stop_waiting(self.ending)

    def _write_on_term(self, frame: types.FrameType | None) -> Callable[[], None]:
        """A SIGTERM came mid-run (``TermGuard``; ``frame``: the code it interrupted): the report
        of what ran, read now (on the training thread), made and written (``complete: false``,
        both files on rank 0) by the function returned, on another thread; no other rank is
        waited for. The epochs whose close waited (``_wait``) are closed first, so that each has
        its summary in ``epochs[]``, where the signal came in the user's code: a handler runs
        between any two of the training thread's bytecodes, and StallScope's own state is whole
        only between its calls (its C work is never cut). Inside them, a note says where those
        epochs' steps are (``in_own_code``)."""
        self._stop_waiting()
        waiting = self.timeline.waiting_epochs
        if waiting and not in_own_code(frame):
            # no report is handed in to a writer meanwhile: the one below, written straight to
            # the file, is the last of each
            writers, (self._writer, self._rank_writer) = (self._writer, self._rank_writer), (None, None)
            try:
                self._settle()
            except Exception as exc:  # the report of what ran, all the same
                self.note(f"the epochs waiting at the SIGTERM could not be closed ({type(exc).__name__}: {exc})")
            finally:
                self._writer, self._rank_writer = writers
            waiting = self.timeline.waiting_epochs
        if waiting:  # (the signal came inside StallScope's own work, or the close failed)
            last = count(waiting, "epoch")
            self.note(f"the last {last} before the SIGTERM are in the run's numbers, not in epochs[]")
        own = self._report_job(complete=False)
        if self.job is not None:  # the forwards read here, not on the writing thread
            forward_run = self.job.forward_run()
            self.job.forward_run = lambda: forward_run

        def write(writer: ReportWriter | None, report: Report) -> None:
            # straight to the file (atomically, as the writer does), not through the writer: the
            # interrupted training thread may hold the writer's lock in a write of its own
            if writer is not None:
                write_report(report, writer.path)

        def finish() -> None:
            report = own.get()
            job = self.job
            if job is None:
                return
            if not job.leader:
                job.finish(report)  # the final summary, for rank 0 to take
                write(self._rank_writer, report)
                return
            # the job's report first: what the user reads, should the time the handler gives run out
            job_report, _ = job.finish(report)
            write(self._writer, dataclasses.replace(job_report, notes=tuple(self.notes)))
            write(self._rank_writer, report)

        return finish

    def _new_writer(self, path: Path) -> ReportWriter:
        """A writer of the run's reports to ``path`` (``report.json``, or a rank's own file)."""
        return ReportWriter(path, clock=self._clock, on_error=self._write_error, first_write_s=FIRST_WRITE_S)

    def start_clock(self) -> None:
        """Start the timeline now if it has not started."""
        if not self.timeline.started:
            self._started_at = utc_now_iso()
            self._group_since = self._clock()
            self.timeline.start()

    def note(self, text: str) -> None:
        """Add a note to the report (once per distinct text)."""
        if text not in self.notes:
            self.notes.append(text)

    def end_with(self, exc: BaseException, what: str = "run") -> None:
        """The run (``what``: ``run``, ``fit``) ends with ``exc``: noted, and said first in the
        final panel. A rank of a distributed job waits for no other rank after it (``finish``)."""
        text = ending_note(exc, what)
        self.note(text)
        if self.ending is None:
            self.ending = text

    def note_loader(
        self,
        loader: LoaderConfig | None,
        batches: int | None,
        iterable: object = None,
        *,
        source: DataSource | None = None,
    ) -> None:
        """A pass over ``iterable`` begins (``source``: where a plain loop's batches come from)."""
        self.source = source
        if loader is not None:
            self.loader = loader
            if loader.num_workers > 0 and loader.in_memory is not None and self.in_process_batch_s is None:
                self._probe_loader(iterable)
        self.batches_per_epoch = batches
        self.signals.begin_pass()

    def _probe_loader(self, iterable: object) -> None:
        """Once per run: what one batch of an in-memory dataset costs without workers (the
        comparison ``data.workers`` needs to suggest fewer). The timeline does not count it."""
        self.timeline.pause()
        try:
            self.in_process_batch_s = probe_batch_s(iterable)
        except Exception:  # a dataset that cannot be indexed here is no reason to stop
            self.in_process_batch_s = None
        finally:
            self.timeline.resume()

    def probe_saves(self) -> None:
        """Once per run, after the first save that wrote bytes: time a copy of as many bytes (what
        an asynchronous save would add to the training thread). The timeline does not count it."""
        if not self.saves.wants_probe:
            return
        self.timeline.pause()
        try:
            self.saves.probe()
        finally:
            self.timeline.resume()

    def note_model(self, model: object) -> None:
        """The model being trained: look for ``nn.DataParallel`` in it (``dist.dataparallel``)."""
        self.data_parallel_devices = data_parallel_devices(model)

    def note_batch(self, batch: object) -> None:
        """The first batch of a pass: on CUDA, check it for pageable (unpinned) tensors."""
        self.signals.note_batch(batch)

    def end_epoch(self, *, may_wait: bool = True, panel: bool = True) -> Later[EpochReport] | None:
        """Close the epoch: print it, write the report (on their budgets); its report, made when
        asked for. None for an empty epoch, and for one whose close waits (``may_wait``: see
        ``_wait``). ``panel=False``: no panel (the run's own comes next and says it all)."""
        if self._folder_lock is not None and not self._folder_lock.claimed:
            self._claim_folder()
        if may_wait and panel and self._wait():
            return None
        if not may_wait and self.job is not None:  # a logger takes the job's numbers at each epoch end
            self.job.each_epoch = True
        timeline = self.timeline
        was_paused = timeline.paused
        # the work below (and a report write or a panel, when due) is StallScope's time, not the
        # run's: the clock pauses where the epoch ends
        snapshot = timeline.end_epoch_snapshot(pause=True)
        empty = snapshot.steps == 0 and snapshot.epochs == 0
        try:
            self._settle()  # the epochs that ended before this one, first
            return None if empty else self._close_epoch(snapshot, panel=panel)
        finally:
            if not (empty and was_paused):
                timeline.resume()
            self._ended_at = self._clock()
            if self._group_since is None:
                self._group_since = self._ended_at

    def _wait(self) -> bool:
        """An epoch end with nothing due (no panel, no report write) leaves the epoch's close to a
        later one: the timeline marks where the epoch ends (``Timeline.mark_epoch``), this end
        reads what only it can (what the rules will know, the signals' windows), and the epoch's
        statistics and place in the report are made, together with up to
        ``MAX_WAITING - 1`` others, at the next epoch end that has something to do, or when the
        report is asked for. Between training steps an epoch end costs what it touches, so a few
        dozen short epochs closed at once cost less than each at its end. Only an epoch shorter
        than ``WAIT_UNDER_NS``; not the first one (a job is looked for there), nor one on CUDA
        before an epoch confirmed that the run works there (``SignalCollector.windows_wait``), nor
        one that may close its group of epochs (``_Group``: its findings are made, and its panel
        printed, at its end). So the epoch waits only while it is too short to be diagnosed: what
        the rules will know is not read, nor the host's window closed. A rank of a distributed job
        sends its epochs at the epoch end that closes them (``_close_job_epoch``): its epoch
        waits where it owes no post (``Job.may_wait``), nor, on rank 0, where a report is to be
        handed in (``_write_due``), and only once the forward probe stopped looking for the DDP
        module (the epoch's forward passes are cut here)."""
        timeline = self.timeline
        if timeline.waiting_epochs >= MAX_WAITING or self._epoch_index == 0:
            return False
        signals = self.signals
        if not timeline.markable or not signals.windows_wait:
            return False
        now = self._clock()
        if now - self._ended_at >= WAIT_UNDER_NS:
            return False
        job = self.job
        if job is not None and not self._job_may_wait(job, timeline.waiting_epochs, now):
            return False
        since = self._group_since
        if since is None or now - since >= GROUP_WALL_NS:  # the group may be long enough now
            return False
        if self._write_due(now):
            return False
        at = (now, self._cpu_clock())
        mark = signals.mark_windows(host=False) if signals.epoch_windows else None
        token = (self._epoch_index, None, mark, self._cut_forward() if job is not None else None)
        # counted first: an exception a signal handler raises from here on loses no marked epoch
        self._epoch_index += 1
        self._ended_at = now
        self._latest = None  # the run moved on: taken when asked for (``report``)
        timeline.mark_epoch(token, at=at)
        return True

    def _settle(self) -> None:
        """Close the epochs whose close waited (``_wait``), oldest first. Each leaves the
        timeline's list once kept: after an exception part-way, the next call keeps the rest."""
        timeline = self.timeline
        if not timeline.waiting_epochs:
            return
        closed = timeline.closed_epochs()
        while closed:
            token, snapshot, _ = closed[0]
            index, facts, mark, forward = cast("tuple[int, _Facts | None, WindowMark | None, _Forward | None]", token)
            signals = self.signals.marked_signals(mark)
            group = snapshot.group
            if group is not None:  # (not expected: ``_wait`` leaves an epoch that may close one)
                self._group_since = None
                group_signals = self.signals.close_group(signals, alone=False, host=True)
                run_span = self._run_span(group)
                first = self._group.first if self._group.first is not None else index
                known = self._known(group_signals, first_epoch=first, facts=facts)
                epoch = self._keep_epoch(index, snapshot, signals, group_signals, known, run_span)
                self._unprinted += 1  # no panel at its end
            else:
                epoch = self._keep_epoch(index, snapshot, signals)
            del closed[0]
            if self.job is not None:  # sent (rank 0: taken into the job's epochs) in order
                self._close_job_epoch(index, epoch, snapshot, forward=forward)

    def top_saving(self, epoch: EpochReport) -> float:
        """The headline's ``top_saving_fraction`` at ``epoch``'s end: its best fix's saving, or, for
        an epoch too short to be diagnosed alone, the latest diagnosis's (0.0 before the first)."""
        findings = epoch.findings
        if epoch.diagnosed_with is None and epoch.covers_epochs is None and not findings:
            group = self._closed_group
            if group is not None and group.view is not None and group.last != epoch.index:
                findings = group.view.get()[1]
        return findings[0].est_saving_fraction if findings else 0.0

    @property
    def epochs_ended(self) -> int:
        """Epochs ended so far, empty ones aside (each epoch's index is its place in this count)."""
        return self._epoch_index

    @property
    def report(self) -> Report | None:
        """The latest report: the final one once the run finished; else the run so far, as of the
        last epoch end (or, after an epoch end whose report the writer did not want, as of now)."""
        self._settle()
        if self._latest is None and self.epochs:
            self._latest = self._shown_report()
        return self._latest.get() if self._latest is not None else None

    def _shown_report(self) -> Later[Report]:
        """The run's report as of now, made later: rank 0 of a distributed job shows the job's
        (its own run information and notes, the ranks' latest summaries together)."""
        job = self.job
        if job is not None and job.leader:
            job.settle()  # first: the notes it adds are in the report
        own = self._report_job(complete=False)
        if job is None or not job.leader:
            return own
        make = job.report_later()
        return Later(lambda: make(own.get()))

    def _close_epoch(self, snapshot: SpanSnapshot, *, panel: bool = True) -> Later[EpochReport]:
        index = self._epoch_index
        self._epoch_index += 1
        group = snapshot.group
        signals = self.signals.close_window(steps=snapshot.steps, host=group is not None)
        if group is not None:  # it closes its group: the group's diagnosis
            self._group_since = None  # (the next group starts at this epoch end's)
            group_signals = self.signals.close_group(signals, alone=group is snapshot)
            run_span = self._run_span(group)
            first = self._group.first if self._group.first is not None else index
            known = self._known(group_signals, first_epoch=first)
            epoch = self._keep_epoch(index, snapshot, signals, group_signals, known, run_span)
        else:
            epoch = self._keep_epoch(index, snapshot, signals)
        if index == 0 and (self.job is None or self.job.exchange is None):
            self._join_job()  # torch.distributed may have come up inside the ``with`` block
        if self.job is not None:  # rank 0 speaks for the job; the others write their own file
            return self._close_job_epoch(index, epoch, snapshot)
        if snapshot.steps > 0 and panel and group is not None:
            self._print_epoch(index, epoch, snapshot, group=self._closed_group)
        writer = self._writer
        if writer is not None and writer.wants_report():
            job = self._latest = self._report_job(complete=False)
            writer.submit(job.get)
        else:
            self._latest = None  # taken when asked for (``report``)
        return epoch

    def _run_span(self, snapshot: SpanSnapshot) -> SpanStats | None:
        """The run so far (``Context.run_span``) where the report of ``snapshot`` (an epoch or a
        group) needs it, else None: the frequency rules take a phase's cost from its totals and
        the steps after each run of it, not its percentiles (``SpanSnapshot.unsorted``), so only
        an epoch where such a phase could be worth a finding pays for it."""
        phase_ns = snapshot.phase_ns
        frequent = sum(phase_ns.get(name, 0) for name in (CHECKPOINT, LOGGING, VALIDATION))
        if snapshot.wall_ns <= 0 or frequent < self.config.min_saving * snapshot.wall_ns:
            return None
        return self.timeline.run_snapshot().unsorted()

    def _keep_epoch(
        self,
        index: int,
        snapshot: SpanSnapshot,
        signals: Signals,
        group_signals: Signals | None = None,
        known: functools.partial[Context] | None = None,
        run_span: SpanStats | None = None,
    ) -> Later[EpochReport]:
        """The epoch's place in the report: its report, made when first asked for (at once for a
        long epoch), with its group's part once the group closed (``_Group``). When the epoch
        closes its group (``snapshot.group``): ``group_signals``, the group's signals, and
        ``known``, what the rules knew when it ended."""
        steps = snapshot.steps
        steps_before = self._steps_ended
        epoch_steps = max(self.epoch_steps or 0, steps) if steps > 0 else self.epoch_steps
        group = self._group
        closes = snapshot.group
        view: Later[tuple[Summary, tuple[Finding, ...], str | None]] | None = None
        if closes is not None:
            assert known is not None
            before = group.steps_before if group.first is not None else steps_before
            view = self._group_view(closes, group_signals or signals, known, before, run_span, epoch_steps)

        def make() -> EpochReport:
            return EpochReport(index=index, summary=self.summarize(snapshot, signals))

        epoch = _Grouped(make, group)
        if group.first is None:
            group.first, group.steps_before = index, steps_before
        group.latest = index
        if view is not None:
            group.view, group.last = view, index
        if steps >= MAKE_AT_ONCE_STEPS:
            epoch.get()
        # the session's state last (an exception before leaves it as it was)
        if view is not None:
            self._closed_group = group
            self._group = _Group()
        self._steps_ended = steps_before + steps
        self.epoch_steps = epoch_steps
        self.epochs.append(epoch)
        if len(self.epochs) > MAX_EPOCHS_IN_REPORT:
            del self.epochs[10]  # keep the first ten and the most recent ones
            self.note(f"only the first 10 and the last {MAX_EPOCHS_IN_REPORT - 10} epochs are kept in the report")
        return epoch

    def _group_view(
        self,
        snapshot: SpanSnapshot,
        signals: Signals,
        known: functools.partial[Context],
        steps_before: int,
        run_span: SpanStats | None,
        epoch_steps: int | None,
    ) -> Later[tuple[Summary, tuple[Finding, ...], str | None]]:
        """A group's summary, findings and whether it is too short to judge, made when first asked
        for (a panel, a report)."""

        def make() -> tuple[Summary, tuple[Finding, ...], str | None]:
            stats = snapshot.stats()
            context = known(span=stats, steps_before=steps_before, run_span=run_span, epoch_steps=epoch_steps)
            return self.summarize(stats, signals), tuple(diagnose(context)), too_short_for(stats.steps, stats.wall_s)

        return Later(make)

    def _close_open_group(self) -> bool:
        """The run ends with epochs not diagnosed yet (together too short to judge): they are
        diagnosed together all the same, their findings low confidence, held by the last of them.
        True when there were such epochs (no panel has shown their diagnosis)."""
        group = self._group
        if group.first is None or group.latest is None:
            return False
        snapshot = self.timeline.close_group()
        if snapshot is None:
            return False
        self._group = _Group()
        signals = self.signals.close_group(Signals(), alone=False, host=True)
        run_span = self._run_span(snapshot)
        known = self._known(signals, first_epoch=group.first)
        group.view = self._group_view(snapshot, signals, known, group.steps_before, run_span, self.epoch_steps)
        group.last = group.latest
        self._closed_group = group
        return True

    def _close_job_epoch(
        self, index: int, epoch: Later[EpochReport], span: SpanSnapshot, *, forward: _Forward | None = None
    ) -> Later[EpochReport]:
        """An epoch end of a distributed job: this rank's epoch is made now and sent to rank 0,
        with its run's report every ``Job.run_every``-th epoch (making that report costs
        milliseconds: with short epochs, not every time). Rank 0 makes the job's epoch when it is
        needed or at its next epoch end (``Job.close_epoch``), prints the job's panel and writes
        the job's report, each on its budget, the report only at an epoch end where every rank
        sent its run's; each rank writes its own ``ranks/rank-<R>.json`` on the same budget."""
        job = self.job
        assert job is not None
        self._note_forward(span.steps, forward)
        closed = self._closed_group
        group = None  # the epochs this one's findings are of, when it closes a group
        if span.group is not None and closed is not None and closed.first is not None:
            group = (closed.first, index)
        job.cores = self.rank_cores
        own: Later[Report] | None = None
        if not job.leader:
            report: Report | None = None
            job.note_epoch(span.wall_ns / 1e9)
            if job.run_due(index):
                start = self._clock()
                own = self._report_job(complete=False)
                report = own.get()
                # before the post: the word it gives (its next post, its ``run_every``) is the
                # schedule it keeps, which rank 0 closes its own epochs by (``Job.ranks_post_at``)
                job.note_run_cost((self._clock() - start) / 1e9 + job.run_post_s, span.wall_ns / 1e9)
                job.close_epoch(epoch.get(), report, group=group)
                self._write_own_later(own)
            else:
                job.close_epoch(epoch.get(), None, group=group)
            self._latest = own
            return epoch
        # the job's report needs every rank's run from this epoch end
        due = job.run_due(index) and self._writer is not None and self._writer.wants_report()
        if due or (self._rank_writer is not None and self._rank_writer.wants_report()):
            own = self._report_job(complete=False)  # read now, made when written
        job.close_epoch(epoch.get(), None, group=group)
        self._latest = None  # taken when asked for (``report``)
        if own is not None:
            self._write_own_later(own)
        if due and own is not None and self._writer is not None:
            job.settle()
            if job.runs_from(index):  # else at a later such epoch end
                make, notes, own_report = job.report_later(), tuple(self.notes), own
                self._latest = Later(lambda: dataclasses.replace(make(own_report.get()), notes=notes))
                self._writer.submit(self._latest.get)

        def shown() -> tuple[EpochReport, tuple[RankEntry, ...]]:
            made = job.job_epoch(index)
            return made if made is not None else (epoch.get(), ())

        made: Later[tuple[EpochReport, tuple[RankEntry, ...]]] = Later(shown)
        if span.steps > 0 and group is not None and self._console is not None:  # a panel per diagnosis
            if span.wall_ns >= HOLD_PANEL_S * 1e9:
                job.settle()  # the ranks' posts of this epoch end, when they said they made one
            self._held_panels.append((index, Later(shown), span))  # its own: read when printed
        self._print_held_panels(made=job.made)
        return Later(lambda: made.get()[0])

    def _print_job_epoch(
        self, index: int, made: Later[tuple[EpochReport, tuple[RankEntry, ...]]], span: SpanSnapshot
    ) -> None:
        """Rank 0: the job's epoch panel (waiting for the ranks' summaries when not in yet)."""
        job = self.job

        def view() -> tuple[Summary, tuple[Finding, ...], str | None]:
            epoch = made.get()[0]
            summary = job.group_summary(index) if job is not None else None
            return summary or epoch.summary, epoch.findings, None

        self._print_epoch(
            index, Later(lambda: made.get()[0]), span, ranks=Later(lambda: made.get()[1]), view=Later(view)
        )

    def _print_held_panels(self, made: Callable[[int], bool] | None = None) -> None:
        """The job's panels held until their ranks' summaries came in (``_close_job_epoch``), in
        order: those whose epoch is ``made``, and the oldest past ``MAX_HELD_PANELS``; all of them
        (with what is in) when ``made`` is None, at the run's end."""
        held = self._held_panels
        while held and (made is None or made(held[0][0]) or len(held) > MAX_HELD_PANELS):
            self._print_job_epoch(*held.pop(0))

    def _write_own_later(self, own: Later[Report]) -> None:
        """This rank's own file, on its writer's budget."""
        writer = self._rank_writer
        if writer is not None and writer.wants_report():
            writer.submit(own.get)

    def _device(self) -> DeviceInfo:
        """The accelerator the run uses. Once CUDA was seen in use it stays the device, also after
        the user's code moved its tensors off it (Lightning's teardown does, before the final
        report)."""
        device = current_device(cuda=False if self.signals.cuda_idle else None)
        facts = self.signals.cuda_device
        if device.kind != "cuda" and facts is not None:
            return DeviceInfo(kind="cuda", name=facts.name, index=facts.index, uuid=facts.uuid)
        return device

    def _print_epoch(
        self,
        index: int,
        later: Later[EpochReport],
        span: SpanSnapshot,
        *,
        ranks: Later[tuple[RankEntry, ...]] | None = None,
        group: _Group | None = None,
        view: Later[tuple[Summary, tuple[Finding, ...], str | None]] | None = None,
    ) -> None:
        """Print the panel of the diagnosis an epoch end made when it is due (the first one's
        always); a panel says how many diagnoses ended unprinted before it. Due: by default when
        the time since the last panel is at least ``1 / PRINT_SHARE`` times what a panel takes (the
        smaller of the last two panels' costs): every epoch, unless epochs are so short that their
        panels would take more than 0.25% of the run; with ``print_interval_s``, when that many
        seconds passed since the last one (0: every epoch). ``group``: the epochs diagnosed
        together that this epoch closes; a panel of several reads "epochs first–last", with their
        numbers together; ``view``: the job's numbers and findings for it (rank 0 of a job)."""
        if self._console is None:
            return
        now = self._clock()
        if not self._panel_due(now):
            self._unprinted += 1
            return
        epoch = later.get()
        offset = self.epoch_label_offset
        summary, findings = epoch.summary, epoch.findings
        short = too_short_for(span.steps, span.wall_ns / 1e9)
        first = epoch.covers_epochs[0] if epoch.covers_epochs is not None else index
        if group is not None and group.first is not None and group.view is not None and group.first < index:
            first = group.first
            summary, findings, short = group.view.get()
        elif view is not None and first < index:
            summary, findings, _ = view.get()
            short = None
        title = f"epoch {index + offset}" if first == index else f"epochs {first + offset}–{index + offset}"
        if self._unprinted:
            title += f" ({self._unprinted} more since the last panel)"
        rows = ranks.get() if ranks is not None else ()
        self.print(title, summary, findings, (short,) if short else (), ranks=rows)
        end = self._clock()
        # the smaller of this panel's cost and the previous one's: a single slow panel (the first,
        # which loads rich's rendering, or one a garbage collection hit) does not hold back the next
        self._panel_cost_ns = min(end - now, self._previous_panel_ns)
        self._previous_panel_ns = end - now
        self._last_panel = now if self.config.print_interval_s is not None else end
        self._unprinted = 0

    def _panel_due(self, now: int) -> bool:
        """Whether an epoch panel is due at ``now`` (a reading of the clock): see ``_print_epoch``."""
        if self._last_panel is None:
            return True
        interval = self.config.print_interval_s
        wait_ns = self._panel_cost_ns / PRINT_SHARE if interval is None else interval * 1e9
        return now - self._last_panel >= wait_ns

    def finish(self, *, print_run: bool) -> Report:
        """The run is over: build, print (when asked) and write the final report. A rank that got
        SIGTERM meanwhile dies of it after the write (``TermGuard``)."""
        term = self._term
        if term is None:
            return self._finish(print_run=print_run)
        term.finishing = True
        try:
            return self._finish(print_run=print_run)
        finally:
            term.uninstall()
            term.reraise()

    def _finish(self, *, print_run: bool) -> Report:
        self._settle()
        # epochs diagnosed only now: the run's panel shows it (a one-epoch Lightning fit too short
        # to judge printed nothing else)
        print_run = self._close_open_group() or print_run
        if self._folder_lock is not None:
            self._claim_folder()
            self._release_folder()
        # the run ends here: stopping the samplers (a wedged one is waited for a bounded while)
        # and the writers is StallScope's time, not the run's tail
        self.timeline.pause()
        self.signals.stop()
        self.saves.close()
        if self._forward is not None:
            self._forward.stop()  # the user's model keeps no hook of ours
        for writer in (self._writer, self._rank_writer):
            if writer is not None:
                waited = writer.close()  # no mid-run report is written after this
                if waited:  # seen twice at the end of a run on a busy host, cause not found yet
                    self.note(f"the run's end waited {waited:.1f} s for a mid-run write of {writer.path.name}")
        no_steps = self.framework == "plain" and not self.epochs and self.timeline.started and self.timeline.steps == 0
        if no_steps:  # phases alone: what they took is in the report, but no step to judge
            self.note(NO_STEPS_NOTE)
        self._close_tail()
        report = self.build_report(complete=True)
        own = report.summary  # this process's run
        ranks: tuple[RankEntry, ...] = ()
        if self.job is not None:
            if self.job.leader:
                self._write_own(report)
            self.job.cores = self.rank_cores  # every rank has said where it runs by now
            report, ranks = self.job.finish(report, ending=self.ending)
            report = dataclasses.replace(report, notes=self.job.load_notes(self.notes, ranks))
        self._latest = Later(None, report)
        self._final_made = True
        self._print_held_panels()
        if print_run or no_steps:
            # the printed diagnosis says when the run was too short to judge (the findings say it
            # with their confidence)
            # (from the summary: the run's statistics again would sort its recent steps again)
            short = too_short_for(own.steps, own.wall_s) if own.steps > 0 else None
            notes = report.notes + ((short,) if short else ())
            title = "run (no steps)" if no_steps else f"run ({count(self._epoch_index, 'epoch')})"
            if self.source == "callable" and self._epoch_index == 1:
                title = "run"  # a loop with no epochs: none named
            ending = self._ending_line()
            if ending:  # first: the numbers below are of a run that did not end as planned
                title = f"{title} · {ending}"
            self.print(title, report.summary, report.findings, notes, ranks=ranks)
        self.write()
        self._final_written = True
        self._write_html(report)
        self._print_where()
        return report

    def finish_interrupted(self, exc: BaseException) -> None:
        """An interrupt (Ctrl-C, a SIGTERM handler's ``sys.exit``) came while ``finish`` ran: write
        the report of what ran all the same, the fast way when the final one was not made yet: the
        run's summary (every step) and the epochs already made, no findings, and a note that says
        so. The caller lets the interrupt go on up."""
        if self._final_written:
            return
        if not self._final_made:
            self.note(
                f"the final diagnosis was interrupted ({type(exc).__name__}): "
                "the report holds the run's summary, no findings"
            )
            self.start_clock()
            span = self.timeline.run_snapshot().stats()
            try:
                summary = self.summarize(span, self.signals.run_window())
            except Exception:  # the samplers' numbers are a refinement: the steps are what counts
                summary = self.summarize(span)
            epochs = _whole_groups(tuple(e for e in (epoch.made() for epoch in self.epochs) if e is not None))
            report = Report(
                run=self._run_info(),
                summary=summary,
                epochs=epochs,
                notes=tuple(self.notes),
                complete=True,
                tail=self.tail,
            )
            self._latest = Later(None, report)
            self._final_made = True
        self.write()
        self._final_written = True

    def _ending_line(self) -> str | None:
        """How the run ended early, for the final panel's first line: this process's exception,
        or (rank 0 of a job) the first other rank's, with how many more ended so."""
        if self.ending is not None:
            return self.ending
        if self.job is None or not self.job.leader or not self.job.endings:
            return None
        ranks = sorted(self.job.endings)
        more = f" (and {len(ranks) - 1} more ranks)" if len(ranks) > 1 else ""
        return f"rank {ranks[0]}: {self.job.endings[ranks[0]]}{more}"

    def _write_html(self, report: Report) -> None:
        """``report.html`` beside the final ``report.json`` (rank 0 alone). Any failure costs the
        page only: it is said once on stderr, and the run and its report.json stay as they are."""
        self._html_path = None
        if self.config.report_dir is None or self._write_failed or not self.config.html:
            return
        if self.job is not None and not self.job.leader:
            return
        try:
            path = self.config.report_dir / HTML_NAME
            write_html(render_report(report), path)
            self._html_path = path
        except Exception as exc:  # the page is extra: never the run's or report.json's failure
            text = f"report.html could not be written ({type(exc).__name__}: {exc})"
            print(f"stallscope: {plain(text)}", file=sys.stderr)

    def _print_where(self) -> None:
        """Say where the final report went (rank 0 alone, when it was written)."""
        if self._console is None or self.config.report_dir is None or self._write_failed:
            return
        if self.job is not None and not self.job.leader:
            return
        path = str(self.config.report_dir / REPORT_NAME)
        try:  # relative to the working directory when it lies below it, as a user would type it
            relative = os.path.relpath(path)
            if relative != os.pardir and not relative.startswith(os.pardir + os.sep):
                path = relative
        except (OSError, ValueError):  # no working directory (removed), another drive
            pass
        # as the panels show the run's strings: no terminal escapes, no markup, lone surrogates
        # (a file name that is not UTF-8) written as their escapes
        where = plain(path)
        self._console.print(f"report: {where}", markup=False, highlight=False, soft_wrap=True)
        if self._html_path is not None:  # beside it: the page to open
            page = plain(os.path.join(os.path.dirname(path), HTML_NAME))
            self._console.print(f"open:   {page}", markup=False, highlight=False, soft_wrap=True)

    def _claim_folder(self) -> None:
        """Take the report folder's lock (``report/lock.py``), once, as the writer of ``report.json``
        (rank 0 of a distributed job, which is known by the first epoch end)."""
        lock = self._folder_lock
        if lock is None or lock.claimed or (self.job is not None and not self.job.leader):
            return
        if (text := lock.claim()) is not None:
            self.note(text)

    def _release_folder(self) -> None:
        if self._folder_lock is not None and (text := self._folder_lock.release()) is not None:
            self.note(text)

    def _close_tail(self) -> None:
        """The time after the last epoch's end (a validation or a save after the last pass, the
        framework's wrap-up) is the report's ``tail``: the epochs and the tail add up to the run.
        The clock stops here, so the run ends where the tail does."""
        if not self.epochs or not self.timeline.started:
            return
        self.timeline.pause()  # first: the tail and the run end at the same instant
        tail = self.timeline.end_epoch()
        if tail.wall_ns <= 0:
            return
        self.tail = self.summarize(tail)
        run_ns = self.timeline.run_wall_ns()
        if run_ns > 0 and tail.wall_ns >= max(0.01 * run_ns, TAIL_NOTE_NS):
            top = max(tail.phase_ns, key=lambda name: tail.phase_ns[name])
            self.note(
                f"{tail.wall_s:.2f} s ({tail.wall_ns / run_ns:.0%} of the run, mostly {top}) came after the last"
                " epoch's end: it is in the run's time and in the report's tail, not in an epoch"
            )

    # -- pieces --------------------------------------------------------------------------

    def context(
        self,
        span: SpanStats,
        signals: Signals | None = None,
        *,
        steps_before: int = 0,
        first_epoch: int = 0,
        run_span: SpanStats | None = None,
    ) -> Context:
        """What the rules see of ``span``: the run (the defaults) or one of its epochs."""
        return self._known(signals, steps_before=steps_before, first_epoch=first_epoch, run_span=run_span)(span=span)

    def _facts(self) -> _Facts:
        """What the rules know of the run that may change as it goes, as of now."""
        return _Facts(
            self.loader,
            self.batches_per_epoch,
            self.batch_tensors,
            self.batch_bytes,
            self.in_process_batch_s,
            self.precision,
            self.shape,
            self.data_parallel_devices,
            self.saves.summary(),
            self.logging_calls.summary(),
            self.source,
            self.val_loader,
            self.val_starts.summary(),
        )

    def _known(
        self,
        signals: Signals | None = None,
        *,
        steps_before: int = 0,
        first_epoch: int = 0,
        run_span: SpanStats | None = None,
        facts: _Facts | None = None,
    ) -> functools.partial[Context]:
        """``context`` but the span, as of now (or with the ``facts`` an epoch end read): an epoch
        end reads what it knows when it ends, and its ``Context`` is made (given the span) when
        its report is made."""
        signals = signals if signals is not None else Signals()
        f = facts if facts is not None else self._facts()
        return functools.partial(
            Context,
            loader=f.loader,
            cores=self.rank_cores,
            config=self.analysis,
            batches_per_epoch=f.batches_per_epoch,
            batch_tensors=f.batch_tensors,
            batch_bytes=f.batch_bytes,
            in_process_batch_s=f.in_process_batch_s,
            compute_threads=compute_threads(on_cuda=self.signals.on_cuda),
            nvml=signals.nvml,
            host_signals=without_siblings(signals.host, ranks_here(self.job, self.local_ranks)),
            cuda=signals.cuda,
            cuda_device=signals.cuda_device,
            precision=f.precision,
            shape=f.shape,
            epoch_steps=self.epoch_steps,
            steps_before=steps_before,
            first_epoch=first_epoch,
            run_span=run_span,
            data_parallel_devices=f.data_parallel_devices,
            saves=f.saves,
            logging_calls=f.logging_calls,
            source=f.source,
            val_loader=f.val_loader,
            val_starts=f.val_starts,
        )

    @property
    def rank_cores(self) -> int:
        """The cores this process's loading can count on: the host's usable cores shared among
        the job's ranks on this host (each rank runs its own workers and compute on them)."""
        return max(1, self.host.usable_cores // ranks_here(self.job, self.local_ranks))

    def summarize(self, span: SpanStats | SpanSnapshot, signals: Signals | None = None) -> Summary:
        """``span``'s summary (an epoch's straight from its snapshot)."""
        if signals is None:
            return summarize(span)
        idle, source = device_idle(span, signals.cuda, signals.nvml)
        return summarize(span, idle_fraction=idle, idle_source=source, nvml=nvml_fields(signals.nvml))

    def build_report(self, *, complete: bool) -> Report:
        """The report of the run so far, built now."""
        return self._report_job(complete=complete).get()

    def _report_job(self, *, complete: bool) -> Later[Report]:
        """The report of the run as of now, to build later, on any thread: what only the training
        thread may read (the timeline, the signals, torch's device and threads) is read now,
        cheaply; the sorting, the diagnosis and the JSON wait until the report is asked for."""
        self.start_clock()  # a run that never reached its first step: an empty report, not an error
        snapshot = self.timeline.run_snapshot()
        signals = self.signals.run_window()
        if self.job is not None:  # what this rank's process tree and the machine's others kept busy
            self.job.note_load(signals.host)
        for text in self.signals.notes():
            self.note(text)
        if (foreign := self.timeline.foreign_thread) and foreign != self._foreign_noted:
            self._foreign_noted = foreign  # once: the thread's name may be gone by the next report
            self.note(_foreign_thread_note(foreign))
        risk = memory_risk_note(signals.host)
        if risk is not None:
            self.note(risk)
        # the numbers move until the end
        busy = (
            disturbance_note(without_siblings(signals.host, ranks_here(self.job, self.local_ranks)))
            if complete
            else None
        )
        if busy is not None:
            self.note(busy)
        run = self._run_info()
        known = self._known(signals)
        epochs = tuple(self.epochs)
        notes = tuple(self.notes)
        tail = self.tail
        recent = self._recent_later()
        framework = self.framework

        def build() -> Report:
            span = snapshot.stats()
            # the numbers move until the end
            late = (scatter_note(span), other_note(span, framework)) if complete else ()
            steps, series = recent()
            return Report(
                run=run,
                summary=self.summarize(span, signals),
                epochs=tuple(epoch.get() for epoch in epochs),
                findings=tuple(diagnose(known(span=span))),
                notes=(*notes, *(note for note in late if note is not None)),
                complete=complete,
                tail=tail,
                recent=steps,
                series=series,
            )

        return Later(build)

    def _recent_later(self) -> Callable[[], tuple[tuple[RecentSteps, ...], tuple[Series, ...]]]:
        """The most recent steps and the samplers' recent readings as of now, copied (the timeline
        has just been folded; the samplers' rings are copied without their locks), in the report's
        form when called (on any thread). A failure here costs the report these, nothing else."""
        try:
            record = self.timeline.recent_record()
            unix_ns = time.time_ns()
            nvml = _ring_copy(self.signals.nvml)
            host = _ring_copy(self.signals.host)
        except Exception:
            return lambda: ((), ())
        rank = self.job.info.rank if self.job is not None else None
        host_name = self.host.name

        def make() -> tuple[tuple[RecentSteps, ...], tuple[Series, ...]]:
            try:
                steps = recent_from_record(record, rank=rank, host=host_name, unix_ns=unix_ns)
                start = record.run_start_ns
                made: list[Series | None] = [
                    series_from_samples("gpu_util", "fraction", [(s.end_ns, s.util) for s in nvml], start)
                ]
                pairs = list(zip(host, host[1:], strict=False))
                for name, which in (("host_cpu", 1), ("workers_cpu", 2)):
                    points = [(b[0], b[which] / ((b[0] - a[0]) / 1e9)) for a, b in pairs if b[0] > a[0]]
                    made.append(series_from_samples(name, "cores", points, start))
            except Exception:
                return (), ()
            return ((steps,) if steps.steps else ()), tuple(s for s in made if s is not None)

        return make

    def _run_info(self) -> RunInfo:
        return RunInfo(
            started_at=self._started_at,
            host=self.host.name,
            torch_version=torch_version(),
            device=self._device(),
            dataloader=self.loader.to_dict() if self.loader is not None else None,
            stallscope_version=__version__,
            framework=self.framework,
            usable_cores=self.host.usable_cores,
            rank=self.job.info.rank if self.job is not None else None,
            world_size=self.job.info.world_size if self.job is not None else None,
            local_rank=self.job.info.local_rank if self.job is not None else None,
        )

    def print(
        self,
        title: str,
        summary: Summary,
        findings: tuple[Finding, ...],
        notes: tuple[str, ...] = (),
        *,
        ranks: tuple[RankEntry, ...] = (),
    ) -> None:
        if self._console is not None:
            if self._device_kind is None:  # what the accelerator is, named in the headline
                self._device_kind = self._device().kind
            if ranks and self.job is not None:
                title = f"{title} · job of {self.job.info.world_size} ranks"
            print_diagnosis(
                self._console,
                title,
                summary,
                findings,
                notes,
                self.config.min_saving,
                device=self._device_kind,
                ranks=ranks,
            )

    def write(self) -> None:
        """Write the latest report now, durably, and no mid-run one after it (the final report,
        or the last one when StallScope turns itself off). A rank other than 0 of a distributed
        job writes its own file, never ``report.json``."""
        report = self.report
        if report is None:
            return
        if self.job is not None and not self.job.leader:
            self._write_own(report)
        elif self._writer is not None:
            self._writer.write_final(report)
        if self._write_failed and report.notes != tuple(self.notes):  # the note is in the report
            self._latest = Later(None, dataclasses.replace(report, notes=tuple(self.notes)))

    def _write_own(self, report: Report) -> None:
        """This rank's own file (``ranks/rank-<R>.json``) of a distributed job, last and durably."""
        if self._rank_writer is not None:
            self._rank_writer.write_final(report)

    def _write_error(self, exc: OSError) -> None:
        """A file system refused a write (permissions, read-only, full, a path under a file): only
        the file is lost. The first failure is noted (in the report and once on stderr), the
        diagnosis goes on, and each later epoch end writes the whole report again."""
        if self._write_failed:
            return
        self._write_failed = True
        where = self.config.report_dir if self.config.report_dir is not None else "the report folder"
        text = (
            f"{where} could not be written ({type(exc).__name__}: {exc.strerror or exc}); "
            "the diagnosis goes on and each later epoch end tries again"
        )
        self.note(text)
        print(f"stallscope: {plain(text)}", file=sys.stderr)

    def stop_helpers(self) -> None:
        """Stop StallScope's threads and hooks, each whatever the others do: a run's end that could
        not finish (``StallScope.close``) leaves none of them running."""
        helpers: list[Callable[[], object]] = [self.signals.stop, self.saves.close]
        if self._forward is not None:
            helpers.append(self._forward.stop)
        helpers += [writer.close for writer in (self._writer, self._rank_writer) if writer is not None]
        for stop in helpers:
            with contextlib.suppress(Exception):  # the next one all the same
                stop()

    def warn_internal(self, exc: BaseException) -> None:
        """Say once, on stderr, that StallScope turned itself off."""
        text = f"StallScope turned itself off after an internal error ({type(exc).__name__}: {exc}); training goes on"
        self.note(text)
        self.signals.stop()
        self._release_folder()
        print(f"stallscope: {plain(text)}", file=sys.stderr)


#: the package's folder: a frame of code in it is StallScope's own (``in_own_code``)
_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep


def in_own_code(frame: types.FrameType | None) -> bool:
    """Whether ``frame`` (the one a signal interrupted), or a frame it was called from, runs
    StallScope's own Python code; True when there is no frame to tell by."""
    if frame is None:
        return True
    f: types.FrameType | None = frame
    while f is not None:
        if f.f_code.co_filename.startswith(_PACKAGE_DIR):
            return True
        f = f.f_back
    return False


def ranks_here(job: Job | None, local_ranks: int | None = None) -> int:
    """How many of the job's ranks run on this machine, this one included (1 without a job):
    every rank that posted this machine's id (``Job.ranks_on_host``), else the launcher's local
    world size, else the devices a Lightning fit runs on (``local_ranks``)."""
    if job is None:
        return 1
    return job.ranks_on_host() or job.info.local_world_size or local_ranks or 1


def without_siblings(host: HostSummary | None, ranks: int) -> HostSummary | None:
    """``host`` with the job's other ranks on this machine (``ranks`` in all) taken out of its
    "other processes" (the sampler sees only this rank's process tree as the run's): each of them
    counted as busy as this rank and its workers, as ranks of one job are. Rank 0 replaces the
    job's note on the machine's load with the ranks' own figures (``JobSession.load_notes``)."""
    if host is None or host.others_cores is None or ranks <= 1:
        return host
    siblings = (ranks - 1) * (host.main_cores + host.workers_cores)
    return dataclasses.replace(host, others_cores=max(0.0, host.others_cores - siblings))
