"""What every rule receives."""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING, Literal

from stallscope.signals.calls import CallSummary
from stallscope.signals.cuda_events import CudaDevice, CudaSummary
from stallscope.signals.host_sampler import HostSummary
from stallscope.signals.loader import LoaderConfig, StartSummary
from stallscope.signals.nvml import NvmlSummary
from stallscope.signals.saves import SaveSummary
from stallscope.timeline.stats import SpanStats

if TYPE_CHECKING:
    from stallscope.analysis.loop_model import LoopModel
    from stallscope.analysis.worker_cpu import LoaderCpu

Framework = Literal["plain", "lightning", "transformers"]
#: where a plain loop's batches come from: a ``DataLoader``, another iterable that is not an
#: iterator (a list, a ``range``), an iterator of ready batches (a generator), or calls of
#: ``scope.batch(get_batch)`` (a loop with no iterable)
DataSource = Literal["loader", "iterable", "generator", "callable"]


@dataclass(frozen=True)
class RunShape:
    """How long the run will be and when it validates, where the framework says (Lightning's
    Trainer, read at fit start and at each epoch start). None: not known."""

    #: ``Trainer(max_epochs)``; None when unbounded
    max_epochs: int | None = None
    #: ``Trainer(max_steps)``; None when unbounded (Lightning's -1)
    max_steps: int | None = None
    #: ``Trainer(limit_train_batches)``: an int is batches, a float a fraction of the loader
    limit_train_batches: int | float | None = None
    #: training batches in one epoch (Lightning's ``num_training_batches``, after the limit)
    batches_per_epoch: int | None = None
    #: ``Trainer(check_val_every_n_epoch)``; None is Lightning's None (count batches across epochs)
    check_val_every_n_epoch: int | None = 1
    #: ``Trainer(val_check_interval)``: an int is batches, a float a fraction of the epoch
    val_check_interval: int | float = 1.0
    #: ``Trainer(limit_val_batches)``: an int is batches, a float a fraction of the loader
    limit_val_batches: int | float = 1.0
    #: batches in one validation run (all validation loaders), when known
    val_batches: int | None = None
    #: ``Trainer(log_every_n_steps)``: the training loop logs every this many steps (and at each
    #: epoch's end); None when not known
    log_every_n_steps: int | None = None
    #: ``Trainer(max_time)`` in seconds (its ``Timer`` callback's duration); None when unbounded
    max_time_s: float | None = None
    #: ``Trainer(min_epochs)``: epochs the fit runs whatever stops it earlier (``max_time``,
    #: ``EarlyStopping``); None when not set
    min_epochs: int | None = None
    #: the Trainer's ``ModelCheckpoint`` callbacks (Lightning's ``checkpoint_callbacks``); None when
    #: not known. With none, a fit's saves are the user's own ``trainer.save_checkpoint`` calls
    model_checkpoints: int | None = None
    #: the ``patience`` of an ``EarlyStopping`` callback, in validation checks; None without one
    early_stopping_patience: int | None = None
    #: training steps done before this fit started (a fit resumed with ``ckpt_path=``, or a
    #: second ``fit`` on the same Trainer): ``max_steps`` and ``max_epochs`` count them too
    steps_before_fit: int = 0

    @property
    def total_steps(self) -> int | None:
        """Training steps this fit will run at most: up to ``max_steps`` or ``max_epochs`` whole
        epochs, the fewer, less the steps done before it."""
        by_epochs = (
            self.max_epochs * self.batches_per_epoch
            if self.max_epochs is not None and self.batches_per_epoch is not None
            else None
        )
        known = [n for n in (self.max_steps, by_epochs) if n is not None]
        return max(0, min(known) - self.steps_before_fit) if known else None

    def fit_steps(self, step_s: float | None) -> int | None:
        """Training steps the fit can be counted on to run, steps taking ``step_s`` seconds each
        (all in: the run's wall time per step so far): ``total_steps``, and within ``max_time``
        (``MAX_TIME_MARGIN`` of it, as the steps' pace varies), but at least ``min_epochs`` whole
        epochs, which Lightning runs before ``max_time`` may stop the fit."""
        total = self.total_steps
        if self.max_time_s is None or step_s is None or step_s <= 0:
            return total
        by_time = max(1, int(MAX_TIME_MARGIN * self.max_time_s / step_s))
        if self.min_epochs is not None and self.batches_per_epoch is not None:
            by_time = max(by_time, self.min_epochs * self.batches_per_epoch)
        return by_time if total is None else min(total, by_time)


#: the share of ``max_time`` a suggestion counts on: a fit stopped by time ends at whatever step
#: the clock says, and the suggestion must still validate and save in it
MAX_TIME_MARGIN = 0.8


@dataclass(frozen=True)
class AnalysisConfig:
    """Thresholds of the diagnosis. All fractions are of wall time."""

    #: findings predicted to recover less than this are not reported
    min_saving: float = 0.02
    #: share of wall time a checkpoint schedule may take after the fix
    checkpoint_target_share: float = 0.02
    #: share of wall time logging may take after the fix
    logging_target_share: float = 0.01
    #: share of wall time validation may take after the fix
    validation_target_share: float = 0.05
    #: most workers suggested per usable core when loading waits on latency, not CPU
    io_workers_per_core: int = 4
    #: words of the fix: plain PyTorch, Lightning's Trainer arguments or transformers'
    #: ``TrainingArguments``
    framework: Framework = "plain"

    def __post_init__(self) -> None:
        for name in (
            "min_saving",
            "checkpoint_target_share",
            "logging_target_share",
            "validation_target_share",
        ):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or not 0.0 <= value < 1.0:
                raise ValueError(f"{name} must be a fraction in [0, 1), got {value!r}")
        if self.io_workers_per_core < 1:
            raise ValueError(f"io_workers_per_core must be >= 1, got {self.io_workers_per_core!r}")


@dataclass(frozen=True)
class Context:
    """One span to diagnose, with what is known about the loader and the host."""

    span: SpanStats
    #: the settings of the loader iterated in the span; None for a plain iterable
    loader: LoaderConfig | None
    #: cores this process may use
    cores: int
    config: AnalysisConfig = field(default_factory=AnalysisConfig)
    #: batches per epoch when the loader has a length
    batches_per_epoch: int | None = None
    #: tensors in one batch (counted in the first batch of each pass); None when unknown
    batch_tensors: int | None = None
    #: bytes of those tensors; None when unknown
    batch_bytes: int | None = None
    #: seconds to build one batch in the training process, timed once at a pass start while
    #: workers build them (``signals.loader.probe_batch_s``); None when not timed
    in_process_batch_s: float | None = None
    #: host threads the compute competes with workers for: torch's intra-op threads when the
    #: accelerator is the CPU itself, 1 when a GPU does the compute
    compute_threads: int = 1
    #: what NVML showed of the GPU over the span; None when no GPU was sampled
    nvml: NvmlSummary | None = None
    #: CPU of the training process and its workers, host memory; None when not sampled
    host_signals: HostSummary | None = None
    #: device-side timing of the compute phase from CUDA events; None off CUDA
    cuda: CudaSummary | None = None
    #: the CUDA device torch uses; None off CUDA
    cuda_device: CudaDevice | None = None
    #: the training precision when the framework says (Lightning's ``"32-true"``, ``"bf16-mixed"``…)
    precision: str | None = None
    #: the run's length and validation schedule where the framework says; None in plain loops
    shape: RunShape | None = None
    #: steps in one whole epoch as they really ran (a loop that ``break``s runs fewer than
    #: ``len(loader)``); None before an epoch has ended
    epoch_steps: int | None = None
    #: steps of the run before ``span`` (0 for the run; an epoch's offset), and its first epoch
    steps_before: int = 0
    first_epoch: int = 0
    #: the run so far, when ``span`` is one of its epochs: the frequency rules take each phase's
    #: cost from it, so that an epoch's finding and the run's agree on the setting
    run_span: SpanStats | None = None
    #: GPUs an ``nn.DataParallel`` in the watched model drives; None when there is none
    data_parallel_devices: int | None = None
    #: the checkpoint saves measured so far (bytes, write time, its CPU, the copy's cost); None
    #: before the first
    saves: SaveSummary | None = None
    #: the logging calls measured so far (wall time, the process's CPU in them: the Trainer's
    #: loggers in Lightning, the ``logging`` phase in a plain loop); None before the first
    logging_calls: CallSummary | None = None
    #: where the batches came from (``DataSource``); None where the framework's loader is read
    source: DataSource | None = None
    #: the validation loader's settings (Lightning's first validation loader); None when unknown
    val_loader: LoaderConfig | None = None
    #: the validation runs' start-ups measured so far (the run so far); None before the first
    val_starts: StartSummary | None = None

    # the models several rules read, made once per context (a frozen dataclass: ``cached_property``
    # keeps them in the instance's ``__dict__``; a ``replace``d context makes its own)

    @cached_property
    def loop_model(self) -> LoopModel | None:
        """``build_loop_model(self)``: the per-step costs the data rules share."""
        from stallscope.analysis.loop_model import build_loop_model

        return build_loop_model(self)

    @cached_property
    def refined_model(self) -> tuple[LoopModel, LoaderCpu] | None:
        """``worker_cpu.refined_model(self)``: the loop model with the measured CPU share."""
        from stallscope.analysis.worker_cpu import refined_model

        return refined_model(self)
