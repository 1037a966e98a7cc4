"""Browser tests: Playwright (Python) driving Debian's Chromium against `make demo` — the real
product (gunicorn, Celery worker and beat, simulated agents) on loopback.

Never `playwright install`: the browser is the system's /usr/bin/chromium, which `make test`
installs with apt. The journeys' screenshots are taken when $VGPU_SCREENSHOTS_DIR is set (`make
screenshots` sets it) and go there; a failed journey's pages are saved there, or else to a
temporary folder.
"""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Generator, Iterator
from pathlib import Path

import pytest
from playwright.sync_api import Browser, BrowserContext, Locator, Page, expect, sync_playwright

from tests.demo_process import Demo

CHROMIUM = os.environ.get("VGPU_CHROMIUM", "/usr/bin/chromium")
SHOTS_WANTED = bool(os.environ.get("VGPU_SCREENSHOTS_DIR"))
# The flags a headless Chromium needs as root on a machine with no outside network.
CHROMIUM_ARGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
]


@pytest.fixture(scope="package")
def browser() -> Iterator[Browser]:
    """One Chromium for the journeys of this folder, closed after the last of them: Playwright's
    sync API holds an asyncio loop on the thread while it runs, and Django refuses database work
    in a running loop, so a session-long one broke every database test a pytest-xdist worker
    ran after the journeys (SynchronousOnlyOperation)."""
    if not (Path(CHROMIUM).exists() or shutil.which(CHROMIUM)):
        pytest.fail(f"{CHROMIUM} is missing: `make test` installs Debian's chromium (apt-get install chromium)")
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, env=_browser_env())
        yield b
        b.close()


def _browser_env() -> dict[str, str | float | bool]:
    """The browser is the user's machine, not the product: under `make test-dates` it keeps the
    real clock (libfaketime slows Chromium down until page loads time out). The server's cookies
    still outlive it, since the faked instants lie ahead of the real clock."""
    return {k: v for k, v in os.environ.items() if k != "LD_PRELOAD" and not k.startswith("FAKETIME")}


@pytest.fixture(scope="session")
def screenshot_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    target = os.environ.get("VGPU_SCREENSHOTS_DIR")
    path = Path(target) if target else tmp_path_factory.mktemp("screenshots")
    path.mkdir(parents=True, exist_ok=True)
    return path


def nav_link(page: Page, name: str) -> Locator:
    """The header's link called `name`, visible: the menu that holds it (Billing, Platform, the
    user's) opened first, as a person opens it."""
    link = page.locator("header.top").get_by_role("link", name=name, exact=True)
    # By its text, not its role: a link in a closed menu is hidden, and roles only find what shows.
    # (`has` is searched inside each menu, so it is written relative to the menu.)
    menu = page.locator("header.top details.menu").filter(
        has=page.locator("a").filter(has_text=re.compile(f"^{re.escape(name)}$")))
    if menu.count() and menu.get_attribute("open") is None:
        menu.locator("summary").click()
    return link


class Session:
    """One signed-in user in their own browser context (cookies are not shared)."""

    def __init__(self, context: BrowserContext, page: Page, demo: Demo, screenshots: Path) -> None:
        self.context, self.page, self.demo, self.screenshots = context, page, demo, screenshots

    def goto(self, path: str) -> Page:
        response = self.page.goto(self.demo.base + path)
        assert response is not None
        self.last_status = response.status
        return self.page

    def shot(self, name: str) -> None:
        """A full-page screenshot for `make screenshots`. Nothing else reads them, and each is about
        0.2 s of the browser's CPU on the suite's longest chain (the shared demo's), sixty a run."""
        if SHOTS_WANTED:
            self.page.screenshot(path=str(self.screenshots / f"{name}.png"), full_page=True)


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None],
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    report = yield
    if report.when == "call":
        item.stash[_FAILED] = report.failed
    return report


_FAILED = pytest.StashKey[bool]()


@pytest.fixture
def sign_in(request: pytest.FixtureRequest, browser: Browser, demo: Demo, screenshot_dir: Path) -> Iterator:
    contexts: list[BrowserContext] = []
    sessions: list[Session] = []

    def login(username: str, *, locale: str = "en-US", saved_language: bool = False) -> Session:
        context = browser.new_context(locale=locale, viewport={"width": 1360, "height": 900}, accept_downloads=True)
        contexts.append(context)
        page = context.new_page()
        page.set_default_timeout(20_000)
        page.goto(demo.base + "/")
        page.fill("input[name=username]", username)
        page.fill("input[name=password]", demo.passwords[username])
        page.click("button[type=submit]")
        page.wait_for_load_state()
        assert "/accounts/login/" not in page.url, page.content()[:2000]
        # A user's chosen language is saved on the user and outlives the session: a journey that
        # switched this user's language leaves it for the next one. Each journey starts in the
        # language its browser asks for, whatever ran before it (`saved_language`: as saved, for
        # the journey that checks it is kept).
        language = "zh-hans" if locale.startswith("zh") else "en"
        if not saved_language and page.locator("html").get_attribute("lang") != language:
            page.select_option("form.lang select", language)
            page.wait_for_load_state()
            expect(page.locator("html")).to_have_attribute("lang", language)
        session = Session(context, page, demo, screenshot_dir)
        sessions.append(session)
        return session

    yield login
    if request.node.stash.get(_FAILED, False):
        # What each browser showed when the test failed: for whoever reads the CI log.
        for i, session in enumerate(sessions):
            name = f"FAILED-{request.node.name}-{i}"
            session.page.screenshot(path=str(screenshot_dir / f"{name}.png"), full_page=True)
            (screenshot_dir / f"{name}.html").write_text(session.page.content(), encoding="utf-8")
            print(f"browser {i} was at {session.page.url}; page saved as {screenshot_dir / name}.html/.png")  # noqa: T201 - a failure's report, which pytest shows with the failure
    for context in contexts:
        context.close()
