"""The mechanics of ``benchmarks/async_save.py``: the model's prediction from a report's evidence."""

from __future__ import annotations

from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any

import pytest
from conftest import load_script

from stallscope.analysis.rules.checkpoint_frequency import HANDOFF_S

PATH = Path(__file__).resolve().parents[1] / "benchmarks" / "async_save.py"


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    return load_script(PATH, "async_save_bench")


def _report(steps: int, wall_s: float, **evidence: Any) -> Any:
    finding = SimpleNamespace(id="checkpoint.frequency", evidence=evidence)
    return SimpleNamespace(findings=[finding], summary=SimpleNamespace(steps=steps, wall_s=wall_s))


def test_a_plain_runs_saves_keep_their_copy_and_the_last_is_waited_for(bench: ModuleType) -> None:
    # 4 saves of 30 ms (20 ms of it CPU, half counted), a 10 ms copy: 3 during training, 1 at the end
    report = _report(
        200, 1.0, each_ms=30, count=4, write_ms=30, write_cpu_ms=20, prepare_ms=0, copy_ms=10, save_mb=20,
        write_cpu_counted=0.5,
    )  # fmt: skip
    wall, _ = bench.predicted_wall_s(report, lightning=False, every=50)
    assert wall == pytest.approx(1.0 - 0.120 + 3 * (0.010 + HANDOFF_S + 0.010) + 0.030)


def test_a_fits_last_save_writes_after_the_fit(bench: ModuleType) -> None:
    report = _report(
        120, 1.0, each_ms=30, count=6, write_ms=25, write_cpu_ms=20, prepare_ms=5, copy_ms=10, save_mb=20,
        write_cpu_counted=0.5,
    )  # fmt: skip
    wall, _ = bench.predicted_wall_s(report, lightning=True, every=20)
    stays = 0.015 + HANDOFF_S
    assert wall == pytest.approx(1.0 - 0.180 + 5 * (stays + 0.010) + stays)


def test_no_split_no_prediction(bench: ModuleType) -> None:
    assert bench.predicted_wall_s(_report(100, 1.0, each_ms=30, count=4), lightning=False, every=20) is None
