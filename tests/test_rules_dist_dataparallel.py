"""``dist.dataparallel``: the rule on hand-made spans, and the seam that finds ``nn.DataParallel``
in a model (no GPU here: a wrapper's ``device_ids`` are set by hand where CUDA would fill them)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from signal_fakes import context, cuda, record_span
from torch import nn

from stallscope import StallScope
from stallscope.analysis.rules import dist_dataparallel
from stallscope.hooks.distributed import data_parallel_devices

# 20 steps of 10 ms data and 40 ms compute: 1 s, compute 80%
SPAN = record_span(steps=20, data_ms=10, compute_ms=40)


def test_host_work_outside_compute_is_split_across_the_gpus() -> None:
    f = dist_dataparallel.rule(context(SPAN, data_parallel_devices=4))
    assert f is not None
    # no CUDA events: compute counts as busy; 0.2 s of data becomes 0.05 s
    assert f.est_saving_fraction == pytest.approx(0.15, abs=1e-3)
    assert f.suggestion == {"strategy": "ddp", "devices": 4}
    assert "DistributedDataParallel" in f.fix


def test_the_gpu_idle_inside_compute_is_split_too() -> None:
    # the first GPU was busy 0.4 s of the 0.8 s of compute
    ctx = context(SPAN, data_parallel_devices=2, cuda=cuda(busy_ns=400_000_000, phases=20))
    f = dist_dataparallel.rule(ctx)
    assert f is not None
    # new step time: 0.4 busy + (0.2 outside + 0.4 idle) / 2 = 0.7 s of 1.0 s
    assert f.est_saving_fraction == pytest.approx(0.3, abs=1e-3)
    assert f.evidence["gpu_idle_in_compute_fraction"] == pytest.approx(0.4, abs=1e-3)
    # a short window that borrowed the run's busy time per phase reads the same
    borrowed = context(SPAN, data_parallel_devices=2, cuda=cuda(busy_ns=400_000_000, phases=0, borrowed=True))
    g = dist_dataparallel.rule(borrowed)
    assert g is not None
    assert g.est_saving_fraction == pytest.approx(0.3, abs=1e-3)
    assert g.evidence["cuda_events"] is True


@pytest.mark.parametrize("devices", [None, 0, 1])
def test_not_without_a_wrapper_over_several_gpus(devices: int | None) -> None:
    assert dist_dataparallel.rule(context(SPAN, data_parallel_devices=devices)) is None


def wrapped(devices: list[int]) -> nn.Module:
    dp = nn.DataParallel(nn.Linear(4, 2))  # on a CPU-only torch it keeps no device ids
    dp.device_ids = devices
    return dp


def test_the_seam_finds_data_parallel_itself_or_inside_a_model() -> None:
    assert data_parallel_devices(wrapped([0, 1, 2])) == 3
    assert data_parallel_devices(nn.Sequential(nn.ReLU(), wrapped([0, 1]))) == 2
    assert data_parallel_devices(nn.Linear(4, 2)) is None
    assert data_parallel_devices(object()) is None


def test_a_watched_model_gets_the_finding(tmp_path: Path) -> None:
    scope = StallScope(tmp_path, console=False)
    scope.watch(wrapped([0, 1]))
    with scope:
        for _ in scope.iter(range(30)):
            torch.zeros(64).sum()  # the step, outside any phase: host work DataParallel does once
    assert scope.report is not None
    assert scope.report.finding("dist.dataparallel") is not None
