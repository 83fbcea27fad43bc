"""The timeline's two seams for samplers: ``probe`` (read from another thread) and ``watch``."""

from __future__ import annotations

import threading
from collections.abc import Callable

import pytest
from conftest import FakeClock

from stallscope.timeline.recorder import END, Timeline

MS = 1_000_000


def test_probe_before_start_is_none(clock: FakeClock) -> None:
    assert Timeline(clock=clock).probe() is None


def test_probe_reports_the_phase_in_progress_and_the_totals(clock: FakeClock) -> None:
    tl = Timeline(clock=clock)
    tl.start()
    compute = tl.phase_id("compute")
    clock.advance_ms(5)
    tl.enter(compute)
    clock.advance_ms(7)
    p = tl.probe()
    assert p is not None
    assert tl.phase_names()[p.phase] == "compute"
    assert (p.now_ns, p.since_ns) == (12 * MS, 5 * MS)
    assert p.totals_ns[tl.phase_id("other")] == 5 * MS
    assert sum(p.totals_ns) == p.since_ns  # totals are credited up to the mark


def test_probe_retries_while_the_training_thread_is_mid_fold(clock: FakeClock) -> None:
    """A probe taken while the training thread rewrites the folded state would be inconsistent;
    the odd fold count rejects it (simulated by leaving a fold half-way, then finishing it)."""
    tl = Timeline(clock=clock)
    tl.start()
    clock.advance_ms(3)
    tl._folds += 1  # a fold begins
    assert tl.probe() is None
    tl._folds += 1  # and ends
    assert tl.probe() is not None


def test_probe_applies_the_events_not_folded_yet(clock: FakeClock) -> None:
    """The probe sees events still in the log exactly as it sees them once folded."""
    tl = Timeline(clock=clock)
    tl.start()
    compute, logging = tl.phase_id("compute"), tl.phase_id("logging")
    for wait, work, log in [(2, 5, 1), (3, 4, 2)]:
        tl.data_begin()
        clock.advance_ms(wait)
        tl.data_end(got_item=True)
        tl.enter(compute)
        clock.advance_ms(work)
        tl.enter(logging)  # nested: compute resumes when it ends
        clock.advance_ms(log)
        tl.leave()
        tl.leave()
        clock.advance_ms(1)
    custom = tl.phase_id("registered late")
    tl.switch(custom)
    clock.advance_ms(2)
    assert tl._log  # events are pending
    pending = tl.probe()
    assert tl.depth == 1  # reading the depth folds the log
    assert not tl._log
    assert tl.probe() == pending
    assert pending is not None
    assert (pending.phase, pending.since_ns, pending.now_ns) == (custom, 19 * MS, 21 * MS)
    expected = {"data": 5 * MS, "compute": 9 * MS, "logging": 3 * MS, "other": 2 * MS}
    names = tl.phase_names()
    assert {names[i]: ns for i, ns in enumerate(pending.totals_ns) if ns} == expected


def test_probe_from_another_thread_is_always_consistent() -> None:
    tl = Timeline()
    tl.start()
    data, compute = tl.phase_id("data"), tl.phase_id("compute")
    stop = threading.Event()
    bad: list[object] = []

    def reader() -> None:
        while not stop.is_set():
            p = tl.probe()
            if p is not None and sum(p.totals_ns) != p.since_ns - tl._start_ns:
                bad.append(p)

    thread = threading.Thread(target=reader)
    thread.start()
    for _ in range(20_000):
        tl.enter(data)
        tl.leave()
        tl.enter(compute)
        tl.leave()
    stop.set()
    thread.join()
    assert bad == []


def test_watch_calls_listeners_around_one_phase_only(clock: FakeClock) -> None:
    tl = Timeline(clock=clock)
    tl.start()
    calls: list[str] = []
    compute, logging = tl.phase_id("compute"), tl.phase_id("logging")
    tl.watch(compute, lambda: calls.append("enter"), lambda: calls.append("leave"))
    tl.enter(logging)
    tl.leave()
    tl.enter(compute)
    tl.enter(logging)  # nested: leaving it resumes compute, which is not an "enter"
    tl.leave()
    tl.leave()
    assert calls == ["enter", "leave"]
    tl.unwatch()
    tl.enter(compute)
    tl.leave()
    assert calls == ["enter", "leave"]


@pytest.mark.parametrize("timer_first", [True, False])
def test_a_watched_phase_timer_calls_its_listeners_at_the_boundaries(clock: FakeClock, timer_first: bool) -> None:
    """The plain loop's timers call the listeners as the phase is entered and left (CUDA events are
    recorded then), while the events themselves are still folded later."""
    tl = Timeline(clock=clock)
    tl.start()
    compute, logging = tl.phase_id("compute"), tl.phase_id("logging")
    calls: list[tuple[str, int]] = []
    if timer_first:
        timer = tl.timer(compute)
    tl.watch(compute, lambda: calls.append(("enter", clock.now)), lambda: calls.append(("leave", clock.now)))
    if not timer_first:
        timer = tl.timer(compute)
    other = tl.timer(logging)
    clock.advance(5)
    with timer:
        clock.advance(7)
        with other:  # nested: leaving it resumes compute, which is not an "enter"
            clock.advance(1)
        clock.advance(2)
    with other:
        clock.advance(3)
    assert calls == [("enter", 5), ("leave", 15)]
    assert tl._log  # not folded per event
    assert tl.run_stats().phase_ns["compute"] == 9
    tl.unwatch()
    with timer:
        clock.advance(1)
    assert calls == [("enter", 5), ("leave", 15)]


def test_a_watched_phase_entered_by_lightnings_calls_gets_its_listeners(clock: FakeClock) -> None:
    """Lightning drives the timeline through its methods: fetch -> h2d -> (switch) compute -> leave."""
    tl = Timeline(clock=clock)
    tl.start()
    h2d, compute = tl.phase_id("h2d"), tl.phase_id("compute")
    calls: list[tuple[str, int]] = []
    tl.watch(compute, lambda: calls.append(("enter", clock.now)), lambda: calls.append(("leave", clock.now)))
    for _ in range(2):
        tl.data_begin()
        clock.advance(2)
        tl.data_end(got_item=True, then=h2d)
        clock.advance(3)
        tl.switch(compute)
        clock.advance(10)
        tl.leave()
        clock.advance(1)
    assert calls == [("enter", 5), ("leave", 15), ("enter", 21), ("leave", 31)]


class _InterruptingClock(FakeClock):
    """A clock that runs ``hook`` once, just before one reading: the training thread taking the
    GIL between two of the probe's reads."""

    hook: Callable[[], None] | None = None

    def __call__(self) -> int:
        hook, self.hook = self.hook, None
        if hook is not None:
            hook()
        return super().__call__()


def test_probe_reads_again_when_an_event_is_logged_while_it_reads() -> None:
    clock = _InterruptingClock()
    tl = Timeline(clock=clock)
    tl.start()
    compute = tl.phase_id("compute")
    clock.now = 10 * MS
    tl.enter(compute)

    def training_thread() -> None:  # runs after the probe copied the log, before it reads its clock
        clock.now = 25 * MS
        tl.leave()  # compute ends at 25 ms
        clock.now = 30 * MS

    clock.hook = training_thread
    p = tl.probe()
    assert p is not None
    assert (tl.phase_names()[p.phase], p.since_ns, p.now_ns) == ("other", 25 * MS, 30 * MS)


def test_probe_at_an_epoch_end_keeps_the_phase_in_progress(clock: FakeClock) -> None:
    """An epoch may end inside a phase; the end of the step changes no phase."""
    tl = Timeline(clock=clock)
    tl.start()
    train = tl.phase_id("train")
    tl.enter(train)
    tl.data_begin()
    clock.advance_ms(2)
    tl.data_end(got_item=True)
    clock.advance_ms(3)
    tl._log.extend((END, clock.now))  # what end_epoch logs before it folds
    pending = tl.probe()
    tl._fold()
    assert pending == tl.probe()
    assert pending is not None
    assert tl.phase_names()[pending.phase] == "train"


def test_a_watched_phase_that_starts_the_clock_calls_its_listener(clock: FakeClock) -> None:
    """CUDA already set up when the scope starts: the watch is on before the clock, and the first
    event (a warm-up step timed before any ``scope.iter``) is the watched phase's."""
    tl = Timeline(clock=clock)
    calls: list[str] = []
    compute = tl.phase_id("compute")
    tl.watch(compute, lambda: calls.append("enter"), lambda: calls.append("leave"))
    timer = tl.timer(compute)
    for _ in range(2):
        with timer:
            clock.advance(5)
    assert tl.started
    assert calls == ["enter", "leave", "enter", "leave"]
