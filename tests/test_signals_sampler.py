"""The periodic sampler base: one sample at a time, contained failures, a stop that never hangs."""

from __future__ import annotations

import threading

import pytest

from stallscope.signals.sampler import PeriodicSampler


class Counting(PeriodicSampler[int, int]):
    name = "counting"

    def __init__(self, **kwargs: object) -> None:
        super().__init__(interval_s=0.001, **kwargs)  # type: ignore[arg-type]
        self.seen: list[int] = []
        self.fail_at: int | None = None
        self.torn_down = threading.Event()
        self.block: threading.Event | None = None
        self.entered = threading.Event()
        self.three = threading.Event()

    def _tick(self, now_ns: int) -> None:
        self.entered.set()
        if self.block is not None:
            self.block.wait()
        if self.fail_at is not None and len(self.seen) == self.fail_at:
            raise RuntimeError("sensor fell off")
        self.seen.append(now_ns)
        self._ring.append(now_ns)
        if len(self.seen) >= 3:
            self.three.set()

    def _teardown(self) -> None:
        self.torn_down.set()


def test_bad_interval_is_rejected() -> None:
    with pytest.raises(ValueError, match="interval_s"):
        PeriodicSampler[int, int](interval_s=0)


def test_sample_once_uses_the_injected_clock() -> None:
    ticks = iter(range(100, 200, 10))
    s = Counting(clock=lambda: next(ticks))
    for _ in range(3):
        s.sample_once()
    assert s.seen == [100, 110, 120]
    assert s.ticks == 3
    assert s.recent() == [100, 110, 120]


def test_the_ring_of_recent_samples_is_bounded() -> None:
    ticks = iter(range(1000))
    s = Counting(clock=lambda: next(ticks), ring_size=4)
    for _ in range(10):
        s.sample_once()
    assert s.recent() == [6, 7, 8, 9]


def test_a_failing_sample_turns_only_this_sampler_off_with_a_note() -> None:
    s = Counting()
    s.fail_at = 1
    s.sample_once()
    s.sample_once()
    s.sample_once()
    assert len(s.seen) == 1
    assert not s.enabled
    assert s.notes() == ("counting sampling is off: RuntimeError: sensor fell off",)


def test_thread_runs_and_stops_promptly() -> None:
    s = Counting()
    s.start()
    s.start()  # idempotent
    assert s.three.wait(timeout=30)
    s.stop()
    assert s.torn_down.is_set()
    assert s._thread is not None
    assert not s._thread.is_alive()


def test_stop_gives_up_on_a_stuck_sample_and_says_so() -> None:
    s = Counting(join_timeout_s=0.01)
    s.block = threading.Event()
    s.start()
    assert s.entered.wait(timeout=30)
    s.stop()  # the tick is stuck (as in a hung NVML call): stop returns anyway
    assert not s.enabled
    assert any("did not stop" in n for n in s.notes())
    s.block.set()  # let the daemon thread finish


def test_summaries_do_not_wait_long_for_a_stuck_sample(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("stallscope.signals.sampler.LOCK_TIMEOUT_S", 0.01)
    s = Counting()
    s._lock.acquire()
    try:
        assert s._locked() is False
    finally:
        s._lock.release()
    assert not s.enabled
    assert any("longer than" in n for n in s.notes())


def test_a_summary_takes_the_lock_while_a_sample_reads() -> None:
    """A sample's reads hold no lock: a summary never waits behind a read that hangs."""
    s = Counting()
    s.block = threading.Event()
    s.start()
    try:
        assert s.entered.wait(timeout=30)
        assert s._with_lock(lambda: "summary") == "summary"
        assert s.enabled
    finally:
        s.block.set()
        s.stop()


def test_a_sample_stuck_too_long_turns_the_sampler_off(monkeypatch: pytest.MonkeyPatch) -> None:
    s = Counting()
    s.block = threading.Event()
    s.start()
    try:
        assert s.entered.wait(timeout=30)
        monkeypatch.setattr("stallscope.signals.sampler.STUCK_AFTER_S", 0.0)
        assert s._with_lock(lambda: "summary") == "summary"
        assert not s.enabled
        assert any("has not returned" in n for n in s.notes())
    finally:
        s.block.set()


class _CountingEvent(threading.Event):
    def __init__(self) -> None:
        super().__init__()
        self.waits = 0

    def wait(self, timeout: float | None = None) -> bool:
        self.waits += 1
        return super().wait(timeout)


def test_an_epoch_end_waits_only_for_a_thread_that_answers() -> None:
    s = Counting()
    served = _CountingEvent()
    s._served = served
    s.block = threading.Event()
    s.start()
    try:
        assert s.entered.wait(timeout=30)
        s._fresh()  # the thread is in a sample: not waited for
        assert served.waits == 0
    finally:
        s.block.set()
    s.block = None
    assert s.three.wait(timeout=30)
    for _ in range(100):  # between two samples (every 1 ms): asked, and waited for
        if s._busy_since is None:
            before = s.ticks
            s._fresh()
            if served.waits and s.ticks > before:
                break
    assert served.waits >= 1
    s.stop()
    assert not s._thread.is_alive()  # type: ignore[union-attr]
