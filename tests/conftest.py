"""Shared test fixtures. Keep them generic; put new ones here with a docstring.

* ``FakeClock`` / ``clock`` / ``cpu_clock``: injected ``clock=`` callables that move only when told.
* ``console``: a rich ``Console`` writing into a ``StringIO`` 100 columns wide (``console.file``).
* ``make_summary`` / ``make_finding`` / ``make_report``: builders of report records with sensible
  defaults; override any field by keyword.
* ``load_script``: a script of ``benchmarks/`` or ``examples/`` imported by its path.
* ``notes_but_the_hosts``: a report's notes less those a busy host may add to any real-time run.
"""

from __future__ import annotations

import importlib.util
import io
import multiprocessing
import os
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from rich.console import Console

from stallscope.analysis.finding import Finding
from stallscope.report.schema import DeviceInfo, EpochReport, Report, RunInfo, Summary

if os.environ.get("STALLSCOPE_SANITIZED"):
    # In the sanitize pass, processes (a DataLoader's workers) start from a fork server: one forked
    # from a test's process, whose other threads may hold ASan's allocator lock at the fork, can
    # wait on that lock for good (seen once: a worker of ``test_scope.py`` stuck so, its loop
    # polling for a batch until the job's time ran out).
    multiprocessing.set_start_method("forkserver", force=True)

#: how the notes that depend on the host's load, not on the run, begin: other processes busy for
#: 5 s of sampling (``analysis/disturbance.py``), the host sampler's tick still running at the
#: run's end, the run's end waiting for a mid-run write
HOST_NOTES = ("other processes kept ", "the host sampler did not stop", "the run's end waited ")


def notes_but_the_hosts(notes: Any) -> list[str]:
    """``notes`` less the ones a busy host may add to any run in real time (``HOST_NOTES``)."""
    return [n for n in notes if not n.startswith(HOST_NOTES)]


def load_script(path: Path, name: str) -> ModuleType:
    """The script at ``path`` imported as module ``name`` (registered in ``sys.modules``, so that
    its dataclasses and pickles find it)."""
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


class FakeClock:
    """A nanosecond clock for ``clock=`` parameters: returns ``now`` and moves only when told."""

    def __init__(self, start: int = 0) -> None:
        self.now = start
        self.calls = 0

    def __call__(self) -> int:
        self.calls += 1
        return self.now

    def advance(self, ns: int) -> None:
        """Move the clock forward by ``ns`` nanoseconds."""
        self.now += ns

    def advance_ms(self, ms: float) -> None:
        """Move the clock forward by ``ms`` milliseconds (rounded to whole nanoseconds)."""
        self.now += round(ms * 1_000_000)


@pytest.fixture
def clock() -> FakeClock:
    """A wall clock (``perf_counter_ns`` stand-in) starting at 0 ns."""
    return FakeClock()


@pytest.fixture
def cpu_clock() -> FakeClock:
    """A process CPU clock (``process_time_ns`` stand-in) starting at 0 ns."""
    return FakeClock()


@pytest.fixture
def console() -> Console:
    """A non-terminal rich Console 100 columns wide; read what it printed with ``console.file.getvalue()``."""
    return Console(file=io.StringIO(), width=100)


@pytest.fixture
def make_summary() -> Callable[..., Summary]:
    """Build a ``Summary``: 100 steps in 2 s, 60% data, 40% compute, idle 0.6 (host_phases)."""

    def make(**overrides: Any) -> Summary:
        fields: dict[str, Any] = {
            "wall_s": 2.0,
            "steps": 100,
            "steps_per_s": 50.0,
            "gpu_idle_fraction": 0.6,
            "idle_source": "host_phases",
            "phase_fractions": {
                "data": 0.6,
                "h2d": 0.0,
                "compute": 0.4,
                "logging": 0.0,
                "checkpoint": 0.0,
                "validation": 0.0,
                "other": 0.0,
            },
        }
        fields.update(overrides)
        return Summary(**fields)

    return make


@pytest.fixture
def make_finding() -> Callable[..., Finding]:
    """Build a ``Finding`` (``data.workers`` saving 0.5, x2.0) with any field overridden."""

    def make(**overrides: Any) -> Finding:
        fields: dict[str, Any] = {
            "id": "data.workers",
            "title": "Training waits for data 60% of the time",
            "est_saving_fraction": 0.5,
            "est_speedup": 2.0,
            "confidence": "high",
            "evidence": {"data_wait_share": 0.6, "num_workers": 0},
            "fix": "Set num_workers=4 in the DataLoader.",
            "suggestion": {"num_workers": 4},
            "snippet": "DataLoader(dataset, num_workers=4)",
        }
        fields.update(overrides)
        return Finding(**fields)

    return make


@pytest.fixture
def make_report(make_summary: Callable[..., Summary], make_finding: Callable[..., Finding]) -> Callable[..., Report]:
    """Build a ``Report`` with one epoch and one finding; override any ``Report`` field by keyword."""

    def make(**overrides: Any) -> Report:
        finding = make_finding()
        fields: dict[str, Any] = {
            "run": RunInfo(
                started_at="2024-05-01T12:00:00+00:00",
                host="box",
                torch_version="2.13.0",
                device=DeviceInfo(kind="cpu", name="Some CPU", index=None),
                dataloader={
                    "num_workers": 0,
                    "pin_memory": False,
                    "prefetch_factor": None,
                    "persistent_workers": False,
                    "batch_size": 32,
                },
                stallscope_version="0.1.0",
                framework="plain",
                usable_cores=2,
            ),
            "summary": make_summary(),
            "epochs": (EpochReport(index=0, summary=make_summary(), findings=(finding,)),),
            "findings": (finding,),
            "notes": ("a note",),
            "complete": True,
        }
        fields.update(overrides)
        return Report(**fields)

    return make
