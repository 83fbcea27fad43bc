"""Headless Chromium for the HTML report's tests: the system's browser (Debian's ``chromium``
package; ``STALLSCOPE_CHROMIUM`` names another), driven by Playwright, which downloads nothing.
Without a browser or Playwright every test here is skipped, and says why."""

from __future__ import annotations

import os
import shutil
import tempfile
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
