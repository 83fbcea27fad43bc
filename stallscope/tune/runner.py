"""One trial: the user's command as a child process, with the trial's plan in its environment.

The child runs in a process group of its own (``start_new_session``): a DataLoader's workers and
anything else it starts are in it. A launcher may start processes in sessions of their own
(``torchrun`` starts each rank so), out of that group: every process of the trial carries the
trial's folder in its environment (``STALLSCOPE_TRIAL_DIR``, inherited), and that is how
``stop_group`` finds them all. It sends the child's group SIGTERM (a launcher passes it on to its
ranks), then SIGKILL to the group and to every process of the trial still there. A trial is
stopped when it runs past its timeout (the trial's budget x2); whatever happens, Ctrl-C included,
``run_trial`` leaves no process of the trial running.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from stallscope.tune.plan import DIR_VAR, TrialPlan

Status = Literal["ok", "short", "failed", "hung", "interrupted"]

#: how long a group has after SIGTERM before SIGKILL
GRACE_S = 3.0
#: how long, after the SIGKILL, tune waits for the group's last processes to be gone (it goes on
#: as soon as they are; one killed inside a disk write, for one, dies only when the write ends).
#: Under ``make test-busy`` a trial's process outlived tune's Ctrl-C three times: a Ctrl-C that
#: lands while ``Popen`` starts the child left it unstopped (``_SignalsHeld``)
GONE_WAIT_S = 10.0
#: how often the child is polled
POLL_S = 0.05
#: the most losses read from a trial's output, and how much of it is read
MAX_PRINTED_LOSSES = 32
MAX_OUTPUT_READ = 1 << 20
#: a loss a script printed: ``loss 2.31``, ``loss: 2.31``, ``loss=2.31``, ``'loss': 2.31``,
#: ``'loss': '2.31'`` (transformers 5), ``loss: tensor(2.3100, ...)``, ``loss nan`` (not
#: ``val_loss``: the word must start there)
PRINTED_LOSS = re.compile(
    r"""(?<![\w])['"]?loss['"]?\s*[:=]?\s*(?:tensor\(|['"])?([-+]?(?:\d+\.\d*|\.\d+|\d+)(?:[eE][-+]?\d+)?|nan|[-+]?inf)""",
    re.IGNORECASE,
)
#: a progress bar's update up to its closing bracket (tqdm: ``... 3.90it/s, loss=1.9]``): what it
#: shows depends on the clock
PROGRESS_BAR = re.compile(r"^.*?(?:it/s|s/it|%\|)[^\]]*\]?")


@dataclass(frozen=True)
class TrialOutcome:
    """What one trial did."""

    plan: TrialPlan
    #: ok: the budget ran out and the trial stopped itself; short: the command ended first, with
    #: some steps measured; failed: it exited with an error or measured nothing; hung: stopped
    #: at its timeout; interrupted: Ctrl-C
    status: Status
    returncode: int | None
    wall_s: float
    #: the trial's ``trial.json``, when it wrote one
    result: Mapping[str, Any] | None
    #: the trial's output (stdout and stderr)
    log: Path
    message: str = ""

    @property
    def steps_per_s(self) -> float | None:
        value = (self.result or {}).get("steps_per_s")
        return float(value) if isinstance(value, (int, float)) and value > 0 else None

    @property
    def report(self) -> Path:
        return self.plan.report_dir / "report.json"

    @property
    def losses(self) -> list[float]:
        """The first losses of the trial: as its framework handed them over (``trial.json``), else
        as the script printed them (``printed_losses``; not for a job of several ranks, whose
        output interleaves theirs in an order that changes from run to run)."""
        handed = (self.result or {}).get("losses")
        if handed:
            return [float(v) for v in handed]
        if int((self.result or {}).get("ranks") or 1) > 1:
            return []
        return printed_losses(self.log)

    @property
    def losses_printed(self) -> bool:
        """Whether ``losses`` come from the trial's output rather than from its framework."""
        return not (self.result or {}).get("losses")


def printed_losses(log: Path, limit: int = MAX_PRINTED_LOSSES) -> list[float]:
    """The first ``limit`` losses a script printed, from its output (a plain loop's ``print``, a
    transformers Trainer's log lines). Progress bars are skipped: what they show depends on the
    clock, so two runs of the same steps would not show the same values. [] when none."""
    try:
        with log.open("rb") as f:
            text = f.read(MAX_OUTPUT_READ).decode("utf-8", "replace")
    except OSError:
        return []
    found: list[float] = []
    for line in re.split(r"[\r\n]", text):
        # a bar's update is cut off, not the line: a print may follow it on the same line
        line = PROGRESS_BAR.sub("", line, count=1)
        for match in PRINTED_LOSS.finditer(line):
            found.append(float(match.group(1)))
            if len(found) >= limit:
                return found
    return found


def stop_group(proc: subprocess.Popen[bytes], grace_s: float = GRACE_S, folder: Path | None = None) -> None:
    """End the trial: SIGTERM to the child's process group, then, after ``grace_s``, SIGKILL to
    the group and to every process of the trial (``folder``: its environment names it) still
    there; reap the child and wait a bounded while until they are all gone."""
    pgid = proc.pid  # start_new_session: the child leads its own group
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGTERM)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=grace_s)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)  # what is left of the group (workers), at once
    stray = trial_processes(folder) if folder is not None else set()
    for pid in stray:  # a rank in a session of its own, its workers
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=grace_s)
    # the processes die of the SIGKILL on their own time (on a busy machine, after the leader was
    # reaped): wait a bounded while until they are gone, so that no trial outlives tune
    gone_by = time.monotonic() + GONE_WAIT_S
    while time.monotonic() < gone_by and (_group_alive(pgid) or any(_alive(pid) for pid in stray)):
        time.sleep(0.01)


def _group_alive(pgid: int) -> bool:
    """Whether a process of the group is still there and not a zombie (one that is, is dead:
    whoever adopted it reaps it)."""
    try:
        os.killpg(pgid, 0)
    except (ProcessLookupError, PermissionError):
        return False
    return any(fields[2] == pgid for fields in _live_stats().values())


def _alive(pid: int) -> bool:
    """Whether process ``pid`` is still there and not a zombie."""
    stat = _stat(Path("/proc") / str(pid))
    return stat is not None and stat[0] != "Z"


def _stat(entry: Path) -> tuple[str, int, int] | None:
    """A /proc entry's state, parent and process group, or None when it is gone."""
    try:
        fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        return fields[0], int(fields[1]), int(fields[2])
    except (OSError, IndexError, ValueError):
        return None


def _live_stats() -> dict[int, tuple[str, int, int]]:
    """Every process that is not a zombie: its state, parent and group (none without /proc)."""
    proc = Path("/proc")
    found: dict[int, tuple[str, int, int]] = {}
    if not proc.is_dir():
        return found
    for entry in proc.iterdir():
        if entry.name.isdigit() and (stat := _stat(entry)) is not None and stat[0] != "Z":
            found[int(entry.name)] = stat
    return found


def trial_processes(folder: Path) -> set[int]:
    """The live processes whose environment says they belong to the trial of ``folder``
    (``STALLSCOPE_TRIAL_DIR``); this process excluded. Empty without /proc."""
    marker = f"{DIR_VAR}={folder}".encode()
    own = os.getpid()
    found: set[int] = set()
    for pid in _live_stats():
        if pid == own:
            continue
        try:
            environ = (Path("/proc") / str(pid) / "environ").read_bytes()
        except OSError:
            continue
        if marker in environ.split(b"\0"):
            found.add(pid)
    return found


def run_trial(
    command: Sequence[str],
    plan: TrialPlan,
    *,
    timeout_s: float,
    cwd: str | os.PathLike[str] | None = None,
    environ: Mapping[str, str] | None = None,
    on_start: Callable[[int], None] | None = None,
    clock: Callable[[], float] = time.monotonic,
) -> TrialOutcome:
    """Run ``command`` as trial ``plan``; stop it after ``timeout_s``. Ctrl-C (KeyboardInterrupt)
    stops the child's group and goes on up."""
    plan.folder.mkdir(parents=True, exist_ok=True)
    log = plan.folder / "output.log"
    env = dict(os.environ if environ is None else environ)
    env.update(plan.environ())
    started = clock()
    with open(log, "wb") as out:
        held = _SignalsHeld()
        try:
            proc = subprocess.Popen(
                list(command),
                cwd=cwd,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        except OSError as exc:
            held.release()
            held.deliver()  # a Ctrl-C while it failed to start: the search stops all the same
            return TrialOutcome(plan, "failed", None, 0.0, None, log, f"could not start the command: {exc}")
        except BaseException:
            held.release()
            raise
        status: Status | None = None
        try:
            held.release()  # inside: a Ctrl-C from here on stops the child's group below
            held.deliver()  # one that came while the child started, likewise
            if on_start is not None:
                on_start(proc.pid)
            while proc.poll() is None:
                if clock() - started > timeout_s:
                    status = "hung"
                    break
                time.sleep(POLL_S)
        except BaseException:
            stop_group(proc, folder=plan.folder)
            raise
        finally:
            # no process of the trial is left
            stop_group(proc, grace_s=0.5 if status is None else GRACE_S, folder=plan.folder)
    wall = clock() - started
    result = with_ranks(read_result(plan.result_path), plan.result_path)
    if status == "hung":
        return TrialOutcome(plan, "hung", proc.returncode, wall, result, log, f"stopped after {timeout_s:.0f} s")
    rc = proc.returncode
    if rc != 0:
        return TrialOutcome(plan, "failed", rc, wall, result, log, f"exited with status {rc}")
    if result is None or not result.get("steps_per_s"):
        why = "no measurement: the command ran no step of a watched loop past warm-up"
        return TrialOutcome(plan, "failed", rc, wall, result, log, why)
    if not result.get("complete"):
        return TrialOutcome(plan, "short", rc, wall, result, log, "the command ended before the trial's budget")
    return TrialOutcome(plan, "ok", rc, wall, result, log)


class _SignalsHeld:
    """Ctrl-C (SIGINT) and SIGTERM held from here until ``release``, and their handlers called by
    ``deliver``. Raised inside ``Popen`` (which waits there for the child's ``exec``), or before
    its result is kept, a KeyboardInterrupt (``stallscope tune`` raises one for a SIGTERM too) left
    a child that nothing stopped, in a session of its own: ``make test-busy`` saw a trial outlive
    tune's Ctrl-C. Only a signal whose handler is Python's is held (SIG_DFL and SIG_IGN need no
    help), and only on the main thread, where Python runs its handlers."""

    SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __init__(self) -> None:
        #: (signal, its handler before) of the signals held, and the signals that came, in order
        self._held: list[tuple[int, Callable[[int, Any], Any]]] = []
        self.came: list[int] = []
        if threading.current_thread() is not threading.main_thread():
            return
        try:
            for signum in self.SIGNALS:
                previous = signal.getsignal(signum)
                if callable(previous):
                    signal.signal(signum, self._note)
                    self._held.append((signum, previous))
        except BaseException:  # a pending handler raised before anything started: all put back
            self.release()
            raise

    def _note(self, signum: int, frame: object) -> None:
        self.came.append(signum)

    def release(self) -> None:
        """Each held signal's own handler again. ``signal.signal`` first runs the handlers of
        signals already pending, and one may raise: the handlers are put back all the same, and
        what it raised goes on up."""
        raised: BaseException | None = None
        held, self._held = self._held, []
        for signum, previous in reversed(held):
            for _ in range(3):
                try:
                    signal.signal(signum, previous)
                    break
                except BaseException as exc:  # a pending handler's: the next try sets it
                    raised = raised or exc
        if raised is not None:
            raise raised

    def deliver(self) -> None:
        """Call the handler of each signal that came while held, as it would have been called."""
        came, self.came = self.came, []
        for signum in came:
            handler = signal.getsignal(signum)
            if callable(handler):
                handler(signum, None)


def with_ranks(result: dict[str, Any] | None, path: Path) -> dict[str, Any] | None:
    """Rank 0's measurement (``result``) with what the job's other ranks applied and could not
    (their ``trial-rank-N.json`` beside ``path``) added to its ``applied`` and ``not_applied``: a
    setting for one rank is applied by that rank."""
    if result is None:
        return None
    others = sorted(path.parent.glob(f"{path.stem}-rank-*{path.suffix}"))
    if others:
        result["ranks"] = 1 + len(others)
    for other in others:
        theirs = read_result(other)
        if theirs is None:
            continue
        for key in ("applied", "not_applied"):
            mine, more = result.get(key), theirs.get(key)
            if isinstance(mine, dict) and isinstance(more, dict):
                result[key] = {**more, **mine}
    return result


def read_result(path: Path) -> dict[str, Any] | None:
    """A trial's ``trial.json``, or None when it wrote none (or not JSON)."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None
