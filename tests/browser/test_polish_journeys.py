"""Polish a user notices, in a real browser against `make demo`, each journey in
English and in Simplified Chinese: the live finance page refreshes its figures without wiping the
period being typed; each role lands on its own page after logging in at the login page (and an
explicit next wins); 403 and 404 are pages with the site's navigation; the audit log reads as
before/after with money formatted; one date format per language; at 390 px wide the header is
whole and the page never scrolls sideways."""

from __future__ import annotations

import re
from collections.abc import Iterator

import pytest
from playwright.sync_api import Browser, BrowserContext, Page, ViewportSize, expect

from tests.demo_process import Demo

pytestmark = [pytest.mark.browser, pytest.mark.timeout(900)]

LANGUAGES = ["en", "zh-hans"]
PHONE: ViewportSize = {"width": 390, "height": 844}
# The demo's users, by what they do.
FINANCE, ADMIN, TENANT = "finance", "admin", "acme-engineer"


@pytest.fixture
def open_browser(browser: Browser, demo: Demo) -> Iterator:
    """Log a demo user in through the login page (no `next`), in a context of the given size and
    language; each user is switched back to English afterwards, since the choice is stored on the
    user and the other journeys of this demo expect English."""
    contexts: list[BrowserContext] = []
    users: set[str] = set()

    def login(username: str, *, language: str = "en", viewport: ViewportSize | None = None,
              next_path: str = "/accounts/login/") -> Page:
        context = browser.new_context(locale="zh-CN" if language == "zh-hans" else "en-US",
                                      viewport=viewport or {"width": 1360, "height": 900})
        contexts.append(context)
        page = context.new_page()
        page.set_default_timeout(20_000)
        page.goto(demo.base + next_path)
        page.fill("input[name=username]", username)
        page.fill("input[name=password]", demo.passwords[username])
        page.locator("main button[type=submit]").click()
        page.wait_for_load_state()
        assert "/accounts/login/" not in page.url, page.content()[:2000]
        users.add(username)
        _speak(page, language)
        return page

    yield login
    for context in contexts:
        context.close()
    for username in sorted(users):
        page = login(username)  # login() switches the stored language back to English
        page.context.close()


def _speak(page: Page, language: str) -> None:
    if page.locator("html").get_attribute("lang") != language:
        page.select_option("form.lang select", language)
        page.wait_for_load_state()
    expect(page.locator("html")).to_have_attribute("lang", language)


@pytest.mark.parametrize("language", LANGUAGES)
def test_the_live_finance_page_keeps_a_typed_period_while_its_figures_refresh(open_browser, demo, language):
    page = open_browser(FINANCE, language=language)
    page.goto(demo.base + "/finance/")  # this month: live
    expect(page.locator('meta[name="live-refresh"]')).to_have_count(1)
    expect(page.locator("[data-live-note]")).to_be_visible()
    typed = "2026-01-15"
    page.locator("form.period input[name=start]").fill(typed)
    page.locator("form.period input[name=start]").focus()
    page.evaluate("document.querySelector('[data-live=dashboard]').dataset.beforeRefresh = 'yes'")
    with page.expect_response(lambda r: r.request.headers.get("x-live-refresh") == "1", timeout=30_000) as live:
        # live.js sets data-live-refreshes at the first swap (a selector, not a function: the
        # pages' Content-Security-Policy forbids the eval a string function would need).
        page.wait_for_selector("html[data-live-refreshes]", state="attached", timeout=30_000)
    assert live.value.status == 200
    assert live.value.url.split("?")[0].endswith("/finance/")
    # The figures' region is the fresh one; the form is the one the user was typing in.
    assert page.evaluate("document.querySelector('[data-live=dashboard]').dataset.beforeRefresh") is None
    assert page.locator("form.period input[name=start]").input_value() == typed
    assert page.evaluate("document.activeElement.name") == "start"
    expect(page.get_by_test_id("total-gpu-cost")).to_be_visible()
    expect(page.locator("[data-live-note]")).to_be_visible()
    assert page.url.endswith("/finance/")  # never reloaded


@pytest.mark.parametrize("language", LANGUAGES)
def test_each_role_lands_on_its_own_page_after_logging_in(open_browser, language):
    for username, landing in ((FINANCE, "/finance/"), (ADMIN, "/nodes/"), (TENANT, "/tenants/acme/")):
        page = open_browser(username, language=language)
        assert page.url.endswith(landing), (username, page.url)
        page.context.close()
    # Asked for a page before logging in: that page, not the role's landing.
    page = open_browser(TENANT, language=language, next_path="/budgets/")
    assert page.url.endswith("/budgets/"), page.url


@pytest.mark.parametrize("language", LANGUAGES)
def test_403_and_404_are_pages_with_the_navigation_and_a_way_back(open_browser, demo, language):
    page = open_browser(TENANT, language=language)
    forbidden = page.goto(demo.base + "/audit/")
    assert forbidden is not None
    assert forbidden.status == 403
    expect(page.get_by_test_id("error-403")).to_be_visible()
    expect(page.get_by_test_id("nav-my-tenant")).to_be_visible()
    expect(page.locator("html")).to_have_attribute("lang", language)
    missing = page.goto(demo.base + "/tenants/globex/")
    assert missing is not None
    assert missing.status == 404
    expect(page.get_by_test_id("error-404")).to_be_visible()
    expect(page.get_by_test_id("nav-my-tenant")).to_be_visible()
    page.get_by_test_id("error-home").click()
    page.wait_for_load_state()
    assert page.url.endswith("/tenants/acme/"), page.url


_ISO_DAY = re.compile(r"\b20\d\d-\d\d-\d\d\b")
_ENGLISH_MONTH = re.compile(r"\b(Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec)[a-z]*\.? \d{1,2}, 20\d\d")
_CHINESE_DAY = re.compile(r"20\d\d年\d{1,2}月\d{1,2}日")


@pytest.mark.parametrize("language", LANGUAGES)
def test_the_audit_log_reads_as_before_and_after_in_the_users_formats(open_browser, demo, language):
    page = open_browser(ADMIN, language=language)
    page.goto(demo.base + "/audit/?action=rate_card.")
    log = page.get_by_test_id("audit-log")
    expect(log).to_be_visible()
    text = log.inner_text()
    # No raw Python dicts.
    assert "{'" not in text, text[:500]
    assert "': " not in text, text[:500]
    price = log.locator('tr[data-field="price_per_gpu_hour"] td[data-side="after"]').first
    expect(price).to_contain_text("USD")
    when = log.locator("time").first.inner_text()
    if language == "en":
        assert _ISO_DAY.search(when), when
        assert not _CHINESE_DAY.search(text), when
    else:
        assert _CHINESE_DAY.search(when), when
        assert not _ISO_DAY.search(text), when


@pytest.mark.parametrize("language", LANGUAGES)
def test_each_page_writes_dates_one_way(open_browser, demo, language):
    pages = {FINANCE: ["/finance/", "/periods/", "/invoices/", "/reports/", "/rate-cards/", "/commitments/"],
             ADMIN: ["/nodes/", "/audit/", "/sla-tiers/", "/rebalance/"]}
    for username, paths in pages.items():
        page = open_browser(username, language=language)
        for path in paths:
            page.goto(demo.base + path)
            text = _dates_text(page)
            if language == "en":
                assert not _ENGLISH_MONTH.search(text), (path, text[:400])
                assert not _CHINESE_DAY.search(text), (path, text[:400])
            else:
                assert not _ISO_DAY.search(text), (path, text[:400])
                assert not _ENGLISH_MONTH.search(text), (path, text[:400])
        page.context.close()


def _dates_text(page: Page) -> str:
    """What the page says in words; identifiers that embed a day (invoice numbers, code) are not dates."""
    return page.evaluate("""() => {
        const main = document.querySelector('main').cloneNode(true);
        main.querySelectorAll('code, pre, input, select, textarea, script').forEach(e => e.remove());
        return main.innerText;
    }""")


@pytest.mark.parametrize("language", LANGUAGES)
def test_at_390_px_the_header_is_whole_and_nothing_scrolls_sideways(open_browser, demo, language):
    pages = {FINANCE: ["/finance/", "/invoices/", "/periods/", "/reports/", "/budgets/", "/commitments/", "/exports/"],
             ADMIN: ["/nodes/", "/rate-cards/", "/sla-tiers/", "/rebalance/", "/audit/"],
             TENANT: ["/tenants/acme/", "/invoices/"]}
    for username, paths in pages.items():
        page = open_browser(username, language=language, viewport=PHONE)
        for path in paths:
            page.goto(demo.base + path)
            width = page.evaluate("document.documentElement.scrollWidth")
            assert width <= PHONE["width"], (username, path, width)
            # Every link and control of the header lies inside the screen.
            outside = page.evaluate("""(w) => [...document.querySelectorAll('header.top a, header.top button, header.top select')]
                .filter(e => { const r = e.getBoundingClientRect(); return r.left < 0 || r.right > w || r.width === 0; })
                .map(e => e.textContent.trim())""", PHONE["width"])
            assert outside == [], (username, path, outside)
            expect(page.locator("header.top .brand")).to_be_in_viewport()
        page.screenshot(path=str(demo.data_dir / f"phone-{username}-{language}.png"), full_page=True)
        page.context.close()
