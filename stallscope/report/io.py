"""Reading and writing ``report.json``: atomic writes, one-line errors on read."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

from stallscope._exceptions import ReportError
from stallscope.report.schema import Report, report_from_dict, report_to_dict

REPORT_NAME = "report.json"


def _new_file_mode() -> int:
    """The mode ``open()`` gives a new file (0o666 less the umask); ``mkstemp`` makes it 0o600."""
    try:
        with open("/proc/self/status", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("Umask:"):
                    return 0o666 & ~int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    return 0o644


def write_report(report: Report, path: str | os.PathLike[str], *, durable: bool = True) -> Path:
    """Write ``report`` as UTF-8 JSON to ``path`` atomically (temp file + ``os.replace``): a reader,
    or a run killed half-way, sees the old file or the new one, never a mix. ``durable`` also
    flushes it to the disk before the swap (``fsync``), so it survives a machine crash too; a
    mid-run report that the next epoch replaces skips that wait (an ``fsync`` can block for
    hundreds of milliseconds on a busy or network disk)."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    # compact: the C encoder is ~10x faster than an indented dump; `stallscope show` is for reading
    text = json.dumps(report_to_dict(report), separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
            fh.write("\n")
            fh.flush()
            if durable:
                os.fsync(fh.fileno())
        os.chmod(tmp, _new_file_mode())  # readable like any other file the run writes
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return target


def load_report(path: str | os.PathLike[str]) -> Report:
    """Read a report. A directory means its ``report.json``. Raises ``ReportError`` (one line)."""
    p = Path(path)
    if p.is_dir():
        p = p / REPORT_NAME
    try:
        raw = p.read_bytes()
    except FileNotFoundError:
        raise ReportError(f"{p}: no such file") from None
    except OSError as exc:
        raise ReportError(f"{p}: cannot read ({exc.strerror or exc})") from None
    if not raw.strip():
        raise ReportError(f"{p}: empty file, not a StallScope report")
    try:
        data = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError:
        raise ReportError(f"{p}: not UTF-8 text, not a StallScope report") from None
    except json.JSONDecodeError as exc:
        raise ReportError(f"{p}: malformed JSON (line {exc.lineno}, column {exc.colno}: {exc.msg})") from None
    except RecursionError:
        raise ReportError(f"{p}: JSON nested too deeply, not a StallScope report") from None
    try:
        return report_from_dict(data)
    except ReportError as exc:
        raise ReportError(f"{p}: {exc}") from None
