"""``summary.nvml`` and where ``gpu_idle_fraction`` comes from (report/build.py)."""

from __future__ import annotations

import json

import pytest
from signal_fakes import context, cuda, nvml, record_span

from stallscope.analysis.device_model import device_view
from stallscope.report.build import device_idle, nvml_fields, summarize
from stallscope.report.schema import summary_from_dict, summary_to_dict

SPAN = record_span(steps=10, data_ms=60, compute_ms=40)  # host phases: idle 60%


def test_nvml_fields_are_fractions_and_keep_the_spec_keys() -> None:
    fields = nvml_fields(
        nvml(
            util_mean=0.37,
            util_p10=0.0,
            util_p50=0.4,
            util_by_phase={"data": 0.02, "compute": 0.951234},
            mem_used_max_bytes=8,
            mem_total_bytes=16,
            throttle={"power": 0.25, "any": 0.25},
        )
    )
    assert fields is not None
    assert fields["util_mean"] == 0.37
    assert fields["util_by_phase"] == {"data": 0.02, "compute": 0.9512}
    assert fields["mem_used_max_fraction"] == 0.5
    assert fields["throttle"] == {"power": 0.25, "any": 0.25}
    assert fields["device"] == {"index": 0, "uuid": "GPU-1", "name": "Fake GPU"}
    assert "power_mean_w" not in fields  # not reported by this GPU: left out


def test_a_gpu_without_utilization_still_has_the_spec_keys() -> None:
    fields = nvml_fields(nvml(util_mean=None, util_samples=0, mem_used_max_bytes=None, mem_total_bytes=None))
    assert fields is not None
    assert {k: fields[k] for k in ("util_mean", "util_p10", "util_p50", "mem_used_max_bytes")} == dict.fromkeys(
        ("util_mean", "util_p10", "util_p50", "mem_used_max_bytes")
    )
    assert fields["util_by_phase"] == {}
    assert nvml_fields(None) is None


def test_idle_fraction_prefers_cuda_events_then_nvml_then_host_phases() -> None:
    events = cuda(busy_ns=int(0.3 * SPAN.wall_ns), phases=10)
    assert device_idle(SPAN, events, nvml(util_mean=0.5)) == (pytest.approx(0.7), "cuda_events")
    assert device_idle(SPAN, cuda(phases=0), nvml(util_mean=0.5)) == (0.5, "nvml")
    # a short window that borrowed the run's busy time per phase is still a CUDA-event measure
    borrowed = cuda(busy_ns=int(0.3 * SPAN.wall_ns), phases=0, borrowed=True)
    assert device_idle(SPAN, borrowed, nvml(util_mean=0.5)) == (pytest.approx(0.7), "cuda_events")
    assert device_idle(SPAN, None, nvml(util_mean=None)) == (None, "host_phases")
    idle, source = device_idle(SPAN, None, nvml(util_mean=0.25))
    summary = summarize(SPAN, idle_fraction=idle, idle_source=source, nvml=nvml_fields(nvml(util_mean=0.25)))
    assert (summary.gpu_idle_fraction, summary.idle_source) == (0.75, "nvml")
    idle, source = device_idle(SPAN, None, None)
    summary = summarize(SPAN, idle_fraction=idle, idle_source=source)
    assert (summary.gpu_idle_fraction, summary.idle_source) == (pytest.approx(0.6), "host_phases")


def test_the_rules_take_a_borrowed_cuda_window_as_the_devices_busy_time() -> None:
    """``device_view`` (what the device-side rules read): a window with no resolved phase of its
    own but the run's busy time per phase is a CUDA-event measure, not NVML's."""
    borrowed = cuda(busy_ns=int(0.3 * SPAN.wall_ns), phases=0, borrowed=True)
    view = device_view(context(SPAN, cuda=borrowed, nvml=nvml(util_mean=0.9, util_samples=50)))
    assert view is not None
    assert (view.source, view.busy) == ("cuda_events", pytest.approx(0.3))
    view = device_view(context(SPAN, cuda=cuda(phases=0), nvml=nvml(util_mean=0.9, util_samples=50)))
    assert view is not None
    assert view.source == "nvml"


def test_the_nvml_summary_survives_the_json_round_trip() -> None:
    fields = nvml_fields(nvml(util_mean=0.5, util_by_phase={"data": 0.1}))
    summary = summarize(SPAN, idle_fraction=0.5, idle_source="nvml", nvml=fields)
    again = summary_from_dict(json.loads(json.dumps(summary_to_dict(summary))), "summary")
    assert again.nvml == fields
