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
