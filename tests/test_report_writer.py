"""``ReportWriter``: mid-run report writes in proportion to the run, ordered, the final one last."""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from conftest import FakeClock

from stallscope.report.io import load_report
from stallscope.report.schema import DeviceInfo, Report, RunInfo, Summary
from stallscope.report.writer import ReportWriter


def _report(steps: int, *, complete: bool = False) -> Report:
    summary = Summary(
        wall_s=1.0,
        steps=steps,
        steps_per_s=float(steps),
        gpu_idle_fraction=0.5,
        idle_source="host_phases",
        phase_fractions={"compute": 0.5, "other": 0.5},
    )
    run = RunInfo(started_at="2026-01-01T00:00:00Z", host="h", torch_version="", device=DeviceInfo("cpu", "cpu"))
    return Report(run=run, summary=summary, complete=complete)


class Disk:
    """A stand-in for ``write_report``: records what was written; each write takes ``cost_ms``
    on the fake clock, and ``written`` is set after each."""

    def __init__(self, clock: FakeClock, cost_ms: float) -> None:
        self.clock = clock
        self.cost_ms = cost_ms
        self.writes: list[tuple[int, bool]] = []
        self.written = threading.Event()

    def __call__(self, report: Report, path: Path, *, durable: bool) -> Path:
        self.clock.advance_ms(self.cost_ms)
        self.writes.append((report.summary.steps, durable))
        self.written.set()
        return path


def _builder(steps: int, built: list[int]) -> Callable[[], Report]:
    def build() -> Report:
        built.append(steps)
        return _report(steps)

    return build


def test_writes_at_once_while_writes_take_under_a_quarter_percent(tmp_path: Path, clock: FakeClock) -> None:
    disk = Disk(clock, cost_ms=2)
    writer = ReportWriter(tmp_path / "report.json", clock=clock, write=disk)
    built: list[int] = []
    writer.submit(_builder(1, built))  # the first is due at once; it takes 2 ms, so the next waits 800 ms
    clock.advance_ms(799)
    assert writer.wants_report()  # nothing pending yet
    writer.submit(_builder(2, built))  # 799 ms after the first ended: kept for later
    assert not writer.wants_report()  # one is pending and no write is due: skip the snapshot
    assert writer.wants_report(now=clock.now + 1_000_000)  # with a reading of the clock taken 1 ms later
    clock.advance_ms(1)
    assert writer.wants_report()  # a write is due
    assert not writer.wants_report(now=clock.now - 1)
    writer.submit(_builder(3, built))  # 800 ms: written now, and the pending one (2) is dropped
    writer.close()
    assert disk.writes == [(1, False), (3, False)]
    assert built == [1, 3]  # a report that was never written was never built either
    assert writer.writes == 2


def test_the_first_write_waits_as_if_one_of_first_write_s_had_just_ended(tmp_path: Path, clock: FakeClock) -> None:
    disk = Disk(clock, cost_ms=2)
    writer = ReportWriter(tmp_path / "report.json", clock=clock, write=disk, first_write_s=0.002)
    built: list[int] = []
    clock.advance_ms(799)
    writer.submit(_builder(1, built))  # 2 ms / 0.25% = 800 ms after the writer was made: not yet
    assert disk.writes == []
    clock.advance_ms(1)
    writer.submit(_builder(2, built))  # due: written now, the pending one dropped
    writer.close()
    assert disk.writes == [(2, False)]
    assert built == [2]


def test_a_report_that_waits_is_written_by_the_thread_once_its_time_comes(tmp_path: Path, clock: FakeClock) -> None:
    disk = Disk(clock, cost_ms=2)
    writer = ReportWriter(tmp_path / "report.json", clock=clock, write=disk)
    built: list[int] = []
    writer.submit(_builder(1, built))
    disk.written.clear()
    writer.submit(_builder(2, built))
    writer.submit(_builder(3, built))  # replaces 2 before its time came
    clock.advance_ms(800)  # no epoch end comes: the thread writes the latest
    assert disk.written.wait(timeout=30)
    writer.close()
    assert disk.writes == [(1, False), (3, False)]
    assert built == [1, 3]


def test_the_wait_is_never_longer_than_max_interval(tmp_path: Path, clock: FakeClock) -> None:
    disk = Disk(clock, cost_ms=1000)  # a write on a very slow disk: 0.25% would mean 400 s between writes
    writer = ReportWriter(tmp_path / "report.json", clock=clock, write=disk, max_interval_s=5.0)
    writer.submit(_builder(1, []))
    clock.advance_ms(4_999)
    writer.submit(_builder(2, []))
    clock.advance_ms(1)
    writer.submit(_builder(3, []))
    writer.close()
    assert [steps for steps, _ in disk.writes] == [1, 3]


def test_the_final_report_is_written_last_and_durably(tmp_path: Path, clock: FakeClock) -> None:
    disk = Disk(clock, cost_ms=2)
    writer = ReportWriter(tmp_path / "report.json", clock=clock, write=disk)
    writer.submit(_builder(1, []))
    writer.submit(_builder(2, []))  # pending
    writer.close()
    writer.write_final(_report(9, complete=True))
    clock.advance_ms(10_000)
    writer.submit(_builder(4, []))  # too late: nothing is written after the final report
    assert disk.writes == [(1, False), (9, True)]


def test_a_failed_write_in_the_thread_is_raised_by_the_next_submit(tmp_path: Path, clock: FakeClock) -> None:
    failed = threading.Event()
    calls: list[int] = []

    def disk(report: Report, path: Path, *, durable: bool) -> Path:
        calls.append(report.summary.steps)
        clock.advance_ms(2)
        if len(calls) == 2:
            failed.set()
            raise OSError(28, "No space left on device")
        return path

    writer = ReportWriter(tmp_path / "report.json", clock=clock, write=disk)
    writer.submit(_builder(1, []))
    writer.submit(_builder(2, []))
    clock.advance_ms(1000)
    assert failed.wait(timeout=30)
    with pytest.raises(OSError, match="No space left"):
        writer.submit(_builder(3, []))
    writer.close()
    assert calls == [1, 2]


def test_real_files(tmp_path: Path) -> None:
    """With ``write_report`` itself: the mid-run report, then the final one, readable."""
    path = tmp_path / "out" / "report.json"
    writer = ReportWriter(path)
    writer.submit(lambda: _report(5))
    assert load_report(path).summary.steps == 5
    writer.close()
    writer.write_final(_report(6, complete=True))
    final: Any = load_report(path)
    assert final.complete
    assert final.summary.steps == 6
