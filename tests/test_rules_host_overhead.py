"""``host.overhead``: the GPU idles inside the compute phase waiting for kernel launches."""

from __future__ import annotations

import pytest
from signal_fakes import context, cuda_device, nvml, record_span

from stallscope.analysis.rules import host_overhead
from stallscope.analysis.rules.host_overhead import RECOVERED

SPAN = record_span(steps=20, data_ms=10, compute_ms=40)  # compute 80% of the wall time


def test_a_launch_bound_step() -> None:
    ctx = context(SPAN, cuda_device=cuda_device(), nvml=nvml(util_mean=0.25, util_by_phase={"compute": 0.3}))
    f = host_overhead.rule(ctx)
    assert f is not None
    assert f.est_saving_fraction == pytest.approx(RECOVERED * 0.8 * (1 - 0.3), abs=1e-3)
    assert f.evidence["gpu_idle_in_compute_fraction"] == pytest.approx(0.56)
    assert "torch.compile" in f.snippet
    assert f.suggestion == {}


def test_not_when_the_gpu_is_busy_in_compute() -> None:
    ctx = context(SPAN, cuda_device=cuda_device(), nvml=nvml(util_mean=0.8, util_by_phase={"compute": 0.9}))
    assert host_overhead.rule(ctx) is None


def test_not_when_torch_is_not_on_the_gpu() -> None:
    """nvml_device given while torch runs on the CPU: a busy CPU compute phase says nothing about launches."""
    ctx = context(SPAN, nvml=nvml(util_mean=0.0, util_by_phase={"compute": 0.0}))
    assert host_overhead.rule(ctx) is None
