"""Bad input never gives a traceback: one line on stderr and exit 2 (SPEC §5)."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from gate_reports import make_report, write

from stallscope.cli import main
from stallscope.report import schema
from stallscope.report.schema import report_to_dict


def _good_dict() -> dict[str, Any]:
    return report_to_dict(make_report(0.3, window_idle=[0.3] * 10))


def _with(**changes: Any) -> Callable[[], str]:
    def text() -> str:
        d = _good_dict()
        d.update(changes)
        return json.dumps(d)

    return text


def _without_summary() -> str:
    d = _good_dict()
    del d["summary"]
    return json.dumps(d)


def _bad_fraction() -> str:
    d = _good_dict()
    d["summary"]["gpu_idle_fraction"] = 37
    return json.dumps(d)


def _bad_window() -> str:
    d = _good_dict()
    d["summary"]["idle_windows"][2]["idle_fraction"] = "high"
    return json.dumps(d)


BAD_FILES: dict[str, Callable[[], str | bytes] | None] = {
    "missing": None,
    "empty": lambda: "",
    "blank": lambda: "  \n",
    "malformed": lambda: '{"schema_version": 1,',
    "not utf-8": lambda: b"\xff\xfe{}",
    "a list": lambda: "[1, 2]",
    "no schema_version": lambda: json.dumps({"summary": {}}),
    "schema_version 0": _with(schema_version=0),
    "schema_version text": _with(schema_version="1"),
    "newer schema_version": _with(schema_version=2),
    "far newer schema_version": _with(schema_version=99),
    "no summary": _without_summary,
    "idle fraction in percent": _bad_fraction,
    "malformed idle window": _bad_window,
}


def _make_bad(tmp_path: Path, kind: str) -> str:
    path = tmp_path / "bad" / "report.json"
    make = BAD_FILES[kind]
    if make is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        content = make()
        if isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_text(content, encoding="utf-8")
    return str(path)


def _assert_one_line_error(capsys: pytest.CaptureFixture[str], *, stdout_empty: bool = True) -> str:
    out, err = capsys.readouterr()
    assert "Traceback" not in err + out
    lines = err.splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("stallscope: error: ")
    if stdout_empty:
        assert out == ""
    return lines[0]


@pytest.mark.parametrize("kind", list(BAD_FILES))
@pytest.mark.parametrize("role", ["show", "check current", "check baseline", "diff a", "diff b"])
def test_bad_file_exits_2_with_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], kind: str, role: str
) -> None:
    bad = _make_bad(tmp_path, kind)
    good = write(tmp_path, "good", make_report(0.3, window_idle=[0.3] * 10))
    argv = {
        "show": ["show", bad],
        "check current": ["check", bad, "--baseline", good],
        "check baseline": ["check", good, "--baseline", bad],
        "diff a": ["diff", bad, good],
        "diff b": ["diff", good, bad],
    }[role]
    assert main(argv) == 2
    line = _assert_one_line_error(capsys)
    assert bad in line


def test_messages_say_what_is_wrong(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    expected = {
        "missing": "no such file",
        "empty": "empty file",
        "malformed": "malformed JSON",
        "newer schema_version": "schema_version 2 is newer than this StallScope reads (1); upgrade stallscope",
        "no schema_version": "not a StallScope report",
        "malformed idle window": "idle_windows[2].idle_fraction must be a fraction",
    }
    for kind, words in expected.items():
        assert main(["check", _make_bad(tmp_path / kind, kind), "--max-idle", "0.5"]) == 2
        assert words in _assert_one_line_error(capsys)


def test_folder_without_report(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["show", str(tmp_path)]) == 2
    assert "report.json: no such file" in _assert_one_line_error(capsys)


@pytest.mark.parametrize(
    ("kwargs", "words"),
    [
        ({"device": "cuda", "idle_source": "cuda_events"}, "the baseline ran on cpu and the current run on cuda"),
        ({"idle_source": "nvml"}, "idle was measured with host_phases in the baseline and with nvml"),
        ({"steps": 2000}, "the baseline has 160 steps and the current run 2000"),
        ({"steps": 0}, "no steps"),
    ],
)
def test_mismatched_runs_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], kwargs: dict[str, Any], words: str
) -> None:
    base = write(tmp_path, "b", make_report(0.3))
    cur = write(tmp_path, "c", make_report(0.3, **kwargs))
    assert main(["check", cur, "--baseline", base]) == 2
    assert words in _assert_one_line_error(capsys)


def test_allow_mismatch_compares_anyway(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    base = write(tmp_path, "b", make_report(0.3))
    cur = write(tmp_path, "c", make_report(0.3, device="cuda", idle_source="cuda_events"))
    assert main(["check", cur, "--baseline", base, "--allow-mismatch"]) == 0
    assert "note: compared although the baseline ran on cpu" in capsys.readouterr().out


def test_diff_of_mismatched_runs_shows_a_note(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    a = write(tmp_path, "a", make_report(0.3))
    b = write(tmp_path, "b", make_report(0.3, steps=2000))
    assert main(["diff", a, b]) == 0
    assert "note: these runs may not be comparable: A has 160 steps and B 2000" in capsys.readouterr().out


def test_errors_reach_json_and_github_output(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    summary = tmp_path / "summary.md"
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary))
    missing = str(tmp_path / "nope.json")
    assert main(["check", missing, "--max-idle", "0.5", "--format", "json", "--github"]) == 2
    out = capsys.readouterr().out
    data = json.loads(out[: out.index("::error")])
    assert data == {"verdict": "error", "exit_code": 2, "error": f"{missing}: no such file"}
    assert "::error title=StallScope check could not run::" in out
    assert "could not run" in summary.read_text(encoding="utf-8")


def test_older_schema_is_upgraded(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Pretend the format is at version 2, which renamed a key; a version-1 file still reads."""
    old = _good_dict()
    old["summary"]["old_name_of_steps"] = old["summary"].pop("steps")
    path = tmp_path / "old.json"
    path.write_text(json.dumps(old), encoding="utf-8")

    def v1_to_v2(d: dict[str, Any]) -> dict[str, Any]:
        summary = dict(d["summary"])
        summary["steps"] = summary.pop("old_name_of_steps")
        return {**d, "summary": summary}

    monkeypatch.setattr(schema, "SCHEMA_VERSION", 2)
    monkeypatch.setitem(schema.UPGRADES, 1, v1_to_v2)
    assert main(["check", str(path), "--baseline", str(path)]) == 0
    assert "160 steps" in capsys.readouterr().out

    monkeypatch.delitem(schema.UPGRADES, 1)
    assert main(["show", str(path)]) == 2
    assert "schema_version 1 cannot be upgraded to 2" in _assert_one_line_error(capsys)


def test_internal_error_is_exit_2_not_1(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A bug must never read as a regression (1) or a pass (0)."""
    from stallscope.cli import check

    def broken(*args: object, **kwargs: object) -> None:
        raise RuntimeError("boom")

    monkeypatch.setattr(check, "compare", broken)
    good = write(tmp_path, "good", make_report(0.3))
    assert main(["check", good, "--baseline", good]) == 2
    line = _assert_one_line_error(capsys)
    assert "internal error: RuntimeError: boom" in line


@pytest.mark.parametrize(
    "argv",
    [
        [],
        ["frobnicate"],
        ["check"],
        ["check", "r.json"],  # neither --baseline nor --max-idle
        ["check", "r.json", "--baseline", "b.json", "--max-increase", "2"],
        ["check", "r.json", "--baseline", "b.json", "--max-increase", "lots"],
        ["check", "r.json", "--max-idle", "-0.1"],
        ["check", "r.json", "--baseline", "b.json", "--min-windows", "1"],
        ["check", "r.json", "--baseline", "b.json", "--format", "xml"],
        ["diff", "a.json"],
    ],
)
def test_usage_errors_exit_2(capsys: pytest.CaptureFixture[str], argv: list[str]) -> None:
    assert main(argv) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert "error:" in err.splitlines()[-1]
    assert "Traceback" not in err


def test_real_process_exit_codes(tmp_path: Path) -> None:
    """The installed entry point, as CI runs it."""
    good = write(tmp_path, "good", make_report(0.3))
    cmd = [sys.executable, "-m", "stallscope.cli"]
    missing = subprocess.run(
        [*cmd, "check", str(tmp_path / "x.json"), "--baseline", good], capture_output=True, text=True
    )
    assert missing.returncode == 2
    assert missing.stderr.count("\n") == 1
    assert "Traceback" not in missing.stderr
    ok = subprocess.run([*cmd, "check", good, "--baseline", good], capture_output=True, text=True)
    assert ok.returncode == 0, ok.stderr
    assert ok.stdout.startswith("OK:")


@pytest.mark.parametrize(
    "argv", [["check"], ["check", "r.json", "--max-increase", "lots"], ["bogus"], [], ["show", "a", "b"]]
)
def test_usage_errors_are_one_line_and_exit_2(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    from stallscope.cli import main

    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    assert err.startswith("stallscope: error: ")
