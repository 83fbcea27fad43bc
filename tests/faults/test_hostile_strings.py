"""Hostile strings and names: phase names and exception messages that are not valid UTF-8
(``os.fsdecode`` of a file name), that carry terminal escapes or rich markup, that are very long;
a report folder with such a name. They reach the report unchanged and back, and reach a
terminal harmless."""

from __future__ import annotations

import io
import os
import time
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from faults.harness import assert_unchanged, numbers, plain_run, valid_report
from stallscope import StallScope
from stallscope.cli import main

#: a file name that is not UTF-8, as Python hands it over: lone surrogates
SURROGATES = os.fsdecode(b"shard-\xff\xfe.bin")
ESCAPES = "\x1b[31mred\x1b[0m\x1b]0;owned\x07"
NAMES = [SURROGATES, ESCAPES, "[/]", "[bold]x[/bold]", "line\nbreak", "x" * 2000, "\u202eevil", "日本語"]


def _body(scope_box: list[StallScope]) -> Any:
    def body(epoch: int, item: int) -> None:
        scope = scope_box[0] if scope_box else None
        if scope is not None:
            for name in NAMES:
                with scope.phase(name):
                    if name.startswith("["):
                        time.sleep(0.002)  # a share large enough to be shown
        if item == 20:
            raise OSError(f"cannot open {SURROGATES}: {ESCAPES}")

    return body


def test_hostile_phase_names_and_messages_round_trip(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    report_dir = tmp_path / f"scope {SURROGATES} {ESCAPES}"
    out = io.StringIO()
    bare = plain_run(_body([]), data=numbers(8))
    scope = StallScope(report_dir, console=Console(file=out, width=100, force_terminal=True))
    scoped = plain_run(_body([scope]), data=numbers(8), scope=scope)
    assert bare.error is not None
    assert bare.error[0] == "OSError"
    assert_unchanged(bare, scoped)
    report = valid_report(report_dir)  # written, and read back through the CLI's checks
    assert report.complete
    assert not any("turned itself off" in n for n in report.notes)
    for name in NAMES:
        assert name in report.summary.phase_fractions  # the same string, surrogates and all
    assert f"the run ended with an exception (OSError: cannot open {SURROGATES}: {ESCAPES})" in report.notes
    printed = out.getvalue()
    assert "owned" not in printed
    assert "\x1b]" not in printed
    assert "\x1b[31mred" not in printed
    assert "shard-\\udcff\\udcfe.bin" in printed.replace("\n", "")  # shown as its escape
    # the last lines name the files, harmless: report.json, then the report.html beside it
    *_, json_line, html_line = printed.rstrip("\n").split("\n")
    assert json_line.endswith("report.json")
    assert html_line.endswith("report.html")
    capsys.readouterr()
    assert main(["show", str(report_dir)]) == 0
    shown = capsys.readouterr().out
    assert "\x1b" not in shown
    assert "[/]" in shown
    assert "[bold]x[/bold]" in shown


@pytest.mark.parametrize("name", [3, None, "", "  ", b"compute"])
def test_a_phase_name_that_is_not_a_non_empty_string_is_the_users_error(tmp_path: Path, name: Any) -> None:
    """On purpose, and documented: ``ValueError`` naming the value, raised in the loop."""
    with StallScope(tmp_path, console=False) as scope, pytest.raises(ValueError, match="phase name must be"):
        scope.phase(name)
    assert valid_report(tmp_path).complete
