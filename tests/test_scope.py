from __future__ import annotations

import contextlib
import functools
import io
import json
import signal
import threading
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, NoReturn

import pytest
import torch
from conftest import FakeClock
from rich.console import Console
from torch.utils.data import DataLoader, TensorDataset

from stallscope import StallScope
from stallscope.hooks import scope as scope_module
from stallscope.hooks import session as session_module
from stallscope.hooks.scope import FINISH_TRIES
from stallscope.hooks.session import MAKE_AT_ONCE_STEPS, MAX_EPOCHS_IN_REPORT, Session
from stallscope.report import writer as writer_module
from stallscope.report.io import REPORT_NAME
from stallscope.report.schema import Report, report_from_dict, report_to_dict
from stallscope.signals.collector import SignalCollector
from stallscope.signals.saves import SaveMeter
from stallscope.timeline.recorder import FOLD_AT, Timeline

MS = 1_000_000


@pytest.fixture
def clocked(monkeypatch: pytest.MonkeyPatch, clock: FakeClock, cpu_clock: FakeClock) -> FakeClock:
    """Every ``StallScope`` made in the test reads ``clock`` (and ``cpu_clock``) instead of real time."""
    monkeypatch.setattr(scope_module, "Session", functools.partial(Session, clock=clock, cpu_clock=cpu_clock))
    return clock


class TimedLoader:
    """An iterable whose ``iter()`` and each ``next()`` take a scripted time on the fake clock."""

    def __init__(
        self,
        items: Sequence[Any],
        clock: FakeClock,
        *,
        wait_ms: float = 0,
        iter_ms: float = 0,
        end_ms: float = 0,
    ) -> None:
        self.items = items
        self.clock = clock
        self.wait_ms = wait_ms
        self.iter_ms = iter_ms
        self.end_ms = end_ms

    def __iter__(self) -> Iterator[Any]:
        self.clock.advance_ms(self.iter_ms)
        return self._items()

    def _items(self) -> Iterator[Any]:
        for item in self.items:
            self.clock.advance_ms(self.wait_ms)
            yield item
        self.clock.advance_ms(self.end_ms)

    def __len__(self) -> int:
        return len(self.items)


class Boom(Exception):
    """The user's own error."""


def _read(report_dir: Path) -> dict[str, Any]:
    data = json.loads((report_dir / REPORT_NAME).read_text(encoding="utf-8"))
    assert isinstance(data, dict)
    return data


def _train_step(scope: StallScope, clock: FakeClock) -> None:
    """5 ms compute, 2 ms logging, 1 ms in no phase (other)."""
    with scope.phase("compute"):
        clock.advance_ms(5)
    with scope.phase("logging"):
        clock.advance_ms(2)
    clock.advance_ms(1)


# -- what it measures ------------------------------------------------------------------------


def test_phase_fractions_reflect_each_phase_share(tmp_path: Path, clocked: FakeClock) -> None:
    loader = TimedLoader(range(4), clocked, wait_ms=2)
    with StallScope(tmp_path, console=False) as scope:
        for _ in scope.iter(loader):
            _train_step(scope, clocked)
    # each step: 2 ms waiting for data + 5 compute + 2 logging + 1 other = 10 ms; 4 steps = 40 ms
    data = _read(tmp_path)
    summary = data["summary"]
    assert summary["steps"] == 4
    assert summary["wall_s"] == pytest.approx(0.040)
    assert summary["steps_per_s"] == pytest.approx(100.0)
    fractions = summary["phase_fractions"]
    assert fractions["data"] == pytest.approx(0.2)
    assert fractions["compute"] == pytest.approx(0.5)
    assert fractions["logging"] == pytest.approx(0.2)
    assert fractions["other"] == pytest.approx(0.1)
    assert fractions["h2d"] == fractions["checkpoint"] == fractions["validation"] == 0.0
    assert sum(fractions.values()) == pytest.approx(1.0, abs=1e-6)
    assert summary["idle_source"] == "host_phases"
    assert summary["gpu_idle_fraction"] == pytest.approx(0.5)  # 1 - compute share
    assert data["epochs"][0]["summary"]["phase_fractions"] == fractions
    assert summary["data_wait_s"]["p50"] == pytest.approx(0.002)
    assert summary["step_time_s"]["max"] == pytest.approx(0.010)


def test_steps_are_counted_per_item(tmp_path: Path) -> None:
    items = (f"batch {i}" for i in range(7))  # a generator: no len(), no DataLoader
    seen = []
    with StallScope(tmp_path, console=False) as scope:
        for item in scope.iter(items):
            seen.append(item)
    assert seen == [f"batch {i}" for i in range(7)]
    assert scope.report is not None
    assert scope.report.summary.steps == 7
    assert scope.report.epochs[0].summary.steps == 7
    assert "dataloader" not in _read(tmp_path)["run"]


def test_real_clock_fractions_sum_to_one(tmp_path: Path) -> None:
    with StallScope(tmp_path, console=False) as scope:
        for _ in range(2):
            for x in scope.iter(range(20)):
                with scope.phase("compute"):
                    sum(range(100 * x))
    summary = _read(tmp_path)["summary"]
    assert summary["steps"] == 40
    assert sum(summary["phase_fractions"].values()) == pytest.approx(1.0, abs=1e-6)
    assert all(0.0 <= v <= 1.0 for v in summary["phase_fractions"].values())


def test_nested_phases_count_exclusively(tmp_path: Path, clocked: FakeClock) -> None:
    with StallScope(tmp_path, console=False) as scope:
        for _ in scope.iter(TimedLoader(range(2), clocked)):
            with scope.phase("compute"):
                clocked.advance_ms(6)
                with scope.phase("logging"):
                    clocked.advance_ms(4)
    fractions = _read(tmp_path)["summary"]["phase_fractions"]
    assert fractions["compute"] == pytest.approx(0.6)
    assert fractions["logging"] == pytest.approx(0.4)


def test_custom_phases_are_reported_under_their_own_name(tmp_path: Path, clocked: FakeClock) -> None:
    with StallScope(tmp_path, console=False) as scope:
        for _ in scope.iter(TimedLoader(range(3), clocked, wait_ms=1)):
            with scope.phase("tokenize"):
                clocked.advance_ms(3)
            with scope.phase("compute"):
                clocked.advance_ms(6)
    data = _read(tmp_path)
    assert data["summary"]["phase_fractions"]["tokenize"] == pytest.approx(0.3)
    assert data["summary"]["phase_seconds"]["tokenize"] == pytest.approx(0.009)
    assert data["epochs"][0]["summary"]["phase_fractions"]["tokenize"] == pytest.approx(0.3)
    assert data["summary"]["gpu_idle_fraction"] == pytest.approx(0.4)  # custom phases are host work


def test_a_run_mostly_in_no_phase_says_how_to_name_that_time(tmp_path: Path, clocked: FakeClock) -> None:
    """6 ms of each 10 ms step outside every phase: the report's notes say so (once the run is
    complete) and how to name it; named, the note is gone."""
    for name in (None, "metrics"):
        folder = tmp_path / str(name)
        with StallScope(folder, console=False) as scope:
            for _ in scope.iter(TimedLoader(range(150), clocked, wait_ms=1)):  # 1.5 s: long enough to judge
                with scope.phase("compute"):
                    clocked.advance_ms(3)
                with scope.phase(name) if name else contextlib.nullcontext():
                    clocked.advance_ms(6)
        notes = [n for n in _read(folder)["notes"] if "in no phase" in n]
        if name is None:
            assert len(notes) == 1
            assert notes[0].startswith("60% of the run's time is in no phase")
        else:
            assert notes == []


def test_a_single_epochs_finding_and_the_runs_count_the_steps_slowed_after_each_save(
    tmp_path: Path, clocked: FakeClock
) -> None:
    """A loop of one pass (a while loop's shape): a 20 ms save every 5 steps of 5 ms, and the
    step after each save 3 ms slower. The epoch's finding and the run's are of the same steps:
    both count the slowdown after each save (the epoch's read the run so far without its recent
    steps, and said 0)."""
    with StallScope(tmp_path, console=False) as scope:
        slow = False
        for i in scope.iter(TimedLoader(range(250), clocked, wait_ms=0)):
            with scope.phase("compute"):
                clocked.advance_ms(8 if slow else 5)
            slow = i % 5 == 4
            if slow:
                with scope.phase("checkpoint"):
                    clocked.advance_ms(20)
    data = _read(tmp_path)
    (run,) = [f for f in data["findings"] if f["id"] == "checkpoint.frequency"]
    (epoch,) = [f for f in data["epochs"][0]["findings"] if f["id"] == "checkpoint.frequency"]
    assert run["evidence"]["slower_after_each_ms"] > 0
    assert epoch["evidence"]["slower_after_each_ms"] == run["evidence"]["slower_after_each_ms"]
    # (their savings differ by the save after the loop, which the run's prediction counts)


def test_phases_between_epochs_count_for_the_run(tmp_path: Path, clocked: FakeClock) -> None:
    with StallScope(tmp_path, console=False) as scope:
        for _ in scope.iter(TimedLoader(range(2), clocked)):
            with scope.phase("compute"):
                clocked.advance_ms(10)
        with scope.phase("validation"):
            clocked.advance_ms(20)
    fractions = _read(tmp_path)["summary"]["phase_fractions"]
    assert fractions["compute"] == pytest.approx(0.5)
    assert fractions["validation"] == pytest.approx(0.5)


def test_the_epochs_and_the_tail_after_the_last_one_add_up_to_the_run(tmp_path: Path, clocked: FakeClock) -> None:
    """Two passes of 10 ms steps, each followed by a validation; the last one after the last pass."""
    with StallScope(tmp_path, console=False) as scope:
        for epoch in range(2):
            for _ in scope.iter(TimedLoader(range(2), clocked)):
                with scope.phase("compute"):
                    clocked.advance_ms(10)
            with scope.phase("validation"):
                clocked.advance_ms(30 if epoch == 0 else 200)
    data = _read(tmp_path)
    walls = [e["summary"]["wall_s"] for e in data["epochs"]]
    assert data["summary"]["wall_s"] == pytest.approx(0.27)
    # epoch 0's validation ran after its pass, so it counts in epoch 1; the last one is the tail
    assert walls == pytest.approx([0.02, 0.05])
    assert data["tail"]["wall_s"] == pytest.approx(0.2)
    assert data["tail"]["phase_seconds"]["validation"] == pytest.approx(0.2)
    assert sum(walls) + data["tail"]["wall_s"] == pytest.approx(data["summary"]["wall_s"])
    assert any("0.20 s (74% of the run, mostly validation) came after the last epoch" in n for n in data["notes"])


@pytest.mark.parametrize("name", ["", "   ", 42, None])
def test_invalid_phase_names_raise(tmp_path: Path, name: Any) -> None:
    with StallScope(tmp_path, console=False) as scope, pytest.raises(ValueError, match="phase name"):
        scope.phase(name)
    with pytest.raises(ValueError, match="phase name"):
        scope.phase(name)  # also once the scope is off


def test_bad_constructor_arguments_raise_naming_them(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="-1"):
        StallScope(tmp_path, nvml_device=-1)
    with pytest.raises(ValueError, match="'sometimes'"):
        StallScope(tmp_path, console="sometimes")  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        StallScope(tmp_path, False)  # type: ignore[misc]


# -- epochs and the report file --------------------------------------------------------------


def test_report_is_written_at_each_epoch_end_and_at_exit(tmp_path: Path, clocked: FakeClock) -> None:
    # epochs of 2.4 s: each report is written at its epoch's end (the first write waits 2 s
    # into the run: see test_a_thousand_instant_epochs_keep_to_the_budget for short epochs)
    loader = TimedLoader(range(3), clocked, wait_ms=800)
    with StallScope(tmp_path, console=False) as scope:
        assert scope.report is None
        assert not (tmp_path / REPORT_NAME).exists()
        for _ in scope.iter(loader):
            _train_step(scope, clocked)
        first = _read(tmp_path)
        assert first["complete"] is False
        assert [e["index"] for e in first["epochs"]] == [0]
        assert first["epochs"][0]["summary"]["steps"] == 3
        for _ in scope.iter(loader):
            _train_step(scope, clocked)
        second = _read(tmp_path)
        assert second["complete"] is False
        assert [e["index"] for e in second["epochs"]] == [0, 1]
    final = _read(tmp_path)
    assert final["complete"] is True
    assert final["schema_version"] == 1
    assert final["summary"]["steps"] == 6
    assert [e["summary"]["steps"] for e in final["epochs"]] == [3, 3]
    assert final["run"]["framework"] == "plain"


def test_scope_report_is_what_the_json_holds(tmp_path: Path, clocked: FakeClock) -> None:
    with StallScope(tmp_path, console=False) as scope:
        for _ in scope.iter(TimedLoader(range(5), clocked, wait_ms=500)):  # long enough to be written at once
            _train_step(scope, clocked)
        assert scope.report is not None
        assert report_to_dict(scope.report) == _read(tmp_path)
    assert scope.report is not None
    assert scope.report.complete
    assert report_to_dict(scope.report) == _read(tmp_path)


def test_no_report_dir_writes_nothing_but_keeps_the_report(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    with StallScope(None, console=False) as scope:
        for _ in scope.iter(range(3)):
            pass
    assert scope.report is not None
    assert scope.report.summary.steps == 3
    assert list(tmp_path.iterdir()) == []


def test_breaking_out_then_iter_again_ends_the_epoch(tmp_path: Path, clocked: FakeClock) -> None:
    loader = TimedLoader(range(10), clocked, wait_ms=1)
    with StallScope(tmp_path, console=False) as scope:
        for i, _ in enumerate(scope.iter(loader)):
            with scope.phase("compute"):
                clocked.advance_ms(4)
            if i == 1:
                break
        clocked.advance_ms(5)  # still the second step: nothing ended it yet
        assert scope.report is None
        second_pass = scope.iter(loader)  # ends the first epoch, before a batch is asked for
        assert scope.report is not None
        first = scope.report.epochs[0].summary
        assert first.steps == 2
        assert first.wall_s == pytest.approx(0.015)  # 1 + 4, then 1 + 4 + 5
        assert first.step_time_s["max"] == pytest.approx(0.010)
        assert first.phase_fractions["compute"] == pytest.approx(8 / 15, abs=1e-6)
        assert sum(1 for _ in second_pass) == 10
    assert [e["summary"]["steps"] for e in _read(tmp_path)["epochs"]] == [2, 10]


def test_breaking_out_then_leaving_the_scope_ends_the_epoch(tmp_path: Path, clocked: FakeClock) -> None:
    with StallScope(tmp_path, console=False) as scope:
        for i, _ in enumerate(scope.iter(TimedLoader(range(10), clocked, wait_ms=1))):
            clocked.advance_ms(1)
            if i == 2:
                break
    data = _read(tmp_path)
    assert data["complete"] is True
    assert [e["summary"]["steps"] for e in data["epochs"]] == [3]
    assert data["summary"]["wall_s"] == pytest.approx(0.006)


def test_an_empty_loader_makes_no_steps(tmp_path: Path) -> None:
    with StallScope(tmp_path, console=False) as scope:
        for _ in scope.iter([]):
            pass
    data = _read(tmp_path)
    assert data["summary"]["steps"] == 0
    assert sum(data["summary"]["phase_fractions"].values()) == pytest.approx(1.0, abs=1e-6)


def test_dataloader_settings_are_reported(tmp_path: Path) -> None:
    loader = DataLoader(TensorDataset(torch.arange(10.0)), batch_size=4, num_workers=0)
    batches = []
    with StallScope(tmp_path, console=False) as scope:
        for (batch,) in scope.iter(loader):
            with scope.phase("compute"):
                batches.append(batch.sum().item())
    assert batches == [6.0, 22.0, 17.0]
    data = _read(tmp_path)
    assert data["summary"]["steps"] == 3
    assert data["run"]["dataloader"] == {
        "num_workers": 0,
        "pin_memory": False,
        "prefetch_factor": None,
        "persistent_workers": False,
        "batch_size": 4,
    }
    assert data["run"]["device"]["kind"] == "cpu"


def test_worker_dataloader_settings_are_reported(tmp_path: Path) -> None:
    loader = DataLoader(
        TensorDataset(torch.arange(4.0)), batch_size=2, num_workers=1, prefetch_factor=3, persistent_workers=True
    )
    with StallScope(tmp_path, console=False) as scope:
        assert [batch.tolist() for (batch,) in scope.iter(loader)] == [[0.0, 1.0], [2.0, 3.0]]
    assert _read(tmp_path)["run"]["dataloader"] == {
        "num_workers": 1,
        "pin_memory": False,
        "prefetch_factor": 3,
        "persistent_workers": True,
        "batch_size": 2,
    }


def test_console_false_prints_nothing(tmp_path: Path, clocked: FakeClock, capsys: pytest.CaptureFixture[str]) -> None:
    with StallScope(tmp_path, console=False) as scope:
        for _ in range(2):
            for _ in scope.iter(TimedLoader(range(3), clocked, wait_ms=5)):
                _train_step(scope, clocked)
    assert capsys.readouterr() == ("", "")
    assert (tmp_path / REPORT_NAME).is_file()


def test_the_diagnosis_is_printed_at_each_epoch_end_when_asked(tmp_path: Path, clocked: FakeClock) -> None:
    """Epochs long enough to judge (100 steps of 13 ms): each one's panel at its end."""
    out = io.StringIO()
    with StallScope(tmp_path, console=Console(file=out, width=100), print_interval_s=0) as scope:
        for _ in scope.iter(TimedLoader(range(100), clocked, wait_ms=5)):
            _train_step(scope, clocked)
        assert "StallScope · epoch 0: CPU (no GPU): training idle" in out.getvalue()  # no CUDA here
        assert "epoch 1" not in out.getvalue()
        for _ in scope.iter(TimedLoader(range(100), clocked, wait_ms=5)):
            _train_step(scope, clocked)
        assert "StallScope · epoch 1:" in out.getvalue()
    assert "StallScope · run (2 epochs):" in out.getvalue()


def test_short_epochs_are_printed_as_the_group_they_are_diagnosed_in(tmp_path: Path, clocked: FakeClock) -> None:
    """Epochs of 4 steps of 13 ms (52 ms) are too short to judge: no panel at their ends, one
    when the epochs since the last diagnosis are long enough together (20 epochs: 80 steps,
    1.04 s), titled with the epochs it covers and with their numbers together."""
    out = io.StringIO()
    with StallScope(tmp_path, console=Console(file=out, width=100), print_interval_s=0) as scope:
        for epoch in range(45):
            for _ in scope.iter(TimedLoader(range(4), clocked, wait_ms=5)):
                _train_step(scope, clocked)
            if epoch == 18:
                assert "StallScope · " not in out.getvalue()
    titles = [line.split(":")[0] for line in out.getvalue().splitlines() if line.startswith("StallScope · ")]
    assert titles == ["StallScope · epochs 0–19", "StallScope · epochs 20–39", "StallScope · run (45 epochs)"]
    assert "80 steps in 1.04 s" in out.getvalue()


def test_the_last_line_says_where_the_report_went(
    tmp_path: Path, clocked: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A loop of the user's own prints no path itself: the console's last lines name the file and
    the page beside it, as written (brackets and all), relative where they lie below the working
    directory, and only once they were written."""
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)  # not below it: the whole path
    report_dir = tmp_path / "runs [v2] ünï"
    out = io.StringIO()
    with StallScope(report_dir, console=Console(file=out, width=100)) as scope:
        for _ in range(2):
            for _ in scope.iter(TimedLoader(range(3), clocked, wait_ms=5)):
                _train_step(scope, clocked)
    assert (report_dir / REPORT_NAME).is_file()
    assert out.getvalue().rstrip("\n").splitlines()[-2:] == [
        f"report: {report_dir / REPORT_NAME}",
        f"open:   {report_dir / 'report.html'}",
    ]
    monkeypatch.chdir(tmp_path)  # below the working directory: as the user would type it
    out = io.StringIO()
    with StallScope("runs/here", console=Console(file=out, width=100)) as scope:
        for _ in scope.iter(TimedLoader(range(3), clocked, wait_ms=5)):
            _train_step(scope, clocked)
    assert out.getvalue().rstrip("\n").splitlines()[-2:] == [
        f"report: {Path('runs/here') / REPORT_NAME}",
        f"open:   {Path('runs/here') / 'report.html'}",
    ]
    gone = tmp_path / "gone"
    gone.mkdir()
    monkeypatch.chdir(gone)
    out = io.StringIO()
    with StallScope(report_dir, console=Console(file=out, width=100)) as scope:
        for _ in scope.iter(TimedLoader(range(3), clocked, wait_ms=5)):
            _train_step(scope, clocked)
        gone.rmdir()  # the working directory removed under the run: the whole path, nothing turned off
    assert scope.report is not None
    assert not any("turned itself off" in note for note in scope.report.notes)
    assert out.getvalue().rstrip("\n").splitlines()[-2:] == [
        f"report: {report_dir / REPORT_NAME}",
        f"open:   {report_dir / 'report.html'}",
    ]
    monkeypatch.chdir(tmp_path)
    blocked = tmp_path / "a file"
    blocked.write_text("not a folder")
    out = io.StringIO()
    with StallScope(blocked / "runs", console=Console(file=out, width=100)) as scope:
        for _ in scope.iter(TimedLoader(range(3), clocked, wait_ms=5)):
            _train_step(scope, clocked)
    assert "StallScope · run (1 epoch)" in out.getvalue()
    assert "report: " not in out.getvalue()


def test_by_default_a_panel_waits_print_interval_s_after_the_last(tmp_path: Path, clocked: FakeClock) -> None:
    """Epochs of 1.04 s on the fake clock, panels at least 2.5 s apart: epoch 0's, then the first
    epoch ending 2.5 s or more after it (epoch 3, which says 2 went unprinted), then epoch 6's..."""
    out = io.StringIO()
    with StallScope(tmp_path, console=Console(file=out, width=100), print_interval_s=2.5) as scope:
        for _ in range(12):
            for _ in scope.iter(TimedLoader(range(130), clocked, wait_ms=0)):
                _train_step(scope, clocked)
    titles = [line.split(":")[0] for line in out.getvalue().splitlines() if line.startswith("StallScope · ")]
    assert titles == [
        "StallScope · epoch 0",
        "StallScope · epoch 3 (2 more since the last panel)",
        "StallScope · epoch 6 (2 more since the last panel)",
        "StallScope · epoch 9 (2 more since the last panel)",
        "StallScope · run (12 epochs)",
    ]
    assert len(_read(tmp_path)["epochs"]) == 12  # every epoch is in the report all the same


def _hold_until_closed(writer: writer_module.ReportWriter) -> None:
    """``ReportWriter._run`` that writes nothing: it waits for ``close``."""
    with writer._cond:
        while not writer._closed:
            writer._cond.wait()


class _Costly:
    """Replaces the report write and the panel print: counts them, and makes each take time on the
    fake clock (a write 2 ms; the n-th panel ``panel_ms[n]``, the last value for every later one:
    1 ms by default), as they do for real. A report left pending is written by a later epoch end
    only, never by the writer's thread: that one looks at the clock when real time says so, and its
    write would move the fake clock at a moment the test does not choose (test_report_writer.py
    tests the thread)."""

    def __init__(self, clock: FakeClock, monkeypatch: pytest.MonkeyPatch, panel_ms: tuple[float, ...] = (1,)) -> None:
        self.clock = clock
        self.panel_ms = panel_ms
        self.writes: list[bool] = []  # ``durable`` of each write
        self.panels: list[str] = []
        self._write = writer_module.write_report
        self._print = session_module.print_diagnosis
        monkeypatch.setattr(writer_module, "write_report", self.write)
        monkeypatch.setattr(session_module, "print_diagnosis", self.print)
        monkeypatch.setattr(writer_module.ReportWriter, "_run", _hold_until_closed)

    def write(self, report: Any, path: Path, *, durable: bool) -> Any:
        self.clock.advance_ms(2)
        self.writes.append(durable)
        return self._write(report, path, durable=durable)

    def print(self, console: Console, title: str, *args: Any, **kwargs: Any) -> None:
        self.clock.advance_ms(self.panel_ms[min(len(self.panels), len(self.panel_ms) - 1)])
        self.panels.append(title)
        self._print(console, title, *args, **kwargs)


def _one_step_epochs(report_dir: Path, clock: FakeClock, epochs: int, *, epoch_ms: float, steps: int = 1) -> None:
    """A run of ``epochs`` epochs of ``steps`` steps (one by default) of ``epoch_ms`` in all,
    panels on (to memory), default budgets."""
    with StallScope(report_dir, console=Console(file=io.StringIO(), width=100)) as scope:
        for _ in range(epochs):
            for _ in scope.iter(range(steps)):
                with scope.phase("compute"):
                    clock.advance_ms(epoch_ms / steps)


def test_a_thousand_instant_epochs_keep_to_the_budget(
    tmp_path: Path, clocked: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """3,000 epochs of one 1 ms step: printing a panel and writing the report at each would take
    three times the training. They are diagnosed 1,000 at a time (1 s together). Mid-run writes
    take at most 0.25% of the time (give or take the one in progress), panels come at most every
    ``print_interval_s``, and the final report and panel are still written."""
    costly = _Costly(clocked, monkeypatch)
    start = clocked.now
    with StallScope(tmp_path, console=Console(file=io.StringIO(), width=100), print_interval_s=1.5) as scope:
        for _ in range(3000):
            for _ in scope.iter(range(1)):
                with scope.phase("compute"):
                    clocked.advance_ms(1)
    elapsed_ms = (clocked.now - start) / 1e6
    *mid_run, final = costly.writes
    assert final is True  # the final report: durable
    assert not any(mid_run)  # no fsync mid-run
    assert 1 <= len(mid_run) <= 0.0025 * elapsed_ms / 2 + 1
    assert len(mid_run) < 10  # instead of 1,000
    *epoch_panels, run_panel = costly.panels
    assert run_panel == "run (3000 epochs)"
    # the groups close at epochs 999, 1999 and 2999; the second's panel comes 1 s after the first's
    assert epoch_panels == ["epochs 0–999", "epochs 2000–2999 (1 more since the last panel)"]
    data = _read(tmp_path)
    assert data["complete"] is True
    assert len(data["epochs"]) == MAX_EPOCHS_IN_REPORT  # bounded as always: the first ten, the latest
    assert data["epochs"][-1]["index"] == 2999
    assert data["epochs"][-1]["covers_epochs"] == [2000, 2999]
    assert {e.get("diagnosed_with") for e in data["epochs"][:10]} == {999}


def _varied_epochs(report_dir: Path, clock: FakeClock, epochs: int) -> Report | None:
    """A run of short epochs that differ: waits for a loader, compute, now and then a long
    logging phase (an epoch where the frequency rules want the run so far), one longer epoch;
    panels on (to memory). Returns ``scope.report`` as read after epoch 40."""
    read: Report | None = None
    with StallScope(report_dir, console=Console(file=io.StringIO(), width=100)) as scope:
        for epoch in range(epochs):
            steps = 150 if epoch == 25 else 3 + epoch % 4
            for step in scope.iter(TimedLoader(range(steps), clock, wait_ms=0.2 * (epoch % 3), iter_ms=0.1)):
                with scope.phase("compute"):
                    clock.advance_ms(8)
                if epoch % 7 == 3 and step == 0:
                    with scope.phase("logging"):
                        clock.advance_ms(20)
            if epoch == 40:
                read = scope.report
    return read


def test_epochs_closed_later_are_reported_as_if_closed_at_their_ends(
    tmp_path: Path, clocked: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Most ends of short epochs only mark the epoch; a later end closes a few at once. The same
    run with every epoch closed at its end (no epoch may wait) gives the same report (every
    epoch's summary and findings, the run's), the same panels, and the same report mid-run. (No
    host sampler: its samples come from the real machine, in real time.)"""
    monkeypatch.setattr(session_module, "SignalCollector", functools.partial(SignalCollector, host=False))
    costly = _Costly(clocked, monkeypatch)
    marked: list[int] = []
    real_mark = Timeline.mark_epoch

    def counting(self: Timeline, *args: Any, **kwargs: Any) -> bool:
        done = real_mark(self, *args, **kwargs)
        marked.append(done)
        return done

    monkeypatch.setattr(Timeline, "mark_epoch", counting)
    seen: list[tuple[object, ...]] = []  # what each group's diagnosis saw, beyond the span
    real_diagnose = session_module.diagnose
    real_view = Session._group_view
    groups: list[Any] = []  # the contexts of the groups' diagnoses (not the run's)

    def group_view(self: Session, snapshot: Any, signals: Any, known: Any, *args: Any) -> Any:
        def tagged(**kwargs: Any) -> Any:
            groups.append(known(**kwargs))
            return groups[-1]

        return real_view(self, snapshot, signals, tagged, *args)

    def diagnose(context: Any) -> Any:
        if not any(context is g for g in groups):
            return real_diagnose(context)  # the run's: made when a report is, on a budget
        run = context.run_span
        seen.append(
            (
                context.first_epoch,
                context.steps_before,
                context.span.steps,
                context.epoch_steps,
                run and (run.wall_ns, run.steps),
                context.batches_per_epoch,  # what was known when the epoch ended (``_facts``)
                context.logging_calls,
            )
        )
        return real_diagnose(context)

    monkeypatch.setattr(session_module, "diagnose", diagnose)
    monkeypatch.setattr(Session, "_group_view", group_view)
    waited_mid = _varied_epochs(tmp_path / "waited", clocked, 120)
    waited_seen = sorted(seen, key=str)
    waited = _read(tmp_path / "waited")
    waited_panels = list(costly.panels)
    assert sum(marked) >= 60  # most epochs waited
    monkeypatch.setattr(session_module, "MAX_WAITING", 0)
    costly.panels.clear()
    marked.clear()
    seen.clear()
    at_once_mid = _varied_epochs(tmp_path / "at once", clocked, 120)
    at_once = _read(tmp_path / "at once")
    assert not any(marked)
    assert [e["index"] for e in waited["epochs"]] == list(range(120))
    steps = [e["summary"]["steps"] for e in waited["epochs"]]
    # one diagnosis per group of epochs (from its first epoch on), each with what was known when
    # the group closed, whether its epochs waited or not (the run's diagnoses aside: mid-run
    # reports are written on a budget)
    closing = {
        (e["covers_epochs"][0] if "covers_epochs" in e else e["index"], e["index"])
        for e in waited["epochs"]
        if "diagnosed_with" not in e
    }
    assert len(closing) >= 5
    spans = sorted((first, sum(steps[:first]), sum(steps[first : last + 1])) for first, last in closing)
    assert sorted(s[:3] for s in waited_seen) == spans
    assert waited_seen == sorted(seen, key=str)
    assert any(run is not None for *_, run, _, _ in seen)  # a group of long logging: the run so far
    for key in ("epochs", "summary", "findings", "notes", "tail"):
        assert waited.get(key) == at_once.get(key), key
    assert waited_panels == costly.panels
    assert any(title.startswith("epochs ") for title in waited_panels)
    assert waited_mid is not None
    assert at_once_mid is not None
    assert report_to_dict(waited_mid)["epochs"] == report_to_dict(at_once_mid)["epochs"]
    assert len(waited_mid.epochs) == 41


def _loop_raising_from_sigusr1(
    tmp_path: Path, clocked: FakeClock, handler: Callable[[int, object], None], *, epochs: int, match: str
) -> None:
    """``epochs`` epochs of 4 steps under a scope, ``handler`` on SIGUSR1: the ``RuntimeError`` it
    raises reaches the loop (matching ``match``)."""
    previous = signal.signal(signal.SIGUSR1, handler)
    try:
        with (  # noqa: PT012
            pytest.raises(RuntimeError, match=match),
            StallScope(tmp_path, console=False) as scope,
        ):
            for _ in range(epochs):
                for _ in scope.iter(TimedLoader(range(4), clocked, wait_ms=1)):
                    clocked.advance_ms(2)
    finally:
        signal.signal(signal.SIGUSR1, previous)


@pytest.mark.parametrize("where", ["after a mark", "while settling"])
def test_a_signal_handlers_exception_loses_no_waiting_epoch(
    tmp_path: Path, clocked: FakeClock, monkeypatch: pytest.MonkeyPatch, where: str
) -> None:
    """A signal handler's exception (torch's SIGCHLD handler, when a worker dies) raised just
    after an epoch was marked, or while waiting epochs are being kept at the run's end, reaches
    the loop unchanged; the final report still has every epoch once, in order, and their steps
    add up to the run's."""
    monkeypatch.setattr(session_module, "SignalCollector", functools.partial(SignalCollector, host=False))

    def handler(signum: int, frame: object) -> None:
        raise RuntimeError("DataLoader worker (pid 1) is killed by signal: Killed.")

    if where == "after a mark":
        real_mark = Timeline.mark_epoch
        marks: list[int] = []

        def mark(self: Timeline, *args: Any, **kwargs: Any) -> bool:
            done = real_mark(self, *args, **kwargs)
            marks.append(1)
            if len(marks) == 1:
                signal.raise_signal(signal.SIGUSR1)
            return done

        monkeypatch.setattr(Timeline, "mark_epoch", mark)
    else:
        real_keep = Session._keep_epoch
        kept: list[int] = []

        def keep(self: Session, *args: Any, **kwargs: Any) -> Any:
            kept.append(1)
            if len(kept) == 3:  # epoch 2, kept at the run's end
                signal.raise_signal(signal.SIGUSR1)
            return real_keep(self, *args, **kwargs)

        monkeypatch.setattr(Session, "_keep_epoch", keep)
    _loop_raising_from_sigusr1(tmp_path, clocked, handler, epochs=4, match="killed by signal")
    data = _read(tmp_path)
    epochs = [(e["index"], e["summary"]["steps"]) for e in data["epochs"]]
    tail_steps = data["tail"]["steps"] if data.get("tail") else 0
    assert [index for index, _ in epochs] == list(range(len(epochs)))
    assert sum(steps for _, steps in epochs) + tail_steps == data["summary"]["steps"]
    # the loop stops at the exception: at epoch 1's end, or after all four (the run's end)
    assert len(epochs) == (2 if where == "after a mark" else 4)


@pytest.mark.parametrize("cut", [2, 4])
def test_a_run_end_cut_short_by_signal_handlers_again_and_again_still_writes_and_stops(
    tmp_path: Path, clocked: FakeClock, monkeypatch: pytest.MonkeyPatch, cut: int
) -> None:
    """Each dead DataLoader worker's SIGCHLD can raise torch's error again while the run ends
    (seen in a fresh-clone `make test`: a killed worker's run left no report.json, and its host
    sampler and report writer threads ran on into the next tests). The run's end is cut short by
    a signal handler's exception ``cut`` times: twice, then it ends normally, every epoch in its
    report; at every try, then the report of what ran is written the fast way. Either way the
    first exception reaches the loop unchanged and no thread of StallScope's is left."""
    raised: list[int] = []

    def handler(signum: int, frame: object) -> None:
        raised.append(1)
        raise RuntimeError(f"DataLoader worker (pid {len(raised)}) is killed by signal: Killed.")

    real_finish = Session._finish

    def finish(self: Session, *, print_run: bool) -> Any:
        if len(raised) < cut:
            signal.raise_signal(signal.SIGUSR1)
        return real_finish(self, print_run=print_run)

    monkeypatch.setattr(Session, "_finish", finish)
    _loop_raising_from_sigusr1(tmp_path, clocked, handler, epochs=3, match=r"pid 1\) is killed by signal")
    assert len(raised) == cut
    data = _read(tmp_path)
    assert data["summary"]["steps"] == 12
    if cut < FINISH_TRIES:
        assert [e["index"] for e in data["epochs"]] == [0, 1, 2]
        assert not any("interrupted" in note for note in data["notes"])
    else:
        assert any("the final diagnosis was interrupted" in note for note in data["notes"])
    assert [t.name for t in threading.enumerate() if t.name.startswith("stallscope")] == []


@pytest.mark.parametrize(("epoch_ms", "epochs"), [(1500, 6), (1.2, 3000)])
def test_by_default_panels_take_at_most_a_quarter_percent_of_the_run(
    tmp_path: Path, clocked: FakeClock, monkeypatch: pytest.MonkeyPatch, epoch_ms: float, epochs: int
) -> None:
    """A panel costs 1 ms here. Epochs of 1.5 s: every epoch's is printed (1 ms against 1,500).
    Epochs of 1.2 ms (of 30 steps): diagnosed 834 at a time (1 s), each group's panel printed
    (1 ms against 1 s), not 3,000; the last 498 are diagnosed with the run's end, in its panel."""
    costly = _Costly(clocked, monkeypatch)
    _one_step_epochs(tmp_path, clocked, epochs, epoch_ms=epoch_ms, steps=30)
    *epoch_panels, run_panel = costly.panels
    assert run_panel == f"run ({epochs} epochs)"
    if epoch_ms == 1500:
        assert epoch_panels == [f"epoch {i}" for i in range(epochs)]
    else:
        assert epoch_panels == [f"epochs {i}–{i + 833}" for i in range(0, 2502, 834)]


def test_a_slow_first_panel_does_not_hold_back_the_next(
    tmp_path: Path, clocked: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first panel takes 50 ms (rich warming up), the others 1 ms; epochs of 1.5 s: every
    epoch's panel is printed (by the first one's cost alone the next would wait 20 s)."""
    costly = _Costly(clocked, monkeypatch, panel_ms=(50, 1))
    _one_step_epochs(tmp_path, clocked, 6, epoch_ms=1500, steps=30)
    assert costly.panels == [f"epoch {i}" for i in range(6)] + ["run (6 epochs)"]


def test_panels_that_are_always_slow_are_spaced_by_their_cost(
    tmp_path: Path, clocked: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every panel takes 5 ms; epochs of 1.02 s: a panel waits 5 ms / 0.25% = 2 s after the last,
    so every other epoch's is printed (the 1 ms first guess does not stay once two are timed)."""
    costly = _Costly(clocked, monkeypatch, panel_ms=(5,))
    _one_step_epochs(tmp_path, clocked, 9, epoch_ms=1020, steps=30)
    epoch_panels = [p.split(" (")[0] for p in costly.panels[:-1]]
    # epoch 0, then epoch 1 (the wait is the 1 ms guess's 0.4 s), then 2 s apart
    assert epoch_panels == ["epoch 0", "epoch 1", "epoch 3", "epoch 5", "epoch 7"]


def test_the_final_report_has_every_epoch_whatever_was_written_mid_run(
    tmp_path: Path, clocked: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """300 short epochs, most of whose reports are never written mid-run: the final report still
    has each epoch's summary, and the findings of each group of epochs diagnosed together
    (every 50th epoch logs slowly: logging.frequency)."""
    costly = _Costly(clocked, monkeypatch)
    with StallScope(tmp_path, console=False) as scope:
        for i in range(300):
            for _ in scope.iter(range(1 + i % 3)):
                with scope.phase("compute"):
                    clocked.advance_ms(4)
                with scope.phase("logging"):
                    clocked.advance_ms(40 if i % 50 == 7 else 0)
    assert len(costly.writes) < 50  # most epochs' reports were skipped
    epochs = _read(tmp_path)["epochs"]
    assert [e["index"] for e in epochs] == list(range(300))
    assert [e["summary"]["steps"] for e in epochs] == [1 + i % 3 for i in range(300)]
    closing = [e for e in epochs if "diagnosed_with" not in e]
    assert len(closing) >= 2
    first = 0
    for e in closing:  # each group: the epochs since the previous one
        assert e["covers_epochs"] == [first, e["index"]]
        assert all(g["diagnosed_with"] == e["index"] and not g["findings"] for g in epochs[first : e["index"]])
        assert any(f["id"] == "logging.frequency" for f in e["findings"])
        first = e["index"] + 1
    assert first == 300


def test_a_short_epoch_is_diagnosed_when_needed_a_long_one_at_its_end(
    monkeypatch: pytest.MonkeyPatch, clocked: FakeClock
) -> None:
    """A short epoch's report is made when something needs it (here ``scope.report``), with
    the others waiting; an epoch of ``MAKE_AT_ONCE_STEPS`` steps or more has it made at its end
    (its snapshot's copy of the step times is not kept waiting)."""
    diagnosed: list[int] = []
    real = session_module.diagnose

    def counting(context: Any) -> Any:
        diagnosed.append(context.span.steps)
        return real(context)

    monkeypatch.setattr(session_module, "diagnose", counting)
    with StallScope(None, console=False) as scope:
        for _ in scope.iter(range(10)):
            clocked.advance_ms(1)
        assert diagnosed == []
        for _ in scope.iter(range(MAKE_AT_ONCE_STEPS)):
            clocked.advance_ms(1)
        # the long epoch closes the group of both: its report (and the group's diagnosis) at once
        assert diagnosed == [10 + MAKE_AT_ONCE_STEPS]
        report = scope.report
        assert report is not None
        assert diagnosed == [10 + MAKE_AT_ONCE_STEPS] * 2  # then the run's
        assert [e.summary.steps for e in report.epochs] == [10, MAKE_AT_ONCE_STEPS]
        assert [(e.diagnosed_with, e.covers_epochs) for e in report.epochs] == [(1, None), (None, (0, 1))]


# -- the user's exceptions pass through unchanged --------------------------------------------


def _assert_pristine(error: BaseException) -> None:
    """Nothing of StallScope's got chained onto the user's exception."""
    assert error.__cause__ is None
    assert error.__context__ is None


def test_error_in_the_loop_body_propagates_and_the_report_is_written(tmp_path: Path, clocked: FakeClock) -> None:
    error = Boom("the user's bug")
    scope = StallScope(tmp_path, console=False)

    def train() -> None:
        with scope:
            for i, _ in enumerate(scope.iter(TimedLoader(range(10), clocked, wait_ms=1))):
                _train_step(scope, clocked)
                if i == 2:
                    raise error

    with pytest.raises(Boom) as caught:
        train()
    assert caught.value is error
    _assert_pristine(caught.value)
    data = _read(tmp_path)
    assert data["complete"] is True
    assert data["summary"]["steps"] == 3
    assert [e["summary"]["steps"] for e in data["epochs"]] == [3]
    assert any("Boom: the user's bug" in note for note in data["notes"])
    assert scope.report is not None
    assert report_to_dict(scope.report) == data


def test_error_in_a_phase_propagates_and_the_phase_is_closed(tmp_path: Path, clocked: FakeClock) -> None:
    error = Boom("out of memory, say")
    scope = StallScope(tmp_path, console=False)

    def train() -> None:
        with scope:
            for i, _ in enumerate(scope.iter(TimedLoader(range(10), clocked, wait_ms=1))):
                with scope.phase("compute"):
                    clocked.advance_ms(3)
                    if i == 1:
                        raise error

    with pytest.raises(Boom) as caught:
        train()
    assert caught.value is error
    _assert_pristine(caught.value)
    assert scope._session.timeline.depth == 0  # the phase was left on the way out
    data = _read(tmp_path)
    assert data["summary"]["steps"] == 2
    assert data["summary"]["phase_fractions"]["compute"] == pytest.approx(0.75)  # 6 of 8 ms
    assert any("Boom: out of memory, say" in note for note in data["notes"])


class _FailingLoader:
    """A loader whose ``iter()`` or ``next()`` raises ``error`` (after ``good`` items)."""

    def __init__(self, error: BaseException, *, on: str, good: int = 0) -> None:
        self.error = error
        self.on = on
        self.good = good

    def __iter__(self) -> Iterator[int]:
        if self.on == "iter":
            raise self.error
        return self

    def __next__(self) -> int:
        if self.good == 0:
            raise self.error
        self.good -= 1
        return self.good


@pytest.mark.parametrize(("on", "steps"), [("iter", 0), ("next", 2)])
def test_error_from_the_loader_propagates_and_the_report_is_written(tmp_path: Path, on: str, steps: int) -> None:
    error = Boom(f"corrupt file in {on}")
    scope = StallScope(tmp_path, console=False)

    def train() -> None:
        with scope:
            for _ in scope.iter(_FailingLoader(error, on=on, good=2)):
                with scope.phase("compute"):
                    pass

    with pytest.raises(Boom) as caught:
        train()
    assert caught.value is error
    _assert_pristine(caught.value)
    data = _read(tmp_path)
    assert data["complete"] is True
    assert data["summary"]["steps"] == steps
    assert any(f"Boom: corrupt file in {on}" in note for note in data["notes"])
    assert scope._session.timeline.depth == 0


@pytest.mark.parametrize("where", ["body", "loader"])
def test_keyboard_interrupt_propagates_and_the_report_is_written(tmp_path: Path, where: str) -> None:
    interrupt = KeyboardInterrupt()
    loader = _FailingLoader(interrupt, on="next", good=3) if where == "loader" else range(10)

    def train() -> None:
        with StallScope(tmp_path, console=False) as scope:
            for i in scope.iter(loader):
                if where == "body" and i == 2:
                    raise interrupt

    with pytest.raises(KeyboardInterrupt) as caught:
        train()
    assert caught.value is interrupt
    data = _read(tmp_path)
    assert data["complete"] is True
    assert data["summary"]["steps"] == 3
    assert "the run was interrupted (KeyboardInterrupt)" in data["notes"]


def test_an_error_the_user_catches_is_not_noted(tmp_path: Path) -> None:
    with StallScope(tmp_path, console=False) as scope:
        for i in scope.iter(range(4)):
            try:
                with scope.phase("compute"):
                    if i == 1:
                        raise Boom("handled")
            except Boom:
                pass
    data = _read(tmp_path)
    assert data["summary"]["steps"] == 4
    assert data["notes"] == []


# -- internal errors turn the scope off, training goes on ------------------------------------


def _planted(*args: object, **kwargs: object) -> NoReturn:
    raise RuntimeError("planted")


def _one_stderr_line(capsys: pytest.CaptureFixture[str]) -> str:
    out, err = capsys.readouterr()
    assert out == ""
    lines = err.splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("stallscope: ")
    assert "RuntimeError: planted" in lines[0]
    return lines[0]


@pytest.mark.parametrize("method", ["_fold", "stream", "data_begin", "data_end", "begin_epoch", "end_epoch_snapshot"])
def test_an_internal_error_turns_the_scope_off_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], method: str
) -> None:
    """A bug hit once: the method fails the first time it is called, then works (the report is
    still written, from what was recorded)."""
    real = getattr(Timeline, method)
    calls = {"n": 0}

    def fails_once(*args: object, **kwargs: object) -> object:
        calls["n"] += 1
        if calls["n"] == 1:
            raise RuntimeError("planted")
        return real(*args, **kwargs)

    monkeypatch.setattr(Timeline, method, fails_once)
    seen = []
    with StallScope(tmp_path, console=False) as scope:
        for epoch in range(2):
            for item in scope.iter(range(5)):
                with scope.phase("compute"):
                    seen.append((epoch, item))
                with scope.phase("logging"):
                    pass
    assert seen == [(epoch, item) for epoch in range(2) for item in range(5)]
    assert not scope.enabled
    line = _one_stderr_line(capsys)
    assert "turned itself off" in line
    data = _read(tmp_path)
    assert any("RuntimeError: planted" in note for note in data["notes"])


def test_an_internal_error_inside_a_phase_turns_the_scope_off_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Phases alone (no ``scope.iter``): the log is folded when a phase ends, inside the user's
    ``with`` block; a failure there is contained and the user's code runs on."""
    monkeypatch.setattr(Timeline, "_fold", _planted)
    seen = []
    with StallScope(tmp_path, console=False) as scope:
        compute = scope.phase("compute")
        for i in range(FOLD_AT):  # enough events to fill the log
            with compute:
                seen.append(i)
        assert not scope.enabled
    assert seen == list(range(FOLD_AT))
    assert "turned itself off" in _one_stderr_line(capsys)


def test_an_internal_error_after_some_steps_keeps_every_item(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    real = Timeline._fold
    calls = {"n": 0}

    def flaky(self: Timeline) -> None:  # the second fold runs inside the loop, mid-pass
        calls["n"] += 1
        if calls["n"] == 2:
            raise RuntimeError("planted")
        real(self)

    monkeypatch.setattr(Timeline, "_fold", flaky)
    items = 4 * FOLD_AT  # two events per item: the log fills every FOLD_AT / 2 items
    with StallScope(tmp_path, console=False) as scope:
        seen = list(scope.iter(range(items)))
        assert not scope.enabled
        seen += list(scope.iter(range(items, items + 3)))  # a later epoch passes items straight through
    assert seen == list(range(items + 3))
    _one_stderr_line(capsys)


def test_a_report_that_cannot_be_written_does_not_stop_training(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from stallscope.report import writer as writer_module

    monkeypatch.setattr(writer_module, "write_report", _planted)
    with StallScope(tmp_path, console=False) as scope:
        totals = [sum(scope.iter(range(5))) for _ in range(3)]
    assert totals == [10, 10, 10]
    assert "turned itself off" in _one_stderr_line(capsys)


def test_an_exception_whose_str_fails_still_propagates_unchanged(tmp_path: Path) -> None:
    class Unprintable(Exception):
        def __str__(self) -> str:
            raise RuntimeError("cannot print me")

    error = Unprintable()

    def train() -> None:
        with StallScope(tmp_path, console=False) as scope:
            for _ in scope.iter(range(3)):
                raise error

    with pytest.raises(Unprintable) as caught:
        train()
    assert caught.value is error
    assert "the run ended with an exception (Unprintable)" in _read(tmp_path)["notes"]


def test_a_worker_traceback_in_an_exception_becomes_one_line_in_the_note(tmp_path: Path) -> None:
    """A DataLoader worker's exception arrives with the worker's traceback in its message: the
    note keeps its first and last lines; the exception itself propagates unchanged."""
    message = (
        "Caught ValueError in DataLoader worker process 0.\nOriginal Traceback (most recent call last):\n"
        '  File "data.py", line 3, in __getitem__\n    raise ValueError("bad row 7")\nValueError: bad row 7\n'
    )
    error = ValueError(message)

    def train() -> None:
        with StallScope(tmp_path, console=False) as scope:
            for _ in scope.iter(range(3)):
                raise error

    with pytest.raises(ValueError, match="bad row 7") as caught:
        train()
    assert caught.value is error
    notes = [n for n in _read(tmp_path)["notes"] if "ended with an exception" in n]
    assert notes == [
        "the run ended with an exception (ValueError: Caught ValueError in DataLoader worker process 0."
        " ... ValueError: bad row 7)"
    ]


def test_an_internal_error_after_next_keeps_the_item(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A failure in the bookkeeping after ``next()`` took an item must not drop that item."""
    cpu_calls = {"n": 0}

    def broken_cpu_clock() -> int:
        cpu_calls["n"] += 1
        # calls: start, iter() begin/end, then the sampled fetch reads before and after next();
        # fail only the read after next() returned an item
        if cpu_calls["n"] == 5:
            raise RuntimeError("planted")
        return 0

    from stallscope.hooks import session as session_module

    real_session = session_module.Session
    monkeypatch.setattr(
        "stallscope.hooks.scope.Session", lambda config: real_session(config, cpu_clock=broken_cpu_clock)
    )
    with StallScope(tmp_path, console=False) as scope:
        seen = list(scope.iter(range(20)))
    assert seen == list(range(20))
    assert not scope.enabled
    assert "RuntimeError: planted" in _one_stderr_line(capsys)


def test_a_scope_pickles_as_its_configuration(tmp_path: Path) -> None:
    """``ddp_spawn`` pickles the Trainer with its callbacks: a copy arrives unstarted, same settings."""
    import pickle

    scope = StallScope(tmp_path, console=Console(file=io.StringIO()), min_saving=0.05)
    with scope:
        list(scope.iter(range(3)))
    copy = pickle.loads(pickle.dumps(scope))
    assert copy is not scope
    assert copy._config.report_dir == scope._config.report_dir
    assert copy._config.min_saving == 0.05
    assert copy._config.console is True
    assert copy.report is None  # nothing recorded travels
    with copy:
        assert list(copy.iter(range(4))) == [0, 1, 2, 3]
    assert copy.report is not None
    assert copy.report.summary.steps == 4


def test_set_up_inside_the_with_block_is_not_counted(tmp_path: Path, clocked: FakeClock) -> None:
    """Building the model after ``__enter__`` is not idle accelerator time: the clock starts at
    the first ``scope.iter`` (or phase)."""
    with StallScope(tmp_path, console=False) as scope:
        clocked.advance_ms(1000)  # model construction, data set indexing, ...
        for _ in scope.iter(TimedLoader(range(4), clocked, wait_ms=2)):
            _train_step(scope, clocked)
    summary = _read(tmp_path)["summary"]
    assert summary["wall_s"] == pytest.approx(0.040)
    assert summary["phase_fractions"]["other"] == pytest.approx(0.1)


def test_a_phase_before_the_first_iter_starts_the_clock(tmp_path: Path, clocked: FakeClock) -> None:
    with StallScope(tmp_path, console=False) as scope:
        clocked.advance_ms(500)  # not counted
        with scope.phase("checkpoint"):  # loading a checkpoint: counted
            clocked.advance_ms(10)
        for _ in scope.iter(TimedLoader(range(3), clocked, wait_ms=2)):
            _train_step(scope, clocked)
    summary = _read(tmp_path)["summary"]
    assert summary["wall_s"] == pytest.approx(0.040)
    assert summary["phase_seconds"]["checkpoint"] == pytest.approx(0.010)


def test_each_save_is_measured_and_the_copy_probe_is_not_in_the_run(tmp_path: Path, clocked: FakeClock) -> None:
    """A ``checkpoint`` phase is metered (``signals.saves``): wall time, the bytes written; after
    the first save, a copy of as many bytes is timed once, with the clock paused."""
    probed: list[float] = []

    def probe(nbytes: float) -> float:
        probed.append(nbytes)
        clocked.advance_ms(30)  # the probe's own time: in no phase, in no step
        return 4e-10

    written = iter([0, 1_000_000, 1_000_000, 3_000_000])
    with StallScope(tmp_path, console=False) as scope:
        meter = SaveMeter(clock=clocked, cpu_clock=lambda: 0, written=lambda: next(written), probe=probe)
        scope._session.saves = meter
        for i in scope.iter(TimedLoader(range(4), clocked, wait_ms=2)):
            _train_step(scope, clocked)
            if i % 2 == 1:
                with scope.phase("checkpoint"):
                    clocked.advance_ms(10)
    summary = meter.summary()
    assert summary is not None
    assert (summary.saves, summary.wall_ns, summary.bytes, summary.copy_s_per_byte) == (2, 20 * MS, 3_000_000, 4e-10)
    assert probed == [1_000_000]
    data = _read(tmp_path)["summary"]
    assert data["phase_seconds"]["checkpoint"] == pytest.approx(0.020)
    assert data["wall_s"] == pytest.approx(4 * 0.010 + 0.020)


def _failing_save(scope: StallScope, clock: FakeClock) -> None:
    with scope.phase("checkpoint"):
        clock.advance_ms(3)
        raise OSError("disk full")


def test_a_save_that_raises_is_measured_and_the_error_propagates(tmp_path: Path, clocked: FakeClock) -> None:
    with StallScope(tmp_path, console=False) as scope:
        meter = SaveMeter(clock=clocked, cpu_clock=lambda: 0, written=lambda: 0)
        scope._session.saves = meter
        for _ in scope.iter(TimedLoader(range(2), clocked, wait_ms=2)):
            with pytest.raises(OSError, match="disk full"):
                _failing_save(scope, clocked)
    assert not any("turned itself off" in note for note in _read(tmp_path)["notes"])
    summary = meter.summary()
    assert summary is not None
    assert (summary.saves, summary.wall_ns) == (2, 6 * MS)


def test_a_scope_with_no_steps_writes_an_empty_report(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with StallScope(tmp_path, console=False) as scope:
        pass
    assert scope.enabled is False  # closed, not failed
    assert capsys.readouterr().err == ""
    data = _read(tmp_path)
    assert data["complete"] is True
    assert data["summary"]["steps"] == 0


def test_a_loader_error_does_not_make_a_later_internal_error_look_like_the_users(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """After the user's loader raised once (caught by the user), a later StallScope failure inside
    the stream is still contained, not re-raised into the loop."""

    class Flaky:
        def __iter__(self) -> Iterator[int]:
            yield 1
            raise Boom("the user's loader")

    with StallScope(tmp_path, console=False) as scope:
        with pytest.raises(Boom):
            list(scope.iter(Flaky()))

        def broken(self: Timeline) -> None:
            raise RuntimeError("planted")

        monkeypatch.setattr(Timeline, "_fold", broken)  # the stream folds the log mid-pass
        assert list(scope.iter(range(FOLD_AT))) == list(range(FOLD_AT))
    assert not scope.enabled
    assert "RuntimeError: planted" in _one_stderr_line(capsys)


def test_the_no_fix_line_states_the_configured_threshold(tmp_path: Path) -> None:
    out = io.StringIO()
    with StallScope(tmp_path, console=Console(file=out, width=100), min_saving=0.5) as scope:
        for _ in scope.iter(range(8)):
            with scope.phase("compute"):
                pass
    assert "no fix predicted to save 50% or more" in out.getvalue()


def test_stallscope_own_epoch_end_work_is_not_counted(
    tmp_path: Path, clocked: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The diagnosis, print and report write at an epoch end take StallScope's time, not the run's:
    they must not show up as ``other`` (idle) in the next epoch or in the run."""
    from stallscope.report import writer as writer_module

    real_write = writer_module.write_report

    def slow_write(*args: Any, **kwargs: Any) -> Any:
        clocked.advance_ms(500)  # an fsync on a slow disk
        return real_write(*args, **kwargs)

    monkeypatch.setattr(writer_module, "write_report", slow_write)
    with StallScope(tmp_path, console=False) as scope:
        for _ in range(3):
            for _ in scope.iter(TimedLoader(range(4), clocked, wait_ms=2)):
                _train_step(scope, clocked)
    data = _read(tmp_path)
    # 3 epochs x 4 steps x 10 ms
    assert data["summary"]["wall_s"] == pytest.approx(0.120)
    assert data["summary"]["phase_fractions"]["other"] == pytest.approx(0.1)
    for epoch in data["epochs"]:
        assert epoch["summary"]["wall_s"] == pytest.approx(0.040)
    assert [w["idle_fraction"] for w in data["summary"]["idle_windows"]] == pytest.approx(
        [0.5] * len(data["summary"]["idle_windows"])
    )


def test_any_non_empty_name_is_a_phase_and_names_are_bounded(tmp_path: Path) -> None:
    """SPEC: any other name is allowed. Names made per step are capped, not grown without end."""
    from stallscope.hooks.scope import MAX_PHASE_NAMES

    with StallScope(tmp_path, console=False) as scope:
        for i in scope.iter(range(MAX_PHASE_NAMES + 50)):
            with scope.phase("x" * 100 if i == 0 else f"batch {i}\n"):
                pass
    data = _read(tmp_path)
    fractions = data["summary"]["phase_fractions"]
    assert "x" * 100 in fractions
    assert len(fractions) <= MAX_PHASE_NAMES + 8
    assert sum(fractions.values()) == pytest.approx(1.0)
    assert any("phase names" in note for note in data["notes"])


def test_a_phase_timed_inside_the_loader_nests_in_the_wait(tmp_path: Path, clocked: FakeClock) -> None:
    """An in-process loader that times its own decoding: the decode time is its own phase, the
    rest of the wait is data, and nothing goes negative or is counted twice."""
    with StallScope(tmp_path, console=False) as scope:

        def batches() -> Iterator[int]:
            for i in range(4):
                clocked.advance_ms(1)  # reading
                with scope.phase("decode"):
                    clocked.advance_ms(3)
                yield i

        for _ in scope.iter(batches()):
            with scope.phase("compute"):
                clocked.advance_ms(5)
    summary = _read(tmp_path)["summary"]
    assert summary["wall_s"] == pytest.approx(0.036)
    seconds = summary["phase_seconds"]
    assert seconds["decode"] == pytest.approx(0.012)
    assert seconds["data"] == pytest.approx(0.004)
    assert seconds["compute"] == pytest.approx(0.020)
    assert seconds["other"] == pytest.approx(0.0)


def test_a_pass_over_the_same_loader_reuses_its_reading_until_a_setting_changes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Many short epochs over one DataLoader: its settings and first batch are read at its first
    pass, not at every one; a changed ``num_workers`` is read again (and shows in the report), and
    so is another loader."""
    counted: list[object] = []
    real = scope_module.count_tensors

    def counting(batch: object) -> int | None:
        counted.append(batch)
        return real(batch)

    monkeypatch.setattr(scope_module, "count_tensors", counting)
    loader = DataLoader(TensorDataset(torch.randn(8, 2)), batch_size=4)
    with StallScope(tmp_path, console=False) as scope:
        for _ in range(3):
            for _ in scope.iter(loader):
                pass
        assert len(counted) == 1
        loader.num_workers, loader.prefetch_factor = 1, 2  # allowed on a DataLoader once made
        for _ in scope.iter(loader):
            pass
        assert len(counted) == 2
        other = DataLoader(TensorDataset(torch.randn(8, 2), torch.randn(8, 1)), batch_size=4)
        for _ in scope.iter(other):
            pass
        assert len(counted) == 3
        assert scope._session.batch_tensors == 2  # the other loader's batch: read, not reused
        for _ in scope.iter(loader):
            pass
        assert scope._session.batch_tensors == 1
    report = scope.report
    assert report is not None
    assert report.run.dataloader is not None
    assert report.run.dataloader["num_workers"] == 1
    assert scope._loaders._last is None  # the loader is not held after the run


class _RecordingMeter:
    """Stands in for the session's ``logging_calls``: records begin / end."""

    def __init__(self) -> None:
        self.events: list[str] = []

    def begin(self) -> None:
        self.events.append("begin")

    def end(self, weight: int = 1) -> None:
        self.events.append(f"end x{weight}")

    def summary(self) -> None:
        return None


def test_a_plain_logging_phase_has_its_first_calls_and_then_one_in_eight_measured(tmp_path: Path) -> None:
    """40 logging phases: the first 16 are measured, then every 8th (24, 32, 40), each counted
    for the 8 calls it stands for, each begun and ended inside the phase; a logging phase inside
    another is part of it; a call that raises is ended too, and the user's exception comes out
    unchanged."""
    meter = _RecordingMeter()
    with StallScope(tmp_path, console=False) as scope:
        scope._session.logging_calls = meter  # type: ignore[assignment]
        for _ in scope.iter(range(40)):
            with scope.phase("logging"):
                pass
        assert meter.events == ["begin", "end x1"] * 16 + ["begin", "end x8"] * 3
        meter.events.clear()
        for _ in scope.iter(range(8)):  # calls 41..48, each with a nested one: only 48 measured
            with scope.phase("logging"), scope.phase("logging"):
                pass
        assert meter.events == ["begin", "end x8"]
        meter.events.clear()

        def logs_until_the_tracker_fails() -> None:
            for _ in scope.iter(range(8)):  # calls 49..56: the 56th is measured, and raises
                with scope.phase("logging"):
                    if len(meter.events) == 1:
                        raise KeyError("tracker")

        with pytest.raises(KeyError, match="tracker"):
            logs_until_the_tracker_fails()
        assert meter.events == ["begin", "end x8"]
        assert scope.enabled


def test_a_pass_that_yields_nothing_leaves_the_first_batch_to_count_for_the_next(tmp_path: Path) -> None:
    """The loader read anew, but its pass yielded no batch: the next pass over it (not read
    anew) counts its first batch."""
    data: list[tuple[torch.Tensor, ...]] = []
    with StallScope(tmp_path, console=False) as scope:
        for _ in scope.iter(data):
            pass
        assert scope._session.batch_tensors is None
        data.append((torch.zeros(2), torch.zeros(2), torch.zeros(2)))
        for _ in scope.iter(data):
            pass
        assert scope._session.batch_tensors == 3


def _epochs_of(report_dir: Path, clock: FakeClock, epochs: int, steps: int, *, compute_ms: float) -> Report | None:
    """``epochs`` epochs of ``steps`` steps of ``compute_ms`` compute and 2 ms of logging each
    (a planted cause: ``logging.frequency``)."""
    with StallScope(report_dir, console=Console(file=io.StringIO(), width=100)) as scope:
        for _ in range(epochs):
            for _ in scope.iter(range(steps)):
                with scope.phase("compute"):
                    clock.advance_ms(compute_ms)
                with scope.phase("logging"):
                    clock.advance_ms(2)
    return scope.report


def test_a_hundred_short_epochs_keep_every_summary_and_are_diagnosed_in_groups(
    tmp_path: Path, clocked: FakeClock
) -> None:
    """100 epochs of 30 steps of 1 ms compute and 2 ms logging (90 ms each): each too short to
    judge. Every epoch has its own summary; the epochs are diagnosed 12 at a time (1.08 s
    together), the findings on the last of each group with ``covers_epochs``, the planted cause
    first; every other epoch has no findings and says where they are; the run's end diagnoses
    the 4 epochs left. The run's findings are the run's, as always."""
    report = _epochs_of(tmp_path, clocked, 100, 30, compute_ms=1)
    assert report is not None
    data = _read(tmp_path)
    epochs = data["epochs"]
    assert [e["index"] for e in epochs] == list(range(100))
    assert all(e["summary"]["steps"] == 30 and e["summary"]["wall_s"] == pytest.approx(0.09) for e in epochs)
    closing = [e["index"] for e in epochs if "diagnosed_with" not in e]
    assert closing == [*range(11, 96, 12), 99]
    first = 0
    for last in closing:
        e = epochs[last]
        assert e.get("covers_epochs") == [first, last]
        assert e["findings"][0]["id"] == "logging.frequency"
        for short in epochs[first:last]:
            assert short["diagnosed_with"] == last
            assert short["findings"] == []
            assert "covers_epochs" not in short
        first = last + 1
    assert epochs[-1]["findings"][0]["confidence"] == "low"  # 4 epochs, 0.36 s: too short to judge
    assert data["findings"][0]["id"] == "logging.frequency"
    assert report_from_dict(data).epochs[11].covers_epochs == (0, 11)  # the validator reads it back


def test_epochs_long_enough_to_judge_are_diagnosed_each_alone_as_before(
    tmp_path: Path, clocked: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Epochs of 400 steps of 3 ms (1.2 s): each long enough, each closes its own group: the
    report is the one made with no grouping at all (every epoch judged alone)."""
    monkeypatch.setattr(session_module, "SignalCollector", functools.partial(SignalCollector, host=False))
    _epochs_of(tmp_path / "grouped", clocked, 4, 400, compute_ms=1)
    grouped = _read(tmp_path / "grouped")
    monkeypatch.setattr(session_module, "MIN_JUDGED_STEPS", 0)
    monkeypatch.setattr(session_module, "MIN_JUDGED_WALL_S", 0.0)
    _epochs_of(tmp_path / "alone", clocked, 4, 400, compute_ms=1)
    alone = _read(tmp_path / "alone")
    assert all("covers_epochs" not in e and "diagnosed_with" not in e for e in grouped["epochs"])
    assert all(e["findings"][0]["id"] == "logging.frequency" for e in grouped["epochs"])
    for key in ("epochs", "summary", "findings"):
        assert grouped[key] == alone[key], key
