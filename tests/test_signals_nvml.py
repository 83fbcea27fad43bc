"""The NVML sampler through the real pynvml bindings, against the scripted stand-in library.

The stub is loaded into this process and its clock is driven together with the timeline's fake
clock, so every number is exact and nothing sleeps. ``test_signals_nvml_e2e.py`` runs whole
StallScope loops against it in subprocesses, with real time.
"""

from __future__ import annotations

import ctypes
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import nvml_stub
import pytest

from stallscope.signals.nvml import NvmlSampler, NvmlSummary
from stallscope.timeline.recorder import Timeline

MS = 1_000_000
WALL0 = 1_700_000_000_000_000_000  # the wall clock at perf_counter 0, ns
UUID1 = "GPU-5afe0000-0000-0000-0000-000000000001"


@pytest.fixture(scope="module")
def stub(tmp_path_factory: pytest.TempPathFactory) -> ctypes.CDLL:
    if nvml_stub.gcc() is None:
        pytest.skip("gcc is not available to build the stand-in libnvidia-ml.so.1")
    lib = nvml_stub.build(tmp_path_factory.mktemp("nvml"))
    try:
        return nvml_stub.load_in_process(lib)
    except RuntimeError as exc:
        pytest.skip(str(exc))


class Rig:
    """A timeline and an NVML sampler on one fake clock, with the stub's clock following it."""

    def __init__(self, lib: ctypes.CDLL, *, target: int | str | None, tick_ms: float, load: Any = None) -> None:
        self.lib = lib
        self.now = 1_000 * MS
        self.tick_ns = round(tick_ms * MS)
        lib.stubnvml_set_busy(0)
        self._sync()
        self.timeline = Timeline(clock=self.clock)
        self.timeline.start()
        kwargs = {"load": load} if load is not None else {}
        self.sampler = NvmlSampler(
            target=target,
            interval_s=tick_ms / 1e3,
            probe=self.timeline.probe,
            phase_names=self.timeline.phase_names,
            clock=self.clock,
            wall_clock=lambda: self.now + WALL0,
            **kwargs,
        )
        self.sampler._setup()
        self.next_tick = self.now + self.tick_ns

    def clock(self) -> int:
        return self.now

    def _sync(self) -> None:
        self.lib.stubnvml_set_time_us((self.now + WALL0) // 1000)

    def advance(self, ms: float) -> None:
        """Let ``ms`` pass, sampling at every tick on the way."""
        end = self.now + round(ms * MS)
        while self.next_tick <= end:
            self.now = self.next_tick
            self._sync()
            self.sampler.sample_once()
            self.next_tick += self.tick_ns
        self.now = end
        self._sync()

    def step(self, data_ms: float, compute_ms: float, *, busy_in_data: bool = False) -> None:
        """One training step: wait for data, then compute with the GPU busy."""
        tl = self.timeline
        tl.data_begin()
        self.lib.stubnvml_set_busy(1 if busy_in_data else 0)
        self.advance(data_ms)
        tl.data_end(got_item=True)
        tl.enter(tl.phase_id("compute"))
        self.lib.stubnvml_set_busy(1)
        self.advance(compute_ms)
        self.lib.stubnvml_set_busy(0)
        tl.leave()

    def close(self) -> None:
        self.sampler._teardown()
        self.lib.stubnvml_set_time_us(0)


@pytest.fixture
def rig(stub: ctypes.CDLL, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    made: list[Rig] = []

    def make(*, target: int | str | None = 0, tick_ms: float = 50, load: Any = None, **script: Any) -> Rig:
        path = nvml_stub.write_script(tmp_path / f"script{len(made)}.txt", **script)
        monkeypatch.setenv("STUBNVML_SCRIPT", str(path))
        r = Rig(stub, target=target, tick_ms=tick_ms, load=load)
        made.append(r)
        return r

    yield make
    for r in made:
        r.close()


def summary(r: Rig) -> NvmlSummary:
    s = r.sampler.close_window()
    assert s is not None
    return s


def test_utilization_per_phase_matches_the_script(rig: Any, stub: ctypes.CDLL) -> None:
    inits = stub.stubnvml_init_calls()
    r = rig(busy_util=95, idle_util=2, sample_period_us=10_000)
    for _ in range(30):
        r.step(30, 50)  # a starved loop: 30 ms waiting for data, 50 ms of GPU work
    s = summary(r)
    assert stub.stubnvml_init_calls() == inits + 1  # NVML initialised once, the handle cached
    assert s.util_source == "samples"
    assert s.util_by_phase == pytest.approx({"data": 0.02, "compute": 0.95}, abs=0.01)
    compute_share = 50 / 80
    assert s.util_mean == pytest.approx(0.95 * compute_share + 0.02 * (1 - compute_share), abs=0.01)
    assert s.idle_fraction == pytest.approx(1 - s.util_mean)
    assert (s.util_p10, s.util_p50, s.util_p90) == (0.02, 0.95, 0.95)
    assert s.phase_resolution is not None
    assert s.phase_resolution > 0.5
    assert (s.index, s.uuid, s.name) == (0, "GPU-5afe0000-0000-0000-0000-000000000000", "Stub GPU")


def test_phases_near_nvmls_real_sample_period_are_still_told_apart(rig: Any) -> None:
    """1/6 s samples and 200 ms ticks (the defaults) with 100 ms phases: every sample mixes both
    phases, and the least-squares split still finds them."""
    r = rig(busy_util=95, idle_util=2, sample_period_us=166_000, tick_ms=200)
    for _ in range(60):
        r.step(100, 100)
    s = summary(r)
    assert s.util_by_phase == pytest.approx({"data": 0.02, "compute": 0.95}, abs=0.06)
    assert s.phase_resolution == 0.0


def test_phases_much_shorter_than_a_sample_get_no_per_phase_number(rig: Any) -> None:
    r = rig(busy_util=95, idle_util=2, sample_period_us=166_000, tick_ms=200)
    for _ in range(120):
        r.step(30, 50)
    s = summary(r)
    assert s.util_by_phase == {}
    assert s.util_mean == pytest.approx(0.95 * 50 / 80 + 0.02 * 30 / 80, abs=0.02)


def test_windows_are_epochs(rig: Any) -> None:
    r = rig(busy_util=100, idle_util=0)
    for _ in range(10):
        r.step(0, 100)
    first = summary(r)
    for _ in range(10):
        r.step(100, 0)
    second = summary(r)
    assert first.util_mean == pytest.approx(1.0, abs=0.02)
    assert second.util_mean == pytest.approx(0.0, abs=0.02)
    run = r.sampler.run_summary()
    assert run is not None
    assert run.util_mean == pytest.approx(0.5, abs=0.02)


def test_a_group_window_spans_the_epochs_since_the_last_group(rig: Any) -> None:
    """Epochs diagnosed together: the group's window holds the samples of every epoch window
    closed since the last group (here a busy epoch and an idle one), and the next group starts
    after it."""
    r = rig(busy_util=100, idle_util=0)
    for _ in range(10):
        r.step(0, 100)
    assert summary(r).util_mean == pytest.approx(1.0, abs=0.02)
    for _ in range(10):
        r.step(100, 0)
    assert summary(r).util_mean == pytest.approx(0.0, abs=0.02)
    group = r.sampler.close_group()
    assert group is not None
    assert group.util_mean == pytest.approx(0.5, abs=0.02)
    for _ in range(10):
        r.step(0, 100)
    summary(r)
    later = r.sampler.close_group()
    assert later is not None
    assert later.util_mean == pytest.approx(1.0, abs=0.02)


def test_memory_power_clocks_temperature(rig: Any) -> None:
    r = rig(
        mem_total=80 * 2**30,
        mem_used=10 * 2**30,
        mem_used_busy=30 * 2**30,
        power_mw=90_000,
        power_busy_mw=400_000,
        power_limit_mw=500_000,
        power_default_limit_mw=700_000,
        sm_clock=1980,
        sm_clock_busy=1400,
        sm_clock_max=1980,
        temperature=83,
        reasons_idle=0x1,
        reasons_busy=0x4,
    )
    for _ in range(20):
        r.step(0, 500)  # always busy, power-capped
    s = summary(r)
    assert (s.mem_used_max_bytes, s.mem_total_bytes) == (30 * 2**30, 80 * 2**30)
    assert (s.power_max_w, s.power_limit_w, s.temperature_max_c) == (400.0, 500.0, 83.0)
    assert s.power_default_limit_w == 700.0
    assert (s.sm_clock_max_mhz, s.sm_clock_throttled_mhz) == (1980.0, 1400.0)
    assert s.throttle["power"] == pytest.approx(1.0)
    assert s.throttle["any"] == pytest.approx(1.0)
    assert s.throttle["thermal"] == 0.0
    assert s.throttle["power_brake"] == 0.0


def test_a_power_brake_is_not_the_power_cap(rig: Any) -> None:
    r = rig(sm_clock_busy=900, sm_clock_max=1980, reasons_idle=0x1, reasons_busy=0x80)  # HwPowerBrakeSlowdown
    for _ in range(10):
        r.step(0, 500)
    s = summary(r)
    assert s.throttle["power_brake"] == pytest.approx(1.0)
    assert s.throttle["power"] == 0.0
    assert s.power_default_limit_w == s.power_limit_w  # the stub's default: the enforced limit


def test_no_new_samples_is_not_an_error(rig: Any) -> None:
    r = rig(sample_period_us=100_000, tick_ms=20)  # most ticks find nothing new (NOT_FOUND)
    for _ in range(10):
        r.step(50, 50)
    s = summary(r)
    assert r.sampler.enabled
    assert r.sampler.notes() == ()
    assert s.util_samples >= 8


def test_without_samples_it_reads_utilization_rates(rig: Any) -> None:
    r = rig(busy_util=90, idle_util=0, fail={"nvmlDeviceGetSamples": 3})
    for _ in range(20):
        r.step(100, 100)
    s = summary(r)
    assert s.util_source == "rates"
    assert s.util_mean == pytest.approx(0.45, abs=0.05)
    assert any("utilization samples not available (Not Supported)" in n for n in r.sampler.notes())


def test_each_metric_degrades_on_its_own(rig: Any) -> None:
    r = rig(
        fail={
            "nvmlDeviceGetPowerUsage": 3,  # NOT_SUPPORTED
            "nvmlDeviceGetTemperature": 4,  # NO_PERMISSION
            "nvmlDeviceGetCurrentClocksEventReasons": 3,
            "nvmlDeviceGetEnforcedPowerLimit": 3,
            "nvmlDeviceGetPowerManagementDefaultLimit": 3,
        }
    )
    for _ in range(10):
        r.step(100, 100)
    s = summary(r)
    assert r.sampler.enabled
    assert s.util_mean is not None
    assert s.mem_total_bytes is not None
    assert s.sm_clock_mean_mhz is not None
    assert (s.power_mean_w, s.power_limit_w, s.temperature_max_c, s.throttle) == (None, None, None, {})
    assert s.power_default_limit_w is None
    notes = r.sampler.notes()
    assert "NVML: power draw not available on this GPU (Not Supported)" in notes
    assert "NVML: temperature not available on this GPU (Insufficient Permissions)" in notes
    assert "NVML: clock-event (throttle) reasons not available on this GPU (Not Supported)" in notes


def test_a_mig_instance_has_memory_but_no_utilization(rig: Any) -> None:
    r = rig(mig=1)
    for _ in range(10):
        r.step(100, 100)
    s = summary(r)
    assert s.util_mean is None
    assert s.util_samples == 0
    assert s.mem_total_bytes is not None
    assert r.sampler.notes() == (
        "NVML reports no utilization for MIG instances; the idle fraction comes from host phases",
    )


def test_the_gpu_named_by_uuid_and_a_target_set_later(rig: Any) -> None:
    r = rig(target=None, devices=2)
    r.step(100, 100)
    assert r.sampler.close_window() is None  # nothing to sample yet: it only waits
    r.sampler.set_target(UUID1)
    for _ in range(5):
        r.step(100, 100)
    s = summary(r)
    assert (s.index, s.uuid) == (1, UUID1)
    r.sampler.set_target(0)  # the first target stays
    assert r.sampler.target == UUID1


@pytest.mark.parametrize(
    ("target", "message"),
    [
        (3, "nvml_device=3 does not exist: NVML sees 1 GPU(s)"),
        ("GPU-00000000-dead", "GPU 'GPU-00000000-dead' could not be opened: Not Found"),
    ],
)
def test_a_target_that_does_not_exist_turns_nvml_off_with_a_note(rig: Any, target: object, message: str) -> None:
    r = rig(target=target)
    r.step(100, 100)
    assert not r.sampler.enabled
    assert r.sampler.notes() == (f"nvml sampling is off: {message}",)


def test_an_unexpected_utilization_error_turns_only_utilization_off(rig: Any) -> None:
    r = rig(fail={"nvmlDeviceGetSamples": 999})
    for _ in range(5):
        r.step(100, 100)
    s = summary(r)
    assert r.sampler.enabled
    assert s.util_mean is None
    assert s.mem_total_bytes is not None
    assert r.sampler.notes() == ("NVML: GPU utilization not available on this GPU (Unknown Error)",)


def test_a_lost_gpu_turns_nvml_off(rig: Any) -> None:
    r = rig(fail={"nvmlDeviceGetSamples": 15})
    r.step(100, 100)
    assert not r.sampler.enabled
    assert r.sampler.notes() == ("nvml sampling is off: NVML reports the GPU is lost",)


def test_a_failing_init_is_a_note(rig: Any) -> None:
    r = rig(fail={"nvmlInit": 9})
    assert not r.sampler.enabled
    assert r.sampler.notes() == ("nvml sampling is off: the NVIDIA driver is not loaded",)


def test_without_pynvml_installed_it_says_what_to_install(rig: Any) -> None:
    def missing() -> None:
        raise ImportError("No module named 'pynvml'")

    r = rig(load=missing)
    assert not r.sampler.enabled
    assert r.sampler.notes() == (
        "nvml sampling is off: the nvidia-ml-py package is not installed; pip install nvidia-ml-py",
    )
