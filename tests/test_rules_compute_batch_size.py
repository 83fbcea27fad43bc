"""``compute.batch_size``: memory headroom allows a larger batch to spread per-step costs."""

from __future__ import annotations

import pytest
from signal_fakes import GIB, context, cuda_device, loader, nvml, record_span

from stallscope.analysis.rules import compute_batch_size

# 10% logging, 60% compute of which the GPU idles a third (host overhead)
SPAN = record_span(steps=20, data_ms=15, compute_ms=30, logging_ms=5)


def test_headroom_and_fixed_costs() -> None:
    ctx = context(
        SPAN,
        loader=loader(batch_size=32),
        cuda_device=cuda_device(max_reserved_bytes=10 * GIB, total_memory_bytes=80 * GIB),
        nvml=nvml(util_mean=0.4, util_by_phase={"compute": 2 / 3}),
    )
    f = compute_batch_size.rule(ctx)
    assert f is not None
    assert f.suggestion == {"batch_size": 128}  # 4x: 40 GiB fits in 90% of 80
    fixed = 0.1 + 0.6 * (1 - 2 / 3)
    assert f.evidence["fixed_per_step_fraction"] == pytest.approx(fixed, abs=1e-3)
    assert f.est_saving_fraction == pytest.approx(fixed * (1 - 1 / 4), abs=1e-3)
    assert f.evidence["memory_source"] == "torch.cuda.max_memory_reserved"
    assert "learning rate" in f.fix


def test_nvmls_device_wide_memory_when_torch_reports_none() -> None:
    ctx = context(
        SPAN,
        loader=loader(batch_size=16),
        cuda_device=cuda_device(max_reserved_bytes=0),
        nvml=nvml(mem_used_max_bytes=30 * GIB, mem_total_bytes=80 * GIB),
    )
    f = compute_batch_size.rule(ctx)
    assert f is not None
    assert f.suggestion == {"batch_size": 32}
    assert f.evidence["memory_source"] == "nvml (whole device)"


@pytest.mark.parametrize(
    "fields",
    [
        {"loader": loader(batch_size=32), "cuda_device": cuda_device(max_reserved_bytes=50 * GIB)},  # no room
        {"loader": loader(batch_size=None), "cuda_device": cuda_device()},  # batch size unknown
        {"loader": loader(batch_size=32)},  # no GPU at all
    ],
)
def test_no_finding(fields: dict[str, object]) -> None:
    assert compute_batch_size.rule(context(SPAN, **fields)) is None


def test_nothing_fixed_to_spread_means_no_finding() -> None:
    span = record_span(steps=20, data_ms=10, compute_ms=40)
    ctx = context(span, loader=loader(), cuda_device=cuda_device(), nvml=nvml(util_by_phase={"compute": 1.0}))
    assert compute_batch_size.rule(ctx) is None
