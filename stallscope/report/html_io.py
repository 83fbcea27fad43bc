"""Writing an HTML page: atomically (temp file + ``os.replace``), as ``report.json`` is written."""

from __future__ import annotations

import os
from pathlib import Path

from stallscope.report.io import _new_temp

HTML_NAME = "report.html"


def write_html(text: str, path: str | os.PathLike[str]) -> Path:
    """Write ``text`` to ``path`` atomically: a reader sees the old page or the new one."""
    target = Path(path)
    if target.parent != Path():
        target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = _new_temp(target)
    try:
        with os.fdopen(fd, "w", encoding="utf-8", errors="backslashreplace") as fh:
            fh.write(text)
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return target
