"""Strings from a report, a path or a setting, made safe to print (SPEC §6).

A report is data from whoever produced it: a phase name, an exception message, a host name or a
folder name may hold anything. ``plain`` is the one function every such string passes before it
reaches a terminal, a CI log or a GitHub runner (the hooks' panel, every CLI command, the gate's
annotations and step summary). It turns the string into text that is only text:

* terminal escape sequences (CSI, OSC up to its BEL or ST, any other ESC pair) are removed;
* line breaks (LF, CR, VT, FF, NEL, U+2028, U+2029) and tabs become a space, so a string never
  starts a line of its own;
* every other control character goes: C0, DEL, C1, and the bidi embeddings, overrides, isolates
  and marks (U+202A-U+202E, U+2066-U+2069, U+200E, U+200F, U+061C) that make text read otherwise
  than it is;
* ``::`` becomes ``: :``, so that no part of it can open a GitHub workflow command, wherever a
  renderer wraps the line (a runner takes any line that starts with ``::`` after white space for
  one, and ``::stop-commands::`` would switch StallScope's own annotations off);
* a lone surrogate (``os.fsdecode`` of a file name that is not UTF-8) is written as its escape,
  which any terminal encoding can print.

``integrations/stallscope-gate.sh`` applies the same rules in bash (its ``neutral``).
"""

from __future__ import annotations

import re

#: terminal escape sequences: CSI, OSC (to BEL or ST, or the end), then any other ESC pair
_SEQUENCE = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]?|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)?|\x1b[@-_]?|\x9b[0-?]*[ -/]*[@-~]?")
#: what reads as a line break or a tab: a space instead
_BREAK = re.compile(r"[\t\n\v\f\r\x85\u2028\u2029]")
#: the other control characters, and the bidi controls
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]")


def plain(text: str) -> str:
    """``text`` as data: safe for a terminal, a log and a CI runner (see the module's docstring)."""
    if text.isascii() and text.isprintable() and "::" not in text:
        return text  # no escape, break, control or non-ASCII character: ``_scrub`` would keep it
    return _scrub(text)


def _scrub(text: str) -> str:
    """``plain``'s work for any string."""
    text = _SEQUENCE.sub("", text)
    text = _BREAK.sub(" ", text)
    text = _CONTROL.sub("", text)
    while "::" in text:  # "x:::y" needs two passes
        text = text.replace("::", ": :")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        text = text.encode("utf-8", "backslashreplace").decode("utf-8")
    return text
