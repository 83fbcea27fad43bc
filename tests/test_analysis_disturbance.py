"""A disturbed measurement: the machine's CPU beyond the run's, read from /proc/stat, and what
it does to the findings' confidence and the report's notes."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from signal_fakes import host

from stallscope.analysis.context import AnalysisConfig, Context
from stallscope.analysis.diagnose import diagnose
from stallscope.analysis.disturbance import disturbance_note, disturbed
from stallscope.analysis.rules import checkpoint_frequency
from stallscope.signals.host_sampler import HostSampler, MemoryReading
from stallscope.signals.procfs import machine_cpu
from stallscope.timeline.stats import Distribution, SpanStats

MS = 1_000_000


def test_machine_cpu_counts_busy_time_of_all_cores(tmp_path: Path) -> None:
    stat = tmp_path / "stat"
    # user nice system idle iowait irq softirq steal guest guest_nice
    stat.write_text(
        "cpu  100 10 50 900 40 5 5 30 0 0\n"
        "cpu0 50 5 25 450 20 2 3 15 0 0\n"
        "cpu1 50 5 25 450 20 3 2 15 0 0\n"
        "intr 1\n"
    )
    busy, cores = machine_cpu(stat) or (0.0, 0)
    assert busy == pytest.approx(200 / os.sysconf("SC_CLK_TCK"))  # idle and iowait are not busy
    assert cores == 2
    assert machine_cpu(tmp_path / "missing") is None
    (tmp_path / "odd").write_text("intr 1\n")
    assert machine_cpu(tmp_path / "odd") is None


class _Tree:
    """This process tree: ``own`` CPU seconds so far, no workers."""

    def __init__(self) -> None:
        self.own = 0.0

    def main_cpu(self) -> tuple[float, float]:
        return self.own, 0.0

    def children(self) -> dict[int, bool]:
        return {}

    def child_cpu(self, pid: int) -> float | None:
        return None

    def memory(self, pids: list[int]) -> MemoryReading | None:
        return None

    def disk_read_bytes(self) -> int | None:
        return None


def test_the_host_sampler_reports_the_cores_other_processes_kept_busy() -> None:
    tree, machine = _Tree(), [100.0]
    now = [0]
    sampler = HostSampler(
        interval_s=0.5, probe=tree, cores=2, clock=lambda: now[0], machine=lambda: (machine[0], 4), slow_interval_s=1.0
    )
    sampler.prime()
    for _ in range(4):  # 4 s: the run keeps 1 core busy, the machine 3.5 of its 4
        now[0] += 1000 * MS
        tree.own += 1.0
        machine[0] += 3.5
        sampler.sample_once()
    summary = sampler.close_window()
    assert summary is not None
    assert summary.others_cores == pytest.approx(2.5)
    assert summary.machine_cores == 4


def test_a_scripted_probe_reads_no_machine_cpu_by_default() -> None:
    now = [0]
    sampler = HostSampler(interval_s=0.5, probe=_Tree(), cores=2, clock=lambda: now[0])
    sampler.prime()
    for _ in range(3):
        now[0] += 1000 * MS
        sampler.sample_once()
    summary = sampler.run_summary()
    assert summary is not None
    assert summary.others_cores is None


def _ctx(host_signals: object) -> Context:
    steps, each_ms, count = 400, 150, 40
    train, total = steps * 2 * MS, count * each_ms * MS
    span = SpanStats(
        wall_ns=train + total,
        steps=steps,
        epochs=1,
        step_total_ns=train,
        phase_ns={"data": 0, "compute": train, "checkpoint": total, "other": 0},
        phase_counts={"data": steps, "compute": steps, "checkpoint": count},
        step=Distribution.of([2 * MS] * steps),
        data_wait=Distribution.of([0] * steps),
        data_cpu_ns=0,
        process_cpu_ns=train + total,
    )
    return Context(span=span, loader=None, cores=2, config=AnalysisConfig(), host_signals=host_signals)  # type: ignore[arg-type]


def test_other_processes_on_most_cores_lower_every_findings_confidence() -> None:
    calm = diagnose(_ctx(host(others_cores=0.2, machine_cores=2)), rules=[checkpoint_frequency.rule])
    busy_host = host(others_cores=1.6, machine_cores=2)
    busy = diagnose(_ctx(busy_host), rules=[checkpoint_frequency.rule])
    assert [f.confidence for f in calm] == ["high"]
    assert [f.confidence for f in busy] == ["medium"]
    assert busy[0].suggestion == calm[0].suggestion
    note = disturbance_note(busy_host)
    assert note is not None
    assert "kept 1.6 of the machine's 2 cores busy" in note
    assert disturbance_note(host(others_cores=0.2, machine_cores=2)) is None


def test_a_short_sample_or_an_unread_machine_is_not_called_disturbed() -> None:
    assert not disturbed(host(others_cores=1.9, machine_cores=2, wall_s=2.0))  # a couple of readings
    assert not disturbed(host())  # the machine's CPU was not read
    assert not disturbed(None)
