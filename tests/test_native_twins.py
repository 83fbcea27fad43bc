"""The C hot path and its Python twin, driven side by side with arbitrary sequences of operations.

Hypothesis draws a sequence of what a training loop and its loader can do to a ``Timeline``:
enter and exit phases (through the reusable timers and the methods Lightning drives), ``next()``
on a stream whose loader returns an item, ends the pass, raises or times a phase of its own,
raise inside a timed phase, fold the log, close a stream or the epoch, stop, watch a phase, and
break the clock (StallScope's own failure). One timeline runs each operation on the C objects
(``_native``), its twin on the Python ones, each with its own fake clock fed the same readings.
After every operation the two must agree on what the operation returned or raised, on the event
log, on every field of the folded state and on what the listeners and ``on_error`` were given;
a clock read once more or once less on one side would show as a different timestamp.

``make sanitize`` runs this file against the C module built with AddressSanitizer and
UndefinedBehaviorSanitizer, so the sequences are also a fuzzer for memory errors.
"""

from __future__ import annotations

import contextlib
from array import array
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_native import _FOLDED

from stallscope.timeline import recorder
from stallscope.timeline.phases import BUILTIN_PHASES

#: the timeline's phases: the built-in ones and one custom
_PHASES = len(BUILTIN_PHASES) + 1
#: small, so a short sequence folds on its own, wraps the ring and merges windows
_FOLD_AT = 6

#: fields the two timelines must agree on after every operation (the folded state and the rest)
_FIELDS = (
    *_FOLDED,
    "_start_ns",
    "_started",
    "_live",
    "_epochs",
    "_data_cpu_total",
    "_data_cpu_wall",
    "_data_switch_mark",
    "_data_still_total",
    "_cpu_due",
    "_data_t0",
    "_tracked",
    "_watch",
)


class _Clock:
    """Moves by ``tick`` ns at each reading; the driver moves it on between operations and can
    break it: the next reading raises (StallScope's own failure on the hot path)."""

    def __init__(self, start: int, tick: int) -> None:
        self.now = start
        self.tick = tick
        self.broken = False

    def __call__(self) -> int:
        if self.broken:
            self.broken = False
            raise RuntimeError("the clock broke")
        self.now += self.tick
        return self.now


class _Switches:
    """A voluntary-switch count that moves at every second reading: some sampled waits blocked,
    others did not (their time off the CPU is still), and a reading more or less on one side
    shows in the still time."""

    def __init__(self) -> None:
        self.readings = 0
        self.broken = False

    def __call__(self) -> int:
        if self.broken:  # as the clock breaks: the next reading raises
            self.broken = False
            raise RuntimeError("the switch count broke")
        self.readings += 1
        return self.readings // 2


class _Loader:
    """An iterator whose next ``__next__`` does what the driver set in ``plan``."""

    def __init__(self, twin: _Twin) -> None:
        self.twin = twin
        self.plan: tuple[str, int] = ("item", 0)

    def __iter__(self) -> Iterator[int]:
        return self

    def __next__(self) -> int:
        kind, arg = self.plan
        if kind == "stop":
            raise StopIteration
        if kind == "raise":
            raise OSError(f"bad read {arg}")
        if kind == "nested":  # the loader times a phase of its own, inside the wait
            with self.twin.timeline.timer(arg):
                self.twin.clock.now += 10
        return arg


class _Twin:
    """One timeline, on the C objects or on the Python ones, and what it was seen to do."""

    def __init__(self, native: bool) -> None:
        self.native = native
        self.clock = _Clock(1_000, 3)
        self.cpu_clock = _Clock(50, 2)
        self.switches = _Switches()
        with self.path():
            self.timeline = recorder.Timeline(
                clock=self.clock,
                cpu_clock=self.cpu_clock,
                switch_clock=self.switches,
                recent_steps=3,
                window_steps=2,
                max_windows=4,
            )
        self.timeline.phase_id("custom")
        self.errors: list[str] = []
        self.timeline.on_error = lambda exc: self.errors.append(repr(exc))
        self.calls: list[str] = []
        self.loader = _Loader(self)
        self.stream: Iterator[int] | None = None
        self.result: list[int] = []
        self.first: list[tuple[int, int]] = []

    def state(self) -> dict[str, Any]:
        tl = self.timeline
        state = {name: _plain(getattr(tl, name)) for name in _FIELDS}
        state["log"] = list(tl._log)
        state["errors"] = list(self.errors)
        state["calls"] = list(self.calls)
        state["result"] = list(self.result)
        state["first"] = list(self.first)
        state["switch readings"] = self.switches.readings
        return state

    @contextlib.contextmanager
    def path(self) -> Iterator[None]:
        """The Python twin runs with ``recorder._native`` set to None, as an install without the C
        module does: the timeline then makes a list for its log, Python timers and generators."""
        saved = recorder._native
        if not self.native:
            recorder._native = None  # type: ignore[assignment]
        try:
            yield
        finally:
            recorder._native = saved

    def apply(self, op: tuple[Any, ...]) -> object:
        """Run one operation; what it returned, or the exception it let out, by type and text."""
        with self.path():
            try:
                return ("returned", self._apply(op))
            except Exception as exc:
                return ("raised", repr(exc))

    def _apply(self, op: tuple[Any, ...]) -> object:
        kind, arg, dt = op
        tl = self.timeline
        self.clock.now += dt
        if kind == "enter":  # ``with scope.phase(...)``, entered
            return tl.timer(arg).__enter__()
        if kind == "exit":  # ... and left (the phase on top or not: the log says only "leave")
            return tl.timer(arg).__exit__(None, None, None)
        if kind == "raise_in":  # the user's error inside a timed phase propagates unchanged
            with tl.timer(arg):
                raise ValueError(f"user error {arg}")
        if kind == "enter_method":
            return tl.enter(arg)
        if kind == "leave_method":
            return tl.leave()
        if kind == "switch":
            return tl.switch(arg)
        if kind == "data_begin":
            return tl.data_begin(new_step=bool(arg % 2))
        if kind == "data_end":
            return tl.data_end(got_item=bool(arg % 2), then=None if arg < 2 else arg % _PHASES)
        if kind == "stream":  # a new pass over the loader
            self.stream = tl.stream(self.loader, lambda item, wait: self.first.append((item, wait)), self.result)
            return None
        if kind == "steps":  # 1 to 8 whole steps of a plain loop: the next batch, then compute
            return [(self._apply(("next_item", i, 0)), self._apply(("compute", 2, 5 + i))) for i in range(arg + 1)]
        if kind == "compute":
            with tl.timer(arg):
                self.clock.now += dt
            return None
        if kind.startswith("next_"):
            if self.stream is None:  # the loop's ``for``: a pass begins
                self._apply(("stream", 0, 0))
            self.loader.plan = (kind[len("next_") :], arg)
            try:
                return next(self.stream)
            except BaseException:
                self.stream = None  # a generator cannot be read again after an error or the end
                raise
        if kind == "close":  # the loop breaks out of the pass: the stream is dropped
            self.stream = None
            return None
        if kind == "fold":
            return tl._fold()
        if kind == "begin_epoch":
            return tl.begin_epoch(in_process_data=bool(arg % 2))
        if kind == "end_epoch":  # the session starts the timeline before any epoch can end
            return tl.end_epoch() if tl.started else None
        if kind == "end_streams":
            return tl.end_streams()
        if kind == "stop":
            return tl.stop()
        if kind == "watch":
            return tl.watch(arg, lambda: self.calls.append("enter"), lambda: self.calls.append("leave"))
        if kind == "unwatch":
            return tl.unwatch()
        if kind == "break_clock":
            self.clock.broken = True
            return None
        if kind == "break_switches":
            self.switches.broken = True
            return None
        if kind == "run_stats":
            return tl.run_stats()
        raise AssertionError(f"unknown operation {kind}")


def _plain(value: object) -> object:
    """A field as comparable data: its type named (a C fold that wrote a float would show)."""
    return (type(value).__name__, list(value) if isinstance(value, array) else value)


#: each kind as often as it is listed: mostly steps, so that rings wrap and windows merge
_KINDS = (
    *["steps"] * 6,
    *["next_item"] * 4,
    *["enter", "exit"] * 3,
    *["next_nested", "next_stop", "data_begin", "data_end", "fold"] * 2,
    "next_raise",
    "raise_in",
    "enter_method",
    "leave_method",
    "switch",
    "stream",
    "close",
    "begin_epoch",
    "end_epoch",
    "end_streams",
    "stop",
    "watch",
    "unwatch",
    "break_clock",
    "break_switches",
    "run_stats",
)
_OPS = st.lists(
    st.tuples(
        st.sampled_from(_KINDS),
        st.integers(0, _PHASES - 1),
        st.sampled_from((0, 1, 7, 1000, 123_456)),
    ),
    max_size=80,
)


@pytest.fixture(autouse=True)
def _small_fold_at() -> Iterator[None]:
    """Both paths read ``FOLD_AT`` when their objects are made or an event is logged."""
    saved = recorder.FOLD_AT
    recorder.FOLD_AT = _FOLD_AT
    try:
        yield
    finally:
        recorder.FOLD_AT = saved


@settings(max_examples=150, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=_OPS)
def test_the_c_path_and_the_python_twin_agree_on_any_sequence(ops: list[tuple[Any, ...]]) -> None:
    if recorder._native is None:
        pytest.skip("the C hot path is not built or turned off")
    in_c, in_python = _Twin(native=True), _Twin(native=False)
    assert isinstance(in_c.timeline._log, recorder._native.EventLog)
    assert isinstance(in_python.timeline._log, list)
    for i, op in enumerate(ops):
        outcome_c = in_c.apply(op)
        outcome_python = in_python.apply(op)
        assert outcome_c == outcome_python, f"operation {i}: {op}"
        assert in_c.state() == in_python.state(), f"after operation {i}: {op}"
    final = in_c.apply(("run_stats", 0, 5)), in_python.apply(("run_stats", 0, 5))
    assert final[0] == final[1]


def test_the_driver_reaches_both_kinds_of_object() -> None:
    """The twins are what they claim: C timers and a C stream on one side, Python on the other
    (a driver that built Python objects on both sides would compare a path with itself)."""
    if recorder._native is None:
        pytest.skip("the C hot path is not built or turned off")
    in_c, in_python = _Twin(native=True), _Twin(native=False)
    for twin in (in_c, in_python):
        outcomes = [twin.apply(op) for op in (("enter", 2, 1), ("exit", 2, 1), ("stream", 0, 1), ("next_item", 4, 1))]
        assert outcomes[-1] == ("returned", 4)
    assert isinstance(in_c.timeline._timers[2], recorder._native.Timer)
    assert isinstance(in_c.stream, recorder._native.Stream)
    assert isinstance(in_python.timeline._timers[2], recorder.PhaseTimer)
    assert type(in_python.stream).__name__ == "generator"
    assert in_c.state() == in_python.state()
    assert in_c.timeline._counts[2] == in_c.timeline._counts[recorder._DATA] == 1  # logged, then folded
