"""``host.sync``: the GPU works only while the loop is in compute, so host and device never overlap."""

from __future__ import annotations

import pytest
from signal_fakes import context, cuda, cuda_device, nvml, record_span

from stallscope.analysis.rules import host_sync

# half the step waiting for data, half computing
SPAN = record_span(steps=20, data_ms=25, compute_ms=25)


def sync_ctx(**fields: object) -> object:
    fields.setdefault("cuda_device", cuda_device())
    fields.setdefault("nvml", nvml(util_mean=0.5 * 0.95 + 0.5 * 0.02, util_by_phase={"compute": 0.95, "data": 0.02}))
    return context(SPAN, **fields)


def test_a_gpu_that_stops_with_the_compute_phase() -> None:
    f = host_sync.rule(sync_ctx())  # type: ignore[arg-type]
    assert f is not None
    c, u_c, u_o = 0.5, 0.95, 0.02
    device = c * u_c + (1 - c) * u_o
    host = (1 - c) + c * (1 - u_c)
    assert f.est_saving_fraction == pytest.approx(1 - max(device, host), abs=2e-3)
    assert f.evidence["gpu_util_in_compute"] == 0.95
    assert f.evidence["gpu_util_elsewhere"] == pytest.approx(0.02, abs=2e-3)
    assert f.confidence == "low"
    assert ".item()" in f.fix


def test_cuda_events_corroborate() -> None:
    events = cuda(busy_ns=int(0.9 * SPAN.phase_ns["compute"]), phases=20)
    f = host_sync.rule(sync_ctx(cuda=events))  # type: ignore[arg-type]
    assert f is not None
    assert f.confidence == "medium"
    assert f.evidence["device_span_over_compute"] == pytest.approx(0.9)


def test_a_short_windows_borrowed_busy_time_corroborates_too() -> None:
    """An epoch with too few timed phases of its own takes the run's busy time per phase
    (``CudaSummary.borrowed``): still the device's span, not nothing."""
    events = cuda(busy_ns=int(0.9 * SPAN.phase_ns["compute"]), phases=0, borrowed=True)
    f = host_sync.rule(sync_ctx(cuda=events))  # type: ignore[arg-type]
    assert f is not None
    assert f.confidence == "medium"
    assert f.evidence["device_span_over_compute"] == pytest.approx(0.9)


def test_not_when_the_gpu_keeps_working_while_the_host_does_other_things() -> None:
    overlapped = nvml(util_mean=0.9, util_by_phase={"compute": 0.95, "data": 0.85})
    assert host_sync.rule(sync_ctx(nvml=overlapped)) is None  # type: ignore[arg-type]


def test_not_without_per_phase_utilization_or_off_cuda() -> None:
    assert host_sync.rule(sync_ctx(nvml=nvml(util_mean=0.5))) is None  # type: ignore[arg-type]
    assert host_sync.rule(sync_ctx(cuda_device=None)) is None  # type: ignore[arg-type]
    assert host_sync.rule(sync_ctx(nvml=nvml(util_mean=0.5, util_samples=3, util_by_phase={"compute": 0.95}))) is None  # type: ignore[arg-type]
