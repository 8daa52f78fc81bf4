"""Browser tests: Playwright for Python driving Debian's Chromium against a live server.

One browser for the session, a fresh context (cookies) per test. Screenshots go to
var/screenshots/ in the checkout (CI keeps them as artifacts; the README shows two).
"""

import contextlib
import os
from pathlib import Path
from typing import NoReturn

import pytest

# The serving layer's live `manage.py serve` (tests/inference), for the playground test.
from tests.inference.conftest import live_engine_server, serve_data  # noqa: F401
from tests.registry.conftest import (  # noqa: F401  (fixtures, re-exported for these tests)
    ALICE_ACTOR,
    adapter,
    base_model,
    good_adapter_dir,
    tiny_base_dir,
)

CHROMIUM = os.environ.get("LORAPLEX_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-dev-shm-usage",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
SCREENSHOTS = Path(__file__).resolve().parents[2] / "var" / "screenshots"


@pytest.fixture(autouse=True)
def fast_passwords(settings):
    # Fast for users the live server (this process) checks; PBKDF2 stays available for a
    # user another process (the engine's `serve`) must check with its default hashers.
    settings.PASSWORD_HASHERS = [
        "django.contrib.auth.hashers.MD5PasswordHasher",
        "django.contrib.auth.hashers.PBKDF2PasswordHasher",
    ]


def browser_unavailable(message: str) -> NoReturn:
    """Skip on a developer's machine without a browser; fail in CI, which must run these."""
    if os.environ.get("LORAPLEX_REQUIRE_SERVICES") == "1":
        pytest.fail(f"{message} (LORAPLEX_REQUIRE_SERVICES=1: the browser tests must run)")
    pytest.skip(message)


def launch_chromium(stack: contextlib.ExitStack, executable: str = CHROMIUM):
    """Chromium under Playwright (closed with `stack`), or a skip or failure saying why not:
    not installed, Playwright not importable, or the browser not starting."""
    if not Path(executable).exists():
        browser_unavailable(f"Chromium is not installed at {executable}: apt-get install chromium")
    try:
        from playwright.sync_api import Error, sync_playwright
    except ImportError as exc:
        browser_unavailable(f"Playwright cannot be imported ({exc}): install requirements-dev.txt")
    playwright = stack.enter_context(sync_playwright())
    try:
        browser = playwright.chromium.launch(executable_path=executable, args=CHROMIUM_ARGS)
    except Error as exc:
        browser_unavailable(f"Chromium at {executable} did not start: {exc}")
    stack.callback(browser.close)
    return browser


@pytest.fixture(scope="package")
def browser():
    """One Chromium for these tests, closed before other packages' tests run.

    Playwright's sync API keeps its event loop running in this thread, so Django would refuse
    ORM calls from test bodies ("async context"); nothing runs concurrently with them, so the
    check is lifted while the browser lives, and only then.
    """
    with pytest.MonkeyPatch.context() as patch, contextlib.ExitStack() as stack:
        browser = launch_chromium(stack)
        patch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
        yield browser


@pytest.fixture
def page(browser):
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    context.set_default_timeout(30_000)
    page = context.new_page()
    errors = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    yield page
    context.close()
    assert not errors, f"JavaScript errors on the page: {errors}"


@pytest.fixture
def screenshot(page):
    """screenshot(name) saves the whole page as var/screenshots/<name>.png."""
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)

    def take(name: str, target=None) -> Path:
        path = SCREENSHOTS / f"{name}.png"
        (target or page).screenshot(path=str(path), **({} if target else {"full_page": True}))
        return path

    return take


def sign_in(page, base_url: str, email: str, password: str) -> None:
    page.goto(f"{base_url}/login/")
    page.fill("input[name=username]", email)
    page.fill("input[name=password]", password)
    page.click("button[type=submit]")
    page.wait_for_url(f"{base_url}/adapters/")
