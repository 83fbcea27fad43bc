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


# -- relative mode: the base and the head commit, interleaved, in pairs ------------------------

#: a tiny reference job in a git repository: its idle fraction is IDLE (changed by a commit),
#: plus a small wobble by run number, the same on both sides; it logs the order it ran in
JOB = """\
import os, sys
sys.path.insert(0, {tests!r})
from gate_reports import data_workers, make_report, windows
from stallscope.report.io import write_report

IDLE = {idle}
run = int(os.environ["STALLSCOPE_RUN"])
idle = IDLE + [0.0, 0.01, -0.01, 0.005][run % 4]
with open(os.environ["ORDER_LOG"], "a", encoding="utf-8") as log:
    log.write(os.environ["STALLSCOPE_SIDE"] + str(run) + " " + os.getcwd() + "\\n")
findings = [data_workers(0.3)] if idle > 0.3 else []
write_report(make_report(idle, window_idle=windows(idle, 10, seed=run), findings=findings), "runs/ci/report.json")
"""


def _git(repo: Path, *args: str) -> str:
    env = {
        "PATH": os.environ.get("PATH", ""),
        "HOME": str(repo),
        "GIT_AUTHOR_NAME": "t",
        "GIT_AUTHOR_EMAIL": "t@example.com",
        "GIT_COMMITTER_NAME": "t",
        "GIT_COMMITTER_EMAIL": "t@example.com",
    }
    done = subprocess.run(["git", *args], cwd=repo, env=env, capture_output=True, text=True, check=True)
    return done.stdout.strip()


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    """A git repository whose first commit runs a job at 20% idle."""
    if shutil.which("git") is None:
        pytest.skip("needs git")
    repo = tmp_path / "repo"
    (repo / "job").mkdir(parents=True)
    _git(repo, "init", "-q")
    (repo / "job" / "train.py").write_text(JOB.format(tests=str(ROOT / "tests"), idle=0.20), encoding="utf-8")
    _git(repo, "add", ".")
    _git(repo, "commit", "-q", "-m", "a job at 20% idle")
    return repo


def _relative(repo: Path, tmp_path: Path, **more: str) -> subprocess.CompletedProcess[str]:
    env = {
        "STALLSCOPE_MODE": "relative",
        "STALLSCOPE_BASE_REF": "HEAD~1",
        "STALLSCOPE_COMMAND": f"{sys.executable} train.py",
        "STALLSCOPE_REPORT": "runs/ci/report.json",
        "ORDER_LOG": str(tmp_path / "order.log"),
        **more,
    }
    return _gate(repo / "job", env)


def test_relative_mode_fails_a_commit_that_idles_more(repo: Path, tmp_path: Path) -> None:
    (repo / "job" / "train.py").write_text(JOB.format(tests=str(ROOT / "tests"), idle=0.55), encoding="utf-8")
    _git(repo, "commit", "-q", "-am", "the job now idles at 55%")
    result = _relative(repo, tmp_path, STALLSCOPE_PAIRS="3")
    assert result.returncode == 1, result.stdout + result.stderr
    # runs 1-3 wobble by +1, -1, +0.5 points on both sides: every pair differs by exactly 35 points
    head = "REGRESSION: accelerator idle 55.2% on the head commit vs 20.2% on the base, paired over 3 runs"
    assert head in result.stdout
    assert "pairs (base -> head): 21.0% -> 56.0%, 19.0% -> 54.0%, 20.5% -> 55.5%" in result.stdout
    assert "data.workers" in result.stdout
    log = (tmp_path / "order.log").read_text(encoding="utf-8").splitlines()
    assert [line.split()[0] for line in log] == ["base1", "head1", "head2", "base2", "base3", "head3"]
    base_dirs = {line.split()[1] for line in log if line.startswith("base")}
    assert len(base_dirs) == 1
    assert base_dirs != {str(repo / "job")}  # the base ran in its own checkout ...
    assert not Path(base_dirs.pop()).exists()  # ... which is gone afterwards
    assert _git(repo, "worktree", "list").count("\n") == 0  # and git forgot it
    kept = sorted(p.name for p in (repo / "job" / "stallscope-relative").iterdir())
    assert kept == ["base-1", "base-2", "base-3", "head-1", "head-2", "head-3"]


def test_relative_mode_passes_a_commit_that_does_not_touch_the_job(repo: Path, tmp_path: Path) -> None:
    (repo / "README").write_text("docs only\n", encoding="utf-8")
    _git(repo, "add", "README")
    _git(repo, "commit", "-q", "-m", "docs")
    result = _relative(repo, tmp_path, STALLSCOPE_PAIRS="4")
    assert result.returncode == 0, result.stdout + result.stderr
    head = "OK: accelerator idle 20.1% on the head commit vs 20.1% on the base, paired over 4 runs each"
    assert head in result.stdout
    assert len((tmp_path / "order.log").read_text(encoding="utf-8").splitlines()) == 8


@pytest.mark.parametrize(
    ("change", "words"),
    [
        ({"STALLSCOPE_BASE_REF": ""}, "relative mode needs STALLSCOPE_BASE_REF"),
        ({"STALLSCOPE_BASE_REF": "no-such-branch"}, "base commit no-such-branch not found"),
        ({"STALLSCOPE_PAIRS": "0"}, "STALLSCOPE_PAIRS must be a whole number >= 1"),
        ({"STALLSCOPE_MODE": "sideways"}, "STALLSCOPE_MODE must be baseline or relative"),
    ],
)
def test_relative_mode_errors_exit_2(repo: Path, tmp_path: Path, change: dict[str, str], words: str) -> None:
    (repo / "README").write_text("docs only\n", encoding="utf-8")
    _git(repo, "add", "README")
    _git(repo, "commit", "-q", "-m", "docs")
    result = _relative(repo, tmp_path, **change)
    assert result.returncode == 2, result.stdout + result.stderr
    assert words in result.stderr


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

    def expression(text: str) -> str:  # `a || b`: the first that is not empty
        return next((v for part in text.split("||") if (v := context.get(part.strip(), ""))), "")

    def resolve(value: str) -> str:
        return re.sub(r"\$\{\{\s*([\w.\-| ]+?)\s*\}\}", lambda m: expression(m.group(1)), str(value))

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
