"""The checkpoint meter (``signals/saves.py``): each save's wall time, CPU and bytes, and the
once-per-run probe of what a copy costs, on scripted clocks and readers."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from stallscope.signals import saves as saves_module
from stallscope.signals.procfs import written_bytes
from stallscope.signals.saves import PROBE_MAX_BYTES, PROBE_MIN_BYTES, SaveMeter, probe_copy_s

MS = 1_000_000


class Script:
    """A reader that returns the next of ``values`` at each call."""

    def __init__(self, *values: int | None) -> None:
        self._values: Iterator[int | None] = iter(values)

    def __call__(self) -> int | None:
        return next(self._values)


def _meter(clock: Script, cpu: Script, written: Script, probed: list[float] | None = None) -> SaveMeter:
    def probe(nbytes: float) -> float | None:
        if probed is not None:
            probed.append(nbytes)
        return 4e-10

    return SaveMeter(clock=clock, cpu_clock=cpu, written=written, probe=probe)  # type: ignore[arg-type]


def test_each_save_adds_its_wall_time_cpu_and_bytes() -> None:
    # two saves: 30 ms (12 ms of CPU, 8 MB) and 50 ms (20 ms of CPU, 8 MB)
    meter = _meter(
        Script(0, 30 * MS, 100 * MS, 150 * MS),
        Script(0, 12 * MS, 40 * MS, 60 * MS),
        Script(1000, 1000 + 8_000_000, 9_000_000, 17_000_000),
    )
    assert meter.summary() is None
    for _ in range(2):
        meter.begin()
        meter.end()
    summary = meter.summary()
    assert summary is not None
    assert (summary.saves, summary.wall_ns, summary.cpu_ns, summary.bytes) == (2, 80 * MS, 32 * MS, 16_000_000)
    assert summary.copy_s_per_byte is None  # not probed yet
    assert not summary.measured


def test_a_save_inside_a_save_counts_once_and_cpu_never_exceeds_wall() -> None:
    meter = _meter(Script(0, 10 * MS), Script(0, 25 * MS), Script(0, 500))
    meter.begin()
    meter.begin()  # torch.save called inside the user's own save function, both marked
    meter.end()
    meter.end()
    meter.end()  # one end too many: ignored
    summary = meter.summary()
    assert summary is not None
    assert (summary.saves, summary.wall_ns, summary.cpu_ns, summary.bytes) == (1, 10 * MS, 10 * MS, 500)


def test_bytes_unknown_when_proc_io_cannot_be_read() -> None:
    meter = _meter(Script(0, 10 * MS), Script(0, 5 * MS), Script(None, None))
    meter.begin()
    meter.end()
    summary = meter.summary()
    assert summary is not None
    assert summary.bytes is None
    assert not meter.wants_probe
    meter.probe()
    assert meter.summary().copy_s_per_byte is None  # type: ignore[union-attr]


def test_the_copy_is_probed_once_with_the_mean_bytes_of_a_save() -> None:
    probed: list[float] = []
    meter = _meter(
        Script(0, 10 * MS, 20 * MS, 30 * MS), Script(0, 1, 2, 3), Script(0, 6_000_000, 6_000_000, 10_000_000), probed
    )
    meter.begin()
    assert not meter.wants_probe  # inside a save
    meter.end()
    assert meter.wants_probe
    meter.probe()
    meter.probe()
    meter.begin()
    meter.end()
    assert not meter.wants_probe
    assert probed == [6_000_000]
    summary = meter.summary()
    assert summary is not None
    assert summary.copy_s_per_byte == 4e-10
    assert summary.measured


def test_a_save_that_wrote_nothing_waits_for_one_that_did() -> None:
    probed: list[float] = []
    meter = _meter(Script(0, 1, 2, 3), Script(0, 0, 0, 0), Script(5, 5, 5, 3005), probed)
    meter.begin()
    meter.end()
    assert not meter.wants_probe
    meter.begin()
    meter.end()
    meter.probe()
    assert probed == [1500]  # the mean over the two saves


def test_the_probe_times_clones_of_the_saves_size_within_bounds(monkeypatch: pytest.MonkeyPatch) -> None:
    sizes: list[int] = []
    clone = torch.Tensor.clone

    def counted(self: torch.Tensor) -> torch.Tensor:
        sizes.append(self.numel())
        return clone(self)

    monkeypatch.setattr(torch.Tensor, "clone", counted)
    ticks = iter(range(0, 10_000_000, 1000))  # each clone takes 1000 ns on this clock
    assert probe_copy_s(2_000_000, clock=lambda: next(ticks)) == pytest.approx(1000 / 1e9 / 2_000_000)
    assert sizes == [2_000_000] * 3
    sizes.clear()
    probe_copy_s(10, clock=lambda: next(ticks))
    probe_copy_s(1e12, clock=lambda: next(ticks))
    assert sizes == [PROBE_MIN_BYTES] * 3 + [PROBE_MAX_BYTES] * 3


def test_the_probe_gives_up_quietly(monkeypatch: pytest.MonkeyPatch) -> None:
    def fails(*args: object, **kwargs: object) -> torch.Tensor:
        raise RuntimeError("out of memory")

    monkeypatch.setattr(torch, "empty", fails)
    assert probe_copy_s(1_000_000) is None
    monkeypatch.setattr(saves_module.sys, "modules", {})  # torch never imported by the user
    assert probe_copy_s(1_000_000) is None


def test_a_real_probe_gives_a_positive_cost() -> None:
    per_byte = probe_copy_s(PROBE_MIN_BYTES)
    assert per_byte is not None
    assert per_byte > 0


def test_written_bytes_reads_wchar(tmp_path: Path) -> None:
    io = tmp_path / "io"
    io.write_text("rchar: 6976\nwchar: 123456\nsyscr: 10\n")
    assert written_bytes(io) == 123456
    io.write_text("rchar: 6976\n")
    assert written_bytes(io) is None
    io.write_text("wchar: many\n")
    assert written_bytes(io) is None
    assert written_bytes(tmp_path / "missing") is None


@pytest.mark.skipif(not Path("/proc/self/io").exists(), reason="Linux's /proc/self/io")
def test_written_bytes_sees_this_process_write(tmp_path: Path) -> None:
    before = written_bytes()
    assert before is not None
    (tmp_path / "blob").write_bytes(b"x" * 100_000)
    after = written_bytes()
    assert after is not None
    assert after - before >= 100_000


def test_a_read_that_comes_back_late_costs_one_saves_bytes_and_one_that_never_does_costs_one_wait() -> None:
    """The reader's first read is held past the deadline (a thread a busy machine runs late): that
    save's bytes are unknown, and so are the next while it is out, without waiting; once it is
    back, reads go on. A read that never comes back is waited for once."""
    import threading

    release = threading.Event()
    calls: list[int] = []

    def read() -> int | None:
        calls.append(1)
        if len(calls) == 1:
            release.wait()
        return 100 * len(calls)

    reader = saves_module._Reader(read)
    first = reader.ask()  # waits READ_DEADLINE_S, then goes on
    assert (first.done, reader.slow) == (False, True)
    assert reader.ask().value is None  # still out: not asked, not waited for
    release.set()
    assert first.event.wait(5.0)
    second = reader.ask()
    assert (second.done, second.value, reader.slow) == (True, 200, False)
    reader.stop()

    wedged = saves_module._Reader(threading.Event().wait)  # type: ignore[arg-type]
    assert wedged.ask().done is False
    for _ in range(3):
        assert wedged.ask().value is None
    assert wedged.slow
