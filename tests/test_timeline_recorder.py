from __future__ import annotations

import random
import time
from collections.abc import Callable, Iterator

import pytest
from conftest import FakeClock

from stallscope.timeline import recorder
from stallscope.timeline.phases import BUILTIN_PHASES
from stallscope.timeline.recorder import DATA_CPU_INTERVAL_NS, GOT, NATIVE_MODULE, NONE, STEP, Timeline
from stallscope.timeline.stats import Distribution, EpochBoundary, IdleWindow, SpanSnapshot, SpanStats

_native = NATIVE_MODULE


@pytest.fixture
def tl(clock: FakeClock, cpu_clock: FakeClock) -> Timeline:
    """A started timeline on fake clocks, at t = 0."""
    timeline = Timeline(clock=clock, cpu_clock=cpu_clock)
    timeline.start()
    return timeline


def _step(tl: Timeline, clock: FakeClock, wait: int, compute: int, other: int = 0) -> None:
    """One item as ``scope.iter`` records it: wait for it, then compute, then uncovered time."""
    tl.data_begin()
    clock.advance(wait)
    tl.data_end(got_item=True)
    tl.enter(tl.phase_id("compute"))
    clock.advance(compute)
    tl.leave()
    clock.advance(other)


def _open_pass(tl: Timeline, clock: FakeClock, iter_ns: int = 0) -> None:
    """``iter(loader)`` as ``scope.iter`` records it (data time, but no step)."""
    tl.data_begin(new_step=False)
    clock.advance(iter_ns)
    tl.data_end(got_item=False)


def _close_pass(tl: Timeline, clock: FakeClock, last_ns: int = 0) -> None:
    """The final ``next()`` that raises ``StopIteration``."""
    tl.data_begin()
    clock.advance(last_ns)
    tl.data_end(got_item=False)


def _assert_partition(span: SpanStats) -> None:
    assert sum(span.phase_ns.values()) == span.wall_ns


# -- construction ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "named"),
    [
        ({"recent_steps": 0}, "recent_steps must be >= 1, got 0"),
        ({"window_steps": 0}, "window_steps must be >= 1, got 0"),
        ({"max_windows": 1}, "got 1"),
        ({"max_windows": 5}, "got 5"),
    ],
)
def test_bad_arguments_raise_value_error_naming_them(kwargs: dict[str, int], named: str) -> None:
    with pytest.raises(ValueError, match=named):
        Timeline(**kwargs)


def test_started_only_after_start(clock: FakeClock, cpu_clock: FakeClock) -> None:
    timeline = Timeline(clock=clock, cpu_clock=cpu_clock)
    assert not timeline.started
    timeline.start()
    assert timeline.started


# -- phases ----------------------------------------------------------------------------------


def test_time_outside_any_phase_is_other(clock: FakeClock, cpu_clock: FakeClock) -> None:
    clock.now = 1_000  # the run starts at start(), not at clock zero
    timeline = Timeline(clock=clock, cpu_clock=cpu_clock)
    timeline.start()
    clock.advance(50)
    run = timeline.run_stats()
    assert run.wall_ns == 50
    assert dict(run.phase_ns) == {name: (50 if name == "other" else 0) for name in BUILTIN_PHASES}
    assert run.steps == 0


def test_nested_phases_count_exclusively(tl: Timeline, clock: FakeClock) -> None:
    compute, logging = tl.phase_id("compute"), tl.phase_id("logging")
    clock.advance(10)  # other
    tl.enter(compute)
    assert tl.depth == 1
    clock.advance(20)  # compute
    tl.enter(logging)
    assert tl.depth == 2
    clock.advance(5)  # logging, not compute
    tl.leave()
    clock.advance(7)  # compute again
    tl.leave()
    assert tl.depth == 0
    clock.advance(3)  # other
    run = tl.run_stats()
    assert run.wall_ns == 45
    assert run.phase_ns["other"] == 13
    assert run.phase_ns["compute"] == 27
    assert run.phase_ns["logging"] == 5
    assert run.phase_counts["compute"] == 1
    assert run.phase_counts["logging"] == 1
    _assert_partition(run)


def test_same_phase_nested_in_itself(tl: Timeline, clock: FakeClock) -> None:
    compute = tl.phase_id("compute")
    tl.enter(compute)
    clock.advance(4)
    tl.enter(compute)
    clock.advance(6)
    tl.leave()
    clock.advance(1)
    tl.leave()
    run = tl.run_stats()
    assert run.phase_ns["compute"] == 11
    assert run.phase_counts["compute"] == 2
    _assert_partition(run)


def test_unbalanced_leave_falls_back_to_other(tl: Timeline, clock: FakeClock) -> None:
    clock.advance(5)
    tl.leave()  # nothing open
    clock.advance(5)
    assert tl.depth == 0
    run = tl.run_stats()
    assert run.phase_ns["other"] == 10
    _assert_partition(run)


def test_builtin_phase_ids_follow_the_vocabulary(tl: Timeline) -> None:
    assert [tl.phase_id(name) for name in BUILTIN_PHASES] == list(range(len(BUILTIN_PHASES)))


def test_custom_phase_is_registered_once_and_reported_under_its_name(tl: Timeline, clock: FakeClock) -> None:
    tokenize = tl.phase_id("tokenize")
    assert tokenize == len(BUILTIN_PHASES)
    assert tl.phase_id("tokenize") == tokenize
    tl.phase_id("never_entered")
    tl.enter(tokenize)
    clock.advance(30)
    tl.leave()
    clock.advance(10)
    run = tl.run_stats()
    assert run.phase_ns["tokenize"] == 30
    assert run.phase_counts["tokenize"] == 1
    assert "never_entered" not in run.phase_ns  # custom phases appear once used
    assert run.phase_ns["other"] == 10
    _assert_partition(run)


# -- steps -----------------------------------------------------------------------------------


def test_a_pass_over_a_loader(tl: Timeline, clock: FakeClock, cpu_clock: FakeClock) -> None:
    tl.begin_epoch(in_process_data=True)
    tl.data_begin(new_step=False)
    clock.advance(4)
    cpu_clock.advance(1)
    assert tl.data_end(got_item=False) == 4  # iter(): data time, not a step
    for wait, compute in ((2, 10), (3, 20), (5, 30)):
        tl.data_begin()
        clock.advance(wait)
        cpu_clock.advance(1)
        assert tl.data_end(got_item=True) == wait
        tl.enter(tl.phase_id("compute"))
        clock.advance(compute)
        cpu_clock.advance(100)
        tl.leave()
        clock.advance(1)  # other
    tl.data_begin()
    clock.advance(6)
    cpu_clock.advance(1)
    tl.data_end(got_item=False)  # StopIteration
    assert tl.steps == 3

    epoch = tl.end_epoch()
    # steps run from one data_begin to the next: 2+10+1, 3+20+1, 5+30+1
    assert epoch.steps == 3
    assert epoch.epochs == 1
    assert epoch.step_total_ns == 13 + 24 + 36
    assert epoch.wall_ns == 4 + 73 + 6
    assert epoch.phase_ns["data"] == 4 + 2 + 3 + 5 + 6
    assert epoch.phase_ns["compute"] == 60
    assert epoch.phase_ns["other"] == 3
    _assert_partition(epoch)
    assert epoch.phase_counts["data"] == 5  # iter() + 3 items + the exhausting next()
    assert epoch.phase_counts["compute"] == 3
    assert epoch.step.n == 3
    assert epoch.step.mean == pytest.approx(73 / 3 / 1e9)
    assert epoch.step.p50 == pytest.approx(24e-9)
    assert epoch.step.max == pytest.approx(36e-9)
    assert epoch.data_wait.mean == pytest.approx(10 / 3 / 1e9)
    assert epoch.data_wait.p50 == pytest.approx(3e-9)
    assert epoch.data_wait.max == pytest.approx(5e-9)
    assert epoch.data_cpu_ns == 5  # CPU time inside the five data calls only
    assert epoch.process_cpu_ns == 305


def test_first_wait_of_a_pass_starts_no_step_until_an_item_arrives(tl: Timeline, clock: FakeClock) -> None:
    tl.begin_epoch(in_process_data=True)
    _open_pass(tl, clock)
    _close_pass(tl, clock, last_ns=9)  # an empty loader
    epoch = tl.end_epoch()
    assert epoch.steps == 0
    assert epoch.step_total_ns == 0
    assert epoch.step.n == 0
    assert epoch.phase_ns["data"] == 9


def test_end_epoch_closes_the_step_in_progress(tl: Timeline, clock: FakeClock) -> None:
    tl.begin_epoch(in_process_data=True)
    _open_pass(tl, clock)
    _step(tl, clock, wait=2, compute=10)
    _step(tl, clock, wait=3, compute=7)  # the user breaks out here
    clock.advance(5)
    epoch = tl.end_epoch()
    assert epoch.steps == 2
    assert epoch.step_total_ns == 12 + 15
    assert epoch.step.max == pytest.approx(15e-9)
    assert epoch.phase_ns["other"] == 5
    _assert_partition(epoch)


def test_worker_loaders_have_no_data_cpu(tl: Timeline, clock: FakeClock, cpu_clock: FakeClock) -> None:
    tl.begin_epoch(in_process_data=False)
    _open_pass(tl, clock)
    _step(tl, clock, wait=1, compute=1)
    _close_pass(tl, clock)
    assert tl.end_epoch().data_cpu_ns is None
    tl.begin_epoch(in_process_data=True)
    _open_pass(tl, clock, iter_ns=10)
    _close_pass(tl, clock)
    assert tl.end_epoch().data_cpu_ns == 0  # measured: no CPU in that pass
    assert tl.run_stats().data_cpu_ns is None  # part of the run had workers


class _BusyWaitClock:
    """A wall clock and a CPU clock where every wait burns CPU for ``share`` of its wall time."""

    def __init__(self, share: float) -> None:
        self.share = share
        self.wall = 0
        self.cpu = 0

    def advance(self, ns: int, busy: bool) -> None:
        self.wall += ns
        if busy:
            self.cpu += round(ns * self.share)


@pytest.mark.parametrize(
    ("compute_ns", "sampled"),
    [
        (DATA_CPU_INTERVAL_NS, 80),  # long steps: every wait is read
        (1000, 1),  # 80 steps in 0.1 ms: only the first wait is read
        (DATA_CPU_INTERVAL_NS // 4 - 400, 20),  # one wait in four
    ],
)
def test_in_process_data_cpu_is_sampled_by_time_and_scaled_by_wall_time(compute_ns: int, sampled: int) -> None:
    """The CPU time of one next() per DATA_CPU_INTERVAL_NS is read; its CPU share scales to all
    the data time."""
    clocks = _BusyWaitClock(share=0.25)
    tl = Timeline(clock=lambda: clocks.wall, cpu_clock=lambda: clocks.cpu)
    tl.start()
    compute = tl.phase_id("compute")
    tl.begin_epoch(in_process_data=True)
    items = iter(range(80))

    class Loader:
        def __iter__(self) -> Loader:
            return self

        def __next__(self) -> int:
            clocks.advance(400, busy=True)  # making a batch: 400 ns, a quarter of it on the CPU
            return next(items)

    reads = {"n": 0}
    real_cpu = tl._cpu_clock

    def counting_cpu() -> int:
        reads["n"] += 1
        return real_cpu()

    tl._cpu_clock = counting_cpu
    stream = tl.stream(Loader(), lambda item, wait: None, [])
    for _ in range(80):
        next(stream)
        tl.enter(compute)
        clocks.advance(compute_ns, busy=False)
        tl.leave()
    stats = tl.end_epoch()
    data_wall = stats.phase_ns["data"]
    assert data_wall == 400 * 80
    assert stats.data_cpu_ns == data_wall // 4
    # two CPU-clock reads per sampled next(), plus one at the epoch end
    assert reads["n"] == 2 * sampled + 1


@pytest.mark.parametrize("how", ["stream", "data_begin/data_end"])
def test_the_sampled_waits_time_neither_on_a_cpu_nor_blocked_is_still(how: str) -> None:
    """A sampled wait in which the thread made no voluntary context switch keeps its time off the
    CPU as ``data_still_ns``; a wait that blocked (a read from storage) does not. Every wait is
    read here (steps of ``DATA_CPU_INTERVAL_NS``), and each is scaled as the CPU time is."""
    clocks = _BusyWaitClock(share=0.25)
    switches = {"n": 100}
    tl = Timeline(clock=lambda: clocks.wall, cpu_clock=lambda: clocks.cpu, switch_clock=lambda: switches["n"])
    tl.start()
    compute = tl.phase_id("compute")
    tl.begin_epoch(in_process_data=True)
    # (wall ns, whether the wait blocked): the blocked ones' time off the CPU is not still
    plan = [(400, False), (800, True), (400, False), (1200, True)] * 5

    def make(wall: int, blocked: bool) -> None:
        clocks.advance(wall, busy=True)
        if blocked:
            switches["n"] += 3

    def step() -> None:
        tl.enter(compute)
        clocks.advance(DATA_CPU_INTERVAL_NS, busy=False)
        tl.leave()

    if how == "stream":
        batches = iter(plan)

        class Loader:
            def __iter__(self) -> Loader:
                return self

            def __next__(self) -> int:
                make(*next(batches))
                return 0

        stream = tl.stream(Loader(), lambda item, wait: None, [])
        for _ in plan:
            next(stream)
            step()
    else:
        for wall, blocked in plan:
            tl.data_begin()
            make(wall, blocked)
            tl.data_end(got_item=True)
            step()
    epoch = tl.end_epoch()
    still = sum(wall * 3 // 4 for wall, blocked in plan if not blocked)
    assert epoch.phase_ns["data"] == sum(wall for wall, _ in plan)
    assert epoch.data_still_ns == still
    assert epoch.data_cpu_ns == epoch.phase_ns["data"] // 4
    assert tl.run_stats().data_still_ns == still


@pytest.mark.parametrize("at", ["begin", "end"])
def test_a_switch_count_that_fails_is_contained(clock: FakeClock, cpu_clock: FakeClock, at: str) -> None:
    """StallScope's own failure reading the switches at either end of a sampled wait: the item is
    not lost, the rest pass through unrecorded, and ``on_error`` gets the exception."""
    reads = {"n": 0}

    def switches() -> int:
        reads["n"] += 1
        if reads["n"] == (1 if at == "begin" else 2):
            raise OSError("getrusage failed")
        return 5

    tl = Timeline(clock=clock, cpu_clock=cpu_clock, switch_clock=switches)
    errors: list[Exception] = []
    tl.on_error = errors.append
    tl.start()
    tl.begin_epoch(in_process_data=True)
    stream = tl.stream(iter([10, 11, 12]), lambda item, wait: None, [])
    assert list(stream) == [10, 11, 12]
    assert [type(e) for e in errors] == [OSError]
    assert reads["n"] == (1 if at == "begin" else 2)  # nothing read after the failure


def test_the_threads_switches_are_read_by_default_with_the_real_clocks_only(clock: FakeClock) -> None:
    """The thread's count says nothing of a made-up clock's waits: with fake clocks (the tests')
    the default switch clock counts nothing, so a fake wait is never taken as still."""
    assert Timeline()._switch_clock is recorder.voluntary_switches
    assert Timeline(clock=clock)._switch_clock() == -1
    assert Timeline(cpu_clock=clock)._switch_clock() == -1
    if recorder.voluntary_switches() >= 0:  # Linux: the calling thread's count
        before = recorder.voluntary_switches()
        time.sleep(0.001)  # blocks: gives up the core
        assert recorder.voluntary_switches() > before


def test_no_still_time_where_switches_are_not_counted_or_loading_had_workers(clock: FakeClock) -> None:
    """A switch clock that reads -1 (no per-thread count) leaves every wait as blocked, and a pass
    with workers has no still time to tell, as it has no CPU time."""
    cpu = {"ns": 0}
    tl = Timeline(clock=clock, cpu_clock=lambda: cpu["ns"], switch_clock=lambda: -1)
    tl.start()
    tl.begin_epoch(in_process_data=True)
    for _ in range(3):
        _step(tl, clock, wait=DATA_CPU_INTERVAL_NS, compute=10)
    assert tl.end_epoch().data_still_ns == 0
    tl.begin_epoch(in_process_data=False)
    _step(tl, clock, wait=5, compute=5)
    assert tl.end_epoch().data_still_ns is None
    assert tl.run_stats().data_still_ns is None


# -- epochs ----------------------------------------------------------------------------------


def test_epochs_are_differences_and_add_up_to_the_run(tl: Timeline, clock: FakeClock) -> None:
    tl.begin_epoch(in_process_data=True)
    _open_pass(tl, clock, iter_ns=1)
    _step(tl, clock, wait=2, compute=10)
    _step(tl, clock, wait=2, compute=10)
    _close_pass(tl, clock)
    first = tl.end_epoch()
    clock.advance(100)  # between passes: belongs to the next epoch, as "other", in no step
    tl.begin_epoch(in_process_data=True)
    _open_pass(tl, clock)
    _step(tl, clock, wait=4, compute=40, other=3)
    _close_pass(tl, clock, last_ns=2)
    second = tl.end_epoch()
    run = tl.run_stats()

    assert first.wall_ns == 1 + 24
    assert first.steps == 2
    assert first.phase_ns["compute"] == 20
    assert second.wall_ns == 100 + 47 + 2
    assert second.steps == 1
    assert second.step_total_ns == 47
    assert second.phase_ns == {
        "data": 6,
        "h2d": 0,
        "compute": 40,
        "logging": 0,
        "checkpoint": 0,
        "validation": 0,
        "other": 103,
    }
    assert second.phase_counts["data"] == 3
    assert second.phase_counts["compute"] == 1
    assert second.step.n == 1  # only this epoch's steps
    assert second.step.max == pytest.approx(47e-9)

    assert run.wall_ns == first.wall_ns + second.wall_ns
    assert run.steps == 3
    assert run.epochs == 2
    assert run.step_total_ns == 24 + 47
    for name in BUILTIN_PHASES:
        assert run.phase_ns[name] == first.phase_ns[name] + second.phase_ns[name]
    for span in (first, second, run):
        _assert_partition(span)


def test_custom_phase_is_in_the_epoch_it_was_used(tl: Timeline, clock: FakeClock) -> None:
    tl.begin_epoch(in_process_data=True)
    _open_pass(tl, clock)
    tl.data_begin()
    tl.data_end(got_item=True)
    tl.enter(tl.phase_id("augment"))
    clock.advance(7)
    tl.leave()
    epoch = tl.end_epoch()
    assert epoch.phase_ns["augment"] == 7
    assert epoch.phase_counts["augment"] == 1
    _assert_partition(epoch)


def test_an_epoch_without_steps_or_passes_counts_no_epoch(tl: Timeline, clock: FakeClock) -> None:
    clock.advance(10)
    empty = tl.end_epoch()
    assert (empty.steps, empty.epochs, empty.wall_ns) == (0, 0, 10)


def test_boundaries_belong_to_their_epoch_and_to_the_run(tl: Timeline) -> None:
    b0 = EpochBoundary(index=0, iter_ns=5, first_wait_ns=6, last_wait_ns=7)
    b1 = EpochBoundary(index=1, iter_ns=8, first_wait_ns=9, last_wait_ns=10)
    tl.note_boundary(b0)
    first = tl.end_epoch()
    tl.note_boundary(b1)
    second = tl.end_epoch()
    assert first.boundaries == (b0,)
    assert first.epochs == 1  # a pass with no items is still an epoch
    assert second.boundaries == (b1,)
    assert tl.run_stats().boundaries == (b0, b1)


def test_run_boundaries_are_bounded_and_keep_the_first_pass(tl: Timeline) -> None:
    for i in range(5000):
        tl.note_boundary(EpochBoundary(index=i, iter_ns=0, first_wait_ns=0, last_wait_ns=0))
    kept = tl.run_stats().boundaries
    assert len(kept) <= 4096
    assert kept[0].index == 0
    assert kept[-1].index == 4999
    assert [b.index for b in kept] == sorted(b.index for b in kept)


# -- the ring of recent steps ----------------------------------------------------------------


def test_ring_keeps_only_the_most_recent_steps(clock: FakeClock, cpu_clock: FakeClock) -> None:
    timeline = Timeline(clock=clock, cpu_clock=cpu_clock, recent_steps=3)
    timeline.start()
    timeline.begin_epoch(in_process_data=True)
    _open_pass(timeline, clock)
    for ms in (1, 2, 3, 4, 5):
        _step(timeline, clock, wait=0, compute=ms * 1_000_000)
    _close_pass(timeline, clock)
    epoch = timeline.end_epoch()
    assert epoch.steps == 5
    assert epoch.step_total_ns == 15_000_000  # totals are exact even when the ring is not
    assert epoch.step.n == 3  # steps of 3, 4 and 5 ms
    assert epoch.step.mean == pytest.approx(0.004)
    assert epoch.step.p10 == pytest.approx(0.0032)
    assert epoch.step.max == pytest.approx(0.005)

    # a second, shorter epoch reads only its own steps, across the ring's wrap-around
    timeline.begin_epoch(in_process_data=True)
    _open_pass(timeline, clock)
    for ms in (10, 20):
        _step(timeline, clock, wait=0, compute=ms * 1_000_000)
    _close_pass(timeline, clock)
    second = timeline.end_epoch()
    assert second.step.n == 2
    assert second.step.mean == pytest.approx(0.015)
    assert second.step.p10 == pytest.approx(0.011)
    run = timeline.run_stats()
    assert run.step.n == 3  # 5, 10 and 20 ms
    assert run.step.p50 == pytest.approx(0.010)
    assert run.step.mean == pytest.approx(35 / 3 / 1000)


def test_recent_steps_keep_each_steps_compute_and_phases_oldest_first(clock: FakeClock, cpu_clock: FakeClock) -> None:
    timeline = Timeline(clock=clock, cpu_clock=cpu_clock, recent_steps=4)
    timeline.start()
    timeline.begin_epoch(in_process_data=True)
    _open_pass(timeline, clock)
    checkpoint, logging = timeline.phase_id("checkpoint"), timeline.phase_id("logging")
    custom = timeline.phase_id("mine")
    for i in range(6):  # steps 1..6: compute i+1 ms; step 3 saves, step 4 logs twice and runs "mine"
        _step(timeline, clock, wait=100 * (i + 1), compute=(i + 1) * 1_000_000)
        if i == 2:
            timeline.enter(checkpoint)
            clock.advance(5_000_000)
            timeline.leave()
        if i == 3:
            for _ in range(2):
                timeline.enter(logging)
                clock.advance(1_000)
                timeline.leave()
            timeline.enter(custom)
            timeline.leave()
    _close_pass(timeline, clock)
    epoch = timeline.end_epoch()
    recent = epoch.recent
    assert recent is not None
    assert len(recent) == 4  # steps 3..6, oldest first, across the ring's wrap-around
    assert list(recent.compute_ns) == [3_000_000, 4_000_000, 5_000_000, 6_000_000]
    assert list(recent.wait_ns) == [300, 400, 500, 600]
    assert list(recent.duration_ns) == [3_000_300 + 5_000_000, 4_000_400 + 2_000, 5_000_500, 6_000_600]
    compute_bit = 1 << BUILTIN_PHASES.index("compute")
    assert list(recent.kinds) == [
        compute_bit | 1 << checkpoint,
        compute_bit | 1 << logging | 1 << custom,
        compute_bit,
        compute_bit,
    ]
    run = timeline.run_stats()
    assert run.recent is not None
    assert list(run.recent.compute_ns) == list(recent.compute_ns)


# -- idle windows ----------------------------------------------------------------------------


def test_idle_windows_close_every_window_steps_and_merge_when_full(clock: FakeClock, cpu_clock: FakeClock) -> None:
    timeline = Timeline(clock=clock, cpu_clock=cpu_clock, window_steps=2, max_windows=4)
    timeline.start()
    timeline.begin_epoch(in_process_data=True)
    _open_pass(timeline, clock)
    # (wait, compute) per step; a window's wall is its steps' sum, busy the compute in them
    for wait, compute in ((1, 1), (1, 3), (2, 2), (0, 4), (3, 1), (1, 1)):
        _step(timeline, clock, wait, compute)
    timeline.data_begin()  # closes step 6, and with it the third window
    timeline.data_end(got_item=True)
    assert timeline.run_stats().windows == (
        IdleWindow(steps=2, wall_ns=6, busy_ns=4),
        IdleWindow(steps=2, wall_ns=8, busy_ns=6),
        IdleWindow(steps=2, wall_ns=6, busy_ns=2),
    )
    clock.advance(1)
    timeline.enter(timeline.phase_id("compute"))
    clock.advance(1)
    timeline.leave()
    _step(timeline, clock, 2, 2)
    timeline.data_begin()  # closes step 8: the fourth window fills the list, neighbours merge
    timeline.data_end(got_item=True)
    assert timeline.run_stats().windows == (
        IdleWindow(steps=4, wall_ns=14, busy_ns=10),
        IdleWindow(steps=4, wall_ns=12, busy_ns=5),
    )
    # now windows hold 4 steps; a trailing window is reported once it has at least half of that
    clock.advance(2)
    timeline.data_begin()  # step 9 closed: 1 step, not reported yet
    timeline.data_end(got_item=True)
    assert len(timeline.run_stats().windows) == 2
    timeline.enter(timeline.phase_id("compute"))
    clock.advance(3)
    timeline.leave()
    timeline.data_begin()  # step 10 closed: 2 steps, reported
    timeline.data_end(got_item=False)
    assert timeline.run_stats().windows[-1] == IdleWindow(steps=2, wall_ns=5, busy_ns=3)


def test_idle_windows_stay_bounded_on_a_long_run(clock: FakeClock, cpu_clock: FakeClock) -> None:
    timeline = Timeline(clock=clock, cpu_clock=cpu_clock, window_steps=1, max_windows=8)
    timeline.start()
    timeline.begin_epoch(in_process_data=True)
    _open_pass(timeline, clock)
    for _ in range(3000):
        _step(timeline, clock, wait=1, compute=3)
    _close_pass(timeline, clock)
    timeline.end_epoch()
    windows = timeline.run_stats().windows
    assert 1 <= len(windows) <= 8
    assert sum(w.steps for w in windows) <= 3000
    assert sum(w.steps for w in windows) > 3000 / 2
    for w in windows:
        assert w.wall_ns == 4 * w.steps
        assert w.idle_fraction == pytest.approx(0.25)


def test_a_second_run_stats_sees_the_windows_and_steps_closed_since_the_first(
    clock: FakeClock, cpu_clock: FakeClock
) -> None:
    timeline = Timeline(clock=clock, cpu_clock=cpu_clock, window_steps=1, max_windows=64)
    timeline.start()
    timeline.begin_epoch(in_process_data=True)
    _open_pass(timeline, clock)
    for compute in (1, 2):
        _step(timeline, clock, wait=1, compute=compute)
    first = timeline.run_stats()
    for compute in (3, 4, 5):
        _step(timeline, clock, wait=1, compute=compute)
    timeline.data_begin()  # closes the fifth step
    timeline.data_end(got_item=True)
    second = timeline.run_stats()
    assert [w.busy_ns for w in first.windows] == [1]
    assert [w.busy_ns for w in second.windows] == [1, 2, 3, 4, 5]
    assert (first.step.n, second.step.n) == (1, 5)
    assert (second.step.p50, second.step.max) == pytest.approx((4e-9, 6e-9))  # steps of 2 to 6 ns


def test_snapshots_sort_nothing_until_their_stats_are_asked_for(
    tl: Timeline, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An epoch end (and the run's report it may lead to) copies the recent steps; the sorting
    for their percentiles waits for ``stats()``, which may run later, on another thread."""
    sorts = []
    of = Distribution.of
    monkeypatch.setattr(Distribution, "of", lambda values: sorts.append(len(values)) or of(values))
    tl.begin_epoch(in_process_data=True)
    _open_pass(tl, clock)
    for _ in range(6):
        _step(tl, clock, wait=1, compute=2)
    _close_pass(tl, clock)
    epoch = tl.end_epoch_snapshot()
    run = tl.run_snapshot()
    assert sorts == []
    _open_pass(tl, clock)  # the rings move on: the snapshots keep their own copies
    _step(tl, clock, wait=1, compute=5)
    _close_pass(tl, clock)
    epoch_stats, run_stats = epoch.stats(), run.stats()
    assert sorts == [6, 6, 6, 6]  # step times and waits, of each
    assert epoch_stats.steps == run_stats.steps == 6
    assert epoch_stats.step.max == run_stats.step.max == pytest.approx(3e-9)
    assert tl.run_stats().step.max == pytest.approx(6e-9)


# -- run_stats -------------------------------------------------------------------------------


def test_run_stats_mid_phase_credits_the_open_phase(tl: Timeline, clock: FakeClock) -> None:
    tl.enter(tl.phase_id("compute"))
    clock.advance(10)
    assert tl.run_stats().phase_ns["compute"] == 10
    clock.advance(5)
    tl.leave()
    assert tl.run_stats().phase_ns["compute"] == 15
    assert tl.run_stats() == tl.run_stats()  # idempotent while the clock stands still


def _script(tl: Timeline, clock: FakeClock, peek: bool) -> list[SpanStats]:
    """The same recorded run, optionally with ``run_stats`` calls sprinkled in."""
    epochs = []
    for _ in range(2):
        tl.begin_epoch(in_process_data=True)
        _open_pass(tl, clock, iter_ns=3)
        for i in range(5):
            _step(tl, clock, wait=i, compute=10 + i, other=1)
            if peek:
                tl.run_stats()
        tl.enter(tl.phase_id("validation"))
        clock.advance(50)
        if peek:
            tl.run_stats()
        tl.leave()
        epochs.append(tl.end_epoch())
    return [*epochs, tl.run_stats()]


def test_run_stats_does_not_change_what_is_recorded() -> None:
    plain_clock, peek_clock = FakeClock(), FakeClock()
    plain = Timeline(clock=plain_clock, cpu_clock=FakeClock())
    peeked = Timeline(clock=peek_clock, cpu_clock=FakeClock())
    plain.start()
    peeked.start()
    assert _script(plain, plain_clock, peek=False) == _script(peeked, peek_clock, peek=True)


def test_every_nanosecond_lands_in_exactly_one_phase(tl: Timeline, clock: FakeClock) -> None:
    rng = random.Random(1234)
    names = ["compute", "h2d", "logging", "checkpoint", "custom_a"]
    epochs: list[SpanStats] = []
    for _ in range(4):
        tl.begin_epoch(in_process_data=bool(rng.getrandbits(1)))
        _open_pass(tl, clock, iter_ns=rng.randrange(100))
        for _ in range(rng.randrange(1, 30)):
            tl.data_begin()
            clock.advance(rng.randrange(100))
            tl.data_end(got_item=True)
            for _ in range(rng.randrange(4)):
                depth = rng.randrange(1, 3)
                for _ in range(depth):
                    clock.advance(rng.randrange(50))
                    tl.enter(tl.phase_id(rng.choice(names)))
                    clock.advance(rng.randrange(50))
                for _ in range(depth):
                    tl.leave()
                    clock.advance(rng.randrange(50))
        if rng.getrandbits(1):
            _close_pass(tl, clock, last_ns=rng.randrange(100))
        clock.advance(rng.randrange(100))
        epochs.append(tl.end_epoch())
    run = tl.run_stats()
    for span in [*epochs, run]:
        _assert_partition(span)
        assert all(ns >= 0 for ns in span.phase_ns.values())
    assert sum(e.wall_ns for e in epochs) == run.wall_ns
    assert sum(e.steps for e in epochs) == run.steps
    assert sum(e.step_total_ns for e in epochs) == run.step_total_ns
    assert run.wall_ns == clock.now


def test_switch_equals_leave_then_enter(clock: FakeClock, cpu_clock: FakeClock) -> None:
    """``switch(b)`` inside ``a`` attributes time exactly like ``leave(); enter(b)``."""

    def run(use_switch: bool) -> dict[str, int]:
        c = FakeClock()
        tl = Timeline(clock=c, cpu_clock=FakeClock())
        tl.start()
        a, b = tl.phase_id("h2d"), tl.phase_id("compute")
        tl.enter(tl.phase_id("validation"))  # an outer phase, resumed at the end
        tl.enter(a)
        c.advance(3)
        if use_switch:
            tl.switch(b)
        else:
            tl.leave()
            tl.enter(b)
        c.advance(5)
        tl.leave()
        c.advance(7)
        tl.leave()
        c.advance(11)
        span = tl.run_stats()
        return {k: v for k, v in span.phase_ns.items() if v} | {f"n_{k}": n for k, n in span.phase_counts.items() if n}

    switched = run(True)
    assert switched == run(False)
    assert switched["h2d"] == 3
    assert switched["compute"] == 5
    assert switched["validation"] == 7
    assert switched["other"] == 11


def test_data_end_then_equals_data_end_and_enter_at_one_instant(clock: FakeClock) -> None:
    """``data_end(then=pid)`` (Lightning's fetch -> h2d) records what ``data_end`` followed by
    ``enter(pid)`` at the same instant records."""

    def run(fused: bool) -> tuple[int, SpanStats]:
        c = FakeClock()
        tl = Timeline(clock=c, cpu_clock=FakeClock())
        tl.start()
        h2d = tl.phase_id("h2d")
        waits = 0
        for _ in range(3):
            tl.data_begin()
            c.advance(4)
            if fused:
                waits += tl.data_end(got_item=True, then=h2d)
            else:
                waits += tl.data_end(got_item=True)
                tl.enter(h2d)
            c.advance(6)
            tl.leave()
            c.advance(1)
        return waits, tl.end_epoch()

    fused, plain = run(True), run(False)
    assert fused == plain
    waits, stats = fused
    assert waits == 12
    assert (stats.steps, stats.phase_ns["h2d"], stats.phase_counts["h2d"]) == (3, 18, 3)


def test_a_failure_while_the_loader_raises_keeps_the_loaders_error() -> None:
    """StallScope's own failure on the way out of a loader's exception goes to ``on_error``; the
    loader's exception is the one the loop sees."""

    class Boom(Exception):
        pass

    broken = {"now": False}

    def clock() -> int:
        if broken["now"]:
            raise RuntimeError("planted")
        return 0

    def loader() -> Iterator[int]:
        yield 1
        broken["now"] = True
        raise Boom("the loader's own")

    errors: list[Exception] = []
    tl = Timeline(clock=clock, cpu_clock=lambda: 0)
    tl.on_error = errors.append
    tl.start()
    stream = tl.stream(loader(), lambda item, wait: None, [])
    assert next(stream) == 1
    with pytest.raises(Boom, match="the loader's own"):
        next(stream)
    assert [str(e) for e in errors] == ["planted"]


def _interrupt_window_close(monkeypatch: pytest.MonkeyPatch, at: int) -> None:
    """Ctrl-C inside the ``at``-th window's close (1-based); the other closes run as usual."""
    real = Timeline._close_window
    calls = {"n": 0}

    def interrupted(self: Timeline, now: int, busy: int) -> None:
        calls["n"] += 1
        if calls["n"] == at:
            raise KeyboardInterrupt
        real(self, now, busy)

    monkeypatch.setattr(Timeline, "_close_window", interrupted)


def test_a_fold_cut_short_applies_no_event_twice(
    clock: FakeClock, cpu_clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ctrl-C inside a fold (it runs on the training thread): the events taken so far stay
    applied once, the rest are dropped, and the totals still partition the time."""
    tl = Timeline(clock=clock, cpu_clock=cpu_clock, window_steps=4)
    tl.start()
    _interrupt_window_close(monkeypatch, at=2)
    for _ in range(12):
        _step(tl, clock, wait=2, compute=5, other=1)
    with pytest.raises(KeyboardInterrupt):
        tl._fold()
    assert not tl._log
    assert tl.probe() is not None  # not left mid-fold
    _step(tl, clock, wait=2, compute=5, other=1)
    stats = tl.end_epoch()
    _assert_partition(stats)
    assert stats.wall_ns == 13 * 8
    assert stats.steps <= 13
    assert stats.phase_counts["data"] <= 13


def test_a_window_close_cut_short_does_not_stop_later_windows(
    clock: FakeClock, cpu_clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ctrl-C inside the first window's close: the fold stops there, and later steps still close
    windows (the window that was cut short closes one step late, with its true step count)."""
    tl = Timeline(clock=clock, cpu_clock=cpu_clock, window_steps=4)
    tl.start()
    _interrupt_window_close(monkeypatch, at=1)
    for _ in range(5):  # the 4th step's end (at the 5th wait) closes the first window
        _step(tl, clock, wait=2, compute=5, other=1)
    with pytest.raises(KeyboardInterrupt):
        tl._fold()
    for _ in range(12):
        _step(tl, clock, wait=2, compute=5, other=1)
    tl._fold()
    # the cut-short fold dropped the 5th step's events after its wait (its step is lost, its
    # time counts as data); the first window closes one counted step late, at the 6th step's end
    closed = tl.run_stats().windows[:3]  # (a fourth, in progress, may follow)
    assert [(w.steps, w.wall_ns, w.busy_ns) for w in closed] == [(5, 48, 25), (4, 32, 20), (4, 32, 20)]


def test_a_pass_ended_during_next_logs_nothing_more(tl: Timeline) -> None:
    """``stop`` or a new pass while the loader's ``next()`` runs (a phase the loader times fails,
    or the loader starts another pass): what that ``next()`` returns, and the rest, pass on
    unrecorded, and the final wait is not this stream's to report."""

    class Loader:
        def __init__(self) -> None:
            self.calls = 0

        def __iter__(self) -> Loader:
            return self

        def __next__(self) -> int:
            self.calls += 1
            if self.calls == 3:
                tl.end_streams()
            if self.calls > 4:
                raise StopIteration
            return self.calls

    result: list[int] = []
    assert list(tl.stream(Loader(), lambda item, wait: None, result)) == [1, 2, 3, 4]
    assert result == []
    codes = list(tl._log)[0::2]
    assert codes.count(STEP) == 3  # the third was logged before its next()
    assert codes.count(GOT) == 2
    assert NONE not in codes


def test_an_epoch_snapshot_that_pauses_reads_each_clock_once_and_cuts_the_pause_out(
    tl: Timeline, clock: FakeClock, cpu_clock: FakeClock
) -> None:
    """An epoch end pauses the clock where the epoch ends, with the readings the snapshot took (the
    process CPU clock sums every thread: one read fewer per epoch end); the paused time and CPU
    are in no epoch."""
    _open_pass(tl, clock)
    _step(tl, clock, wait=10, compute=100)
    cpu_clock.advance(50)
    clock_calls, cpu_calls = clock.calls, cpu_clock.calls
    first = tl.end_epoch_snapshot(pause=True)
    assert (clock.calls - clock_calls, cpu_clock.calls - cpu_calls) == (1, 1)
    assert tl.paused
    assert (first.steps, first.epochs, first.wall_ns) == (1, 1, 110)
    assert first.phase_ns["compute"] == 100
    clock.advance(1000)  # StallScope's own work at the epoch end
    cpu_clock.advance(700)
    tl.resume()
    assert not tl.paused
    _step(tl, clock, wait=20, compute=200)
    cpu_clock.advance(30)
    second = tl.end_epoch_snapshot().stats()
    assert (second.wall_ns, second.process_cpu_ns) == (220, 30)
    span = first.stats()  # made now, from what the epoch end kept
    assert (span.wall_ns, span.steps, span.process_cpu_ns) == (110, 1, 50)
    assert span.phase_counts["compute"] == 1
    assert span.boundaries == ()
    _assert_partition(span)
    assert tl.run_stats().wall_ns == 330


# -- epochs closed later (``mark_epoch``) ------------------------------------------------------


def _random_step(
    tl: Timeline, clock: FakeClock, cpu_clock: FakeClock, rng: random.Random, epoch: int, compute_ns: int
) -> None:
    """One step of a random run: a wait with data CPU, compute of up to ``compute_ns``, and now and
    then a logging or custom phase."""
    tl.data_begin()
    clock.advance(rng.randint(0, 30))
    cpu_clock.advance(rng.randint(0, 20))
    tl.data_end(got_item=True)
    tl.enter(tl.phase_id("compute"))
    clock.advance(rng.randint(1, compute_ns))
    tl.leave()
    if rng.random() < 0.1:
        tl.enter(tl.phase_id(rng.choice(("logging", f"custom-{epoch}"))))
        clock.advance(rng.randint(1, 50))
        tl.leave()


def _scripted_run(seed: int, end: Callable[[Timeline, FakeClock, FakeClock], None]) -> Timeline:
    """A run of random epochs (steps with waits, compute, a custom phase now and then, data CPU,
    a pass's boundary) on fake clocks; ``end`` ends each epoch. The same seed drives the same run."""
    rng = random.Random(seed)
    clock, cpu_clock = FakeClock(), FakeClock()
    tl = Timeline(clock=clock, cpu_clock=cpu_clock, recent_steps=64)
    tl.start()
    for epoch in range(rng.randint(3, 12)):
        tl.begin_epoch(in_process_data=rng.random() < 0.7)
        _open_pass(tl, clock, iter_ns=rng.randint(0, 50))
        # up to 600 steps: some epochs span a fold of the log (FOLD_AT entries) or wrap the ring
        for _ in range(rng.choice((0, 1, 3, 40, 600))):
            _random_step(tl, clock, cpu_clock, rng, epoch, compute_ns=100)
        _close_pass(tl, clock, last_ns=rng.randint(0, 20))
        tl.note_boundary(EpochBoundary(epoch, 1, 2, 3))
        clock.advance(rng.randint(0, 40))  # the user's code after the pass
        cpu_clock.advance(rng.randint(0, 40))
        end(tl, clock, cpu_clock)
    _step(tl, clock, wait=5, compute=7)  # a step after the last epoch end
    return tl


def _record(span: SpanStats) -> tuple[object, ...]:
    return (
        span.wall_ns,
        span.steps,
        span.epochs,
        dict(span.phase_ns),
        dict(span.phase_counts),
        span.step_total_ns,
        span.step,
        span.data_wait,
        span.data_cpu_ns,
        span.process_cpu_ns,
        span.boundaries,
        span.windows,
    )


def _take(tl: Timeline) -> list[tuple[object, SpanSnapshot, SpanSnapshot | None]]:
    """The epochs the timeline closed at their marks, taken (each once)."""
    closed = tl.closed_epochs()
    taken = list(closed)
    closed.clear()
    return taken


@pytest.mark.parametrize("seed", range(12))
def test_an_epoch_closed_at_its_mark_is_the_epoch_closed_at_its_end(seed: int) -> None:
    """Two timelines record the same run. One closes each epoch at its end, pausing while
    StallScope works (``end_epoch_snapshot(pause=True)`` ... ``resume``); the other marks it
    (``mark_epoch``) after the same work and has it closed by a later fold: every epoch's
    statistics, its steps, the run's as of each epoch's end and the run's at the end are the
    same, and the work is cut out of both alike."""
    at_end: list[tuple[SpanStats, SpanStats]] = []
    at_mark: list[tuple[object, SpanStats, SpanStats]] = []
    marks = iter(range(100))

    def close_now(tl: Timeline, clock: FakeClock, cpu_clock: FakeClock) -> None:
        epoch = tl.end_epoch_snapshot(pause=True).stats()
        at_end.append((epoch, tl.run_stats()))  # the run as of the epoch's end (paused there)
        clock.advance(1000)  # StallScope's own work
        cpu_clock.advance(700)
        tl.resume()

    def take(tl: Timeline) -> None:
        for token, snapshot, run in _take(tl):
            assert run is not None
            at_mark.append((token, snapshot.stats(), run.stats()))

    def mark(tl: Timeline, clock: FakeClock, cpu_clock: FakeClock) -> None:
        at = (clock(), cpu_clock())
        clock.advance(1000)
        cpu_clock.advance(700)
        token = next(marks)
        assert tl.mark_epoch(token, at=at, run_if=lambda snapshot: True)
        # some closes wait for a fold of the log, some happen at the next epoch end
        if token % 3 == 0:
            take(tl)

    now = _scripted_run(seed, close_now)
    later = _scripted_run(seed, mark)
    take(later)
    assert [token for token, *_ in at_mark] == list(range(len(at_end)))
    assert [(_record(epoch), _record(run)) for _, epoch, run in at_mark] == [
        (_record(epoch), _record(run)) for epoch, run in at_end
    ]
    assert _record(later.run_stats()) == _record(now.run_stats())
    assert _record(later.end_epoch()) == _record(now.end_epoch())  # the epoch after the last end


def test_an_epoch_mark_asks_for_the_run_as_of_its_end(tl: Timeline, clock: FakeClock, cpu_clock: FakeClock) -> None:
    """``run_if`` sees the epoch's snapshot; when it says so, the run's snapshot is taken as of the
    epoch's end, not as of the fold that closes it."""
    seen: list[int] = []

    def wanted(snapshot: SpanSnapshot) -> bool:
        seen.append(snapshot.steps)
        return snapshot.steps == 2

    for steps in (2, 1):
        _open_pass(tl, clock)
        for _ in range(steps):
            _step(tl, clock, wait=10, compute=100)
        tl.note_boundary(EpochBoundary(0, 0, 0, 0))
        cpu_clock.advance(40)
        assert tl.mark_epoch(steps, at=(clock(), cpu_clock()), run_if=wanted)
    _step(tl, clock, wait=10, compute=100)
    (first, _, run), (second, _, none) = tl.closed_epochs()
    assert [token for token, *_ in tl.closed_epochs()] == [2, 1]  # until taken
    assert tl.waiting_epochs == 2
    _take(tl)
    assert (first, second, seen) == (2, 1, [2, 1])
    assert none is None
    assert run is not None
    span = run.stats()
    assert (span.wall_ns, span.steps, span.process_cpu_ns, len(span.boundaries)) == (220, 2, 40, 1)
    assert (tl.closed_epochs(), tl.waiting_epochs) == ([], 0)


def test_an_epoch_is_marked_only_when_it_can_wait(tl: Timeline, clock: FakeClock) -> None:
    """No pass noted (the epoch may be empty), a paused or a stopped clock: the epoch must be
    closed at once, and ``mark_epoch`` does nothing."""
    _step(tl, clock, wait=10, compute=100)
    assert not tl.markable
    assert not tl.mark_epoch("no pass", at=(clock(), 0))
    tl.note_boundary(EpochBoundary(0, 0, 0, 0))
    tl.pause()
    assert not tl.mark_epoch("paused", at=(clock(), 0))
    tl.resume()
    assert tl.markable
    tl.stop()
    assert not tl.mark_epoch("stopped", at=(clock(), 0))
    assert tl.closed_epochs() == []
    assert tl.end_epoch().steps == 1


@pytest.mark.skipif(_native is None, reason="the C hot path is not in use")
def test_the_c_fold_takes_the_first_entries_out_of_the_log_and_leaves_the_rest(tl: Timeline, clock: FakeClock) -> None:
    """``fold(timeline, log, upto)`` folds the first ``upto`` entries and keeps the others, in
    order, for the next fold; ``upto`` is an even number of entries."""
    assert _native is not None
    tl.enter(tl.phase_id("compute"))
    clock.advance(100)
    tl.leave()
    clock.advance(50)
    tl.enter(tl.phase_id("logging"))
    log = tl._log
    rest = log.copy()[4:]
    with pytest.raises(ValueError, match="even"):
        _native.fold(tl, log, 3)
    with pytest.raises(ValueError, match="past the end"):
        _native.fold(tl, log, len(log) + 2)
    _native.fold(tl, log, 4)
    assert log.copy() == rest
    assert tl.run_stats().phase_ns["compute"] == 100
    clock.advance(30)
    tl.leave()
    assert tl.run_stats().phase_ns["logging"] == 30


def _sum_of(epochs: list[SpanStats]) -> tuple[object, ...]:
    """What a group of ``epochs`` must read: their numbers added up (phases by name)."""
    phase_ns: dict[str, int] = {}
    counts: dict[str, int] = {}
    for e in epochs:
        for name, ns in e.phase_ns.items():
            phase_ns[name] = phase_ns.get(name, 0) + ns
        for name, n in e.phase_counts.items():
            counts[name] = counts.get(name, 0) + n
    cpu = [e.data_cpu_ns for e in epochs]
    return (
        sum(e.wall_ns for e in epochs),
        sum(e.steps for e in epochs),
        sum(e.epochs for e in epochs),
        {k: v for k, v in phase_ns.items() if v or counts.get(k)},
        counts,
        sum(e.step_total_ns for e in epochs),
        None if None in cpu else sum(c or 0 for c in cpu),
        sum(e.process_cpu_ns for e in epochs),
        tuple(b for e in epochs for b in e.boundaries),
    )


def _group_record(span: SpanStats) -> tuple[object, ...]:
    return (
        span.wall_ns,
        span.steps,
        span.epochs,
        {k: v for k, v in span.phase_ns.items() if v or span.phase_counts.get(k)},
        dict(span.phase_counts),
        span.step_total_ns,
        span.data_cpu_ns,
        span.process_cpu_ns,
        span.boundaries,
    )


@pytest.mark.parametrize(("seed", "marked"), [(seed, marked) for seed in range(8) for marked in (False, True)])
def test_groups_of_epochs_close_when_long_enough_together_and_add_their_epochs_up(seed: int, marked: bool) -> None:
    """Random short epochs (closed at their ends, or marked and closed by a later fold): an epoch
    closes its group exactly when the epochs since the last group have ``group_steps`` steps and
    ``group_wall_ns`` of time together; the group's snapshot is its epochs added up, its recent
    steps are theirs, and one long enough alone is its own group. ``close_group`` closes the
    epochs left at the end."""
    rng = random.Random(seed)
    clock, cpu_clock = FakeClock(), FakeClock()
    tl = Timeline(clock=clock, cpu_clock=cpu_clock, recent_steps=64, group_steps=30, group_wall_ns=4000)
    tl.start()
    closed: list[SpanSnapshot] = []
    for epoch in range(rng.randint(10, 30)):
        tl.begin_epoch(in_process_data=rng.random() < 0.7)
        _open_pass(tl, clock, iter_ns=rng.randint(0, 50))
        for _ in range(rng.choice((1, 3, 8, 40, 300))):
            _random_step(tl, clock, cpu_clock, rng, epoch, compute_ns=60)
        _close_pass(tl, clock, last_ns=rng.randint(0, 20))
        tl.note_boundary(EpochBoundary(epoch, 1, 2, 3))
        if marked:
            at = (clock(), cpu_clock())
            clock.advance(500)
            assert tl.mark_epoch(epoch, at=at)
            if rng.random() < 0.3:
                closed.extend(snapshot for _, snapshot, _ in _take(tl))
        else:
            closed.append(tl.end_epoch_snapshot(pause=True))
            clock.advance(500)
            tl.resume()
    closed.extend(snapshot for _, snapshot, _ in _take(tl))
    _step(tl, clock, wait=5, compute=7)  # a step after the last epoch end: in no group
    group: list[SpanSnapshot] = []
    closes = 0
    for snapshot in closed:
        group.append(snapshot)
        stats = [s.stats() for s in group]
        long_enough = sum(s.steps for s in stats) >= 30 and sum(s.wall_ns for s in stats) >= 4000
        assert (snapshot.group is not None) == long_enough
        if snapshot.group is None:
            continue
        closes += 1
        if len(group) == 1:
            assert snapshot.group is snapshot
        together = snapshot.group.stats()
        assert _group_record(together) == _sum_of(stats)
        steps = [t for s in group for t in s.step][-64:]
        assert list(snapshot.group.step) == steps
        group = []
    assert closes >= 1
    left = tl.close_group()
    if group:
        assert left is not None
        assert _group_record(left.stats()) == _sum_of([s.stats() for s in group])
        assert list(left.step) == [t for s in group for t in s.step][-64:]
    else:
        assert left is None
    assert tl.close_group() is None


# -- the record of the most recent steps -------------------------------------------------------


def test_the_recent_record_holds_each_steps_start_and_phase_times(clock: FakeClock, cpu_clock: FakeClock) -> None:
    """Each step's start and its time per phase, exactly as driven, oldest first; a custom phase
    has the last column, named after it; the step in progress is not in it."""
    tl = Timeline(clock=clock, cpu_clock=cpu_clock, recent_steps=3)
    tl.start()
    clock.advance(50)
    starts = []
    for i in range(5):
        starts.append(clock.now)
        _step(tl, clock, wait=100 + i, compute=1000 * (i + 1), other=7)
        tl.enter(tl.phase_id("forward-hooks"))
        clock.advance(11)
        tl.leave()
    tl.data_begin()  # the sixth step begins: the fifth ends here
    clock.advance(3)
    tl.run_snapshot()
    record = tl.recent_record()
    assert record.columns == (*BUILTIN_PHASES, "forward-hooks")
    assert record.steps == 5
    assert list(record.start_ns) == starts[2:]
    rows = [list(record.phase_ns[i * 8 : (i + 1) * 8]) for i in range(3)]
    # data, h2d, compute, logging, checkpoint, validation, other, forward-hooks
    assert rows == [[100 + i, 0, 1000 * (i + 1), 0, 0, 0, 7, 11] for i in (2, 3, 4)]
    assert record.run_start_ns == 0
    assert record.clock_ns == clock.now


def test_the_recent_record_is_bounded_and_wraps(clock: FakeClock, cpu_clock: FakeClock) -> None:
    """A run of many steps keeps the last ``recent_steps`` of them, whatever its length."""
    tl = Timeline(clock=clock, cpu_clock=cpu_clock, recent_steps=4)
    tl.start()
    for i in range(1001):
        _step(tl, clock, wait=i, compute=5)
    tl.data_begin()
    tl.run_snapshot()
    record = tl.recent_record()
    assert record.steps == 1001
    assert len(record.start_ns) == 4
    assert len(record.phase_ns) == 4 * 8
    assert [record.phase_ns[i * 8] for i in range(4)] == [997, 998, 999, 1000]
    assert record.columns[-1] == ""  # no custom phase
