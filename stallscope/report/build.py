"""Turn timeline statistics into report summaries."""

from __future__ import annotations

from array import array
from collections.abc import Mapping
from typing import Any

from stallscope.report.schema import Summary
from stallscope.signals.cuda_events import CudaSummary
from stallscope.signals.nvml import NvmlSummary
from stallscope.timeline.phases import COMPUTE
from stallscope.timeline.stats import Distribution, IdleWindow, SpanSnapshot, SpanStats, native_summary_numbers


def _dist(d: Distribution) -> dict[str, float]:
    if not (d.max or d.mean):  # no wait at all (most loops' data_wait_s): round() is the cost here
        return dict.fromkeys(("mean", "p10", "p50", "p90", "max"), 0.0)
    return {
        "mean": round(d.mean, 6),
        "p10": round(d.p10, 6),
        "p50": round(d.p50, 6),
        "p90": round(d.p90, 6),
        "max": round(d.max, 6),
    }


def phase_fractions(span: SpanStats | SpanSnapshot) -> dict[str, float]:
    """Fractions of wall time per phase, rounded so that they still sum to 1."""
    wall = span.wall_ns
    if wall <= 0:
        return dict.fromkeys(span.phase_ns, 0.0)
    # one pass (every epoch's report makes one): rounded fractions and the first largest of them
    rounded: dict[str, float] = {}
    largest = ""
    top = -1.0
    for name, ns in span.phase_ns.items():
        value = rounded[name] = round(ns / wall, 6) if ns > 0 else 0.0
        if value > top:
            largest, top = name, value
    if not rounded:
        return rounded
    # put the rounding residue on the largest phase so the sum is 1 to 6 decimals
    rounded[largest] = round(min(1.0, max(0.0, top + 1.0 - sum(rounded.values()))), 6)
    return rounded


def _r(value: float | None, digits: int = 4) -> float | None:
    return None if value is None else round(value, digits)


def _frac(value: float | None) -> float | None:
    return None if value is None else round(min(1.0, max(0.0, value)), 4)


def nvml_fields(nvml: NvmlSummary | None) -> dict[str, Any] | None:
    """``summary.nvml`` (SPEC §3): NVML aggregates of a span, every fraction in [0, 1]; None when
    no GPU was sampled. The SPEC's fields are always there (null when the GPU did not report
    them); other metrics the GPU did not report are left out."""
    if nvml is None:
        return None
    fields: dict[str, Any] = {
        "util_mean": _frac(nvml.util_mean),
        "util_p10": _frac(nvml.util_p10),
        "util_p50": _frac(nvml.util_p50),
        "util_p90": _frac(nvml.util_p90),
        "util_samples": nvml.util_samples,
        "util_source": nvml.util_source,
        "util_by_phase": {name: _frac(u) for name, u in nvml.util_by_phase.items()},
        "phase_resolution": _frac(nvml.phase_resolution),
        "mem_used_max_bytes": nvml.mem_used_max_bytes,
        "mem_total_bytes": nvml.mem_total_bytes,
        "mem_used_max_fraction": _frac(nvml.mem_used_max_bytes / nvml.mem_total_bytes)
        if nvml.mem_used_max_bytes is not None and nvml.mem_total_bytes
        else None,
        "power_mean_w": _r(nvml.power_mean_w, 1),
        "power_max_w": _r(nvml.power_max_w, 1),
        "power_limit_w": _r(nvml.power_limit_w, 1),
        "power_default_limit_w": _r(nvml.power_default_limit_w, 1),
        "sm_clock_mean_mhz": _r(nvml.sm_clock_mean_mhz, 1),
        "sm_clock_max_mhz": _r(nvml.sm_clock_max_mhz, 1),
        "throttle": {k: _frac(v) for k, v in nvml.throttle.items()},
        "temperature_max_c": _r(nvml.temperature_max_c, 1),
        "device": {k: v for k, v in (("index", nvml.index), ("uuid", nvml.uuid), ("name", nvml.name)) if v is not None},
        "util_partial": True if nvml.util_partial else None,
    }
    always = ("util_mean", "util_p10", "util_p50", "util_by_phase", "mem_used_max_bytes", "mem_total_bytes")
    return {k: v for k, v in fields.items() if k in always or (v is not None and v != {})}


def device_idle(
    span: SpanStats | SpanSnapshot, cuda: CudaSummary | None, nvml: NvmlSummary | None
) -> tuple[float | None, str]:
    """The best measurement of the accelerator's idle fraction over ``span`` and its source:
    CUDA events (device-side busy time of the compute phase), else NVML utilization, else None
    (``summarize`` then uses the host phases). NVML utilization that stopped part-way through
    the span is not used: the headline covers the whole span from one source."""
    if cuda is not None and cuda.timed and span.wall_ns > 0:
        return min(1.0, max(0.0, 1.0 - cuda.busy_ns / span.wall_ns)), "cuda_events"
    if nvml is not None and nvml.idle_fraction is not None and not nvml.util_partial:
        return min(1.0, max(0.0, nvml.idle_fraction)), "nvml"
    return None, "host_phases"


def summarize(
    span: SpanStats | SpanSnapshot,
    *,
    idle_fraction: float | None = None,
    idle_source: str = "host_phases",
    nvml: Mapping[str, Any] | None = None,
) -> Summary:
    """A report summary of ``span``. Without a device measurement the idle fraction is
    ``1 - compute share`` (``host_phases``). A snapshot (an epoch's) is summarised from its own
    numbers, as ``summarize(snapshot.stats())`` would, without the ``SpanStats`` a summary does
    not need: what a report made of many short epochs makes once for each of them."""
    step: Distribution
    data_wait: Distribution
    idle_windows: tuple[IdleWindow, ...]
    if isinstance(span, SpanSnapshot):
        made = span.made
        idle_windows = made.windows if made is not None else ()  # a span made from it has none
        if not idle_windows:  # an epoch's: its numbers in C where they can be
            quick = _from_numbers(span, idle_fraction, idle_source, nvml)
            if quick is not None:
                return quick
        step, data_wait = Distribution.of(span.step), Distribution.of(span.data_wait)
    else:
        step, data_wait, idle_windows = span.step, span.data_wait, span.windows
    wall_ns = span.wall_ns
    fractions = phase_fractions(span)
    if idle_fraction is None:
        idle_fraction = 1.0 - span.phase_ns.get(COMPUTE, 0) / wall_ns if wall_ns > 0 else 0.0
        idle_source = "host_phases"
    windows = (
        tuple(
            {
                "steps": w.steps,
                "wall_s": round(w.wall_ns / 1e9, 6),
                "idle_fraction": round(w.idle_fraction, 6),
            }
            for w in idle_windows
        )
        if idle_windows  # an epoch's: none
        else ()
    )
    wall_s = wall_ns / 1e9
    return Summary(
        wall_s=round(wall_s, 6),
        steps=span.steps,
        steps_per_s=round(span.steps / wall_s, 4) if wall_ns > 0 else 0.0,
        gpu_idle_fraction=round(min(1.0, max(0.0, idle_fraction)), 6),
        idle_source=idle_source,
        phase_fractions=fractions,
        phase_seconds={name: round(ns / 1e9, 6) if ns else 0.0 for name, ns in span.phase_ns.items()},
        step_time_s=_dist(step),
        data_wait_s=_dist(data_wait),
        nvml=nvml,
        idle_windows=windows,
    )


def _from_numbers(
    span: SpanSnapshot, idle_fraction: float | None, idle_source: str, nvml: Mapping[str, Any] | None
) -> Summary | None:
    """``summarize`` of an epoch's snapshot, its numbers made in C (``_native.summary_numbers``,
    each the same double as the code above makes: ``tests/test_native.py`` holds them so);
    None where they are not (no C module, numbers it leaves to Python)."""
    step, data_wait, phase_ns = span.step, span.data_wait, span.phase_ns
    if (
        native_summary_numbers is None
        or type(step) is not array
        or type(data_wait) is not array
        or step.typecode != "q"
        or data_wait.typecode != "q"
        or type(phase_ns) is not dict
    ):
        return None
    numbers = native_summary_numbers(step, data_wait, phase_ns, span.wall_ns, span.steps, COMPUTE)
    if numbers is None:
        return None
    wall_s, steps_per_s, idle, fractions, largest, top, seconds, step_time, data_wait_s = numbers
    if largest is not None:  # phase_fractions' residue, on the largest, so that they sum to 1
        fractions[largest] = round(min(1.0, max(0.0, top + 1.0 - sum(fractions.values()))), 6)
    if idle_fraction is None:
        idle_fraction, idle_source = idle, "host_phases"
    return Summary(
        wall_s=wall_s,
        steps=span.steps,
        steps_per_s=steps_per_s,
        gpu_idle_fraction=round(min(1.0, max(0.0, idle_fraction)), 6),
        idle_source=idle_source,
        phase_fractions=fractions,
        phase_seconds=seconds,
        step_time_s=step_time,
        data_wait_s=data_wait_s,
        nvml=nvml,
        idle_windows=(),
    )
