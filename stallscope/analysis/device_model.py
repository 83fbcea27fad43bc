"""The accelerator's side of a span, from NVML and CUDA events, in shares of wall time.

The host timeline says which phase the loop was in; the device signals say how busy the GPU
was meanwhile. With

    c    share of wall time the loop spent in the compute phase
    u_c  GPU utilization while the loop was in compute (NVML, per phase)
    u_o  GPU utilization while it was anywhere else
    B    share of wall time the GPU was busy: c * u_c + (1 - c) * u_o

the device-side rules (``host.sync``, ``host.overhead``, ``compute.amp``, ``compute.batch_size``,
``gpu.throttle``, ``data.pin_memory``) reason about what a change would move: the device's work
``B`` or the host's time during which the device had nothing to do.
"""

from __future__ import annotations

from dataclasses import dataclass

from stallscope.analysis.context import Context
from stallscope.timeline.phases import COMPUTE, DATA

#: NVML utilization samples a span needs before its numbers are used
MIN_UTIL_SAMPLES = 8


@dataclass(frozen=True)
class DeviceView:
    """How busy the accelerator was over a span. Shares of wall time, all in [0, 1]."""

    #: share of wall time the device was busy
    busy: float
    #: where ``busy`` came from: ``nvml`` or ``cuda_events``
    source: str
    #: share of wall time in the compute phase (host side)
    compute_share: float
    #: GPU utilization while the loop was in compute / waiting for data; None when NVML could not
    #: tell (see ``NvmlSummary.util_by_phase``)
    util_compute: float | None
    util_data: float | None
    #: whether torch itself runs on CUDA (device-side advice applies to torch's work)
    on_cuda: bool

    @property
    def util_outside_compute(self) -> float | None:
        """Utilization while the loop was not in compute, from the mean and the compute share."""
        if self.util_compute is None or self.compute_share >= 0.999:
            return None
        rest = (self.busy - self.compute_share * self.util_compute) / (1.0 - self.compute_share)
        return min(1.0, max(0.0, rest))


def device_view(ctx: Context) -> DeviceView | None:
    """The device side of ``ctx``'s span; None when no GPU was observed."""
    span = ctx.span
    if span.wall_ns <= 0:
        return None
    on_cuda = ctx.cuda_device is not None or ctx.cuda is not None
    compute_share = span.phase_fraction(COMPUTE)
    nvml = ctx.nvml
    util_ok = nvml is not None and nvml.util_mean is not None and nvml.util_samples >= MIN_UTIL_SAMPLES
    by_phase = nvml.util_by_phase if nvml is not None and util_ok else {}
    if ctx.cuda is not None and ctx.cuda.timed:
        busy, source = min(1.0, ctx.cuda.busy_ns / span.wall_ns), "cuda_events"
    elif nvml is not None and nvml.util_mean is not None and util_ok:
        busy, source = nvml.util_mean, "nvml"
    else:
        return None
    return DeviceView(
        busy=busy,
        source=source,
        compute_share=compute_share,
        util_compute=by_phase.get(COMPUTE),
        util_data=by_phase.get(DATA),
        on_cuda=on_cuda,
    )


def cap_by_device_idle(saving: float, ctx: Context, phase: str = DATA) -> float:
    """A saving on ``phase`` recovers at most the time the GPU sat idle during it: when NVML saw the
    GPU busy while the loop waited (work queued earlier still running), shortening the wait gains
    less. Without a per-phase utilization the saving is returned unchanged."""
    nvml = ctx.nvml
    if nvml is None or nvml.util_samples < MIN_UTIL_SAMPLES or phase not in nvml.util_by_phase:
        return saving
    idle_in_phase = ctx.span.phase_fraction(phase) * (1.0 - nvml.util_by_phase[phase])
    return min(saving, idle_in_phase)
