"""Plain loops of every shape (SPEC §2): a ``while`` loop with no iterable (``scope.batch``), a
generator of ready batches, a loop that only marks phases, a run of a single epoch. Each on a
fake clock, so the numbers are exact on a busy machine, on both hot paths."""

from __future__ import annotations

import functools
import io
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import FakeClock
from rich.console import Console

from stallscope import StallScope
from stallscope.hooks import scope as scope_module
from stallscope.hooks import session as session_module
from stallscope.hooks.session import NO_STEPS_NOTE, Session
from stallscope.report.io import REPORT_NAME
from stallscope.signals.collector import SignalCollector

MS = 1_000_000


@pytest.fixture
def clocked(monkeypatch: pytest.MonkeyPatch, clock: FakeClock, cpu_clock: FakeClock) -> FakeClock:
    """Every ``StallScope`` made in the test reads ``clock`` (and ``cpu_clock``) instead of real
    time, and samples no host (what other processes do to this machine is not the fake loop's)."""
    monkeypatch.setattr(scope_module, "Session", functools.partial(Session, clock=clock, cpu_clock=cpu_clock))
    monkeypatch.setattr(session_module, "SignalCollector", functools.partial(SignalCollector, host=False))
    return clock


class Boom(Exception):
    """The user's own error."""


def _read(report_dir: Path) -> dict[str, Any]:
    data = json.loads((report_dir / REPORT_NAME).read_text(encoding="utf-8"))
    assert isinstance(data, dict)
    return data


class Batches:
    """nanoGPT's ``get_batch``: each call takes ``wait_ms`` of CPU in this process."""

    def __init__(self, clock: FakeClock, cpu_clock: FakeClock, wait_ms: float) -> None:
        self.clock = clock
        self.cpu_clock = cpu_clock
        self.wait_ms = wait_ms
        self.calls: list[str] = []

    def __call__(self, split: str, *, block: int = 8) -> tuple[str, int]:
        self.calls.append(split)
        self.clock.advance_ms(self.wait_ms)
        self.cpu_clock.advance_ms(self.wait_ms)
        return split, block


def _compute(scope: StallScope, clock: FakeClock, cpu_clock: FakeClock, ms: float = 1) -> None:
    with scope.phase("compute"):
        clock.advance_ms(ms)
        cpu_clock.advance_ms(ms)


# -- a loop with no iterable -----------------------------------------------------------------


def test_batch_times_the_wait_for_each_batch_exactly_and_starts_a_step(
    tmp_path: Path, clocked: FakeClock, cpu_clock: FakeClock
) -> None:
    """``while`` loop of 10 steps: 3 ms for ``get_batch``, 1 ms of compute, 0.5 ms in no phase."""
    get_batch = Batches(clocked, cpu_clock, wait_ms=3)
    with StallScope(tmp_path, console=False) as scope:
        x = scope.batch(get_batch, "train", block=4)  # nanoGPT fetches the first batch before the loop
        step = 0
        while True:
            assert x == ("train", 4)
            _compute(scope, clocked, cpu_clock)
            clocked.advance_ms(0.5)
            step += 1
            if step == 10:
                break
            x = scope.batch(get_batch, "train", block=4)
    summary = _read(tmp_path)["summary"]
    assert get_batch.calls == ["train"] * 10
    assert summary["steps"] == 10
    assert summary["wall_s"] == pytest.approx(0.045)
    assert summary["phase_seconds"]["data"] == pytest.approx(0.030)
    assert summary["phase_seconds"]["compute"] == pytest.approx(0.010)
    assert summary["data_wait_s"]["p50"] == pytest.approx(0.003)
    assert summary["step_time_s"]["max"] == pytest.approx(0.0045)
    assert scope.report is not None
    assert len(scope.report.epochs) == 1  # no epochs: the run is one


def test_batch_lets_the_users_exception_through_and_writes_the_report(tmp_path: Path, clocked: FakeClock) -> None:
    def get_batch() -> None:
        raise Boom("no more data")

    scope = StallScope(tmp_path, console=False)

    def loop() -> None:
        with scope:
            scope.batch(lambda: "first")
            scope.batch(get_batch)

    with pytest.raises(Boom, match="no more data"):
        loop()
    assert _read(tmp_path)["complete"] is True
    assert scope.enabled is False  # closed, not failed


def test_batch_and_iter_each_end_the_others_epoch(tmp_path: Path, clocked: FakeClock, cpu_clock: FakeClock) -> None:
    get_batch = Batches(clocked, cpu_clock, wait_ms=1)
    with StallScope(tmp_path, console=False) as scope:
        for _ in range(3):
            scope.batch(get_batch, "train")
        for _ in scope.iter(range(2)):
            clocked.advance_ms(1)
        for _ in range(4):
            scope.batch(get_batch, "train")
    epochs = _read(tmp_path)["epochs"]
    assert [e["summary"]["steps"] for e in epochs] == [3, 2, 4]


def test_batch_after_the_scope_turned_off_still_returns_the_batch(tmp_path: Path, clocked: FakeClock) -> None:
    with StallScope(tmp_path, console=False) as scope:
        scope.batch(lambda: 1)
    assert scope.batch(lambda: 2) == 2  # after the run: passed through, nothing recorded


def test_a_while_loop_is_told_steps_not_epochs(tmp_path: Path, clocked: FakeClock, cpu_clock: FakeClock) -> None:
    """nanoGPT: 610 steps of 2 ms, an evaluation of 60 ms every 25 steps (at steps 0, 25, ...,
    600: 25 of them, 610 / 25 = 24.4 steps apart on average) and none after the loop. Told in
    steps, with the gap the loop set, and a run after the loop."""
    get_batch = Batches(clocked, cpu_clock, wait_ms=0.1)
    with StallScope(tmp_path, console=False) as scope:
        for it in range(610):
            if it % 25 == 0:
                with scope.phase("validation"):
                    clocked.advance_ms(60)
            scope.batch(get_batch, "train")
            _compute(scope, clocked, cpu_clock, ms=1.9)
    top = {f["id"]: f for f in _read(tmp_path)["findings"]}["validation.frequency"]
    assert top["suggestion"] == {"every_n_steps": 1000, "at_end": True}
    assert "instead of every 25 steps" in top["fix"]
    assert top["evidence"]["every_n_steps_seen"] == 25
    assert "The 610 steps seen are fewer than 1000" in top["fix"]
    assert "epoch" not in top["fix"]
    assert "epoch" not in top["snippet"]
    assert top["title"].endswith("(60 ms per validation pass)")


# -- a generator of ready batches ------------------------------------------------------------


def test_a_generator_of_ready_batches_is_told_an_iterable_dataset_of_batches(
    tmp_path: Path, clocked: FakeClock, cpu_clock: FakeClock
) -> None:
    """A generator that makes each batch with 20 ms of CPU, 1 ms of compute: more processes help
    (whatever torch's threads and the hand-over's GIL wait), but a generator is not a Dataset,
    and ``batch_size=...`` would batch its batches again."""

    def batches() -> Iterator[int]:
        for i in range(300):
            clocked.advance_ms(20)
            cpu_clock.advance_ms(20)
            yield i

    with StallScope(tmp_path, console=False) as scope:
        for _ in scope.iter(batches()):
            _compute(scope, clocked, cpu_clock)
    top = _read(tmp_path)["findings"][0]
    assert top["id"] == "data.workers"
    assert "IterableDataset" in top["fix"]
    assert "batch_size=None" in top["snippet"]
    assert "batch_size=..." not in top["snippet"]
    assert "DataLoader(dataset" not in top["snippet"]
    if top["suggestion"]["num_workers"] > 1:
        assert "get_worker_info()" in top["fix"]  # each worker runs its own copy: shard it


def test_batch_fed_loops_are_told_to_make_batches_ahead(
    tmp_path: Path, clocked: FakeClock, cpu_clock: FakeClock
) -> None:
    get_batch = Batches(clocked, cpu_clock, wait_ms=20)
    with StallScope(tmp_path, console=False) as scope:
        for _ in range(300):
            scope.batch(get_batch, "train")
            _compute(scope, clocked, cpu_clock)
    top = _read(tmp_path)["findings"][0]
    assert top["id"] == "data.workers"
    assert "scope.batch(next, batches)" in top["snippet"]
    assert "batch_size=None" in top["snippet"]
    assert "batch_size=..." not in top["snippet"]


# -- phases and no step ----------------------------------------------------------------------


def test_a_loop_of_phases_alone_says_once_that_no_step_was_seen(tmp_path: Path, clocked: FakeClock) -> None:
    out = io.StringIO()
    with StallScope(tmp_path, console=Console(file=out, width=100)) as scope:
        for _ in range(20):
            with scope.phase("data"):
                clocked.advance_ms(4)
            with scope.phase("compute"):
                clocked.advance_ms(6)
    data = _read(tmp_path)
    assert data["summary"]["steps"] == 0
    assert data["notes"].count(NO_STEPS_NOTE) == 1
    text = out.getvalue()
    assert text.count("no training step was seen") == 1
    assert "scope.batch(get_batch)" in text
    assert "scope.iter(loader)" in text


def test_a_loop_with_steps_gets_no_such_note(tmp_path: Path, clocked: FakeClock) -> None:
    with StallScope(tmp_path, console=False) as scope:
        for _ in scope.iter(range(3)):
            clocked.advance_ms(1)
    assert NO_STEPS_NOTE not in _read(tmp_path)["notes"]


# -- a single epoch --------------------------------------------------------------------------


def test_a_single_epoch_run_shows_the_runs_diagnosis_with_its_notes(
    tmp_path: Path, clocked: FakeClock, cpu_clock: FakeClock
) -> None:
    """One pass of 40 steps validating every 5, and a validation after the loop: the panel the
    user sees is the run's (the validation after the loop counted), the same as report.json's
    findings, with the run's notes; no epoch panel that says otherwise."""
    out = io.StringIO()
    with StallScope(tmp_path, console=Console(file=out, width=200)) as scope:
        for i in range(1, 41):
            scope.batch(lambda: None)
            _compute(scope, clocked, cpu_clock, ms=2)
            if i % 5 == 0:
                with scope.phase("validation"):
                    clocked.advance_ms(30)
        with scope.phase("validation"):
            clocked.advance_ms(30)
    text = out.getvalue()
    data = _read(tmp_path)
    assert "StallScope · epoch 0" not in text
    assert text.count("StallScope · run: ") == 1  # a loop with no epochs: none named
    top = data["findings"][0]
    assert top["id"] == "validation.frequency"
    assert f"x{top['est_speedup']:.2f}" in text
    assert f"saves {top['est_saving_fraction']:.0%}" in text
    for note in data["notes"]:
        assert note[:60] in text.replace("\n", " ")


def test_a_single_pass_ended_before_the_exit_shows_its_panel_then_the_runs(tmp_path: Path, clocked: FakeClock) -> None:
    out = io.StringIO()
    with StallScope(tmp_path, console=Console(file=out, width=200)) as scope:
        for _ in scope.iter(range(50)):
            clocked.advance_ms(25)
    text = out.getvalue()
    assert text.index("StallScope · epoch 0") < text.index("StallScope · run (1 epoch)")


def test_a_single_short_pass_is_diagnosed_in_the_runs_panel_alone(tmp_path: Path, clocked: FakeClock) -> None:
    """Too short to judge alone, and no epoch after it: diagnosed at the run's end, one panel."""
    out = io.StringIO()
    with StallScope(tmp_path, console=Console(file=out, width=200)) as scope:
        for _ in scope.iter(range(5)):
            clocked.advance_ms(1)
    titles = [line.split(":")[0] for line in out.getvalue().splitlines() if line.startswith("StallScope · ")]
    assert titles == ["StallScope · run (1 epoch)"]
    assert scope.report is not None
    assert scope.report.epochs[0].covers_epochs is None  # a group of one


def test_an_internal_failure_in_batch_turns_the_scope_off_and_the_loop_goes_on(
    tmp_path: Path, clocked: FakeClock, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from stallscope.timeline.recorder import Timeline

    def broken(self: Timeline, *, new_step: bool = True) -> None:
        raise RuntimeError("planted")

    got = []
    with StallScope(tmp_path, console=False) as scope:
        got.append(scope.batch(lambda: 1))
        monkeypatch.setattr(Timeline, "data_begin", broken)
        got.append(scope.batch(lambda: 2))
        got.append(scope.batch(lambda: 3))
    assert got == [1, 2, 3]
    assert scope.enabled is False
    assert "turned itself off" in capsys.readouterr().err
    assert any("turned itself off" in note for note in _read(tmp_path)["notes"])


def test_a_generator_and_a_batch_function_get_the_same_prediction_as_an_iterable(
    tmp_path: Path, clocked: FakeClock, cpu_clock: FakeClock
) -> None:
    """The same batches (20 ms of CPU each) and steps from a list-like iterable, a generator and
    ``scope.batch`` calls: one model, one number of workers, one prediction; only the words differ."""

    class Items:
        def __iter__(self) -> Iterator[int]:
            for i in range(300):
                clocked.advance_ms(20)
                cpu_clock.advance_ms(20)
                yield i

    found = {}
    for shape in ("iterable", "generator", "callable"):
        with StallScope(tmp_path / shape, console=False) as scope:
            if shape == "callable":
                get = iter(Items()).__next__
                for _ in range(300):
                    scope.batch(get)
                    _compute(scope, clocked, cpu_clock)
            else:
                for _ in scope.iter(Items() if shape == "iterable" else iter(Items())):
                    _compute(scope, clocked, cpu_clock)
        found[shape] = {f["id"]: f for f in _read(tmp_path / shape)["findings"]}["data.workers"]
    assert found["iterable"]["suggestion"] == found["generator"]["suggestion"] == found["callable"]["suggestion"]
    speedups = {shape: f["est_speedup"] for shape, f in found.items()}
    assert max(speedups.values()) - min(speedups.values()) <= 0.05, speedups
    assert "Wrap the iterable" in found["iterable"]["fix"]
    assert "IterableDataset" in found["generator"]["fix"]
    assert "IterableDataset" in found["callable"]["fix"]
