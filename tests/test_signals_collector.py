"""The session's background signals: which samplers run, CUDA wiring, containment, clean exit."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from conftest import FakeClock
from test_signals_cuda_events import FakeDevice
from test_signals_host import FakeHost

from stallscope import StallScope
from stallscope.config import ScopeConfig
from stallscope.hooks import session as session_module
from stallscope.hooks.session import Session
from stallscope.signals import collector as collector_module
from stallscope.signals.collector import SignalCollector
from stallscope.signals.cuda_events import CudaDevice
from stallscope.timeline.stats import EpochBoundary

MS = 1_000_000


def no_pynvml() -> Any:
    raise ImportError("No module named 'pynvml'")


def make_session(tmp_path: Path, clock: FakeClock, cpu_clock: FakeClock, **config: Any) -> Session:
    session = Session(ScopeConfig.create(tmp_path, console=False, **config), clock=clock, cpu_clock=cpu_clock)
    session.signals = SignalCollector(
        session.timeline,
        nvml_device=session.config.nvml_device,
        interval_s=session.config.sample_interval_s,
        host_probe=FakeHost(),
        nvml_load=no_pynvml,
        cores=2,
    )
    return session


def steps(session: Session, clock: FakeClock, n: int, data_ms: float, compute_ms: float) -> None:
    tl = session.timeline
    compute = tl.phase_id("compute")
    for _ in range(n):
        tl.data_begin()
        clock.advance_ms(data_ms)
        tl.data_end(got_item=True)
        tl.enter(compute)
        clock.advance_ms(compute_ms)
        tl.leave()


def stallscope_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith("stallscope-")]


def test_a_cpu_run_samples_the_host_only_and_says_nothing_about_nvml(
    tmp_path: Path, clock: FakeClock, cpu_clock: FakeClock
) -> None:
    session = make_session(tmp_path, clock, cpu_clock)
    session.start()
    session.note_loader(None, None)
    steps(session, clock, 8, 10, 10)
    epoch = session.end_epoch()
    report = session.finish(print_run=False)
    assert epoch is not None
    assert epoch.get().summary.idle_source == "host_phases"
    assert session.signals.nvml is None
    assert report.summary.nvml is None
    assert report.notes == ()
    assert stallscope_threads() == []


def test_nvml_device_given_without_pynvml_is_a_note(tmp_path: Path, clock: FakeClock, cpu_clock: FakeClock) -> None:
    session = make_session(tmp_path, clock, cpu_clock, nvml_device=0)
    session.start()
    steps(session, clock, 4, 10, 10)
    report = session.finish(print_run=False)
    assert "nvml sampling is off: the nvidia-ml-py package is not installed; pip install nvidia-ml-py" in report.notes
    assert report.summary.idle_source == "host_phases"


def _fake_cuda(monkeypatch: pytest.MonkeyPatch, device: FakeDevice, *, uuid: str | None) -> CudaDevice:
    """torch reports a CUDA device (with ``uuid``) whose events ``device`` makes."""
    facts = CudaDevice(
        index=0,
        name="Fake GPU",
        uuid=uuid,
        capability=(9, 0),
        total_memory_bytes=80 * 2**30,
        max_reserved_bytes=2**30,
        max_allocated_bytes=2**29,
        tf32_matmul=False,
    )
    monkeypatch.setattr(collector_module, "cuda_facts", lambda **_: facts)
    monkeypatch.setattr(collector_module, "event_factory", lambda: device.event)
    return facts


def test_on_cuda_the_compute_phase_is_timed_with_events(
    tmp_path: Path, clock: FakeClock, cpu_clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    device = FakeDevice()
    facts = _fake_cuda(monkeypatch, device, uuid="GPU-1234")
    monkeypatch.setattr(collector_module, "batch_pinning", lambda batch, **_: (0, 2))
    session = make_session(tmp_path, clock, cpu_clock)
    session.start()
    session.note_loader(None, None)
    session.note_batch(object())
    tl = session.timeline
    compute = tl.phase_id("compute")
    for _ in range(10):
        tl.data_begin()
        clock.advance_ms(30)
        tl.data_end(got_item=True)
        tl.enter(compute)
        device.now_ms += 20  # the device works 20 ms of the 25 ms phase
        clock.advance_ms(25)
        tl.leave()
        device.now_ms += 35
    device.done_until = 1e12
    epoch = session.end_epoch()
    assert epoch is not None
    assert epoch.get().summary.idle_source == "cuda_events"
    assert epoch.get().summary.gpu_idle_fraction == pytest.approx(1 - 200 / 550, abs=1e-6)
    ctx = session.context(tl.run_stats(), session.signals.run_window())
    assert ctx.cuda is not None
    assert (ctx.cuda.batches_checked, ctx.cuda.pageable_batches) == (1, 1)
    assert ctx.cuda_device == facts
    # the GPU torch uses is handed to NVML by UUID (here NVML is not installed: a note)
    assert session.signals.nvml is not None
    assert session.signals.nvml.target == "GPU-1234"
    report = session.finish(print_run=False)
    assert "nvml sampling is off: the nvidia-ml-py package is not installed; pip install nvidia-ml-py" in report.notes
    tl.enter(compute)  # after the run the timeline no longer calls the timer
    assert tl._watch == -1


def test_a_broken_host_probe_is_contained(tmp_path: Path, clock: FakeClock, cpu_clock: FakeClock) -> None:
    session = make_session(tmp_path, clock, cpu_clock)
    probe = session.signals.host._probe  # type: ignore[union-attr]

    def broken() -> tuple[float, float]:
        raise OSError("proc is gone")

    probe.main_cpu = broken  # type: ignore[union-attr]
    session.start()  # the thread's first read fails: the sampler turns itself off
    steps(session, clock, 4, 10, 10)
    assert session.end_epoch() is not None
    report = session.finish(print_run=False)
    assert "host sampling is off: OSError: proc is gone" in report.notes
    assert report.summary.steps == 4


def test_an_internal_failure_stops_the_samplers(tmp_path: Path, clock: FakeClock, cpu_clock: FakeClock) -> None:
    session = make_session(tmp_path, clock, cpu_clock)
    session.start()
    session.warn_internal(RuntimeError("boom"))
    assert stallscope_threads() == []
    session.signals.stop()  # idempotent


def test_a_real_plain_loop_leaves_no_threads_behind(tmp_path: Path) -> None:
    with StallScope(tmp_path, console=False, sample_interval_s=0.01) as scope:
        for _ in scope.iter(range(20)):
            with scope.phase("compute"):
                pass
    assert stallscope_threads() == []
    assert scope.report is not None
    assert scope.report.summary.nvml is None


@pytest.mark.skipif(
    not Path(f"/proc/self/task/{threading.get_native_id()}/schedstat").exists(), reason="needs Linux's schedstat"
)
def test_the_host_sampler_follows_the_thread_that_started_the_run() -> None:
    """Started from a thread of its own, the collector reads that thread's time on a CPU (what
    it burnt here), not the main thread's (asleep in ``join``)."""
    timeline = Session(ScopeConfig.create(Path("unused"), console=False)).timeline
    collector = SignalCollector(timeline, nvml_device=None, interval_s=1.0, nvml_load=no_pynvml)
    burnt: list[float] = []

    def run() -> None:
        collector.start()
        sampler = collector.host
        assert sampler is not None
        deadline = time.monotonic() + 10
        while sampler._win is None and time.monotonic() < deadline:  # primed (its set-up needs the GIL)
            time.sleep(0.001)
        began = time.thread_time()
        while time.thread_time() - began < 0.1:
            pass
        burnt.append(time.thread_time() - began)
        collector.stop()

    worker = threading.Thread(target=run)
    worker.start()
    worker.join()
    host = collector.run_window().host
    assert host is not None, collector.notes()
    assert host.thread_cpu_s is not None
    assert host.thread_cpu_s >= 0.9 * burnt[0]
    assert host.thread_wait_s is not None


def _pass(session: Session, clock: FakeClock, index: int) -> None:
    """One short pass over a loader, as the plain loop's hooks record it."""
    session.note_loader(None, None)
    session.timeline.begin_epoch(in_process_data=True)
    steps(session, clock, 3, data_ms=1, compute_ms=2)
    session.timeline.note_boundary(EpochBoundary(index, 0, 0, 0))


def test_short_epochs_that_wait_share_the_host_window_of_their_group(
    tmp_path: Path, clock: FakeClock, cpu_clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On the CPU an epoch end with nothing due leaves the epoch's close for later and leaves the
    host's window open: the epochs too short to judge are diagnosed together, over the host's
    window of them all (samples taken in epochs 1 and 3 both count), closed when the group is
    (here by the run's end). The sampler is driven by hand: its thread's first step (the
    baseline readings) would race the test's samples."""
    seen: dict[int, object] = {}
    real = session_module.diagnose

    def diagnose(context: Any) -> Any:
        seen.setdefault(context.first_epoch, context.host_signals)
        return real(context)

    monkeypatch.setattr(session_module, "diagnose", diagnose)
    session = make_session(tmp_path, clock, cpu_clock)
    sampler = session.signals.host
    assert sampler is not None
    monkeypatch.setattr(sampler, "start", sampler.prime)  # no thread: the baseline taken here
    session.start()
    _pass(session, clock, 0)
    assert session.end_epoch() is not None  # the first epoch: closed at its end
    host = session.signals.host
    assert host is not None
    probe = host._probe
    assert isinstance(probe, FakeHost)
    for index, cpu_s in ((1, 0.004), (2, 0.0), (3, 0.010)):
        _pass(session, clock, index)
        if cpu_s:
            probe.own += cpu_s
            host.sample_once()  # the sampler's tick, inside this epoch
        assert session.end_epoch() is None  # waits
    assert (session.epochs_ended, len(session.epochs)) == (4, 1)
    report = session.report  # closes the waiting epochs: no diagnosis yet
    assert report is not None
    assert [epoch.index for epoch in report.epochs] == [0, 1, 2, 3]
    assert all(not e.findings and e.diagnosed_with is None for e in report.epochs)
    final = session.finish(print_run=False)
    assert [(e.diagnosed_with, e.covers_epochs) for e in final.epochs] == [(3, None)] * 3 + [(None, (0, 3))]
    assert getattr(seen[0], "main_cpu_s", None) == pytest.approx(0.014)


def test_on_cuda_short_epochs_wait_and_keep_their_own_windows(
    tmp_path: Path, clock: FakeClock, cpu_clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An epoch end on CUDA cost 1.4 ms of CPU on an H100 host (5% of a run of 30-step epochs),
    closing the CUDA events' and NVML's windows at once. Once the first epoch confirmed the run
    works on the GPU, a short epoch's end sets its windows aside and the epoch is closed a few
    epochs later, with its own device time."""
    device = FakeDevice()
    _fake_cuda(monkeypatch, device, uuid=None)
    allocations = Allocations()
    monkeypatch.setattr(collector_module, "cuda_allocations", allocations)
    session = make_session(tmp_path, clock, cpu_clock)
    session.signals = SignalCollector(
        session.timeline, nvml_device=None, interval_s=1.0, host=False, nvml_load=no_pynvml, clock=clock
    )
    session.start()
    assert not session.signals.windows_wait  # not before an epoch confirmed it
    device_ms = [2 * (i + 1) for i in range(6)]
    waited = 0
    for index, ms in enumerate(device_ms):
        session.timeline.begin_epoch(in_process_data=True)  # as the plain loop's hooks record a pass
        _cuda_steps(session, clock, device, allocations, grow=2, compute_ms=ms)
        session.timeline.note_boundary(EpochBoundary(index, 0, 0, 0))
        waited += session.end_epoch() is None  # its close waits
        assert session.signals.windows_wait
    assert waited == 5  # every epoch after the first
    report = session.finish(print_run=False)
    assert [e.summary.idle_source for e in report.epochs] == ["cuda_events"] * 6
    # 4 steps of 1 ms of data and ``ms`` of device work each: idle 1 / (1 + ms), epoch by epoch
    assert [e.summary.gpu_idle_fraction for e in report.epochs] == [
        pytest.approx(1 / (1 + ms), abs=1e-6) for ms in device_ms
    ]


class Allocations:
    """The CUDA allocator's count of allocations as a test drives it (``cuda_allocations``)."""

    def __init__(self) -> None:
        self.count = 500

    def __call__(self, torch: Any) -> int:
        return self.count


def _cuda_steps(
    session: Session,
    clock: FakeClock,
    device: FakeDevice,
    allocations: Allocations,
    grow: int,
    compute_ms: float = 20,
    on_first_step: Callable[[], object] | None = None,
) -> None:
    """A pass of 4 steps whose compute phases the CUDA events time; each step makes ``grow``
    allocations on the device (a model on the GPU: its activations; a model on the CPU: none).
    The device runs the phases as the host records them: an idle stream."""
    session.note_loader(None, None)
    tl = session.timeline
    compute = tl.phase_id("compute")
    for step in range(4):
        tl.data_begin()
        clock.advance_ms(1)
        tl.data_end(got_item=True)
        if step == 0 and on_first_step is not None:
            on_first_step()
        tl.enter(compute)
        clock.advance_ms(compute_ms)
        device.now_ms += compute_ms
        allocations.count += grow
        tl.leave()
    device.done_until = 1e12


def test_a_cpu_run_beside_tensors_held_on_cuda_is_read_as_a_cpu_run(
    tmp_path: Path, clock: FakeClock, cpu_clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Seen on an H100: a CPU training run in a process that still held tensors on the GPU (an
    earlier model, as in a notebook) was read as "GPU 100% busy (cuda_events), computes in
    float32: use bf16". Its compute phases timed an idle stream. The allocator's count of
    allocations did not move in its first epoch: it is a CPU run, until the count moves."""
    device = FakeDevice()
    _fake_cuda(monkeypatch, device, uuid="GPU-1234")
    allocations = Allocations()
    monkeypatch.setattr(collector_module, "cuda_allocations", allocations)
    session = make_session(tmp_path, clock, cpu_clock)
    session.start()
    assert session.signals.cuda_device is not None  # CUDA holds tensors: taken as the device at first
    _cuda_steps(session, clock, device, allocations, grow=0)
    first = session.end_epoch()
    assert first is not None
    assert first.get().summary.idle_source == "host_phases"
    assert session.signals.timer is None
    assert session.signals.nvml is None
    assert session._device().kind == "cpu"
    assert session.signals.on_cuda is False
    _cuda_steps(session, clock, device, allocations, grow=0)  # the next pass start does not take it back
    second = session.end_epoch(may_wait=False)
    assert second is not None
    assert second.get().summary.idle_source == "host_phases"
    assert session.signals.cuda_device is None
    # the run moves its model to the GPU: the count moves, and the next pass is on CUDA
    allocations.count += 3
    _cuda_steps(session, clock, device, allocations, grow=2)
    third = session.end_epoch(may_wait=False)
    assert third is not None
    assert third.get().summary.idle_source == "cuda_events"
    report = session.finish(print_run=False)
    assert report.run.device.kind == "cuda"
    assert any("allocated nothing on the GPU in its first epoch" in n for n in report.notes)


def test_a_gpu_run_that_allocates_stays_on_cuda(
    tmp_path: Path, clock: FakeClock, cpu_clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    device = FakeDevice()
    _fake_cuda(monkeypatch, device, uuid="GPU-1234")
    allocations = Allocations()
    monkeypatch.setattr(collector_module, "cuda_allocations", allocations)
    session = make_session(tmp_path, clock, cpu_clock)
    session.start()
    for index in range(3):
        _cuda_steps(session, clock, device, allocations, grow=2)
        epoch = session.end_epoch()
        assert epoch is not None
        assert session.signals.timer is not None
        assert session.signals.on_cuda is True
        if index == 0:  # (the timer times a phase every 16 ms of real time: the first one here)
            assert epoch.get().summary.idle_source == "cuda_events"
    allocations.count = 10**6  # confirmed once: not asked again
    monkeypatch.setattr(collector_module, "cuda_allocations", lambda torch: pytest.fail("asked again"))
    _cuda_steps(session, clock, device, allocations, grow=0)
    assert session.end_epoch() is not None
    report = session.finish(print_run=False)
    assert report.run.device.kind == "cuda"
    assert not any("allocated nothing" in n for n in report.notes)


def test_an_epoch_end_reads_the_gpus_peak_memory_on_a_budget(
    tmp_path: Path, clock: FakeClock, cpu_clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Reading the device's peak memory took 0.8 ms an epoch end on an H100 host (three walks of
    the allocator's table), 5% of a run of 30-step epochs. Each reading here takes 0.05 ms of the
    clock: with epochs 2 ms apart, one epoch end in about ten reads it, and the run's report has
    the peak as of its end."""
    device = FakeDevice()
    facts = _fake_cuda(monkeypatch, device, uuid=None)
    reads = {"n": 0}

    def read(*, in_use: bool = False) -> CudaDevice:
        reads["n"] += 1
        clock.advance_ms(0.05)
        return replace(facts, max_allocated_bytes=reads["n"])

    monkeypatch.setattr(collector_module, "cuda_facts", read)
    collector = SignalCollector(
        Session(ScopeConfig.create(tmp_path, console=False)).timeline,
        nvml_device=None,
        interval_s=1.0,
        host=False,
        nvml_load=no_pynvml,
        clock=clock,
    )
    collector.start()
    start = reads["n"]
    for _ in range(200):
        clock.advance_ms(2)
        collector.close_window(steps=0)
    epoch_reads = reads["n"] - start
    assert 10 <= epoch_reads <= 200 // 8
    run = collector.run_window()
    assert run.cuda_device is not None
    assert run.cuda_device.max_allocated_bytes == reads["n"]  # read anew for the run's report
    collector.stop()


def test_cuda_first_seen_at_an_epoch_end_is_confirmed_at_the_next(
    tmp_path: Path, clock: FakeClock, cpu_clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A model whose memory appears only in its first step (lazy modules, a model moved to the GPU
    inside the step) is first seen at the epoch's end: taken there, and confirmed (or not) at the
    next epoch end, not in the same one against its own count (found in review)."""
    device = FakeDevice()
    facts = _fake_cuda(monkeypatch, device, uuid="GPU-1234")
    on_gpu = {"yet": False}
    monkeypatch.setattr(collector_module, "cuda_facts", lambda **_: facts if on_gpu["yet"] else None)
    allocations = Allocations()
    monkeypatch.setattr(collector_module, "cuda_allocations", allocations)
    session = make_session(tmp_path, clock, cpu_clock)
    session.start()
    assert session.signals.cuda_device is None
    _cuda_steps(session, clock, device, allocations, grow=2, on_first_step=lambda: on_gpu.update(yet=True))
    assert session.signals.cuda_device is None  # the pass started before
    session.end_epoch()
    assert session.signals.cuda_device is not None
    assert not session.signals.cuda_idle
    _cuda_steps(session, clock, device, allocations, grow=2)
    session.end_epoch(may_wait=False)
    assert session.signals.on_cuda is True
    report = session.finish(print_run=False)
    assert report.run.device.kind == "cuda"
    assert not any("allocated nothing" in n for n in report.notes)
