"""``stallscope check --html FILE``: the gate's verdict as a self-contained HTML page (the baseline
runs against the current one, the bound, the phases that grew, the findings that explain it)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping
from typing import Any

from stallscope.report.html import render_verdict
from stallscope.report.html_io import write_html
from stallscope.report.safe import plain


def add_argument(p: argparse.ArgumentParser) -> None:
    p.add_argument("--html", metavar="FILE", help="also write the verdict as a self-contained HTML page")


def write(args: argparse.Namespace, verdict: Mapping[str, Any]) -> None:
    """Write the page when asked; a failure to write it is a warning, never the gate's verdict."""
    path = getattr(args, "html", None)
    if not path:
        return
    try:
        write_html(render_verdict(verdict), path)
    except OSError as exc:
        why = plain(f"cannot write {path}: {exc.strerror or exc}")
        print(f"stallscope: warning: {why}", file=sys.stderr)
