"""``data.cpu_bound``: starved, CPU-heavy loading, and the cores are the limit."""

from __future__ import annotations

import pytest
from signal_fakes import context, host, loader, nvml, record_span

from stallscope.analysis.rules import data_cpu_bound


def starved_with_workers(*, cores: int = 4, **host_fields: object) -> object:
    """20 steps of 20 ms waiting + 10 ms computing (0.6 s) with 4 workers: a worker takes
    4 x 30 = 120 ms per batch, so 20 batches of all-CPU work are 2.4 worker-seconds."""
    span = record_span(steps=20, data_ms=20, compute_ms=10, in_process=False)
    fields: dict[str, object] = {"wall_s": 0.6, "main_cpu_s": 0.06, "cores": cores}
    fields.update(host_fields)
    return context(span, cores=cores, loader=loader(num_workers=4), host_signals=host(**fields))


def test_workers_burning_every_core() -> None:
    ctx = starved_with_workers(workers_cpu_s=2.28)  # 95% of each batch's time on a CPU
    f = data_cpu_bound.rule(ctx)  # type: ignore[arg-type]
    assert f is not None
    assert f.id == "data.cpu_bound"
    assert f.suggestion == {}
    assert f.evidence["cpu_busy_fraction"] == pytest.approx((0.06 + 2.28) / (0.6 * 4), abs=1e-4)
    assert f.evidence["loading_cpu_share"] == pytest.approx(0.95)
    assert f.evidence["cpu_measured_in"] == "workers"
    assert 0.1 < f.est_saving_fraction < 0.6
    assert f.est_speedup == pytest.approx(1 / (1 - f.est_saving_fraction), abs=1e-3)
    assert "More workers cannot help" in f.fix


def test_a_collate_fn_of_the_users_is_named_where_each_sample_is_not_the_cost() -> None:
    """Text batches made by a collate_fn of the user's: no decode nor resize to speak of, the
    batch is what costs; torch's own collate leaves the per-sample advice."""
    span = record_span(steps=20, data_ms=20, compute_ms=10, in_process=False)
    fields: dict[str, object] = {"wall_s": 0.6, "main_cpu_s": 0.06, "cores": 4, "workers_cpu_s": 2.28}
    own = context(span, cores=4, loader=loader(num_workers=4, collate="pad_and_tokenize"), host_signals=host(**fields))
    f = data_cpu_bound.rule(own)  # type: ignore[arg-type]
    assert f is not None
    assert "the loader's collate_fn (pad_and_tokenize) and the dataset's __getitem__ run for every batch" in f.fix
    assert "decode and resize" not in f.fix
    default = data_cpu_bound.rule(starved_with_workers(workers_cpu_s=2.28))  # type: ignore[arg-type]
    assert default is not None
    assert "decode and resize once" in default.fix


def test_not_when_cores_are_left() -> None:
    assert data_cpu_bound.rule(starved_with_workers(cores=8, workers_cpu_s=2.28)) is None  # type: ignore[arg-type]


def test_not_when_workers_wait() -> None:
    assert data_cpu_bound.rule(starved_with_workers(workers_cpu_s=0.24)) is None  # type: ignore[arg-type]


def test_not_without_worker_cpu_evidence() -> None:
    span = record_span(steps=20, data_ms=20, compute_ms=10, in_process=False)
    assert data_cpu_bound.rule(context(span, loader=loader(num_workers=4))) is None


def test_the_saving_is_capped_by_the_gpus_idle_time_during_data_waits() -> None:
    ctx = starved_with_workers(workers_cpu_s=2.28)
    uncapped = data_cpu_bound.rule(ctx)  # type: ignore[arg-type]
    capped_ctx = context(
        ctx.span,  # type: ignore[attr-defined]
        cores=4,
        loader=loader(num_workers=4),
        host_signals=ctx.host_signals,  # type: ignore[attr-defined]
        nvml=nvml(util_by_phase={"data": 0.9, "compute": 0.95}),
    )
    capped = data_cpu_bound.rule(capped_ctx)
    assert uncapped is not None
    assert capped is not None
    data_share = ctx.span.phase_fraction("data")  # type: ignore[attr-defined]
    assert capped.est_saving_fraction == pytest.approx(data_share * 0.1, abs=1e-4)
    assert capped.est_saving_fraction < uncapped.est_saving_fraction
    assert capped.evidence["gpu_util_during_data"] == 0.9


def test_in_process_loading_on_one_core() -> None:
    span = record_span(steps=20, data_ms=20, data_cpu_ms=19, compute_ms=10)
    f = data_cpu_bound.rule(context(span, cores=1))
    assert f is not None
    assert f.evidence["cpu_measured_in"] == "in_process"


def test_in_process_loading_with_free_cores_is_data_workers_business() -> None:
    span = record_span(steps=20, data_ms=20, data_cpu_ms=19, compute_ms=10)
    assert data_cpu_bound.rule(context(span, cores=8)) is None


def test_not_cpu_bound_when_the_sampled_cores_idle() -> None:
    """In-process loading of 20 ms per batch, all CPU, on one core that the host sampler saw 60%
    busy (other work had it the rest): the loop model alone would call the core the limit (a
    worker's batch plus the compute would not fit on it), the measurement says it was not."""
    span = record_span(steps=20, data_ms=20, data_cpu_ms=20, compute_ms=10)
    unsampled = context(span, cores=1, loader=loader())
    assert data_cpu_bound.rule(unsampled) is not None
    busy = host(wall_s=0.6, main_cpu_s=0.36, cores=1)
    assert data_cpu_bound.rule(context(span, cores=1, loader=loader(), host_signals=busy)) is None


def test_a_dataset_of_tensors_is_not_told_to_decode() -> None:
    ctx = starved_with_workers(workers_cpu_s=2.28)
    in_memory = context(
        ctx.span,  # type: ignore[attr-defined]
        cores=4,
        loader=loader(num_workers=4, in_memory="TensorDataset", per_sample_indexing=True),
        host_signals=ctx.host_signals,  # type: ignore[attr-defined]
    )
    f = data_cpu_bound.rule(in_memory)
    assert f is not None
    assert "decode" not in f.fix
    assert "data.batch_indexing" in f.fix
