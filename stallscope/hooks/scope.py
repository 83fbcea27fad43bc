"""``StallScope``: the plain-loop context manager (SPEC §2).

Recording only. Each public method does O(1) work (amortized: the timeline folds its event log
in batches) and never lets an internal error reach the user: the first one turns the scope off
(``_fail``), is noted in the report, and training goes on. The user's own exceptions (from the
loader, from phases) propagate unchanged.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import os
import weakref
from collections.abc import Callable, Iterable, Iterator
from contextlib import AbstractContextManager
from pathlib import Path
from types import TracebackType
from typing import Any, TypeVar

from rich.console import Console

from stallscope._exceptions import from_signal_handler
from stallscope.analysis.context import DataSource
from stallscope.config import ScopeConfig
from stallscope.hooks.environment import batch_bytes, count_tensors
from stallscope.hooks.lightning import LightningCallbacks
from stallscope.hooks.session import Session
from stallscope.hooks.transformers import TransformersCallbacks
from stallscope.report.schema import Report
from stallscope.signals.loader import LoaderConfig, LoaderReader
from stallscope.timeline.phases import BUILTIN_PHASES, CHECKPOINT, LOGGING, OTHER, check_phase_name
from stallscope.timeline.stats import EpochBoundary
from stallscope.tune import lightning as tune_lightning
from stallscope.tune import transformers as tune_transformers
from stallscope.tune import trial as tune_trial

T = TypeVar("T")

#: where the report goes unless told
DEFAULT_REPORT_DIR = Path("stallscope")

#: the live scopes by ``state_key`` (``StallScope._keyed``)
_LIVE_KEYS: weakref.WeakValueDictionary[str, StallScope] = weakref.WeakValueDictionary()
#: every live scope (``_after_fork_in_child``)
_LIVE_SCOPES: weakref.WeakSet[StallScope] = weakref.WeakSet()


def _after_fork_in_child() -> None:
    """A process forked while a scope runs (a DataLoader worker, the user's ``os.fork``) is not
    the run: in it every running scope is off and finished, so that leaving the ``with`` block there (a
    ``sys.exit`` in the child) writes nothing and waits for nothing (no lock another thread held
    at the fork, no thread the fork left behind)."""
    try:
        for scope in list(_LIVE_SCOPES):
            if scope._started and not scope._finished:  # running: a scope made but not yet
                scope._forked = True  # entered is the child's to use (a training process forked)
                scope._active = False
                scope._finished = True
    except Exception:  # never the child's problem
        pass


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)

#: distinct phase names a scope records; later new names count as ``other`` (with a note)
MAX_PHASE_NAMES = 256

#: ``logging`` phases measured (wall time and the process's CPU, ``_LoggingPhase``): the first
#: ones, then one in this many
MEASURE_FIRST = 16
MEASURE_EVERY = 8
#: how many times the run's end is tried when a signal handler's exception cuts it short (each
#: dead DataLoader worker's SIGCHLD can raise one: torch's handler raises while any has failed)
FINISH_TRIES = 4


class _NullPhase:
    __slots__ = ()

    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc_info: object) -> None:
        return None


_NULL_PHASE = _NullPhase()


class _SavePhase:
    """The ``checkpoint`` phase's timer, with each save in it measured (``signals.saves``): its
    bytes, CPU and wall time, and after the run's first save, with the timeline paused, the cost
    of copying that many bytes. A save costs milliseconds; this adds some 20 us to it."""

    __slots__ = ("_timer", "_scope")

    def __init__(self, timer: AbstractContextManager[None], scope: StallScope) -> None:
        self._timer = timer
        self._scope = scope

    def __enter__(self) -> None:
        self._timer.__enter__()
        if self._scope._session.timeline.is_owner_thread():  # another thread's save is not the run's
            self._scope._guarded(self._scope._session.saves.begin)

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        scope = self._scope
        if not scope._session.timeline.is_owner_thread():
            self._timer.__exit__(exc_type, exc, tb)
            return
        scope._guarded(scope._session.saves.end)
        self._timer.__exit__(exc_type, exc, tb)
        if exc_type is None:
            scope._guarded(scope._session.probe_saves)
        # returns None: the user's exception, if any, propagates unchanged


class _LoggingPhase:
    """The ``logging`` phase's timer, with some of its calls measured (``signals.calls``): the
    call's wall time and the process's CPU in it, which tell a logger that waits (on a server, a
    disk) from one that computes. The first ``MEASURE_FIRST`` calls, then one in
    ``MEASURE_EVERY`` (counted ``MEASURE_EVERY`` times); a phase inside another is part of it."""

    __slots__ = ("_timer", "_scope", "_calls", "_depth", "_weight")

    def __init__(self, timer: AbstractContextManager[None], scope: StallScope) -> None:
        self._timer = timer
        self._scope = scope
        self._calls = 0
        self._depth = 0
        #: the weight of the call being measured; 0 when it is not
        self._weight = 0

    def __enter__(self) -> None:
        if not self._scope._session.timeline.is_owner_thread():
            self._timer.__enter__()  # records nothing but the thread (``Timeline.set_owner``)
            return
        self._timer.__enter__()
        self._depth += 1
        if self._depth > 1:
            return
        calls = self._calls = self._calls + 1
        if (calls <= MEASURE_FIRST or calls % MEASURE_EVERY == 0) and self._scope._guarded(
            self._scope._session.logging_calls.begin
        ):
            self._weight = 1 if calls <= MEASURE_FIRST else MEASURE_EVERY

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if not self._scope._session.timeline.is_owner_thread():
            self._timer.__exit__(exc_type, exc, tb)
            return
        self._depth -= 1
        if self._depth == 0 and self._weight:
            weight, self._weight = self._weight, 0
            self._scope._guarded(self._scope._session.logging_calls.end, weight)
        self._timer.__exit__(exc_type, exc, tb)
        # returns None: the user's exception, if any, propagates unchanged


class _PhaseCache(dict[str, AbstractContextManager[None]]):
    """The timers ``scope.phase`` hands out, by name; a name not seen yet goes to ``make``."""

    __slots__ = ("_make",)

    def __init__(self, make: Callable[[str], AbstractContextManager[None]]) -> None:
        super().__init__()
        self._make = make

    def __missing__(self, name: str) -> AbstractContextManager[None]:
        return self._make(name)


class StallScope(TransformersCallbacks, LightningCallbacks):
    """Watches a training loop and tells why the accelerator waits.

    ``StallScope(report_dir="stallscope", *, console=True, nvml_device=None, min_saving=0.02,
    sample_interval_s=0.2, recent_steps=4096, print_interval_s=None, html=True)``; bad values raise
    ``ValueError`` naming them. ``recent_steps``: the last steps the report keeps, each one's start
    and phase times (``stallscope trace``, the timeline of ``report.html``); ``html``: write
    ``report.html`` beside the final ``report.json``. ``print_interval_s``: by default every epoch's diagnosis is
    printed unless the panels would take more than 1% of the run (many very short epochs: then
    they are spaced out, and a panel says how many epochs it skipped); a number prints one when at
    least that many seconds passed since the last printed one; ``0`` prints every epoch's. The
    first epoch's, and the run's at the end, are always printed.
    The same object is a Lightning callback: ``Trainer(callbacks=[StallScope()])``
    (``hooks/lightning.py``), where each ``fit`` is one run, and a ``transformers``
    ``TrainerCallback`` (``hooks/transformers.py``), where each ``train()`` is one run.
    """

    def __init__(
        self,
        report_dir: str | os.PathLike[str] | None = "stallscope",
        *,
        console: bool | Console = True,
        nvml_device: int | str | None = None,
        min_saving: float = 0.02,
        sample_interval_s: float = 0.2,
        recent_steps: int = 4096,
        print_interval_s: float | None = None,
        html: bool = True,
    ) -> None:
        self._config = ScopeConfig.create(
            tune_trial.report_dir(report_dir),  # a trial of `stallscope tune` writes to its own folder
            console=console,
            nvml_device=nvml_device,
            min_saving=min_saving,
            sample_interval_s=sample_interval_s,
            recent_steps=recent_steps,
            print_interval_s=print_interval_s,
            html=html,
        )
        trial = tune_trial.current()
        if trial is not None:  # Lightning makes its loggers' folders before a callback's ``setup``,
            # transformers its output_dir before on_init_end: each wrapped first, in a trial only;
            # a release that moved a touch point is said in the trial's result
            try:
                tune_lightning.before_setup(trial)
            except Exception as exc:
                trial.not_applied["logger folders"] = f"{type(exc).__name__}: {exc}"
            try:
                tune_transformers.before_init()
            except Exception as exc:
                trial.not_applied["output_dir"] = f"{type(exc).__name__}: {exc}"
        self._keyed()
        self._reset()
        self._quiet_hooks()
        #: this process was forked from the one the scope runs in (``_after_fork_in_child``)
        self._forked = False
        _LIVE_SCOPES.add(self)

    def _keyed(self) -> None:
        """Lightning's ``state_key``, one per report folder: a Trainer refuses two stateful
        callbacks with the same key, and two scopes writing to two folders must both work. The
        default folder keeps the plain class name (it labels every hook in a profiler's output).
        A second live scope of the same folder gets a key of its own (``copy``), so that a Trainer
        given both still starts; the later one in the Trainer's list then turns itself off
        (``LightningCallbacks._watched_already``)."""
        folder = self._config.report_dir
        key = type(self).state_key
        if folder != DEFAULT_REPORT_DIR.resolve():
            key = self._generate_state_key(report_dir=None if folder is None else str(folder))
        copy = 1
        while (other := _LIVE_KEYS.get(key)) is not None and other is not self:
            copy += 1
            key = self._generate_state_key(report_dir=None if folder is None else str(folder), copy=copy)
        _LIVE_KEYS[key] = self
        self.state_key = key

    def _reset(self, session: Session | None = None) -> None:
        """Fresh, unstarted recording state: ``session``, or a new one for ``self._config``."""
        self._session = session if session is not None else Session(self._config)
        self._session.timeline.on_error = self._fail  # a failure on the hot path turns the scope off
        self._phases = _PhaseCache(self._new_phase)
        # per instance, in C: a timer already made is one dict lookup (see ``phase``)
        self.phase = self._phases.__getitem__  # type: ignore[method-assign,assignment]
        self._active = True
        self._started = False
        self._finished = False
        #: inside ``with scope:`` (a second ``with`` is refused)
        self._entered = False
        self._generation = 0
        self._in_epoch = False
        #: [epoch index, iter() ns, first wait ns, final next() ns] of the pass in progress
        self._boundary: list[int] | None = None
        #: the loader settings of the last pass, and whether the next first batch is to be
        #: counted (the loader was read anew since the last one counted)
        self._loaders = LoaderReader()
        self._look_at_batch = True
        #: the epoch in progress is one of ``batch`` calls, not a ``scope.iter`` pass
        self._batch_epoch = False

    # -- context manager -----------------------------------------------------------------

    def __enter__(self) -> StallScope:
        # one run per scope: a second ``with scope:`` would record nothing, silently
        if self._finished:
            raise RuntimeError(
                "this StallScope has recorded its run already (its report is written); "
                "make a new StallScope(...) for another run"
            )
        if self._entered:
            raise RuntimeError("this StallScope is already in use in a 'with' block; it cannot be entered twice")
        self._entered = True
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._forked:  # a child forked inside the block is not the run: nothing to write
            return
        if exc is not None:  # the note never raises: never replace the user's exception
            self._session.end_with(exc)
        elif exc_type is not None:
            self._session.note(f"the run was interrupted ({exc_type.__name__})")
        self.close()
        # never suppress: the user's exception propagates unchanged

    def start(self) -> None:
        """Start watching (``__enter__`` calls this). The clock starts at the first ``iter`` or
        phase, so building the model inside the ``with`` block is not counted as idle time."""
        self._start(clock=False)

    def _start(self, *, clock: bool) -> None:
        if self._started:
            return
        self._started = True
        try:
            self._session.start(clock=clock)
        except Exception as exc:
            self._fail(exc)

    def _start_clock(self) -> None:
        try:
            self._session.start_clock()
        except Exception as exc:
            self._fail(exc)

    def _begin_run(self, session: Session) -> None:
        """Start a fresh run recorded by ``session`` (the Lightning callback starts one per ``fit``)."""
        generation = self._generation + 1  # iterators of an earlier run must see they are stale
        self._reset(session)
        self._generation = generation
        self._start(clock=True)

    def close(self) -> None:
        """End the run: close the epoch in progress, write the final report (``__exit__`` calls this)."""
        if self._finished or not self._started:
            return
        self._finished = True
        self._generation += 1
        self._loaders.forget()  # the user's iterable is not held after the run
        users: Exception | None = None
        try:
            for _ in range(FINISH_TRIES):
                try:
                    if self._active and self._in_epoch:
                        # the run's only epoch ends here: the run's panel alone (its findings
                        # count what came after the loop, and it has the run's notes)
                        self._end_epoch(panel=self._session.epochs_ended > 0)
                    # a plain loop's single epoch: the run's panel is the one the user sees
                    least = 1 if self._session.framework == "plain" else 2
                    print_run = self._active and self._session.epochs_ended >= least
                    self._session.finish(print_run=print_run)
                    break
                except Exception as exc:
                    if from_signal_handler(exc):  # the user's: the final report first, then the first such
                        users = users or exc
                        continue
                    self._fail(exc)
                    break
            else:  # each try was cut short: what ran, the fast way, and no thread of ours left
                if self._active and users is not None:
                    with contextlib.suppress(Exception):
                        self._session.finish_interrupted(users)
                self._session.stop_helpers()
        except BaseException as exc:  # Ctrl-C, a SIGTERM handler's sys.exit: the report, then it
            if self._active:
                with contextlib.suppress(Exception):
                    self._session.finish_interrupted(exc)
            raise
        finally:
            self._active = False
            self._session.timeline.stop()
        if users is not None:
            raise users

    # -- recording -----------------------------------------------------------------------

    def phase(self, name: str) -> AbstractContextManager[None]:
        """A context manager that attributes the time inside it to phase ``name``.

        (Each instance answers this with its cache's ``__getitem__``, set in ``_reset``: a name
        seen before costs one dict lookup in C, per step. This method is the first-use path.)"""
        return self._phases[name]

    def _new_phase(self, name: str) -> AbstractContextManager[None]:
        """The first ``phase(name)``: check the name, make the timer and cache it."""
        check_phase_name(name)
        if not self._active:
            return _NULL_PHASE
        if not self._started:
            self.start()
        try:
            timeline = self._session.timeline
            if len(self._phases) >= MAX_PHASE_NAMES and name not in BUILTIN_PHASES:
                # bounded: names made per step (f"batch {i}") would otherwise grow without end
                self._session.note(f"more than {MAX_PHASE_NAMES} phase names: later ones count as 'other'")
                return timeline.timer(timeline.phase_id(OTHER))
            phase = timeline.timer(timeline.phase_id(name))
            if name == CHECKPOINT:
                phase = _SavePhase(phase, self)
            elif name == LOGGING:
                phase = _LoggingPhase(phase, self)
        except Exception as exc:
            self._fail(exc)
            return _NULL_PHASE
        self._phases[name] = phase
        return phase

    def iter(self, iterable: Iterable[T]) -> Iterator[T]:
        """Iterate ``iterable`` as one epoch, timing the wait for each item; one step per item.

        Calling ``iter`` again ends the previous epoch, as does exhausting the iterator or leaving
        the scope.
        """
        if not self._started:
            self.start()
        if self._active and not self._session.timeline.started:
            self._start_clock()
        self._generation += 1
        self._batch_epoch = False
        trial = tune_trial.current()
        if trial is not None:  # a trial of `stallscope tune`: the loader with the trial's settings
            iterable = trial.loader(iterable)
        self._session.timeline.end_streams()  # an earlier pass still running passes items through
        if self._active and self._in_epoch:
            try:
                self._end_epoch()
            except Exception as exc:
                self._fail(exc)
        # the loop reads from the stream itself: no Python frame of StallScope's between steps
        return itertools.chain.from_iterable(self._iterate(iterable, self._generation))

    def _iterate(self, iterable: Iterable[T], generation: int) -> Iterator[Iterable[T]]:
        """The pass over ``iterable``: set-up, then its items (one iterable, ``Timeline.stream``),
        then the epoch's end once they are exhausted."""
        if not self._active:
            yield iterable
            return
        timeline = self._session.timeline
        try:
            loader, batches = self._inspect(iterable)
            source: DataSource = (
                "loader" if loader is not None else "generator" if isinstance(iterable, Iterator) else "iterable"
            )
            self._session.note_loader(loader, batches, iterable, source=source)
            timeline.begin_epoch(in_process_data=loader is None or loader.num_workers == 0)
            self._in_epoch = True
            index = self._session.epochs_ended
            timeline.data_begin(new_step=False)
        except Exception as exc:
            self._fail(exc)
            yield iterable
            return
        try:
            it = iter(iterable)  # the user's code: worker start-up happens here
        finally:
            iter_ns = self._data_end(got_item=False)
        trial = tune_trial.current()
        if trial is not None:  # a step boundary before each batch: the trial stops at one
            it = trial.counted(it)
        self._boundary = [index, iter_ns, 0, 0]
        if not self._active or generation != self._generation:
            yield it
            return
        last: list[int] = []  # the final next()'s wait, once the stream ran to its end
        try:
            stream = timeline.stream(it, self._first_item, last)
        except Exception as exc:
            self._fail(exc)
            yield it
            return
        yield stream  # the hot loop
        if last and self._active and generation == self._generation:
            try:
                self._boundary[3] = last[0]
                self._end_epoch()
            except Exception as exc:
                self._fail(exc)

    def batch(self, get_batch: Callable[..., T], /, *args: Any, **kwargs: Any) -> T:
        """``get_batch(*args, **kwargs)``, timed as the wait for the next batch; a step starts with
        each call. The one-line form for a loop with no iterable (``X, Y = scope.batch(get_batch,
        "train")`` in a ``while`` loop): its calls are one epoch, until the scope exits or
        ``iter`` is called. ``get_batch``'s own exceptions propagate unchanged."""
        trial = tune_trial.current()
        if trial is not None:  # a trial of `stallscope tune` stops at a step boundary
            trial.step_begin()
        if not self._active:
            return get_batch(*args, **kwargs)
        try:
            if not self._batch_epoch:
                self._begin_batches()
            self._session.timeline.data_begin(new_step=True)
        except Exception as exc:
            self._fail(exc)
            return get_batch(*args, **kwargs)
        try:
            item = get_batch(*args, **kwargs)
        except BaseException:
            self._data_end(got_item=False)
            raise
        self._data_end(got_item=True)
        if self._look_at_batch and self._active:
            self._look_at_batch = False
            self._guarded(self._count_batch, item)
        return item

    def _begin_batches(self) -> None:
        """The first ``batch`` call since the scope started or since a ``scope.iter`` pass: an
        epoch of calls begins (it ends as a pass does: at the next ``iter`` or at exit)."""
        if not self._started:
            self.start()
        if self._active and not self._session.timeline.started:
            self._start_clock()
        self._generation += 1
        timeline = self._session.timeline
        timeline.end_streams()
        if self._in_epoch:
            self._end_epoch()
        self._session.note_loader(None, None, source="callable")
        timeline.begin_epoch(in_process_data=True)
        self._in_epoch = True
        self._batch_epoch = True
        self._look_at_batch = True

    def _count_batch(self, item: object) -> None:
        """The first batch of an epoch of ``batch`` calls: count its tensors and bytes; on CUDA,
        look for pageable tensors (``data.pin_memory``)."""
        self._session.batch_tensors = count_tensors(item)
        self._session.batch_bytes = batch_bytes(item)
        self._session.note_batch(item)

    def _inspect(self, iterable: object) -> tuple[LoaderConfig | None, int | None]:
        """The settings of the loader a pass iterates (``LoaderReader``: not at every pass over the
        same one; when read anew, its next first batch is counted again) and its length."""
        batches: int | None
        try:  # read at every pass: a list may grow between passes
            batches = len(iterable)  # type: ignore[arg-type]
        except Exception:
            batches = None
        loader, fresh = self._loaders.read(iterable)
        if fresh:
            self._look_at_batch = True  # until a first batch is counted (a pass may yield none)
        return loader, batches

    def _first_item(self, item: object, wait_ns: int) -> None:
        """The first item of a pass: its wait is the start-up's; count the batch's tensors and
        bytes when the loader was read anew (``_inspect``)."""
        try:
            assert self._boundary is not None
            self._boundary[2] = max(1, wait_ns)
            if self._look_at_batch:
                self._look_at_batch = False
                self._session.batch_tensors = count_tensors(item)
                self._session.batch_bytes = batch_bytes(item)
            self._session.note_batch(item)  # on CUDA: pageable tensors -> data.pin_memory
        except Exception as exc:
            self._fail(exc)

    def _data_end(self, *, got_item: bool) -> int:
        if not self._active:
            return 0
        try:
            return self._session.timeline.data_end(got_item=got_item)
        except Exception as exc:
            self._fail(exc)
            return 0

    def _end_epoch(self, *, panel: bool = True) -> None:
        self._in_epoch = False
        self._batch_epoch = False
        if self._boundary is not None:
            index, iter_ns, first_ns, last_ns = self._boundary
            self._boundary = None
            self._session.timeline.note_boundary(EpochBoundary(index, iter_ns, first_ns, last_ns))
        self._session.end_epoch(panel=panel)

    def watch(self, model: object) -> None:
        """Tell the scope which model is trained, once, before the loop: an ``nn.DataParallel``
        in it gets ``dist.dataparallel``. (The Lightning callback looks at the LightningModule.)"""
        try:
            self._session.note_model(model)
        except Exception as exc:
            self._fail(exc)

    # -- results -------------------------------------------------------------------------

    @property
    def report(self) -> Report | None:
        """The latest report: the final one after the scope exits, else the one of the last epoch end."""
        return self._session.report

    @property
    def enabled(self) -> bool:
        """False once StallScope turned itself off after an internal error (or after ``close``)."""
        return self._active

    def _guarded(self, fn: Callable[..., object], *args: Any) -> bool:
        """Run ``fn`` unless the scope is off; contain its errors (``_fail``). True when it ran
        cleanly."""
        if not self._active:
            return False
        try:
            fn(*args)
        except Exception as exc:
            self._fail(exc)
            return False
        return True

    def _fail(self, exc: BaseException) -> None:
        """Contain an internal error: turn off once, note it, let training go on. An exception a
        signal handler raised while StallScope's code ran is the user's: it goes on up, unchanged."""
        if from_signal_handler(exc):
            raise exc
        if not self._active:
            return
        self._active = False
        try:
            self._session.timeline.stop()
            self._session.warn_internal(exc)
            if self._started and not self._finished:
                self._session.write()
        except Exception:
            pass

    def __repr__(self) -> str:
        state = "on" if self._active else "off"
        return f"StallScope(report_dir={str(self._config.report_dir)!r}, {state})"

    def __getstate__(self) -> dict[str, Any]:
        """Only the configuration travels (``ddp_spawn`` pickles the Trainer and its callbacks):
        a copy starts unstarted, with its own session, in the process that unpickles it. A rich
        Console given as ``console`` cannot travel; the copy prints to its own stdout."""
        config = self._config
        if not isinstance(config.console, bool):
            config = dataclasses.replace(config, console=True)
        return {"config": config}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self._config = state["config"]
        self._keyed()
        self._reset()
        self._quiet_hooks()
        self._forked = False
        _LIVE_SCOPES.add(self)
