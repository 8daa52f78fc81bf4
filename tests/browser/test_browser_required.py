"""CI (LORAPLEX_REQUIRE_SERVICES=1) must run the browser tests: when Chromium is missing,
Playwright cannot be imported or the browser does not start, they fail instead of skipping.
A developer's machine without a browser skips them, saying why."""

import contextlib
import sys
from concurrent.futures import ThreadPoolExecutor

import pytest

from tests.browser.conftest import launch_chromium


@pytest.fixture(params=["ci", "developer"])
def where(request, monkeypatch):
    if request.param == "ci":
        monkeypatch.setenv("LORAPLEX_REQUIRE_SERVICES", "1")
        return pytest.fail.Exception
    monkeypatch.delenv("LORAPLEX_REQUIRE_SERVICES", raising=False)
    return pytest.skip.Exception


def test_a_missing_chromium(where):
    with contextlib.ExitStack() as stack, pytest.raises(where, match="not installed"):
        launch_chromium(stack, executable="/nonexistent/chromium")


def test_playwright_that_cannot_be_imported(where, monkeypatch):
    monkeypatch.setitem(sys.modules, "playwright.sync_api", None)  # import raises ImportError
    with contextlib.ExitStack() as stack, pytest.raises(where, match="Playwright cannot be"):
        launch_chromium(stack, executable="/bin/false")  # exists: the import is what fails


def test_a_browser_that_does_not_start(where):
    def attempt():
        with contextlib.ExitStack() as stack:
            launch_chromium(stack, executable="/bin/false")

    # In a thread of its own: the package's browser, if started, runs Playwright's event loop
    # in this one, and Playwright's sync API refuses to start inside a running loop.
    with ThreadPoolExecutor(1) as pool, pytest.raises(where, match="did not start"):
        pool.submit(attempt).result()
