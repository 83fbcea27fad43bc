"""Builders for rule tests that need background signals: spans recorded on fake clocks, and
NVML / host / CUDA summaries with sensible defaults (override any field by keyword)."""

from __future__ import annotations

import itertools
from typing import Any

from conftest import FakeClock

from stallscope.analysis.context import AnalysisConfig, Context
from stallscope.signals.cuda_events import CudaDevice, CudaSummary
from stallscope.signals.host_sampler import HostSummary
from stallscope.signals.loader import LoaderConfig
from stallscope.signals.nvml import NvmlSummary
from stallscope.timeline.recorder import Timeline
from stallscope.timeline.stats import SpanStats

GIB = 1024**3


def record_span(
    *,
    steps: int = 20,
    data_ms: float = 0.0,
    data_cpu_ms: float = 0.0,
    compute_ms: float = 10.0,
    compute_cpu_ms: float | None = None,
    h2d_ms: float = 0.0,
    logging_ms: float = 0.0,
    in_process: bool = True,
    blocked: bool = True,
) -> SpanStats:
    """A span of ``steps`` identical steps: data wait, h2d copy, compute, logging. ``blocked``:
    each wait for data blocks (the thread's voluntary switches move at each reading), so its time
    off the CPU waited on storage; else none does, and that time is still (``data_still_ns``)."""
    clock, cpu = FakeClock(), FakeClock()
    reads = itertools.count()
    tl = Timeline(clock=clock, cpu_clock=cpu, switch_clock=reads.__next__ if blocked else lambda: 0)
    tl.start()
    tl.begin_epoch(in_process_data=in_process)
    ids = {name: tl.phase_id(name) for name in ("h2d", "compute", "logging")}
    for _ in range(steps):
        tl.data_begin()
        clock.advance_ms(data_ms)
        cpu.advance_ms(data_cpu_ms)
        tl.data_end(got_item=True)
        for name, ms in (("h2d", h2d_ms), ("compute", compute_ms), ("logging", logging_ms)):
            if ms:
                tl.enter(ids[name])
                clock.advance_ms(ms)
                cpu.advance_ms(compute_cpu_ms if compute_cpu_ms is not None and name == "compute" else ms)
                tl.leave()
    return tl.end_epoch()


def loader(**overrides: Any) -> LoaderConfig:
    fields: dict[str, Any] = {
        "num_workers": 0,
        "pin_memory": False,
        "prefetch_factor": None,
        "persistent_workers": False,
        "batch_size": 32,
    }
    fields.update(overrides)
    if fields["num_workers"] and fields["prefetch_factor"] is None:
        fields["prefetch_factor"] = 2
    return LoaderConfig(**fields)


def nvml(**overrides: Any) -> NvmlSummary:
    fields: dict[str, Any] = {
        "index": 0,
        "uuid": "GPU-1",
        "name": "Fake GPU",
        "util_samples": 100,
        "util_mean": 0.5,
        "util_by_phase": {},
        "mem_used_max_bytes": 8 * GIB,
        "mem_total_bytes": 80 * GIB,
    }
    fields.update(overrides)
    return NvmlSummary(**fields)


def host(**overrides: Any) -> HostSummary:
    fields: dict[str, Any] = {
        "wall_s": 10.0,
        "main_cpu_s": 5.0,
        "workers_cpu_s": 0.0,
        "max_children": 0,
        "cores": 4,
        "rss_max_bytes": 2 * GIB,
        "mem_available_min_bytes": 20 * GIB,
        "mem_limit_bytes": 32 * GIB,
        "mem_stall_some_s": 0.0,
        "mem_stall_full_s": 0.0,
        "disk_read_bytes_per_s": 1e6,
    }
    fields.update(overrides)
    return HostSummary(**fields)


def cuda_device(**overrides: Any) -> CudaDevice:
    fields: dict[str, Any] = {
        "index": 0,
        "name": "Fake GPU",
        "uuid": "GPU-1",
        "capability": (9, 0),
        "total_memory_bytes": 80 * GIB,
        "max_reserved_bytes": 10 * GIB,
        "max_allocated_bytes": 8 * GIB,
        "tf32_matmul": False,
    }
    fields.update(overrides)
    return CudaDevice(**fields)


def cuda(**overrides: Any) -> CudaSummary:
    fields: dict[str, Any] = {"busy_ns": 0, "phases": 0, "dropped": 0, "pending": 0}
    fields.update(overrides)
    return CudaSummary(**fields)


def context(span: SpanStats, *, cores: int = 4, framework: str = "plain", **fields: Any) -> Context:
    fields.setdefault("loader", None)
    return Context(span=span, cores=cores, config=AnalysisConfig(framework=framework), **fields)  # type: ignore[arg-type]
