from __future__ import annotations

import stallscope

#: The public API (SPEC §2, §3, §5). Adding a name here is a promise to users; keep it short.
PUBLIC = {
    "ComparisonError",
    "Finding",
    "PossibleFalsePositiveWarning",
    "Report",
    "ReportError",
    "StallScope",
    "StallScopeError",
    "__version__",
    "load_report",
}


def test_all_is_exactly_the_public_api() -> None:
    assert set(stallscope.__all__) == PUBLIC
    assert len(stallscope.__all__) == len(PUBLIC)  # no duplicates


def test_every_exported_member_is_importable() -> None:
    namespace: dict[str, object] = {}
    exec("from stallscope import *", namespace)
    assert namespace.keys() >= PUBLIC
    for name in PUBLIC:
        assert getattr(stallscope, name) is namespace[name]


def test_exported_members_say_they_are_stallscope_s() -> None:
    for name in PUBLIC - {"__version__"}:
        member = getattr(stallscope, name)
        assert member.__module__.startswith("stallscope."), name


def test_version_is_a_string() -> None:
    assert isinstance(stallscope.__version__, str)
    assert stallscope.__version__.count(".") >= 2


def test_the_exception_tree() -> None:
    assert issubclass(stallscope.StallScopeError, Exception)
    assert issubclass(stallscope.ReportError, stallscope.StallScopeError)
    assert issubclass(stallscope.PossibleFalsePositiveWarning, UserWarning)
    assert not issubclass(stallscope.PossibleFalsePositiveWarning, stallscope.StallScopeError)
