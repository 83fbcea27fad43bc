"""``host.memory``: tasks stalled on memory near the limit."""

from __future__ import annotations

import pytest
from signal_fakes import GIB, context, host, loader, record_span

from stallscope.analysis.rules import host_memory

SPAN = record_span(steps=20, compute_ms=50)


def test_memory_stalls_cost_time() -> None:
    signals = host(wall_s=10.0, mem_stall_some_s=0.5, mem_stall_full_s=0.2, mem_available_min_bytes=GIB)
    f = host_memory.rule(context(SPAN, loader=loader(num_workers=8), host_signals=signals))
    assert f is not None
    assert f.est_saving_fraction == pytest.approx(0.05)
    assert f.evidence["memory_full_stall_fraction"] == pytest.approx(0.02)
    assert f.evidence["mem_used_max_fraction"] == pytest.approx(31 / 32, abs=1e-4)
    assert "97% of 32.0 GiB" in f.title
    assert "prefetch_factor" in f.fix


def test_no_stalls_no_finding() -> None:
    assert host_memory.rule(context(SPAN, host_signals=host())) is None
    assert host_memory.rule(context(SPAN, host_signals=host(mem_stall_some_s=None))) is None
    assert host_memory.rule(context(SPAN)) is None
