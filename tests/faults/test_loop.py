"""Faults in the user's own loop: its exceptions, interrupts and exits, its DataLoader workers
failing, and signals. StallScope changes none of what training sees, and its report of what ran
is written and readable."""

from __future__ import annotations

import json
import multiprocessing.util
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader, Dataset

from faults.harness import (
    EXIT_S,
    assert_unchanged,
    dead_worker_teardown,
    numbers,
    plain_run,
    script_run,
    valid_report,
)
from stallscope import StallScope
from stallscope._exceptions import ReportError
from stallscope.hooks import session as session_module
from stallscope.report.io import load_report
from stallscope.signals.host import host_info
from stallscope.timeline.recorder import Timeline


def _raise_at(target: int, exc: BaseException) -> Any:
    def body(epoch: int, item: int) -> None:
        if item == target:
            raise exc

    return body


@pytest.mark.parametrize(
    ("exc", "note"),
    [
        (ValueError("planted in the body"), "the run ended with an exception (ValueError: planted in the body)"),
        (KeyboardInterrupt(), "the run was interrupted (KeyboardInterrupt)"),
        (SystemExit(0), "the run stopped at sys.exit(0)"),
        (SystemExit("bye"), "the run stopped at sys.exit('bye')"),
    ],
)
def test_an_exception_interrupt_or_exit_in_the_body(tmp_path: Path, exc: BaseException, note: str) -> None:
    bare = plain_run(_raise_at(13, exc), data=numbers(8))
    scoped = plain_run(_raise_at(13, exc), data=numbers(8), scope=StallScope(tmp_path, console=False))
    assert bare.error is not None
    assert_unchanged(bare, scoped)
    report = valid_report(tmp_path)
    assert report.complete
    assert note in report.notes
    assert "interrupted" not in note or not isinstance(exc, SystemExit)
    assert report.summary.steps == 14  # 13 finished, and the one that raised
    assert [e.summary.steps for e in report.epochs] == [8, 6]


class _Planted(Dataset[torch.Tensor]):
    """Eight samples; ``fault`` at ``at``: "raise" (a ValueError in the worker) or "kill" (the
    worker process SIGKILLs itself)."""

    def __init__(self, fault: str, at: int) -> None:
        self.fault = fault
        self.at = at

    def __len__(self) -> int:
        return 8

    def __getitem__(self, i: int) -> torch.Tensor:
        if i == self.at and torch.utils.data.get_worker_info() is not None:
            if self.fault == "raise":
                raise ValueError(f"sample {i} is unreadable")
            os.kill(os.getpid(), signal.SIGKILL)
        return torch.full((2,), float(i))


#: the loaders' own timeout: how long torch waits for a batch before it looks for dead workers
LOADER_TIMEOUT_S = 20


def _worker_data(fault: str) -> Any:
    def data(epoch: int) -> Iterator[Any]:
        # the fault in the second epoch; the loader's own timeout keeps a lost worker from hanging
        ds = _Planted(fault, at=5 if epoch == 1 else -1)
        yield from DataLoader(ds, batch_size=1, num_workers=1, timeout=LOADER_TIMEOUT_S)

    return data


def _first(batches: list[Any]) -> list[float]:
    return [float(b[0, 0]) for b in batches]


def test_a_dataloader_worker_that_raises(tmp_path: Path) -> None:
    def body(epoch: int, batch: Any) -> None:
        return None

    bare = plain_run(body, data=_worker_data("raise"))
    scoped = plain_run(body, data=_worker_data("raise"), scope=StallScope(tmp_path, console=False))
    assert _first(scoped.items) == _first(bare.items)
    assert bare.error is not None
    assert scoped.error == bare.error
    assert "sample 5 is unreadable" in scoped.error[1]
    report = valid_report(tmp_path)
    assert report.summary.steps == len(bare.items) == 8 + 5  # no step for the batch that never came
    assert report.complete


#: how torch reports a worker that died: which comes first depends on timing, with or without
#: StallScope (the SIGCHLD handler, the broken pipe to the worker, or its end of the queue)
LOST_WORKER = ("RuntimeError", "ConnectionResetError", "EOFError")


def test_a_dataloader_worker_that_is_killed(tmp_path: Path) -> None:
    def body(epoch: int, batch: Any) -> None:
        return None

    with dead_worker_teardown():
        bare = plain_run(body, data=_worker_data("kill"))
    with dead_worker_teardown():
        scoped = plain_run(body, data=_worker_data("kill"), scope=StallScope(tmp_path, console=False))
    # how many batches torch delivers before it notices depends on timing too: each run's own
    assert bare.error is not None
    assert bare.error[0] in LOST_WORKER
    assert scoped.error is not None
    assert scoped.error[0] in LOST_WORKER
    assert _first(scoped.items)[:8] == _first(bare.items)[:8] == [float(i) for i in range(8)]
    # torch learns of the dead worker from its SIGCHLD, which the kernel may hand to another of
    # the process's threads (the loader's own queue feeders, with or without StallScope): the
    # main thread then waits out the loader's timeout and finds the worker gone ("exited
    # unexpectedly"). Bare runs do so too (seen under load: 60 s with a 60 s timeout), so only
    # that path may take the timeout; StallScope's own threads take no signals (test_threads.py).
    # ("exited unexpectedly" also comes at once, from a broken queue: only a run that waited at
    # least the timeout took that path)
    # The scope's own exit is bounded as after any loop (``EXIT_S``); the loop's time is judged
    # apart from it, so that a slow exit is told from a slow loop.
    looped = scoped.seconds - scoped.exit_s
    timings = {"loop_s": looped, "exit_s": scoped.exit_s, "bare_s": bare.seconds, "error": scoped.error}
    assert scoped.exit_s < EXIT_S, timings
    # Torch also waits its own ``MP_STATUS_CHECK_INTERVAL`` (5 s) in places (a look at the
    # workers' status, a worker's join when it shuts the loader down): once, under `make test`,
    # the scoped run took 5.1 s (ConnectionResetError, its exit not timed apart then) where the
    # bare one took 0.09 s. StallScope has no wait of its own in the loop that long.
    status_s = torch.utils.data._utils.MP_STATUS_CHECK_INTERVAL
    if "exited unexpectedly" in scoped.error[1] and looped >= LOADER_TIMEOUT_S:
        assert looped < LOADER_TIMEOUT_S + 2.5, timings
    elif looped >= status_s:
        assert looped < status_s + 2.5, timings
    else:
        assert looped < bare.seconds + 2.5, timings
    report = valid_report(tmp_path)
    assert report.summary.steps == len(scoped.items)  # no step for the batch that never came
    assert report.complete


class _Held:
    """Something a finalizer is attached to."""


def _raising(message: str) -> None:
    raise ConnectionResetError(message)


@pytest.mark.parametrize(
    ("callback", "args", "collected"),
    [(_raising, ("the worker is gone",), True), (load_report, ("/nonexistent/report",), False)],
    ids=["multiprocessing's finalizer", "a finalizer that runs StallScope's code"],
)
def test_only_torch_and_multiprocessing_teardown_is_let_through(
    monkeypatch: pytest.MonkeyPatch, callback: Any, args: tuple[str], collected: bool
) -> None:
    """``dead_worker_teardown`` keeps a killed worker's loader teardown from failing its tests, and
    nothing else: an exception raised in StallScope's code, or in an object of another module, still
    reaches the hook that was in place."""
    passed_on: list[Any] = []
    monkeypatch.setattr(sys, "unraisablehook", lambda u: passed_on.append((u.object, u.exc_type)))
    with dead_worker_teardown() as seen:
        held = _Held()
        multiprocessing.util.Finalize(held, callback, args=args)
        del held
        owned = _Owned()
        del owned
    assert [p[1] for p in passed_on] == ([] if collected else [ReportError]) + [ValueError]
    assert len(seen) == int(collected)
    assert all("Finalize" in line and "ConnectionResetError" in line for line in seen)


def test_teardown_while_the_runs_own_error_is_handled_is_let_through(monkeypatch: pytest.MonkeyPatch) -> None:
    """The finalizers may run while the run's error is handled, and that error came through
    StallScope's code (its wrapper of the loader's ``next()``): the teardown is still torch's."""
    passed_on: list[Any] = []
    monkeypatch.setattr(sys, "unraisablehook", lambda u: passed_on.append(u.exc_type))
    with dead_worker_teardown() as seen:
        held = _Held()
        multiprocessing.util.Finalize(held, _raising, args=("the worker is gone",))
        try:
            load_report(Path("/nonexistent/report"))
        except ReportError:
            del held
    assert passed_on == []
    assert len(seen) == 1


class _Owned:
    """An object of this module whose finalizer raises."""

    def __del__(self) -> None:
        raise ValueError("not torch's teardown")


def test_sigterm_without_a_handler(tmp_path: Path) -> None:
    """The default action kills the process at once: the last report written stays on disk,
    whole (it is replaced atomically). Epochs of 1 s: the second epoch's report is written at its
    end (the first write waits 2 s into the run)."""
    bare = script_run(None, sigterm_at=19, step_s=0.125)
    scoped = script_run(tmp_path, sigterm_at=19, step_s=0.125)
    assert bare.returncode == scoped.returncode == -signal.SIGTERM
    assert scoped.items == bare.items == list(range(19))
    report = valid_report(tmp_path)
    assert not report.complete
    assert [e.index for e in report.epochs] == [0, 1]


def test_sigterm_with_a_handler_that_exits(tmp_path: Path) -> None:
    bare = script_run(None, sigterm_at=19, handler=True)
    scoped = script_run(tmp_path, sigterm_at=19, handler=True)
    assert bare.returncode == scoped.returncode == 143
    assert scoped.items == bare.items == list(range(19))
    assert "Traceback" not in scoped.stderr
    report = valid_report(tmp_path)
    assert report.complete
    assert "the run stopped at sys.exit(143)" in report.notes
    assert report.summary.steps == 19  # the signal came while waiting for item 19: no step for it


# _to_the_process: a diagnosis may run on StallScope's report thread (a mid-run report still being
# written when the run ends), which blocks every signal (``stallscope._threads``). A signal raised
# there with ``signal.raise_signal`` is that thread's alone and stays pending in it, never handled
# (under `make test-busy` the interrupt tests lost their SIGTERM so); a scheduler's SIGTERM or a
# Ctrl-C is sent to the process, and the kernel hands it to a thread that takes it: ``os.kill``.


def _final(thread: threading.Thread) -> bool:
    """Whether a diagnosis on ``thread`` is the final report's: the training thread's, not the
    report thread's for a mid-run report still being written when the run ends. A signal sent
    from the latter reaches the training thread wherever it is then, in a finalizer too (a
    DataLoader iterator's ``__del__``, which swallows the handler's exception: seen under
    `make test-busy`), not while the final report is diagnosed."""
    return thread is threading.main_thread()


@pytest.mark.parametrize("where", ["epoch end", "final report"])
def test_a_signal_handlers_exception_while_stallscope_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, where: str
) -> None:
    """A Python signal handler runs between any two bytecodes, StallScope's too: torch's SIGCHLD
    handler raises ``RuntimeError`` when a worker dies. Raised inside StallScope's own work, at
    the second epoch end or while the final report is diagnosed, it reaches the loop unchanged,
    StallScope does not take it for a failure of its own, and the final report is still written."""

    def handler(signum: int, frame: object) -> None:
        raise RuntimeError("DataLoader worker (pid 1) is killed by signal: Killed.")

    previous = signal.signal(signal.SIGUSR1, handler)
    try:
        scope = StallScope(tmp_path, console=False)
        session = scope._session
        if where == "epoch end":
            real_mark = Timeline.mark_epoch

            def mark(self: Timeline, *args: Any, **kwargs: Any) -> bool:
                done = real_mark(self, *args, **kwargs)
                signal.raise_signal(signal.SIGUSR1)
                return done

            # the second epoch end is the first a short epoch's close waits from: it marks the
            # epoch's end in the timeline (the first epoch is closed at its end)
            monkeypatch.setattr(Timeline, "mark_epoch", mark)
            items = 16
        else:
            real_diagnose, real_finish = session_module.diagnose, session.finish
            finishing: list[int] = []

            def diagnose(*args: Any, **kwargs: Any) -> Any:
                if finishing and len(finishing) == 1 and _final(threading.current_thread()):
                    finishing.append(1)
                    os.kill(os.getpid(), signal.SIGUSR1)  # to the process: see _to_the_process
                return real_diagnose(*args, **kwargs)

            def finish(*args: Any, **kwargs: Any) -> Any:
                finishing.append(1)
                return real_finish(*args, **kwargs)

            monkeypatch.setattr(session_module, "diagnose", diagnose)
            monkeypatch.setattr(session, "finish", finish)
            items = 32
        scoped = plain_run(lambda epoch, item: None, data=numbers(8), epochs=4, scope=scope)
    finally:
        signal.signal(signal.SIGUSR1, previous)
    assert scoped.error == ("RuntimeError", "DataLoader worker (pid N) is killed by signal: Killed.")
    assert len(scoped.items) == items
    report = valid_report(tmp_path)
    assert report.complete
    assert report.summary.steps == items
    assert not any("turned itself off" in n for n in report.notes)


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
@pytest.mark.parametrize("epochs", [1, 3])
def test_an_interrupt_during_the_final_diagnosis_still_writes_the_report(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, signum: int, epochs: int
) -> None:
    """Ctrl-C (Python's own SIGINT handler) or a SIGTERM handler that calls ``sys.exit(143)``
    while the final report is diagnosed: the interrupt reaches the loop unchanged, and the report
    of what ran is written anyway, the fast way (the summary of every step, no findings, a note
    that says so). A one-epoch run had no report on disk before (the first mid-run write waits).
    Python's own SIGINT handler is put in place for the test: a suite started in the background
    by a shell inherits SIGINT ignored, and Python then installs none."""
    previous = signal.signal(signal.SIGTERM, lambda s, f: sys.exit(143))
    previous_int = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        scope = StallScope(tmp_path, console=False)
        session = scope._session
        real_diagnose, real_finish = session_module.diagnose, session.finish
        finishing: list[int] = []

        def diagnose(*args: Any, **kwargs: Any) -> Any:
            if len(finishing) == 1 and _final(threading.current_thread()):
                finishing.append(1)
                os.kill(os.getpid(), signum)  # to the process: see _to_the_process
            return real_diagnose(*args, **kwargs)

        def finish(*args: Any, **kwargs: Any) -> Any:
            finishing.append(1)
            return real_finish(*args, **kwargs)

        monkeypatch.setattr(session_module, "diagnose", diagnose)
        monkeypatch.setattr(session, "finish", finish)
        scoped = plain_run(lambda epoch, item: None, data=numbers(8), epochs=epochs, scope=scope)
    finally:
        signal.signal(signal.SIGTERM, previous)
        signal.signal(signal.SIGINT, previous_int)
    assert len(finishing) == 2  # the interrupt came while the final report was being made
    assert scoped.error == (("KeyboardInterrupt", "") if signum == signal.SIGINT else ("SystemExit", "143"))
    assert len(scoped.items) == 8 * epochs
    report = valid_report(tmp_path)
    assert report.summary.steps == 8 * epochs  # every step, not the last epoch end's
    assert report.findings == ()
    name = "KeyboardInterrupt" if signum == signal.SIGINT else "SystemExit"
    assert f"the final diagnosis was interrupted ({name}): the report holds the run's summary, no findings" in (
        report.notes
    )
    assert scope.report is not None
    assert scope.report.summary.steps == 8 * epochs


def test_a_scope_entered_again_says_so_at_once(tmp_path: Path) -> None:
    """A scope records one run: a second ``with scope:`` after the first ended, or one inside the
    first, raises ``RuntimeError`` before training starts, and the first run's report stays."""
    scope = StallScope(tmp_path / "a", console=False)
    with scope:
        for _ in scope.iter(range(100)):
            pass
        with pytest.raises(RuntimeError, match="cannot be entered twice"), scope:
            pass
        for _ in scope.iter(range(10)):
            pass
    with pytest.raises(RuntimeError, match="has recorded its run already"), scope:
        pass
    report = valid_report(tmp_path / "a")
    assert report.complete
    assert report.summary.steps == 110


def test_two_runs_writing_one_folder_at_once_say_so(tmp_path: Path) -> None:
    """Two runs of one report folder at once (here two scopes of one process, interleaved): the
    later one says, on taking the folder's lock, that another was writing there; the earlier one
    says, at its end, that another run began meanwhile. Neither run is lost without a note."""
    first = StallScope(tmp_path, console=False)
    second = StallScope(tmp_path, console=False)
    with first:
        for _ in first.iter(range(8)):
            pass
        assert (tmp_path / ".stallscope.lock").is_file()
        with second:
            for _ in second.iter(range(4)):
                pass
        for _ in first.iter(range(8)):
            pass
    assert first.report is not None
    assert second.report is not None
    assert any("another run" in n and "was writing this report folder" in n for n in second.report.notes)
    assert any("another run" in n or "lock" in n for n in first.report.notes)
    on_disk = valid_report(tmp_path)  # the run that finished last
    assert on_disk.summary.steps == 16
    assert any("lock" in n or "another run" in n for n in on_disk.notes)
    assert not (tmp_path / ".stallscope.lock").exists()  # released


def test_a_lock_left_by_a_dead_run_is_taken_over_quietly(tmp_path: Path) -> None:
    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True, check=True
    )
    lock = {"pid": int(dead.stdout), "host": host_info().name, "token": "gone"}
    (tmp_path / ".stallscope.lock").write_text(json.dumps(lock), encoding="utf-8")
    with StallScope(tmp_path, console=False) as scope:
        for _ in scope.iter(range(8)):
            pass
    report = valid_report(tmp_path)
    assert not any("another run" in n for n in report.notes)
    assert not (tmp_path / ".stallscope.lock").exists()


def _child_exit_code(pid: int, timeout: float = 30) -> int:
    """The forked child's exit status; a child still running after ``timeout`` s (deadlocked) is
    killed and fails the test."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        time.sleep(0.01)
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    pytest.fail("the forked child did not end: it waits on something of the parent's")


@pytest.mark.parametrize("report_dir", ["scope", None])
@pytest.mark.filterwarnings("ignore:This process .* is multi-threaded:DeprecationWarning")  # Python 3.12+
def test_a_child_forked_inside_the_scope_writes_nothing_and_waits_for_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, report_dir: str | None
) -> None:
    """The loop forks at step 9 and the child leaves through the ``with`` block by ``sys.exit``
    (while the parent's samplers and a report write may be mid-way on other threads): the child
    is not the run, so it writes no report and ends at once; the parent's run goes on whole."""
    monkeypatch.setattr(session_module, "FIRST_WRITE_S", 0.0)  # writes at every epoch end
    folder = tmp_path / report_dir if report_dir else None
    report = tmp_path / "scope" / "report.json"
    scope = StallScope(folder, console=False, sample_interval_s=0.01)
    pid = -1
    before: tuple[int, int] | None = None
    try:
        with scope:
            for epoch in range(3):
                for i in scope.iter(range(8)):
                    with scope.phase("compute"):
                        time.sleep(0.001)
                    if epoch == 1 and i == 1:
                        before = (report.stat().st_mtime_ns, report.stat().st_size) if report.exists() else None
                        pid = os.fork()
                        if pid == 0:
                            sys.exit(0)  # the child leaves through the with block
    except SystemExit:
        if pid != 0:
            raise
        after = (report.stat().st_mtime_ns, report.stat().st_size) if report.exists() else None
        os._exit(0 if after == before else 3)  # 3: the child wrote the report
    assert pid > 0
    assert _child_exit_code(pid) == 0
    assert scope.report is not None
    assert scope.report.summary.steps == 24
    if folder is not None:
        assert valid_report(folder).summary.steps == 24


def test_a_phase_entered_on_another_thread_is_not_the_training_threads(tmp_path: Path) -> None:
    """A logging thread that times ``scope.phase("logging")`` while the training thread computes:
    only the training thread's phases make its steps (no 'logging' share, compute as bare), and
    one note names the other thread."""
    scope = StallScope(tmp_path, console=False)
    stop = threading.Event()

    def logger() -> None:
        while not stop.is_set():
            with scope.phase("logging"):
                time.sleep(0.002)

    side = threading.Thread(target=logger, name="metrics-logger", daemon=True)
    with scope:
        for i in scope.iter(range(40)):
            if i == 0:
                side.start()
            with scope.phase("compute"):
                time.sleep(0.003)
    stop.set()
    side.join(5)
    report = valid_report(tmp_path)
    fractions = report.summary.phase_fractions
    assert fractions.get("logging", 0.0) == 0.0
    assert fractions["compute"] > 0.5
    assert abs(sum(fractions.values()) - 1) < 0.01
    notes = [n for n in report.notes if "another thread than the training thread" in n]
    assert len(notes) == 1
    assert "metrics-logger" in notes[0]


@pytest.mark.filterwarnings("ignore:This process .* is multi-threaded:DeprecationWarning")  # Python 3.12+
def test_a_scope_made_before_a_fork_is_the_childs_to_use(tmp_path: Path) -> None:
    """A scope made but not yet entered when the process forks (training run in a forked
    process) records the child's run as usual."""
    scope = StallScope(tmp_path, console=False)
    pid = os.fork()
    if pid == 0:
        try:
            with scope:
                for _ in scope.iter(range(12)):
                    pass
        finally:
            os._exit(0)
    assert _child_exit_code(pid) == 0
    assert valid_report(tmp_path).summary.steps == 12
