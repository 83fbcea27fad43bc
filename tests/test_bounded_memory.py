"""Nothing StallScope keeps per step may grow with the number of steps (issue: bounded memory).

Not a timing test: it counts the bytes that StallScope's own code holds (tracemalloc, filtered to
the ``stallscope`` package) after a number of steps, and again after six times as many.
"""

from __future__ import annotations

import gc
import itertools
import math
import tracemalloc
from pathlib import Path

import pytest

import stallscope
from stallscope import StallScope
from stallscope.analysis import disturbance
from stallscope.hooks import session as session_module
from stallscope.timeline import recorder

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
            gc.collect()  # garbage (an earlier test's included) is not what StallScope holds
            held = _held_by_stallscope(tracemalloc.take_snapshot())
    finally:
        tracemalloc.stop()
    assert scope.report is not None
    assert scope.report.summary.steps == steps
    assert len(scope.report.summary.idle_windows) <= 256
    return held


def test_per_step_structures_do_not_grow_with_steps(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The idle windows are the only per-step series, at most 256 of them. Both lengths end right
    # after a merge of the windows (16 x 2^k x 256 steps: 128 windows each), so a structure
    # that is bounded holds the same bytes in both runs, and one that grows per step does not.
    # Both runs write their report at their epoch's end: the first mid-run write otherwise waits
    # for a moment of wall time that only the long run reached on a busy machine, and a written
    # report keeps what its scatter check read (the last recent steps, bounded) for the next one.
    monkeypatch.setattr(session_module, "FIRST_WRITE_S", 0.0)
    # A report's diagnosis checks its steps' scatter (and keeps the list it read, bounded) only
    # when the host sampler did not already find other processes busy: a `make test`'s Python
    # twin pass saw the short run on a busy moment and the long one on a quiet one, 813 against
    # 1,108 kB. Both runs check it here, whatever the machine's load.
    monkeypatch.setattr(disturbance, "OTHERS_SHARE", math.inf)
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


def test_a_recorded_step_holds_no_memory_until_the_fold() -> None:
    """No per-step allocation held: once the C log's buffer has grown to a fold's worth, the events
    of a step (the stream's two, the timer's two) are written into it, and nothing allocated while
    200 steps run (no fold in between) is still held at their end. A log of Python ints held an
    int per timestamp until the fold: about 40 kB here."""
    if recorder._native is None:
        pytest.skip("the Python twin logs an int per timestamp")
    tl = recorder.Timeline()
    tl.start()
    timer = tl.timer(tl.phase_id("compute"))
    stream = tl.stream(iter(range(10_000)), lambda item, wait: None, [])
    for _ in itertools.islice(stream, 1_000):  # folds several times: the log's buffer has grown
        with timer:
            pass
    tl._fold()
    tracemalloc.start()
    try:
        for _ in itertools.islice(stream, 200):
            with timer:
                pass
        snapshot = tracemalloc.take_snapshot()
    finally:
        tracemalloc.stop()
    assert len(tl._log) == 200 * 8  # logged, not folded yet
    here = snapshot.filter_traces([tracemalloc.Filter(True, __file__)])
    allocated = sum(stat.size for stat in here.statistics("filename"))
    assert allocated < 500, f"the loop allocated {allocated} B over 200 steps"
    tl._fold()
    assert tl.steps == 1_200 - 1  # the 1,200th step is still in progress
