"""The C hot path (``stallscope/timeline/_native.c``) is built and in use, unless
``STALLSCOPE_NO_NATIVE`` turns it off; ``make unit`` runs the whole suite both ways, and
``make sanitize`` runs the tests of the hot path against a build with AddressSanitizer and
UndefinedBehaviorSanitizer."""

from __future__ import annotations

import copy
import gc
import math
import os
import random
import sys
from array import array
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from stallscope import StallScope
from stallscope.timeline import recorder


def test_the_c_hot_path_is_in_use_unless_turned_off() -> None:
    """An install here always has a C compiler: a build that silently lost the extension would
    pass every other test on the Python twin and be twice as slow."""
    from stallscope.timeline import stats

    if os.environ.get("STALLSCOPE_NO_NATIVE"):
        assert recorder._native is None
        assert stats._order_stats is None
    else:
        assert recorder._native is not None
        assert stats._order_stats is recorder._native.order_stats


def test_a_sanitized_run_imports_the_sanitized_build() -> None:
    """``make sanitize`` names the folder of its build in ``STALLSCOPE_SANITIZED``: the module in
    use must be that file, compiled with AddressSanitizer and UndefinedBehaviorSanitizer (their
    runtime hooks are in it), not the checkout's own build found first on the path."""
    where = os.environ.get("STALLSCOPE_SANITIZED")
    if not where:
        pytest.skip("not a `make sanitize` run")
    assert recorder._native is not None
    built = Path(recorder._native.__file__).resolve()
    assert built.is_relative_to(Path(where).resolve())
    assert Path(recorder.__file__).resolve().is_relative_to(Path(where).resolve())
    code = built.read_bytes()
    assert b"__asan_report_store8" in code
    assert b"__ubsan_handle_" in code


def test_a_scope_uses_the_c_hot_path_when_it_is_built(tmp_path: object) -> None:
    if recorder._native is None:
        pytest.skip("the Python twin is in use")
    with StallScope(str(tmp_path), console=False) as scope:
        items = scope.iter(range(3))
        assert isinstance(scope.phase("compute"), recorder._native.Timer)
        assert list(items) == [0, 1, 2]
        # the items of a pass come from the C stream, not the Python generator
        stream = scope._session.timeline.stream(iter([]), lambda item, wait: None, [])
        assert isinstance(stream, recorder._native.Stream)


def test_the_python_twin_is_what_runs_when_turned_off(tmp_path: object) -> None:
    if recorder._native is not None:
        pytest.skip("the C hot path is in use")
    with StallScope(str(tmp_path), console=False) as scope:
        assert isinstance(scope.phase("compute"), recorder.PhaseTimer)
        assert list(scope.iter(range(3))) == [0, 1, 2]


def test_native_objects_misused_from_python_raise_instead_of_crashing() -> None:
    """Nothing of StallScope's does these, but a C object must not read a missing field."""
    native = recorder._native
    if native is None:
        pytest.skip("the Python twin is in use")
    with pytest.raises(RuntimeError, match="not initialised"), native.Timer.__new__(native.Timer):
        pass
    with pytest.raises(RuntimeError, match="not initialised"):
        next(native.Stream.__new__(native.Stream))
    timer = native.Timer(3, native.EventLog(), native.EventLog(), lambda: 0, object(), 8)
    del timer.target
    with pytest.raises(RuntimeError, match="not initialised"), timer:
        pass
    log = native.EventLog()
    timer = native.Timer(3, log, log, lambda: 7, object(), 8)
    timer.log = 5  # type: ignore[assignment]  # not a log: never measured as one
    with timer:
        pass
    assert log.copy() == [3, 7, -1, 7]
    with pytest.raises(TypeError):
        native.Timer(3, log, [], lambda: 0, object(), 8)  # type: ignore[arg-type]  # a list is no log
    with pytest.raises(TypeError):
        native.Timer("compute", log, log, lambda: 0, object(), 8)  # type: ignore[arg-type]
    with pytest.raises(RuntimeError, match="not initialised"):
        native.StepHook.__new__(native.StepHook)()


def test_a_step_hook_refuses_what_it_cannot_use(tmp_path: Path) -> None:
    native = recorder._native
    if native is None:
        pytest.skip("the Python twin is in use")
    run, _, _ = _fit_run(tmp_path, 0, {"_top": None, "_lazy": None})
    args = (run, run.scope, run.timeline, run.h2d, run.compute, 64, 1000)
    with pytest.raises(ValueError, match="kind in range"):
        native.StepHook(7, print, print, *args)
    with pytest.raises(ValueError, match="two callables"):
        native.StepHook(native.FETCH_BEGIN, None, print, *args)
    with pytest.raises(TypeError, match=r"int\.closed is not a slot"):
        native.StepHook(native.FETCH_BEGIN, print, print, 5, *args[1:])  # the state is in the run's slots
    with pytest.raises(TypeError, match="is not a slot"):
        native.StepHook(native.FETCH_BEGIN, print, print, *args[:2], object(), *args[3:])  # the timeline's too
    hook = native.StepHook(native.FETCH_BEGIN, print, print, *args)
    with pytest.raises(TypeError, match="already initialised"):
        hook.__init__(native.FETCH_BEGIN, print, print, *args)  # type: ignore[misc]


def test_native_objects_keep_what_they_use_while_python_runs() -> None:
    """A clock written in Python may run any code: a member it replaces stays alive until the
    event is logged, and an object is never initialised twice."""
    native = recorder._native
    if native is None:
        pytest.skip("the Python twin is in use")
    log = native.EventLog()

    def clock() -> int:
        timer.target = log  # the log the event was bound for is freed here but for the C reference
        return 9

    timer = native.Timer(3, native.EventLog(), log, clock, object(), 8)
    with timer:
        pass
    assert log.copy() == [-1, 9]  # the enter went to the first log, the exit to ``log``
    with pytest.raises(TypeError, match="already initialised"):
        native.Timer.__init__(timer, 3, log, log, clock, object(), 8)
    stream = native.Stream(
        iter([1]),
        native.EventLog(),
        lambda: 0,
        lambda: 0,
        lambda: 0,
        object(),
        lambda i, w: None,
        [],
        [object()],
        0,
        1,
        8,
    )
    with pytest.raises(TypeError, match="already initialised"):
        native.Stream.__init__(
            stream,
            iter([]),
            native.EventLog(),
            lambda: 0,
            lambda: 0,
            lambda: 0,
            object(),
            print,
            [],
            [object()],
            0,
            1,
            8,
        )


def test_the_c_stream_goes_on_after_the_loaders_error(tmp_path: object) -> None:
    """Unlike a generator, the C stream can be read again after the loader raised (a loop that
    catches the error and calls ``next()`` again gets the rest, recorded)."""
    if recorder._native is None:
        pytest.skip("the Python twin is in use")

    class Flaky:
        def __init__(self) -> None:
            self.i = 0

        def __iter__(self) -> Flaky:
            return self

        def __next__(self) -> int:
            self.i += 1
            if self.i == 3:
                raise OSError("one bad read")
            if self.i > 5:
                raise StopIteration
            return self.i

    seen: list[object] = []
    with StallScope(str(tmp_path), console=False) as scope:
        stream = scope.iter(Flaky())
        while True:
            try:
                seen.append(next(stream))
            except OSError as exc:
                seen.append(str(exc))
            except StopIteration:
                break
    assert seen == [1, 2, "one bad read", 4, 5]
    assert scope.report is not None
    assert scope.report.summary.steps == 4


# -- the fold in C against the fold in Python --------------------------------------------------

_FOLDED = (
    "_totals",
    "_counts",
    "_cur",
    "_stack",
    "_mark",
    "_in_step",
    "_step_start",
    "_step_wait",
    "_data_mark",
    "_ring_step",
    "_ring_wait",
    "_ring_compute",
    "_ring_kinds",
    "_ring_start",
    "_ring_phases",
    "_step_phases0",
    "_step_compute0",
    "_step_kinds",
    "_ring_pos",
    "_steps",
    "_step_total",
    "_windows",
    "_window_steps",
    "_win_steps",
    "_win_start",
    "_win_busy",
)


def _folded_state(tl: recorder.Timeline) -> dict[str, object]:
    state: dict[str, object] = {}
    for name in _FOLDED:
        value = getattr(tl, name)
        state[name] = (type(value).__name__, list(value) if isinstance(value, array) else value)
    return state


def _random_log(rng: random.Random, phases: int, t: int, events: int) -> tuple[list[int], int]:
    """Events of every kind in a random order (more data waits and steps than anything else, so
    steps complete, rings wrap and windows close and merge), at non-decreasing times."""
    codes = [recorder.LEAVE, recorder.STEP, recorder.WAIT, recorder.GOT, recorder.NONE, recorder.END]
    log: list[int] = []
    for _ in range(events):
        roll = rng.random()
        if roll < 0.3:
            code = rng.randrange(phases)
        elif roll < 0.5:
            code = rng.choice((recorder.STEP, recorder.GOT))
        else:
            code = rng.choice(codes)
        t += rng.choice((0, 1, 7, 1000, 123_456_789))
        log += [code, t]
    return log, t


def _twin_timelines(seed: int) -> tuple[recorder.Timeline, recorder.Timeline]:
    pair = []
    for _ in range(2):
        tl = recorder.Timeline(clock=lambda: 0, cpu_clock=lambda: 0, recent_steps=5, window_steps=2, max_windows=4)
        tl.phase_id(f"custom-{seed}")
        tl.start(at=1_000)
        pair.append(tl)
    return pair[0], pair[1]


@pytest.mark.parametrize("seed", range(40))
def test_the_c_fold_leaves_the_same_state_as_the_python_fold(seed: int) -> None:
    """Random logs of every event kind, folded in random slices: after each slice the C fold and
    the Python fold agree on every field of the folded state (types included)."""
    native = recorder._native
    if native is None:
        pytest.skip("the Python twin is in use")
    rng = random.Random(seed)
    in_c, in_python = _twin_timelines(seed)
    phases = len(in_c._totals)
    t = 1_000
    for _ in range(rng.randrange(4, 12)):
        log, t = _random_log(rng, phases, t, rng.randrange(0, 120))
        native.fold(in_c, list(log))
        in_python._fold_events(list(log))
        assert _folded_state(in_c) == _folded_state(in_python)
    # what the logs are meant to reach: steps that wrap the ring, windows merged
    assert in_c._steps > in_c._ring_size
    assert in_c._window_steps > 2


@pytest.mark.parametrize("stop_at", [1, 2, 3])
def test_a_c_fold_stopped_by_a_windows_close_leaves_what_the_python_fold_leaves(
    stop_at: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A window's close that raises (Ctrl-C at that moment) stops both folds at the same event,
    with the same state written back."""
    native = recorder._native
    if native is None:
        pytest.skip("the Python twin is in use")
    real = recorder.Timeline._close_window

    def make_close() -> Callable[[recorder.Timeline, int, int], None]:
        calls = [0]

        def close(self: recorder.Timeline, now: int, busy: int) -> None:
            calls[0] += 1
            if calls[0] == stop_at:
                raise KeyboardInterrupt
            real(self, now, busy)

        return close

    in_c, in_python = _twin_timelines(0)
    log: list[int] = []
    for i in range(12):  # 12 whole steps: 6 windows of 2
        log += [recorder.STEP, 100 * i + 1, recorder.GOT, 100 * i + 20, 2, 100 * i + 30, recorder.LEAVE, 100 * i + 90]
    monkeypatch.setattr(recorder.Timeline, "_close_window", make_close())
    with pytest.raises(KeyboardInterrupt):
        native.fold(in_c, list(log))
    monkeypatch.setattr(recorder.Timeline, "_close_window", make_close())
    with pytest.raises(KeyboardInterrupt):
        in_python._fold_events(list(log))
    assert _folded_state(in_c) == _folded_state(in_python)
    assert in_c._steps == 2 * stop_at  # the step whose window failed to close is counted


def test_the_c_fold_refuses_a_log_it_cannot_read() -> None:
    native = recorder._native
    if native is None:
        pytest.skip("the Python twin is in use")
    tl, _ = _twin_timelines(0)
    before = _folded_state(tl)
    with pytest.raises(IndexError, match="names no phase"):
        native.fold(tl, [len(tl._totals), 5])
    with pytest.raises(ValueError, match="odd length"):
        native.fold(tl, [recorder.STEP])
    with pytest.raises(TypeError):
        native.fold(tl, ["compute", 5])
    with pytest.raises(TypeError):
        native.fold(tl, (recorder.STEP, 5))  # type: ignore[arg-type]
    assert _folded_state(tl) == before
    # from the C log the events are taken out first, whether they fold or not: none is folded twice
    log = native.EventLog([recorder.STEP, 7, len(tl._totals), 9])
    with pytest.raises(IndexError, match="names no phase"):
        native.fold(tl, log)
    assert len(log) == 0
    assert tl._cur == recorder._DATA  # the event before the bad one was applied
    assert tl._mark == 7


def test_the_c_fold_survives_a_callback_that_changes_the_list_it_was_given(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``_native.fold`` reads a snapshot of the events: Python run from a window's close (here,
    one that empties the caller's list) cannot make it read past the end."""
    native = recorder._native
    if native is None:
        pytest.skip("the Python twin is in use")
    real = recorder.Timeline._close_window
    log: list[int] = []

    def clearing(self: recorder.Timeline, now: int, busy: int) -> None:
        log.clear()
        real(self, now, busy)

    monkeypatch.setattr(recorder.Timeline, "_close_window", clearing)
    tl, _ = _twin_timelines(0)
    for i in range(200):
        log += [recorder.STEP, 100 * i + 1, recorder.GOT, 100 * i + 20]
    native.fold(tl, log)
    assert tl._steps == 199  # every event of the snapshot was applied


def test_events_logged_during_a_c_fold_wait_for_the_next_one(monkeypatch: pytest.MonkeyPatch) -> None:
    """The C fold empties the log before it applies anything: events that Python run from a
    window's close logs meanwhile stay in the log, for the next fold, and none is applied twice."""
    native = recorder._native
    if native is None:
        pytest.skip("the Python twin is in use")
    real = recorder.Timeline._close_window
    tl, _ = _twin_timelines(0)

    def logging(self: recorder.Timeline, now: int, busy: int) -> None:
        self._log.extend((recorder.STEP, 10**9 + now))  # later than any event of this fold
        real(self, now, busy)

    monkeypatch.setattr(recorder.Timeline, "_close_window", logging)
    log = tl._log
    for i in range(8):
        log.extend([recorder.STEP, 100 * i + 1, recorder.GOT, 100 * i + 20])
    native.fold(tl, log)
    assert tl._steps == 7
    closes = 7 // 2  # windows of 2 steps
    assert log.copy()[0::2] == [recorder.STEP] * closes
    assert tl._mark == 100 * 7 + 20  # the last event of the fold, not one logged during it


def test_the_c_log_appends_all_or_nothing_and_reads_as_a_list() -> None:
    native = recorder._native
    if native is None:
        pytest.skip("the Python twin is in use")
    log = native.EventLog([recorder.STEP, 5])
    log.extend((2, 6))
    with pytest.raises(TypeError):
        log.extend((recorder.LEAVE, "7"))  # type: ignore[arg-type]
    with pytest.raises(OverflowError):
        log.extend((recorder.LEAVE, 2**64))
    with pytest.raises(TypeError):
        log.extend(5)  # type: ignore[arg-type]
    assert log.copy() == list(log) == [recorder.STEP, 5, 2, 6]  # the failed extends added nothing
    assert (len(log), log[1], log[-1], bool(log)) == (4, 5, 6, True)
    assert repr(log) == "EventLog([-2, 5, 2, 6])"
    with pytest.raises(IndexError):
        log[4]
    big = list(range(-50_000, 50_000))
    log.extend(big)
    assert log.copy()[4:] == big
    log.clear()
    assert (len(log), log.copy(), bool(log)) == (0, [], False)
    log.extend((1, 2))
    assert log.copy() == [1, 2]


# -- Lightning's per-step hooks: ``StepHook`` against the ``_FitRun`` methods it stands in for ----


class _TickingClock:
    """A clock that moves by ``step`` ns at each reading: a hook that read it once more or once
    less than its twin would log other times."""

    def __init__(self, start: int, step: int) -> None:
        self.now = start
        self.step = step

    def __call__(self) -> int:
        self.now += self.step
        return self.now


def _fit_run(tmp_path: Path, seed: int, state: dict[str, object]) -> tuple[Any, list[str], list[object]]:
    """A ``_FitRun`` in ``state`` (its timeline as the state implies), with the calls its scope's
    ``_fail`` receives, and a list for the calls of Lightning's stand-in callable and of the
    listeners of a watched compute phase (``state["watched"]``)."""
    from stallscope.hooks.lightning import _SETUP, _FitRun
    from stallscope.hooks.session import Session

    scope = StallScope(str(tmp_path), console=False)
    session = Session(
        scope._config, clock=_TickingClock(10_000, 7), cpu_clock=_TickingClock(500, 3), switch_clock=_TickingClock(7, 0)
    )
    failures: list[str] = []
    scope._fail = lambda exc: failures.append(repr(exc))  # type: ignore[method-assign]
    run = _FitRun(scope, object(), session, None)
    tl = session.timeline
    tl.start()
    top, lazy = state["_top"], state["_lazy"]
    calls: list[object] = []
    if state.get("watched"):
        tl.watch(run.compute, lambda: calls.append("compute entered"), lambda: calls.append("compute left"))
    if top == _SETUP:
        tl.data_begin(new_step=False)
    elif top is not None:
        tl.enter(top)  # type: ignore[arg-type]
    if lazy is not None:
        tl.enter(lazy)  # type: ignore[arg-type]
    rng = random.Random(seed)
    tl._cpu_due = rng.choice([0, 1 << 62])
    tl._data_cpu_mark = rng.choice([-1, 400])
    tl._data_switch_mark = rng.choice([-1, 7])  # the switch clock reads 7: a wait that did not block
    tl._data_t0 = 9_000
    for name, value in state.items():
        if name == "_active":
            scope._active = value  # type: ignore[assignment]
        elif name != "watched":
            setattr(run, name, value)
    return run, failures, calls


def _observed(run: Any, failures: list[str], inner_calls: list[object], result: object) -> dict[str, object]:
    tl = run.timeline
    keys = ("closed", "_top", "_lazy", "_lazy_depth", "_resume_setup", "_nested_fetch", "_first_wait_ns")
    keys += ("_fetched", "_count_tensors", "_setup_ns")
    timeline = ("_log", "_data_t0", "_data_cpu_mark", "_cpu_due", "_data_cpu_total", "_data_cpu_wall", "_steps")
    timeline += ("_data_switch_mark", "_data_still_total")
    timeline += ("_tracked",)
    return {
        **{key: getattr(run, key) for key in keys},
        **{key: list(getattr(tl, key)) if key == "_log" else copy.copy(getattr(tl, key)) for key in timeline},
        "stack": list(tl._stack),
        "clock readings": (tl._clock.now, tl._cpu_clock.now),
        "active": run.scope._active,
        "failures": failures,
        "inner": inner_calls,
        "result": result,
    }


#: each hook's usual case: the state in which its C hook calls no Python method of the run
_USUAL = {
    "FETCH_BEGIN": {"_top": None},
    "FETCH_END": {"_top": "h2d", "_nested_fetch": False, "_first_wait_ns": 5},
    "COMPUTE_BEGIN": {"_top": "h2d", "_fetched": True, "_count_tensors": False},
    "COMPUTE_END": {"_top": "compute"},
}


def _random_fit_state(rng: random.Random, ids: dict[str, int], kind: str) -> tuple[dict[str, object], bool]:
    """A state for hook ``kind``, and whether it is its usual case: half of them are, the others
    are random, or one field away from it."""
    from stallscope.hooks.lightning import _SETUP

    lazy = None if rng.random() < 0.5 else ids["logging"]
    state: dict[str, object] = {
        "_top": rng.choice([None, ids["h2d"], ids["compute"], ids["validation"], _SETUP]),
        "_lazy": lazy,
        "_lazy_depth": 0 if lazy is None else rng.choice([0, 1, 2]),
        "_resume_setup": False if lazy is None else rng.random() < 0.5,
        "_fetched": rng.random() < 0.7,
        "_count_tensors": rng.random() < 0.2,
        "_nested_fetch": rng.random() < 0.2,
        "_first_wait_ns": None if rng.random() < 0.2 else 5,
        "closed": False,
        "_active": True,
        "watched": rng.random() < 0.3,
    }
    if rng.random() >= 0.5:
        return state, False
    usual = {k: ids.get(v, v) if isinstance(v, str) else v for k, v in _USUAL[kind].items()}
    state.update(usual, _lazy=None, _lazy_depth=0, _resume_setup=False)
    if rng.random() < 0.5:
        return state, True
    field = rng.choice([*usual, "_lazy", "closed", "_active"])
    state[field] = {
        "_top": rng.choice([None, ids["validation"], _SETUP]),
        "_lazy": ids["logging"],
        "closed": True,
        "_active": False,
    }.get(field, not state[field] if isinstance(state[field], bool) else None)
    return state, False


@pytest.mark.parametrize("seed", range(60))
def test_a_step_hook_does_what_the_python_hook_does(tmp_path: Path, seed: int) -> None:
    """Each of Lightning's four per-step touch points, from random fit states (the usual cases
    and their neighbours): the C hook and the Python method (with ``call_after``/``call_before``
    for the compute points) leave the same run, timeline, log and calls, clock readings included."""
    native = recorder._native
    if native is None:
        pytest.skip("the Python twin is in use")
    from stallscope.hooks.lightning import call_after, call_before

    rng = random.Random(seed)
    probe, _, _ = _fit_run(tmp_path / "ids", seed, {"_top": None, "_lazy": None})
    ids = {k: getattr(probe, k) for k in ("h2d", "compute", "validation", "logging")}
    for trial in range(8):
        kind = rng.choice(list(_USUAL))
        state, usual = _random_fit_state(rng, ids, kind)
        batch = [trial]
        slow_calls: list[object] = []
        seen = []
        for side in ("python", "c"):
            run, failures, inner_calls = _fit_run(tmp_path / f"{trial}-{side}", seed, state)

            def inner(*args: object, _calls: list[object] = inner_calls, **kwargs: object) -> object:
                _calls.append((args, kwargs))
                return "lightning's result"

            args: tuple[object, ...] = (batch,) if kind == "COMPUTE_BEGIN" else ()
            kwargs = {"update_plateau_schedulers": False} if kind == "COMPUTE_END" else {}
            if kind == "COMPUTE_END":
                args = ("step",)
            if side == "python":
                hook: Callable[..., object] = {
                    "FETCH_BEGIN": run._on_fetch_begin,
                    "FETCH_END": run._on_fetch_end,
                    "COMPUTE_BEGIN": call_after(run._on_compute_begin)(inner),
                    "COMPUTE_END": call_before(run._on_compute_end)(inner),
                }[kind]
                run._start_profiler = run._stop_profiler = inner
            else:
                method = {
                    "FETCH_BEGIN": run._fetch_began,
                    "FETCH_END": run._fetch_ended,
                    "COMPUTE_BEGIN": run._on_compute_begin,
                    "COMPUTE_END": run._on_compute_end,
                }[kind]

                def slow(
                    *args: object, _method: Callable[..., None] = method, _calls: list[object] = slow_calls
                ) -> None:
                    _calls.append(args)
                    _method(*args)

                hook = run._native_hook(getattr(native, kind), inner, slow)
            logged = len(run.timeline._log)
            result = hook(*args, **kwargs)
            seen.append(_observed(run, failures, inner_calls, result))
        assert seen[0] == seen[1], (kind, state)
        if usual:  # the C hook took it alone, and logged
            assert slow_calls == [], (kind, state)
            assert len(run.timeline._log) > logged, (kind, state)


@pytest.mark.parametrize("twin", ["python", "c"])
def test_a_failed_fetch_end_still_stops_the_profiler_and_chains_what_it_raised(tmp_path: Path, twin: str) -> None:
    """Ctrl-C while the fetch's end is recorded: Lightning's stop-profiler runs all the same (a
    ``finally``), and when it raises too, its error carries the interrupt as ``__context__``."""
    native = recorder._native
    if twin == "c" and native is None:
        pytest.skip("the Python twin is in use")
    state = {"_top": None, "_lazy": None, "_nested_fetch": False, "_first_wait_ns": 5, "_fetched": False}
    run, _, _ = _fit_run(tmp_path, 0, state)
    stops: list[str] = []

    def clock() -> int:
        raise KeyboardInterrupt("clock")

    def stop_profiler() -> None:
        stops.append("stop")
        raise ValueError("the profiler's own error")

    run.timeline._clock = clock
    if twin == "python":
        run._stop_profiler = stop_profiler
        hook: Callable[[], object] = run._on_fetch_end
    else:
        hook = run._native_hook(native.FETCH_END, stop_profiler, run._fetch_ended)
    with pytest.raises(ValueError, match="own error") as raised:
        hook()
    assert stops == ["stop"]
    assert isinstance(raised.value.__context__, KeyboardInterrupt)
    run._stop_profiler = lambda: stops.append("stop")
    hook = (
        run._native_hook(native.FETCH_END, run._stop_profiler, run._fetch_ended) if twin == "c" else run._on_fetch_end
    )
    with pytest.raises(KeyboardInterrupt, match="clock"):  # alone, the interrupt propagates unchanged
        hook()
    assert stops == ["stop", "stop"]


def test_a_copy_of_the_c_log_is_a_snapshot_even_when_making_it_runs_python() -> None:
    """``probe`` copies the log from the sampler thread. Making the list may collect garbage, whose
    finalizer (or another thread let in meanwhile) may fold the log and free a large buffer: the
    copy is of the entries as they were when it began."""
    native = recorder._native
    if native is None:
        pytest.skip("the Python twin is in use")
    log = native.EventLog(range(100_000))  # a buffer that clear() frees

    class ClearsOnCollection:
        def __init__(self) -> None:
            self.cycle = self

        def __del__(self) -> None:
            log.clear()

    threshold = gc.get_threshold()
    enabled = gc.isenabled()
    gc.disable()
    try:
        ClearsOnCollection()
        free_lists_emptied = [[] for _ in range(500)]  # the next list is allocated, and may collect
        gc.set_threshold(1)
        gc.enable()
        copied = log.copy()
    finally:
        gc.set_threshold(*threshold)
        if not enabled:
            gc.disable()
    del free_lists_emptied
    assert copied == list(range(100_000))
    assert len(log) == 0  # the collection ran during the copy


def test_a_c_timer_takes_a_log_or_a_callable_as_its_target() -> None:
    native = recorder._native
    if native is None:
        pytest.skip("the Python twin is in use")
    log = native.EventLog()
    with pytest.raises(TypeError, match="EventLog or a callable"):
        native.Timer(3, [], log, lambda: 0, object(), 8)  # type: ignore[arg-type]
    timer = native.Timer(3, log, log, lambda: 0, object(), 8)
    with pytest.raises(TypeError, match="EventLog or a callable"):
        timer.target = []  # type: ignore[assignment]
    assert timer.target is log
    sent: list[tuple[int, int]] = []
    timer.target = sent.append
    with timer:
        pass
    assert sent == [(3, 0), (recorder.LEAVE, 0)]
    assert len(log) == 0


# -- HookBase: the Lightning callback's attribute reads -------------------------------------------


def _hook_classes() -> list[type[Any]]:
    """The same class on the C base and on ``object`` (what the twin uses)."""
    if recorder._native is None:
        pytest.skip("the C hot path is not built")
    made = []
    for base in (recorder._native.HookBase, object):

        class Hooks(base):  # type: ignore[valid-type,misc]
            on_class_none = None

            def on_method(self) -> str:
                return "method"

            @property
            def on_prop(self) -> Any:
                return ("prop", self.__dict__.get("_prop"))

            @on_prop.setter
            def on_prop(self, value: Any) -> None:
                self.__dict__["_prop"] = value

        made.append(Hooks)
    return made


def _read(obj: object, name: str) -> Any:
    try:
        value = getattr(obj, name)
    except AttributeError as exc:
        return ("AttributeError", str(exc))
    if callable(value):
        return ("callable", value())
    return value


class _Name(str):
    pass


def test_a_hook_base_reads_every_attribute_as_a_plain_class_does() -> None:
    """Set, replace, delete and read ``on_*`` and other attributes in the same random order on
    an instance of each class: every read must give the same answer (or the same error)."""
    names = ["on_a", "on_b", "on_class_none", "on_method", "on_prop", "on_", "on", "other", "on_é", "on_\u4e00"]
    values: list[Any] = [None, None, 0, "", False, 3, lambda: "set"]
    for seed in range(40):
        rng = random.Random(seed)
        objs = [cls() for cls in _hook_classes()]
        for _ in range(60):
            name = rng.choice(names)
            if rng.random() < 0.2:
                name = _Name(name)  # a str subclass takes the generic path
            action = rng.random()
            if action < 0.4:
                value = rng.choice(values)
                for obj in objs:
                    setattr(obj, name, value)
            elif action < 0.5:
                outcomes = []
                for obj in objs:
                    try:
                        delattr(obj, name)
                        outcomes.append(None)
                    except AttributeError as exc:
                        outcomes.append(str(exc))
                assert outcomes[0] == outcomes[1], (seed, name)
            reads = [_read(obj, name) for obj in objs]
            assert reads[0] == reads[1], (seed, name, reads)
        assert vars(objs[0]).keys() == vars(objs[1]).keys()


def test_a_hook_set_to_none_is_read_from_the_instance_alone() -> None:
    """What the C base skips is the type lookup: a None it finds in the instance's dict is the
    answer even where the class later gained a data descriptor of that name (the plain class
    then reads the descriptor). A value set through ``setattr`` is in the dict only when the class
    has no such descriptor, so nothing StallScope sets can tell the difference."""
    fast, plain = (cls() for cls in _hook_classes())
    for obj in (fast, plain):
        obj.on_late = None
        type(obj).on_late = property(lambda self: "descriptor")
    assert fast.on_late is None
    assert plain.on_late == "descriptor"
    assert fast.on_method() == "method"  # not None in the dict: the generic read
    with pytest.raises(AttributeError, match="has no attribute 'on_x'"):  # not the missing __dict__
        _ = recorder._native.HookBase().on_x  # type: ignore[union-attr]
    with pytest.raises(TypeError):
        recorder._native.HookBase(1)  # type: ignore[call-arg,union-attr]
    pytest.importorskip("lightning.pytorch")  # the hooks to set are read from its Callback
    scope = StallScope(None, console=False)
    assert isinstance(scope, recorder._native.HookBase)  # type: ignore[union-attr]
    twin = copy.deepcopy(scope)  # ddp_spawn pickles callbacks: the copy is quiet too
    assert "on_before_backward" in vars(twin)
    assert twin.on_before_backward is None
    # each None handed out is a reference of its own (a missing one would free None on 3.11;
    # from 3.12 None is immortal and its count never moves)
    before = sys.getrefcount(None)
    held = [fast.on_late for _ in range(10_000)]
    if sys.version_info < (3, 12):
        assert sys.getrefcount(None) - before > len(held) // 2  # other code moves it by a few


@pytest.mark.parametrize("custom", [0, 2, 3])
def test_the_folds_agree_on_the_recent_steps_with_any_number_of_custom_phases(custom: int) -> None:
    """No custom phase (its column stays 0), or several sharing the last column: the two folds
    leave the same rings of the recent steps."""
    native = recorder._native
    if native is None:
        pytest.skip("the Python twin is in use")
    rng = random.Random(custom)
    pair = []
    for _ in range(2):
        tl = recorder.Timeline(clock=lambda: 0, cpu_clock=lambda: 0, recent_steps=7, window_steps=2, max_windows=4)
        for k in range(custom):
            tl.phase_id(f"custom-{k}")
        tl.start(at=1_000)
        pair.append(tl)
    in_c, in_python = pair
    t = 1_000
    for _ in range(8):
        log, t = _random_log(rng, len(in_c._totals), t, rng.randrange(0, 150))
        native.fold(in_c, list(log))
        in_python._fold_events(list(log))
        assert _folded_state(in_c) == _folded_state(in_python)
    assert in_c._steps > in_c._ring_size
    assert any(in_c._ring_phases[recorder.RECENT_COLUMNS - 1 :: recorder.RECENT_COLUMNS]) == (custom > 0)


def _order_stats_in_python(values: list[int]) -> tuple[object, ...]:
    """``Distribution.of``'s numbers as its Python code makes them (a list never goes to C)."""
    from stallscope.timeline.stats import Distribution

    d = Distribution.of(values)
    return (d.n, d.mean, d.p10, d.p50, d.p90, d.max)


@pytest.mark.parametrize("seed", range(30))
def test_the_c_order_statistics_are_the_python_ones_to_the_last_bit(seed: int) -> None:
    """An epoch's step times and waits (an ``array('q')``) are summarised in C: every number is
    the same double as the Python code's, for any length, spread and size of value, ties and
    the interpolation between two neighbours included."""
    native = recorder._native
    if native is None:
        pytest.skip("the Python twin is in use")
    rng = random.Random(seed)
    n = rng.choice([1, 2, 3, 10, 30, 31, 100, 2048, rng.randrange(1, 5000)])
    top = rng.choice([10, 1_000, 300_000, 10**9, 2**40, 2**53 // n])
    low = -top if seed % 5 == 0 else -top // 50  # some far below 0: the differences are large
    values = [rng.randrange(low, top) if rng.random() < 0.1 else rng.randrange(0, top) for _ in range(n)]
    if rng.random() < 0.3:  # ties
        values = [v - v % (top // 7 + 1) for v in values]
    got = native.order_stats(array("q", values))
    assert got is not None
    want = _order_stats_in_python(values)
    assert [type(x) for x in got] == [type(x) for x in want]
    assert got == want, (n, top)


def test_c_order_statistics_leave_to_python_what_only_its_exact_division_gets_right() -> None:
    """A sum past 2**53 (Python divides ints exactly, C would round the sum first): C says None
    and ``Distribution.of`` gives Python's numbers; what is not an ``array('q')`` is refused."""
    native = recorder._native
    if native is None:
        pytest.skip("the Python twin is in use")
    from stallscope.timeline.stats import Distribution

    big = [2**52 + 1, 2**52 + 3, 2**52 + 7]
    assert native.order_stats(array("q", big)) is None
    d = Distribution.of(array("q", big))
    assert (d.n, d.mean, d.p10, d.p50, d.p90, d.max) == _order_stats_in_python(big)
    with pytest.raises(OverflowError):
        array("q", [2**63])  # nothing past 64 bits can reach C
    assert native.order_stats(array("q", [2**62, 2**62])) is None  # the sum overflows: Python's
    apart = [-(2**62), 2**62]  # the sum is 0, the difference 2**63: past 64 bits
    assert native.order_stats(array("q", apart)) is None
    d = Distribution.of(array("q", apart))
    assert (d.n, d.mean, d.p10, d.p50, d.p90, d.max) == _order_stats_in_python(apart)
    edge = [2**52, 2**52]  # a sum of exactly 2**53: still C's, and Python's numbers
    assert native.order_stats(array("q", edge)) == _order_stats_in_python(edge)
    for bad in (array("d", [1.0]), array("i", [1]), [1, 2], b"12345678"):
        with pytest.raises(TypeError):
            native.order_stats(bad)
    with pytest.raises(ValueError, match="no values"):
        native.order_stats(array("q"))


def _summaries_both_ways(snapshot: object, monkeypatch: pytest.MonkeyPatch, **device: object) -> tuple[object, object]:
    """``summarize`` of an epoch's snapshot, its numbers made in C, and by the Python code alone."""
    from stallscope.report import build

    calls: list[object] = []
    native = build.native_summary_numbers
    assert native is not None

    def counted(*args: Any) -> Any:
        calls.append(args)
        return native(*args)

    with monkeypatch.context() as patch:
        patch.setattr(build, "native_summary_numbers", counted)
        got = build.summarize(snapshot, **device)  # type: ignore[arg-type]
    assert len(calls) == 1  # made in C (or declined by it)
    with monkeypatch.context() as patch:
        patch.setattr(build, "native_summary_numbers", None)
        want = build.summarize(snapshot, **device)  # type: ignore[arg-type]
    return got, want


@pytest.mark.parametrize("seed", range(60))
def test_the_c_epoch_summary_is_the_python_one_to_the_last_bit(seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """A report of many short epochs summarises each in C (``_native.summary_numbers``): every
    number of its summary is the same double as the Python code's, values on a tie of the
    rounding (half a unit in the 6th decimal, exact in binary) and zero wall time included."""
    native = recorder._native
    if native is None:
        pytest.skip("the Python twin is in use")
    from stallscope.timeline.phases import BUILTIN_PHASES
    from stallscope.timeline.stats import SpanSnapshot

    rng = random.Random(seed)
    steps = rng.choice([0, 1, 2, 30, rng.randrange(0, 500)])
    scale = rng.choice([1_000, 300_000, 10**9, 10**12])
    step = array("q", (rng.randrange(0, scale) for _ in range(steps)))
    wait = array("q", (rng.choice([0, rng.randrange(0, scale)]) for _ in range(steps)))
    names = (*BUILTIN_PHASES, *(["custom", "ünïcode"] if seed % 2 else []))
    if seed % 3 == 0:  # ties: ns / wall = k / 128, and ns / 1e9 = an odd multiple of 0.5e-6
        wall = 128 * rng.choice([1, 1_000, 1_000_000])
        phases = {name: rng.choice([0, 1, 3, 5, 77]) * wall // 128 for name in names}
        phases[rng.choice(names)] = rng.choice([500, 1_500, 7_812_500, 2_500])
    else:
        phases = {name: rng.choice([0, rng.randrange(0, scale)]) for name in names}
        wall = sum(phases.values()) if rng.random() < 0.9 else rng.choice([0, -5])
    snapshot = SpanSnapshot(lambda: None, step, wait, steps=steps, wall_ns=wall, phase_ns=phases)  # type: ignore[arg-type, return-value]
    device = {} if seed % 4 else {"idle_fraction": rng.random(), "idle_source": "nvml", "nvml": {"util_mean": 0.5}}
    numbers = native.summary_numbers(step, wait, phases, wall, steps, "compute")
    assert numbers is not None  # these all go to C
    got, want = _summaries_both_ways(snapshot, monkeypatch, **device)
    assert got == want
    for scalar in ("wall_s", "steps_per_s", "gpu_idle_fraction"):
        assert math.copysign(1, getattr(got, scalar)) == math.copysign(1, getattr(want, scalar))
    for field in ("phase_fractions", "phase_seconds", "step_time_s", "data_wait_s"):
        a, b = getattr(got, field), getattr(want, field)
        assert list(a) == list(b)  # the same order
        assert [math.copysign(1, v) for v in a.values()] == [math.copysign(1, v) for v in b.values()]


def test_the_c_epoch_summary_leaves_to_python_what_it_cannot_make_the_same(monkeypatch: pytest.MonkeyPatch) -> None:
    """Numbers past 2**53 (Python's int arithmetic is exact there), a phase time that is not an
    int, a name that is not a str: C says None, and the summary is Python's."""
    native = recorder._native
    if native is None:
        pytest.skip("the Python twin is in use")
    from stallscope.timeline.stats import SpanSnapshot

    step, wait = array("q", [5, 7]), array("q", [0, 0])
    fine = {"data": 3, "compute": 9}
    assert native.summary_numbers(step, wait, fine, 12, 2, "compute") is not None
    for phases, wall, steps in (
        ({"data": 2**53 + 1, "compute": 9}, 2**54, 2),
        (fine, 2**53 + 2, 2),
        (fine, 12, 2**60),
        ({"data": 3.0, "compute": 9}, 12, 2),
        ({"data": True, "compute": 9}, 12, 2),
        ({1: 3, "compute": 9}, 12, 2),
    ):
        assert native.summary_numbers(step, wait, phases, wall, steps, "compute") is None
    assert native.summary_numbers(array("q", [2**62, 2**62]), wait, fine, 12, 2, "compute") is None
    big = {"data": 2**53 + 1, "compute": 2**53 + 3}
    snapshot = SpanSnapshot(lambda: None, step, wait, steps=2, wall_ns=2**54 + 4, phase_ns=big)  # type: ignore[arg-type, return-value]
    got, want = _summaries_both_ways(snapshot, monkeypatch)
    assert got == want
    with pytest.raises(TypeError):
        native.summary_numbers([5, 7], wait, fine, 12, 2, "compute")
    with pytest.raises(TypeError):
        native.summary_numbers(step, wait, list(fine.items()), 12, 2, "compute")
