"""Faults where the report goes: a folder that cannot be written (a path under a file, a
read-only file system, a full disk). Only the file is lost, and only while the fault lasts: the
diagnosis goes on, ``scope.report`` stays whole, and each epoch end tries the write again."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from faults.harness import assert_unchanged, numbers, plain_run, valid_report
from stallscope import StallScope
from stallscope.hooks import session as session_module


def _no_fault(epoch: int, item: int) -> None:
    return None


def _mend_at(epoch_to_mend: int, mend: object) -> object:
    """A body that calls ``mend()`` at the first item of an epoch (the fault goes away)."""

    def body(epoch: int, item: int) -> None:
        if epoch == epoch_to_mend and item == epoch * 6:
            mend()  # type: ignore[operator]

    return body


def _check_whole(scope: StallScope, report_dir: Path, capsys: pytest.CaptureFixture[str], *, why: str) -> None:
    report = scope.report
    assert report is not None
    assert report.complete
    assert scope.enabled is False  # closed, not turned off: every epoch was diagnosed
    assert len(report.epochs) == 4
    assert report.summary.steps == 24
    assert [e.summary.steps for e in report.epochs] == [6, 6, 6, 6]
    notes = [n for n in report.notes if "could not be written" in n]
    assert len(notes) == 1
    assert why in notes[0]
    assert not any("turned itself off" in n for n in report.notes)
    err = capsys.readouterr().err
    assert err.count("could not be written") == 1  # said once
    on_disk = valid_report(report_dir)  # written again once the fault went away
    assert on_disk.complete
    assert len(on_disk.epochs) == 4
    assert [n for n in on_disk.notes if "could not be written" in n] == notes


def _write_from_the_first_epoch(monkeypatch: pytest.MonkeyPatch) -> None:
    """These runs last a fraction of a second: without the first write's wait (2 s into the
    run, ``report/writer.py``) each epoch end writes the report, so the fault meets a write at
    the epoch it is planted in."""
    monkeypatch.setattr(session_module, "FIRST_WRITE_S", 0.0)


def test_a_report_folder_under_a_file_then_mended(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    _write_from_the_first_epoch(monkeypatch)
    blocker = tmp_path / "blocker"
    blocker.write_text("a file where a folder should be")
    report_dir = blocker / "scope"
    bare = plain_run(_no_fault, data=numbers(6), epochs=4)
    scope = StallScope(report_dir, console=False)
    scoped = plain_run(_mend_at(2, blocker.unlink), data=numbers(6), epochs=4, scope=scope)
    assert_unchanged(bare, scoped)
    _check_whole(scope, report_dir, capsys, why="NotADirectoryError")


@contextlib.contextmanager
def _tmpfs(where: Path, *options: str) -> Iterator[Path]:
    """A small tmpfs mounted at ``where`` (root only; the test is skipped where mount fails)."""
    where.mkdir()
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("mounting a tmpfs needs root")
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", ",".join(("size=256k", *options)), "tmpfs", str(where)],
        capture_output=True,
        check=False,
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.decode(errors='replace').strip()}")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], capture_output=True, check=False)


def test_a_full_disk_then_space_again(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    _write_from_the_first_epoch(monkeypatch)
    with _tmpfs(tmp_path / "disk") as disk:
        report_dir = disk / "scope"
        report_dir.mkdir()
        filler = disk / "filler"
        with open(filler, "wb", buffering=0) as fh, contextlib.suppress(OSError):  # to the last block
            while True:
                fh.write(b"\0" * 4096)
        bare = plain_run(_no_fault, data=numbers(6), epochs=4)
        scope = StallScope(report_dir, console=False)
        scoped = plain_run(_mend_at(2, filler.unlink), data=numbers(6), epochs=4, scope=scope)
        assert_unchanged(bare, scoped)
        _check_whole(scope, report_dir, capsys, why="OSError")
        assert not [p for p in report_dir.iterdir() if p.name != "report.json"]  # no temp file left


def test_a_read_only_file_system(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with _tmpfs(tmp_path / "ro", "ro") as ro:
        bare = plain_run(_no_fault, data=numbers(6), epochs=4)
        scope = StallScope(ro / "scope", console=False)
        scoped = plain_run(_no_fault, data=numbers(6), epochs=4, scope=scope)
        assert_unchanged(bare, scoped)
        report = scope.report
        assert report is not None
        assert report.complete
        assert len(report.epochs) == 4
        assert any("could not be written" in n and "OSError" in n for n in report.notes)
        assert capsys.readouterr().err.count("could not be written") == 1
        assert not (ro / "scope").exists()


def _too_long(tmp_path: Path) -> Path:
    return tmp_path / ("x" * 300)  # a name over NAME_MAX (255): ENAMETOOLONG


def _loop(tmp_path: Path) -> Path:
    (tmp_path / "loop-a").symlink_to(tmp_path / "loop-b")
    (tmp_path / "loop-b").symlink_to(tmp_path / "loop-a")
    return tmp_path / "loop-a"


def _loop_below(tmp_path: Path) -> Path:
    return _loop(tmp_path) / "scope"


@pytest.mark.parametrize("make", [_too_long, _loop, _loop_below], ids=["name too long", "symlink loop", "below a loop"])
def test_a_report_folder_that_cannot_even_be_named(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], make: object
) -> None:
    """The constructor never raises for a folder that cannot be written: a note, and the
    diagnosis goes on (``scope.report`` is whole), as for any other unwritable folder."""
    report_dir = make(tmp_path)  # type: ignore[operator]
    bare = plain_run(_no_fault, data=numbers(6), epochs=2)
    scope = StallScope(report_dir, console=False)
    scoped = plain_run(_no_fault, data=numbers(6), epochs=2, scope=scope)
    assert_unchanged(bare, scoped)
    report = scope.report
    assert report is not None
    assert report.complete
    assert report.summary.steps == 12
    assert len([n for n in report.notes if "could not be written" in n]) == 1
    assert not any("turned itself off" in n for n in report.notes)
    assert capsys.readouterr().err.count("could not be written") == 1
