"""Folders of reports: several healthy baseline runs, and a rolling history of them.

``report_files`` expands what a user passes as ``--baseline`` (a report, the folder of one run, or
a folder of several runs' reports); ``add_to_history`` copies a healthy report into such a folder
under a new, unique name, atomically, and keeps the newest ``keep`` that it added. Every file is
read with ``stallscope.report.io.load_report``; errors are ``ReportError`` / ``ComparisonError``
with one-line messages.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from stallscope._exceptions import ComparisonError, ReportError
from stallscope.report.io import REPORT_NAME, load_report
from stallscope.report.schema import Report

#: names ``add_to_history`` gives: report-<UTC time, microseconds>-<first 12 hex of the content's sha256>.json
HISTORY_NAME = re.compile(r"^report-(\d{8}T\d{12}Z)-([0-9a-f]{12})(?:-\d+)?\.json$")


def report_files(path: str | os.PathLike[str]) -> list[Path]:
    """The report files ``path`` names: a file is itself; a folder holding ``report.json`` is that one
    run; any other folder holds several runs, its ``*.json`` files and its subfolders'
    ``report.json``, in name order (names starting with ``.`` are skipped).

    Raises ``ReportError`` for a folder with no reports in it.
    """
    p = Path(path)
    if not p.is_dir():
        return [p]
    if (p / REPORT_NAME).exists():
        return [p / REPORT_NAME]
    try:
        entries = sorted(p.iterdir(), key=lambda e: e.name)
    except OSError as exc:
        raise ReportError(f"{p}: cannot list the folder ({exc.strerror or exc})") from None
    files: list[Path] = []
    for entry in entries:
        if entry.name.startswith("."):
            continue
        if entry.is_dir():
            if (entry / REPORT_NAME).exists():
                files.append(entry / REPORT_NAME)
        elif entry.suffix == ".json":
            files.append(entry)
    if not files:
        raise ReportError(f"{p}: no reports in this folder (*.json files or subfolders with a {REPORT_NAME})")
    return files


def load_reports(paths: list[str]) -> tuple[list[str], list[Report]]:
    """Every report the given paths name (see ``report_files``), with the path each came from."""
    names: list[str] = []
    reports: list[Report] = []
    for path in paths:
        for file in report_files(path):
            reports.append(load_report(file))
            names.append(str(file))
    return names, reports


@dataclass(frozen=True)
class Added:
    """What ``add_to_history`` did."""

    #: the new file
    path: Path
    #: older files it removed to keep the newest ``keep``
    removed: tuple[Path, ...]
    #: reports in the folder now (every kind ``report_files`` counts)
    reports: int


def _history_files(folder: Path) -> list[Path]:
    return sorted((f for f in folder.iterdir() if HISTORY_NAME.match(f.name) and f.is_file()), key=lambda f: f.name)


def add_to_history(
    report: str | os.PathLike[str],
    folder: str | os.PathLike[str],
    *,
    keep: int,
    mismatch: Callable[[Report, Report], str | None] | None = None,
    now: Callable[[], datetime] = lambda: datetime.now(timezone.utc),
) -> Added:
    """Copy ``report`` (checked with ``load_report``) into ``folder`` as a new baseline run.

    The copy appears atomically (written beside, then linked into place under a name no other
    file has), so a gate reading the folder at the same time never sees half a report. Of the
    files this function added (``report-<time>-<hash>.json``), the newest ``keep`` stay; other
    files in the folder are left alone. Refuses (``ReportError``) a report already in the
    folder, and (``ComparisonError``) one for which ``mismatch(new, newest run there)`` says why
    the two cannot be compared (the CLI passes the gate's ``comparison_problem``).
    """
    if keep < 1:
        raise ValueError(f"keep must be >= 1, got {keep!r}")
    source = report_files(report)
    if len(source) != 1:
        raise ReportError(f"{report}: a folder of {len(source)} reports; add one report at a time")
    new = load_report(source[0])
    try:
        content = source[0].read_bytes()
    except OSError as exc:
        raise ReportError(f"{source[0]}: cannot read ({exc.strerror or exc})") from None
    target = Path(folder)
    if target.exists() and not target.is_dir():
        raise ReportError(f"{target}: not a folder")
    try:
        target.mkdir(parents=True, exist_ok=True)
        return _add(new, content, source[0], target, keep=keep, mismatch=mismatch, now=now)
    except OSError as exc:
        raise ReportError(f"{target}: cannot write the baseline folder ({exc.strerror or exc})") from None


def _add(
    new: Report,
    content: bytes,
    source: Path,
    target: Path,
    *,
    keep: int,
    mismatch: Callable[[Report, Report], str | None] | None,
    now: Callable[[], datetime],
) -> Added:
    digest = hashlib.sha256(content).hexdigest()[:12]
    history = _history_files(target)
    for old in history:
        match = HISTORY_NAME.match(old.name)
        if match is not None and match.group(2) == digest and old.read_bytes() == content:
            raise ReportError(f"{source}: already in {target} as {old.name}")
    if history and mismatch is not None and (problem := mismatch(new, load_report(history[-1]))) is not None:
        raise ComparisonError(
            f"{source} does not belong in {target}: {problem} (start a new folder for a new reference run)"
        )

    stamp = now().astimezone(timezone.utc).strftime("%Y%m%dT%H%M%S%fZ")
    fd, tmp = tempfile.mkstemp(prefix=".report-", suffix=".tmp", dir=target)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(content)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, 0o644)
        path = _link_unique(Path(tmp), target, f"report-{stamp}-{digest}")
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
    history = _history_files(target)
    removed = tuple(history[: max(0, len(history) - keep)])
    for old in removed:
        with contextlib.suppress(FileNotFoundError):
            old.unlink()
    return Added(path=path, removed=removed, reports=len(report_files(target)))


def _link_unique(tmp: Path, folder: Path, stem: str) -> Path:
    """Give ``tmp`` a name in ``folder`` that no file has yet (``stem.json``, ``stem-2.json``, ...)."""
    for i in range(1, 1000):
        candidate = folder / (f"{stem}.json" if i == 1 else f"{stem}-{i}.json")
        try:
            os.link(tmp, candidate)  # fails when the name is taken: never replaces a file
        except FileExistsError:
            continue
        except OSError:  # a file system without hard links: rename, after checking the name is free
            if candidate.exists():
                continue
            os.replace(tmp, candidate)
        return candidate
    raise ReportError(f"{folder}: cannot find a free name for {stem}.json")
