"""GPU signals from NVML, sampled on a background thread.

``pynvml`` (package ``nvidia-ml-py``) is imported lazily on the sampler's thread, NVML is
initialised once and the device handle cached. The device is the one ``target`` names: an NVML
index or a GPU/MIG UUID, either given by the user (``nvml_device``) or the UUID of the GPU torch
uses (NVML ignores ``CUDA_VISIBLE_DEVICES``, so indices do not match; UUIDs do). Until a target
is known the thread only waits.

Each tick reads, in this order: the timeline's probe (for the phase correlation), utilization
samples newer than the last one seen (``nvmlDeviceGetSamples``; ``NOT_FOUND`` just means none
yet), falling back to ``nvmlDeviceGetUtilizationRates`` where samples are not supported, and
memory in use. About once a second it also reads power, SM clock, clock-event (throttle)
reasons and temperature. Every metric degrades on its own: ``NotSupported``,
``FunctionNotFound``, ``NoPermission`` (MIG instances report no utilization, for one) turn that
metric off with a note for the report, never an error.

NVML stamps samples in microseconds of wall-clock time; each tick pairs the wall clock with the
timeline's clock, so samples land on the timeline's time base. Every fraction is in [0, 1].
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from stallscope.signals.correlate import PhaseCorrelator, UtilTally
from stallscope.signals.sampler import Clock, PeriodicSampler
from stallscope.timeline.recorder import PhaseProbe

#: clock-event reason bits (NVML ``nvmlClocksEventReason*``) grouped by what the user can act on
THROTTLE_REASONS: Mapping[str, int] = {
    "power": 0x4,  # SwPowerCap: the board's power limit (its normal state under full load)
    "power_brake": 0x80,  # HwPowerBrakeSlowdown: an external power brake
    "thermal": 0x20 | 0x40,  # SwThermalSlowdown, HwThermalSlowdown
    "hw_slowdown": 0x8,  # HwSlowdown
}
THROTTLE_ANY = 0x4 | 0x80 | 0x20 | 0x40 | 0x8
GPU_IDLE = 0x1

# NVML return codes this module tells apart
_NOT_SUPPORTED = 3
_NO_PERMISSION = 4
_NOT_FOUND = 6
_FUNCTION_NOT_FOUND = 13
_GPU_IS_LOST = 15
_UTIL_SAMPLES = 1  # NVML_GPU_UTILIZATION_SAMPLES
_CLOCK_SM = 1  # NVML_CLOCK_SM
_TEMPERATURE_GPU = 0

_METRIC_LABELS = {
    "samples": "utilization samples",
    "util": "GPU utilization",
    "memory": "memory in use",
    "power": "power draw",
    "power_limit": "power limit",
    "power_default_limit": "default power limit",
    "clock": "SM clock",
    "clock_max": "maximum SM clock",
    "reasons": "clock-event (throttle) reasons",
    "temperature": "temperature",
    "mig": "MIG mode",
}


class UtilSample(NamedTuple):
    """One utilization reading on the timeline's clock (kept in the sampler's ring)."""

    end_ns: int
    period_ns: int
    util: float


@dataclass(frozen=True)
class NvmlSummary:
    """What NVML showed over one window (an epoch or the run). Fractions in [0, 1]."""

    #: NVML index, UUID and name of the sampled GPU
    index: int | None
    uuid: str | None
    name: str | None
    #: utilization samples in the window
    util_samples: int = 0
    #: time-weighted mean utilization (share of time a kernel ran), None when not measured
    util_mean: float | None = None
    util_p10: float | None = None
    util_p50: float | None = None
    util_p90: float | None = None
    #: estimated utilization while the loop was in each phase (phase name -> fraction)
    util_by_phase: Mapping[str, float] = field(default_factory=dict)
    #: share of the correlated time that lay wholly in one phase; low values mean phases changed
    #: faster than the samples and ``util_by_phase`` rests on the least-squares split
    phase_resolution: float | None = None
    #: where utilization came from: ``samples`` (nvmlDeviceGetSamples), ``rates`` or None
    util_source: str | None = None
    mem_used_max_bytes: int | None = None
    mem_total_bytes: int | None = None
    power_mean_w: float | None = None
    power_max_w: float | None = None
    power_limit_w: float | None = None
    #: the board's default power limit; an enforced limit below it was lowered on purpose
    power_default_limit_w: float | None = None
    sm_clock_mean_mhz: float | None = None
    sm_clock_max_mhz: float | None = None
    #: mean SM clock while busy and throttled / busy and not throttled, MHz
    sm_clock_throttled_mhz: float | None = None
    sm_clock_unthrottled_mhz: float | None = None
    #: share of the sampled busy time with each throttle reason (``power``, ``power_brake``, ``thermal``,
    #: ``hw_slowdown``, ``any``); empty when reasons are not available
    throttle: Mapping[str, float] = field(default_factory=dict)
    temperature_max_c: float | None = None
    #: utilization was measured, then stopped during the run (the sampler or the metric turned
    #: off) before this window closed: it covers only part of the window
    util_partial: bool = False

    @property
    def idle_fraction(self) -> float | None:
        """1 - mean utilization: the share of time no kernel ran."""
        return None if self.util_mean is None else 1.0 - self.util_mean


class _Window:
    """Running sums of one window besides utilization."""

    def __init__(self) -> None:
        self.util = UtilTally()
        self.mem_used_max: int | None = None
        self.mem_total: int | None = None
        self.power_sum = 0.0
        self.power_n = 0
        self.power_max: float | None = None
        self.clock_sum = 0.0
        self.clock_n = 0
        self.clock_thr_sum = 0.0
        self.clock_thr_n = 0
        self.clock_free_sum = 0.0
        self.clock_free_n = 0
        self.busy_ns = 0
        self.throttle_ns = dict.fromkeys((*THROTTLE_REASONS, "any"), 0)
        self.reasons_seen = False
        self.temp_max: float | None = None


def _load_pynvml() -> Any:
    import pynvml  # the optional, untyped NVML bindings (package nvidia-ml-py)

    return pynvml


class NvmlSampler(PeriodicSampler[NvmlSummary, UtilSample]):
    """Samples one GPU through NVML. See the module docstring."""

    name = "nvml"

    def __init__(
        self,
        *,
        target: int | str | None,
        interval_s: float,
        probe: Callable[[], PhaseProbe | None] | None = None,
        phase_names: Callable[[], Sequence[str]] = tuple,
        clock: Clock = time.perf_counter_ns,
        wall_clock: Clock = time.time_ns,
        slow_interval_s: float = 1.0,
        load: Callable[[], Any] = _load_pynvml,
    ) -> None:
        super().__init__(interval_s=interval_s, clock=clock)
        self._target = target
        self._probe = probe
        self._phase_names = phase_names
        self._wall = wall_clock
        self._slow_ns = int(slow_interval_s * 1e9)
        self._load = load
        self._nv: Any = None
        self._inited = False
        self._handle: Any = None
        self._off: set[str] = set()
        #: metrics that returned a value at least once (a failure later is "stopped", not "not available")
        self._worked: set[str] = set()
        self._corr = PhaseCorrelator()
        self._win = _Window()
        #: the window of the epochs diagnosed together (``close_group``): a group of short epochs
        self._grp = _Window()
        self._all = _Window()
        self._start_ns: int | None = None
        self._last_tick: int | None = None
        self._last_slow: int | None = None
        self._last_ts_us = 0
        self._prev_sample_us = 0
        self._period_ns: int | None = None
        self._samples_missing = 0
        self._ts_shift_ns = 0
        self._use_rates = False
        self.index: int | None = None
        self.uuid: str | None = None
        self.device_name: str | None = None
        self._clock_max: float | None = None
        self._power_limit: float | None = None
        self._power_default_limit: float | None = None
        self._mig = False

    # -- target --------------------------------------------------------------------------

    def set_target(self, target: int | str) -> None:
        """Sample this GPU (NVML index or UUID) from the next tick on, if none was chosen yet."""
        if self._target is None:
            self._target = target

    @property
    def target(self) -> int | str | None:
        return self._target

    @property
    def has_device(self) -> bool:
        return self._handle is not None

    # -- thread --------------------------------------------------------------------------

    def _setup(self) -> None:
        try:
            self._nv = self._load()
        except ImportError:
            self.disable(reason="the nvidia-ml-py package is not installed; pip install nvidia-ml-py")
            return
        nv = self._nv
        try:
            nv.nvmlInit()
        except nv.NVMLError as err:
            code = getattr(err, "value", None)
            if code == 12:  # LIBRARY_NOT_FOUND
                why = "the NVIDIA driver's libnvidia-ml.so.1 was not found"
            elif code == 9:  # DRIVER_NOT_LOADED
                why = "the NVIDIA driver is not loaded"
            else:
                why = f"nvmlInit failed: {_text(err)}"
            self.disable(reason=why)
            return
        self._inited = True
        self._start_ns = self._clock()
        self._last_ts_us = self._wall() // 1000

    def _teardown(self) -> None:
        if self._inited:
            self._inited = False
            self._nv.nvmlShutdown()

    def _open(self) -> bool:
        """Open the target's handle; False while there is no target. Disables on a bad target."""
        target = self._target
        if target is None or self._nv is None:
            return False
        nv = self._nv
        try:
            if isinstance(target, int):
                count = nv.nvmlDeviceGetCount()
                if target >= count:
                    self.disable(reason=f"nvml_device={target} does not exist: NVML sees {count} GPU(s)")
                    return False
                handle = nv.nvmlDeviceGetHandleByIndex(target)
            else:
                handle = self._by_uuid(target)
        except nv.NVMLError as err:
            self.disable(reason=f"GPU {target!r} could not be opened: {_text(err)}")
            return False
        self._handle = handle
        self.uuid = self._try("uuid", nv.nvmlDeviceGetUUID, handle, quiet=True)
        self.device_name = self._try("name", nv.nvmlDeviceGetName, handle, quiet=True)
        index = target if isinstance(target, int) else self._try("index", nv.nvmlDeviceGetIndex, handle, quiet=True)
        self.index = index if isinstance(index, int) else None
        mig = self._try("mig", nv.nvmlDeviceGetMigMode, handle, quiet=True)
        self._mig = bool(mig and mig[0]) or (isinstance(self.uuid, str) and self.uuid.startswith("MIG-"))
        clock_max = self._try("clock_max", nv.nvmlDeviceGetMaxClockInfo, handle, _CLOCK_SM, quiet=True)
        self._clock_max = float(clock_max) if clock_max else None
        limit = self._try("power_limit", nv.nvmlDeviceGetEnforcedPowerLimit, handle, quiet=True)
        self._power_limit = limit / 1000.0 if limit else None
        default = self._try("power_default_limit", nv.nvmlDeviceGetPowerManagementDefaultLimit, handle, quiet=True)
        self._power_default_limit = default / 1000.0 if default else None
        return True

    def _by_uuid(self, uuid: str) -> Any:
        nv = self._nv
        try:
            return nv.nvmlDeviceGetHandleByUUID(uuid)
        except nv.NVMLError as err:
            # torch formats MIG instances' UUIDs like GPUs'; NVML names them MIG-...
            if getattr(err, "value", None) == _NOT_FOUND and uuid.startswith("GPU-"):
                return nv.nvmlDeviceGetHandleByUUID("MIG-" + uuid[4:])
            raise

    def _tick(self, now_ns: int) -> None:
        # the NVML calls first, without the lock (a wedged driver blocks only this thread); then
        # what they returned goes into the windows with the lock held
        if self._handle is None and not self._open():
            self._last_tick = now_ns
            return
        nv, handle = self._nv, self._handle
        wall_ns = self._wall()
        offset_ns = wall_ns - now_ns
        probe = self._probe() if self._probe is not None else None
        prev_tick = self._last_tick if self._last_tick is not None else now_ns - int(self.interval_s * 1e9)
        self._last_tick = now_ns
        try:
            util = self._read_util(nv, handle)
        except nv.NVMLError as err:
            if getattr(err, "value", None) == _GPU_IS_LOST:
                self.disable(reason="NVML reports the GPU is lost")
                return
            raise
        memory = self._try("memory", nv.nvmlDeviceGetMemoryInfo, handle)
        slow: tuple[Any, Any, int | None, Any] | None = None
        dt = 0
        if self._last_slow is None or now_ns - self._last_slow >= self._slow_ns:
            dt = now_ns - self._last_slow if self._last_slow is not None else int(self.interval_s * 1e9)
            self._last_slow = now_ns
            slow = self._read_slow(nv, handle)
        with self._lock:
            if probe is not None:
                self._corr.observe(probe)
            if isinstance(util, float):
                self._add_util(prev_tick, now_ns, util)
            elif util is not None:
                self._take_samples(*util, now_ns, offset_ns)
            if memory is not None:
                for w in (self._win, self._grp, self._all):
                    w.mem_total = int(memory.total)
                    w.mem_used_max = max(w.mem_used_max or 0, int(memory.used))
            if slow is not None:
                self._add_slow(*slow, dt)

    def _read_util(self, nv: Any, handle: Any) -> tuple[int, Sequence[Any]] | float | None:
        """Utilization since the last tick: (value type, samples) from ``nvmlDeviceGetSamples``,
        else one rate (a fraction), else None."""
        if "util" in self._off:
            return None
        if not self._use_rates:
            try:
                value_type, samples = nv.nvmlDeviceGetSamples(handle, _UTIL_SAMPLES, self._last_ts_us)
            except nv.NVMLError as err:
                code = getattr(err, "value", None)
                if code == _NOT_FOUND:  # no sample newer than the last one seen
                    self._samples_missing += 1
                    if self._samples_missing * self.interval_s < 5.0 or self._period_ns is not None:
                        return None
                    self.note("NVML returned no utilization samples for 5 s; reading utilization rates instead")
                elif code in (_NOT_SUPPORTED, _FUNCTION_NOT_FOUND, _NO_PERMISSION):
                    if not self._mig:  # on MIG the rates fail too, and that note says why
                        label = _METRIC_LABELS["samples"]
                        self.note(f"NVML: {label} not available ({_text(err)}); using utilization rates")
                elif code == _GPU_IS_LOST:
                    raise
                else:
                    self._metric_off("util", err)
                    return None
                self._use_rates = True
            else:
                self._samples_missing = 0
                self._worked.add("util")
                return int(value_type), samples
        rates = self._try("util", nv.nvmlDeviceGetUtilizationRates, handle)
        return None if rates is None else float(rates.gpu) / 100.0

    def _take_samples(self, value_type: int, samples: Sequence[Any], now_ns: int, offset_ns: int) -> None:
        last = self._last_ts_us
        fresh = sorted((int(s.timeStamp), _value(value_type, s)) for s in samples if int(s.timeStamp) > last)
        if not fresh:
            return
        self._last_ts_us = fresh[-1][0]
        newest = fresh[-1][0] * 1000 - offset_ns
        if abs(newest - now_ns) > 60_000_000_000 and not self._ts_shift_ns:
            # not on the wall clock after all: line the newest sample up with its arrival
            self._ts_shift_ns = now_ns - newest
            self.note("NVML sample timestamps are not on the wall clock; they were aligned by arrival time")
        start = self._start_ns if self._start_ns is not None else -(2**62)
        for ts_us, util in fresh:
            prev, self._prev_sample_us = self._prev_sample_us, ts_us
            if not prev:
                continue  # the first sample: its period is not known yet
            gap_ns = (ts_us - prev) * 1000
            # the sample period is the smallest gap seen; a larger gap means samples were lost
            if self._period_ns is None or 0 < gap_ns < self._period_ns:
                self._period_ns = gap_ns
            period = min(self._period_ns, gap_ns)
            end_ns = ts_us * 1000 - offset_ns + self._ts_shift_ns
            if end_ns - period >= start:  # older samples predate the run
                self._add_util(end_ns - period, end_ns, util)

    def _add_util(self, start_ns: int, end_ns: int, util: float) -> None:
        if util < 0:
            return
        util = min(1.0, util)
        period = end_ns - start_ns
        if period <= 0:
            return
        self._ring.append(UtilSample(end_ns, period, util))
        shares, covered, exact = self._corr.shares(start_ns, end_ns)
        for w in (self._win, self._grp, self._all):
            w.util.add_sample(util, period)
            w.util.add_row(shares, covered, util, exact=exact)

    def _read_slow(self, nv: Any, handle: Any) -> tuple[Any, Any, int | None, Any]:
        """(power, SM clock, clock-event reasons, temperature); None where not available."""
        power = self._try("power", nv.nvmlDeviceGetPowerUsage, handle)
        clock = self._try("clock", nv.nvmlDeviceGetClockInfo, handle, _CLOCK_SM)
        reasons = self._reasons(nv, handle)
        temp = self._try("temperature", nv.nvmlDeviceGetTemperature, handle, _TEMPERATURE_GPU)
        return power, clock, reasons, temp

    def _add_slow(self, power: Any, clock: Any, reasons: int | None, temp: Any, dt_ns: int) -> None:
        for w in (self._win, self._grp, self._all):
            if power is not None:
                watts = power / 1000.0
                w.power_sum += watts
                w.power_n += 1
                w.power_max = max(w.power_max or 0.0, watts)
            if clock is not None:
                w.clock_sum += clock
                w.clock_n += 1
            if temp is not None:
                w.temp_max = max(w.temp_max or 0.0, float(temp))
            if reasons is None:
                continue
            w.reasons_seen = True
            if reasons & GPU_IDLE:
                continue
            w.busy_ns += dt_ns
            for key, mask in THROTTLE_REASONS.items():
                if reasons & mask:
                    w.throttle_ns[key] += dt_ns
            if reasons & THROTTLE_ANY:
                w.throttle_ns["any"] += dt_ns
                if clock is not None:
                    w.clock_thr_sum += clock
                    w.clock_thr_n += 1
            elif clock is not None:
                w.clock_free_sum += clock
                w.clock_free_n += 1

    def _reasons(self, nv: Any, handle: Any) -> int | None:
        if "reasons" in self._off:
            return None
        try:
            return int(nv.nvmlDeviceGetCurrentClocksEventReasons(handle))
        except nv.NVMLError as err:
            if getattr(err, "value", None) != _FUNCTION_NOT_FOUND:  # older drivers: the old name
                self._metric_off("reasons", err)
                return None
        value = self._try("reasons", nv.nvmlDeviceGetCurrentClocksThrottleReasons, handle)
        return None if value is None else int(value)

    def _try(self, key: str, fn: Callable[..., Any], *args: Any, quiet: bool = False) -> Any:
        """Call one NVML getter; an NVML error turns that metric off (with a note unless quiet)."""
        if key in self._off:
            return None
        try:
            value = fn(*args)
        except self._nv.NVMLError as err:
            if getattr(err, "value", None) == _GPU_IS_LOST:
                raise
            if quiet:
                self._off.add(key)
            else:
                self._metric_off(key, err)
            return None
        self._worked.add(key)
        return value

    def _metric_off(self, key: str, err: Any) -> None:
        self._off.add(key)
        label = _METRIC_LABELS.get(key, key)
        if key in self._worked:
            self.note(f"NVML: {label} stopped working during the run ({_text(err)})")
            if key == "util":
                self._util_stopped()
        elif key == "util" and self._mig:
            self.note("NVML reports no utilization for MIG instances; the idle fraction comes from host phases")
        else:
            self.note(f"NVML: {label} not available on this GPU ({_text(err)})")

    def _turned_off(self) -> None:
        if "util" in self._worked:
            self._util_stopped()

    def _util_stopped(self) -> None:
        self.note(
            "NVML stopped measuring utilization part-way through the run: the run's idle fraction, and "
            "that of the epoch it stopped in and of later ones, come from host phases (1 - compute share)"
        )

    @property
    def util_stopped(self) -> bool:
        """Utilization was measured, then stopped before now: what was measured covers part of the run."""
        return "util" in self._worked and (not self._enabled or "util" in self._off)

    # -- summaries (training thread) -----------------------------------------------------

    def close_window(self) -> NvmlSummary | None:
        return self.window_summary(self.mark_window())

    def _swap_window(self) -> _Window:
        window, self._win = self._win, _Window()
        return window

    def mark_window(self) -> object:
        """``close_window`` for an epoch whose close waits: the window's samples are set aside now
        (nothing adds to them after), with whether utilization had stopped by then, summarised by
        ``window_summary`` when the epoch is closed."""
        return (self._with_lock(self._swap_window), self.util_stopped)

    def window_summary(self, mark: object) -> NvmlSummary | None:
        """The summary of a window ``mark_window`` set aside."""
        if not isinstance(mark, tuple) or len(mark) != 2 or not isinstance(mark[0], _Window):
            return None
        window, partial = mark
        return self._summary(window, util_partial=bool(partial))

    def close_group(self) -> NvmlSummary | None:
        """The summary of the group's window (every epoch since the previous call); starts the next."""
        window = self._with_lock(self._swap_group)
        return self._summary(window) if window is not None else None

    def _swap_group(self) -> _Window:
        window, self._grp = self._grp, _Window()
        return window

    def run_summary(self) -> NvmlSummary | None:
        return self._with_lock(lambda: self._summary(self._all))

    def _summary(self, w: _Window, *, util_partial: bool | None = None) -> NvmlSummary | None:
        if self._handle is None:
            return None
        names = self._phase_names()
        util = w.util
        busy = w.busy_ns
        return NvmlSummary(
            index=self.index if isinstance(self.index, int) else None,
            uuid=self.uuid,
            name=self.device_name,
            util_samples=util.samples,
            util_mean=util.mean(),
            util_p10=util.quantile(0.10),
            util_p50=util.quantile(0.50),
            util_p90=util.quantile(0.90),
            util_by_phase={names[p] if p < len(names) else f"phase{p}": u for p, u in util.by_phase().items()},
            phase_resolution=util.resolution(),
            util_source=None if util.samples == 0 else "rates" if self._use_rates else "samples",
            mem_used_max_bytes=w.mem_used_max,
            mem_total_bytes=w.mem_total,
            power_mean_w=w.power_sum / w.power_n if w.power_n else None,
            power_max_w=w.power_max,
            power_limit_w=self._power_limit,
            power_default_limit_w=self._power_default_limit,
            sm_clock_mean_mhz=w.clock_sum / w.clock_n if w.clock_n else None,
            sm_clock_max_mhz=self._clock_max,
            sm_clock_throttled_mhz=w.clock_thr_sum / w.clock_thr_n if w.clock_thr_n else None,
            sm_clock_unthrottled_mhz=w.clock_free_sum / w.clock_free_n if w.clock_free_n else None,
            throttle={k: v / busy for k, v in w.throttle_ns.items()} if w.reasons_seen and busy > 0 else {},
            temperature_max_c=w.temp_max,
            util_partial=self.util_stopped if util_partial is None else util_partial,
        )


_VALUE_FIELDS = ("dVal", "uiVal", "ulVal", "ullVal", "sllVal", "siVal", "usVal")


def _value(value_type: int, sample: Any) -> float:
    """A utilization sample's value as a fraction (NVML gives whole percents)."""
    name = _VALUE_FIELDS[value_type] if 0 <= value_type < len(_VALUE_FIELDS) else "uiVal"
    return float(getattr(sample.sampleValue, name)) / 100.0


def _text(err: Any) -> str:
    try:
        return str(err)
    except Exception:
        return type(err).__name__
