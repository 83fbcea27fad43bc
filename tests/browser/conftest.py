"""Headless Chromium for the HTML report's tests: the system's browser (Debian's ``chromium``
package; ``STALLSCOPE_CHROMIUM`` names another), driven by Playwright, which downloads nothing.
Without a browser or Playwright every test here is skipped, and says why."""

from __future__ import annotations

import os
import shutil
import struct
import tempfile
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

#: what a closed network and a container need (no sandbox for root, no background fetches)
CHROMIUM_FLAGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


def _chromium() -> str | None:
    named = os.environ.get("STALLSCOPE_CHROMIUM")
    if named:
        return named if os.access(named, os.X_OK) else None
    for name in ("chromium", "chromium-browser", "google-chrome"):
        found = shutil.which(name)
        if found:
            return found
    return None


def _skip_reason() -> str | None:
    if _chromium() is None:
        return (
            "no Chromium found (apt-get install chromium, or set STALLSCOPE_CHROMIUM): "
            "the browser tests of report.html are skipped"
        )
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return "playwright is not installed (pip install -e '.[test]'): the browser tests of report.html are skipped"
    return None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    reason = _skip_reason()
    if reason is None:
        return
    here = Path(__file__).parent
    for item in items:
        if here in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.skip(reason=reason))


@pytest.fixture(scope="session")
def browser() -> Iterator[Any]:
    from playwright.sync_api import sync_playwright

    with tempfile.TemporaryDirectory(prefix="stallscope-chromium-") as profile, sync_playwright() as p:
        context = p.chromium.launch_persistent_context(
            profile,
            executable_path=_chromium(),
            args=CHROMIUM_FLAGS,
            headless=True,
            viewport={"width": 960, "height": 1400},
            device_scale_factor=1,
        )
        try:
            yield context
        finally:
            context.close()


@dataclass
class Opened:
    """A page opened from disk, and what it did: console messages, errors, requests, dialogs."""

    page: Any
    console: list[tuple[str, str]] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    requests: list[str] = field(default_factory=list)
    dialogs: list[str] = field(default_factory=list)

    def assert_clean(self, path: Path) -> None:
        """No console error, no page error, no dialog, and no request but the page's own file."""
        assert [m for m in self.console if m[0] in ("error", "warning")] == []
        assert self.errors == []
        assert self.dialogs == []
        assert self.requests == [path.resolve().as_uri()]


@pytest.fixture
def open_page(browser: Any) -> Iterator[Any]:
    pages: list[Any] = []

    def open_(path: Path, *, color_scheme: str = "light") -> Opened:
        page = browser.new_page()
        pages.append(page)
        page.emulate_media(color_scheme=color_scheme)
        opened = Opened(page)
        page.on("console", lambda m: opened.console.append((m.type, m.text)))
        page.on("pageerror", lambda e: opened.errors.append(str(e)))
        page.on("request", lambda r: opened.requests.append(r.url))

        def on_dialog(d: Any) -> None:
            opened.dialogs.append(d.message)
            d.dismiss()

        page.on("dialog", on_dialog)
        page.goto(path.resolve().as_uri())
        page.wait_for_load_state("load")
        return opened

    yield open_
    for page in pages:
        page.close()


def png_pixels(data: bytes) -> tuple[int, int, list[bytes]]:
    """(width, height, rows of RGBA bytes) of an 8-bit RGBA or RGB PNG, as Chromium writes them."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    pos, idat, width, height, kind = 8, b"", 0, 0, 6
    while pos < len(data):
        (length,) = struct.unpack(">I", data[pos : pos + 4])
        tag, body = data[pos + 4 : pos + 8], data[pos + 8 : pos + 8 + length]
        if tag == b"IHDR":
            width, height, depth, kind, _, _, interlace = struct.unpack(">IIBBBBB", body)
            assert depth == 8
            assert kind in (2, 6)
            assert interlace == 0
        elif tag == b"IDAT":
            idat += body
        pos += 12 + length
    bpp = 4 if kind == 6 else 3
    raw = zlib.decompress(idat)
    stride = width * bpp
    rows: list[bytes] = []
    prev = bytearray(stride)
    for y in range(height):
        f = raw[y * (stride + 1)]
        line = bytearray(raw[y * (stride + 1) + 1 : (y + 1) * (stride + 1)])
        for i in range(stride):
            a = line[i - bpp] if i >= bpp else 0
            b = prev[i]
            c = prev[i - bpp] if i >= bpp else 0
            if f == 1:
                line[i] = (line[i] + a) & 255
            elif f == 2:
                line[i] = (line[i] + b) & 255
            elif f == 3:
                line[i] = (line[i] + (a + b) // 2) & 255
            elif f == 4:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                line[i] = (line[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
        if bpp == 3:
            rows.append(bytes(v for j in range(width) for v in (*line[3 * j : 3 * j + 3], 255)))
        else:
            rows.append(bytes(line))
        prev = line
    return width, height, rows
