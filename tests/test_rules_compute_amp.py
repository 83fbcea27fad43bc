"""``compute.amp``: a device-bound float32 loop would gain from mixed precision."""

from __future__ import annotations

import pytest
from signal_fakes import context, cuda, cuda_device, nvml, record_span

from stallscope.analysis.rules import compute_amp
from stallscope.analysis.rules.compute_amp import AMP_SPEEDUP

SPAN = record_span(steps=20, data_ms=2, compute_ms=48)  # compute 96% of the wall time
BUSY = nvml(util_mean=0.92, util_by_phase={"compute": 0.95})


def test_device_bound_in_float32() -> None:
    f = compute_amp.rule(context(SPAN, cuda_device=cuda_device(), nvml=BUSY))
    assert f is not None
    assert f.suggestion == {"precision": "bf16-mixed"}
    assert f.est_saving_fraction == pytest.approx(0.96 * 0.95 * (1 - 1 / AMP_SPEEDUP), abs=1e-3)
    assert f.confidence == "low"  # a plain loop may use autocast already
    assert "torch.bfloat16" in f.snippet
    assert "TF32" in f.fix
    assert "1.6x faster; a model that is mostly matrix math gains more" in f.fix


def test_lightning_in_32_bit_is_more_certain() -> None:
    ctx = context(SPAN, framework="lightning", cuda_device=cuda_device(), nvml=BUSY, precision="32-true")
    f = compute_amp.rule(ctx)
    assert f is not None
    assert f.confidence == "medium"
    assert f.snippet == 'Trainer(precision="bf16-mixed")'


def test_older_tensor_cores_get_float16() -> None:
    f = compute_amp.rule(context(SPAN, cuda_device=cuda_device(capability=(7, 5)), nvml=BUSY))
    assert f is not None
    assert f.suggestion == {"precision": "16-mixed"}
    assert "GradScaler" in f.snippet


def test_cuda_events_alone_are_enough() -> None:
    events = cuda(busy_ns=int(0.9 * SPAN.wall_ns), phases=20)
    f = compute_amp.rule(context(SPAN, cuda_device=cuda_device(), cuda=events))
    assert f is not None
    assert f.evidence["busy_source"] == "cuda_events"
    assert f.est_saving_fraction == pytest.approx(0.9 * (1 - 1 / AMP_SPEEDUP), abs=1e-3)


@pytest.mark.parametrize(
    "fields",
    [
        {"precision": "bf16-mixed"},  # already mixed
        {"cuda_device": cuda_device(capability=(6, 1))},  # no tensor cores
        {"nvml": nvml(util_mean=0.4, util_by_phase={"compute": 0.95})},  # not device-bound
        {"nvml": nvml(util_mean=0.7, util_by_phase={"compute": 0.6})},  # launch-bound compute
        {"cuda_device": None},  # torch not on CUDA
    ],
)
def test_no_finding(fields: dict[str, object]) -> None:
    base: dict[str, object] = {"cuda_device": cuda_device(), "nvml": BUSY}
    base.update(fields)
    assert compute_amp.rule(context(SPAN, **base)) is None
