"""Forward passes timed apart from the collectives (``signals/forward.py``): the timer on a fake
clock and on fake CUDA events (never waited for), and the probe that finds a DDP module itself."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist
from torch import nn

from stallscope.signals.forward import MAX_PENDING, ForwardProbe, ForwardTimer, timer_for


class Clock:
    def __init__(self) -> None:
        self.now = 0

    def __call__(self) -> int:
        return self.now


def test_the_timer_sums_each_epochs_forwards_on_its_clock() -> None:
    clock = Clock()
    timer = ForwardTimer(clock=clock)
    for ms in (2, 4, 6):
        timer.begin()
        clock.now += ms * 1_000_000
        timer.end()
    epoch = timer.take_epoch()
    assert epoch is not None
    assert (epoch.calls, epoch.total_s, epoch.p50_s, epoch.source) == (3, pytest.approx(0.012), 0.004, "cpu_time")
    assert epoch.to_dict(steps=2)["per_step"] == pytest.approx(6.0)  # ms of forward per step
    assert timer.take_epoch() is None  # a new epoch: none yet
    timer.begin()
    clock.now += 1_000_000
    timer.end()
    run = timer.run()
    assert run is not None
    assert (run.calls, run.total_s) == (4, pytest.approx(0.013))
    timer.end()  # an end without a begin counts nothing
    assert timer.run().calls == 4  # type: ignore[union-attr]


def test_an_epoch_cut_now_is_summed_later_and_the_next_epoch_starts_at_the_cut() -> None:
    """``cut_epoch`` (an epoch whose close waits for a later epoch end): the forwards before the
    cut are its own, summed up when asked for after later forwards were timed; those after it
    are the next epoch's, and no cycle runs through the cut."""
    clock = Clock()
    timer = ForwardTimer(clock=clock)

    def forward(ms: int, gap_ms: int = 1) -> None:
        timer.begin()
        clock.now += ms * 1_000_000
        timer.end()
        clock.now += gap_ms * 1_000_000

    for ms in (2, 4):
        forward(ms)
    first = timer.cut_epoch()
    clock.now += 50 * 1_000_000  # the epoch's end
    for ms in (10, 20, 30):
        forward(ms)
    before, after = first(), timer.take_epoch()
    assert before is not None
    assert after is not None
    assert (before.calls, before.total_s) == (2, pytest.approx(0.006))
    assert (after.calls, after.total_s, after.p50_s) == (3, pytest.approx(0.06), pytest.approx(0.02))
    assert before.cycle_s == pytest.approx(0.003)  # 2 ms and a 1 ms gap: the cut's 50 ms not in it
    assert after.cycle_s == pytest.approx(0.016)  # (11 + 21) / 2 ms
    assert timer.cut_epoch()() is None  # nothing since


def test_the_runs_forwards_summed_later_are_as_of_when_they_were_taken() -> None:
    """``run_later`` marks the run's forwards now and sums them up when called: forwards timed
    after it are not in it (a job's run summary goes out at an epoch end, with that epoch's
    steps)."""
    clock = Clock()
    timer = ForwardTimer(clock=clock)
    for ms in (2, 4):
        timer.begin()
        clock.now += ms * 1_000_000
        timer.end()
    later = timer.run_later()
    timer.begin()
    clock.now += 100 * 1_000_000
    timer.end()
    then = later()
    assert then is not None
    assert (then.calls, then.total_s, then.p90_s) == (2, pytest.approx(0.006), pytest.approx(0.004, abs=0.0005))
    now = timer.run()
    assert now is not None
    assert now.calls == 3


def test_the_runs_forwards_as_of_a_mark_keep_their_totals_when_the_window_moves_on(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The mark holds the count and the totals; the percentiles and the cycle come from the
    samples of then that the window (``MAX_SAMPLES``, 4 here) still holds: a window that moved
    on has dropped the oldest, never added the newer ones."""
    monkeypatch.setattr("stallscope.signals.forward.MAX_SAMPLES", 4)
    clock = Clock()
    timer = ForwardTimer(clock=clock)

    def forward(ms: int, gap_ms: int = 0) -> None:
        clock.now += gap_ms * 1_000_000
        timer.begin()
        clock.now += ms * 1_000_000
        timer.end()

    for ms in (1, 2, 3, 4):
        forward(ms, gap_ms=10)
    later = timer.run_later()
    for _ in range(3):  # three new samples and cycles: one of then is left in each window
        forward(100, gap_ms=500)
    then = later()
    assert then is not None
    assert (then.calls, then.total_s) == (4, pytest.approx(0.010))
    # samples then: 1, 2, 3, 4 ms; the window holds 4 ms of them now
    assert (then.p10_s, then.p50_s, then.p90_s) == (pytest.approx(0.004),) * 3
    # cycles then: 11, 12, 13 ms (begin to begin); the window holds 13 ms of them now
    assert then.cycle_s == pytest.approx(0.013)
    now = timer.run()
    assert now is not None
    assert (now.calls, now.p50_s) == (7, pytest.approx(0.1))
    # a window that moved past all of them (a report read well after the mark): the window as
    # it is, not percentiles of nothing; the count and totals still those of then
    forward(100, gap_ms=500)
    late = later()
    assert late is not None
    assert (late.calls, late.total_s) == (4, pytest.approx(0.010))
    assert (late.p50_s, late.cycle_s) == (pytest.approx(0.1), pytest.approx((504 + 3 * 600) / 4 / 1e3))


def test_the_cycle_is_the_training_threads_work_from_one_forward_to_the_next() -> None:
    """Forwards of 1 ms CPU (2 ms wall: a busy machine) every 5 ms of CPU; an evaluation
    between two of them and an epoch's end break the cycle, and a 60 ms cycle (a save) is an
    outlier left out."""
    cpu, wall = Clock(), Clock()
    timer = ForwardTimer(clock=cpu, wall=wall)

    def step(ms: int) -> None:
        timer.begin()
        cpu.now += 1_000_000
        wall.now += 2_000_000
        timer.end()
        cpu.now += (ms - 1) * 1_000_000
        wall.now += (ms - 1) * 1_000_000

    for _ in range(3):
        step(5)
    timer.break_cycle()  # an evaluation: its forwards are not a step's
    cpu.now += 500_000_000
    for ms in (5, 60, 5):
        step(ms)
    epoch = timer.take_epoch()
    assert epoch is not None
    # cycles 5, 5 | 5, 60, 5 (the evaluation's is not one): 60 ms is over 4x the median
    assert epoch.cycle_s == pytest.approx(0.005)
    assert epoch.stretch == pytest.approx(2.0)
    assert epoch.to_dict(steps=6)["cycle_per_step"] == pytest.approx(5.0)
    assert epoch.to_dict(steps=3)["cycle_per_step"] == pytest.approx(10.0)  # two forwards a step
    step(5)  # an epoch's end broke the cycle: one forward is no cycle yet
    assert timer.take_epoch().cycle_s is None  # type: ignore[union-attr]
    assert timer.run().cycle_s == pytest.approx(0.005)  # type: ignore[union-attr]


class FakeEvent:
    """A CUDA event: recorded at a time the test sets, complete once the test says so."""

    now_ms = 0.0

    def __init__(self) -> None:
        self.at: float | None = None
        self.done = False

    def record(self) -> None:
        self.at = FakeEvent.now_ms

    def query(self) -> bool:
        return self.done

    def elapsed_time(self, end: FakeEvent) -> float:
        assert self.done, "elapsed_time of an event not complete would synchronise"
        assert end.done, "elapsed_time of an event not complete would synchronise"
        assert self.at is not None
        assert end.at is not None
        return end.at - self.at


def test_cuda_events_are_read_only_once_complete_and_never_waited_for() -> None:
    made: list[FakeEvent] = []

    def event() -> FakeEvent:
        made.append(FakeEvent())
        return made[-1]

    timer = ForwardTimer(event=event)
    assert timer.source == "cuda_events"
    for ms in (3.0, 5.0):
        timer.begin()
        FakeEvent.now_ms += ms
        timer.end()
    made[0].done = made[1].done = True  # the first forward ran on the device; the second not yet
    epoch = timer.take_epoch()
    assert epoch is not None
    assert (epoch.calls, epoch.total_s) == (1, pytest.approx(0.003))
    made[2].done = made[3].done = True
    later = timer.take_epoch()  # the pending one counts in the next epoch
    assert later is not None
    assert (later.calls, later.total_s) == (1, pytest.approx(0.005))


def test_cuda_events_pending_are_bounded() -> None:
    timer = ForwardTimer(event=FakeEvent)
    for _ in range(MAX_PENDING + 10):
        timer.begin()
        timer.end()
    assert len(timer._pending) == MAX_PENDING


@pytest.fixture(scope="module")
def group() -> Iterator[None]:
    """A process group of one rank (gloo), for a real DDP module."""
    store = dist.HashStore()
    dist.init_process_group("gloo", store=store, rank=0, world_size=1, timeout=timedelta(seconds=30))
    try:
        yield
    finally:
        dist.destroy_process_group()


def test_the_probe_finds_the_ddp_module_and_times_its_training_forwards(group: None) -> None:
    model = nn.parallel.DistributedDataParallel(nn.Linear(4, 2))
    other = nn.Linear(4, 4)
    probe = ForwardProbe(timer_for)
    assert probe.start()
    other(torch.zeros(1, 4))  # not DDP: not hooked
    assert probe.timer is None
    assert probe.looking
    for _ in range(3):
        model(torch.zeros(2, 4)).sum().backward()
    assert probe.timer is not None
    assert not probe.looking  # found: the global hook is gone
    model.eval()
    model(torch.zeros(2, 4))  # validation: not counted, and the cycle running through it neither
    model.train()
    model(torch.zeros(2, 4)).sum().backward()
    stats = probe.timer.take_epoch()
    assert stats is not None
    assert stats.calls == 4
    assert stats.source == "cpu_time"  # parameters on the CPU
    assert len(probe.timer._run.cycles) == 2  # the first three forwards' two cycles
    probe.stop()
    model.train()
    model(torch.zeros(2, 4))
    assert probe.timer.take_epoch() is None  # no hook of ours left on the user's model
    assert not model.module._forward_hooks
    assert not model.module._forward_pre_hooks


def test_a_probe_that_gives_up_leaves_no_global_hook() -> None:
    from torch.nn.modules import module as torch_module

    before = len(torch_module._global_forward_pre_hooks)
    probe = ForwardProbe(timer_for)
    assert probe.start()
    assert len(torch_module._global_forward_pre_hooks) == before + 1
    assert probe.looking
    probe.give_up()
    assert len(torch_module._global_forward_pre_hooks) == before
    assert not probe.looking
