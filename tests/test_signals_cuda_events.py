"""CUDA-event timing of the compute phase, tested with fake events (no GPU here)."""

from __future__ import annotations

import sys
from collections import deque
from types import SimpleNamespace
from typing import Any

import pytest

from stallscope.signals import cuda_events
from stallscope.signals.cuda_events import CudaComputeTimer, batch_pinning


class FakeDevice:
    """A device timeline: events complete when ``run_until`` passes their time."""

    def __init__(self, record_cost_ms: float = 0.0) -> None:
        self.now_ms = 0.0
        self.done_until = -1.0
        self.created = 0
        self.synchronized = False
        #: host time one event record takes (the fake clock moves by it)
        self.record_cost_ms = record_cost_ms

    def clock(self) -> int:
        """The host's clock, ns: here the same timeline as the device's."""
        return round(self.now_ms * 1e6)

    def event(self) -> FakeEvent:
        self.created += 1
        return FakeEvent(self)


class FakeEvent:
    def __init__(self, device: FakeDevice) -> None:
        self.device = device
        self.at: float | None = None

    def record(self) -> None:
        self.at = self.device.now_ms
        self.device.now_ms += self.device.record_cost_ms

    def query(self) -> bool:
        return self.at is not None and self.at <= self.device.done_until

    def elapsed_time(self, end: Any) -> float:
        if not (self.query() and end.query()):
            raise RuntimeError("elapsed_time on unfinished events")
        assert self.at is not None
        return float(end.at - self.at)

    def synchronize(self) -> None:  # pragma: no cover - must never be called
        self.device.synchronized = True


def compute_phase(timer: CudaComputeTimer, device: FakeDevice, ms: float) -> None:
    timer.begin()
    device.now_ms += ms
    timer.end()


def test_pairs_resolve_once_the_device_is_done_and_never_wait() -> None:
    device = FakeDevice()
    timer = CudaComputeTimer(device.event, clock=device.clock, poll_every=1, warmup=0)
    for _ in range(3):
        compute_phase(timer, device, 10)
        device.now_ms += 5  # data wait
    assert timer.close_window() is None  # nothing finished on the device yet
    device.done_until = 26  # the first two phases are done
    run = timer.run_summary()
    assert run is not None
    # two resolved; the third, still on the device, counts at their mean
    assert (run.busy_ns, run.phases, run.pending) == (30_000_000, 2, 1)
    for _ in range(2):
        compute_phase(timer, device, 4)
    device.done_until = 1000
    window = timer.close_window()
    assert window is not None
    # resolved since the first window closed: its three phases (10 ms each; it had none to
    # measure them by) and this window's two (4 ms each); this window's own two count at their
    # mean, 7.6 ms
    assert (window.busy_ns, window.phases, window.pending) == (15_200_000, 5, 0)
    assert not device.synchronized


def test_events_are_pooled() -> None:
    device = FakeDevice()
    device.done_until = 1e9
    timer = CudaComputeTimer(device.event, clock=device.clock, poll_every=1, warmup=0)
    for _ in range(100):
        compute_phase(timer, device, 1)
    run = timer.run_summary()
    assert run is not None
    assert run.phases == 100
    assert device.created <= 4


def test_the_pending_queue_is_bounded() -> None:
    device = FakeDevice()  # never finishes anything
    timer = CudaComputeTimer(device.event, clock=device.clock, max_pending=8, poll_every=4, warmup=0)
    for _ in range(50):
        compute_phase(timer, device, 1)
    assert len(timer._pending) == 8
    assert device.created <= 2 * 8 + 1
    device.done_until = 1e9
    window = timer.close_window()
    assert window is not None
    assert (window.phases, window.dropped) == (8, 42)


def test_nested_compute_phases_are_timed_once() -> None:
    device = FakeDevice()
    device.done_until = 1e9
    timer = CudaComputeTimer(device.event, clock=device.clock, warmup=0)
    timer.begin()
    device.now_ms += 3
    compute_phase(timer, device, 4)  # nested
    device.now_ms += 3
    timer.end()
    window = timer.close_window()
    assert window is not None
    assert (window.phases, window.busy_ns) == (1, 10_000_000)


def test_a_failing_event_turns_the_timer_off_with_a_note() -> None:
    def broken() -> Any:
        raise RuntimeError("CUDA error: an illegal memory access")

    timer = CudaComputeTimer(broken, warmup=0)
    timer.begin()  # must not raise on the hot path
    timer.end()
    assert not timer.enabled
    assert timer.note == (
        "CUDA-event timing of the compute phase turned itself off (RuntimeError: CUDA error: an illegal memory access)"
    )
    assert timer.close_window() is None


def test_batches_checked_for_pinning() -> None:
    device = FakeDevice()
    timer = CudaComputeTimer(device.event, clock=device.clock, warmup=0)
    timer.note_batch(pinned=0, pageable=2)
    timer.note_batch(pinned=2, pageable=0)
    timer.note_batch(pinned=0, pageable=0)  # no CPU tensors: not a check
    window = timer.close_window()
    assert window is not None
    assert (window.batches_checked, window.pageable_batches) == (2, 1)


class FakeTensor:
    def __init__(self, device: str, pinned: bool) -> None:
        self.device = SimpleNamespace(type=device)
        self._pinned = pinned

    def is_pinned(self) -> bool:
        return self._pinned


def test_batch_pinning_walks_nested_batches(monkeypatch: pytest.MonkeyPatch) -> None:
    fake_torch = SimpleNamespace(Tensor=FakeTensor)
    monkeypatch.setattr(cuda_events, "_cuda_torch", lambda **_: fake_torch)
    batch = {"x": FakeTensor("cpu", False), "y": [FakeTensor("cpu", True), FakeTensor("cuda", False)], "n": 3}
    assert batch_pinning(batch) == (1, 1)


def test_without_cuda_nothing_is_asked_of_torch() -> None:
    """On this CPU-only machine CUDA is never initialised, so nothing here touches it."""
    import torch

    assert batch_pinning((torch.zeros(2),)) == (0, 0)
    assert cuda_events.cuda_facts() is None
    assert cuda_events.event_factory() is None
    assert not torch.cuda.is_initialized()


def _torch_with_cuda(*, initialised: bool, allocated: int) -> SimpleNamespace:
    def memory_allocated() -> int:
        if not initialised:
            raise AssertionError("asked the allocator of an uninitialised CUDA")
        return allocated

    cuda = SimpleNamespace(
        is_initialized=lambda: initialised,
        memory_allocated=memory_allocated,
        current_device=lambda: 0,
        get_device_properties=lambda index: SimpleNamespace(
            name="GPU", uuid="1234", major=9, minor=0, total_memory=2**30
        ),
        max_memory_reserved=lambda index: allocated,
        max_memory_allocated=lambda index: allocated,
        Event=lambda enable_timing: object(),
    )
    return SimpleNamespace(
        cuda=cuda, backends=SimpleNamespace(cuda=SimpleNamespace(matmul=SimpleNamespace(allow_tf32=False)))
    )


@pytest.mark.parametrize(
    ("initialised", "allocated", "in_use"), [(False, 0, False), (True, 0, False), (True, 4096, True)]
)
def test_cuda_counts_only_with_tensors_on_the_device(
    monkeypatch: pytest.MonkeyPatch, initialised: bool, allocated: int, in_use: bool
) -> None:
    """A process that initialised CUDA but keeps nothing on it trains on the CPU: on a GPU machine,
    a CPU run after CUDA had been touched in the same process was read as "accelerator idle 100%
    (cuda_events)" and told to train in mixed precision."""
    from stallscope.hooks import environment

    fake = _torch_with_cuda(initialised=initialised, allocated=allocated)
    monkeypatch.setitem(sys.modules, "torch", fake)
    assert cuda_events.cuda_in_use(fake) is in_use
    assert (cuda_events.cuda_facts() is not None) is in_use
    assert (cuda_events.event_factory() is not None) is in_use
    assert environment.current_device().kind == ("cuda" if in_use else "cpu")


def test_records_are_sampled_to_keep_their_cost_within_budget() -> None:
    """Two records cost 40 us of host time (about what an H100 host measured, 38 us); steps come
    every 1.5 ms. Timing every phase would take 2.7% of the host's time; the timer times one in
    ``every``, keeps the records within the budget, and the busy time it reports is the device
    time of all the phases."""
    device = FakeDevice(record_cost_ms=0.02)
    timer = CudaComputeTimer(device.event, clock=device.clock, warmup=0)
    for _ in range(2000):
        compute_phase(timer, device, 1.0)  # 1 ms of device work a phase
        device.now_ms += 0.5  # the rest of the step
    device.done_until = device.now_ms
    window = timer.close_window()
    assert window is not None
    assert timer.gap_ns == pytest.approx(0.04e6 / cuda_events.TIMING_BUDGET)  # 16 ms
    assert window.phases + window.untimed == 2000
    assert window.phases < 2000 / 8
    # each timed phase spans its 1 ms plus the start record's cost; scaled to all 2000 phases
    assert window.busy_ns == pytest.approx(2000 * 1.02e6, rel=0.01)
    # the records' share of the host's time: timed phases x 40 us over the wall time
    assert window.phases * 0.04 / device.now_ms <= 1.5 * cuda_events.TIMING_BUDGET


def test_long_phases_are_all_timed() -> None:
    device = FakeDevice(record_cost_ms=0.02)
    timer = CudaComputeTimer(device.event, clock=device.clock, warmup=0)
    for _ in range(50):
        compute_phase(timer, device, 20.0)
    device.done_until = device.now_ms
    window = timer.close_window()
    assert window is not None
    assert (window.phases, window.untimed) == (50, 0)


def test_a_loop_that_runs_ahead_of_the_device_is_timed_once_it_waits() -> None:
    """A device-bound loop: the host launches a step in 1 ms, the device takes 100 ms, and the
    host blocks once it is 3 steps ahead. The first, fast launches are sampled; once the host
    waits for the device, the 100 ms between phases leave every phase timed, and the busy time
    is the device's."""
    device = FakeDevice(record_cost_ms=0.02)
    timer = CudaComputeTimer(device.event, clock=device.clock, warmup=0)
    device_free = 0.0

    class Event(FakeEvent):
        def record(self) -> None:  # the device reaches an event once the work before it is done
            self.at = max(device.now_ms, device_free)
            device.now_ms += device.record_cost_ms

    timer = CudaComputeTimer(lambda: Event(device), clock=device.clock, warmup=0)
    for _ in range(60):
        timer.begin()
        device.now_ms += 1.0  # the launches
        device_free = max(device_free, device.now_ms) + 100.0
        device.now_ms = max(device.now_ms, device_free - 300.0)  # at most 3 steps ahead
        timer.end()
    device.done_until = device_free
    device.now_ms = device_free
    window = timer.close_window()
    assert window is not None
    assert window.untimed <= 3  # only among the first launches
    assert window.busy_ns == pytest.approx(60 * 100e6, rel=0.03)


def test_released_at_the_end_of_the_run_holding_no_event() -> None:
    """The events are let go in the training process when the run ends: one left to the garbage
    collector could be destroyed in a DataLoader worker forked by a later fit, where CUDA cannot
    be used (on an H100 that aborted the worker)."""
    device = FakeDevice()
    timer = CudaComputeTimer(device.event, clock=device.clock, poll_every=1, warmup=0)
    for _ in range(3):
        compute_phase(timer, device, 10)
    device.done_until = 15  # the first phase is done, two are still on the device
    timer.release()
    assert (timer._pending, timer._free, timer._open) == (deque(), [], None)
    run = timer.run_summary()
    assert run is not None
    # the two phases still on the device count at the resolved one's device time
    assert (run.phases, run.busy_ns, run.dropped, run.pending) == (1, 30_000_000, 2, 0)
    timer.begin()  # after the end: nothing recorded, nothing raised
    timer.end()
    assert device.created == 6


def test_the_collector_releases_the_timer_when_it_stops() -> None:
    from stallscope.signals.collector import SignalCollector
    from stallscope.timeline.recorder import Timeline

    device = FakeDevice()
    collector = SignalCollector(Timeline(), nvml_device=None, interval_s=0.2, host=False)
    collector.timer = CudaComputeTimer(device.event, clock=device.clock, warmup=0)
    compute_phase(collector.timer, device, 10)
    collector.stop()
    assert collector.timer._pending == deque()


def _torch_with_nested_stats(stats: dict[str, Any]) -> SimpleNamespace:
    """A torch whose allocator answers through ``memory_stats_as_nested_dict`` only: the one-number
    functions flatten the whole table in Python (about 250 us each on an H100 host)."""

    def flat(*args: Any) -> Any:
        raise AssertionError("a one-number allocator function was called")

    cuda = SimpleNamespace(
        is_initialized=lambda: True,
        memory_stats_as_nested_dict=lambda index=None: stats,
        memory_allocated=flat,
        memory_stats=flat,
        max_memory_reserved=flat,
        max_memory_allocated=flat,
        current_device=lambda: 0,
        get_device_properties=lambda index: SimpleNamespace(
            name="GPU", uuid="1234", major=9, minor=0, total_memory=2**30
        ),
    )
    return SimpleNamespace(
        cuda=cuda, backends=SimpleNamespace(cuda=SimpleNamespace(matmul=SimpleNamespace(allow_tf32=True)))
    )


def test_the_allocator_is_read_in_one_call_per_question(monkeypatch: pytest.MonkeyPatch) -> None:
    stats = {
        "allocated_bytes": {"all": {"current": 4096, "peak": 8192}},
        "reserved_bytes": {"all": {"current": 2**20, "peak": 2**21}},
        "allocation": {"all": {"allocated": 77}},
    }
    fake = _torch_with_nested_stats(stats)
    monkeypatch.setitem(sys.modules, "torch", fake)
    assert cuda_events.cuda_in_use(fake)
    assert cuda_events.cuda_allocations(fake) == 77
    facts = cuda_events.cuda_facts()
    assert facts is not None
    assert (facts.max_allocated_bytes, facts.max_reserved_bytes, facts.uuid) == (8192, 2**21, "GPU-1234")
    stats["allocated_bytes"]["all"]["current"] = 0  # nothing held: not in use, unless the caller saw it
    assert not cuda_events.cuda_in_use(fake)
    assert cuda_events.cuda_facts() is None
    assert cuda_events.cuda_facts(in_use=True) is not None
    assert cuda_events.cuda_allocations(None) is None


@pytest.mark.parametrize(
    ("backend", "count", "expected"), [("native", 77, 77), ("native", 0, None), ("cudaMallocAsync", 0, None)]
)
def test_an_allocator_that_keeps_no_count_is_unknown(
    monkeypatch: pytest.MonkeyPatch, backend: str, count: int, expected: int | None
) -> None:
    """``cudaMallocAsync`` fills only the byte counts of its tables: its count of allocations reads
    0, and a GPU run would have read as one that allocates nothing (found in review)."""
    stats = {"allocated_bytes": {"all": {"current": 4096}}, "allocation": {"all": {"allocated": count}}}
    fake = _torch_with_nested_stats(stats)
    fake.cuda.get_allocator_backend = lambda: backend
    assert cuda_events.cuda_allocations(fake) == expected


def test_cudas_lazy_start_in_the_first_phase_is_not_read_as_busy_time() -> None:
    """A data-bound run in a fresh process, as an H100 showed it: in the first compute phase the
    host spends 500 ms initialising CUDA (cuBLAS, kernel modules) while the device, past the
    start event, waits; the first event record also creates CUDA's events (4 ms). Each later step
    is 1 ms of device work in 20 ms. Timed from its first phase, with the gap stretched by the
    first records' cost and the few timed phases scaled up to all 80, the run read as busy for
    longer than it lasted ("GPU 0% idle"). The warm-up phase is left untimed, the gap stays
    within ``MAX_GAP_NS`` (without it only 2 phases are timed): the busy time is the device's
    80 ms, scaled from many timed phases."""
    device = FakeDevice(record_cost_ms=0.02)
    records = 0

    class Event(FakeEvent):
        def record(self) -> None:
            nonlocal records
            records += 1
            if records == 1:
                device.now_ms += 4.0  # the first record also creates CUDA's events
            super().record()

    timer = CudaComputeTimer(lambda: Event(device), clock=device.clock)
    compute_phase(timer, device, 500.0)  # the lazy initialisation, inside the first step
    device.now_ms += 19.0
    for _ in range(79):
        compute_phase(timer, device, 1.0)
        device.now_ms += 19.0
    device.done_until = device.now_ms
    window = timer.close_window()
    assert window is not None
    assert window.untimed >= 1
    assert window.phases >= 10  # timed often enough that the scaling rests on many phases
    # 80 phases of 1 ms (each timed span also holds its start record's 0.02 ms)
    assert window.busy_ns == pytest.approx(80 * 1.02e6, rel=0.05)
    assert window.busy_ns < 0.1 * device.now_ms * 1e6  # the device was idle 90%+ of the run


def test_the_warm_up_phase_alone_gives_no_busy_time() -> None:
    """An epoch of one compute phase, the warm-up: no phase timed, no CUDA-event window (the
    epoch's idle time comes from NVML or the host); the next phases are timed."""
    device = FakeDevice()
    device.done_until = 1e9
    timer = CudaComputeTimer(device.event, clock=device.clock)
    compute_phase(timer, device, 300.0)
    assert timer.close_window() is None
    for _ in range(3):
        compute_phase(timer, device, 2.0)
    window = timer.close_window()
    assert window is not None
    assert (window.phases, window.busy_ns) == (3, 6_000_000)


def test_short_epochs_borrow_the_runs_busy_time_per_phase() -> None:
    """60 epochs of 30 launch-bound steps (1.2 ms each, 0.6 ms of it device work), records at
    0.02 ms so one phase in about 13 is timed, and the device 5 ms behind the host: an epoch
    holds two or three timed phases, some of whose events resolve in the next epoch. Each epoch's
    window must still give its busy time (not None, which sent the epoch to NVML or the host's
    phases), close to the device's 30 x 0.6 ms."""
    device = FakeDevice(record_cost_ms=0.02)
    timer = CudaComputeTimer(device.event, clock=device.clock)
    windows = []
    for _ in range(60):
        for _ in range(30):
            compute_phase(timer, device, 0.6)
            device.now_ms += 0.6  # the rest of the step
            device.done_until = device.now_ms - 5.0
        windows.append(timer.close_window())
    later = windows[5:]  # once the run has timed a few phases
    assert all(w is not None for w in later)
    for w in later:
        assert w is not None
        # each timed span also holds its start record's 0.02 ms
        assert w.busy_ns == pytest.approx(30 * 0.62e6, rel=0.15)
    assert all(w is not None and w.timed for w in later)
    assert any(w is not None and w.borrowed for w in later)


def test_a_window_with_enough_timed_phases_keeps_its_own() -> None:
    """Long phases, all timed: a window's busy time is its own, whatever the run's was."""
    device = FakeDevice()
    device.done_until = 1e9
    timer = CudaComputeTimer(device.event, clock=device.clock, warmup=0)
    for _ in range(8):
        compute_phase(timer, device, 10.0)
    first = timer.close_window()
    for _ in range(8):
        compute_phase(timer, device, 2.0)
    second = timer.close_window()
    assert first is not None
    assert second is not None
    assert not second.borrowed
    assert second.busy_ns == 16_000_000


def test_phases_still_on_the_device_at_a_windows_end_are_not_counted_twice() -> None:
    """Identical epochs of 10 phases of 1 ms of device work in 2 ms steps; every other epoch ends
    with all its phases still on the device, which finishes them in the next one. Each window's
    busy time is its own 10 ms, whether its phases resolved in it or in the next window (counted
    there by the resolved phases' number, the whole lot would read 20 ms in one window and 0 or
    a borrowed 10 ms in the other)."""
    device = FakeDevice()
    timer = CudaComputeTimer(device.event, clock=device.clock, warmup=0)
    windows = []
    for epoch in range(8):
        for _ in range(10):
            compute_phase(timer, device, 1.0)
            device.now_ms += 1.0
        if epoch % 2 == 1:
            device.done_until = device.now_ms  # caught up: this epoch's and the last one's
        windows.append(timer.close_window())
    for w in windows[2:]:
        assert w is not None
        assert w.busy_ns == pytest.approx(10e6, rel=0.01)


def test_a_group_window_spans_the_epoch_windows_closed_since_the_last_group() -> None:
    """Epochs diagnosed together (``close_group``): the group's window holds every compute
    phase of its epochs' windows, whatever those windows were closed in between; it has its own
    six phases to measure them by (an epoch's two are too few: it borrows the run's mean)."""
    device = FakeDevice()
    device.done_until = 1e9
    timer = CudaComputeTimer(device.event, clock=device.clock, poll_every=1, warmup=0)
    windows = []
    for ms in (2, 3, 5):  # three short epochs of two phases each
        for _ in range(2):
            compute_phase(timer, device, ms)
        window = timer.close_window()
        assert window is not None
        windows.append(window)
    group = timer.close_group()
    assert group is not None
    assert group.phases == sum(w.phases for w in windows) == 6
    assert windows[1].borrowed
    assert not group.borrowed
    assert group.busy_ns == 20_000_000
    compute_phase(timer, device, 7)
    assert timer.close_window() is not None
    later = timer.close_group()  # the next group: only what came after (one phase: too few of
    assert later is not None  # its own, it borrows the run's mean, 27 ms / 7)
    assert (later.phases, later.borrowed, later.busy_ns) == (1, True, 3_857_143)
