"""``plain``: the one function every string from a report, a path or a setting passes before it is
printed (stallscope/report/safe.py)."""

from __future__ import annotations

import os

import pytest

from stallscope.report.safe import _scrub, plain


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        ("compute", "compute"),
        ("日本語 é ’", "日本語 é ’"),
        ("a\n::error::x", "a : :error: :x"),
        ("%0A::add-mask::y", "%0A: :add-mask: :y"),
        (":::", ": : :"),
        ("\x1b]0;owned\x07\x1b[2J\x1b[31mred\x1b[0m", "red"),
        ("\x1b]8;;http://evil\x1b\\link\x1b]8;;\x1b\\", "link"),
        ("\x9b31mred", "red"),
        ("tab\there\r\nnel\x85ls\u2028ps\u2029", "tab here  nel ls ps "),
        ("\u202eevil\u202c \u2066iso\u2069\u200f\u061c", "evil iso"),
        ("bell\x07 del\x7f c1\x90", "bell del c1"),
        (os.fsdecode(b"shard-\xff.bin"), "shard-\\udcff.bin"),
    ],
)
def test_plain(text: str, shown: str) -> None:
    assert plain(text) == shown


def test_plain_is_idempotent() -> None:
    text = "x\n::a::b\x1b[1m\u202e"
    assert plain(plain(text)) == plain(text)


@pytest.mark.parametrize("code", range(256))
def test_the_fast_path_keeps_only_what_scrubbing_would_keep(code: int) -> None:
    """``plain`` returns a printable ASCII string without ``::`` as it is: for every character
    of the first 256, alone, between letters and beside colons, it gives what the full scrub
    gives."""
    c = chr(code)
    for text in (c, f"a{c}b", f":{c}", f"{c}:", f"x{c}{c}y", f"\x1b[{c}m"):
        assert plain(text) == _scrub(text), repr(text)
