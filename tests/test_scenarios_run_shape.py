"""Advice that fits the run: the planted cause ranks first, and its suggestion, applied whole
to the same run, still validates or saves at least once in it (SPEC §3)."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path
from typing import Any

import pytest

from stallscope.analysis.rules.logging_frequency import SATURATED_SHARE, THREAD_BUSY_MAX

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
sys.path.insert(0, str(EXAMPLES))

pytestmark = [
    pytest.mark.scenario,
    # Lightning 2.6 builds torch's ``LeafSpec``, which torch 2.13 deprecates; harmless here
    pytest.mark.filterwarnings(r"ignore:.isinstance.treespec, LeafSpec.. is deprecated:FutureWarning"),
]


def _before_and_after(name: str, tmp_path: Path) -> tuple[Any, Any, dict[str, Any]]:
    """The scenario at its small size, then again with its top finding's suggestion (all keys)."""
    module = importlib.import_module(name)
    before = module.run(report_dir=str(tmp_path / "before"), console=False, **module.SMALL)
    assert before.findings, f"{name}: no finding; phases {before.summary.phase_fractions}"
    top = before.findings[0]
    assert top.id == module.EXPECTED, f"{name}: ranking {[f.id for f in before.findings]}"
    suggestion = dict(top.suggestion)
    # the epochs and what came after the last one (a save, the wrap-up) add up to the run
    tail = before.tail.wall_s if before.tail is not None else 0.0
    assert sum(e.summary.wall_s for e in before.epochs) + tail == pytest.approx(before.summary.wall_s, abs=1e-5)
    after = module.run(report_dir=str(tmp_path / "after"), console=False, **{**module.SMALL, **suggestion})
    return before, after, suggestion


def test_a_one_epoch_fit_with_heavy_validation_keeps_one_validation(tmp_path: Path) -> None:
    before, after, suggestion = _before_and_after("lightning_one_epoch_validation", tmp_path)
    # any interval in epochs would never validate in a one-epoch fit
    assert suggestion.get("check_val_every_n_epoch", 1) == 1
    assert suggestion["val_check_interval"] == 1.0
    assert before.findings[0].evidence["runs_in_fit_after"] == 1
    assert after.summary.phase_seconds["validation"] > 0, "the applied suggestion validated nothing"
    assert after.summary.phase_seconds["validation"] < before.summary.phase_seconds["validation"]


def test_a_max_steps_fit_that_checkpoints_often_keeps_one_save(tmp_path: Path) -> None:
    before, after, suggestion = _before_and_after("lightning_max_steps_checkpoint", tmp_path)
    max_steps = 50  # SMALL's
    assert before.summary.steps == max_steps
    assert 5 < suggestion["every_n_train_steps"] <= max_steps
    top = before.findings[0]
    assert top.evidence["saves_in_fit_after"] >= 1
    if "copy_ms" in top.evidence:  # the save's split was measured (Linux): an asynchronous save is modelled
        assert top.evidence["write_ms"] > 0
        assert top.est_speedup_bound == ("estimate" if suggestion.get("async_save") else "lower")
    assert after.summary.phase_seconds["checkpoint"] > 0, "the applied suggestion saved nothing"
    assert after.summary.phase_seconds["checkpoint"] < before.summary.phase_seconds["checkpoint"]


def test_a_plain_loop_whose_interval_exceeds_the_run_still_saves_at_the_end(tmp_path: Path) -> None:
    before, after, suggestion = _before_and_after("short_blocking_checkpoint", tmp_path)
    top = before.findings[0]
    assert suggestion["every_n_steps"] > before.summary.steps  # longer than what was seen
    assert suggestion["at_end"] is True
    assert top.evidence["saves_after"] == 1
    assert f"The {before.summary.steps} steps seen so far are fewer than" in top.fix
    assert top.est_speedup_bound == "lower"
    # its one save left is its last, which the run waits for: saving it in the background buys nothing
    assert "async_save" not in suggestion
    if Path("/proc/self/io").exists():  # the save's split is measured and shown
        assert top.evidence["copy_ms"] > 0
        assert top.evidence["write_ms"] > 0
    assert after.summary.phase_seconds["checkpoint"] > 0, "the applied suggestion saved nothing"
    assert after.summary.phase_seconds["checkpoint"] < before.summary.phase_seconds["checkpoint"]


@pytest.mark.parametrize("name", ["chatty_logging", "lightning_slow_logger"])
def test_a_logger_that_blocks_is_moved_to_a_thread_and_still_logs(name: str, tmp_path: Path) -> None:
    """A 3 ms call each step is a wait, not work: the suggestion hands it to a background thread
    (the examples' ``async_logging``), and logs every step, or every few steps where a call is
    longer than a step (the thread must keep up). Applied, the training thread keeps only the
    hand-offs, and every call is still made (chatty_logging's ``run`` checks its tracker got one
    per ``log_every_n_steps`` steps)."""
    before, after, suggestion = _before_and_after(name, tmp_path)
    top = before.findings[0]
    assert suggestion["async_logging"] is True
    assert set(suggestion) <= {"async_logging", "log_every_n_steps"}
    k = suggestion.get("log_every_n_steps", 1)
    # as often as the logging thread keeps up with (busy at most THREAD_BUSY_MAX of the time), and
    # no less often: how many steps that is depends on how fast this machine runs the steps now
    each, without = top.evidence["each_ms"], top.evidence["step_without_ms"]
    assert k * without * THREAD_BUSY_MAX >= 0.99 * each, "the logging thread would fall behind"
    smaller = {2: 1, 5: 2, 10: 5, 20: 10}.get(k)
    assert smaller is None or smaller * without * THREAD_BUSY_MAX < 1.01 * each, "logs less often than needed"
    assert top.evidence["blocking_calls"] is True
    assert top.evidence["calls_after"] >= before.summary.steps // k
    # the calls' CPU measured (mostly waiting): only their wait is removed, a floor, unless other
    # work on this machine saturated its cores meanwhile (then the wait may be a wait for a core)
    assert top.evidence["call_cpu_share"] < 0.5
    # (the evidence rounds busy_cores to 0.01: within that of the line, either side is right; a
    # slowdown billed after each call is not surely the call's, and makes the whole an estimate)
    line = SATURATED_SHARE * top.evidence["machine_cores"]
    if abs(top.evidence["busy_cores"] - line) > 0.005:
        saturated = top.evidence["busy_cores"] > line
        slower_after = top.evidence["slower_after_each_ms"] > 0
        assert top.est_speedup_bound == ("estimate" if saturated or slower_after else "lower")
    # 3 ms a call before; a queue.put after: microseconds on a quiet host (benchmarks/whatif.py
    # measures what that buys). On a busy one each hand-off may also wait for a core and the GIL:
    # with two CPU-bound processes beside the suite, after / before read 0.19 and 0.52. Less, then.
    assert after.summary.phase_seconds["logging"] < before.summary.phase_seconds["logging"]
    assert after.summary.phase_seconds["logging"] > 0, "no call was handed off: the logging was turned off"
