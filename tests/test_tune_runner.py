"""The driver's side of a trial (``tune.runner``): the child process, started and stopped."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from stallscope.tune import runner
from stallscope.tune.plan import TrialPlan


@pytest.fixture
def ctrl_c_raises() -> Iterator[None]:
    """Python's own SIGINT handler for the test (KeyboardInterrupt), as in a terminal: a suite
    started in the background by a shell (``make unit``'s two passes) has SIGINT ignored."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def test_a_ctrl_c_while_the_child_starts_leaves_no_trial_running(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, ctrl_c_raises: None
) -> None:
    """Ctrl-C lands inside ``Popen`` (it waits there for the child's ``exec``): the child has
    started, in a session of its own, and ``Popen`` has not returned it. ``run_trial`` still
    stops it, and the KeyboardInterrupt goes on up."""
    started: list[subprocess.Popen[bytes]] = []
    real = subprocess.Popen

    def popen_then_ctrl_c(*args: Any, **kwargs: Any) -> subprocess.Popen[bytes]:
        child = real(*args, **kwargs)
        started.append(child)
        os.kill(os.getpid(), signal.SIGINT)  # before Popen returns
        for _ in range(100):  # Python runs a handler between two bytecodes: give it some
            time.sleep(0)
        return child

    monkeypatch.setattr(runner.subprocess, "Popen", popen_then_ctrl_c)
    plan = TrialPlan(1, tmp_path / "trial", {}, steps=10)
    try:
        with pytest.raises(KeyboardInterrupt):
            runner.run_trial([sys.executable, "-c", "import time; time.sleep(30)"], plan, timeout_s=300)
        assert len(started) == 1
        assert started[0].poll() is not None  # stopped and reaped
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    finally:
        for child in started:  # a failure leaves nothing behind either
            if child.poll() is None:
                child.kill()
                child.wait()


class _Stopped(KeyboardInterrupt):
    """What ``stallscope tune``'s SIGTERM handler raises."""


def _raise_stopped(signum: int, frame: object) -> None:
    raise _Stopped


def test_a_sigterm_while_the_child_starts_leaves_no_trial_running(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A scheduler's SIGTERM, which ``stallscope tune`` turns into a KeyboardInterrupt of its own,
    lands inside ``Popen``: the child is stopped and the handler's exception goes on up."""
    started: list[subprocess.Popen[bytes]] = []
    real = subprocess.Popen

    def popen_then_sigterm(*args: Any, **kwargs: Any) -> subprocess.Popen[bytes]:
        child = real(*args, **kwargs)
        started.append(child)
        os.kill(os.getpid(), signal.SIGTERM)
        for _ in range(100):
            time.sleep(0)
        return child

    previous = signal.signal(signal.SIGTERM, _raise_stopped)
    monkeypatch.setattr(runner.subprocess, "Popen", popen_then_sigterm)
    try:
        with pytest.raises(_Stopped):
            runner.run_trial(
                [sys.executable, "-c", "import time; time.sleep(30)"], TrialPlan(1, tmp_path), timeout_s=300
            )
        assert started[0].poll() is not None
        assert signal.getsignal(signal.SIGTERM) is _raise_stopped
    finally:
        signal.signal(signal.SIGTERM, previous)
        for child in started:
            if child.poll() is None:
                child.kill()
                child.wait()


def test_a_ctrl_c_while_the_command_fails_to_start_still_stops_the_search(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, ctrl_c_raises: None
) -> None:

    def ctrl_c_then_fail(*args: Any, **kwargs: Any) -> None:
        os.kill(os.getpid(), signal.SIGINT)
        for _ in range(100):
            time.sleep(0)
        raise FileNotFoundError("no such command")

    monkeypatch.setattr(runner.subprocess, "Popen", ctrl_c_then_fail)
    with pytest.raises(KeyboardInterrupt):
        runner.run_trial(["no-such-command"], TrialPlan(1, tmp_path), timeout_s=300)
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
