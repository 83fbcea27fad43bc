"""One observed run: owns the timeline and turns its statistics into findings and reports.

The hooks (plain loop, Lightning) drive a ``Session``; it is the only place where recording
meets analysis, and it runs only at epoch ends and at the end of the run.

An epoch end costs about the same however short the epoch, so the parts of it that need not
happen every epoch happen in proportion to the run (docs/overhead.md, "Many short epochs"):
every epoch is summarised and diagnosed (``epochs[]`` has them all), but its panel is printed
only when ``print_interval_s`` passed since the previous one, and its report is handed to a
``ReportWriter``, which writes it at once or, while writes would take more than 1% of the run,
a little later (and while one waits, later epoch ends skip taking theirs). The final report and
panel are always written in full.
"""

from __future__ import annotations

import dataclasses
import sys
import threading
import time
from collections.abc import Callable
from typing import Generic, TypeVar

from rich.console import Console

from stallscope._version import __version__
from stallscope.analysis.context import AnalysisConfig, Context, Framework
from stallscope.analysis.diagnose import diagnose
from stallscope.analysis.finding import Finding
from stallscope.config import ScopeConfig
from stallscope.hooks.environment import compute_threads, current_device, torch_version, utc_now_iso
from stallscope.report.build import device_idle, nvml_fields, summarize
from stallscope.report.io import REPORT_NAME
from stallscope.report.render import print_diagnosis
from stallscope.report.schema import EpochReport, Report, RunInfo, Summary
from stallscope.report.writer import ReportWriter
from stallscope.signals.collector import SignalCollector, Signals
from stallscope.signals.host import HostInfo, host_info
from stallscope.signals.host_sampler import memory_risk_note
from stallscope.signals.loader import LoaderConfig
from stallscope.timeline.recorder import Timeline
from stallscope.timeline.stats import SpanSnapshot, SpanStats

#: most epochs kept in the report (the first few and the most recent)
MAX_EPOCHS_IN_REPORT = 500
#: an epoch of at least this many steps has its report made at its end: making it costs little
#: next to the epoch, and its snapshot holds 16 bytes a step until then (this bounds what the
#: epochs waiting for a report write hold to 8 MB)
MAKE_AT_ONCE_STEPS = 1024


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


class Session:
    """The state of one run between ``start`` and ``finish``."""

    def __init__(
        self,
        config: ScopeConfig,
        *,
        framework: Framework = "plain",
        clock: Callable[[], int] = time.perf_counter_ns,
        cpu_clock: Callable[[], int] = time.process_time_ns,
    ) -> None:
        self.config = config
        self.framework: Framework = framework
        self._clock = clock
        self.timeline = Timeline(clock=clock, cpu_clock=cpu_clock, recent_steps=config.recent_steps)
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
        #: tensors per batch, counted in the first batch of each pass
        self.batch_tensors: int | None = None
        #: each epoch's report, made when first needed (a panel, a logger, a report write): made
        #: together at a report write, a few dozen short epochs cost less than one at a time
        self.epochs: list[Later[EpochReport]] = []
        self.notes: list[str] = []
        #: the latest report: the last epoch end's, then the final one
        self._latest: Later[Report] | None = None
        self._writer = (
            ReportWriter(config.report_dir / REPORT_NAME, clock=clock) if config.report_dir is not None else None
        )
        self._started_at = ""
        self._epoch_index = 0
        #: when the last epoch panel was printed (a clock reading), and epochs ended since
        self._last_panel: int | None = None
        self._unprinted = 0
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
        if clock:
            self.timeline.start()
        self.signals.start()

    def start_clock(self) -> None:
        """Start the timeline now if it has not started."""
        if not self.timeline.started:
            self._started_at = utc_now_iso()
            self.timeline.start()

    def note(self, text: str) -> None:
        """Add a note to the report (once per distinct text)."""
        if text not in self.notes:
            self.notes.append(text)

    def note_loader(self, loader: LoaderConfig | None, batches: int | None) -> None:
        if loader is not None:
            self.loader = loader
        self.batches_per_epoch = batches
        self.signals.begin_pass()

    def note_batch(self, batch: object) -> None:
        """The first batch of a pass: on CUDA, check it for pageable (unpinned) tensors."""
        self.signals.note_batch(batch)

    def end_epoch(self) -> Later[EpochReport] | None:
        """Close the epoch: print it, write the report (on their budgets); its report, made when
        asked for. None for an empty epoch."""
        snapshot = self.timeline.end_epoch_snapshot()
        if snapshot.span.steps == 0 and snapshot.span.epochs == 0:
            return None
        # the work below (and a report write or a panel, when due) is StallScope's time, not the run's
        self.timeline.pause()
        try:
            return self._close_epoch(snapshot)
        finally:
            self.timeline.resume()

    @property
    def report(self) -> Report | None:
        """The latest report: the final one once the run finished; else the run so far, as of the
        last epoch end (or, after an epoch end whose report the writer did not want, as of now)."""
        if self._latest is None and self.epochs:
            self._latest = self._report_job(complete=False)
        return self._latest.get() if self._latest is not None else None

    def _close_epoch(self, snapshot: SpanSnapshot) -> Later[EpochReport]:
        index = self._epoch_index
        self._epoch_index += 1
        signals = self.signals.close_window()
        context = self.context(snapshot.span, signals)

        def make() -> EpochReport:
            stats = snapshot.stats()
            return EpochReport(
                index=index,
                summary=self.summarize(stats, signals),
                findings=tuple(diagnose(dataclasses.replace(context, span=stats))),
            )

        epoch = Later(make)
        if snapshot.span.steps >= MAKE_AT_ONCE_STEPS:
            epoch.get()
        self.epochs.append(epoch)
        if len(self.epochs) > MAX_EPOCHS_IN_REPORT:
            del self.epochs[10]  # keep the first ten and the most recent ones
            self.note(f"only the first 10 and the last {MAX_EPOCHS_IN_REPORT - 10} epochs are kept in the report")
        if snapshot.span.steps > 0:
            self._print_epoch(index, epoch)
        writer = self._writer
        if writer is not None and writer.wants_report():
            job = self._latest = self._report_job(complete=False)
            writer.submit(job.get)
        else:
            self._latest = None  # taken when asked for (``report``)
        return epoch

    def _print_epoch(self, index: int, later: Later[EpochReport]) -> None:
        """Print the epoch's panel if ``print_interval_s`` passed since the last one (the first
        epoch's always); a panel says how many epochs ended unprinted before it."""
        if self._console is None:
            return
        now = self._clock()
        if self._last_panel is not None and now - self._last_panel < self.config.print_interval_s * 1e9:
            self._unprinted += 1
            return
        epoch = later.get()
        title = f"epoch {index}"
        if self._unprinted:
            title += f" ({self._unprinted} more since the last panel)"
        self.print(title, epoch.summary, epoch.findings)
        self._last_panel = now
        self._unprinted = 0

    def finish(self, *, print_run: bool) -> Report:
        """The run is over: build, print (when asked) and write the final report."""
        self.signals.stop()
        if self._writer is not None:
            self._writer.close()  # no mid-run report is written after this
        report = self.build_report(complete=True)
        self._latest = Later(None, report)
        if print_run:
            self.print(f"run ({self._epoch_index} epochs)", report.summary, report.findings, report.notes)
        self.write()
        return report

    # -- pieces --------------------------------------------------------------------------

    def context(self, span: SpanStats, signals: Signals | None = None) -> Context:
        signals = signals if signals is not None else Signals()
        return Context(
            span=span,
            loader=self.loader,
            cores=self.host.usable_cores,
            config=self.analysis,
            batches_per_epoch=self.batches_per_epoch,
            batch_tensors=self.batch_tensors,
            compute_threads=compute_threads(),
            nvml=signals.nvml,
            host_signals=signals.host,
            cuda=signals.cuda,
            cuda_device=signals.cuda_device,
            precision=self.precision,
        )

    def diagnose(self, span: SpanStats, signals: Signals | None = None) -> list[Finding]:
        return diagnose(self.context(span, signals))

    def summarize(self, span: SpanStats, signals: Signals | None = None) -> Summary:
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
        for text in self.signals.notes():
            self.note(text)
        risk = memory_risk_note(signals.host)
        if risk is not None:
            self.note(risk)
        run = RunInfo(
            started_at=self._started_at,
            host=self.host.name,
            torch_version=torch_version(),
            device=current_device(),
            dataloader=self.loader.to_dict() if self.loader is not None else None,
            stallscope_version=__version__,
            framework=self.framework,
            usable_cores=self.host.usable_cores,
        )
        context = self.context(snapshot.span, signals)
        epochs = tuple(self.epochs)
        notes = tuple(self.notes)

        def build() -> Report:
            span = snapshot.stats()
            return Report(
                run=run,
                summary=self.summarize(span, signals),
                epochs=tuple(epoch.get() for epoch in epochs),
                findings=tuple(diagnose(dataclasses.replace(context, span=span))),
                notes=notes,
                complete=complete,
            )

        return Later(build)

    def print(
        self,
        title: str,
        summary: Summary,
        findings: tuple[Finding, ...],
        notes: tuple[str, ...] = (),
    ) -> None:
        if self._console is not None:
            print_diagnosis(self._console, title, summary, findings, notes, self.config.min_saving)

    def write(self) -> None:
        """Write the latest report now, durably, and no mid-run one after it (the final report,
        or the last one when StallScope turns itself off)."""
        report = self.report
        if report is not None and self._writer is not None:
            self._writer.write_final(report)

    def warn_internal(self, exc: BaseException) -> None:
        """Say once, on stderr, that StallScope turned itself off."""
        text = f"StallScope turned itself off after an internal error ({type(exc).__name__}: {exc}); training goes on"
        self.note(text)
        self.signals.stop()
        print(f"stallscope: {text}", file=sys.stderr)
