from __future__ import annotations

import io
import math
import re
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from stallscope.config import ScopeConfig, check_nvml_device


def test_defaults() -> None:
    config = ScopeConfig.create()
    assert config == ScopeConfig(
        report_dir=Path("stallscope").resolve(),
        console=True,
        nvml_device=None,
        min_saving=0.02,
        sample_interval_s=0.2,
        recent_steps=4096,
    )


def test_report_dir_may_be_positional_the_rest_keyword_only() -> None:
    assert ScopeConfig.create("runs/a").report_dir == Path("runs/a").resolve()
    with pytest.raises(TypeError):
        ScopeConfig.create("runs/a", False)  # type: ignore[misc]


@pytest.mark.parametrize(
    ("value", "expected"),
    [("runs/scope", Path.cwd() / "runs/scope"), (Path("/tmp/x"), Path("/tmp/x")), (None, None)],
)
def test_report_dir_accepts_paths_and_none(value: Any, expected: Path | None) -> None:
    assert ScopeConfig.create(value).report_dir == expected


def _raises_naming(value: Any, **kwargs: Any) -> None:
    with pytest.raises(ValueError, match=re.escape(repr(value))):
        ScopeConfig.create(**kwargs)


@pytest.mark.parametrize("value", [3, b"runs", "", "   ", ["runs"]])
def test_bad_report_dir(value: Any) -> None:
    _raises_naming(value, report_dir=value)


def test_console_accepts_bools_and_a_console() -> None:
    rich_console = Console(file=io.StringIO(), width=100)
    assert ScopeConfig.create(console=False).console is False
    assert ScopeConfig.create(console=rich_console).console is rich_console


@pytest.mark.parametrize("value", ["yes", 1, None, io.StringIO])
def test_bad_console(value: Any) -> None:
    _raises_naming(value, console=value)


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (None, None),
        (0, 0),
        (3, 3),
        ("1", 1),
        (" 2 ", 2),
        ("GPU-5c1a2b3c-1d2e-3f40-5a6b-7c8d9e0f1a2b", "GPU-5c1a2b3c-1d2e-3f40-5a6b-7c8d9e0f1a2b"),
        ("MIG-4b1b8d5c-9f3e-5a6b-8c7d-0e1f2a3b4c5d", "MIG-4b1b8d5c-9f3e-5a6b-8c7d-0e1f2a3b4c5d"),
    ],
)
def test_valid_nvml_devices(value: Any, expected: int | str | None) -> None:
    assert check_nvml_device(value) == expected
    assert ScopeConfig.create(nvml_device=value).nvml_device == expected


@pytest.mark.parametrize("value", [-1, True, False, "garbage", "-1", "", "1.5", 1.5, "GPU-", "gpu-5c1a", "²", [0]])
def test_bad_nvml_device(value: Any) -> None:
    _raises_naming(value, nvml_device=value)
    with pytest.raises(ValueError, match="nvml_device"):
        check_nvml_device(value)


@pytest.mark.parametrize("value", [0, 0.0, 0.5, 0.999])
def test_valid_min_saving(value: float) -> None:
    assert ScopeConfig.create(min_saving=value).min_saving == value


@pytest.mark.parametrize("value", [1, 1.0, -0.01, math.nan, True, "0.1", None])
def test_bad_min_saving(value: Any) -> None:
    _raises_naming(value, min_saving=value)


def test_valid_sample_interval() -> None:
    assert ScopeConfig.create(sample_interval_s=0.05).sample_interval_s == 0.05
    interval = ScopeConfig.create(sample_interval_s=2).sample_interval_s
    assert interval == 2.0
    assert isinstance(interval, float)


@pytest.mark.parametrize("value", [0, -1, math.nan, math.inf, 1e300, True, "1", None])
def test_bad_sample_interval(value: Any) -> None:
    """inf and 1e300 would crash the sampler thread: ``Event.wait`` overflows on them."""
    _raises_naming(value, sample_interval_s=value)


def test_valid_recent_steps() -> None:
    assert ScopeConfig.create(recent_steps=16).recent_steps == 16


@pytest.mark.parametrize("value", [15, 0, -5, True, 16.0, "100", None])
def test_bad_recent_steps(value: Any) -> None:
    _raises_naming(value, recent_steps=value)


@pytest.mark.parametrize("value", [0, 0.5, 10, 3600.0])
def test_valid_print_interval(value: float) -> None:
    interval = ScopeConfig.create(print_interval_s=value).print_interval_s
    assert interval == value
    assert isinstance(interval, float)


def test_print_interval_defaults_to_the_time_budget() -> None:
    assert ScopeConfig.create().print_interval_s is None
    assert ScopeConfig.create(print_interval_s=None).print_interval_s is None


@pytest.mark.parametrize("value", [-1, -0.001, math.nan, math.inf, True, "10", [1]])
def test_bad_print_interval(value: Any) -> None:
    _raises_naming(value, print_interval_s=value)


def test_relative_report_dir_is_fixed_at_construction(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A chdir during training must not move where the report goes."""
    monkeypatch.chdir(tmp_path)
    config = ScopeConfig.create("runs/scope")
    monkeypatch.chdir("/")
    assert config.report_dir == tmp_path / "runs" / "scope"


@pytest.mark.parametrize("value", ["MIG-GPU-5c1a2b3c-0000-1111-2222-333344445555/1/0", "MIG-5c1a2b3c-0000-1111"])
def test_mig_uuids_are_accepted(value: str) -> None:
    assert ScopeConfig.create(nvml_device=value).nvml_device == value


def test_recent_steps_has_an_upper_bound() -> None:
    with pytest.raises(ValueError, match="recent_steps"):
        ScopeConfig.create(recent_steps=10**9)


def test_report_dir_that_is_a_file_is_refused_up_front(tmp_path: Path) -> None:
    target = tmp_path / "report.json"
    target.write_text("{}")
    with pytest.raises(ValueError, match="report.json"):
        ScopeConfig.create(target)
