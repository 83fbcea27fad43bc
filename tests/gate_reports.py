"""Synthetic reports for the CI-gate tests (``check``, ``diff``, ``stallscope.testing``, integrations).

Built from the schema dataclasses, so a test states exactly the numbers it compares.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from stallscope.analysis.finding import Finding
from stallscope.report.io import write_report
from stallscope.report.schema import DeviceInfo, Report, RunInfo, Summary


def windows(mean: float, n: int, *, sd: float = 0.03, seed: int = 0, wall_s: float = 0.2) -> list[float]:
    """``n`` window idle fractions around ``mean`` (seeded, clipped to [0, 1])."""
    rng = random.Random(seed)
    return [min(1.0, max(0.0, rng.gauss(mean, sd))) for _ in range(n)]


def data_workers(saving: float = 0.4) -> Finding:
    return Finding(
        id="data.workers",
        title=f"Training waits for data {saving:.0%} of the time",
        est_saving_fraction=saving,
        est_speedup=1 / (1 - saving),
        confidence="high",
        evidence={"data_fraction": saving},
        fix="Raise num_workers of the DataLoader from 0 to 4.",
        suggestion={"num_workers": 4},
    )


def logging_frequency(saving: float = 0.05) -> Finding:
    return Finding(
        id="logging.frequency",
        title="Logging takes 5% of the time",
        est_saving_fraction=saving,
        est_speedup=1 / (1 - saving),
        confidence="medium",
        evidence={},
        fix="Log every 50 steps instead of every step.",
        suggestion={"log_every_n_steps": 50},
    )


def make_report(
    idle: float,
    *,
    window_idle: Sequence[float] | None = None,
    steps: int | None = None,
    device: str = "cpu",
    idle_source: str = "host_phases",
    findings: Sequence[Finding] = (),
    phases: dict[str, float] | None = None,
    complete: bool = True,
) -> Report:
    """A run whose accelerator sat idle ``idle`` of the time (``data`` takes the idle share)."""
    window_idle = list(window_idle) if window_idle is not None else []
    steps = steps if steps is not None else max(16 * len(window_idle), 160)
    if phases is None:
        phases = {"data": round(idle, 6), "compute": round(1 - idle, 6)}
    summary = Summary(
        wall_s=2.0,
        steps=steps,
        steps_per_s=steps / 2.0,
        gpu_idle_fraction=idle,
        idle_source=idle_source,
        phase_fractions=phases,
        idle_windows=tuple({"steps": 16, "wall_s": 0.2, "idle_fraction": round(w, 6)} for w in window_idle),
    )
    return Report(
        run=RunInfo(
            started_at="2026-01-01T00:00:00+00:00",
            host="test",
            torch_version="2.13.0",
            device=DeviceInfo(kind=device, name=device, index=None if device == "cpu" else 0),
        ),
        summary=summary,
        findings=tuple(findings),
        complete=complete,
    )


def write(tmp: Path, name: str, report: Report) -> str:
    """Write ``report`` to ``tmp/name/report.json``; returns the file's path."""
    return str(write_report(report, tmp / name / "report.json"))


def regressed_pair(tmp: Path, **kw: Any) -> tuple[str, str]:
    """(current, baseline) paths: the current run waits on data far more than the baseline."""
    base = make_report(0.20, window_idle=windows(0.20, 10, seed=1), findings=[logging_frequency()])
    cur = make_report(
        0.55,
        window_idle=windows(0.55, 10, seed=2),
        findings=[data_workers(0.35), logging_frequency()],
        **kw,
    )
    return write(tmp, "current", cur), write(tmp, "baseline", base)
