"""Run the same small training loop bare and under StallScope, and compare what training saw.

``plain_run(body, scope=...)`` runs a plain loop in this process; ``script_run(...)`` runs one in
a fresh interpreter (signals, a stand-in NVML driver through ``LD_LIBRARY_PATH``) and reads what
it printed. An ``Outcome`` holds what training itself observed: the items its body finished, the
exception that ended it (type and message), or the exit status, and the wall time of the loop.
"""

from __future__ import annotations

import contextlib
import gc
import json
import os
import re
import subprocess
import sys
import time
import traceback
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import stallscope
from stallscope import StallScope
from stallscope.report.io import load_report
from stallscope.report.schema import Report
from stallscope.report.writer import JOIN_TIMEOUT_S
from stallscope.signals.sampler import JOIN_TIMEOUT_S as SAMPLER_JOIN_TIMEOUT_S

#: a run under StallScope may take at most this much longer than the bare one, up to its last
#: item. Generous on purpose (a shared, busy machine): what it guards against is a wait per epoch,
#: and a 0.5 s wait at each of 10 epoch ends already exceeds it by far
EXTRA_S = 2.5
#: the scope's exit may take at most this long: the waits it may make are bounded (a report write
#: in progress: ``report.writer.JOIN_TIMEOUT_S``; samplers: ``signals.sampler.JOIN_TIMEOUT_S``),
#: and what it does besides (the run's diagnosis, the final report) gets ``EXTRA_S``
EXIT_S = JOIN_TIMEOUT_S + SAMPLER_JOIN_TIMEOUT_S + EXTRA_S


@dataclass
class Outcome:
    """What the training loop observed."""

    items: list[Any] = field(default_factory=list)
    #: (type name, message) of the exception that ended the loop, None when it ran to its end
    error: tuple[str, str] | None = None
    seconds: float = 0.0
    scope: StallScope | None = None
    #: of ``seconds``, the scope's exit after the loop's last item, or after the exception left the
    #: loop (0 bare)
    exit_s: float = 0.0


def same_error(text: str) -> str:
    """An exception message with process ids taken out (a DataLoader names its worker's pid)."""
    return re.sub(r"pid\(?s?\)? [\d, ]+", "pid N", text)


def plain_run(
    body: Callable[[int, Any], None],
    *,
    data: Callable[[int], Iterable[Any]],
    epochs: int = 3,
    scope: StallScope | None = None,
    phase: str = "compute",
) -> Outcome:
    """``for epoch: for item in data(epoch): body(epoch, item)``, bare or under ``scope``; catches
    anything (KeyboardInterrupt and SystemExit too) and records it."""
    out = Outcome(scope=scope)
    began = time.perf_counter()
    try:
        if scope is None:
            for epoch in range(epochs):
                for item in data(epoch):
                    body(epoch, item)
                    out.items.append(item)
        else:
            looped = 0.0
            try:
                with scope:
                    try:
                        for epoch in range(epochs):
                            for item in scope.iter(data(epoch)):
                                with scope.phase(phase):
                                    body(epoch, item)
                                out.items.append(item)
                    finally:
                        looped = time.perf_counter()
            finally:
                out.exit_s = time.perf_counter() - looped if looped else 0.0
    except BaseException as exc:  # whatever ended the loop is what we compare
        out.error = (type(exc).__name__, same_error(str(exc)))
    out.seconds = time.perf_counter() - began
    return out


def assert_unchanged(bare: Outcome, scoped: Outcome) -> None:
    """Training saw the same thing under StallScope, at a bounded cost: its loop (every epoch's
    end in it) within ``EXTRA_S`` of the bare one's, and the scope's exit within its bounded waits."""
    assert scoped.items == bare.items
    assert scoped.error == bare.error
    timings = {"scoped_s": scoped.seconds, "of_which_exit_s": scoped.exit_s, "bare_s": bare.seconds}
    assert scoped.seconds - scoped.exit_s < bare.seconds + EXTRA_S, timings
    assert scoped.exit_s < EXIT_S, timings


def valid_report(report_dir: Path) -> Report:
    """The report on disk, read back through the CLI's checks (types, ranges, finite numbers)."""
    report = load_report(report_dir)
    assert report.schema_version == 1
    return report


#: where the finalizers of a DataLoader whose worker was killed live: torch's iterator
#: (``_MultiProcessingDataLoaderIter.__del__``) and multiprocessing's (``util.Finalize``: the queue's
#: feeder, the resource sharer that hands a worker's tensors over as file descriptors)
_LOADER_TEARDOWN = ("torch.utils.data.", "torch.multiprocessing.", "multiprocessing.")
_OUR_CODE = os.path.dirname(stallscope.__file__) + os.sep


def loader_teardown(unraisable: Any) -> bool:
    """Whether an exception Python could not raise (``sys.unraisablehook``'s argument) is a dead
    worker's DataLoader being torn down by torch and multiprocessing: their object, and no frame of
    StallScope's between the finalizer and the raise. (Only the exception's own frames: it may have
    been raised while the run's own ConnectionResetError was handled, which came through StallScope's
    wrapper of the loader's ``next()``.)"""
    where = unraisable.object
    module = getattr(where, "__module__", None) or type(where).__module__
    if not module.startswith(_LOADER_TEARDOWN):
        return False
    frames = traceback.extract_tb(unraisable.exc_traceback)
    return not any(frame.filename.startswith(_OUR_CODE) for frame in frames)


@contextlib.contextmanager
def dead_worker_teardown() -> Iterator[list[str]]:
    """Around a run whose DataLoader worker is killed: the exceptions torch's and multiprocessing's
    finalizers raise as they tear its loader down are collected (a line each) instead of failing the
    test. When the worker died while handing a batch over (its tensors go as file descriptors, which
    the parent fetches from the worker's resource sharer), the parent's fetch fails (the run's own
    ConnectionResetError) and so do the finalizers after it; which comes depends on timing, bare as
    under StallScope. Anything else unraisable goes to the hook that was in place (pytest's, which
    fails the test). The garbage is collected before the hook is put back."""
    seen: list[str] = []
    previous = sys.unraisablehook

    def hook(unraisable: Any) -> None:
        try:
            teardown = loader_teardown(unraisable)
        except Exception:  # an object too odd to classify: not known to be torch's
            teardown = False
        if teardown:
            seen.append(f"{unraisable.object!r}: {unraisable.exc_type.__name__}")
        else:
            previous(unraisable)

    sys.unraisablehook = hook
    try:
        yield seen
    finally:
        gc.collect()
        sys.unraisablehook = previous


def numbers(n: int) -> Callable[[int], Iterator[int]]:
    """``data`` for ``plain_run``: n items per epoch, numbered across epochs."""

    def data(epoch: int) -> Iterator[int]:
        yield from range(epoch * n, epoch * n + n)

    return data


# -- in a fresh interpreter ------------------------------------------------------------------

#: a plain loop driven by a JSON config: ``epochs``, ``steps``, ``step_s`` (sleep per step),
#: ``scope`` (False: bare), ``report_dir``, ``nvml_device``, ``sigterm_at`` (item that sends this
#: process SIGTERM), ``handler`` (install a SIGTERM handler that calls sys.exit(143)). Prints
#: each item it finished, then "loop_s <seconds>" (the loop's wall time) when it ends normally.
LOOP = r"""
import json, os, signal, sys, time
cfg = json.loads(sys.argv[1])
if cfg.get("handler"):
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(143))
from stallscope import StallScope

def data(epoch):
    for i in range(cfg["steps"]):
        item = epoch * cfg["steps"] + i
        if item == cfg.get("sigterm_at"):
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(0.5)  # the default action ends the process while it waits here
        yield item

def train(item):
    time.sleep(cfg["step_s"])
    print(item, flush=True)

began = time.perf_counter()
if cfg["scope"]:
    with StallScope(cfg["report_dir"], console=False, nvml_device=cfg.get("nvml_device"),
                    sample_interval_s=0.02) as scope:
        for epoch in range(cfg["epochs"]):
            for item in scope.iter(data(epoch)):
                with scope.phase("compute"):
                    train(item)
else:
    for epoch in range(cfg["epochs"]):
        for item in data(epoch):
            train(item)
print("loop_s", time.perf_counter() - began, flush=True)
"""


@dataclass
class ScriptOutcome:
    """What a loop in a fresh interpreter printed, and how it exited."""

    items: list[int]
    returncode: int
    loop_s: float | None
    stderr: str


def script_run(
    report_dir: Path | None,
    *,
    env: dict[str, str] | None = None,
    timeout: float = 120,
    **cfg: Any,
) -> ScriptOutcome:
    """Run ``LOOP`` (``report_dir`` None: bare) and collect what it printed."""
    settings = {"epochs": 3, "steps": 8, "step_s": 0.005, "scope": report_dir is not None}
    settings.update(cfg)
    settings["report_dir"] = str(report_dir) if report_dir is not None else None
    full_env = dict(os.environ)
    full_env.update(env or {})
    proc = subprocess.run(
        [sys.executable, "-c", LOOP, json.dumps(settings)],
        env=full_env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    items: list[int] = []
    loop_s = None
    for line in proc.stdout.splitlines():
        if line.startswith("loop_s "):
            loop_s = float(line.split()[1])
        elif line.strip().isdigit():
            items.append(int(line))
    return ScriptOutcome(items, proc.returncode, loop_s, proc.stderr)
