"""StallScope as a Lightning callback (SPEC §1): ``Trainer(callbacks=[StallScope()])``.

One object, both namespaces, no import
    Lightning calls its callbacks through ``getattr(callback, hook_name)(trainer, pl_module, ...)``
    and never checks their class on that path, so ``StallScope`` implements the ``Callback``
    interface by duck typing (``LightningCallbacks``, a mixin it inherits). The same object then
    works in ``lightning.pytorch`` and ``pytorch_lightning`` Trainers, and this module imports
    neither. Pass it in a list (``callbacks=[StallScope()]``): Lightning wraps a lone callback into
    a list only when it is a ``Callback`` subclass.

Where the time goes (every nanosecond of ``fit`` is in exactly one phase)
    data        waiting on the train loader's ``next()`` (``attach_fetch_probe``, the one private
                touch point), and the loader's set-up: ``train_dataloader()`` and ``iter()`` (worker
                spawn and the previous pass's shutdown) before each epoch's first batch
    h2d         from the end of ``next()`` to ``on_train_batch_start``: ``batch_to_device`` and the
                batch-transfer hooks around it
    compute     ``on_train_batch_start`` to ``on_train_batch_end``: the training step, backward and
                the optimizer step
    logging     calls to the Trainer's loggers (``log_metrics``, ``log_hyperparams``, ``save``) made
                by the training loop: between steps every ``log_every_n_steps`` and at an epoch's
                end. Those a validation run makes (``self.log`` in ``validation_step``, with
                ``on_step=True`` or at its end) are that run's: they count as ``validation``
    checkpoint  ``trainer.save_checkpoint`` (what ``ModelCheckpoint`` calls), until the next event;
                the checkpoint IO's write inside it is measured apart (``signals.saves``)
    validation  the validation loop's ``run`` (``attach_validation_probe``): its loader's set-up
                and worker start-up, the validation steps, the waits on that loader and its
                logger calls (without the probe, ``on_validation_start`` to ``on_validation_end``)
    sanity_check  the same for Lightning's sanity check, a one-off before the first epoch that
                ``val_check_interval`` does not change (a custom phase name, SPEC §2)
    other       the rest: progress bars, other callbacks, Lightning's bookkeeping

The logging and checkpoint wrappers are instance attributes on this trainer's own objects (its
loggers, the trainer, its strategy's checkpoint IO), set at ``on_fit_start`` and removed at
teardown; nothing global is patched.
A burst of logger calls (``log_metrics`` then ``save``, for each logger) or of checkpoint saves
(top-k, then ``last``) is one entry of its phase, so the frequency rules count events, not calls.

Epochs, reports, loggers
    Each ``fit`` is one run. A train epoch ends at StallScope's ``on_train_epoch_end``: the
    diagnosis is printed (through the progress bar's ``print``, which keeps bars intact),
    ``report.json`` is written and the headline numbers go to the Trainer's loggers through
    ``pl_module.log("stallscope/...")`` (unless the Trainer has no logger and no callback
    monitors them). What Lightning does after that hook (``ModelCheckpoint``'s epoch-end save
    when there is no validation, the epoch-end logger flush) counts in the next epoch and in the
    run; the report's notes say where such a save went (``EPOCH_END_SAVE``). The final report is
    written at ``on_fit_end``, or at ``on_exception``. In a distributed fit, rank 0 prints and
    writes the job's report and logs the job's numbers; the other ranks print nothing and write
    only ``<report_dir>/ranks/rank-<R>.json`` (``hooks/distributed.py``).
"""

from __future__ import annotations

import functools
import io
import sys
import threading
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, cast

from stallscope._exceptions import from_signal_handler
from stallscope.analysis.context import RunShape
from stallscope.hooks.environment import batch_bytes, count_tensors
from stallscope.hooks.session import Session, console_for_rank
from stallscope.report.schema import EpochReport
from stallscope.signals.loader import LoaderReader
from stallscope.timeline import recorder
from stallscope.timeline.phases import CHECKPOINT, COMPUTE, H2D, LOGGING, VALIDATION
from stallscope.timeline.stats import EpochBoundary
from stallscope.tune import lightning as tune_lightning
from stallscope.tune import trial as tune_trial

if TYPE_CHECKING:
    from stallscope.hooks.scope import StallScope

#: Logger methods whose time is ``logging``; ``save`` after the last logger ends the burst.
LOGGER_METHODS = ("log_metrics", "log_hyperparams", "log_graph", "save")

#: Headline numbers logged to the Trainer's loggers at each train epoch end, under ``stallscope/``.
HEADLINE_PHASES = ("data", "h2d", "compute", "logging", "checkpoint", "validation", "other")

#: the modules whose ``Callback`` lists the hooks Lightning's dispatcher reads (both installs)
LIGHTNING_NAMESPACES = ("lightning.pytorch", "pytorch_lightning")

#: Lightning's sanity check (a few validation batches before the first epoch): a one-off that
#: ``val_check_interval`` does not change, so it is kept apart from ``validation``
SANITY_CHECK = "sanity_check"

#: the note of a checkpoint saved after StallScope's end of an epoch (``ModelCheckpoint`` runs its
#: epoch-end save after every other callback's ``on_train_epoch_end``)
EPOCH_END_SAVE = (
    "checkpoints saved at an epoch's end (ModelCheckpoint, after StallScope's epoch end) count in the"
    " next epoch's panel; the last one in the run's (the report's tail)"
)

#: ``_FitRun._top`` while the loader's set-up window (a ``data`` interval) is open
_SETUP = -1


#: what ``attach_fetch_probe`` installs: given Lightning's own (start the profiler, stop it), the
#: (before ``next()``, after ``next()``) pair to call instead
FetchHooks = Callable[[Callable[[], None], Callable[[], None]], tuple[Callable[[], None], Callable[[], None]]]

#: what ``attach_step_probe`` installs: given Lightning's own method, the callable to set instead,
#: which calls it (``call_after``, ``call_before``)
Wrap = Callable[[Callable[..., Any]], Callable[..., Any]]


def attach_fetch_probe(trainer: Any, make: FetchHooks) -> Callable[[], None]:
    """The private touch point: time the train loader's ``next()`` inside ``trainer.fit``.

    Lightning has no public hook around it. At the start of every epoch,
    ``_TrainingEpochLoop.on_run_start`` hands ``self._on_before_fetch`` and
    ``self._on_after_fetch`` to the data fetcher, which calls them right before and right after
    each ``next()`` on the train loader (they start and stop the profiler's
    ``[_TrainingEpochLoop].train_dataloader_next``). Instance attributes of those names on this
    trainer's epoch loop are picked up instead: ``make(start_profiler, stop_profiler)`` returns
    them. Its ``before`` must call ``start_profiler()`` first and its ``after`` must call
    ``stop_profiler()`` last, even when it fails, so a user's profiler keeps measuring the same
    interval around ours. (One call each way, no wrapper around them: they run every step.)
    Install before the epoch starts (``on_fit_start``).

    ``tests/test_hooks_lightning.py`` checks this against the installed Lightning, in both
    namespaces; it raises ``RuntimeError`` naming what moved when a release changes the layout.
    Returns a function that removes the probe.
    """
    names = ("_on_before_fetch", "_on_after_fetch")
    loop = getattr(getattr(trainer, "fit_loop", None), "epoch_loop", None)
    if loop is None or not all(callable(getattr(type(loop), name, None)) for name in names):
        version = _lightning_version(trainer)
        raise RuntimeError(
            f"cannot time the train loader's next(): this Lightning ({version}) has no "
            f"trainer.fit_loop.epoch_loop.{names[0]}/{names[1]}; StallScope needs an update"
        )
    hooks = make(getattr(loop, names[0]), getattr(loop, names[1]))
    for name, fn in zip(names, hooks, strict=True):
        setattr(loop, name, fn)

    def detach() -> None:
        for name, fn in zip(names, hooks, strict=True):
            if vars(loop).get(name) is fn:
                delattr(loop, name)

    return detach


def attach_step_probe(trainer: Any, begin: Wrap, end: Wrap) -> Callable[[], None]:
    """Two more private touch points: where a training step's compute starts and ends.

    A callback's ``on_train_batch_start``/``on_train_batch_end`` cost two dispatches a step, and
    Lightning opens a profiler context around each (a ``contextmanager`` generator, some ten
    Python calls): about 3% of a tiny Lightning step on its own, more than all of StallScope's
    recording. Two calls Lightning makes anyway stand at nearly the same places, and are instance
    attributes that can be set on this trainer's own objects:

    * ``trainer._logger_connector.on_batch_start(batch)``, right after ``batch_to_device`` and
      before the ``on_train_batch_start`` hooks (the evaluation loop calls it for each of its
      batches too): ``begin(original)`` replaces it, and must call the original first
      (``call_after``);
    * the epoch loop's ``update_lr_schedulers(interval, ...)``, right after the optimizer step and
      before the ``on_train_batch_end`` hooks (and again at other points of an epoch):
      ``end(original)`` replaces it, and must call the original last (``call_before``), so
      stepping the schedulers is not compute.

    Compute is then the training step with the batch-start hooks before it (other callbacks'
    included); the batch-end hooks count as ``other``.
    ``tests/test_hooks_lightning.py`` checks both points against the installed Lightning, in both
    namespaces; this raises ``RuntimeError`` naming what moved. Returns the undo.
    """
    connector = getattr(trainer, "_logger_connector", None)
    loop = getattr(getattr(trainer, "fit_loop", None), "epoch_loop", None)
    missing = [
        where
        for where, obj, name in (
            ("trainer._logger_connector.on_batch_start", connector, "on_batch_start"),
            ("trainer.fit_loop.epoch_loop.update_lr_schedulers", loop, "update_lr_schedulers"),
        )
        if obj is None or not callable(getattr(type(obj), name, None))
    ]
    if missing:
        version = _lightning_version(trainer)
        raise RuntimeError(f"this Lightning ({version}) has no {' or '.join(missing)}")

    undo = [_wrap_method(connector, "on_batch_start", begin), _wrap_method(loop, "update_lr_schedulers", end)]

    def detach() -> None:
        for fn in undo:
            fn()

    return detach


def attach_validation_probe(trainer: Any, wrap: Wrap) -> Callable[[], None]:
    """A private touch point: the validation loop's ``run`` (``trainer.fit_loop.epoch_loop.val_loop``),
    which sets up the validation loader (``setup_data``, then ``iter()``, which spawns its workers)
    before it calls ``on_validation_start``. ``wrap(original)`` replaces it on this instance. The
    sanity check runs the same loop. Where a Lightning release moved it, nothing is installed
    (the set-up then counts as ``other``, as the hooks alone see it). Returns the undo."""
    loop = getattr(getattr(getattr(trainer, "fit_loop", None), "epoch_loop", None), "val_loop", None)
    if loop is None or not callable(getattr(type(loop), "run", None)):
        return _nothing
    return _wrap_method(loop, "run", wrap)


def call_after(hook: Callable[[Any], None]) -> Wrap:
    """For ``attach_step_probe``'s ``begin``: the original ``on_batch_start(batch, ...)``, then
    ``hook(batch)``."""

    def wrap(original: Callable[..., Any]) -> Callable[..., Any]:
        def after(batch: Any, *args: Any, **kwargs: Any) -> Any:
            result = original(batch, *args, **kwargs)
            hook(batch)
            return result

        return after

    return wrap


def call_before(hook: Callable[[], None]) -> Wrap:
    """For ``attach_step_probe``'s ``end``: ``hook()``, then the original."""

    def wrap(original: Callable[..., Any]) -> Callable[..., Any]:
        def before(*args: Any, **kwargs: Any) -> Any:
            hook()
            return original(*args, **kwargs)

        return before

    return wrap


def _lightning_version(trainer: Any) -> str:
    """The version of the Lightning package ``trainer`` comes from (for errors naming it)."""
    return str(getattr(sys.modules.get(type(trainer).__module__.split(".")[0]), "__version__", "?"))


def _wrap_method(
    obj: Any, name: str, make: Callable[[Callable[..., Any]], Callable[..., Any] | None]
) -> Callable[[], None]:
    """Replace ``obj.name`` by ``make(original)`` on this instance only; returns the undo."""
    original = getattr(obj, name, None)
    if not callable(original):
        return _nothing
    wrapper = make(original)
    setattr(obj, name, wrapper)

    def undo() -> None:
        if vars(obj).get(name) is wrapper:
            delattr(obj, name)

    return undo


def _nothing() -> None:
    return None


def _replacement(fn: Callable[..., Any] | None, original: Callable[..., Any]) -> Callable[..., Any] | None:
    """For ``_wrap_method``: ``fn`` in place of the original, which it does not call."""
    return fn


def _first_loader(loaders: object) -> object | None:
    """The first DataLoader-like object in what ``trainer.train_dataloader`` returns."""
    if loaders is None or isinstance(getattr(loaders, "num_workers", None), int):
        return loaders
    items: list[object] = []
    if isinstance(loaders, Mapping):
        items = list(loaders.values())
    elif isinstance(loaders, (list, tuple)):
        items = list(loaders)
    for item in items:
        found = _first_loader(item)
        if found is not None:
            return found
    return None


def _count(value: object) -> int | None:
    """A non-negative whole number of Lightning's (an int, or a float like ``inf`` when it is not
    known), else None."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    if isinstance(value, float) and not value.is_integer():
        return None
    return int(value) if value >= 0 else None


def _limit(value: object, default: int | float) -> int | float:
    """``limit_*_batches`` or ``val_check_interval``: an int or a float as Lightning keeps it."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return default
    return value


def time_budget_s(trainer: Any) -> float | None:
    """What is left of ``Trainer(max_time)`` in seconds, from its ``Timer`` callback (read at fit
    start: a fit resumed from a checkpoint has spent part of it already); None without one."""
    for callback in getattr(trainer, "callbacks", None) or []:
        if _named(callback, "Timer") and callable(getattr(callback, "time_remaining", None)):
            left = callback.time_remaining()
            return max(0.0, float(left)) if isinstance(left, (int, float)) else None
    return None


def _patience(trainer: Any) -> int | None:
    """The ``patience`` of the Trainer's ``EarlyStopping`` callback (the fewest, if several)."""
    found = [
        callback.patience
        for callback in getattr(trainer, "callbacks", None) or []
        if _named(callback, "EarlyStopping") and isinstance(getattr(callback, "patience", None), int)
    ]
    return min(found) if found else None


def _named(obj: object, name: str) -> bool:
    """Whether ``obj`` is an instance of a class called ``name`` or of a subclass of one (either
    Lightning namespace, without importing it)."""
    return any(cls.__name__ == name for cls in type(obj).__mro__)


def run_shape(
    trainer: Any, batches: int | None = None, *, max_time_s: float | None = None, steps_before: int = 0
) -> RunShape:
    """The fit's length and validation schedule from the Trainer's settings (read once per fit
    and once per epoch, never per step). ``batches``: training batches in an epoch, when known;
    ``max_time_s``: the fit's time budget (``time_budget_s`` at its start); ``steps_before``:
    the Trainer's ``global_step`` when the fit started (a resumed fit)."""
    every = getattr(trainer, "check_val_every_n_epoch", 1)
    val_batches = getattr(trainer, "num_val_batches", None)
    counted = [_count(v) for v in val_batches] if isinstance(val_batches, (list, tuple)) else []
    return RunShape(
        max_epochs=_count(getattr(trainer, "max_epochs", None)) or None,
        max_steps=_count(getattr(trainer, "max_steps", None)),
        limit_train_batches=_limit(getattr(trainer, "limit_train_batches", None), 1.0),
        batches_per_epoch=batches,
        check_val_every_n_epoch=every if isinstance(every, int) and not isinstance(every, bool) else None,
        val_check_interval=_limit(getattr(trainer, "val_check_interval", None), 1.0),
        limit_val_batches=_limit(getattr(trainer, "limit_val_batches", None), 1.0),
        val_batches=sum(n for n in counted if n is not None) or None if counted else None,
        log_every_n_steps=_count(getattr(trainer, "log_every_n_steps", None)) or None,
        max_time_s=max_time_s,
        min_epochs=_count(getattr(trainer, "min_epochs", None)) or None,
        early_stopping_patience=_patience(trainer),
        model_checkpoints=_model_checkpoints(trainer),
        steps_before_fit=steps_before,
    )


def _model_checkpoints(trainer: Any) -> int | None:
    """How many ``ModelCheckpoint`` callbacks the Trainer has (None: it does not say)."""
    callbacks = getattr(trainer, "callbacks", None)
    if not isinstance(callbacks, (list, tuple)):
        return None
    return sum(1 for callback in callbacks if _named(callback, "ModelCheckpoint"))


def _loader_count(loaders: object) -> int:
    if isinstance(loaders, Mapping):
        return sum(_loader_count(v) for v in loaders.values())
    if isinstance(loaders, (list, tuple)):
        return sum(_loader_count(v) for v in loaders)
    return 0 if loaders is None else 1


class _FitRun:
    """The recording of one ``trainer.fit``: a state machine over Lightning's events.

    ``_top`` is the phase the loop is in between events (set-up window, h2d, compute, validation,
    or None for ``other``); ``_lazy`` a logging or checkpoint phase opened on top of it by a wrapped
    call, closed at the next event (or at the last logger's ``save``). Every method is called by
    a guarded hook, so an internal error turns the scope off instead of reaching the user.

    While ``_lazy`` is None, ``_lazy_depth`` is 0 and ``_resume_setup`` False (only ``lazy_begin``
    sets them otherwise, and it sets ``_lazy``): the per-step usual cases rely on it and leave
    them as they are.
    """

    # slots: a ``_native.StepHook`` reads and writes the per-step state at fixed offsets
    __slots__ = (
        "scope",
        "trainer",
        "session",
        "buffer",
        "timeline",
        "h2d",
        "compute",
        "logging",
        "checkpoint",
        "validation",
        "sanity_check",
        "closed",
        "_sanity_checking",
        "_top",
        "_before_validation",
        "_lazy",
        "_lazy_depth",
        "_resume_setup",
        "_nested_fetch",
        "_fetched",
        "_in_epoch",
        "_setup_ns",
        "_first_wait_ns",
        "_count_tensors",
        "_loaders",
        "_last_logger",
        "_probed",
        "_undo",
        "_thread",
        "_start_profiler",
        "_stop_profiler",
        "_fetch_end",
        "_time_budget_s",
        "_steps_before",
        "_val_loaders",
        "_labelled",
    )

    def __init__(self, scope: StallScope, trainer: Any, session: Session, buffer: io.StringIO | None) -> None:
        self.scope = scope
        self.trainer = trainer
        self.session = session
        self.buffer = buffer
        timeline = session.timeline
        self.timeline = timeline
        self.h2d = timeline.phase_id(H2D)
        self.compute = timeline.phase_id(COMPUTE)
        self.logging = timeline.phase_id(LOGGING)
        self.checkpoint = timeline.phase_id(CHECKPOINT)
        self.validation = timeline.phase_id(VALIDATION)
        self.sanity_check = timeline.phase_id(SANITY_CHECK)
        self.closed = False
        self._sanity_checking = False
        self._top: int | None = None
        self._before_validation: int | None = None
        self._lazy: int | None = None
        self._lazy_depth = 0
        self._resume_setup = False
        self._nested_fetch = False
        self._fetched = False
        self._in_epoch = False
        self._setup_ns = 0
        self._first_wait_ns: int | None = None
        self._count_tensors = False
        #: the train loader's settings, read once per loader (and settings) in the fit
        self._loaders = LoaderReader()
        #: the first validation loader's settings, read at each validation run's start
        self._val_loaders = LoaderReader()
        #: whether the panels' epoch numbers were read (at the fit's first epoch)
        self._labelled = False
        self._last_logger: object | None = None
        #: compute is timed by ``attach_step_probe``, not by the batch hooks
        self._probed = False
        self._undo: list[Callable[[], None]] = []
        self._thread = threading.get_ident()
        #: Lightning's own fetch hooks (they start and stop its profiler), set by the fetch probe
        self._start_profiler: Callable[[], None] = _nothing
        self._stop_profiler: Callable[[], None] = _nothing
        #: what the fetch probe set in place of Lightning's ``_on_after_fetch``
        self._fetch_end: Callable[[], None] | None = None
        #: what was left of ``Trainer(max_time)`` when the fit started; None without it
        self._time_budget_s: float | None = None
        #: the Trainer's ``global_step`` when the fit started (a resumed fit's steps before it)
        self._steps_before = 0

    # -- wiring --------------------------------------------------------------------------

    def attach(self) -> None:
        """Install the probes: the fetch touch point, the loggers, ``trainer.save_checkpoint``."""
        self._undo.append(attach_fetch_probe(self.trainer, self._fetch_hooks))
        self._install_step_hooks()
        loggers = list(getattr(self.trainer, "loggers", None) or [])
        self._last_logger = loggers[-1] if loggers else None
        for logger in loggers:
            for name in LOGGER_METHODS:
                try:
                    self._undo.append(_wrap_method(logger, name, self._logging_wrapper(logger, name)))
                except (AttributeError, TypeError):  # a logger that refuses attributes: not timed
                    self.session.note(f"calls to {type(logger).__name__}.{name} are not timed (not wrappable)")
        self._undo.append(_wrap_method(self.trainer, "save_checkpoint", self._checkpoint_wrapper))
        self._meter_writes()
        self._undo.append(attach_validation_probe(self.trainer, self._validation_wrapper))

    def _meter_writes(self) -> None:
        """Measure each write of the Trainer's checkpoint IO (``signals.saves``): the call that
        ``AsyncCheckpointIO`` would move to its thread. A save through an IO already asynchronous
        is noted as such."""
        io = getattr(getattr(self.trainer, "strategy", None), "checkpoint_io", None)
        if io is None:
            return
        self.session.saves.already_async = type(io).__name__ == "AsyncCheckpointIO"
        try:
            self._undo.append(_wrap_method(io, "save_checkpoint", self._write_wrapper))
        except (AttributeError, TypeError):  # an IO that refuses attributes: its saves are not split
            self.session.note(f"{type(io).__name__}.save_checkpoint is not measured (not wrappable)")

    def detach(self) -> None:
        undo, self._undo = self._undo, []
        for fn in reversed(undo):
            fn()

    def _logging_wrapper(self, logger: object, name: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
        ends_burst = name == "save"
        run = self
        meter = self.session.logging_calls

        def make(original: Callable[..., Any]) -> Callable[..., Any]:
            @functools.wraps(original)
            def timed(*args: Any, **kwargs: Any) -> Any:
                entered = run.on_training_thread() and run.training_logs() and run.guard(run.lazy_begin, run.logging)
                if entered:
                    run.guard(meter.begin)  # the call's wall time and the process's CPU in it
                try:
                    return original(*args, **kwargs)
                finally:
                    if entered:
                        run.guard(meter.end)
                        run.guard(run.lazy_end, ends_burst and logger is run._last_logger)

            return timed

        return make

    def _checkpoint_wrapper(self, original: Callable[..., Any]) -> Callable[..., Any]:
        run = self

        @functools.wraps(original)
        def save_checkpoint(*args: Any, **kwargs: Any) -> Any:
            entered = run.on_training_thread() and run.guard(run.lazy_begin, run.checkpoint)
            if entered and not run._in_epoch:
                run.session.note(EPOCH_END_SAVE)
            try:
                return original(*args, **kwargs)
            finally:
                if entered:
                    run.guard(run.lazy_end, False)

        return save_checkpoint

    def _validation_wrapper(self, original: Callable[..., Any]) -> Callable[..., Any]:
        """The validation loop's ``run``: the whole of it is validation (or the sanity check),
        its loader's set-up (``setup_data``, the workers spawned in ``iter()``) before
        ``on_validation_start`` included, and that set-up is timed (``session.val_starts``)."""
        run = self
        starts = self.session.val_starts

        @functools.wraps(original)
        def run_validation(*args: Any, **kwargs: Any) -> Any:
            entered = run.on_training_thread() and run.guard(run.validation_start)
            if entered:
                run.guard(starts.begin)
            try:
                return original(*args, **kwargs)
            finally:
                if entered:
                    run.guard(run.validation_run_end)

        return run_validation

    def _write_wrapper(self, original: Callable[..., Any]) -> Callable[..., Any]:
        run = self
        saves = self.session.saves

        @functools.wraps(original)
        def save_checkpoint(*args: Any, **kwargs: Any) -> Any:
            entered = run.on_training_thread() and run.guard(saves.begin)
            try:
                result = original(*args, **kwargs)
            except BaseException:
                if entered:
                    run.guard(saves.end)
                raise
            if entered:
                run.guard(saves.end)
                run.guard(run.session.probe_saves)  # once per run, with the timeline paused
            return result

        return save_checkpoint

    def training_logs(self) -> bool:
        """Whether a logger call now is the training loop's: one made in a validation run (or the
        sanity check) is that run's work, which ``val_check_interval`` controls and
        ``log_every_n_steps`` does not, so its time stays in the run's phase."""
        return self._top != self.validation and self._top != self.sanity_check

    def on_training_thread(self) -> bool:
        """The timeline is driven from the training thread only; calls from others pass untimed."""
        return threading.get_ident() == self._thread

    # -- per step: Lightning calls these itself, with the guard inlined and a fast path for the
    # usual state (every Python call between two training steps costs several times its
    # tight-loop price, because the step's own work has just evicted it from the CPU caches).
    # Where the C module is built, ``_native.StepHook``s stand in Lightning's place instead: they
    # take the usual case without a Python frame (a tiny step's probes cost about 4 us in Python)
    # and call these methods for the rest -----------------------------------------------------

    def _fetch_hooks(
        self, start_profiler: Callable[[], None], stop_profiler: Callable[[], None]
    ) -> tuple[Callable[[], None], Callable[[], None]]:
        self._start_profiler = start_profiler
        self._stop_profiler = stop_profiler
        native = recorder.NATIVE_MODULE
        hooks: tuple[Callable[[], None], Callable[[], None]]
        if native is not None:
            hooks = (
                self._native_hook(native.FETCH_BEGIN, start_profiler, self._fetch_began),
                self._native_hook(native.FETCH_END, stop_profiler, self._fetch_ended),
            )
        else:
            hooks = (self._on_fetch_begin, self._on_fetch_end)
        self._fetch_end = hooks[1]
        return hooks

    def _step_wrappers(self) -> tuple[Wrap, Wrap]:
        """What ``attach_step_probe`` sets in place of Lightning's two methods."""
        native = recorder.NATIVE_MODULE
        if native is not None:
            return (
                functools.partial(self._native_hook, native.COMPUTE_BEGIN, slow=self._on_compute_begin),
                functools.partial(self._native_hook, native.COMPUTE_END, slow=self._on_compute_end),
            )
        return call_after(self._on_compute_begin), call_before(self._on_compute_end)

    def _native_hook(self, kind: int, inner: Callable[..., Any], slow: Callable[..., None]) -> Callable[..., Any]:
        """A ``_native.StepHook``: ``inner`` and this run's usual case in C, ``slow`` otherwise."""
        native = recorder.NATIVE_MODULE
        if native is None:
            raise RuntimeError("the C hot path is not built")
        hook: Callable[..., Any] = native.StepHook(
            kind,
            inner,
            slow,
            self,
            self.scope,
            self.timeline,
            self.h2d,
            self.compute,
            recorder.FOLD_AT,
            recorder.DATA_CPU_INTERVAL_NS,
        )
        return hook

    def _install_step_hooks(self) -> None:
        """Time compute through ``attach_step_probe``, and have Lightning skip the scope's own
        ``on_train_batch_start``/``on_train_batch_end``: during this fit they read as None on the
        instance. A subclass that overrides one keeps it (its ``super()`` call then records
        nothing), and so does a hook already set on the instance.

        Where a Lightning release moved those points, the hooks time compute instead, as this
        run's own methods set on the instance: one call from Lightning's dispatcher to the
        timeline. ``detach`` removes what was set."""
        scope = self.scope
        hooks: tuple[tuple[str, Callable[..., None]], ...] = (
            ("on_train_batch_start", self.on_train_batch_start),
            ("on_train_batch_end", self.on_train_batch_end),
        )
        try:
            self._undo.append(attach_step_probe(self.trainer, *self._step_wrappers()))
            self._probed = True
        except RuntimeError as exc:
            self.session.note(f"compute is timed by the batch hooks, at some cost per step: {exc}")
        for name, fn in hooks:
            if getattr(type(scope), name, None) is getattr(LightningCallbacks, name) and name not in vars(scope):
                stand_in = None if self._probed else fn  # None: Lightning's dispatcher skips it
                self._undo.append(_wrap_method(scope, name, functools.partial(_replacement, stand_in)))

    def _on_fetch_begin(self) -> None:
        self._start_profiler()
        self._fetch_began()

    def _on_fetch_end(self) -> None:
        try:
            self._fetch_ended()
        finally:
            self._stop_profiler()

    def _fetch_began(self) -> None:
        if self.closed or not self.scope._active:
            return
        try:
            if self._top is None and self._lazy is None:  # the usual case: between two steps
                self.timeline.data_begin(new_step=True)
            else:
                self.fetch_begin()
        except Exception as exc:
            self.scope._fail(exc)

    def _fetch_ended(self) -> None:
        if self.closed or not self.scope._active:
            return
        try:
            if self._nested_fetch or self._first_wait_ns is None:
                self.fetch_end()
            else:  # the usual case: a step's batch arrived, h2d starts
                self.timeline.data_end(got_item=True, then=self.h2d)
                self._fetched = True
                self._top = self.h2d
        except Exception as exc:
            self.scope._fail(exc)

    def _on_compute_begin(self, batch: Any) -> None:
        """A batch is about to be trained on (``attach_step_probe``), or validated on."""
        if self.closed or not self.scope._active:
            return
        try:
            if self._fetched and self._top == self.h2d and self._lazy is None and not self._count_tensors:
                self._fetched = False  # the usual case: h2d -> compute in one clock read
                self.timeline.switch(self.compute)
                self._top = self.compute
            elif self._top not in (self.validation, self.sanity_check):  # not a validation batch
                self.batch_start(batch)
        except Exception as exc:
            self.scope._fail(exc)

    def _on_compute_end(self, *, any_phase: bool = False) -> None:
        """The optimizer step is done (``attach_step_probe``, which is also called where no step
        ran: only compute ends here), or the batch ended (``on_train_batch_end``, ``any_phase``:
        whatever is open ends)."""
        if self.closed or not self.scope._active:
            return
        try:
            if self._top == self.compute and self._lazy is None:  # the usual case
                self.timeline.leave()
                self._top = None
            elif any_phase or self._top == self.compute:
                self.batch_end()
        except Exception as exc:
            self.scope._fail(exc)

    # the same through Lightning's callback dispatch, where ``attach_step_probe`` found nothing

    def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int) -> None:
        if not self._probed:
            self._on_compute_begin(batch)

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        if not self._probed:
            self._on_compute_end(any_phase=True)

    def guard(self, fn: Callable[..., object], *args: Any) -> bool:
        """Run ``fn`` unless the fit is over or the scope is off; contain its errors. True when it
        ran cleanly."""
        return not self.closed and self.scope._guarded(fn, *args)

    # -- phase bookkeeping ---------------------------------------------------------------

    def _drop_lazy(self) -> None:
        if self._lazy is not None:
            self.timeline.leave()
            self._lazy = None
        self._lazy_depth = 0

    def _settle(self) -> None:
        """Close a lazily open logging/checkpoint phase; resume the set-up window it interrupted."""
        if self._lazy is None:
            return
        self._drop_lazy()
        if self._resume_setup:
            self._resume_setup = False
            self.timeline.data_begin(new_step=False)
            self._top = _SETUP

    def _set_top(self, new: int | None) -> None:
        """Move the loop to phase ``new`` (None: ``other``), closing what was open."""
        self._drop_lazy()
        self._resume_setup = False
        top = self._top
        if top == new:
            return
        if top is not None and top != _SETUP and new is not None and new != _SETUP:
            self.timeline.switch(new)  # h2d -> compute each step: one clock read
            self._top = new
            return
        if top == _SETUP:
            self._setup_ns += self.timeline.data_end(got_item=False)
        elif top is not None:
            self.timeline.leave()
        self._top = None
        if new == _SETUP:
            self.timeline.data_begin(new_step=False)
        elif new is not None:
            self.timeline.enter(new)
        self._top = new

    def lazy_begin(self, pid: int) -> None:
        if self._lazy is not None and (self._lazy == pid or self._lazy_depth > 0):
            self._lazy_depth += 1  # the same burst, or a call nested in another wrapped call
            return
        if self._lazy is not None:
            self.timeline.leave()  # a burst of the other kind ends; a suspended set-up stays so
            self._lazy = None
        if self._top == _SETUP:
            self._setup_ns += self.timeline.data_end(got_item=False)
            self._top = None
            self._resume_setup = True
        self.timeline.enter(pid)
        self._lazy = pid
        self._lazy_depth = 1

    def lazy_end(self, ends_burst: bool) -> None:
        if self._lazy is None:
            self._lazy_depth = 0
            return
        self._lazy_depth = max(0, self._lazy_depth - 1)
        if self._lazy_depth == 0 and ends_burst:
            self._settle()

    # -- events --------------------------------------------------------------------------

    def fit_start(self) -> None:
        self.attach()
        self._time_budget_s = time_budget_s(self.trainer)
        self._steps_before = _count(getattr(self.trainer, "global_step", 0)) or 0
        self.session.shape = run_shape(self.trainer, max_time_s=self._time_budget_s, steps_before=self._steps_before)
        if getattr(self.trainer, "fast_dev_run", False):
            self.session.note("fast_dev_run: a smoke test of a few batches; the numbers are not representative")
        self._set_top(_SETUP)  # train_dataloader() and the first iter() happen before on_train_start

    def fetch_begin(self) -> None:
        if not self._in_epoch and self._top != self.compute:
            # a fit resumed mid-epoch (``ckpt_path=``): Lightning skips ``on_train_epoch_start``
            self.epoch_start()
        if self._top == self.compute or (self._fetched and self._top == self.h2d):
            # training_step consumes dataloader_iter, or Lightning fetches the next batch before
            # this step's (a loader without ``__len__``, from its second epoch): a wait in the step
            self._settle()
            self.timeline.data_begin(new_step=False)
            self._nested_fetch = True
            return
        self._set_top(None)
        self.timeline.data_begin(new_step=True)

    def fetch_end(self) -> None:
        if self._nested_fetch:
            self._nested_fetch = False
            self.timeline.data_end(got_item=False)
            return
        wait = self.timeline.data_end(got_item=True, then=self.h2d)
        if self._first_wait_ns is None:
            self._first_wait_ns = wait
        self._fetched = True
        self._top = self.h2d

    def batch_start(self, batch: Any) -> None:
        """``on_train_batch_start`` outside its usual case (the first batch of an epoch, a step
        without a fetch, a logging call still open)."""
        if not self._fetched:  # no fetch before this step (dataloader_iter): the step starts here
            self._set_top(None)
            self.timeline.data_begin(new_step=True)
            self.timeline.data_end(got_item=True)
        self._fetched = False
        self._set_top(self.compute)
        if self._count_tensors:
            self._count_tensors = False
            self.session.batch_tensors = count_tensors(batch)
            self.session.batch_bytes = batch_bytes(batch)

    def batch_end(self) -> None:
        """``on_train_batch_end`` outside its usual case."""
        self._set_top(None)

    def validation_start(self) -> None:
        phase = self.sanity_check if self._sanity_checking else self.validation
        if self._top != phase:
            self._before_validation = self._top
        self._set_top(phase)

    def validation_hook_start(self) -> None:
        """``on_validation_start``: the run's loader is set up (its start-up ends here)."""
        self.validation_start()
        self.session.val_starts.started()
        loader, _ = self._val_loaders.read(_first_loader(getattr(self.trainer, "val_dataloaders", None)))
        self.session.val_loader = loader

    def validation_run_end(self) -> None:
        """The validation loop's ``run`` returned (or raised): whatever of it is still open ends."""
        if self._top in (self.validation, self.sanity_check):
            self.validation_end()

    def validation_end(self) -> None:
        before, self._before_validation = self._before_validation, None
        self._set_top(before if before not in (self.validation, self.sanity_check) else None)

    def sanity_check_start(self) -> None:
        """The sanity check interrupts the first epoch's set-up window."""
        self._sanity_checking = True
        self._set_top(None)

    def sanity_check_end(self) -> None:
        self._sanity_checking = False
        self._set_top(_SETUP)

    def epoch_start(self) -> None:
        self._set_top(None)
        loaders = getattr(self.trainer, "train_dataloader", None)
        first = _first_loader(loaders)
        loader, fresh = self._loaders.read(first)
        batches = getattr(self.trainer, "num_training_batches", None)
        finite = isinstance(batches, int) or (isinstance(batches, float) and batches.is_integer())
        per_epoch = int(batches) if finite and batches is not None else None
        self.session.note_loader(loader, per_epoch, first)
        self.session.shape = run_shape(
            self.trainer, per_epoch, max_time_s=self._time_budget_s, steps_before=self._steps_before
        )
        epoch = getattr(self.trainer, "current_epoch", None)
        if not self._labelled and isinstance(epoch, int) and not isinstance(epoch, bool):
            # panels read Lightning's epoch numbers: the fit's epochs follow its first one's
            self._labelled = True
            self.session.epoch_label_offset = epoch
        if _loader_count(loaders) > 1:
            self.session.note("several train loaders: the first one's settings are reported")
        self.timeline.begin_epoch(in_process_data=loader is None or loader.num_workers == 0)
        self._in_epoch = True
        # the first batch after the loader was read anew (kept until one comes: a pass may yield none)
        self._count_tensors = self._count_tensors or fresh
        self._set_top(_SETUP)

    def epoch_end(self, pl_module: Any) -> None:
        self._set_top(None)
        if not self._in_epoch:
            return
        self._in_epoch = False
        index = self.session.epochs_ended
        boundary = EpochBoundary(index, self._setup_ns, self._first_wait_ns or 0, 0)
        self._setup_ns, self._first_wait_ns = 0, None
        self.timeline.note_boundary(boundary)
        # the headline numbers are logged at this epoch's end: its close cannot wait
        headline = pl_module is not None and self._headline_wanted()
        epoch = self.session.end_epoch(may_wait=not headline)
        self.flush_console(during_training=True)
        if epoch is not None and headline:
            self.log_headline(pl_module, epoch.get())

    def _headline_wanted(self) -> bool:
        """The Trainer has a logger, or a callback monitors a ``stallscope/`` number (an
        ``EarlyStopping`` or ``ModelCheckpoint`` reads it from ``callback_metrics``)."""
        if getattr(self.trainer, "loggers", None):
            return True
        for callback in getattr(self.trainer, "callbacks", None) or []:
            monitor = getattr(callback, "monitor", None)
            if isinstance(monitor, str) and monitor.startswith("stallscope/"):
                return True
        return False

    def log_headline(self, pl_module: Any, epoch: EpochReport) -> None:
        """Log the epoch's headline numbers through ``pl_module.log``: Lightning hands them to every
        logger of the Trainer at the epoch's end (and to ``callback_metrics``, for monitors).

        Only when the Trainer has a logger (SPEC: "to the Trainer's loggers") or a callback
        monitors one of them: the first ``self.log`` of each new key costs Lightning about a
        millisecond, 11 ms an epoch here, which a Trainer without either would pay for nothing."""
        summary = epoch.summary
        values = {
            "gpu_idle_fraction": summary.gpu_idle_fraction,
            "steps_per_s": summary.steps_per_s,
            "step_time_s": float(summary.step_time_s.get("mean", 0.0)),
            "top_saving_fraction": self.session.top_saving(epoch),
        }
        for name in HEADLINE_PHASES:
            values[f"{name}_fraction"] = float(summary.phase_fractions.get(name, 0.0))
        try:
            if self.session.job is not None:
                self._log_job_headline(values)
                return
            for name, value in values.items():
                pl_module.log(f"stallscope/{name}", float(value), on_step=False, on_epoch=True, prog_bar=False)
        except Exception as exc:  # e.g. Trainer(barebones=True) forbids self.log: a note, not a failure
            if from_signal_handler(exc):
                raise
            self.session.note(f"headline numbers not logged to the Trainer's loggers ({type(exc).__name__}: {exc})")

    def _log_job_headline(self, values: Mapping[str, float]) -> None:
        """A distributed fit: rank 0 hands the job's numbers to the loggers itself (the other ranks
        log nothing). ``pl_module.log`` would run on every rank and warn, each epoch, that the
        values are not synced; so these are not in ``callback_metrics`` for monitors. The class's
        ``log_metrics`` is called, not the instance's timing wrapper: this is StallScope's time."""
        if not self.session.job or not self.session.job.leader:
            return
        metrics = {f"stallscope/{name}": float(value) for name, value in values.items()}
        step = getattr(self.trainer, "global_step", None)
        for logger in getattr(self.trainer, "loggers", None) or []:
            type(logger).log_metrics(logger, metrics, step=step)

    def train_end(self) -> None:
        self._set_top(None)

    def finish(self, exception: BaseException | None = None) -> None:
        """The fit is over (or failed): close the epoch in progress, write the final report."""
        if self.closed:
            return
        try:
            if self.scope._active:
                if (
                    exception is not None
                    and self._fetched
                    and self._top == self.h2d
                    and self._raised_in_fetch(exception)
                ):
                    # the train loader's next() raised: the probe after it saw a batch arrive,
                    # but none did, and no step ran (as in the plain loop, it is not counted)
                    self._fetched = False
                    self.timeline.drop_step()
                self._set_top(None)
                if exception is not None and self._in_epoch:
                    self.epoch_end(None)
        finally:
            if exception is not None:
                self.session.end_with(exception, "fit")
            self.scope.close()
            self.closed = True
            self._loaders.forget()  # the train loader is not held after the fit
            self._val_loaders.forget()
            self.detach()
            self.flush_console(during_training=False)

    def _raised_in_fetch(self, exception: BaseException) -> bool:
        """Whether ``exception`` came out of the train loader's ``next()``: its traceback passes
        through the data fetcher that calls this run's fetch probe (Lightning's fetcher keeps it
        as ``_stop_profiler``; another private name, read only on this failure path)."""
        hook = self._fetch_end
        if hook is None:
            return False
        try:
            tb = exception.__traceback__
            while tb is not None:
                owner = tb.tb_frame.f_locals.get("self")
                if owner is not None and getattr(owner, "_stop_profiler", None) == hook:
                    return True
                tb = tb.tb_next
        except Exception:
            return False
        return False

    # -- output --------------------------------------------------------------------------

    def flush_console(self, *, during_training: bool) -> None:
        """Hand what the session printed to the terminal without breaking a progress bar: through
        the bar's own ``print`` while training (tqdm clears and redraws its bar), else to stdout."""
        buffer = self.buffer
        if buffer is None:
            return
        text = buffer.getvalue()
        if not text:
            return
        buffer.seek(0)
        buffer.truncate()
        bar = getattr(self.trainer, "progress_bar_callback", None)
        if during_training and bar is not None and getattr(bar, "is_enabled", False):
            bar.print(text.rstrip("\n"))
        else:
            sys.stdout.write(text)
            sys.stdout.flush()


def _session_for(scope: StallScope, trainer: Any) -> tuple[Session, io.StringIO | None]:
    """A fresh ``lightning`` session for one fit. Printing goes to a buffer that ``flush_console``
    routes; ranks other than 0 print nothing (and write only ``<report_dir>/ranks/rank-<R>.json``)."""
    config = scope._config
    config, buffer = console_for_rank(config, getattr(trainer, "global_rank", 0))
    session = Session(config, framework="lightning")
    precision = getattr(trainer, "precision", None)
    if precision is not None:
        session.precision = str(precision)  # lets compute.amp tell fp32 from mixed precision
    return session, buffer


if TYPE_CHECKING:
    _HookBase = object
else:  # a C base that reads the hooks set to None without a type lookup, where it is built
    _HookBase = recorder.NATIVE_MODULE.HookBase if recorder.NATIVE_MODULE is not None else object


class LightningCallbacks(_HookBase):
    """Lightning's ``Callback`` interface, by duck typing; ``StallScope`` inherits it.

    Each hook forwards to the ``_FitRun`` of the ``fit`` in progress (there is none outside
    ``trainer.fit``: ``validate``/``test``/``predict`` are not observed) and never raises.
    """

    _fit_run: _FitRun | None = None

    if TYPE_CHECKING:  # provided by StallScope
        _active: bool

        def _fail(self, exc: BaseException) -> None: ...

        def _begin_run(self, session: Session) -> None: ...

    # -- identity, as Lightning reads it -------------------------------------------------

    #: a plain attribute, not a property: Lightning formats it into a profiler label on every
    #: hook call, twice per step (a subclass gets its own name, ``__init_subclass__``). Each
    #: ``StallScope`` sets its own, naming its report folder (``StallScope._keyed``)
    state_key: str = "StallScope"

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls.state_key = cls.__qualname__

    @property
    def _legacy_state_key(self) -> type[Any]:
        return type(self)

    def _generate_state_key(self, **kwargs: Any) -> str:
        return f"{type(self).__qualname__}{kwargs!r}"

    def state_dict(self) -> dict[str, Any]:
        return {}  # nothing to carry over: a resumed fit is a new run

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        return None

    # -- the hooks that record -----------------------------------------------------------

    def _event(self, name: str, *args: Any) -> None:
        run = self._fit_run
        if run is not None:
            run.guard(getattr(run, name), *args)

    def setup(self, trainer: Any, pl_module: Any, stage: str) -> None:
        try:
            self._quiet_hooks()
        except Exception as exc:
            self._fail(exc)
        trial = tune_trial.current()
        if trial is not None and stage == "fit":  # a trial of `stallscope tune`: its settings, its budget
            tune_lightning.attach(trial, trainer)

    def on_fit_start(self, trainer: Any, pl_module: Any) -> None:
        previous = self._fit_run
        if previous is not None:  # a fit that never reached its end on this scope
            previous.finish()
        self._fit_run = None
        try:
            if self._watched_already(trainer):
                return
            session, buffer = _session_for(self._scope(), trainer)
            session.note_model(pl_module)  # an nn.DataParallel inside: dist.dataparallel
            if int(getattr(trainer, "world_size", 1) or 1) > 1:  # ranks on this host share its cores
                session.local_ranks = int(getattr(trainer, "num_devices", 1) or 1)
            run = _FitRun(self._scope(), trainer, session, buffer)
            self._begin_run(session)
        except Exception as exc:
            self._fail(exc)
            return
        self._fit_run = run
        run.guard(run.fit_start)

    def on_sanity_check_start(self, trainer: Any, pl_module: Any) -> None:
        self._event("sanity_check_start")

    def on_sanity_check_end(self, trainer: Any, pl_module: Any) -> None:
        self._event("sanity_check_end")

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        return None

    def on_train_epoch_start(self, trainer: Any, pl_module: Any) -> None:
        self._event("epoch_start")

    # the two per-step hooks: during a fit, the run's own methods of these names usually stand
    # in front of these as instance attributes (``_FitRun._install_step_hooks``); these are the
    # path when a subclass overrides one (through ``super()``) or a hook was set on the instance

    def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int) -> None:
        run = self._fit_run
        if run is not None:
            run.on_train_batch_start(trainer, pl_module, batch, batch_idx)

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        run = self._fit_run
        if run is not None:
            run.on_train_batch_end(trainer, pl_module, outputs, batch, batch_idx)

    def on_train_epoch_end(self, trainer: Any, pl_module: Any) -> None:
        self._event("epoch_end", pl_module)

    def on_validation_start(self, trainer: Any, pl_module: Any) -> None:
        self._event("validation_hook_start")

    def on_validation_end(self, trainer: Any, pl_module: Any) -> None:
        self._event("validation_end")

    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        self._event("train_end")

    def on_fit_end(self, trainer: Any, pl_module: Any) -> None:
        run = self._fit_run
        if run is not None:
            self._finish(run, None)

    def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
        run = self._fit_run
        if run is not None:
            self._finish(run, exception)
            self._fit_run = None

    def teardown(self, trainer: Any, pl_module: Any, stage: str) -> None:
        run = self._fit_run
        if run is not None and run.trainer is trainer:
            self._finish(run, None)  # no-op after on_fit_end; removes the probes either way
            self._fit_run = None

    def _finish(self, run: _FitRun, exception: BaseException | None) -> None:
        try:
            run.finish(exception)
        except Exception as exc:
            run.closed = True
            try:
                self._fail(exc)  # raises it again when it is the user's (a signal handler's)
            finally:
                run.detach()

    def _scope(self) -> StallScope:
        return cast("StallScope", self)

    def _watched_already(self, trainer: Any) -> bool:
        """Whether an earlier StallScope in the Trainer's callbacks watches this fit into the same
        report folder: then this one turns itself off for the fit (two watchers of one run would
        overwrite each other's report), and the other's report says so."""
        folder = self._scope()._config.report_dir
        for callback in getattr(trainer, "callbacks", None) or ():
            if callback is self:
                return False
            if isinstance(callback, LightningCallbacks) and callback._scope()._config.report_dir == folder:
                self._scope()._active = False
                where = "no report folder" if folder is None else f"report folder {folder}"
                callback._scope()._session.note(
                    f"a second StallScope callback with the same {where} turned itself off: "
                    "one watcher per report folder"
                )
                return True
        return False

    # -- hooks not needed: None, so Lightning's dispatcher (which calls only callable hooks)
    # skips them without opening a profiler context; the per-step ones matter most. Not a
    # ``__getattr__``: a class with one has every attribute read go through it (two more type
    # lookups each), and the dispatcher reads six hooks a step. These, and every other hook of
    # Lightning's that no class of this object's defines (test, predict, any a later release
    # adds), are set on the instance (``_quiet_hooks``); a mixin's own hooks are left alone -----

    on_before_backward = None
    on_after_backward = None
    on_before_optimizer_step = None
    on_before_zero_grad = None
    on_validation_batch_start = None
    on_validation_batch_end = None
    on_validation_epoch_start = None
    on_validation_epoch_end = None

    def _quiet_hooks(self) -> None:
        """Set to None on this instance every ``on_*`` hook of the imported Lightning's
        ``Callback`` that reads as None on its class: those above, and any no class of this
        object's defines (test and predict hooks, and any a later release adds: Lightning's
        dispatcher reads hooks with a plain ``getattr``, which would raise ``AttributeError`` in
        the user's fit). From the instance's dict the C base answers them without a type lookup
        (``_native.HookBase``). Called at ``__init__``, on unpickling, and again at ``setup``
        (the first hook of every ``fit``, ``validate``, ``test`` and ``predict``), by when a
        Trainer's namespace is imported. A hook patched onto the class later is not seen by an
        instance that already holds its None."""
        for namespace in LIGHTNING_NAMESPACES:
            base = getattr(sys.modules.get(namespace), "Callback", None)
            if not isinstance(base, type):
                continue
            for name in dir(base):
                if name.startswith("on_") and name not in vars(self) and getattr(type(self), name, None) is None:
                    setattr(self, name, None)

    # -- hooks Lightning calls directly (not through its callable() check) ---------------------

    def on_save_checkpoint(self, trainer: Any, pl_module: Any, checkpoint: dict[str, Any]) -> None:
        return None

    def on_load_checkpoint(self, trainer: Any, pl_module: Any, checkpoint: dict[str, Any]) -> None:
        return None
