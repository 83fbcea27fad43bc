"""The what-if model of the input pipeline, on hand-built spans with numbers worked out here."""

from __future__ import annotations

from dataclasses import replace

import pytest

from stallscope.analysis import loop_model
from stallscope.analysis.context import AnalysisConfig, Context
from stallscope.analysis.loop_model import (
    COLD_GAP_S,
    COLD_STEP_BASE_S,
    COLD_STEP_SHARE,
    MAIN_TRANSFER_BASE_S,
    MAIN_TRANSFER_PER_BYTE_S,
    MAIN_TRANSFER_PER_TENSOR_S,
    PASS_START_BASE_S,
    PASS_START_PER_WORKER_S,
    WORKER_TRANSFER_BASE_S,
    WORKER_TRANSFER_PER_BYTE_S,
    WORKER_TRANSFER_PER_TENSOR_S,
    build_loop_model,
)
from stallscope.analysis.rules import data_workers
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


#: the hand-over of a batch of two tensors of unknown size: in the training process, in the worker
XM = MAIN_TRANSFER_BASE_S + 2 * MAIN_TRANSFER_PER_TENSOR_S
XW = WORKER_TRANSFER_BASE_S + 2 * WORKER_TRANSFER_PER_TENSOR_S


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
    assert model.transfer_main_s == pytest.approx(XM)
    assert model.transfer_worker_s == pytest.approx(XW)
    assert model.starved


def test_step_time_is_the_slowest_of_consumer_workers_and_cores(monkeypatch: pytest.MonkeyPatch) -> None:
    """Tensors handed over by name (the ``file_system`` strategy): no wait for a worker's GIL."""
    monkeypatch.setattr(loop_model, "_tensors_as_descriptors", lambda: False)
    model = build_loop_model(ctx(starved_span()))
    assert model is not None
    assert model.gil_wait_s == 0
    assert model.predict_step_s(0) == pytest.approx(0.010)
    assert model.predict_step_s(1) == pytest.approx(0.008 + XW)  # one worker: its production rate
    cpu_bound = (0.002 + 0.008 + XM + XW) / 2  # all CPU work over 2 cores
    assert model.predict_step_s(2) == pytest.approx(max((0.008 + XW) / 2, 0.002 + XM, cpu_bound))
    assert model.predict_step_s(8) == pytest.approx(cpu_bound)  # more workers cannot beat the cores
    assert model.best_workers(cap=8) == 2


def test_a_worker_busy_in_python_makes_each_tensor_wait_for_its_gil(monkeypatch: pytest.MonkeyPatch) -> None:
    """CPU-bound loading, tensors passed as file descriptors: each of the batch's 2 tensors is
    fetched from a worker that holds its GIL while it makes the next batch, up to the 5 ms switch
    interval, for the share of the time the worker is busy. With 2 workers the consumer then sets
    the step: step = c + x_m + g * ((P + x_w) / 2) / step, worked out here as its positive root."""
    monkeypatch.setattr(loop_model, "_tensors_as_descriptors", lambda: True)
    monkeypatch.setattr(loop_model.sys, "getswitchinterval", lambda: 0.005)
    model = build_loop_model(ctx(starved_span()))
    assert model is not None
    assert model.gil_wait_s == pytest.approx(2 * 0.005)
    a = 0.002 + XM  # 3.3 ms
    production = (0.008 + XW) / 2  # 4.445 ms
    step = (a + (a * a + 4 * 0.010 * production) ** 0.5) / 2
    assert step == pytest.approx(0.008518, abs=1e-6)
    assert step == pytest.approx(a + 0.010 * production / step)  # the root: the wait at the busy share
    assert model.predict_step_s(2) == pytest.approx(step)
    assert model.gil_wait_at(2) == pytest.approx(0.010 * production / step)
    assert model.predict_step_s(0) == pytest.approx(0.010)  # no worker, no hand-over
    # the same loading, waiting on storage (5% CPU): the worker lets go of its GIL, no wait
    waiting = build_loop_model(ctx(starved_span(cpu_share=0.05)))
    assert waiting is not None
    assert waiting.gil_wait_s == 0
    # 16 cores: the loop keeps 0.76 ms of its 4.445 ms step's cores busy (17%), so 17% of g
    roomy = build_loop_model(ctx(starved_span(), cores=16))
    assert roomy is not None
    cores_step = (0.002 + 0.008 + XM + XW) / 16
    g = 0.010 * cores_step / production
    step16 = (a + (a * a + 4 * g * production) ** 0.5) / 2
    assert g == pytest.approx(0.00171, abs=1e-5)
    assert roomy.predict_step_s(2) == pytest.approx(max(step16, production))
    assert roomy.predict_step_s(2) < step


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
    now = 99 * 0.010 + (0.008 + 0.002)  # steady steps + the pass's first batch and step
    first = PASS_START_BASE_S + 2 * PASS_START_PER_WORKER_S + 0.008 + XM + XW + 0.002
    after = 99 * model.predict_step_s(2) + first
    assert model.predict_saving_s(2) == pytest.approx(now - after)


def test_a_loader_with_workers_is_modelled_from_its_production_rate() -> None:
    """With N workers and a starved loop, one worker makes a batch in N x the step time."""
    span = starved_span()
    model = build_loop_model(Context(span=span, loader=loader(2), cores=4, config=AnalysisConfig()))
    assert model is not None
    # a worker makes a batch and hands it over in 2 x 10 ms; x_m is the training process's
    assert model.load_s == pytest.approx(2 * 0.010 - XW)  # two tensors assumed when not counted
    assert model.load_source == "production"
    assert not model.load_cpu_measured


def test_too_short_a_span_gives_no_model() -> None:
    assert build_loop_model(ctx(starved_span(steps=3))) is None


def test_the_hand_over_grows_with_tensors_and_bytes() -> None:
    span = starved_span()
    c = Context(span=span, loader=loader(), cores=2, config=AnalysisConfig(), batch_tensors=3, batch_bytes=10**6)
    model = build_loop_model(c)
    assert model is not None
    assert model.transfer_main_s == pytest.approx(
        MAIN_TRANSFER_BASE_S + 3 * MAIN_TRANSFER_PER_TENSOR_S + 1e6 * MAIN_TRANSFER_PER_BYTE_S
    )
    assert model.transfer_worker_s == pytest.approx(
        WORKER_TRANSFER_BASE_S + 3 * WORKER_TRANSFER_PER_TENSOR_S + 1e6 * WORKER_TRANSFER_PER_BYTE_S
    )


def handed_over(*, probe_s: float | None, wait_ms: float = 1.5, compute_cpu_ms: float = 1.0) -> Context:
    """Two workers on 2 cores, 200 steps: 1 ms of compute, then ``wait_ms`` in ``next()`` every step
    (batches already queued: the wait is the training process's side of the hand-over, CPU work)."""
    from signal_fakes import record_span

    span = record_span(
        steps=200,
        data_ms=wait_ms,
        data_cpu_ms=wait_ms,
        compute_ms=1.0,
        compute_cpu_ms=compute_cpu_ms,
        in_process=False,
    )
    return Context(
        span=span,
        loader=loader(2),
        cores=2,
        config=AnalysisConfig(),
        batch_tensors=2,
        in_process_batch_s=probe_s,
    )


def test_an_in_memory_batch_cheaper_than_its_hand_over_predicts_fewer_workers() -> None:
    model = build_loop_model(handed_over(probe_s=0.3e-3))
    assert model is not None
    assert model.load_source == "probe"
    assert model.load_s == pytest.approx(0.3e-3)
    assert model.transfer_main_s == pytest.approx(XM)  # 1.3 ms estimated, under the 1.5 ms waits
    # the measured 1 ms step followed a batch from a worker: cold in full. Without workers it
    # follows 0.3 ms of indexing, cold for 0.3 / COLD_GAP_S of d
    hot = (1.0e-3 - COLD_STEP_BASE_S) / (1 + COLD_STEP_SHARE)
    drag = COLD_STEP_BASE_S + COLD_STEP_SHARE * hot
    assert model.step_drag_s == pytest.approx(drag)
    assert model.predict_step_s(0) == pytest.approx(hot + drag * 0.3e-3 / COLD_GAP_S + 0.3e-3)
    assert model.predict_step_s(2) >= 1.0e-3 + XM
    assert model.best_workers(2, lowest=0) == 0


def test_the_cold_step_is_what_the_benchmark_measured() -> None:
    """``benchmarks/handoff.py --drag-only`` on the 2-core box (27 Nov): a median 0.32 ms more a
    step after a batch from a worker for a 0.8 ms step, 0.28 ms for 1.9 ms, 0.41 ms for 7 ms."""
    for step_ms, measured_ms in ((0.8, 0.32), (1.9, 0.28), (7.0, 0.41)):
        modelled_ms = (COLD_STEP_BASE_S + COLD_STEP_SHARE * step_ms * 1e-3) * 1e3
        assert modelled_ms == pytest.approx(measured_ms, abs=0.1)


def test_brief_in_process_loading_leaves_the_step_warm_and_workers_would_not() -> None:
    """0.4 ms of indexing before each 1 ms step: a fifth of d now, all of it with workers."""
    from signal_fakes import record_span

    span = record_span(steps=200, data_ms=0.4, data_cpu_ms=0.4, compute_ms=1.0)
    model = build_loop_model(Context(span=span, loader=loader(0), cores=2, config=AnalysisConfig()))
    assert model is not None
    share = 0.4e-3 / COLD_GAP_S
    hot = (1.0e-3 - COLD_STEP_BASE_S * share) / (1 + COLD_STEP_SHARE * share)
    assert model.step_drag_s == pytest.approx(COLD_STEP_BASE_S + COLD_STEP_SHARE * hot)
    assert model.consumer_at(0) == pytest.approx(1.0e-3)
    assert model.consumer_at(1) == pytest.approx(hot + model.step_drag_s)
    assert model.consumer_at(1) > 1.0e-3


def test_long_in_process_loading_leaves_the_step_as_cold_as_workers_do() -> None:
    span = starved_span(wait_ms=8, consumer_ms=2)  # 8 ms of loading: past COLD_GAP_S
    model = build_loop_model(ctx(span))
    assert model is not None
    assert model.step_drag_s > 0
    assert model.consumer_at(0) == model.consumer_at(1) == model.consumer_at(4) == pytest.approx(2e-3)


def test_on_a_gpu_the_step_does_not_change_with_the_workers() -> None:
    from signal_fakes import cuda_device

    context = replace(handed_over(probe_s=0.3e-3), cuda_device=cuda_device())
    model = build_loop_model(context)
    assert model is not None
    assert model.step_drag_s == 0
    assert model.predict_step_s(0) == pytest.approx(1.0e-3 + 0.3e-3)


def test_the_fastest_waits_cap_the_estimated_hand_over() -> None:
    """On a machine where receiving a batch takes 0.4 ms, not the 1.3 ms estimated."""
    model = build_loop_model(handed_over(probe_s=0.3e-3, wait_ms=0.4))
    assert model is not None
    assert model.transfer_main_s == pytest.approx(0.4e-3)


def test_without_a_probe_the_production_rate_bounds_the_batch_from_above() -> None:
    model = build_loop_model(handed_over(probe_s=None))
    assert model is not None
    assert model.load_source == "production"
    assert model.load_s == pytest.approx(2 * 2.5e-3 - XW)
    assert model.best_workers(2, lowest=0) > 0  # the bound is too high to say fewer


def test_a_loaded_host_scales_the_probe_by_the_training_process_share_of_a_core() -> None:
    """Compute took 1 ms of wall time for 0.5 ms of CPU: the busy wall time per step (1 ms + the
    1.3 ms hand-over) over the process's CPU per step (1.5 + 0.5 ms) scales the probe."""
    model = build_loop_model(handed_over(probe_s=0.3e-3, compute_cpu_ms=0.5))
    assert model is not None
    assert model.load_s == pytest.approx(0.3e-3 * (1.0 + 1.3) / (1.5 + 0.5))


def loaded_span(*, load_cpu_share: float, wait_ms: int = 4, steps: int = 100) -> SpanStats:
    """A CPU run on a host busy with other processes: the training process got a quarter of a
    core. Each step computes for 20 ms of wall time (5 ms of CPU) and waits ``wait_ms`` for
    in-process loading that spends ``load_cpu_share`` of it on the CPU."""
    consumer_ms = 20
    data_cpu_ns = round(steps * wait_ms * MS * load_cpu_share)
    span = starved_span(steps=steps, wait_ms=wait_ms, consumer_ms=consumer_ms)
    return replace(span, data_cpu_ns=data_cpu_ns, process_cpu_ns=data_cpu_ns + steps * 5 * MS)


def test_a_loaded_host_stretches_the_hand_over_as_it_stretched_cpu_bound_loading() -> None:
    """Loading as slow as the compute (a quarter of a core each): receiving a batch from a worker
    would also take four times the quiet host's hand-over, and a worker would hand it over four
    times as slowly. With 1 ms of CPU a batch, a worker then costs more than it hides."""
    model = build_loop_model(ctx(loaded_span(load_cpu_share=0.25)))
    assert model is not None
    assert model.transfer_main_s == pytest.approx(XM / 0.25)
    assert model.transfer_worker_s == pytest.approx(XW / 0.25)
    assert model.predict_step_s(1) > model.step_s
    assert data_workers.rule(ctx(loaded_span(load_cpu_share=0.25))) is None


def test_loading_that_waits_on_storage_on_a_loaded_host_still_stretches_the_hand_over() -> None:
    """The same loaded host, 12 ms of loading that spends 5% of it on the CPU: receiving a batch
    is still CPU work of the training process at a quarter of a core (5.2 ms), and a worker
    hides the wait all the same."""
    span = loaded_span(load_cpu_share=0.05, wait_ms=12)
    model = build_loop_model(ctx(span))
    assert model is not None
    assert model.transfer_main_s == pytest.approx(XM / 0.25)
    assert model.predict_step_s(1) < model.step_s
    assert data_workers.rule(ctx(span)) is not None


def still_span(span: SpanStats, still_share: float) -> SpanStats:
    """``span`` with ``still_share`` of its loading's time off the CPU neither on a CPU nor blocked."""
    assert span.data_cpu_ns is not None
    off_cpu_ns = span.phase_ns["data"] - span.data_cpu_ns
    return replace(span, data_still_ns=round(off_cpu_ns * still_share))


def test_loading_that_neither_ran_nor_blocked_on_a_loaded_host_is_the_hosts_time() -> None:
    """The span of the storage test above (12 ms of loading, 0.6 ms of it on the CPU, the compute
    at a quarter of a core), but no wait blocked: none waited on storage. At the compute's pace the
    loading's 0.6 ms of CPU explain 1.8 ms off the CPU; the other 9.6 ms are the host's and stay
    with the training thread whatever makes the batch. The loop then waits 2.4 ms a batch, under a
    tenth of its 29.6 ms consumer time: not starved, and no worker is suggested."""
    span = still_span(loaded_span(load_cpu_share=0.05, wait_ms=12), still_share=1.0)
    model = build_loop_model(ctx(span))
    assert model is not None
    assert model.still_s == pytest.approx(0.0114 - 0.0006 * (1 / 0.25 - 1))
    assert model.load_s == pytest.approx(0.012 - model.still_s)
    assert model.wait_s == pytest.approx(model.load_s)
    assert model.measured_wait_s == pytest.approx(0.012)  # what the rules' words say
    assert model.consumer_s == pytest.approx(0.020 + model.still_s)
    assert model.step_s == pytest.approx(0.032)  # the step itself is as measured
    assert model.load_cpu_s == pytest.approx(0.0006)
    assert not model.starved
    assert data_workers.rule(ctx(span)) is None


def test_cpu_bound_loading_preempted_at_the_computes_pace_keeps_its_time() -> None:
    """Loading at a quarter of a core, as the compute is: its time off the CPU is what its CPU
    work explains at that pace, so a worker takes all of it off the training thread."""
    span = still_span(loaded_span(load_cpu_share=0.25), still_share=1.0)
    model = build_loop_model(ctx(span))
    assert model is not None
    assert model.still_s == pytest.approx(0.0)
    assert model.load_s == pytest.approx(0.004)


def test_still_time_on_a_quiet_host_is_all_the_hosts() -> None:
    """A quiet host (the compute all on the CPU): loading's time neither on a CPU nor blocked is
    none of its own work, and moves to the consumer whole, as far as it goes."""
    span = still_span(starved_span(cpu_share=0.5), still_share=0.5)
    model = build_loop_model(ctx(span))
    assert model is not None
    assert model.still_s == pytest.approx(0.002)  # half of the 4 ms off the CPU
    assert model.load_s == pytest.approx(0.006)
    assert model.consumer_s == pytest.approx(0.004)


def test_the_step_starts_as_cold_as_the_whole_gap_before_it_left_it() -> None:
    """1 ms of a 2 ms wait is the host's: the step still follows 2 ms of other work and pauses,
    as cold as after a batch from a worker, and the model's step with no workers is the measured
    one."""
    span = still_span(starved_span(wait_ms=2, consumer_ms=2, cpu_share=0.5), still_share=1.0)
    model = build_loop_model(ctx(span))
    assert model is not None
    assert model.still_s == pytest.approx(0.001)
    assert model.load_s == pytest.approx(0.001)
    assert model.cold_share(0) == pytest.approx(min(1.0, 0.002 / COLD_GAP_S))
    assert model.predict_step_s(0) == pytest.approx(model.step_s)
    assert model.step_s == pytest.approx(0.004)


def test_a_quiet_host_whose_steps_also_wait_keeps_the_measured_hand_over() -> None:
    """CPU-bound loading (its wall time all CPU) beside a consumer that also waits (a quarter of
    its wall time on the CPU, a logger's round trips, say): nothing took the cores."""
    model = build_loop_model(ctx(loaded_span(load_cpu_share=1.0)))
    assert model is not None
    assert model.transfer_main_s == pytest.approx(XM)
    assert model.transfer_worker_s == pytest.approx(XW)
