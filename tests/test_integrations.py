"""integrations/: the gate script, run locally the way the GitHub action and the GitLab job run it."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from gate_reports import make_report, windows, write

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "integrations" / "stallscope-gate.sh"
ACTION = ROOT / "integrations" / "github" / "action.yml"
GITLAB = ROOT / "integrations" / "gitlab" / "stallscope.gitlab-ci.yml"

pytestmark = pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")

#: the reference "training": writes a report whose idle fraction is its first argument
REFERENCE = """\
import sys
sys.path.insert(0, {tests!r})
from gate_reports import data_workers, make_report, windows
from stallscope.report.io import write_report

idle = float(sys.argv[1])
findings = [data_workers(0.3)] if idle > 0.3 else []
write_report(make_report(idle, window_idle=windows(idle, 10, seed=5), findings=findings), sys.argv[2])
"""


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    (tmp_path / "train.py").write_text(REFERENCE.format(tests=str(ROOT / "tests")), encoding="utf-8")
    base = make_report(0.20, window_idle=windows(0.20, 10, seed=1))
    write(tmp_path, "ci", base)
    (tmp_path / "ci" / "report.json").rename(tmp_path / "baseline.json")
    return tmp_path


def _gate(workdir: Path, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    full = {
        "PATH": os.environ.get("PATH", ""),
        "HOME": os.environ.get("HOME", str(workdir)),
        "STALLSCOPE_PYTHON": sys.executable,
        **env,
    }
    return subprocess.run(
        ["bash", str(SCRIPT), *args], cwd=workdir, env=full, capture_output=True, text=True, timeout=120
    )


def _settings(idle: float, workdir: Path, **more: str) -> dict[str, str]:
    return {
        "STALLSCOPE_COMMAND": f"{sys.executable} train.py {idle} runs/ci/report.json",
        "STALLSCOPE_REPORT": "runs/ci/report.json",
        "STALLSCOPE_BASELINE": "baseline.json",
        "STALLSCOPE_GITHUB": "1",
        "GITHUB_STEP_SUMMARY": str(workdir / "summary.md"),
        **more,
    }


def test_gate_passes(workdir: Path) -> None:
    result = _gate(workdir, _settings(0.205, workdir))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "OK: accelerator idle 20.5% vs baseline 20.0%" in result.stdout
    assert "::group::StallScope reference run" in result.stdout
    assert "::error" not in result.stdout
    assert (workdir / "summary.md").read_text(encoding="utf-8").startswith("### StallScope check: ✅ passed")


def test_gate_fails_on_regression(workdir: Path) -> None:
    result = _gate(workdir, _settings(0.55, workdir))
    assert result.returncode == 1, result.stdout + result.stderr
    assert "REGRESSION: accelerator idle 55.0% vs baseline 20.0% (+35.0 pp, allowed +2.0 pp)" in result.stdout
    assert "data.workers" in result.stdout
    annotations = [line for line in result.stdout.splitlines() if line.startswith("::error title=")]
    assert len(annotations) == 1
    assert "Top fix: data.workers" in annotations[0]
    summary = (workdir / "summary.md").read_text(encoding="utf-8")
    assert summary.startswith("### StallScope check: ❌ regression")
    assert "| **accelerator idle** | 20.0% | 55.0% | +35.0 pp |" in summary


def test_gate_settings_reach_check(workdir: Path) -> None:
    """max-increase, max-idle and extra check arguments are passed through."""
    assert _gate(workdir, _settings(0.55, workdir, STALLSCOPE_MAX_INCREASE="0.5")).returncode == 0
    ceiling = _gate(workdir, _settings(0.205, workdir, STALLSCOPE_MAX_IDLE="0.1"))
    assert ceiling.returncode == 1
    assert "above the 10.0% maximum" in ceiling.stdout
    few = _gate(workdir, _settings(0.205, workdir, STALLSCOPE_CHECK_ARGS="--min-windows 20"))
    assert few.returncode == 0
    assert "too few idle windows" in few.stdout


def test_gate_without_github_and_with_the_command_as_arguments(workdir: Path) -> None:
    env = _settings(0.55, workdir)
    del env["STALLSCOPE_COMMAND"], env["STALLSCOPE_GITHUB"]
    result = _gate(workdir, env, sys.executable, "train.py", "0.55", "runs/ci/report.json")
    assert result.returncode == 1
    assert "::" not in result.stdout
    assert not (workdir / "summary.md").exists()


@pytest.mark.parametrize(
    ("change", "words"),
    [
        ({"STALLSCOPE_COMMAND": "exit 3"}, "the reference command failed (exit 3)"),
        ({"STALLSCOPE_COMMAND": "true"}, "wrote no report at runs/ci/report.json"),
        ({"STALLSCOPE_BASELINE": "nope.json"}, "cp runs/ci/report.json nope.json"),
        ({"STALLSCOPE_BASELINE": ""}, "set STALLSCOPE_BASELINE"),
        ({"STALLSCOPE_COMMAND": ""}, "set STALLSCOPE_COMMAND"),
        ({"STALLSCOPE_PYTHON": "/bin/false"}, "cannot import stallscope with /bin/false"),
        ({"STALLSCOPE_MAX_INCREASE": "2"}, "must be a fraction"),
    ],
)
def test_gate_errors_exit_2(workdir: Path, change: dict[str, str], words: str) -> None:
    result = _gate(workdir, _settings(0.55, workdir, **change))
    assert result.returncode == 2, result.stdout + result.stderr
    assert words in result.stderr
    assert "Traceback" not in result.stderr


def test_gate_refuses_a_stale_report(workdir: Path) -> None:
    assert _gate(workdir, _settings(0.205, workdir)).returncode == 0
    result = _gate(workdir, _settings(0.205, workdir, STALLSCOPE_COMMAND="true"))
    assert result.returncode == 2
    assert "was not rewritten by the reference command" in result.stderr


# -- the GitHub action and the GitLab template call the script as tested above ---------------


def _action() -> dict[str, Any]:
    yaml = pytest.importorskip("yaml")
    return yaml.safe_load(ACTION.read_text(encoding="utf-8"))  # type: ignore[no-any-return]


def test_action_runs_the_script_like_github_does(workdir: Path) -> None:
    """Resolve the action's ``${{ ... }}`` expressions and run its step as the runner would."""
    action = _action()
    assert action["runs"]["using"] == "composite"
    (step,) = action["runs"]["steps"]
    assert step["shell"] == "bash"
    inputs = {name: spec.get("default", "") for name, spec in action["inputs"].items()}
    inputs.update(
        command=f"{sys.executable} train.py 0.55 runs/ci/report.json",
        report="runs/ci/report.json",
        baseline="baseline.json",
        python=sys.executable,
    )
    context = {f"inputs.{k}": v for k, v in inputs.items()}
    context["github.action_path"] = str(ACTION.parent)

    def resolve(value: str) -> str:
        return re.sub(r"\$\{\{\s*([\w.-]+)\s*\}\}", lambda m: context[m.group(1)], str(value))

    env = {k: resolve(v) for k, v in step["env"].items()}
    env |= {"PATH": os.environ.get("PATH", ""), "GITHUB_STEP_SUMMARY": str(workdir / "summary.md")}
    cwd = workdir / resolve(step["working-directory"])
    result = subprocess.run(["bash", "-c", step["run"]], cwd=cwd, env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "::error title=StallScope%3A accelerator idle time regressed::" in result.stdout
    assert "❌ regression" in (workdir / "summary.md").read_text(encoding="utf-8")


def test_action_inputs_all_reach_the_script() -> None:
    action = _action()
    script = SCRIPT.read_text(encoding="utf-8")
    env = action["runs"]["steps"][0]["env"]
    used = {m.group(1) for v in env.values() for m in re.finditer(r"inputs\.([\w-]+)", str(v))}
    used |= {"working-directory"}
    assert used == set(action["inputs"])
    for name in env:
        if name.startswith("STALLSCOPE_"):
            assert name in script, f"{name} is set by the action but not read by the script"


def test_gitlab_template_uses_the_script_settings() -> None:
    yaml = pytest.importorskip("yaml")
    job = yaml.safe_load(GITLAB.read_text(encoding="utf-8"))[".stallscope-gate"]
    script = SCRIPT.read_text(encoding="utf-8")
    assert job["script"] == ['bash "$STALLSCOPE_GATE_SCRIPT"']
    for name in job["variables"]:
        if name != "STALLSCOPE_GATE_SCRIPT":
            assert name in script, f"{name} is set by the template but not read by the script"
    assert job["artifacts"]["when"] == "always"


def test_gitlab_job_runs_the_script(workdir: Path) -> None:
    """What the GitLab runner does: the template's variables, overridden by the user's job."""
    yaml = pytest.importorskip("yaml")
    job = yaml.safe_load(GITLAB.read_text(encoding="utf-8"))[".stallscope-gate"]
    variables = dict(job["variables"])
    variables.update(
        STALLSCOPE_COMMAND=f"{sys.executable} train.py 0.205 runs/ci/report.json",
        STALLSCOPE_REPORT="runs/ci/report.json",
        STALLSCOPE_BASELINE="baseline.json",
        STALLSCOPE_PYTHON=sys.executable,
        STALLSCOPE_GATE_SCRIPT=str(SCRIPT),
    )
    env = {**variables, "PATH": os.environ.get("PATH", "")}
    (line,) = job["script"]
    result = subprocess.run(["bash", "-c", line], cwd=workdir, env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.startswith("OK: accelerator idle 20.5%")


def test_script_is_executable() -> None:
    assert os.access(SCRIPT, os.X_OK)
    assert SCRIPT.read_text(encoding="utf-8").startswith("#!/usr/bin/env bash\n")
