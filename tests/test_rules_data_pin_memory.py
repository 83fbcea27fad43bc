"""``data.pin_memory``: copies to the GPU from pageable memory."""

from __future__ import annotations

import pytest
from signal_fakes import context, cuda, cuda_device, loader, record_span

from stallscope.analysis.rules import data_pin_memory


def span_with_copies(data_ms: float = 1.0) -> object:
    """20 steps of 50 ms: a ``data_ms`` wait for the loader, a 10 ms copy, compute for the rest."""
    return record_span(steps=20, data_ms=data_ms, h2d_ms=10, compute_ms=40 - data_ms)


def workers(n: int = 2) -> object:
    return loader(num_workers=n)


def test_an_unpinned_loader_on_cuda() -> None:
    ctx = context(span_with_copies(), loader=workers(), cuda_device=cuda_device())  # type: ignore[arg-type]
    f = data_pin_memory.rule(ctx)
    assert f is not None
    assert f.suggestion == {"pin_memory": True, "non_blocking": True}
    # the loop hardly waits for its workers (1 ms of 50): the pin thread takes the 10 ms copy off
    # the training thread (39 ms a step are left to make it in), which gets its 20% share back;
    # the device's copy at twice the speed (10%) fits in its idle time (no device signal:
    # 1 - compute share = 22%)
    assert f.est_saving_fraction == pytest.approx(0.2)
    assert f.evidence["predicted_step_ms"] < 41
    assert f.confidence == "low"
    assert "non_blocking=True" in f.snippet


def test_no_gain_when_the_workers_set_the_pace() -> None:
    """The loop already waits 5 ms a step for its two workers: they deliver a batch every 50 ms,
    and a shorter training thread would only wait longer (seen on an H100: x2.4 was predicted
    for pinning 32 MB batches, x1.1 realized)."""
    ctx = context(span_with_copies(data_ms=5), loader=workers(), cuda_device=cuda_device())  # type: ignore[arg-type]
    assert ctx.loop_model is not None
    assert ctx.loop_model.starved
    assert data_pin_memory.rule(ctx) is None


def test_no_gain_without_workers() -> None:
    """With num_workers=0 the loader pins inside next(), on the training thread: the host copy
    stays where it was."""
    ctx = context(span_with_copies(), loader=workers(0), cuda_device=cuda_device())  # type: ignore[arg-type]
    assert data_pin_memory.rule(ctx) is None


def test_the_pin_thread_can_become_the_limit() -> None:
    """A 30 ms copy in a 50 ms step: the pin thread needs 30 ms a batch plus receiving it from the
    workers, more than the 20 ms left on the training thread, so the step goes from 50 to about
    30 ms, not 20."""
    span = record_span(steps=20, data_ms=1, h2d_ms=30, compute_ms=19)
    ctx = context(span, loader=workers(), cuda_device=cuda_device())  # type: ignore[arg-type]
    f = data_pin_memory.rule(ctx)
    assert f is not None
    receive_ms = ctx.loop_model.transfer_main_s * 1e3  # type: ignore[union-attr]
    assert 0 < receive_ms <= 1.0  # capped by the 1 ms waits
    assert f.evidence["predicted_step_ms"] == pytest.approx(30.0 + receive_ms, abs=0.01)
    # (50 - 30 - x_m) / 50; the device's 15 ms copy fits in its idle time (1 - compute share = 62%)
    assert f.est_saving_fraction == pytest.approx((20 - receive_ms) / 50, abs=0.005)


def test_the_device_copy_counts_when_the_device_has_no_idle_time() -> None:
    ctx = context(
        span_with_copies(),  # type: ignore[arg-type]
        loader=workers(),
        cuda_device=cuda_device(),
        cuda=cuda(busy_ns=int(0.95 * 20 * 50e6), phases=20),  # busy 95% of the wall time
    )
    alone = data_pin_memory.rule(context(span_with_copies(), loader=workers(), cuda_device=cuda_device()))  # type: ignore[arg-type]
    f = data_pin_memory.rule(ctx)
    assert f is not None
    assert alone is not None
    assert f.est_saving_fraction == pytest.approx(alone.est_saving_fraction - (0.1 - 0.05), abs=1e-3)


def test_pageable_batches_seen_even_with_pin_memory_set() -> None:
    ctx = context(
        span_with_copies(),  # type: ignore[arg-type]
        loader=loader(pin_memory=True, num_workers=2),
        cuda_device=cuda_device(),
        cuda=cuda(batches_checked=2, pageable_batches=2),
    )
    f = data_pin_memory.rule(ctx)
    assert f is not None
    assert f.confidence == "medium"


@pytest.mark.parametrize(
    "fields",
    [
        {"loader": loader(pin_memory=True)},  # already pinned
        {"loader": loader(), "cuda": cuda(batches_checked=3, pageable_batches=0)},  # pinned after all
        {"loader": None},  # nothing known about pinning
    ],
)
def test_no_finding(fields: dict[str, object]) -> None:
    assert data_pin_memory.rule(context(span_with_copies(), cuda_device=cuda_device(), **fields)) is None  # type: ignore[arg-type]


def test_not_on_the_cpu_or_without_copies() -> None:
    assert data_pin_memory.rule(context(span_with_copies(), loader=loader())) is None  # type: ignore[arg-type]
    no_copies = record_span(steps=20, data_ms=5, compute_ms=45)
    assert data_pin_memory.rule(context(no_copies, loader=loader(), cuda_device=cuda_device())) is None


def test_lightning_words() -> None:
    ctx = context(span_with_copies(), framework="lightning", loader=workers(), cuda_device=cuda_device())  # type: ignore[arg-type]
    f = data_pin_memory.rule(ctx)
    assert f is not None
    assert "Lightning" in f.fix
