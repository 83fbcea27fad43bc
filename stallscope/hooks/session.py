"""One observed run: owns the timeline and turns its statistics into findings and reports.

The hooks (plain loop, Lightning) drive a ``Session``; it is the only place where recording
meets analysis, and it runs only at epoch ends and at the end of the run.
"""

from __future__ import annotations

import dataclasses
import sys
import time
from collections.abc import Callable

from rich.console import Console

from stallscope._version import __version__
from stallscope.analysis.context import AnalysisConfig, Context, Framework
from stallscope.analysis.diagnose import diagnose
from stallscope.analysis.finding import Finding
from stallscope.config import ScopeConfig
from stallscope.hooks.environment import compute_threads, current_device, torch_version, utc_now_iso
from stallscope.report.build import device_idle, nvml_fields, summarize
from stallscope.report.io import REPORT_NAME, write_report
from stallscope.report.render import print_diagnosis
from stallscope.report.schema import EpochReport, Report, RunInfo, Summary
from stallscope.signals.collector import SignalCollector, Signals
from stallscope.signals.host import HostInfo, host_info
from stallscope.signals.host_sampler import memory_risk_note
from stallscope.signals.loader import LoaderConfig
from stallscope.timeline.recorder import Timeline
from stallscope.timeline.stats import SpanStats

#: most epochs kept in the report (the first few and the most recent)
MAX_EPOCHS_IN_REPORT = 500


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
        detail = f"{type(exc).__name__}: {exc}" if isinstance(exc, Exception) else type(exc).__name__
    except Exception:
        detail = type(exc).__name__
    if isinstance(exc, Exception):
        return f"the {what} ended with an exception ({detail})"
    return f"the {what} was interrupted ({detail})"


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
        self.epochs: list[EpochReport] = []
        self.notes: list[str] = []
        self.report: Report | None = None
        self._started_at = ""
        self._epoch_index = 0
        #: a write of report.json failed (noted once; later epoch ends try again)
        self._write_failed = False
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

    def end_epoch(self) -> EpochReport | None:
        """Close the epoch: diagnose it, print it, write the report. None for an empty epoch."""
        stats = self.timeline.end_epoch()
        if stats.steps == 0 and stats.epochs == 0:
            return None
        # the diagnosis, the print and the report write are StallScope's time, not the run's
        self.timeline.pause()
        try:
            return self._close_epoch(stats)
        finally:
            self.timeline.resume()

    def _close_epoch(self, stats: SpanStats) -> EpochReport:
        index = self._epoch_index
        self._epoch_index += 1
        signals = self.signals.close_window()
        epoch = EpochReport(
            index=index,
            summary=self.summarize(stats, signals),
            findings=tuple(self.diagnose(stats, signals)),
        )
        self.epochs.append(epoch)
        if len(self.epochs) > MAX_EPOCHS_IN_REPORT:
            del self.epochs[10]  # keep the first ten and the most recent ones
            self.note(f"only the first 10 and the last {MAX_EPOCHS_IN_REPORT - 10} epochs are kept in the report")
        self.report = self.build_report(complete=False)
        if stats.steps > 0:
            self.print(f"epoch {index}", epoch.summary, epoch.findings)
        self.write(durable=False)
        return epoch

    def finish(self, *, print_run: bool) -> Report:
        """The run is over: build, print (when asked) and write the final report."""
        self.signals.stop()
        report = self.build_report(complete=True)
        self.report = report
        if print_run:
            self.print(f"run ({len(self.epochs)} epochs)", report.summary, report.findings, report.notes)
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
        self.start_clock()  # a run that never reached its first step: an empty report, not an error
        run_stats = self.timeline.run_stats()
        signals = self.signals.run_window()
        for text in self.signals.notes():
            self.note(text)
        risk = memory_risk_note(signals.host)
        if risk is not None:
            self.note(risk)
        return Report(
            run=RunInfo(
                started_at=self._started_at,
                host=self.host.name,
                torch_version=torch_version(),
                device=current_device(),
                dataloader=self.loader.to_dict() if self.loader is not None else None,
                stallscope_version=__version__,
                framework=self.framework,
                usable_cores=self.host.usable_cores,
            ),
            summary=self.summarize(run_stats, signals),
            epochs=tuple(self.epochs),
            findings=tuple(self.diagnose(run_stats, signals)),
            notes=tuple(self.notes),
            complete=complete,
        )

    def print(
        self,
        title: str,
        summary: Summary,
        findings: tuple[Finding, ...],
        notes: tuple[str, ...] = (),
    ) -> None:
        if self._console is not None:
            print_diagnosis(self._console, title, summary, findings, notes, self.config.min_saving)

    def write(self, *, durable: bool = True) -> None:
        """Write the report; ``durable``: wait for the disk (the final report, not each epoch's).

        A file system that refuses the write (permissions, read-only, full, a path under a file)
        loses only the file: the first failure is noted (in the report and once on stderr), the
        diagnosis goes on, and the next epoch end writes the whole report again."""
        if self.report is None or self.config.report_dir is None:
            return
        path = self.config.report_dir / REPORT_NAME
        try:
            write_report(self.report, path, durable=durable)
        except OSError as exc:
            if self._write_failed:
                return
            self._write_failed = True
            text = (
                f"{path} could not be written ({type(exc).__name__}: {exc.strerror or exc}); "
                "the diagnosis goes on and each later epoch end tries again"
            )
            self.note(text)
            self.report = dataclasses.replace(self.report, notes=tuple(self.notes))
            print(f"stallscope: {text}", file=sys.stderr)

    def warn_internal(self, exc: BaseException) -> None:
        """Say once, on stderr, that StallScope turned itself off."""
        text = f"StallScope turned itself off after an internal error ({type(exc).__name__}: {exc}); training goes on"
        self.note(text)
        self.signals.stop()
        print(f"stallscope: {text}", file=sys.stderr)
