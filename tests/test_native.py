"""The C hot path (``stallscope/timeline/_native.c``) is built and in use, unless
``STALLSCOPE_NO_NATIVE`` turns it off; ``make unit`` runs the timeline and scope tests both ways."""

from __future__ import annotations

import os

import pytest

from stallscope import StallScope
from stallscope.timeline import recorder


def test_the_c_hot_path_is_in_use_unless_turned_off() -> None:
    """An install here always has a C compiler: a build that silently lost the extension would
    pass every other test on the Python twin and be twice as slow."""
    if os.environ.get("STALLSCOPE_NO_NATIVE"):
        assert recorder._native is None
    else:
        assert recorder._native is not None


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
    timer = native.Timer(3, [], [], lambda: 0, object(), 8)
    del timer.target
    with pytest.raises(RuntimeError, match="not initialised"), timer:
        pass
    log: list[int] = []
    timer = native.Timer(3, log, log, lambda: 7, object(), 8)
    timer.log = 5  # type: ignore[assignment]  # not a list: never measured as one
    with timer:
        pass
    assert log == [3, 7, -1, 7]


def test_native_objects_keep_what_they_use_while_python_runs() -> None:
    """A clock written in Python may run any code: a member it replaces stays alive until the
    event is logged, and an object is never initialised twice."""
    native = recorder._native
    if native is None:
        pytest.skip("the Python twin is in use")
    log: list[int] = []

    def clock() -> int:
        timer.target = log  # the list the event was bound for is freed here but for the C reference
        return 9

    timer = native.Timer(3, [], log, clock, object(), 8)
    with timer:
        pass
    assert log == [-1, 9]  # the enter went to the first list, the exit to ``log``
    with pytest.raises(TypeError, match="already initialised"):
        native.Timer.__init__(timer, 3, log, log, clock, object(), 8)
    stream = native.Stream(iter([1]), [], lambda: 0, lambda: 0, object(), lambda i, w: None, [], [object()], 0, 1, 8)
    with pytest.raises(TypeError, match="already initialised"):
        native.Stream.__init__(stream, iter([]), [], lambda: 0, lambda: 0, object(), print, [], [object()], 0, 1, 8)


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
