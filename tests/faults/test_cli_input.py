"""Malformed, huge and special files for every CLI command (``show``, ``check`` as the current
run or the baseline, ``diff`` on either side): exit 2 with one line on stderr that names the file
and what is wrong with it, never a traceback, never "internal error", never a hang or a read
without end."""

from __future__ import annotations

import json
import os
import resource
import socket
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from gate_reports import data_workers, make_report, write

from stallscope.cli import main
from stallscope.report.schema import finding_to_dict, report_to_dict

ROLES = ["show", "check current", "check baseline", "diff a", "diff b"]


def _argv(role: str, bad: str, good: str) -> list[str]:
    return {
        "show": ["show", bad],
        "check current": ["check", bad, "--baseline", good],
        "check baseline": ["check", good, "--baseline", bad],
        "diff a": ["diff", bad, good],
        "diff b": ["diff", good, bad],
    }[role]


def _good(tmp_path: Path) -> str:
    return write(tmp_path, "good", make_report(0.3, window_idle=[0.3] * 10))


def _one_line(err: str) -> str:
    assert "Traceback" not in err
    lines = err.splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("stallscope: error: ")
    assert "internal error" not in lines[0]
    return lines[0]


# -- numbers and types: each names the field ---------------------------------------------------


def _edit(change: Callable[[dict[str, Any]], None]) -> Callable[[], str]:
    def text() -> str:
        d = report_to_dict(make_report(0.3, window_idle=[0.3] * 10))
        change(d)
        return json.dumps(d)

    return text


def _raw(old: str, new: str) -> Callable[[], str]:
    """Edit the JSON text itself (for what ``json.dumps`` would not write)."""

    def text() -> str:
        d = report_to_dict(make_report(0.3, window_idle=[0.3] * 10))
        out = json.dumps(d).replace(old, new, 1)
        assert new in out
        return out

    return text


def _set(path: str, value: Any) -> Callable[[], str]:
    def change(d: dict[str, Any]) -> None:
        *parents, last = path.split(".")
        node: Any = d
        for key in parents:
            node = node[int(key)] if isinstance(node, list) else node[key]
        if isinstance(node, list):
            node[int(last)] = value
        else:
            node[last] = value

    return _edit(change)


def _rank(**change: Any) -> dict[str, Any]:
    rank = {"rank": 0, "host": "a", "steps": 10, "wall_s": 1.0, "steps_per_s": 10.0, "gpu_idle_fraction": 0.3}
    return {**rank, "phase_fractions": {"data": 0.3, "compute": 0.7}, **change}


BAD_FIELDS: dict[str, tuple[Callable[[], str], str]] = {
    "steps = 10**400": (_raw('"steps": 160', '"steps": 1' + "0" * 400), "report.summary.steps is out of range"),
    "steps of 5000 digits": (_raw('"steps": 160', '"steps": ' + "9" * 5000), "report.summary.steps is out of range"),
    "wall_s = 1e400": (_raw('"wall_s": 2.0', '"wall_s": 1e400'), "report.summary.wall_s is out of range"),
    "wall_s = NaN": (_raw('"wall_s": 2.0', '"wall_s": NaN'), "report.summary.wall_s is out of range"),
    "wall_s = -Infinity": (_raw('"wall_s": 2.0', '"wall_s": -Infinity'), "report.summary.wall_s is out of range"),
    "negative wall_s": (_set("summary.wall_s", -1.0), "report.summary.wall_s must be >= 0"),
    "negative steps": (_set("summary.steps", -200), "report.summary.steps must be an integer >= 0"),
    "negative steps_per_s": (_set("summary.steps_per_s", -3), "report.summary.steps_per_s must be >= 0"),
    "complete is a string": (_set("complete", "yes"), "report.complete has the wrong type (str)"),
    "a note that is a number": (_set("notes", ["ok", 5]), "report.notes[1] has the wrong type (int)"),
    "notes is an object": (_set("notes", {"a": 1}), "report.notes must be a list"),
    "a title that is a list": (
        _edit(lambda d: d.update(findings=[{**finding_to_dict(data_workers()), "title": ["x"]}])),
        "report.findings[0].title has the wrong type (list)",
    ),
    "a negative speedup": (
        _edit(lambda d: d.update(findings=[{**finding_to_dict(data_workers()), "est_speedup": -1}])),
        "report.findings[0].est_speedup must be > 0",
    ),
    "negative epoch index": (
        _edit(lambda d: d.update(epochs=[{"index": -1, "summary": d["summary"], "findings": []}])),
        "report.epochs[0].index must be an integer >= 0",
    ),
    "negative phase seconds": (_set("summary.phase_seconds", {"data": -2}), "report.summary.phase_seconds.data"),
    "negative window wall_s": (_set("summary.idle_windows.0.wall_s", -1), "report.summary.idle_windows[0].wall_s"),
    "usable_cores below 1": (_set("run.usable_cores", -3), "report.run.usable_cores must be an integer >= 1"),
    "device is a string": (_set("run.device", "cuda"), "report.run.device has the wrong type (str)"),
    "host is a number": (_set("run.host", 7), "report.run.host has the wrong type (int)"),
    "wall_s = 1e308": (_set("summary.wall_s", 1e308), "report.summary.wall_s is out of range"),
    "a rank's wall_s = 1e308": (
        _edit(lambda d: d.update(ranks=[_rank(wall_s=1e308)])),
        "report.ranks[0].wall_s is out of range",
    ),
    "phase fractions summing to 1.18": (
        _set("summary.phase_fractions", {"data": 0.5, "compute": 0.68}),
        "report.summary.phase_fractions sum to 1.18, not 1",
    ),
    "a rank's fractions summing to 0.5": (
        _edit(lambda d: d.update(ranks=[_rank(phase_fractions={"compute": 0.5})])),
        "report.ranks[0].phase_fractions sum to 0.5, not 1",
    ),
    "a huge number in evidence": (
        _raw('"notes": []', '"notes": [], "extra": {"x": [1e999]}'),
        "report.extra.x[0] is out of range",
    ),
}


@pytest.mark.parametrize("kind", list(BAD_FIELDS))
@pytest.mark.parametrize("role", ROLES)
def test_a_bad_field_is_named(tmp_path: Path, capsys: pytest.CaptureFixture[str], kind: str, role: str) -> None:
    make, words = BAD_FIELDS[kind]
    bad = tmp_path / "bad.json"
    bad.write_text(make(), encoding="utf-8")
    assert main(_argv(role, str(bad), _good(tmp_path))) == 2
    out, err = capsys.readouterr()
    line = _one_line(err)
    assert str(bad) in line
    assert words in line
    assert out == ""


# -- special and huge files, in a fresh interpreter (bounded memory and time) --------------------


def _cli(argv: list[str], timeout: float = 60, limit_bytes: int = 2 << 30) -> subprocess.CompletedProcess[str]:
    """``stallscope ...`` in a child limited to 2 GB of address space: reading /dev/zero whole
    fails there instead of filling the machine."""

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (limit_bytes, limit_bytes))

    return subprocess.run(
        [sys.executable, "-m", "stallscope.cli", *argv],
        capture_output=True,
        text=True,
        timeout=timeout,
        preexec_fn=limit,
        check=False,
    )


def _fifo(tmp_path: Path) -> str:
    path = tmp_path / "fifo.json"
    os.mkfifo(path)
    return str(path)


def _fifo_folder(tmp_path: Path) -> str:
    os.mkfifo(tmp_path / "report.json")
    return str(tmp_path)


def _socket(tmp_path: Path) -> str:
    path = tmp_path / "sock.json"
    server = socket.socket(socket.AF_UNIX)
    server.bind(str(path))  # the file stays after the socket closes
    server.close()
    return str(path)


def _huge(tmp_path: Path) -> str:
    path = tmp_path / "huge.json"
    with open(path, "wb") as fh:  # sparse: no disk used
        fh.truncate(64 * 2**20 + 1)  # the cap: 64 MB
    return str(path)


def _link_to_zero(tmp_path: Path) -> str:
    path = tmp_path / "zero.json"
    path.symlink_to("/dev/zero")
    return str(path)


SPECIAL: dict[str, tuple[Callable[[Path], str], str]] = {
    "/dev/zero": (lambda tmp: "/dev/zero", "a character device"),
    "a link to /dev/zero": (_link_to_zero, "a character device"),
    "a named pipe no one writes to": (_fifo, "a named pipe"),
    "a folder whose report.json is a named pipe": (_fifo_folder, "a named pipe"),
    "a socket": (_socket, "a socket"),
    "a file over 64 MB": (_huge, "larger than 64 MB"),
    "/proc/self/status": (lambda tmp: "/proc/self/status", "the top level is not a JSON object"),
}


@pytest.mark.parametrize("kind", list(SPECIAL))
@pytest.mark.parametrize("role", ROLES)
def test_special_and_huge_files(tmp_path: Path, kind: str, role: str) -> None:
    make, words = SPECIAL[kind]
    bad = make(tmp_path)
    done = _cli(_argv(role, bad, _good(tmp_path)))
    assert done.returncode == 2, done.stderr
    line = _one_line(done.stderr)
    assert words in line
    assert done.stdout == ""


def _many(tmp_path: Path, head: bytes, item: bytes, tail: bytes) -> str:
    """About 60 MB of JSON: ``head``, then ``item`` separated by commas, then ``tail``."""
    path = tmp_path / "many.json"
    count = (60 << 20) // (len(item) + 1)
    with open(path, "wb") as fh:
        fh.write(head)
        fh.write(b",".join([item] * count))
        fh.write(tail)
    return str(path)


MANY: dict[str, tuple[Callable[[Path], str], str]] = {
    "a top-level array of 20 million objects": (
        lambda tmp: _many(tmp, b"[", b"{}", b"]"),
        "the top level is not a JSON object",
    ),
    "an object holding 20 million objects": (
        lambda tmp: _many(tmp, b'{"schema_version": 1, "x": [', b"{}", b"]}"),
        "more than the 1000000 a report may hold",
    ),
    "an object holding 30 million numbers": (
        lambda tmp: _many(tmp, b'{"schema_version": 1, "x": [', b"1", b"]}"),
        "more than the 4000000 a report may hold",
    ),
}


@pytest.mark.parametrize("kind", list(MANY))
@pytest.mark.parametrize("role", ["show", "check baseline"])
def test_many_elements_are_refused_within_a_gigabyte(tmp_path: Path, kind: str, role: str) -> None:
    """A file under the size cap whose parse would still take gigabytes: refused before parsing,
    naming the bound, in a child limited to 1 GB of address space (no MemoryError)."""
    make, words = MANY[kind]
    bad = make(tmp_path)
    done = _cli(_argv(role, bad, _good(tmp_path)), limit_bytes=1 << 30)
    assert done.returncode == 2, done.stderr
    line = _one_line(done.stderr)
    assert words in line
    assert "MemoryError" not in line


def test_show_strips_terminal_escapes_from_notes(tmp_path: Path) -> None:
    report = make_report(0.3)
    path = write(tmp_path, "r", report)
    d = json.loads(Path(path).read_text())
    d["notes"] = ["\x1b]0;owned\x07\x1b[2J\x1b[31mnote\x1b[0m with \x07 bell"]
    Path(path).write_text(json.dumps(d))
    done = subprocess.run(
        [sys.executable, "-m", "stallscope.cli", "show", path],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "FORCE_COLOR": "1", "COLUMNS": "120"},  # a terminal: rich adds its own colours
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "note with  bell" in done.stdout
    assert "owned" not in done.stdout
    assert "\x1b[2J" not in done.stdout
    assert "\x1b]" not in done.stdout
    assert "\x07" not in done.stdout
