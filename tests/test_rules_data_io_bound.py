"""``data.io_bound``: starved while the loading processes wait instead of computing."""

from __future__ import annotations

import pytest
from signal_fakes import context, host, loader, nvml, record_span

from stallscope.analysis.rules import data_io_bound


def test_in_process_reads_that_wait() -> None:
    span = record_span(steps=20, data_ms=100, data_cpu_ms=2, compute_ms=10)
    f = data_io_bound.rule(context(span, cores=1))
    assert f is not None
    assert f.id == "data.io_bound"
    assert f.evidence["loading_cpu_share"] == pytest.approx(0.02)
    assert f.evidence["workers_assumed"] == 4  # what data.workers reaches on one core; the rest is storage's
    # the loop model's step with 4 workers, a hand-over of 1.3 ms in the training process and 0.89 ms
    # in the worker (two tensors): now (100 + 0.89) / 4; with the wait gone the one core binds:
    # main CPU 10 + loading CPU 2 + 1.3 + 0.89 of hand-over
    assert f.est_saving_fraction == pytest.approx(20 * (100.89 / 4 - 14.19) / (20 * 110), abs=1e-3)
    assert f.suggestion == {}
    assert f.snippet.startswith("DataLoader(dataset, num_workers=4)")  # what the prediction assumes
    assert "with 4 workers (now 0:" in f.fix


def test_in_process_loading_preempted_by_other_processes_is_not_waiting_on_storage() -> None:
    """20% of ``next()`` on a CPU, but the training thread waited 2 s for a core per second it ran:
    most of the rest it was runnable, so loading waits for the cores, not for storage. With few
    such waits the same share is storage's."""
    span = record_span(steps=20, data_ms=400, data_cpu_ms=80, compute_ms=10, compute_cpu_ms=6)
    busy = host(wall_s=8.2, main_cpu_s=1.7, cores=1, thread_cpu_s=1.7, thread_wait_s=3.4)
    calm = host(wall_s=8.2, main_cpu_s=1.7, cores=1, thread_cpu_s=1.7, thread_wait_s=0.17)
    assert data_io_bound.rule(context(span, cores=1, host_signals=busy)) is None
    f = data_io_bound.rule(context(span, cores=1, host_signals=calm))
    assert f is not None
    assert f.evidence["loading_cpu_share"] == pytest.approx(0.2)


def test_the_snippet_never_names_fewer_workers_than_the_run_has() -> None:
    """Eight workers on two cores that still wait on reads: the prediction keeps the eight."""
    span = record_span(steps=20, data_ms=100, compute_ms=10, in_process=False)
    signals = host(wall_s=2.2, main_cpu_s=0.2, workers_cpu_s=20 * 0.011, cores=2)
    f = data_io_bound.rule(context(span, cores=2, loader=loader(num_workers=8), host_signals=signals))
    assert f is not None
    assert f.evidence["workers_assumed"] == 8  # io_workers_per_core (2) x 2 cores is fewer
    assert f.snippet.startswith("DataLoader(dataset, num_workers=8)")
    assert f.fix.endswith("with 8 workers.")


def test_more_workers_hide_short_waits_so_no_finding() -> None:
    span = record_span(steps=20, data_ms=20, data_cpu_ms=1, compute_ms=10)
    assert data_io_bound.rule(context(span, cores=4)) is None


def test_workers_that_wait() -> None:
    # 20 steps of 110 ms with 2 workers: 220 ms per batch per worker, of which 11 ms on a CPU
    span = record_span(steps=20, data_ms=100, compute_ms=10, in_process=False)
    signals = host(wall_s=2.2, main_cpu_s=0.2, workers_cpu_s=20 * 0.011, cores=2)
    ctx = context(span, cores=2, loader=loader(num_workers=2), host_signals=signals)
    f = data_io_bound.rule(ctx)
    assert f is not None
    assert f.evidence["cpu_measured_in"] == "workers"
    assert f.evidence["loading_cpu_share"] == pytest.approx(0.05)
    assert f.evidence["disk_read_mb_per_s"] == 1.0


def test_not_when_workers_burn_cpu() -> None:
    span = record_span(steps=20, data_ms=100, compute_ms=10, in_process=False)
    signals = host(wall_s=2.2, main_cpu_s=0.2, workers_cpu_s=20 * 0.2, cores=2)
    ctx = context(span, cores=2, loader=loader(num_workers=2), host_signals=signals)
    assert data_io_bound.rule(ctx) is None


def test_a_gpu_busy_during_the_waits_leaves_little_to_gain() -> None:
    span = record_span(steps=20, data_ms=100, data_cpu_ms=2, compute_ms=10)
    ctx = context(span, cores=1, nvml=nvml(util_by_phase={"data": 0.99}))
    f = data_io_bound.rule(ctx)
    assert f is None or f.est_saving_fraction <= span.phase_fraction("data") * 0.01 + 1e-4


def test_worker_cpu_says_nothing_when_the_loop_is_only_mildly_starved() -> None:
    """Workers that keep up part of the time sit idle then: low CPU is no evidence of waiting."""
    span = record_span(steps=20, data_ms=3, compute_ms=10, in_process=False)  # waits 30% of compute
    signals = host(wall_s=0.26, main_cpu_s=0.2, workers_cpu_s=0.01, cores=2)
    assert data_io_bound.rule(context(span, cores=2, loader=loader(num_workers=2), host_signals=signals)) is None
