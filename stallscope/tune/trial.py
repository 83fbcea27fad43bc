"""The trial, inside the child process: apply the plan's settings, count steps, stop on budget.

Nothing here runs unless ``STALLSCOPE_TRIAL`` is set (``current``). The hooks call in at three
places: ``StallScope(report_dir=...)`` (the report goes to the trial's folder, never over the
user's), ``scope.iter`` (``Trial.plain_pass``: the loader rebuilt with the settings, a step
boundary before each batch) and the Lightning callback's ``setup`` (``stallscope.tune.lightning``).

The measured window opens after ``warmup_steps`` steps and closes after ``steps`` more, or at the
first step boundary ``seconds`` after it opened; then a plain loop raises ``TrialStop`` (a
``SystemExit`` with status 0: the ``with StallScope`` block still writes its report) and a Lightning
fit sets ``trainer.should_stop``. The measurement goes to ``trial.json`` in the trial's folder:
at the stop, or at the process's exit when the command ended first (``complete: false``).

In a job of several ranks (``torchrun``, Lightning's ``ddp``) every rank must stop at the same
step, or the ones that go on wait in their next collective for the ones that stopped. Rank 0
decides (``JobStop``): when its budget is spent it posts, in the job's rendezvous store, the step
boundary two steps ahead, and every rank stops there; the other ranks look for that key at each
step boundary once their own window opened (one store lookup a step, during a trial only). Without
a store (``torch.distributed`` not initialized), a rank of a job stops by the step budget alone,
which every rank counts alike. Rank 0 writes ``trial.json``; rank N writes ``trial-rank-N.json``.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import time
import weakref
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any, TypeVar

from stallscope.tune.applicable import RANK_KEY, THREADS_KEY
from stallscope.tune.loaders import LOADER_KEYS, is_loader, rebuild
from stallscope.tune.plan import TrialPlan

T = TypeVar("T")

#: losses recorded for the loss-curve check (the first ones after step 0)
MAX_LOSSES = 32


class TrialStop(SystemExit):
    """The trial's budget is spent: the training loop stops at this step boundary (status 0)."""

    def __init__(self) -> None:
        super().__init__(0)


class Meter:
    """Counts steps and keeps the measured window. ``boundary(steps_done)`` is called between two
    steps; it returns True when the budget is spent. The clock is injected."""

    def __init__(self, plan: TrialPlan, clock: Callable[[], float] = time.perf_counter) -> None:
        self.plan = plan
        self._clock = clock
        #: (steps done, time) when the window opened
        self.opened: tuple[int, float] | None = None
        #: (steps in the window, seconds) at the last boundary inside it
        self.last: tuple[int, float] = (0, 0.0)
        self.done = False
        self.steps_seen = 0

    def boundary(self, steps_done: int) -> bool:
        if self.done:
            return True
        now = self._clock()
        self.steps_seen = steps_done
        if self.opened is None:
            if steps_done >= self.plan.warmup_steps:
                self.opened = (steps_done, now)
            return False
        n, seconds = steps_done - self.opened[0], now - self.opened[1]
        self.last = (n, seconds)
        budget = self.plan
        if (budget.steps is not None and n >= budget.steps) or (
            budget.seconds is not None and seconds >= budget.seconds and n >= 1
        ):
            self.done = True
        return self.done


#: how many step boundaries after rank 0's decision the ranks of a job stop at: a rank is at most
#: a step ahead of another when a collective joins them every step
STOP_LEAD = 2


class JobStop:
    """The ranks of a job stop at one step boundary, the one rank 0 posts in the job's store
    (``key``) ``STOP_LEAD`` boundaries after its own budget is spent."""

    def __init__(self, store: Any, rank: int, key: str) -> None:
        self.store = store
        self.rank = rank
        self.key = key
        #: the boundary every rank stops at, once known
        self.stop_at: int | None = None

    def agree(self, spent: bool, steps_done: int) -> bool:
        """Whether this rank stops at boundary ``steps_done`` (``spent``: this rank's own budget
        is spent; called once its measured window has opened)."""
        if self.stop_at is None:
            if self.rank == 0:
                if spent:
                    self.stop_at = steps_done + STOP_LEAD
                    self.store.set(self.key, str(self.stop_at).encode())
            elif self.store.check([self.key]):
                self.stop_at = int(bytes(self.store.get(self.key)).decode())
        return self.stop_at is not None and steps_done >= self.stop_at


def _job_place() -> tuple[int, int, Any]:
    """This process's rank, the job's size (``rank_info``: 0 and 1 for a single process) and the
    job's store (None when ``torch.distributed`` is not initialized)."""
    from stallscope.hooks.distributed import default_store, rank_info

    info = rank_info()
    if info is None:
        return 0, 1, None
    store = None
    with contextlib.suppress(Exception):
        store = default_store()
    return info.rank, info.world_size, store


class Trial:
    """This process's trial: its plan, its meter, what it applied."""

    def __init__(self, plan: TrialPlan, clock: Callable[[], float] = time.perf_counter) -> None:
        self.plan = plan
        self.meter = Meter(plan, clock)
        #: settings applied, and settings not applied with the reason
        self.applied: dict[str, Any] = {}
        self.not_applied: dict[str, str] = {}
        #: the loss of the first steps, where the framework hands it over (Lightning)
        self.losses: list[float] = []
        self.framework = "plain"
        self._steps = 0
        self._written = False
        #: whether the plan's thread count was looked at (``_set_threads``)
        self._threads_done = False
        #: this rank of a job and the job's agreement on where to stop (``_place``), once looked up
        self._place: tuple[int, int, JobStop | None] | None = None
        #: the user's loader -> the one rebuilt with the settings (the same one every epoch, so
        #: persistent workers persist)
        self._rebuilt: weakref.WeakKeyDictionary[Any, Any] = weakref.WeakKeyDictionary()

    # -- the plain loop ------------------------------------------------------------------

    def report_dir(self) -> Path:
        return self.plan.report_dir

    def plain_pass(self, iterable: Iterable[T]) -> Iterable[T]:
        """What ``scope.iter`` iterates in a trial: ``iterable`` (or its rebuilt loader), with a
        step boundary before each item."""
        return self.counted(iter(self.loader(iterable)))

    def loader(self, iterable: Any) -> Any:
        """The user's DataLoader rebuilt with the plan's loader settings (once per loader); with a
        ``"rank"`` among them, on that rank of the job only."""
        keys = {k: v for k, v in self.plan.settings.items() if k in LOADER_KEYS}
        if not keys or not is_loader(iterable):
            return iterable
        if RANK_KEY in self.plan.settings:
            wanted, rank = self.plan.settings[RANK_KEY], _job_place()[0]
            if rank != wanted:
                return iterable  # another rank's setting: this rank's loader is the user's
            keys[RANK_KEY] = wanted  # said applied with the rest
        try:
            made = self._rebuilt.get(iterable)
            if made is None:
                made = self._rebuilt[iterable] = rebuild(iterable, keys)
                self.applied.update(keys)
        except (ValueError, TypeError) as exc:
            for key in keys:
                self.not_applied[key] = str(exc)
            return iterable
        return made

    def counted(self, it: Iterator[T]) -> Iterator[T]:
        """``it``'s items, with a step boundary before each (``TrialStop`` once the budget is spent)."""
        while True:
            if self._spent():
                self.stop()
            try:
                item = next(it)
            except StopIteration:
                return
            self._steps += 1
            yield item

    def step_begin(self) -> None:
        """A step is about to fetch its batch (``scope.batch``): a boundary, then the step."""
        if self._spent():
            self.stop()
        self._steps += 1

    def stop(self) -> None:
        """The budget is spent: write the measurement, and end the loop (``TrialStop``)."""
        self.write()
        raise TrialStop

    # -- any loop ------------------------------------------------------------------------

    def step_end(self, loss: float | None = None) -> bool:
        """A step ended (the Lightning trial's hook); True when the budget is spent."""
        self._steps += 1
        if loss is not None and len(self.losses) < MAX_LOSSES:
            self.losses.append(loss)
        done = self._spent()
        if done:
            self.write()
        return done

    def _set_threads(self) -> None:
        """The plan's ``torch_num_threads``, set at the first step boundary: after the user's
        own set-up (a ``torch.set_num_threads`` of theirs included), before the steps that are
        measured; with a ``"rank"`` in the plan, on that rank only."""
        self._threads_done = True
        threads = self.plan.settings.get(THREADS_KEY)
        if threads is None:
            return
        if RANK_KEY in self.plan.settings and _job_place()[0] != self.plan.settings[RANK_KEY]:
            return
        try:
            import torch

            torch.set_num_threads(int(threads))
        except Exception as exc:  # a bad count (a plan edited by hand): said, and the trial goes on
            self.not_applied[THREADS_KEY] = f"{type(exc).__name__}: {exc}"
            return
        self.applied[THREADS_KEY] = int(threads)

    def _spent(self) -> bool:
        """A step boundary: whether the trial stops here (this rank's budget, or the job's)."""
        if not self._threads_done:
            self._set_threads()
        spent = self.meter.boundary(self._steps)
        if self.meter.opened is None:
            return spent
        if self._place is None:  # the job (if any) is up by the time the window opens
            rank, world, store = _job_place()
            key = f"stallscope/tune/trial{self.plan.number}/stop"
            self._place = (rank, world, JobStop(store, rank, key) if world > 1 and store is not None else None)
        rank, world, job = self._place
        if world <= 1:
            return spent
        if job is None:  # no store: the step budget alone, which every rank counts alike
            budget = self.plan.steps
            opened = self.meter.opened[0]
            return budget is not None and self._steps - opened >= budget
        try:
            return job.agree(spent, self._steps)
        except Exception:  # the store is gone (the job ends): stop by this rank's own budget
            return spent

    def result(self) -> dict[str, Any]:
        n, seconds = self.meter.last
        return {
            "trial": self.plan.number,
            "framework": self.framework,
            "settings": dict(self.plan.settings),
            "applied": self.applied,
            "not_applied": self.not_applied,
            "warmup_steps": self.plan.warmup_steps,
            "steps_total": self._steps,
            "steps": n,
            "seconds": seconds,
            "steps_per_s": n / seconds if n > 0 and seconds > 0 else None,
            "complete": self.meter.done,
            "losses": self.losses,
            "pid": os.getpid(),
        }

    def write(self) -> None:
        """Write ``trial.json`` (atomically), once."""
        if self._written:
            return
        self._written = True
        path = self.plan.result_path
        rank = self._place[0] if self._place is not None else _job_place()[0]
        if rank > 0:
            path = path.with_name(f"{path.stem}-rank-{rank}{path.suffix}")
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(self.result()), encoding="utf-8")
        os.replace(tmp, path)


_current: list[Trial | None] = []


def current(environ: Mapping[str, str] | None = None) -> Trial | None:
    """This process's trial, or None when it is no trial (read once). A plan that cannot be read
    makes no trial: the run goes on as the user wrote it."""
    if _current:
        return _current[0]
    trial: Trial | None = None
    with contextlib.suppress(ValueError, OSError):
        plan = TrialPlan.from_environ(environ)
        if plan is not None:
            trial = Trial(plan)
            atexit.register(_write_at_exit, trial)
    _current.append(trial)
    return trial


def _write_at_exit(trial: Trial) -> None:
    with contextlib.suppress(Exception):
        trial.write()


def report_dir(report_dir: Any) -> Any:
    """The report folder a scope writes to: the trial's in a trial, else ``report_dir``."""
    trial = current()
    if trial is None or report_dir is None:
        return report_dir
    return trial.report_dir()
