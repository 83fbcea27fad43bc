"""One observed run: owns the timeline and turns its statistics into findings and reports.

The hooks (plain loop, Lightning) drive a ``Session``; it is the only place where recording
meets analysis, and it runs only at epoch ends and at the end of the run.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from dataclasses import replace

from rich.console import Console

from stallscope._version import __version__
from stallscope.analysis.context import AnalysisConfig, Context, Framework, RunShape
from stallscope.analysis.diagnose import diagnose, too_short
from stallscope.analysis.disturbance import disturbance_note
from stallscope.analysis.finding import Finding
from stallscope.config import ScopeConfig
from stallscope.hooks.distributed import Job, data_parallel_devices, join_job
from stallscope.hooks.environment import compute_threads, current_device, torch_version, utc_now_iso
from stallscope.report.build import device_idle, nvml_fields, summarize
from stallscope.report.io import REPORT_NAME, write_report
from stallscope.report.render import print_diagnosis
from stallscope.report.schema import EpochReport, RankEntry, Report, RunInfo, Summary
from stallscope.signals.collector import SignalCollector, Signals
from stallscope.signals.host import HostInfo, host_info
from stallscope.signals.host_sampler import memory_risk_note
from stallscope.signals.loader import LoaderConfig, probe_batch_s
from stallscope.timeline.recorder import Timeline
from stallscope.timeline.stats import SpanStats

#: a tail at least this long (and 1% of the run) gets a note
TAIL_NOTE_NS = 100_000_000

#: most epochs kept in the report (the first few and the most recent)
MAX_EPOCHS_IN_REPORT = 500


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
        #: tensors per batch, counted in the first batch of each pass, and their bytes
        self.batch_tensors: int | None = None
        #: the run's length and validation schedule, where the framework says (Lightning)
        self.shape: RunShape | None = None
        #: steps of the longest epoch that ended (a loop that breaks early runs fewer than its loader)
        self.epoch_steps: int | None = None
        self.batch_bytes: int | None = None
        #: seconds to build one batch in this process, timed once while workers build them
        self.in_process_batch_s: float | None = None
        self.epochs: list[EpochReport] = []
        #: the time after the last epoch's end, set when the run finishes
        self.tail: Summary | None = None
        self.notes: list[str] = []
        self.report: Report | None = None
        #: this rank's part in a distributed job (``hooks/distributed.py``); None when alone
        self.job: Job | None = None
        #: GPUs an ``nn.DataParallel`` in the model drives (``note_model``); None when none seen
        self.data_parallel_devices: int | None = None
        #: ranks of the job on this host, where the framework says (Lightning: processes per node)
        self.local_ranks: int | None = None
        self._started_at = ""
        self._epoch_index = 0
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
        self._join_job()
        self.signals.start()

    def _join_job(self) -> None:
        """Join the distributed job this process is a rank of, if any: ranks other than 0 print
        nothing. (Again at the first epoch end when ``torch.distributed`` came up after start.)"""
        self.job = join_job(self.host.name, min_saving=self.config.min_saving, note=self.note)
        if self.job is not None and not self.job.leader:
            self._console = None

    def start_clock(self) -> None:
        """Start the timeline now if it has not started."""
        if not self.timeline.started:
            self._started_at = utc_now_iso()
            self.timeline.start()

    def note(self, text: str) -> None:
        """Add a note to the report (once per distinct text)."""
        if text not in self.notes:
            self.notes.append(text)

    def note_loader(self, loader: LoaderConfig | None, batches: int | None, iterable: object = None) -> None:
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

    def note_model(self, model: object) -> None:
        """The model being trained: look for ``nn.DataParallel`` in it (``dist.dataparallel``)."""
        self.data_parallel_devices = data_parallel_devices(model)

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
        if stats.steps > 0:
            self.epoch_steps = max(self.epoch_steps or 0, stats.steps)
        epoch = self._epoch_report(stats, signals, self.timeline.steps - stats.steps, index)
        if index == 0 and (self.job is None or self.job.exchange is None):
            self._join_job()  # torch.distributed may have come up inside the ``with`` block
        self.epochs.append(epoch)
        if len(self.epochs) > MAX_EPOCHS_IN_REPORT:
            del self.epochs[10]  # keep the first ten and the most recent ones
            self.note(f"only the first 10 and the last {MAX_EPOCHS_IN_REPORT - 10} epochs are kept in the report")
        self.report = self.build_report(complete=False)
        shown: EpochReport = epoch
        ranks: tuple[RankEntry, ...] = ()
        if self.job is not None:  # rank 0: the job's epoch and report from here on
            if self.job.leader:  # the others write theirs in ``write``
                self.job.write_own(self.report, self.config.report_dir, durable=False)
            shown, report, ranks = self.job.close_epoch(epoch, self.report)
            self.report = replace(report, notes=tuple(self.notes))
        if stats.steps > 0:
            short = too_short(stats)
            self.print(f"epoch {index}", shown.summary, shown.findings, (short,) if short else (), ranks=ranks)
        self.write(durable=False)
        return shown

    def _epoch_report(self, stats: SpanStats, signals: Signals, steps_before: int, index: int) -> EpochReport:
        # where the epoch lies in the run, and the run so far (the frequency rules pool from it)
        context = self.context(
            stats, signals, steps_before=steps_before, first_epoch=index, run_span=self.timeline.run_stats()
        )
        return EpochReport(index=index, summary=self.summarize(stats, signals), findings=tuple(diagnose(context)))

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
        run_ns = self.timeline.run_stats().wall_ns
        if run_ns > 0 and tail.wall_ns >= max(0.01 * run_ns, TAIL_NOTE_NS):
            top = max(tail.phase_ns, key=lambda name: tail.phase_ns[name])
            self.note(
                f"{tail.wall_s:.2f} s ({tail.wall_ns / run_ns:.0%} of the run, mostly {top}) came after the last"
                " epoch's end: it is in the run's time and in the report's tail, not in an epoch"
            )

    def finish(self, *, print_run: bool) -> Report:
        """The run is over: build, print (when asked) and write the final report."""
        self.signals.stop()
        self._close_tail()
        report = self.build_report(complete=True)
        ranks: tuple[RankEntry, ...] = ()
        if self.job is not None:
            if self.job.leader:
                self.job.write_own(report, self.config.report_dir, durable=True)
            report, ranks = self.job.finish(report)
            report = replace(report, notes=tuple(self.notes))
        self.report = report
        if print_run:
            # the printed diagnosis says when the run was too short to judge (the findings say it
            # with their confidence)
            short = too_short(self.timeline.run_stats()) if report.summary.steps > 0 else None
            notes = report.notes + ((short,) if short else ())
            self.print(f"run ({len(self.epochs)} epochs)", report.summary, report.findings, notes, ranks=ranks)
        self.write()
        return report

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
        signals = signals if signals is not None else Signals()
        return Context(
            span=span,
            loader=self.loader,
            cores=self.rank_cores,
            config=self.analysis,
            batches_per_epoch=self.batches_per_epoch,
            batch_tensors=self.batch_tensors,
            batch_bytes=self.batch_bytes,
            in_process_batch_s=self.in_process_batch_s,
            compute_threads=compute_threads(),
            nvml=signals.nvml,
            host_signals=signals.host,
            cuda=signals.cuda,
            cuda_device=signals.cuda_device,
            precision=self.precision,
            shape=self.shape,
            epoch_steps=self.epoch_steps,
            steps_before=steps_before,
            first_epoch=first_epoch,
            run_span=run_span,
            data_parallel_devices=self.data_parallel_devices,
        )

    @property
    def rank_cores(self) -> int:
        """The cores this process's loading can count on: the host's usable cores shared among
        the job's ranks on this host (each rank runs its own workers and compute on them)."""
        local = self.job.info.local_world_size if self.job is not None else None
        local = local or (self.local_ranks if self.job is not None else None) or 1
        return max(1, self.host.usable_cores // local)

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
        busy = disturbance_note(signals.host) if complete else None  # the numbers move until the end
        if busy is not None:
            self.note(busy)
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
                rank=self.job.info.rank if self.job is not None else None,
                world_size=self.job.info.world_size if self.job is not None else None,
                local_rank=self.job.info.local_rank if self.job is not None else None,
            ),
            summary=self.summarize(run_stats, signals),
            epochs=tuple(self.epochs),
            findings=tuple(self.diagnose(run_stats, signals)),
            notes=tuple(self.notes),
            complete=complete,
            tail=self.tail,
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
            device = self.report.run.device.kind if self.report is not None else None
            if ranks and self.job is not None:
                title = f"{title} · job of {self.job.info.world_size} ranks"
            print_diagnosis(
                self._console, title, summary, findings, notes, self.config.min_saving, device=device, ranks=ranks
            )

    def write(self, *, durable: bool = True) -> None:
        """Write the report; ``durable``: wait for the disk (the final report, not each epoch's).
        A rank other than 0 of a distributed job writes its own file, never ``report.json``."""
        if self.report is None or self.config.report_dir is None:
            return
        if self.job is not None and not self.job.leader:
            self.job.write_own(self.report, self.config.report_dir, durable=durable)
        else:
            write_report(self.report, self.config.report_dir / REPORT_NAME, durable=durable)

    def warn_internal(self, exc: BaseException) -> None:
        """Say once, on stderr, that StallScope turned itself off."""
        text = f"StallScope turned itself off after an internal error ({type(exc).__name__}: {exc}); training goes on"
        self.note(text)
        self.signals.stop()
        print(f"stallscope: {text}", file=sys.stderr)
