"""The mechanics of ``benchmarks/whatif.py``: suggestions applied whole, phases kept, limits."""

from __future__ import annotations

from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any

import pytest
from conftest import load_script

PATH = Path(__file__).resolve().parents[1] / "benchmarks" / "whatif.py"


@pytest.fixture(scope="module")
def whatif() -> ModuleType:
    return load_script(PATH, "whatif")


def _scenario(**_: Any) -> ModuleType:
    module = ModuleType("fake_scenario")

    def run(*, report_dir: str, console: bool, every_n_steps: int = 5, at_end: bool = False) -> None:
        return None

    module.run = run  # type: ignore[attr-defined]
    return module


def test_a_suggestion_is_applied_whole_or_not_at_all(whatif: ModuleType) -> None:
    scenario = _scenario()
    assert whatif.settings_for(scenario, {"every_n_steps": 100, "at_end": True}) == {
        "every_n_steps": 100,
        "at_end": True,
    }
    # one key the scenario cannot take: nothing is applied, not the rest of it
    assert whatif.settings_for(scenario, {"every_n_steps": 100, "async_save": True}) is None


@pytest.mark.parametrize(
    ("predicted", "realized", "bound", "holds"),
    [
        (1.29, 1.0, "estimate", True),
        (1.31, 1.0, "estimate", False),
        (0.71, 1.0, "estimate", True),
        (0.69, 1.0, "estimate", False),
        (5.0, 9.8, "lower", True),  # a floor may be well under what happened
        (4.8, 9.8, "lower", False),  # ... but not under half of it
        (11.2, 9.8, "lower", True),  # nor much over it
        (11.3, 9.8, "lower", False),
    ],
)
def test_estimates_within_30_percent_floors_between_half_and_115_percent(
    whatif: ModuleType, predicted: float, realized: float, bound: str, holds: bool
) -> None:
    assert whatif.judge(predicted, realized, bound)[0] is holds


def _report(**phase_seconds: float) -> Any:
    return SimpleNamespace(summary=SimpleNamespace(phase_seconds=phase_seconds))


def test_a_phase_that_ran_before_must_still_run_after(whatif: ModuleType) -> None:
    before = _report(validation=2.0, checkpoint=1.0)
    assert whatif.turned_off(before, _report(validation=0.1, checkpoint=0.2)) == []
    assert whatif.turned_off(before, _report(validation=0.0, checkpoint=0.2)) == ["validation"]
    assert whatif.turned_off(_report(validation=0.0), _report()) == []  # nothing to keep


def test_a_suggestion_must_not_log_training_more_often(whatif: ModuleType) -> None:
    module = ModuleType("fake_logging_scenario")

    def run(*, report_dir: str, console: bool, log_every_n_steps: int = 50) -> None:
        return None

    module.run = run  # type: ignore[attr-defined]
    assert whatif.logs_more_often(module, {"log_every_n_steps": 5})
    assert not whatif.logs_more_often(module, {"log_every_n_steps": 100})
    assert not whatif.logs_more_often(module, {"val_check_interval": 1.0})
    module.WHATIF = {"log_every_n_steps": 1}  # type: ignore[attr-defined]
    assert not whatif.logs_more_often(module, {"log_every_n_steps": 5})
    row = {"expected": None, "top": None, "turned_off": [], "logs_more": True, "steps_differ": False}
    assert whatif.problems(row) == ["the suggestion logs training more often than the run did"]
