"""One rule per module. A rule is ``(Context) -> Finding | None``; ``ALL_RULES`` lists them."""

from __future__ import annotations

from collections.abc import Callable

from stallscope.analysis.context import Context
from stallscope.analysis.finding import Finding
from stallscope.analysis.rules import (
    checkpoint_frequency,
    compute_amp,
    compute_batch_size,
    data_batch_indexing,
    data_cpu_bound,
    data_io_bound,
    data_persistent_workers,
    data_pin_memory,
    data_prefetch,
    data_workers,
    dist_dataparallel,
    gpu_throttle,
    host_memory,
    host_overhead,
    host_sync,
    logging_frequency,
    validation_frequency,
)

Rule = Callable[[Context], "Finding | None"]

ALL_RULES: tuple[Rule, ...] = (
    data_workers.rule,
    data_batch_indexing.rule,
    data_prefetch.rule,
    data_persistent_workers.rule,
    checkpoint_frequency.rule,
    logging_frequency.rule,
    validation_frequency.rule,
    # rules that need the background signals (NVML, host sampler, CUDA events)
    data_cpu_bound.rule,
    data_io_bound.rule,
    data_pin_memory.rule,
    host_sync.rule,
    host_overhead.rule,
    compute_amp.rule,
    compute_batch_size.rule,
    gpu_throttle.rule,
    host_memory.rule,
    dist_dataparallel.rule,
)
