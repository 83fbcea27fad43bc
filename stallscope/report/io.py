"""Reading and writing ``report.json``: atomic writes, one-line errors on read."""

from __future__ import annotations

import json
import math
import os
import secrets
import stat
from pathlib import Path
from typing import Any

from stallscope._exceptions import ReportError
from stallscope.report.schema import Report, report_from_dict, report_to_dict
from stallscope.timeline.stats import native_json_ints as _json_ints

REPORT_NAME = "report.json"


def write_report(report: Report, path: str | os.PathLike[str], *, durable: bool = True) -> Path:
    """Write ``report`` as UTF-8 JSON to ``path`` atomically (temp file + ``os.replace``): a reader,
    or a run killed half-way, sees the old file or the new one, never a mix. ``durable`` also
    flushes it to the disk before the swap (``fsync``), so it survives a machine crash too; a
    mid-run report that the next epoch replaces skips that wait (an ``fsync`` can block for
    hundreds of milliseconds on a busy or network disk)."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    text = report_json(report_to_dict(report))
    fd, tmp = _new_temp(target)
    try:
        # a lone surrogate (``os.fsdecode`` of a file name that is not UTF-8, in a phase name or an
        # exception message) has no UTF-8 form: "backslashreplace" writes it as the JSON escape
        # ``\udcff``, which reads back as the same string
        with os.fdopen(fd, "w", encoding="utf-8", errors="backslashreplace") as fh:
            fh.write(text)
            fh.write("\n")
            fh.flush()
            if durable:
                os.fsync(fh.fileno())
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return target


def _dumps(value: Any) -> str:
    # compact: the C encoder is ~10x faster than an indented dump; `stallscope show` is for reading
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def report_json(data: dict[str, Any]) -> str:
    """``report_to_dict``'s ``data`` as ``report.json``'s text: ``json.dumps``'s, with the lists of
    ints of the record of the last steps (``recent_steps``: thousands a rank, one str object each
    in ``json``) written by ``_native.json_ints``. The same text, the record in a tenth of the time."""
    keys = list(data)
    last = keys[keys.index("recent_steps") :] if "recent_steps" in keys else []
    if _json_ints is None or last not in (["recent_steps"], ["recent_steps", "series"]):
        return _dumps(data)
    if type(data["recent_steps"]) is not list:
        return _dumps(data)
    rest = {key: value for key, value in data.items() if key not in last}
    head = _dumps(rest)[:-1] + ("," if rest else "")
    entries = [_recent_json(entry) for entry in data["recent_steps"]]
    series = f',"series":{_dumps(data["series"])}' if "series" in last else ""
    return f'{head}"recent_steps":[{",".join(entries)}]{series}}}'


def _recent_json(entry: Any) -> str:
    """One rank's record (``recent_to_dict``) as JSON, its lists of ints by ``_native.json_ints``."""
    if type(entry) is not dict or not all(type(key) is str for key in entry):
        return _dumps(entry)
    fields = []
    for key, value in entry.items():
        text = None
        if key == "start_delta_us":
            text = _ints(value)
        elif key == "phases_us" and type(value) is dict and all(type(name) is str for name in value):
            columns = [(_dumps(name), _ints(column)) for name, column in value.items()]
            if all(column is not None for _, column in columns):
                text = "{" + ",".join(f"{name}:{column}" for name, column in columns) + "}"
        fields.append(f"{_dumps(key)}:{text if text is not None else _dumps(value)}")
    return "{" + ",".join(fields) + "}"


def _ints(values: Any) -> str | None:
    """A list of ints as JSON text; None for anything else (``json.dumps`` then writes it)."""
    return _json_ints(values) if _json_ints is not None and type(values) is list else None


def _new_temp(target: Path) -> tuple[int, str]:
    """A new file beside ``target`` for its next version, opened for writing. Mode 0o666 less the
    umask, as ``open()`` gives (the kernel applies the umask; ``mkstemp`` would make it 0o600, and
    reading the umask back means a read of /proc/self/status, which can block)."""
    for _ in range(100):
        tmp = str(target.parent / f".{target.name}.{secrets.token_hex(6)}.tmp")
        try:
            return os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), 0o666), tmp
        except FileExistsError:
            continue
    raise FileExistsError(f"no free temporary name beside {target}")


def load_report(path: str | os.PathLike[str]) -> Report:
    """Read a report. A directory means its ``report.json``. Raises ``ReportError`` (one line).

    Only a regular file of at most ``MAX_REPORT_BYTES`` is read (``/dev/zero`` or a named pipe is
    refused before anything is read from it), and every number must be finite and of a sensible
    size: the error names the field that is not."""
    p = Path(path)
    if p.is_dir():
        p = p / REPORT_NAME
    raw = _read_capped(p)
    if not raw.strip():
        raise ReportError(f"{p}: empty file, not a StallScope report")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise ReportError(f"{p}: not UTF-8 text, not a StallScope report") from None
    _check_shape(p, raw, text)
    try:
        data = json.loads(text, parse_int=_parse_int, parse_float=_parse_float, parse_constant=_BadNumber)
    except json.JSONDecodeError as exc:
        raise ReportError(f"{p}: malformed JSON (line {exc.lineno}, column {exc.colno}: {exc.msg})") from None
    except RecursionError:
        raise ReportError(f"{p}: JSON nested too deeply, not a StallScope report") from None
    except ValueError as exc:  # what the parser itself refuses (no field to name yet)
        raise ReportError(f"{p}: malformed JSON ({' '.join(str(exc).split())[:120]})") from None
    try:
        bad = _bad_number(data, "report")
    except RecursionError:
        raise ReportError(f"{p}: JSON nested too deeply, not a StallScope report") from None
    if bad is not None:
        raise ReportError(f"{p}: {bad}")
    try:
        return report_from_dict(data)
    except ReportError as exc:
        raise ReportError(f"{p}: {exc}") from None


#: the largest report file read, bytes (a report is kilobytes; 500 epochs of findings a few MB)
MAX_REPORT_BYTES = 64 * 1024 * 1024
#: the most JSON objects and arrays a report may hold (500 epochs of findings: tens of thousands)
MAX_CONTAINERS = 1_000_000
#: the most JSON values (told by their separators) a report may hold
MAX_VALUES = 4_000_000


def _check_shape(p: Path, raw: bytes, text: str) -> None:
    """Refuse before parsing what parsing would make huge: the top level must be an object, and
    the objects and arrays (counted by their brackets, strings included: an upper bound) and the
    values (counted by their commas) within bounds. Parsing 60 MB of ``[{},{},...]`` takes 1.6 GB."""
    if not text.lstrip().startswith("{"):
        raise ReportError(f"{p}: not a StallScope report (the top level is not a JSON object)")
    containers = raw.count(b"{") + raw.count(b"[")
    if containers > MAX_CONTAINERS:
        raise ReportError(
            f"{p}: {containers} JSON objects and arrays, more than the {MAX_CONTAINERS} a report may hold; "
            "not a StallScope report"
        )
    values = raw.count(b",")
    if values > MAX_VALUES:
        raise ReportError(
            f"{p}: {values} JSON values, more than the {MAX_VALUES} a report may hold; not a StallScope report"
        )


_KINDS = (
    (stat.S_ISFIFO, "a named pipe"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)


def _read_capped(p: Path) -> bytes:
    """The bytes of regular file ``p``, at most ``MAX_REPORT_BYTES``; ``ReportError`` otherwise."""
    try:
        _check_regular(p, os.stat(p))
        # O_NONBLOCK: a file swapped for a named pipe since the stat must not block the open
        fd = os.open(p, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0))
    except FileNotFoundError:
        raise ReportError(f"{p}: no such file") from None
    except OSError as exc:
        raise ReportError(f"{p}: cannot read ({exc.strerror or exc})") from None
    try:
        with os.fdopen(fd, "rb") as fh:
            _check_regular(p, os.fstat(fh.fileno()))
            raw = fh.read(MAX_REPORT_BYTES + 1)
    except OSError as exc:
        raise ReportError(f"{p}: cannot read ({exc.strerror or exc})") from None
    if len(raw) > MAX_REPORT_BYTES:
        raise ReportError(f"{p}: larger than {MAX_REPORT_BYTES >> 20} MB, not a StallScope report")
    return raw


def _check_regular(p: Path, st: os.stat_result) -> None:
    if stat.S_ISREG(st.st_mode):
        if st.st_size > MAX_REPORT_BYTES:
            raise ReportError(
                f"{p}: {st.st_size / 2**20:.0f} MB, larger than {MAX_REPORT_BYTES >> 20} MB; not a StallScope report"
            )
        return
    kind = next((name for test, name in _KINDS if test(st.st_mode)), "not a regular file")
    raise ReportError(f"{p}: {kind}, not a StallScope report (a report is a regular file)")


class _BadNumber:
    """A number the parser will not turn into a float or an int (NaN, Infinity, 1e999, a
    thousand digits); the check after parsing names the field that holds it."""

    __slots__ = ("text",)

    def __init__(self, text: str) -> None:
        self.text = text

    def __repr__(self) -> str:
        shown = self.text if len(self.text) <= 24 else f"{self.text[:12]}... ({len(self.text)} characters)"
        return f"the number {shown}"


#: longest integer literal read as a number (int64 has 19 digits)
_MAX_INT_DIGITS = 20


def _parse_int(text: str) -> int | _BadNumber:
    return int(text) if len(text) <= _MAX_INT_DIGITS else _BadNumber(text)


def _parse_float(text: str) -> float | _BadNumber:
    if len(text) > 400:
        return _BadNumber(text)
    value = float(text)
    return value if math.isfinite(value) else _BadNumber(text)


def _bad_number(value: object, where: str) -> str | None:
    """Where the first number out of range sits in ``value``, as an error message; None if none."""
    if isinstance(value, _BadNumber):
        return f"{where} is out of range ({value!r})"
    if isinstance(value, dict):
        for key, item in value.items():
            found = _bad_number(item, f"{where}.{key}")
            if found is not None:
                return found
    elif isinstance(value, list):
        for i, item in enumerate(value):
            found = _bad_number(item, f"{where}[{i}]")
            if found is not None:
                return found
    return None
