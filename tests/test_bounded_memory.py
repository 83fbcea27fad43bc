"""Nothing StallScope keeps per step may grow with the number of steps (issue: bounded memory).

Not a timing test: it counts the bytes that StallScope's own code holds (tracemalloc, filtered to
the ``stallscope`` package) after a number of steps, and again after six times as many.
"""

from __future__ import annotations

import tracemalloc
from pathlib import Path

import stallscope
from stallscope import StallScope

PACKAGE = str(Path(stallscope.__file__).parent)


def _held_by_stallscope(snapshot: tracemalloc.Snapshot) -> int:
    """Bytes held by StallScope's recording, analysis and report code. The background samplers
    (``signals/``) are left out: their rings fill with time, not steps, up to a fixed size, and
    their own tests check that bound."""
    ours = snapshot.filter_traces(
        [tracemalloc.Filter(True, f"{PACKAGE}/*"), tracemalloc.Filter(False, f"{PACKAGE}/signals/*")]
    )
    return sum(stat.size for stat in ours.statistics("filename"))


def _held_after(steps: int, report_dir: Path) -> int:
    """Bytes StallScope's code holds at the end of one epoch of ``steps`` steps, scope still open."""
    tracemalloc.start()
    try:
        with StallScope(report_dir, console=False) as scope:
            compute, custom = scope.phase("compute"), scope.phase("my-custom-phase")
            for i in scope.iter(range(steps)):
                with compute:
                    pass
                if i % 100 == 0:
                    with custom:
                        pass
            held = _held_by_stallscope(tracemalloc.take_snapshot())
    finally:
        tracemalloc.stop()
    assert scope.report is not None
    assert scope.report.summary.steps == steps
    assert len(scope.report.summary.idle_windows) <= 256
    return held


def test_per_step_structures_do_not_grow_with_steps(tmp_path: Path) -> None:
    # The idle windows are the only per-step series, at most 256 of them. Both lengths end right
    # after a merge of the windows (16 x 2^k x 256 steps: 128 windows each), so a structure
    # that is bounded holds the same bytes in both runs, and one that grows per step does not.
    short = _held_after(16_384, tmp_path / "short")
    long = _held_after(131_072, tmp_path / "long")
    assert long - short < 16_000, f"StallScope held {short} B after 16k steps and {long} B after 131k"


def test_a_long_run_writes_a_small_report(tmp_path: Path) -> None:
    with StallScope(tmp_path, console=False) as scope:
        compute = scope.phase("compute")
        for _ in scope.iter(range(200_000)):
            with compute:
                pass
    size = (tmp_path / "report.json").stat().st_size
    assert size < 1_000_000
    assert scope.report is not None
    assert scope.report.summary.steps == 200_000
