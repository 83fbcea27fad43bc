"""A hostile report (SPEC §6): every string a report, a path or a setting holds may carry a GitHub
workflow command after a newline (``\\n::error::x``), its ``%0A`` form, terminal escapes
(ESC, OSC, BEL, C1), bidi overrides (U+202E) or Unicode line separators. ``show``, ``diff`` and
``check`` (with and without ``--github``) print them as data: no output line starts with ``::``
unless StallScope wrote the command itself, and no control character reaches stdout or stderr.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from gate_reports import data_workers, logging_frequency, make_report, windows

from stallscope.cli import main
from stallscope.report.schema import RankEntry, rank_to_dict, report_to_dict, summary_to_dict

#: what each string field holds after its own text
PAYLOAD = (
    "\n::error::x\r\n::add-mask::y %0A::error::x %0D%0A::warning::z "
    "\x1b]0;owned\x07\x1b[2J\x1b[31mred\x1b[0m\x1b]8;;http://evil\x1b\\link\x1b]8;;\x1b\\ "
    "\x07bell \x9b31m \x85::notice::nel \u2028::notice::ls \u2029 \u202eevil\u202c \u2066iso\u2069 \u200f"
    " ::stop-commands::tok"
)

#: a folder name a path argument carries (the file system allows anything but / and NUL)
HOSTILE_DIR = "r\n::error::path\x1b]0;owned\x07\u202e"

#: control characters: C0 but newline, DEL, C1, bidi embeddings, overrides, isolates and marks,
#: and the Unicode line and paragraph separators
_FORBIDDEN = re.compile("[\x00-\x09\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069]")

#: the workflow commands StallScope writes itself
_OWN = re.compile(
    r"::(error|warning) title=StallScope[^:]*::|::stop-commands::[0-9a-f]{32}$|::[0-9a-f]{32}::$"
    r"|::group::StallScope reference run|::endgroup::$"
)


def assert_safe(text: str) -> None:
    """No control character, and no line a GitHub runner would take for a command unless it is
    one of StallScope's own (the runner trims a line's leading white space before it looks)."""
    bad = _FORBIDDEN.search(text)
    assert bad is None, f"{bad.group()!r} at {bad.start()} in {text[max(0, bad.start() - 60) : bad.start() + 20]!r}"
    for line in text.split("\n"):
        if line.strip().startswith("::"):
            assert _OWN.match(line.strip()), line


def _hostile(value: Any, *, keep: frozenset[str] = frozenset(), key: str = "") -> Any:
    """``value`` with ``PAYLOAD`` after every string (but the fields named in ``keep``), and one
    hostile key beside the others in every object whose keys are free (phases, evidence)."""
    if isinstance(value, str):
        return value if key in keep else value + PAYLOAD
    if isinstance(value, list):
        return [_hostile(v, keep=keep, key=key) for v in value]
    if isinstance(value, dict):
        out = {k: _hostile(v, keep=keep, key=k) for k, v in value.items()}
        if key in ("evidence", "suggestion", "nvml", "dataloader", "extra"):
            out["key" + PAYLOAD] = "value" + PAYLOAD
        return out
    return value


def _phases(shares: dict[str, float]) -> dict[str, float]:
    """Phase fractions with a hostile phase name holding a visible share."""
    return {**shares, "upload" + PAYLOAD: 0.1}


#: the fields whose values the reader checks against a fixed set: kept in the report that is
#: shown, made hostile one at a time in ``test_a_hostile_enum_field_is_refused_harmlessly``
ENUMS = frozenset({"idle_source", "id", "est_speedup_bound", "kind"})


def _report(idle: float, seed: int) -> dict[str, Any]:
    base = make_report(
        idle,
        window_idle=windows(idle, 10, seed=seed),
        findings=[data_workers(0.35), logging_frequency()],
        phases=_phases({"data": round(idle - 0.1, 6), "compute": round(1 - idle, 6)}),
    )
    d = report_to_dict(base)
    d["epochs"] = [{"index": 0, "summary": d["summary"], "findings": d["findings"]}]
    rank = RankEntry(
        rank=1,
        host="node-1",
        steps=160,
        wall_s=2.0,
        steps_per_s=80.0,
        gpu_idle_fraction=idle,
        phase_fractions=_phases({"data": round(idle - 0.1, 6), "compute": round(1 - idle, 6)}),
    )
    d["ranks"] = [{**rank_to_dict(rank), "rank": n} for n in (0, 1)]
    d["tail"] = summary_to_dict(base.summary)
    d["notes"] = ["a note", "another"]
    d["run"]["dataloader"] = {"num_workers": 0, "pin_memory": False, "batch_size": 8}
    d["run"]["device"]["uuid"] = "GPU-0"
    return d


def _write(folder: Path, d: dict[str, Any]) -> str:
    folder.mkdir(parents=True)
    (folder / "report.json").write_text(json.dumps(d), encoding="utf-8")
    return str(folder)


@pytest.fixture
def reports(tmp_path: Path) -> tuple[str, str]:
    """(current, baseline): folders with hostile names, holding hostile reports; the current run
    regressed, so ``check`` prints its findings."""
    current = _write(tmp_path / ("cur" + HOSTILE_DIR), _hostile(_report(0.55, 2), keep=ENUMS))
    baseline = _write(tmp_path / ("base" + HOSTILE_DIR), _hostile(_report(0.20, 1), keep=ENUMS))
    return current, baseline


COMMANDS: dict[str, Callable[[str, str], list[str]]] = {
    "show": lambda cur, base: ["show", cur],
    "show --epochs": lambda cur, base: ["show", "--epochs", cur],
    "check": lambda cur, base: ["check", cur, "--baseline", base],
    "check --github": lambda cur, base: ["check", cur, "--baseline", base, "--github"],
    "check --github --format json": lambda cur, base: [
        "check",
        cur,
        "--baseline",
        base,
        "--github",
        "--format",
        "json",
    ],
    "diff": lambda cur, base: ["diff", base, cur],
}


@pytest.mark.parametrize("command", list(COMMANDS))
def test_hostile_strings_in_every_field_reach_no_terminal_or_runner(
    reports: tuple[str, str],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    command: str,
) -> None:
    summary = tmp_path / "step-summary.md"
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary))
    code = main(COMMANDS[command](*reports))
    out, err = capsys.readouterr()
    assert code == (1 if command.startswith("check") else 0), err
    assert "data.workers" in out  # the report was read and shown, not refused
    assert_safe(out)
    assert_safe(err)
    if command.startswith("check --github"):
        assert "::error title=StallScope" in out  # the regression's own annotation is there
        assert_safe(summary.read_text(encoding="utf-8"))
    if command.endswith("json"):
        assert json.loads(out[: out.rindex("}") + 1])["verdict"] == "regression"  # still valid JSON


def test_github_text_output_is_wrapped_in_stop_commands(
    reports: tuple[str, str], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """With ``--github`` the verdict's text runs between ``::stop-commands::TOKEN`` and
    ``::TOKEN::`` (a fresh random token each run), and the annotation comes after."""
    monkeypatch.delenv("GITHUB_STEP_SUMMARY", raising=False)
    assert main(["check", *reports[:1], "--baseline", reports[1], "--github"]) == 1
    lines = capsys.readouterr().out.splitlines()
    stop = next(i for i, line in enumerate(lines) if line.startswith("::stop-commands::"))
    token = lines[stop].removeprefix("::stop-commands::")
    resume = lines.index(f"::{token}::")
    assert stop == 0
    assert any("data.workers" in line for line in lines[stop:resume])
    assert lines[-1].startswith("::error title=StallScope")
    assert resume < len(lines) - 1


@pytest.mark.parametrize("field", sorted(ENUMS))
@pytest.mark.parametrize("command", ["show", "check --github", "diff"])
def test_a_hostile_enum_field_is_refused_harmlessly(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, field: str, command: str
) -> None:
    monkeypatch.delenv("GITHUB_STEP_SUMMARY", raising=False)
    keep = ENUMS - {field}
    current = _write(tmp_path / ("cur" + HOSTILE_DIR), _hostile(_report(0.55, 2), keep=keep))
    baseline = _write(tmp_path / "base", _report(0.20, 1))
    main(COMMANDS[command](current, baseline))
    out, err = capsys.readouterr()
    assert_safe(out)
    assert_safe(err)


def test_a_hostile_argument_in_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["check", "missing" + PAYLOAD, "--max-idle", "0.3" + PAYLOAD]) == 2
    out, err = capsys.readouterr()
    assert_safe(out)
    assert_safe(err)
    assert main(["show", "missing" + PAYLOAD]) == 2
    out, err = capsys.readouterr()
    assert_safe(out)
    assert_safe(err)
    assert err.startswith("stallscope: error: ")


GATE = Path(__file__).resolve().parents[2] / "integrations" / "stallscope-gate.sh"

#: a reference command that writes a healthy report where the gate looks for it
_WRITES_A_REPORT = "mkdir -p stallscope && cp good.json stallscope/report.json"


@pytest.mark.parametrize(
    "setting",
    ["STALLSCOPE_BASELINE", "STALLSCOPE_REPORT", "STALLSCOPE_MAX_INCREASE", "STALLSCOPE_MODE", "STALLSCOPE_PAIRS"],
)
def test_the_gate_scripts_messages_neutralise_paths_and_settings(tmp_path: Path, setting: str) -> None:
    """``die()`` prints a path or a setting it was given: the same rules hold for it."""
    (tmp_path / "good.json").write_text(json.dumps(_report(0.2, 1)), encoding="utf-8")
    env = {
        **os.environ,
        "STALLSCOPE_PYTHON": sys.executable,
        "STALLSCOPE_COMMAND": _WRITES_A_REPORT,
        "STALLSCOPE_MAX_IDLE": "0.9",
        "STALLSCOPE_GITHUB": "1",
        "STALLSCOPE_BASE_REF": "HEAD",
        setting: "nope" + PAYLOAD,
    }
    if setting == "STALLSCOPE_PAIRS":
        env["STALLSCOPE_MODE"] = "relative"
    done = subprocess.run(
        ["bash", str(GATE)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 2, done.stderr
    assert "error" in done.stderr
    assert_safe(done.stdout)
    assert_safe(done.stderr)
