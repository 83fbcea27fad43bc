"""The what-if model of the input pipeline, on hand-built spans with numbers worked out here."""

from __future__ import annotations

import pytest

from stallscope.analysis.context import AnalysisConfig, Context
from stallscope.analysis.loop_model import (
    PASS_START_BASE_S,
    PASS_START_PER_WORKER_S,
    TRANSFER_BASE_S,
    TRANSFER_PER_TENSOR_S,
    build_loop_model,
)
from stallscope.signals.loader import LoaderConfig
from stallscope.timeline.stats import Distribution, EpochBoundary, SpanStats

MS = 1_000_000


def starved_span(steps: int = 100, wait_ms: int = 8, consumer_ms: int = 2, cpu_share: float = 1.0) -> SpanStats:
    """``steps`` steps of ``wait_ms`` in-process loading then ``consumer_ms`` of work, one pass."""
    data_ns = steps * wait_ms * MS
    return SpanStats(
        wall_ns=steps * (wait_ms + consumer_ms) * MS,
        steps=steps,
        epochs=1,
        step_total_ns=steps * (wait_ms + consumer_ms) * MS,
        phase_ns={"data": data_ns, "compute": steps * consumer_ms * MS, "other": 0},
        phase_counts={"data": steps, "compute": steps},
        step=Distribution.of([(wait_ms + consumer_ms) * MS] * steps),
        data_wait=Distribution.of([wait_ms * MS] * steps),
        data_cpu_ns=round(data_ns * cpu_share),
        process_cpu_ns=round(data_ns * cpu_share) + steps * consumer_ms * MS,
        boundaries=(EpochBoundary(index=0, iter_ns=0, first_wait_ns=wait_ms * MS, last_wait_ns=0),),
    )


def loader(workers: int = 0, persistent: bool = False) -> LoaderConfig:
    return LoaderConfig(
        num_workers=workers,
        pin_memory=False,
        prefetch_factor=2 if workers else None,
        persistent_workers=persistent,
        batch_size=16,
    )


def ctx(span: SpanStats, *, cores: int = 2, workers: int = 0, tensors: int = 2) -> Context:
    return Context(span=span, loader=loader(workers), cores=cores, config=AnalysisConfig(), batch_tensors=tensors)


def test_costs_are_read_from_the_span() -> None:
    model = build_loop_model(ctx(starved_span()))
    assert model is not None
    assert model.steps == 99  # the first step of the pass belongs to its start-up
    assert model.consumer_s == pytest.approx(0.002)
    assert model.wait_s == pytest.approx(0.008)
    assert model.load_s == pytest.approx(0.008)
    assert model.load_cpu_s == pytest.approx(0.008)
    assert model.load_cpu_measured
    assert model.main_cpu_s == pytest.approx(0.002)
    assert model.transfer_s == pytest.approx(TRANSFER_BASE_S + 2 * TRANSFER_PER_TENSOR_S)
    assert model.starved


def test_step_time_is_the_slowest_of_consumer_workers_and_cores() -> None:
    model = build_loop_model(ctx(starved_span()))
    assert model is not None
    x = TRANSFER_BASE_S + 2 * TRANSFER_PER_TENSOR_S
    assert model.predict_step_s(0) == pytest.approx(0.010)
    assert model.predict_step_s(1) == pytest.approx(0.008 + x)  # one worker: its production rate
    cpu_bound = (0.002 + 0.008 + 2 * x) / 2  # all CPU work over 2 cores
    assert model.predict_step_s(2) == pytest.approx(max((0.008 + x) / 2, cpu_bound))
    assert model.predict_step_s(8) == pytest.approx(cpu_bound)  # more workers cannot beat the cores
    assert model.best_workers(cap=8) == 2


def test_latency_bound_loading_is_not_capped_by_the_cores() -> None:
    """Loading that waits (little CPU) scales with workers beyond the core count."""
    model = build_loop_model(ctx(starved_span(cpu_share=0.05)))
    assert model is not None
    assert model.cpu_share_of_loading == pytest.approx(0.05)
    assert model.predict_step_s(8) < model.predict_step_s(2)
    assert model.best_workers(cap=8) > 2


def test_saving_counts_the_start_up_of_each_pass() -> None:
    model = build_loop_model(ctx(starved_span()))
    assert model is not None
    x = TRANSFER_BASE_S + 2 * TRANSFER_PER_TENSOR_S
    now = 99 * 0.010 + (0.008 + 0.002)  # steady steps + the pass's first batch and step
    after = 99 * model.predict_step_s(2) + (PASS_START_BASE_S + 2 * PASS_START_PER_WORKER_S + 0.008 + 0.002)
    assert model.predict_saving_s(2) == pytest.approx(now - after)
    assert x > 0


def test_a_loader_with_workers_is_modelled_from_its_production_rate() -> None:
    """With N workers and a starved loop, one worker makes a batch in N x the step time."""
    span = starved_span()
    model = build_loop_model(Context(span=span, loader=loader(2), cores=4, config=AnalysisConfig()))
    assert model is not None
    assert model.load_s == pytest.approx(2 * 0.010)
    assert model.transfer_s == 0  # already inside the measured times
    assert not model.load_cpu_measured


def test_too_short_a_span_gives_no_model() -> None:
    assert build_loop_model(ctx(starved_span(steps=3))) is None
