"""Whole StallScope runs against the scripted NVML stand-in, each in a subprocess.

The subprocess finds the stub as ``libnvidia-ml.so.1`` through ``LD_LIBRARY_PATH``, exactly as
pynvml finds the real driver library, and runs a small plain loop with ``nvml_device=0`` (torch
itself stays on the CPU). The loop tells the stub when "kernels run" (``stubnvml_set_busy``), so
the GPU is busy during compute and idle while the loop waits for data; the assertions compare the
report with that script and with the report's own phase shares, never with the wall clock.
"""

from __future__ import annotations

import ctypes.util
import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import nvml_stub
import pytest
from conftest import notes_but_the_hosts

LOOP = r"""
import ctypes, json, os, sys, time

cfg = json.loads(sys.argv[1])
if cfg["cores"]:
    os.sched_setaffinity(0, set(sorted(os.sched_getaffinity(0))[: cfg["cores"]]))
from stallscope import StallScope

try:
    gpu = ctypes.CDLL("libnvidia-ml.so.1")
    busy = gpu.stubnvml_set_busy
except (OSError, AttributeError):
    busy = lambda on: None

def batches():
    for i in range(cfg["steps"]):
        busy(cfg["busy_in_data"])
        time.sleep(cfg["data_s"])  # waiting on storage: no CPU
        yield i

with StallScope(cfg["report_dir"], console=False, nvml_device=cfg["nvml_device"], sample_interval_s=0.05) as scope:
    for epoch in range(cfg["epochs"]):
        for batch in scope.iter(batches()):
            with scope.phase("compute"):
                busy(1)
                time.sleep(cfg["compute_s"])
                busy(0)
"""


@pytest.fixture(scope="module")
def libs(tmp_path_factory: pytest.TempPathFactory) -> Callable[..., Path]:
    """Build the stub (once per set of left-out functions); returns its folder."""
    if nvml_stub.gcc() is None:
        pytest.skip("gcc is not available to build the stand-in libnvidia-ml.so.1")
    built: dict[tuple[str, ...], Path] = {}

    def get(*omit: str) -> Path:
        key = tuple(sorted(omit))
        if key not in built:
            built[key] = nvml_stub.build(tmp_path_factory.mktemp("nvml"), omit=key).parent
        return built[key]

    return get


def run_loop(
    tmp_path: Path,
    lib_dir: Path | None,
    *,
    steps: int = 14,
    epochs: int = 1,
    data_s: float = 0.04,
    compute_s: float = 0.03,
    busy_in_data: int = 0,
    nvml_device: int | str | None = 0,
    cores: int = 0,
    **script: Any,
) -> dict[str, Any]:
    tmp_path.mkdir(parents=True, exist_ok=True)
    report_dir = tmp_path / "report"
    cfg = {
        "report_dir": str(report_dir),
        "steps": steps,
        "epochs": epochs,
        "data_s": data_s,
        "compute_s": compute_s,
        "busy_in_data": busy_in_data,
        "nvml_device": nvml_device,
        "cores": cores,
    }
    script.setdefault("busy_util", 95)
    script.setdefault("idle_util", 2)
    script.setdefault("sample_period_us", 10_000)
    env = dict(os.environ)
    env["STUBNVML_SCRIPT"] = str(nvml_stub.write_script(tmp_path / "script.txt", **script))
    env["LD_LIBRARY_PATH"] = str(lib_dir) if lib_dir is not None else str(tmp_path / "no-driver-here")
    proc = subprocess.run(
        [sys.executable, "-c", LOOP, json.dumps(cfg)], env=env, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr
    report: dict[str, Any] = json.loads((report_dir / "report.json").read_text())
    return report


def finding(report: dict[str, Any], fid: str) -> dict[str, Any] | None:
    return next((f for f in report["findings"] if f["id"] == fid), None)


#: slow reads on one core: more workers hide only part of the wait, faster storage the rest
SLOW_READS: dict[str, Any] = {"steps": 8, "data_s": 0.2, "compute_s": 0.02, "cores": 1}


def test_a_starved_loop_idles_the_gpu_during_data_waits(tmp_path: Path, libs: Callable[..., Path]) -> None:
    """20 steps: about 90 samples 50 ms apart, 9% of the time in compute. Where other processes
    share the core the samples land about at random: with 8 steps (36 samples) none landed in a
    compute phase once under ``make test-busy`` (a chance of about 3% at random; 0.03% with 20)."""
    report = run_loop(tmp_path, libs(), **{**SLOW_READS, "steps": 20})
    summary = report["summary"]
    nvml = summary["nvml"]
    assert summary["idle_source"] == "nvml"
    assert nvml["util_by_phase"]["data"] <= 0.1  # the script: 2% while idle
    assert nvml["util_by_phase"]["compute"] >= 0.85  # 95% while busy
    compute = summary["phase_fractions"]["compute"]
    expected_util = 0.95 * compute + 0.02 * (1 - compute)
    assert nvml["util_mean"] == pytest.approx(expected_util, abs=0.05)
    assert summary["gpu_idle_fraction"] == pytest.approx(1 - nvml["util_mean"], abs=1e-3)
    assert nvml["device"] == {"index": 0, "uuid": "GPU-5afe0000-0000-0000-0000-000000000000", "name": "Stub GPU"}
    assert nvml["mem_total_bytes"] == 17179869184
    assert all(0.0 <= v <= 1.0 for v in nvml["util_by_phase"].values())
    assert report["epochs"][0]["summary"]["idle_source"] == "nvml"
    assert notes_but_the_hosts(report["notes"]) == []  # (a busy host's note aside: 4.4 s of sampling)
    # the ranking: waiting on storage while the GPU idles is worth fixing, and it says so
    io = finding(report, "data.io_bound")
    assert io is not None
    assert io["evidence"]["gpu_util_during_data"] <= 0.1


def test_the_ranking_discounts_data_waits_the_gpu_works_through(tmp_path: Path, libs: Callable[..., Path]) -> None:
    """The same loop, but the GPU stays busy while the loop waits (work queued earlier still
    running): faster storage gains only the little time the GPU was idle, and ranks lower."""
    idle = run_loop(tmp_path / "idle", libs(), busy_util=100, idle_util=0, **SLOW_READS)
    busy = run_loop(tmp_path / "busy", libs(), busy_util=100, idle_util=0, busy_in_data=1, **SLOW_READS)
    assert busy["summary"]["nvml"]["util_by_phase"]["data"] >= 0.85
    assert busy["summary"]["gpu_idle_fraction"] < 0.2 < idle["summary"]["gpu_idle_fraction"]
    idle_io = finding(idle, "data.io_bound")
    busy_io = finding(busy, "data.io_bound")
    assert idle_io is not None
    data_share = busy["summary"]["phase_fractions"]["data"]
    gpu_idle_in_data = data_share * (1 - busy["summary"]["nvml"]["util_by_phase"]["data"])
    if busy_io is not None:
        assert busy_io["est_saving_fraction"] <= gpu_idle_in_data + 1e-3
        assert busy_io["est_saving_fraction"] < idle_io["est_saving_fraction"] / 2


def test_partial_nvml_degrades_metric_by_metric(tmp_path: Path, libs: Callable[..., Path]) -> None:
    lib = libs("nvmlDeviceGetSamples", "nvmlDeviceGetCurrentClocksEventReasons")
    # the power cap is on whenever the reasons are read, idle or busy: the reads come once a
    # second, at whatever point of the step (a read only while busy came in none of a 2 s run's
    # two or three reads now and then on a busy machine)
    report = run_loop(
        tmp_path,
        lib,
        steps=30,
        fail={"nvmlDeviceGetPowerUsage": 3},
        reasons_busy=0x4,
        reasons_idle=0x4,
        sm_clock_busy=1200,
    )
    nvml = report["summary"]["nvml"]
    assert nvml["util_source"] == "rates"  # nvmlDeviceGetSamples is missing from this "driver"
    assert report["summary"]["idle_source"] == "nvml"
    assert "power_mean_w" not in nvml
    assert nvml["throttle"]["power"] > 0.5  # read through the older ThrottleReasons name
    assert "NVML: utilization samples not available (Function Not Found); using utilization rates" in report["notes"]
    assert "NVML: power draw not available on this GPU (Not Supported)" in report["notes"]


def test_no_utilization_at_all_falls_back_to_host_phases(tmp_path: Path, libs: Callable[..., Path]) -> None:
    lib = libs("nvmlDeviceGetSamples", "nvmlDeviceGetUtilizationRates")
    report = run_loop(tmp_path, lib)
    assert report["summary"]["idle_source"] == "host_phases"
    assert report["summary"]["nvml"]["util_mean"] is None
    assert report["summary"]["nvml"]["util_by_phase"] == {}
    assert report["summary"]["nvml"]["mem_total_bytes"] == 17179869184
    assert "NVML: GPU utilization not available on this GPU (Function Not Found)" in report["notes"]


@pytest.mark.skipif(ctypes.util.find_library("nvidia-ml") is not None, reason="a real NVIDIA driver is installed")
def test_no_driver_library_is_a_note_not_an_error(tmp_path: Path) -> None:
    report = run_loop(tmp_path, None)
    assert report["summary"]["idle_source"] == "host_phases"
    assert "nvml" not in report["summary"]
    assert report["notes"] == ["nvml sampling is off: the NVIDIA driver's libnvidia-ml.so.1 was not found"]
    assert report["summary"]["steps"] == 14


def test_nvml_device_by_uuid_on_a_two_gpu_box(tmp_path: Path, libs: Callable[..., Path]) -> None:
    uuid = "GPU-5afe0000-0000-0000-0000-000000000001"
    report = run_loop(tmp_path, libs(), devices=2, nvml_device=uuid, steps=6)
    assert report["summary"]["nvml"]["device"]["index"] == 1
    assert report["summary"]["nvml"]["device"]["uuid"] == uuid
