"""``stallscope tune`` end to end: real example scripts as trials, real child processes.

What is asserted is structure, never a time or a realized speedup (the machine is shared): the
search ran trial 0 and the top finding's suggestion against a baseline, the child applied the
setting (its own report shows it), the trials wrote to the scratch folder and not to the user's
report folder, ``tune.json`` holds what the search did, and no process of any trial is left. A
``torchrun`` job's ranks stop together, and its hung trial is stopped at its timeout, ranks and
all; Ctrl-C (a real SIGINT) stops the search and still prints what was measured. The children
inherit ``STALLSCOPE_NO_NATIVE``: ``make unit`` runs the plain loop's and the Lightning fit's
searches and Ctrl-C on both hot paths (C, and beside it ``STALLSCOPE_NO_NATIVE=1``), in tune's
children too; the transformers and ``torchrun`` searches (45 to 65 s each: what they add is the
trial code of a framework and of a job, the same Python on both paths) on the C pass only, which
keeps the twin's pass shorter than the C pass it runs beside.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = Path(__file__).resolve().parent / "tune_scripts"

pytestmark = pytest.mark.scenario


def trial_processes(scratch: Path) -> list[int]:
    """Processes whose environment makes them a trial under ``scratch`` (children and workers)."""
    found = []
    marker = f"STALLSCOPE_TRIAL_DIR={scratch}".encode()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            environ = (entry / "environ").read_bytes()
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if marker in environ and state != "Z":
            found.append(int(entry.name))
    return found


def described(pids: list[int]) -> str:
    """Each process's state, pending signals and command line, for a failure's message (a
    trial's process that outlived tune under ``make test-busy``: which one, and why, is not known)."""
    lines = []
    for pid in pids:
        try:
            status = Path(f"/proc/{pid}/status").read_text()
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError as exc:
            lines.append(f"{pid}: gone ({exc})")
            continue
        fields = dict(line.split(":\t", 1) for line in status.splitlines() if ":\t" in line)
        keep = ("State", "PPid", "SigPnd", "ShdPnd", "SigBlk", "SigIgn")
        lines.append(f"{pid}: " + ", ".join(f"{k} {fields.get(k, '?').strip()}" for k in keep) + f"; {cmdline[:200]}")
    return "\n".join(lines)


def tune_command(scratch: Path, out: Path, *options: str, command: list[str]) -> list[str]:
    return [
        sys.executable,
        "-m",
        "stallscope.cli",
        "tune",
        "--scratch",
        str(scratch),
        "--out",
        str(out),
        *options,
        "--",
        *command,
    ]


def env_with(extra: dict[str, str]) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("STALLSCOPE_TRIAL")}
    env.update(extra)
    env["PYTHONWARNINGS"] = "ignore"
    return env


def run_tune(tmp_path: Path, extra: dict[str, str], *options: str, command: list[str]) -> tuple[Any, str]:
    scratch, out = tmp_path / "scratch", tmp_path / "tune.json"
    proc = subprocess.run(
        tune_command(scratch, out, *options, command=command),
        cwd=tmp_path,
        env=env_with(extra),
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return json.loads(out.read_text()), proc.stdout


def quick_tune(tmp_path: Path, example: str, *, steps: int, warmup: int) -> tuple[Any, str]:
    """``tune`` on an example of ``examples/``: the predicted value alone, three rounds at most."""
    command = [sys.executable, str(ROOT / "examples" / example), "--quiet"]
    options = ["--budget", "240", "--steps", str(steps), "--warmup", str(warmup), "--timeout", "120"]
    return run_tune(tmp_path, {}, *options, "--no-neighbours", "--max-rounds", "3", command=command)


def workers_applied(tune: Any, framework: str, key: str, *, steps: int) -> tuple[Any, list[Any]]:
    """The first candidate (``data.workers``'s ``key``) and its trials: at least three, each
    applied as asked, stopped at its budget, its own report showing the loader's new workers."""
    assert tune["framework"] == framework
    assert tune["trials"][0]["status"] == "ok"
    top = tune["candidates"][0]
    assert top["finding"] == "data.workers"
    workers = top["change"][key]
    assert workers >= 1
    measured = [t for t in tune["trials"] if t["candidate"] == 0]
    assert len(measured) >= 3
    for trial in measured:
        assert trial["applied"] == top["change"]
        assert trial["status"] == "ok"
        assert trial["steps"] == steps
        report = json.loads(Path(trial["report"]).read_text())
        assert report["run"]["framework"] == framework
        assert report["run"]["dataloader"]["num_workers"] == workers
    return top, measured


def test_tune_applies_the_workers_suggestion_in_the_child(tmp_path: Path) -> None:
    command = [sys.executable, str(ROOT / "examples" / "starved_loader.py"), "--quiet"]
    tune, stdout = run_tune(
        tmp_path,
        {},
        "--budget",
        "150",
        "--steps",
        "20",
        "--warmup",
        "4",
        "--timeout",
        "90",
        "--no-neighbours",
        "--max-rounds",
        "3",
        command=command,
    )
    first = tune["trials"][0]
    assert first["label"] == "as configured"
    assert first["settings"] == {}
    assert first["status"] == "ok"
    # the planted cause is what tune tries first: the loader's workers
    top = tune["candidates"][0]
    assert top["finding"] == "data.workers"
    workers = top["change"]["num_workers"]
    assert workers >= 1  # the scenario's SMALL size (24 steps): enough for the diagnosis
    assert top["predicted"] > 1
    measured = [t for t in tune["trials"] if t["candidate"] == 0]
    assert len(measured) >= 3  # at least three interleaved pairs
    for trial in measured:
        assert trial["applied"] == top["change"]
        # the child's own report saw the loader with the setting applied
        report = json.loads(Path(trial["report"]).read_text())
        assert report["run"]["dataloader"]["num_workers"] == workers
    # the first comparison's baselines ran as configured; a later one's from the settings kept
    baselines = [t for t in tune["trials"] if t["label"] == "baseline" and t["settings"] == {}]
    assert len(baselines) == len(measured)
    for trial in [t for t in tune["trials"] if t["label"] == "baseline"]:
        report = json.loads(Path(trial["report"]).read_text())
        assert report["run"]["dataloader"]["num_workers"] == trial["settings"].get("num_workers", 0)
    # interleaved: baseline and candidate alternate (the order turns each round)
    rounds = [t["round"] for t in tune["trials"][1:7]]
    assert rounds == [0, 0, 1, 1, 2, 2]
    assert top["realized"]["pairs"] == len(measured)
    assert set(tune["best"]) == {"settings", "speedup"}
    kept: dict[str, Any] = {}
    for candidate in tune["candidates"]:
        if candidate["kept"]:
            kept.update(candidate["change"])
    assert tune["best"]["settings"] == kept  # every kept change, merged
    # the trials wrote to the scratch folder, not over the user's report folder
    assert not (tmp_path / "runs").exists()
    assert all(str(tmp_path / "scratch") in t["report"] for t in tune["trials"])
    assert "stallscope tune" in stdout
    assert "as configured" in stdout
    assert "predictions were within" in stdout
    assert trial_processes(tmp_path / "scratch") == []


def c_pass_only() -> None:
    """Skip on ``make unit``'s second pass (``STALLSCOPE_NO_NATIVE=1``): see the module docstring."""
    if os.environ.get("STALLSCOPE_NO_NATIVE"):
        pytest.skip("run on the C hot path's pass only: the frameworks' trial code is the same Python on both")


def test_tune_applies_the_workers_suggestion_in_a_lightning_fit(tmp_path: Path) -> None:
    pytest.importorskip("lightning")
    tune, stdout = quick_tune(tmp_path, "lightning_starved_loader.py", steps=20, warmup=4)
    # the fit stopped itself through trainer.should_stop, at the budget
    top, measured = workers_applied(tune, "lightning", "num_workers", steps=20)
    # the fit's losses reached tune (the loss-curve check) and did not change with the workers
    result = json.loads((Path(measured[0]["report"]).parents[1] / "trial.json").read_text())
    assert len(result["losses"]) >= 20
    assert top["verdict"] != "loss changed"
    assert not (tmp_path / "runs").exists()
    assert "as configured" in stdout
    assert trial_processes(tmp_path / "scratch") == []


def test_tune_applies_the_workers_suggestion_in_a_transformers_trainer(tmp_path: Path) -> None:
    """A tiny transformers ``Trainer`` (a model from a config, synthetic data) whose collator
    costs 40 ms a batch: the trials apply ``dataloader_num_workers`` to its
    ``TrainingArguments``, stop through ``control.should_training_stop`` at the budget, and
    write the Trainer's output to the scratch folder."""
    pytest.importorskip("transformers")
    pytest.importorskip("accelerate")
    c_pass_only()
    tune, stdout = quick_tune(tmp_path, "transformers_starved_loader.py", steps=10, warmup=3)
    # it stopped itself through control.should_training_stop, at the budget
    top, _ = workers_applied(tune, "transformers", "dataloader_num_workers", steps=10)
    assert set(top["change"]) == {"dataloader_num_workers"}  # the Trainer's own vocabulary
    assert not (tmp_path / "runs").exists()  # the Trainer's output_dir went to the scratch folder
    assert "dataloader_num_workers" in stdout
    assert trial_processes(tmp_path / "scratch") == []


def test_a_torchrun_job_stops_together_and_its_hung_trial_is_ended_whole(tmp_path: Path) -> None:
    """``tune -- torchrun`` on a job whose rank 1 reads slowly: both ranks of each trial stop at the
    same step (the job exits 0, each rank writes its measurement), and the fix for rank 1 is
    applied on rank 1 only; in trial 3 rank 1 hangs deaf to SIGTERM and rank 0 waits in the
    all-reduce, each rank in a session of its own: tune stops the trial at its timeout and leaves
    no rank, worker or torchrun running."""
    c_pass_only()  # the job's stop and the trial's end do not use the recorder
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node",
        "2",
        str(SCRIPTS / "ddp_loop.py"),
    ]
    tune, stdout = run_tune(
        tmp_path,
        {"TUNE_TEST_HANG": "3", "OMP_NUM_THREADS": "1"},
        "--budget",
        "150",
        "--steps",
        "20",
        "--warmup",
        "4",
        "--timeout",
        "30",
        "--no-neighbours",
        "--max-rounds",
        "3",
        command=command,
    )
    trials = tune["trials"]
    assert [t["status"] for t in trials[:4]] == ["ok", "ok", "ok", "hung"], stdout
    top = tune["candidates"][0]
    assert top["finding"] == "data.workers"
    workers = top["change"]["num_workers"]
    assert top["change"] == {"num_workers": workers, "rank": 1}
    candidate = trials[2]
    assert candidate["candidate"] == 0
    assert candidate["applied"] == top["change"]  # as rank 1 said
    folder = Path(candidate["report"]).parents[1]
    measured = [json.loads((folder / name).read_text()) for name in ("trial.json", "trial-rank-1.json")]
    assert [m["applied"] for m in measured] == [{}, {"num_workers": workers, "rank": 1}]
    assert measured[0]["steps_total"] == measured[1]["steps_total"]  # the ranks stopped together
    report = json.loads(Path(candidate["report"]).read_text())  # rank 0's report of the job
    assert [r["rank"] for r in report["ranks"]] == [0, 1]
    assert report["run"]["dataloader"]["num_workers"] == 0  # rank 0's loader is the user's
    rank_1 = json.loads((Path(candidate["report"]).parent / "ranks" / "rank-1.json").read_text())
    assert rank_1["run"]["dataloader"]["num_workers"] == workers
    assert trials[3]["message"] == "stopped after 30 s"
    assert top["verdict"] == "hung"
    assert tune["best"]["settings"] == {}
    assert trial_processes(tmp_path / "scratch") == []  # torchrun, both ranks, their workers


def test_ctrl_c_stops_the_search_and_prints_what_was_measured(tmp_path: Path) -> None:
    scratch, out = tmp_path / "scratch", tmp_path / "tune.json"
    command = [sys.executable, str(SCRIPTS / "slow_reads_loop.py")]
    proc = subprocess.Popen(
        tune_command(scratch, out, "--budget", "300", "--steps", "20", "--warmup", "4", command=command),
        cwd=tmp_path,
        env=env_with({}),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        # Ctrl-C as in a terminal: a suite started in the background by a shell has SIGINT
        # ignored, and a child would inherit that
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    try:
        deadline = time.monotonic() + 240
        second: list[int] = []
        while time.monotonic() < deadline and proc.poll() is None:
            if (scratch / "trial-1").exists():
                second = trial_processes(scratch)
                if second:
                    break
            time.sleep(0.05)
        assert second, "trial 1 never started"
        proc.send_signal(signal.SIGINT)
        stdout, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130, stdout
    assert "interrupted" in stdout
    assert "as configured" in stdout  # trial 0's measurement is still shown
    tune = json.loads(out.read_text())
    assert tune["interrupted"] is True
    assert tune["trials"][0]["status"] == "ok"
    assert tune["trials"][0]["steps_per_s"] > 0
    lingering = trial_processes(scratch)
    assert lingering == [], described(lingering)
