from __future__ import annotations

import json
import math
import os
import stat
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn

import pytest

from stallscope._exceptions import ReportError
from stallscope.analysis.finding import Finding
from stallscope.report import io as report_io
from stallscope.report.io import REPORT_NAME, load_report, write_report
from stallscope.report.schema import DeviceInfo, Report, RunInfo, Summary, report_to_dict

MakeReport = Callable[..., Report]


def _strict_json(text: str) -> Any:
    """Parse ``text`` refusing NaN / Infinity, which are not JSON."""

    def refuse(name: str) -> NoReturn:
        raise AssertionError(f"non-JSON constant {name} in the report")

    return json.loads(text, parse_constant=refuse)


def test_write_then_load_gives_back_the_report(tmp_path: Path, make_report: MakeReport) -> None:
    report = make_report()
    target = write_report(report, tmp_path / REPORT_NAME)
    assert target == tmp_path / REPORT_NAME
    assert load_report(target) == report


def test_written_file_is_utf8_json_ending_in_a_newline(tmp_path: Path, make_report: MakeReport) -> None:
    report = make_report(
        run=RunInfo(started_at="", host="Ålesund-gpu", torch_version="", device=DeviceInfo(kind="cpu", name="c"))
    )
    path = write_report(report, tmp_path / REPORT_NAME)
    raw = path.read_bytes()
    assert raw.endswith(b"\n")
    assert "Ålesund-gpu".encode() in raw  # real UTF-8, not \u escapes
    assert _strict_json(raw.decode("utf-8")) == report_to_dict(report)


def test_write_creates_missing_folders(tmp_path: Path, make_report: MakeReport) -> None:
    path = write_report(make_report(), tmp_path / "runs" / "a" / REPORT_NAME)
    assert path.is_file()


@pytest.mark.parametrize(("umask", "mode"), [(0o022, 0o644), (0o002, 0o664), (0o077, 0o600)])
def test_written_file_has_the_mode_of_any_new_file(
    tmp_path: Path, make_report: MakeReport, umask: int, mode: int
) -> None:
    """Not mkstemp's private 0o600 whatever the umask: CI uploaders and colleagues must read it."""
    old = os.umask(umask)
    try:
        path = write_report(make_report(), tmp_path / REPORT_NAME)
    finally:
        os.umask(old)
    assert stat.S_IMODE(path.stat().st_mode) == mode


def test_nan_is_written_as_null(
    tmp_path: Path, make_report: MakeReport, make_summary: Callable[..., Summary], make_finding: Callable[..., Finding]
) -> None:
    report = make_report(
        summary=make_summary(nvml={"util_mean": math.nan}),
        findings=(make_finding(evidence={"ratio": math.inf}),),
    )
    data = _strict_json(write_report(report, tmp_path / REPORT_NAME).read_text(encoding="utf-8"))
    assert data["summary"]["nvml"]["util_mean"] is None
    assert data["findings"][0]["evidence"]["ratio"] is None


def test_a_directory_means_its_report_json(tmp_path: Path, make_report: MakeReport) -> None:
    report = make_report()
    write_report(report, tmp_path / REPORT_NAME)
    assert load_report(tmp_path) == report
    assert load_report(str(tmp_path)) == report


# -- atomic writes ---------------------------------------------------------------------------


def _fail(*args: object, **kwargs: object) -> NoReturn:
    raise OSError(28, "No space left on device")


@pytest.mark.parametrize(
    "target",
    [
        "json.dumps",  # before anything touches the disk
        "os.fsync",  # half-way through writing the temp file
        "os.replace",  # the temp file is complete, the swap fails
    ],
)
def test_a_failed_write_leaves_the_old_report_and_no_temp_file(
    tmp_path: Path, make_report: MakeReport, monkeypatch: pytest.MonkeyPatch, target: str
) -> None:
    path = tmp_path / REPORT_NAME
    old = make_report(notes=("the old one",))
    write_report(old, path)
    before = path.read_bytes()
    module, name = target.split(".")
    monkeypatch.setattr(getattr(report_io, module), name, _fail)
    with pytest.raises(OSError, match="No space left"):
        write_report(make_report(notes=("the new one",)), path)
    monkeypatch.undo()
    assert path.read_bytes() == before
    assert load_report(path) == old
    assert sorted(p.name for p in tmp_path.iterdir()) == [REPORT_NAME]


def test_an_interrupted_write_leaves_no_temp_file(
    tmp_path: Path, make_report: MakeReport, monkeypatch: pytest.MonkeyPatch
) -> None:
    def interrupt(*args: object) -> NoReturn:
        raise KeyboardInterrupt

    monkeypatch.setattr(report_io.os, "replace", interrupt)
    with pytest.raises(KeyboardInterrupt):
        write_report(make_report(), tmp_path / REPORT_NAME)
    monkeypatch.undo()
    assert list(tmp_path.iterdir()) == []


def test_the_file_appears_only_complete(
    tmp_path: Path, make_report: MakeReport, monkeypatch: pytest.MonkeyPatch
) -> None:
    """At the moment the report takes its name it is already whole: written, flushed, synced."""
    path = tmp_path / REPORT_NAME
    seen: list[bytes] = []
    real_replace = os.replace

    def replace(src: str, dst: Path) -> None:
        seen.append(Path(src).read_bytes())
        assert not path.exists()
        real_replace(src, dst)

    monkeypatch.setattr(report_io.os, "replace", replace)
    write_report(make_report(), path)
    assert seen == [path.read_bytes()]


@pytest.fixture
def synced(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The file descriptors ``write_report`` syncs to disk, in order (the real ``fsync`` still runs)."""
    calls: list[int] = []
    real_fsync = os.fsync
    monkeypatch.setattr(report_io.os, "fsync", lambda fd: (calls.append(fd), real_fsync(fd)))
    return calls


def test_only_a_durable_write_waits_for_the_disk(tmp_path: Path, make_report: MakeReport, synced: list[int]) -> None:
    write_report(make_report(notes=("mid-run",)), tmp_path / REPORT_NAME, durable=False)
    assert synced == []
    assert load_report(tmp_path).notes == ("mid-run",)
    write_report(make_report(notes=("final",)), tmp_path / REPORT_NAME)
    assert len(synced) == 1
    assert load_report(tmp_path).notes == ("final",)


def test_a_run_syncs_only_its_final_report(tmp_path: Path, synced: list[int]) -> None:
    """Each epoch end rewrites the report (no fsync: the next epoch replaces it); the last write,
    when the scope closes, is synced."""
    from stallscope import StallScope

    with StallScope(tmp_path, console=False) as scope:
        for _ in range(3):
            for _ in scope.iter(range(5)):
                pass
            assert synced == []
    assert len(synced) == 1
    assert len(load_report(tmp_path).epochs) == 3


# -- load errors -----------------------------------------------------------------------------


def _write(tmp_path: Path, content: bytes | str) -> Path:
    path = tmp_path / REPORT_NAME
    path.write_bytes(content if isinstance(content, bytes) else content.encode("utf-8"))
    return path


def _valid(make_report: MakeReport, **changes: Any) -> str:
    data = report_to_dict(make_report())
    for dotted, value in changes.items():
        node = data
        *parents, last = dotted.split("__")
        for key in parents:
            node = node[key]
        node[last] = value
    return json.dumps(data)


def _load_error(path: Path) -> str:
    with pytest.raises(ReportError) as caught:
        load_report(path)
    message = str(caught.value)
    assert "\n" not in message
    assert message.startswith(str(path))
    return message


def test_missing_file(tmp_path: Path) -> None:
    assert "no such file" in _load_error(tmp_path / "nope.json")


def test_folder_without_a_report(tmp_path: Path) -> None:
    assert "no such file" in _load_error(tmp_path)


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"", "empty file"),
        (b"  \n\t", "empty file"),
        (b'{"schema_version": 1,', "malformed JSON (line 1"),
        (b"\xff\xfe{}", "not UTF-8"),
        (b"[1, 2]", "top level is not a JSON object"),
        (b"42", "top level is not a JSON object"),
        (b'{"run": {}}', "no schema_version"),
        (b'{"a": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", "nested too deeply"),
    ],
)
def test_unreadable_content(tmp_path: Path, content: bytes, message: str) -> None:
    assert message in _load_error(_write(tmp_path, content))


def test_newer_schema_version(tmp_path: Path, make_report: MakeReport) -> None:
    message = _load_error(_write(tmp_path, _valid(make_report, schema_version=99)))
    assert "schema_version 99 is newer" in message
    assert "upgrade stallscope" in message


def test_fraction_out_of_range(tmp_path: Path, make_report: MakeReport) -> None:
    message = _load_error(_write(tmp_path, _valid(make_report, summary__gpu_idle_fraction=37.0)))
    assert "report.summary.gpu_idle_fraction must be a fraction in [0, 1], got 37.0" in message


def test_nan_fraction_is_out_of_range(tmp_path: Path, make_report: MakeReport) -> None:
    text = _valid(make_report).replace('"gpu_idle_fraction": 0.6', '"gpu_idle_fraction": NaN', 1)
    assert "NaN" in text
    assert "report.summary.gpu_idle_fraction is out of range (the number NaN)" in _load_error(_write(tmp_path, text))


def test_unreadable_file(tmp_path: Path, make_report: MakeReport, monkeypatch: pytest.MonkeyPatch) -> None:
    path = _write(tmp_path, _valid(make_report))

    def refuse(file: object, *args: object) -> NoReturn:
        raise PermissionError(13, "Permission denied", str(file))

    monkeypatch.setattr(os, "open", refuse)
    assert "cannot read (Permission denied)" in _load_error(path)
