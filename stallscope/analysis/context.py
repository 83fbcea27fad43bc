"""What every rule receives."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from stallscope.signals.cuda_events import CudaDevice, CudaSummary
from stallscope.signals.host_sampler import HostSummary
from stallscope.signals.loader import LoaderConfig
from stallscope.signals.nvml import NvmlSummary
from stallscope.timeline.stats import SpanStats

Framework = Literal["plain", "lightning"]


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
    #: words of the fix: plain PyTorch or Lightning's Trainer arguments
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
    #: GPUs an ``nn.DataParallel`` in the watched model drives; None when there is none
    data_parallel_devices: int | None = None
