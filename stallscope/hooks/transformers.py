"""StallScope as a Hugging Face ``transformers.TrainerCallback`` (SPEC §1b):
``Trainer(..., callbacks=[StallScope()])``.

One object, no import
    The Trainer's ``CallbackHandler`` calls ``getattr(callback, event)(args, state, control,
    **kwargs)`` for every callback and every event, and never checks the callback's class on that
    path, so ``StallScope`` answers the ``TrainerCallback`` events by duck typing
    (``TransformersCallbacks``, a mixin it inherits) and this module imports nothing of
    transformers'. ``on_train_end`` is also a Lightning hook: the mixin tells the two callers
    apart by their arguments (the Trainer passes ``args, state, control`` and keywords).

Where the time goes (the Trainer's training thread; a step is an optimizer step)
    data        ``trainer.get_batch_samples``: the wait for every micro-batch of the step
                (``gradient_accumulation_steps`` of them). Accelerate's loader reads one batch
                ahead and copies it to the device inside its ``next()``: on a GPU that copy is
                part of this wait. Before each epoch's first step, the loader's set-up
                (``iter()``: worker start) from ``on_epoch_begin`` is the pass's start-up.
    compute     from the batches' arrival to ``on_step_end``: forward and backward of every
                micro-batch, clipping, the optimizer and scheduler steps
    logging     ``trainer.log`` (what hands the metrics to every ``report_to`` integration)
    validation  ``trainer.evaluate`` during training (``eval_strategy``)
    checkpoint  ``trainer._save_checkpoint`` (``save_strategy``)
    other       the rest: callbacks between the phases, the loss's ``.item()`` before a log

All of them are attributes set on the instance of the Trainer that owns the callback
(``attach_trainer_probes``) at ``on_train_begin`` and removed at ``on_train_end`` (or when the
next ``train()`` starts); nothing global is patched. The Trainer is found from the call stack at
``on_train_begin`` (``find_trainer``), as callbacks are not handed it.

Epochs, reports, loggers
    Each ``trainer.train()`` is one run. An epoch ends after the Trainer's epoch-end
    ``_maybe_log_save_evaluate`` (so an ``eval_strategy="epoch"`` evaluation and an epoch-end save
    belong to the epoch they follow): the diagnosis is printed (through ``tqdm.write`` when tqdm
    is there, which keeps progress bars intact), ``report.json`` is written and the headline
    numbers go through ``trainer.log`` (``stallscope/...``, once per epoch) to the integrations of
    ``report_to``. The final report is written at ``on_train_end``.
"""

from __future__ import annotations

import functools
import io
import math
import sys
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, cast

from stallscope._exceptions import from_signal_handler
from stallscope.analysis.context import RunShape
from stallscope.hooks.environment import batch_bytes, count_tensors
from stallscope.hooks.session import Session, console_for_rank
from stallscope.report.schema import EpochReport
from stallscope.signals.loader import LoaderReader
from stallscope.timeline.phases import CHECKPOINT, COMPUTE, LOGGING, VALIDATION
from stallscope.timeline.stats import EpochBoundary
from stallscope.tune import transformers as tune_transformers
from stallscope.tune import trial as tune_trial

if TYPE_CHECKING:
    from stallscope.hooks.scope import StallScope

#: the Trainer's methods timed, public and private, and the phase each is: set on the instance
PUBLIC_PROBES = {"get_batch_samples": "data", "log": LOGGING, "evaluate": VALIDATION, "training_step": "failure"}
PRIVATE_PROBES = {
    "_save_checkpoint": CHECKPOINT,
    "_maybe_log_save_evaluate": "epoch_end",
    "_get_num_items_in_batch": "batches_in",
}

#: headline numbers handed to ``trainer.log`` at each epoch end, under ``stallscope/``
HEADLINE_PHASES = ("data", "compute", "logging", "checkpoint", "validation", "other")

#: how many frames up from a callback event the Trainer is looked for
MAX_FRAMES = 12


def find_trainer(callback: object) -> Any:
    """The ``transformers.Trainer`` whose callback handler holds ``callback``, from the call stack.

    Callbacks are not handed their Trainer. Every event is called from a Trainer method through
    ``trainer.callback_handler`` (``CallbackHandler.call_event``), so a frame a few levels up has
    ``self`` = the Trainer. Returns None when none is found (an event called by hand).
    ``tests/test_hooks_transformers.py`` checks this against the installed transformers."""
    frame = sys._getframe(1)
    for _ in range(MAX_FRAMES):
        if frame is None:
            return None
        owner = frame.f_locals.get("self")
        handler = getattr(owner, "callback_handler", None)
        if handler is not None and any(cb is callback for cb in getattr(handler, "callbacks", ()) or ()):
            return owner
        frame = frame.f_back  # type: ignore[assignment]
    return None


#: what ``attach_trainer_probes`` sets: given what a method is timed as and the original, its wrapper
Wrap = Callable[[str, Callable[..., Any]], Callable[..., Any]]


def attach_trainer_probes(trainer: Any, wrap: Wrap) -> Callable[[], None]:
    """Set ``wrap(what, original)`` in place of each probed method on this Trainer instance
    (``PUBLIC_PROBES`` and the private touch points, ``PRIVATE_PROBES``: transformers has no
    public hook around a checkpoint save, and none after the epoch-end evaluation and save).

    Raises ``RuntimeError`` naming what moved when a release no longer has one of them
    (``tests/test_hooks_transformers.py`` checks them against the installed transformers).
    Returns the undo."""
    names = {**PUBLIC_PROBES, **PRIVATE_PROBES}
    missing = [name for name in names if not callable(getattr(type(trainer), name, None))]
    if missing:
        version = getattr(sys.modules.get("transformers"), "__version__", "?")
        raise RuntimeError(
            f"this transformers ({version}) has no Trainer.{', Trainer.'.join(missing)}; StallScope needs an update"
        )
    set_here: list[tuple[str, Callable[..., Any]]] = []
    for name, what in names.items():
        wrapper = wrap(what, getattr(trainer, name))
        setattr(trainer, name, wrapper)
        set_here.append((name, wrapper))

    def detach() -> None:
        for name, wrapper in set_here:
            if vars(trainer).get(name) is wrapper:
                delattr(trainer, name)

    return detach


def _whole(value: object) -> int | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
        return None
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return math.ceil(value)


def run_shape(args: Any, state: Any, steps_per_epoch: int | None) -> RunShape:
    """The run's length from ``TrainingArguments`` and ``TrainerState``: ``state.max_steps``
    optimizer steps (the Trainer works it out from ``max_steps`` or ``num_train_epochs``)."""
    max_steps = _whole(getattr(state, "max_steps", None))
    return RunShape(
        max_epochs=_whole(getattr(state, "num_train_epochs", None) or getattr(args, "num_train_epochs", None)),
        max_steps=max_steps or None,
        batches_per_epoch=steps_per_epoch,
    )


def _steps_per_epoch(loader: object, args: Any) -> int | None:
    """Optimizer steps in one pass over the train loader (its batches over the accumulation)."""
    try:
        batches = len(loader)  # type: ignore[arg-type]
    except Exception:
        return None
    accumulation = getattr(args, "gradient_accumulation_steps", 1)
    if not isinstance(accumulation, int) or accumulation < 1:
        accumulation = 1
    return max(1, math.ceil(batches / accumulation)) if batches > 0 else None


class _TrainRun:
    """The recording of one ``trainer.train()``: the Trainer's methods, timed."""

    def __init__(self, scope: StallScope, trainer: Any, session: Session, buffer: io.StringIO | None) -> None:
        self.scope = scope
        self.trainer = trainer
        self.session = session
        self.buffer = buffer
        timeline = session.timeline
        self.timeline = timeline
        self.compute = timeline.phase_id(COMPUTE)
        self.phases = {name: timeline.phase_id(name) for name in (LOGGING, VALIDATION, CHECKPOINT)}
        self.closed = False
        self._thread = threading.get_ident()
        self._undo: list[Callable[[], None]] = []
        self._loaders = LoaderReader()
        #: the phase the loop is in between the probes: None (``other``), compute, or the set-up
        self._in_setup = False
        self._in_compute = False
        #: between ``get_batch_samples``' start and the arrival of the step's batches
        self._fetching = False
        #: probed calls in progress (a log inside an evaluation is the evaluation's)
        self._depth = 0
        self._in_epoch = False
        self._epoch_ending = False
        self._setup_ns = 0
        self._first_wait_ns: int | None = None
        self._count_tensors = False

    # -- wiring --------------------------------------------------------------------------

    def attach(self) -> None:
        self._undo.append(attach_trainer_probes(self.trainer, self._wrap))

    def detach(self) -> None:
        undo, self._undo = self._undo, []
        for fn in reversed(undo):
            fn()

    def guard(self, fn: Callable[..., object], *args: Any) -> bool:
        return not self.closed and self.scope._guarded(fn, *args)

    def _wrap(self, what: str, original: Callable[..., Any]) -> Callable[..., Any]:
        if what == "data":
            return self._data_wrapper(original)
        if what == "epoch_end":
            return self._after_wrapper(original)
        if what == "failure":
            return self._failure_wrapper(original)
        if what == "batches_in":
            return self._batches_in_wrapper(original)
        return self._phase_wrapper(self.phases[what], original)

    def _data_wrapper(self, original: Callable[..., Any]) -> Callable[..., Any]:
        """``get_batch_samples``: the step's data wait begins (the usual case inline: it runs every
        step, and every Python call between two steps costs more than its tight-loop price)."""
        run = self
        scope = self.scope
        timeline = self.timeline
        thread = self._thread
        get_ident = threading.get_ident

        @functools.wraps(original)
        def get_batch_samples(*args: Any, **kwargs: Any) -> Any:
            timed = False
            if scope._active and not run.closed and get_ident() == thread:
                try:
                    if run._in_compute or run._in_setup:
                        run._leave_all()
                    timeline.data_begin(new_step=True)
                    run._fetching = timed = True
                except Exception as exc:
                    scope._fail(exc)
            try:
                result = original(*args, **kwargs)
            except BaseException as exc:
                if timed and run._fetching:
                    run.guard(run.fetch_end, None)
                run.failed(exc)
                raise
            if timed and run._fetching:  # a get_batch_samples that counts no items
                run.guard(run.fetch_end, result[0] if isinstance(result, tuple) and result else None)
            return result

        return get_batch_samples

    def _phase_wrapper(self, pid: int, original: Callable[..., Any]) -> Callable[..., Any]:
        run = self

        @functools.wraps(original)
        def timed(*args: Any, **kwargs: Any) -> Any:
            entered = run.on_training_thread() and run.guard(run.phase_begin, pid)
            try:
                return original(*args, **kwargs)
            except BaseException as exc:
                if entered:
                    run.guard(run.phase_end)
                    entered = False
                run.failed(exc)
                raise
            finally:
                if entered:
                    run.guard(run.phase_end)

        return timed

    def _batches_in_wrapper(self, original: Callable[..., Any]) -> Callable[..., Any]:
        """``_get_num_items_in_batch(batch_samples, device)``: the step's batches are in; what
        follows is compute (in a distributed job it gathers the token count from every rank: a
        collective, where a fast rank waits for a slow one, as in the backward's all-reduce)."""
        run = self

        scope = self.scope
        thread = self._thread
        get_ident = threading.get_ident

        @functools.wraps(original)
        def get_num_items_in_batch(batch_samples: Any, *args: Any, **kwargs: Any) -> Any:
            if run._fetching and get_ident() == thread and scope._active and not run.closed:
                try:
                    run.fetch_end(batch_samples)
                except Exception as exc:
                    scope._fail(exc)
            return original(batch_samples, *args, **kwargs)

        return get_num_items_in_batch

    def _failure_wrapper(self, original: Callable[..., Any]) -> Callable[..., Any]:
        """``training_step``: not timed (compute runs from the batches' arrival to
        ``on_step_end``); an exception out of it ends the run with its report written."""
        run = self

        @functools.wraps(original)
        def training_step(*args: Any, **kwargs: Any) -> Any:
            try:
                return original(*args, **kwargs)
            except BaseException as exc:
                run.failed(exc)
                raise

        return training_step

    def _after_wrapper(self, original: Callable[..., Any]) -> Callable[..., Any]:
        run = self

        @functools.wraps(original)
        def maybe_log_save_evaluate(*args: Any, **kwargs: Any) -> Any:
            if run._in_compute:  # the step's compute ends at on_step_end; this is its aftermath
                run.guard(run.leave_compute)
            try:
                result = original(*args, **kwargs)
            except BaseException as exc:
                run.failed(exc)
                raise
            if run._epoch_ending and run.on_training_thread():
                run.guard(run.epoch_end)
            return result

        return maybe_log_save_evaluate

    def on_training_thread(self) -> bool:
        return threading.get_ident() == self._thread

    # -- events --------------------------------------------------------------------------

    def train_begin(self, args: Any, state: Any) -> None:
        self.attach()
        self.session.shape = run_shape(args, state, None)

    def epoch_begin(self, args: Any, state: Any, loader: object) -> None:
        if self._in_epoch:  # an epoch whose end was not seen
            self.epoch_end()
        self._leave_all()
        config, fresh = self._loaders.read(loader)
        per_epoch = _steps_per_epoch(loader, args)
        self.session.note_loader(config, per_epoch, loader)
        self.session.shape = run_shape(args, state, per_epoch)
        self.timeline.begin_epoch(in_process_data=config is None or config.num_workers == 0)
        self._in_epoch = True
        self._count_tensors = self._count_tensors or fresh
        self.timeline.data_begin(new_step=False)  # iter(train_dataloader): the workers start
        self._in_setup = True

    def _leave_all(self) -> None:
        if self._in_setup:
            self._setup_ns += self.timeline.data_end(got_item=False)
            self._in_setup = False
        self.leave_compute()

    def leave_compute(self) -> None:
        if self._in_compute:
            self.timeline.leave()
            self._in_compute = False

    def fetch_end(self, batches: Any) -> None:
        """The step's batches are in (``batches``: the list of micro-batches; empty or None when
        the loader had none left, or raised)."""
        self._fetching = False
        if batches and self._first_wait_ns is not None and not self._count_tensors:  # the usual case
            self.timeline.data_end(got_item=True, then=self.compute)
            self._in_compute = True
            return
        got = bool(batches)
        wait = self.timeline.data_end(got_item=got, then=self.compute if got else None)
        if not got:
            return
        self._in_compute = True
        if self._first_wait_ns is None:
            self._first_wait_ns = wait
        if self._count_tensors and isinstance(batches, list) and batches:
            self._count_tensors = False
            self.session.batch_tensors = count_tensors(batches[0])
            self.session.batch_bytes = batch_bytes(batches[0])
            self.session.note_batch(batches[0])

    def phase_begin(self, pid: int) -> None:
        self._depth += 1
        if self._depth > 1:  # a log inside an evaluation: the evaluation's time
            return
        self._leave_all()
        self.timeline.enter(pid)

    def phase_end(self) -> None:
        self._depth = max(0, self._depth - 1)
        if self._depth == 0:
            self.timeline.leave()

    def epoch_ending(self) -> None:
        """``on_epoch_end``: the epoch ends after the epoch-end log, evaluation and save."""
        self.leave_compute()
        self._epoch_ending = True

    def epoch_end(self, headline: bool = True) -> None:
        self._epoch_ending = False
        self._leave_all()
        if not self._in_epoch:
            return
        self._in_epoch = False
        boundary = EpochBoundary(self.session.epochs_ended, self._setup_ns, self._first_wait_ns or 0, 0)
        self._setup_ns, self._first_wait_ns = 0, None
        self.timeline.note_boundary(boundary)
        later = self.session.end_epoch(may_wait=False)
        self.flush_console()
        if later is not None and headline:
            self.log_headline(later.get())

    def log_headline(self, epoch: EpochReport) -> None:
        """The epoch's headline numbers through the Trainer's own ``log`` (the class's, not the
        timing wrapper: this is StallScope's time, and the timeline is paused), which hands them
        to every ``report_to`` integration and keeps them in ``state.log_history``."""
        summary = epoch.summary
        values = {
            "gpu_idle_fraction": summary.gpu_idle_fraction,
            "steps_per_s": summary.steps_per_s,
            "top_saving_fraction": self.session.top_saving(epoch),
        }
        for name in HEADLINE_PHASES:
            values[f"{name}_fraction"] = float(summary.phase_fractions.get(name, 0.0))
        job = self.session.job
        if job is not None and not job.leader:
            return
        metrics = {f"stallscope/{name}": float(value) for name, value in values.items()}
        self.timeline.pause()
        try:
            type(self.trainer).log(self.trainer, metrics)
        except Exception as exc:
            if from_signal_handler(exc):
                raise
            self.session.note(f"headline numbers not logged through the Trainer ({type(exc).__name__}: {exc})")
        finally:
            self.timeline.resume()

    def failed(self, exception: BaseException) -> None:
        """The user's training raised through a probed method (transformers has no exception
        event): end the run with what ran, written; the exception goes on unchanged."""
        if self.closed or not self.on_training_thread():
            return
        try:
            self.finish(exception)
        except Exception as exc:  # never replace the user's exception
            if from_signal_handler(exc):
                raise
            self.closed = True
            self.detach()

    def finish(self, exception: BaseException | None = None) -> None:
        if self.closed:
            return
        try:
            if self.scope._active:
                self._leave_all()
                while self._depth > 0:  # a probed call the exception left open
                    self.phase_end()
                if self._in_epoch:
                    self.epoch_end(headline=exception is None)
        finally:
            if exception is not None:
                self.session.end_with(exception, "train()")
            self.scope.close()
            self.closed = True
            self._loaders.forget()
            self.detach()
            self.flush_console()

    def flush_console(self) -> None:
        """Hand what the session printed to the terminal: through ``tqdm.write`` where tqdm is
        imported (it clears and redraws the Trainer's progress bar), else to stdout."""
        buffer = self.buffer
        if buffer is None:
            return
        text = buffer.getvalue()
        if not text:
            return
        buffer.seek(0)
        buffer.truncate()
        tqdm = getattr(sys.modules.get("tqdm"), "tqdm", None)
        if tqdm is not None and callable(getattr(tqdm, "write", None)):
            tqdm.write(text.rstrip("\n"), file=sys.stdout)
        else:
            sys.stdout.write(text)
            sys.stdout.flush()


def _session_for(scope: StallScope, args: Any) -> tuple[Session, io.StringIO | None]:
    """A fresh ``transformers`` session for one ``train()``: printing goes to a buffer that
    ``flush_console`` routes; processes other than the main one print nothing."""
    config = scope._config
    config, buffer = console_for_rank(config, getattr(args, "process_index", 0))
    session = Session(config, framework="transformers")
    if getattr(args, "bf16", False):
        session.precision = "bf16-mixed"
    elif getattr(args, "fp16", False):
        session.precision = "16-mixed"
    else:
        session.precision = "32-true"
    return session, buffer


def _is_trainer_call(args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    """Whether a hook named like a Lightning one was called by transformers' ``CallbackHandler``
    (``args, state, control`` and keywords) rather than by Lightning (``trainer, pl_module``)."""
    return len(args) == 3 or bool(kwargs)


class TransformersCallbacks:
    """transformers' ``TrainerCallback`` events, by duck typing; ``StallScope`` inherits it.

    Each event forwards to the ``_TrainRun`` of the ``train()`` in progress and never raises,
    and returns None (the Trainer's ``control`` unchanged)."""

    _train_run: _TrainRun | None = None

    if TYPE_CHECKING:  # provided by StallScope
        _active: bool

        def _fail(self, exc: BaseException) -> None: ...

        def _begin_run(self, session: Session) -> None: ...

    def _hf_event(self, name: str, *args: Any) -> None:
        run = self._train_run
        if run is not None and run.on_training_thread():
            run.guard(getattr(run, name), *args)

    def on_init_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        trial = tune_trial.current()
        if trial is not None:  # a trial of `stallscope tune`: its settings, before train() reads them
            tune_transformers.attach(trial, args)

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        previous = self._train_run
        if previous is not None:  # a train() that never reached its end on this scope
            self._hf_finish(previous)
        self._train_run = None
        try:
            trainer = find_trainer(self)
            if trainer is None:
                raise RuntimeError("the transformers Trainer that called on_train_begin was not found")
            scope = cast("StallScope", self)
            session, buffer = _session_for(scope, args)
            session.note_model(kwargs.get("model"))
            run = _TrainRun(scope, trainer, session, buffer)
            self._begin_run(session)
        except Exception as exc:
            self._fail(exc)
            return
        self._train_run = run
        run.guard(run.train_begin, args, state)

    def on_epoch_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._hf_event("epoch_begin", args, state, kwargs.get("train_dataloader"))

    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        return None

    def on_substep_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        return None

    def on_pre_optimizer_step(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        return None

    def on_optimizer_step(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        return None

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        run = self._train_run
        if run is not None and run._in_compute and self._active and not run.closed:
            try:  # the step's compute ends (inline: every step)
                run._in_compute = False
                run.timeline.leave()
            except Exception as exc:
                self._fail(exc)
        trial = tune_trial.current()
        if trial is not None:  # a trial of `stallscope tune`: stop once its budget is spent
            trial.framework = "transformers"
            if trial.step_end():
                control.should_training_stop = True

    def on_epoch_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._hf_event("epoch_ending")

    def on_evaluate(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        return None

    def on_predict(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        return None

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        return None

    def on_log(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        return None

    def on_prediction_step(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        return None

    def on_push_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        return None

    def on_train_end(self, trainer: Any, pl_module: Any = None, *args: Any, **kwargs: Any) -> None:
        """Lightning's ``on_train_end(trainer, pl_module)`` (its names first: Lightning's
        signature), or transformers' ``on_train_end(args, state, control, **kwargs)``."""
        if not _is_trainer_call((trainer, pl_module, *args), kwargs):
            super_hook = getattr(super(), "on_train_end", None)
            if callable(super_hook):
                super_hook(trainer, pl_module)
            return
        run = self._train_run
        if run is not None:
            self._hf_finish(run)
            self._train_run = None

    def _hf_finish(self, run: _TrainRun) -> None:
        try:
            run.finish()
        except Exception as exc:
            run.closed = True
            try:
                self._fail(exc)
            finally:
                run.detach()
