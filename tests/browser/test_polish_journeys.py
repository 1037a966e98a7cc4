"""Polish a user notices, in a real browser against `make demo`, each journey in
English and in Simplified Chinese: the live finance page refreshes its figures without wiping the
period being typed; each role lands on its own page after logging in at the login page (and an
explicit next wins); 403 and 404 are pages with the site's navigation; the audit log reads as
before/after with money formatted; one date format per language; and no page of the URL
configuration scrolls sideways at 390 or 1,400 px, for any role, in either language."""

from __future__ import annotations

import itertools
import re
from collections import Counter
from collections.abc import Iterator
from urllib.parse import parse_qs, urlsplit

import pytest
from django.urls import NoReverseMatch, Resolver404, URLPattern, URLResolver, get_resolver, resolve, reverse
from playwright.sync_api import Browser, BrowserContext, Page, ViewportSize, expect

from tests.demo_process import Demo

pytestmark = [pytest.mark.browser, pytest.mark.timeout(900)]

LANGUAGES = ["en", "zh-hans"]
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
    # The page's own timers on a clock the test moves (Playwright's fake clock): the refresh is due
    # when the test says, not 15 seconds of the suite later.
    page.clock.install()
    page.goto(demo.base + "/finance/")  # this month: live
    expect(page.locator('meta[name="live-refresh"]')).to_have_count(1)
    expect(page.locator("[data-live-note]")).to_be_visible()
    typed = "2026-01-15"
    page.locator("form.period input[name=start]").fill(typed)
    page.locator("form.period input[name=start]").focus()
    page.evaluate("document.querySelector('[data-live=dashboard]').dataset.beforeRefresh = 'yes'")
    refresh_s = float(page.locator('meta[name="live-refresh"]').get_attribute("content") or 0)
    with page.expect_response(lambda r: r.request.headers.get("x-live-refresh") == "1", timeout=30_000) as live:
        page.clock.fast_forward(int(refresh_s * 1000))
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


# --- No page scrolls sideways -------------------------------------------------------------------

WIDTHS = (1400, 390)
# URL names that are not pages a person reads: machine answers and downloads. A POST-only view
# needs no entry (it answers 405 to a GET, which the test checks), nor does an API view (DRF).
NOT_PAGES = {
    "healthz": "health as JSON, for probes and admins", "readyz": "readiness for the kubelet",
    "metrics": "Prometheus text", "metrics-opencost": "Prometheus text",
    "period-status": "a close's progress as JSON, for scripts",
    "invoice-download": "a file", "credit-note-download": "a file", "report-pdf": "a file", "report-csv": "a file",
}
# Pages a link offers only in a state the demo's own fleet never reaches, each measured by the
# journey that brings that state about (with `measure_layout`).
MEASURED_BY_THEIR_JOURNEY = {
    "rebalance-decide": "an approval's confirmation is linked only while a proposed plan frees a node, which "
                        "the demo's full nodes never allow; tests/browser/test_rebalance_journeys.py adds a "
                        "spare node and measures the page",
}
# Pages a person reaches by address rather than by a link, measured all the same: a tenant's own
# budget by its slug (the budgets page links each budget by its id).
BY_ADDRESS = {ADMIN: ["/budgets/acme/"]}
# Query keys that choose a period, not a different page.
_PERIOD_KEYS = frozenset({"start", "end"})
# Candidate values for a URL's arguments when checking that an unreached pattern is POST-only.
_ARGUMENT_GUESSES = ("0", "x", "2026-11", "csv", "approve", "send")


def _page_patterns() -> dict[str, URLPattern]:
    """Every named URL pattern of the URL configuration that is not an API (DRF) view."""
    out: dict[str, URLPattern] = {}

    def walk(patterns: list[URLPattern | URLResolver]) -> None:
        for p in patterns:
            if isinstance(p, URLResolver):
                walk(p.url_patterns)
            elif p.name and not isinstance(getattr(p.callback, "cls", None), type):
                out[p.name] = p

    walk(get_resolver().url_patterns)
    return out


def _key(url: str, base: str) -> tuple[str, frozenset[str]] | None:
    """(URL name, query keys other than the period's) of a link on this site, or None."""
    parts = urlsplit(url)
    if f"{parts.scheme}://{parts.netloc}" != base:
        return None
    try:
        match = resolve(parts.path)
    except Resolver404:
        return None
    keys = frozenset(parse_qs(parts.query)) - _PERIOD_KEYS
    return None if "format" in keys else (match.url_name or "", keys)


def _guess_url(name: str, pattern: URLPattern) -> str | None:
    """A URL of `pattern` with made-up arguments that fit it, or None."""
    groups = list(pattern.pattern.regex.groupindex)
    for values in itertools.product(_ARGUMENT_GUESSES, repeat=len(groups)):
        try:
            return reverse(name, kwargs=dict(zip(groups, values, strict=True)))
        except NoReverseMatch:
            continue
    return None


def measure_layout(page: Page, where: str) -> list[str]:
    """`_measure` for a journey that goes on afterwards: the window is given back its size."""
    size = page.viewport_size
    try:
        return _measure(page, where)
    finally:
        if size:
            page.set_viewport_size(size)


def _measure(page: Page, where: str) -> list[str]:
    """What is wrong with the page as laid out now at each width: the document wider than the
    window, the header not one row at 1,400 px or a header control off screen at 390 px, a chart's
    legend or axis labels too small to read."""
    problems = []
    for width in WIDTHS:
        page.set_viewport_size({"width": width, "height": 900})
        found = page.evaluate(_LAYOUT_JS, width)
        problems += [f"{where} at {width} px: {p}" for p in found]
    return problems


_LAYOUT_JS = """(width) => {
  const out = [];
  const doc = document.documentElement;
  if (doc.scrollWidth > doc.clientWidth) out.push(`the page is ${doc.scrollWidth} px wide`);
  const shown = [...document.querySelectorAll('header.top a, header.top summary, header.top select, header.top button')]
    .filter(e => e.offsetParent !== null && !e.closest('details:not([open]) > .menu-items'))
    .map(e => [e, e.getBoundingClientRect()]);
  const off = shown.filter(([e, r]) => r.left < 0 || r.right > width).map(([e]) => e.textContent.trim());
  if (off.length) out.push(`header controls off screen: ${off}`);
  if (width >= 1400) {
    const tops = new Set(shown.map(([e, r]) => Math.round((r.top + r.bottom) / 20)));
    if (tops.size > 1) out.push(`the header has ${tops.size} rows`);
  }
  for (const li of document.querySelectorAll('ul.chart-legend li'))
    if (parseFloat(getComputedStyle(li).fontSize) < 12) out.push(`legend text ${getComputedStyle(li).fontSize}`);
  for (const t of document.querySelectorAll('svg.chart text.tick'))
    if (t.getBoundingClientRect().height && t.getBoundingClientRect().height < 9)
      out.push(`axis label ${t.textContent} ${t.getBoundingClientRect().height.toFixed(1)} px high`);
  return [...new Set(out)];
}"""


def _crawl(page: Page, base: str, pages: dict[str, URLPattern], by_address: list[str]) -> list[str]:
    """The URLs of this user's pages: from where they land (and `by_address`), every link on this
    site to a page, one URL per page and set of query keys (Explore's levels are each their own),
    at most 6 per page."""
    queue, seen, per_name = [page.url, *(base + path for path in by_address)], set(), Counter[str]()
    urls = []
    while queue:
        url = queue.pop(0)
        key = _key(url, base)
        if key is None or key in seen or key[0] not in pages or per_name[key[0]] >= 6:
            continue
        seen.add(key)
        per_name[key[0]] += 1
        page.goto(url)
        urls.append(url)
        queue += page.eval_on_selector_all("a[href]:not([download])", "links => links.map(a => a.href)")
    return urls


_UPCOMING_EDGES_JS = """() => {
  const table = document.querySelector('[data-testid="upcoming-lines"]');
  const box = table.closest('.table-box').getBoundingClientRect();
  const right = s => [...table.querySelectorAll(s)].map(e => e.getBoundingClientRect().right);
  return {box: [box.left, box.right], scroll: [table.parentElement.scrollWidth, table.parentElement.clientWidth],
          amounts: [...right('[data-testid="upcoming-amount-head"]'), ...right('td[data-sum="upcoming"]'),
                    ...right('[data-testid="upcoming-total"]')]};
}"""


@pytest.mark.parametrize("language", LANGUAGES)
def test_the_upcoming_invoices_amounts_and_total_are_seen_at_390_px_without_scrolling_the_table(
        open_browser, demo, language):
    """The upcoming invoice gained quantity and unit-price columns; at 390 px they fold into the
    line's description, so the Amount column and the total lie inside the window and the table's box
    does not scroll."""
    page = open_browser(TENANT, language=language, viewport={"width": 390, "height": 900})
    page.goto(demo.base + "/tenants/acme/")
    expect(page.get_by_test_id("upcoming-lines")).to_be_visible()
    edges = page.evaluate(_UPCOMING_EDGES_JS)
    assert edges["amounts"], edges
    assert all(right <= min(390, edges["box"][1]) + 0.5 for right in edges["amounts"]), edges
    assert edges["scroll"][0] <= edges["scroll"][1], edges  # nothing hidden behind the table's scroll
    expect(page.get_by_test_id("upcoming-unit-price").first).to_be_hidden()
    expect(page.get_by_test_id("upcoming-line-stacked").first).to_be_visible()
    page.set_viewport_size({"width": 1400, "height": 900})  # wide: the columns, not the folded line
    expect(page.get_by_test_id("upcoming-unit-price").first).to_be_visible()
    expect(page.get_by_test_id("upcoming-line-stacked").first).to_be_hidden()


def test_no_page_scrolls_sideways_at_390_or_1400_px_for_any_role_in_either_language(open_browser, browser, demo):
    """Every page of the URL configuration, as the role that sees it (found by following links from
    where the role lands, so a page added later is covered once something links to it), in English
    and Simplified Chinese, at 1,400 and 390 px: the page never scrolls sideways, the header is one
    row at 1,400 px and whole at 390, chart legends and axis labels stay readable. One browser
    context per role, each page loaded once per language and resized rather than reloaded. The
    credit note's confirmation (a POST's answer that writes nothing), the 404 page and the login
    page are measured too; a pattern no link reached must be POST-only or named in NOT_PAGES."""
    pages = _page_patterns()
    problems: list[str] = []
    reached = {"login", "credit-note-issue"}
    for username in (FINANCE, ADMIN, TENANT):
        page = open_browser(username)
        urls = _crawl(page, demo.base, pages, BY_ADDRESS.get(username, []))
        reached |= {key[0] for url in urls if (key := _key(url, demo.base))}
        for language in LANGUAGES:
            _speak(page, language)
            for url in urls:
                page.goto(url)
                problems += _measure(page, f"{username} {language} {url.removeprefix(demo.base)}")
            if username == FINANCE:
                problems += _credit_note_confirmation(page, urls, f"{username} {language}")
                page.goto(demo.base + "/no-such-page/")
                problems += _measure(page, f"{username} {language} 404")
        _speak(page, "en")
        if username == ADMIN:
            unreached = [f"{name} ({url})" for name, url in _unreached(page, demo.base, pages, reached)]
        page.context.close()
    anonymous = browser.new_context().new_page()
    for language in LANGUAGES:
        anonymous.goto(demo.base + "/accounts/login/")
        _speak(anonymous, language)
        problems += _measure(anonymous, f"anonymous {language} /accounts/login/")
    anonymous.context.close()
    assert problems == [], "\n".join(problems)
    assert unreached == [], f"pages no link reached: link them, or name them in NOT_PAGES with why: {unreached}"


def _credit_note_confirmation(page: Page, urls: list[str], where: str) -> list[str]:
    """Fill an invoice's credit-note form and measure the confirmation it answers (nothing issued)."""
    for url in urls:
        if "/invoices/VGL-" in url:
            page.goto(url)
            form = page.get_by_test_id("credit-note-form")
            if form.count():
                form.locator("input[name=amount]").fill("0.01")
                form.locator("textarea[name=reason]").fill("layout check, never confirmed")
                form.locator("button[type=submit]").click()
                page.wait_for_load_state()
                expect(page.get_by_test_id("credit-note-confirm")).to_be_visible()
                return _measure(page, f"{where} credit note confirmation")
    return [f"{where}: no invoice with a credit-note form, so its confirmation was not measured"]


def _unreached(page: Page, base: str, pages: dict[str, URLPattern], reached: set[str]) -> list[tuple[str, str | None]]:
    """Patterns no link reached that are neither POST-only (405 to a GET, signed in) nor in NOT_PAGES."""
    out = []
    for name, pattern in pages.items():
        if name in reached or name in NOT_PAGES or name in MEASURED_BY_THEIR_JOURNEY:
            continue
        url = _guess_url(name, pattern)
        if url is None or page.request.get(base + url, max_redirects=0).status != 405:
            out.append((name, url))
    return out
