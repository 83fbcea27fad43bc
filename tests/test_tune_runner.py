"""The driver's side of a trial (``tune.runner``): the child process, started and stopped."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from stallscope.tune import runner
from stallscope.tune.plan import TrialPlan


def test_a_ctrl_c_while_the_child_starts_leaves_no_trial_running(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ctrl-C lands inside ``Popen`` (it waits there for the child's ``exec``): the child has
    started, in a session of its own, and ``Popen`` has not returned it. ``run_trial`` still
    stops it, and the KeyboardInterrupt goes on up."""
    if signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
        pytest.skip("SIGINT does not raise KeyboardInterrupt here")
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
            runner.run_trial([sys.executable, "-c", "import time; time.sleep(120)"], plan, timeout_s=300)
        assert len(started) == 1
        assert started[0].poll() is not None  # stopped and reaped
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    finally:
        for child in started:  # a failure leaves nothing behind either
            if child.poll() is None:
                child.kill()
                child.wait()
