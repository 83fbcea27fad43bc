"""Faults in the background samplers: NVML absent, failing part-way, wedged, or raising
SystemExit; psutil raising, or blocking for good. Training never waits on a sampler: its reads
run on the sampler's own thread, a sampler that is stuck or off costs nothing, and what a
sampler measured over only part of the run never becomes the run's headline."""

from __future__ import annotations

import os
import sys
import threading
import time
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

import nvml_stub
import pytest

from faults.harness import EXTRA_S, Outcome, assert_unchanged, numbers, plain_run, script_run, valid_report
from stallscope import StallScope
from stallscope.signals import collector as collector_module
from stallscope.signals import host_sampler
from stallscope.signals.host_sampler import MemoryReading

# -- NVML, through the stand-in driver in a fresh interpreter ---------------------------------

#: 10 short epochs (about 0.1 s each), the loop the time bounds are measured on
TEN_EPOCHS: dict[str, Any] = {"epochs": 10, "steps": 10, "step_s": 0.01}


def _nvml_env(tmp_path: Path, lib: Path | None, **script: Any) -> dict[str, str]:
    return {
        "STUBNVML_SCRIPT": str(nvml_stub.write_script(tmp_path / "script.txt", **script)),
        "LD_LIBRARY_PATH": str(lib) if lib is not None else str(tmp_path / "no-driver-here"),
    }


def test_nvml_absent(tmp_path: Path) -> None:
    bare = script_run(None)
    scoped = script_run(tmp_path / "r", nvml_device=0, env=_nvml_env(tmp_path, None))
    assert scoped.returncode == bare.returncode == 0
    assert scoped.items == bare.items
    report = valid_report(tmp_path / "r")
    assert report.summary.idle_source == "host_phases"
    assert any(n.startswith("nvml sampling is off") for n in report.notes)


def test_nvml_failing_part_way_is_not_the_runs_headline(tmp_path: Path, stub_lib: Path) -> None:
    """Every NVML call fails after the first 30 (about a third of the run): the run's idle
    fraction comes from one source for the whole run (host phases), and the notes say NVML
    stopped, not that the GPU lacks the metric."""
    env = _nvml_env(tmp_path, stub_lib, fail_after={"*": (30, 999)})
    bare = script_run(None, epochs=4, steps=10, step_s=0.02)
    scoped = script_run(tmp_path / "r", nvml_device=0, env=env, epochs=4, steps=10, step_s=0.02)
    assert scoped.returncode == bare.returncode == 0
    assert scoped.items == bare.items
    report = valid_report(tmp_path / "r")
    assert report.summary.idle_source == "host_phases"
    assert report.summary.nvml is not None
    assert report.summary.nvml["util_partial"] is True
    assert any("GPU utilization stopped working during the run" in n for n in report.notes)
    assert any("NVML stopped measuring utilization part-way" in n for n in report.notes)
    assert not any("utilization not available on this GPU" in n for n in report.notes)
    sources = [e.summary.idle_source for e in report.epochs]
    assert sources[-1] == "host_phases"  # measured by NVML no more
    assert set(sources) <= {"nvml", "host_phases"}


def test_a_wedged_nvml_costs_the_loop_nothing_per_epoch(tmp_path: Path, stub_lib: Path) -> None:
    """Every NVML call hangs for good after the first 20. Against the same loop without a driver:
    the old lock waits (0.5 s at each epoch end, twice) would add 10 s here."""
    bare = script_run(None, **TEN_EPOCHS)
    absent = script_run(tmp_path / "absent", nvml_device=0, env=_nvml_env(tmp_path, None), **TEN_EPOCHS)
    env = _nvml_env(tmp_path, stub_lib, block_after={"*": 20})
    wedged = script_run(tmp_path / "r", nvml_device=0, env=env, **TEN_EPOCHS)
    assert wedged.returncode == bare.returncode == 0
    assert wedged.items == bare.items
    assert wedged.loop_s is not None
    assert absent.loop_s is not None
    assert wedged.loop_s < absent.loop_s + EXTRA_S, (wedged.loop_s, absent.loop_s)
    report = valid_report(tmp_path / "r")
    assert report.complete
    assert report.summary.steps == 100
    assert report.summary.idle_source == "host_phases"  # what NVML measured ended at the wedge
    assert any("nvml sampler did not stop" in n or "nvml sampling is off" in n for n in report.notes)


def test_nvml_raising_systemexit_is_noted(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A binding that raises SystemExit (not an Exception) turns the sampler off with a note,
    instead of ending its thread silently."""
    fake = types.ModuleType("pynvml")

    class NVMLError(Exception):
        value = 999

    def init() -> None:
        raise SystemExit(3)

    fake.NVMLError = NVMLError  # type: ignore[attr-defined]
    fake.nvmlInit = init  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    bare = plain_run(_sleep(0.005), data=numbers(8))
    scope = StallScope(tmp_path, console=False, nvml_device=0, sample_interval_s=0.02)
    scoped = plain_run(_sleep(0.005), data=numbers(8), scope=scope)
    assert_unchanged(bare, scoped)
    report = valid_report(tmp_path)
    assert "nvml sampling is off: SystemExit: 3" in report.notes


def _sleep(seconds: float) -> Callable[[int, Any], None]:
    def body(epoch: int, item: int) -> None:
        time.sleep(seconds)

    return body


# -- psutil, through a scripted probe in this process --------------------------------------


class _Probe:
    """Stands in for ``PsutilProbe``: constant readings; records the threads that read; after
    ``wedge_after`` reads, every read blocks until ``release`` is set (a read of /proc that never
    returns); ``fail``: every read raises."""

    calls: list[int] = []
    wedge_after: int | None = None
    fail = False
    release = threading.Event()

    def _read(self) -> None:
        cls = type(self)
        cls.calls.append(threading.get_ident())
        if cls.fail:
            raise RuntimeError("psutil: /proc went away")
        if cls.wedge_after is not None and len(cls.calls) > cls.wedge_after:
            cls.release.wait()

    def main_cpu(self) -> tuple[float, float]:
        self._read()
        return time.process_time(), 0.0

    def children(self) -> dict[int, bool]:
        self._read()
        return {os.getpid() + 1: True}  # one worker, always there

    def child_cpu(self, pid: int) -> float | None:
        self._read()
        return 1.0

    def memory(self, pids: list[int]) -> MemoryReading | None:
        self._read()
        return MemoryReading(rss=1 << 30, available=8 << 30, limit=16 << 30, stall_some_s=None, stall_full_s=None)

    def disk_read_bytes(self) -> int | None:
        self._read()
        return 0


@pytest.fixture
def probe(monkeypatch: pytest.MonkeyPatch) -> type[_Probe]:
    """A fresh scripted probe class in place of ``PsutilProbe``; released after the test."""
    cls = type("Probe", (_Probe,), {"calls": [], "release": threading.Event()})
    monkeypatch.setattr(host_sampler, "PsutilProbe", cls)
    yield cls
    cls.release.set()  # let a blocked sampler thread finish


def _on_a_training_thread(run: Callable[[], Outcome], timeout: float = 60) -> tuple[Outcome, int]:
    """``run()`` on a thread of its own (the "training thread"), so that a hang fails the test
    instead of hanging it; returns the outcome and that thread's id."""
    box: list[Outcome] = []
    thread = threading.Thread(target=lambda: box.append(run()), daemon=True)
    thread.start()
    thread.join(timeout)
    assert not thread.is_alive(), "training hung"
    assert thread.ident is not None
    return box[0], thread.ident


def test_psutil_raising(tmp_path: Path, probe: type[_Probe]) -> None:
    probe.fail = True
    bare = plain_run(_sleep(0.005), data=numbers(8))
    scoped = plain_run(_sleep(0.005), data=numbers(8), scope=StallScope(tmp_path, console=False))
    assert_unchanged(bare, scoped)
    report = valid_report(tmp_path)
    assert "host sampling is off: RuntimeError: psutil: /proc went away" in report.notes
    assert report.summary.steps == 24


def test_psutil_reads_never_run_on_the_training_thread(tmp_path: Path, probe: type[_Probe]) -> None:
    """A read of /proc can block for good (a process stuck in the kernel): none is made on the
    training thread, at epoch ends or at the end of the run."""
    scope = StallScope(tmp_path, console=False, sample_interval_s=0.02)
    scoped, training = _on_a_training_thread(lambda: plain_run(_sleep(0.005), data=numbers(8), scope=scope))
    assert scoped.error is None
    assert len(scoped.items) == 24
    assert probe.calls, "the scripted probe was not used"
    assert training not in probe.calls
    report = valid_report(tmp_path)
    host_epochs = [e for e in report.epochs if e.summary.steps]
    assert len(host_epochs) == 3


def test_a_wedged_psutil_costs_the_loop_nothing_per_epoch(tmp_path: Path, probe: type[_Probe]) -> None:
    """Every read blocks for good after the first few: the old lock waits (0.5 s at each epoch
    end) would add 5 s or more to these 10 epochs, and a read on the training thread would hang it."""
    probe.wedge_after = 12
    bare = plain_run(_sleep(0.01), data=numbers(10), epochs=10)
    scope = StallScope(tmp_path, console=False)
    scoped, _ = _on_a_training_thread(lambda: plain_run(_sleep(0.01), data=numbers(10), epochs=10, scope=scope))
    assert len(probe.calls) > probe.wedge_after  # it did wedge
    assert_unchanged(bare, scoped)
    report = valid_report(tmp_path)
    assert report.complete
    assert report.summary.steps == 100
    assert len(report.epochs) == 10


def test_a_sampler_wedged_at_its_last_sample_is_not_the_runs_time(
    tmp_path: Path, probe: type[_Probe], monkeypatch: pytest.MonkeyPatch
) -> None:
    """psutil reads block for good from the run's last step on, so the host sampler's final
    sample (taken as the scope exits) never returns. Exit waits for it a bounded while, on
    StallScope's time: the run's wall time, its tail and its notes do not count the wait. (No
    periodic tick in the run: one falling after the wedge would block, and the final sample
    then would not be the one waited for.)"""
    monkeypatch.setattr(collector_module, "HOST_MIN_INTERVAL_S", 600.0)
    scope = StallScope(tmp_path, console=False, sample_interval_s=0.02)
    stops: list[float] = []
    real_stop = scope._session.signals.stop

    def timed_stop() -> None:
        began = time.perf_counter()
        real_stop()
        stops.append(time.perf_counter() - began)

    monkeypatch.setattr(scope._session.signals, "stop", timed_stop)

    def body(epoch: int, item: int) -> None:
        time.sleep(0.005)
        if item == 23:  # the last step: every read from now on blocks
            probe.wedge_after = len(probe.calls)

    scoped = plain_run(body, data=numbers(8), scope=scope)
    assert scoped.error is None
    assert len(probe.calls) > (probe.wedge_after or 0)  # it did wedge
    assert stops
    assert 0.3 < stops[0] < 5  # exit waited for the wedged sample, a bounded while
    report = valid_report(tmp_path)
    assert report.summary.steps == 24
    in_epochs = sum(e.summary.wall_s for e in report.epochs)
    tail = report.tail.wall_s if report.tail is not None else 0.0
    assert tail < stops[0] / 2  # the wait is not the run's tail
    assert report.summary.wall_s < in_epochs + stops[0] / 2
    assert not any("came after the last epoch's end" in n for n in report.notes)


def test_a_wedged_proc_and_sys_never_stop_the_training_thread(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every open of a file under /proc or /sys blocks for good, on any thread (a wedged-open
    stand-in for a process stuck in the kernel, a hung cgroup file system). A run made on its own
    training thread, constructor, checkpoint phases, report writes and exit included, still ends,
    and it never opened such a file itself: the reads run on StallScope's helper threads."""
    import builtins
    import io

    from stallscope.hooks import session as session_module

    monkeypatch.setattr(session_module, "FIRST_WRITE_S", 0.0)  # a report write at every epoch end
    release = threading.Event()
    on_training: list[str] = []
    training: list[int] = []
    real_open, real_os_open = builtins.open, os.open

    def wedge(path: object) -> None:
        name = os.fsdecode(path) if isinstance(path, (str, bytes, os.PathLike)) else ""
        if name.startswith(("/proc", "/sys")):
            if threading.get_ident() in training:
                on_training.append(name)
            release.wait()

    def wedged_open(file: Any, *args: Any, **kwargs: Any) -> Any:
        wedge(file)
        return real_open(file, *args, **kwargs)

    def wedged_os_open(path: Any, *args: Any, **kwargs: Any) -> Any:
        wedge(path)
        return real_os_open(path, *args, **kwargs)

    def run() -> Outcome:
        training.append(threading.get_ident())
        scope = StallScope(tmp_path, console=False, sample_interval_s=0.02)

        def body(epoch: int, item: int) -> None:
            if item % 4 == 0:
                with scope.phase("checkpoint"):
                    (tmp_path / "ckpt.bin").write_bytes(b"x" * 4096)

        return plain_run(body, data=numbers(8), scope=scope)

    monkeypatch.setattr(builtins, "open", wedged_open)
    monkeypatch.setattr(io, "open", wedged_open)
    monkeypatch.setattr(os, "open", wedged_os_open)
    try:
        scoped, _ = _on_a_training_thread(run, timeout=30)
    finally:
        monkeypatch.undo()
        release.set()  # let the helper threads that wedged finish
    assert scoped.error is None
    assert len(scoped.items) == 24
    assert on_training == []
    report = valid_report(tmp_path)
    assert report.complete
    assert report.summary.steps == 24
