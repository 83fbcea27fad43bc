"""``data.pin_memory``: copies to the GPU from pageable memory."""

from __future__ import annotations

import pytest
from signal_fakes import context, cuda, cuda_device, loader, record_span

from stallscope.analysis.rules import data_pin_memory


def span_with_copies() -> object:
    return record_span(steps=20, data_ms=5, h2d_ms=10, compute_ms=35)


def test_an_unpinned_loader_on_cuda() -> None:
    ctx = context(span_with_copies(), loader=loader(num_workers=2), cuda_device=cuda_device())  # type: ignore[arg-type]
    f = data_pin_memory.rule(ctx)
    assert f is not None
    assert f.suggestion == {"pin_memory": True, "non_blocking": True}
    # the host gets the 20% h2d share back; the device's copy at twice the speed (10%) fits in its
    # idle time (no device signal: 1 - compute share = 30%)
    assert f.est_saving_fraction == pytest.approx(0.2)
    assert f.confidence == "low"
    assert "non_blocking=True" in f.snippet


def test_the_device_copy_counts_when_the_device_has_no_idle_time() -> None:
    ctx = context(
        span_with_copies(),  # type: ignore[arg-type]
        loader=loader(num_workers=2),
        cuda_device=cuda_device(),
        cuda=cuda(busy_ns=int(0.95 * 20 * 50e6), phases=20),  # busy 95% of the wall time
    )
    f = data_pin_memory.rule(ctx)
    assert f is not None
    assert f.est_saving_fraction == pytest.approx(0.2 - (0.1 - 0.05), abs=1e-3)


def test_pageable_batches_seen_even_with_pin_memory_set() -> None:
    ctx = context(
        span_with_copies(),  # type: ignore[arg-type]
        loader=loader(pin_memory=True),
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
    ctx = context(span_with_copies(), framework="lightning", loader=loader(), cuda_device=cuda_device())  # type: ignore[arg-type]
    f = data_pin_memory.rule(ctx)
    assert f is not None
    assert "Lightning" in f.fix
