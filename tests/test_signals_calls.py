"""``signals.calls.CallMeter``: the logger calls' wall time and the training thread's CPU in them,
on fake clocks."""

from __future__ import annotations

from stallscope.signals.calls import CallMeter


class Clock:
    def __init__(self) -> None:
        self.now = 0

    def __call__(self) -> int:
        return self.now


def test_a_call_inside_another_counts_once_and_cpu_never_exceeds_wall() -> None:
    wall, cpu = Clock(), Clock()
    meter = CallMeter(clock=wall, cpu_clock=cpu)
    assert meter.summary() is None
    meter.begin()
    meter.begin()  # log_metrics calling save, say
    wall.now += 3_000
    cpu.now += 300
    meter.end()
    meter.end()
    meter.end()  # one end too many: ignored
    meter.begin()
    wall.now += 1_000
    cpu.now += 5_000  # another thread's time read as this one's: capped at the wall time
    meter.end()
    summary = meter.summary()
    assert summary is not None
    assert (summary.calls, summary.wall_ns, summary.cpu_ns) == (2, 4_000, 1_300)
    assert summary.cpu_share == 1_300 / 4_000


def test_a_sampled_call_stands_for_the_calls_not_measured() -> None:
    """A 200 ms first call (a connection set up) and then calls of 2 ms with 1.5 ms of CPU, one
    in 8 measured with weight 8: the share is that of all the calls, not of the sample."""
    wall, cpu = Clock(), Clock()
    meter = CallMeter(clock=wall, cpu_clock=cpu)
    meter.begin()
    wall.now += 200_000
    meter.end()
    for _ in range(10):
        meter.begin()
        wall.now += 2_000
        cpu.now += 1_500
        meter.end(8)
    summary = meter.summary()
    assert summary is not None
    assert summary.calls == 81
    assert summary.cpu_share == (80 * 1_500) / (200_000 + 80 * 2_000)
