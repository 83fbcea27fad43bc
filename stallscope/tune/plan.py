"""A trial's plan: what the driver tells the child, through its environment.

``STALLSCOPE_TRIAL`` (the trial's number) says that the process is a trial of ``stallscope tune``:
a script may read it to point its own outputs elsewhere. ``STALLSCOPE_TRIAL_DIR`` is the trial's
scratch folder (its report, its measurement, Lightning's root folder), and
``STALLSCOPE_TRIAL_PLAN`` holds the rest as JSON: the settings to apply and the budget.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

TRIAL_VAR = "STALLSCOPE_TRIAL"
DIR_VAR = "STALLSCOPE_TRIAL_DIR"
PLAN_VAR = "STALLSCOPE_TRIAL_PLAN"

#: the file a trial writes its measurement to, in its folder
RESULT_FILE = "trial.json"
#: the trial's report folder, in its folder
REPORT_FOLDER = "report"
#: Lightning's ``default_root_dir`` and checkpoint folder for the trial, in its folder
ROOT_FOLDER = "root"


@dataclass(frozen=True)
class TrialPlan:
    """One trial, as the driver plans it and the child reads it."""

    #: the trial's number (0: the command as configured)
    number: int
    #: the trial's scratch folder
    folder: Path
    #: the settings to apply (suggestion keys: ``{"num_workers": 2}``); empty for the command as is
    settings: Mapping[str, Any] = field(default_factory=dict)
    #: steps run before the measured window opens (worker start-up, first-step costs)
    warmup_steps: int = 5
    #: steps in the measured window; None: no limit in steps
    steps: int | None = 300
    #: the measured window's longest duration in seconds; None: no limit in time
    seconds: float | None = 30.0

    def __post_init__(self) -> None:
        if self.warmup_steps < 0:
            raise ValueError(f"warmup_steps must be >= 0, got {self.warmup_steps!r}")
        if self.steps is not None and self.steps < 1:
            raise ValueError(f"steps must be >= 1, got {self.steps!r}")
        if self.seconds is not None and not self.seconds > 0:
            raise ValueError(f"seconds must be > 0, got {self.seconds!r}")
        if self.steps is None and self.seconds is None:
            raise ValueError("a trial needs a budget: steps, seconds or both")

    @property
    def result_path(self) -> Path:
        return self.folder / RESULT_FILE

    @property
    def report_dir(self) -> Path:
        return self.folder / REPORT_FOLDER

    @property
    def root_dir(self) -> Path:
        return self.folder / ROOT_FOLDER

    def environ(self) -> dict[str, str]:
        """The variables that make a child process this trial."""
        plan = {
            "settings": dict(self.settings),
            "warmup_steps": self.warmup_steps,
            "steps": self.steps,
            "seconds": self.seconds,
        }
        return {TRIAL_VAR: str(self.number), DIR_VAR: str(self.folder), PLAN_VAR: json.dumps(plan)}

    @classmethod
    def from_environ(cls, environ: Mapping[str, str] | None = None) -> TrialPlan | None:
        """The plan this process runs under, or None when it is no trial. Raises ``ValueError``
        for variables that do not make a plan."""
        env = os.environ if environ is None else environ
        if TRIAL_VAR not in env:
            return None
        try:
            number = int(env[TRIAL_VAR])
            folder = Path(env[DIR_VAR])
            plan = json.loads(env.get(PLAN_VAR, "{}"))
        except (KeyError, ValueError) as exc:
            raise ValueError(f"{TRIAL_VAR} is set but the trial's plan is not readable: {exc}") from exc
        if not isinstance(plan, dict) or not isinstance(plan.get("settings", {}), dict):
            raise ValueError(f"{PLAN_VAR} must be a JSON object with a 'settings' object")
        return cls(
            number=number,
            folder=folder,
            settings=plan.get("settings", {}),
            warmup_steps=int(plan.get("warmup_steps", 5)),
            steps=None if plan.get("steps") is None else int(plan["steps"]),
            seconds=None if plan.get("seconds") is None else float(plan["seconds"]),
        )
