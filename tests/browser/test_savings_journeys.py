"""Savings and forecasts in a real browser against `make demo`, in English
and in Simplified Chinese: finance reads the savings card's headline, against the cheapest static
alternative that fits on the fleet (or that none fits), finds the same figures and every baseline's
definition on the report, whose tables add up as shown; in English it also requests a report up to
today (inclusive) and reads it back with that day as its last; a tenant engineer sees one
month-to-date figure on the portal's card and its budget card, and the forecast's definition."""

from __future__ import annotations

import csv
import re
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import date, timedelta
from decimal import Decimal

import pytest
from playwright.sync_api import Locator, Page, expect

from tests import clock

pytestmark = [pytest.mark.browser, pytest.mark.timeout(900)]

LANGUAGES = ["en", "zh-hans"]


def _amounts(text: str) -> list[Decimal]:
    return [Decimal(a.replace(",", "")) for a in re.findall(r"-?\d[\d,]*\.\d+(?= USD)", text)]


@contextmanager
def speaking(page: Page, language: str) -> Iterator[None]:
    """The user's language for the journey; English again afterwards (the choice is kept per user,
    and other journeys sign in as the same users)."""
    if language != "en":
        page.select_option("form.lang select", language)
        page.wait_for_load_state()
    expect(page.locator("html")).to_have_attribute("lang", language)
    try:
        yield
    finally:
        if language != "en":
            page.select_option("form.lang select", "en")
            page.wait_for_load_state()


def _day(day: date, language: str) -> str:
    """A date as the pages write it in the language (config/formats: one date format per language)."""
    return f"{day.year}年{day.month}月{day.day}日" if language == "zh-hans" else f"{day:%Y-%m-%d}"


def _adds_up(page: Page, testid: str) -> None:
    """Every column of a savings table: the rows shown add up to the total row shown."""
    rows = page.get_by_test_id(testid).locator("tbody tr")
    values = [_amounts(rows.nth(i).inner_text()) for i in range(rows.count())]
    *parts, total = values
    for column in range(len(total)):
        assert sum(p[column] for p in parts) == total[column], (testid, column, values)


KEYS = ("whole_card", "request_fraction", "fixed_profile")


def _on_card(block: Locator) -> dict[str, tuple[str, Decimal | None]]:
    """Each allocation on the savings card: its name, and its cost (None: not feasible)."""
    shown = {}
    for key in ("dynamic", *KEYS):
        cell = block.get_by_test_id(f"savings-alternative-{key}")
        text = cell.inner_text()
        name = cell.locator("xpath=preceding-sibling::dt[1]").inner_text().strip()
        shown[key] = (name, _amounts(text)[0] if "USD" in text else None)
    return shown


def _on_report(page: Page) -> dict[str, Decimal | None]:
    """Each static alternative's cost in the report's table (None: not feasible)."""
    table = page.get_by_test_id("alternatives")
    costs = {}
    for key in KEYS:
        cell = table.get_by_test_id(f"alternative-cost-{key}")
        costs[key] = _amounts(cell.inner_text())[0] if cell.count() else None
    return costs


@pytest.mark.parametrize("language", LANGUAGES)
def test_finance_reads_the_headline_against_the_cheapest_feasible_alternative(sign_in, language):
    s = sign_in("finance")
    page = s.page
    with speaking(page, language):
        # Last month holds the demo's simulated day, reported when the demo started.
        page.get_by_test_id("period-last-month").click()
        page.wait_for_load_state()
        block = page.get_by_test_id("savings-vs-static")
        last_month = (clock.now().date().replace(day=1) - timedelta(days=1)).replace(day=1)
        expect(block.get_by_test_id("savings-period")).to_contain_text(_day(last_month, language))
        card = _on_card(block)
        dynamic = card.pop("dynamic")[1]
        assert dynamic is not None
        figure = block.get_by_test_id("savings-headline-figure").inner_text()
        sentence = block.get_by_test_id("savings-headline-sentence").inner_text()
        feasible = {key: cost for key, (_, cost) in card.items() if cost is not None}
        if feasible:
            cheapest = min(feasible, key=lambda k: feasible[k])
            assert _amounts(figure)[0] == abs(feasible[cheapest] - dynamic), (figure, feasible, dynamic)
            assert card[cheapest][0] in sentence, (sentence, card)
        else:
            assert "USD" not in figure, figure  # none fits: nothing is priced
        block.get_by_test_id("savings-definitions-link").click()
        page.wait_for_load_state()
        assert page.url.endswith("#definitions"), page.url
        # The report shows the same headline and costs, and defines every baseline.
        expect(page.get_by_test_id("savings-headline-figure")).to_have_text(figure)
        assert _on_report(page) == {k: cost for k, (_, cost) in card.items()}
        terms = page.get_by_test_id("savings-definitions").locator("dt").all_inner_texts()
        for name, _ in card.values():
            assert name in terms, (name, terms)
        expect(page.get_by_test_id("study-note")).not_to_contain_text("docs/")
        _adds_up(page, "fleet-cost")
        _adds_up(page, "chargeback")
        s.shot(f"paired-report-fleet-{language}")


def test_finance_requests_a_report_to_today_and_downloads_it(sign_in):
    s = sign_in("finance")
    page = s.page
    # A report from the first of the month to today, today included.
    today = clock.now().date()
    s.goto("/reports/")
    page.fill("form.period input[name=start]", f"{today.replace(day=1):%Y-%m-%d}")
    page.fill("form.period input[name=end]", f"{today:%Y-%m-%d}")
    page.locator("form.period button[type=submit]").click()
    page.wait_for_load_state()
    assert re.search(r"/reports/\d+/$", page.url), page.url
    expect(page.get_by_test_id("fleet-cost")).to_be_visible(timeout=180_000)
    expect(page.get_by_test_id("report-period")).to_contain_text(f"{today.replace(day=1):%Y-%m-%d} – {today:%Y-%m-%d}")
    # Today is not over: its workload-days are left out of the per-workload-day figures, and said so.
    expect(page.get_by_test_id("partial-days")).to_contain_text(f"{today:%Y-%m-%d}")
    _adds_up(page, "fleet-cost")
    _adds_up(page, "chargeback")
    with page.expect_download() as download:
        page.get_by_test_id("report-csv").click()
    with open(download.value.path(), encoding="utf-8-sig") as fh:
        rows = list(csv.DictReader(fh))
    money_rows = [r for r in rows if r["section"] in ("alternatives", "fleet", "chargeback")]
    assert money_rows
    assert all(r["currency"] == "USD" for r in money_rows)
    assert all(re.fullmatch(r"-?\d+\.\d{2}", r["dynamic"]) for r in money_rows)
    with page.expect_download() as download:
        page.get_by_test_id("report-pdf").click()
    with open(download.value.path(), "rb") as pdf:
        assert pdf.read(4) == b"%PDF"


@pytest.mark.parametrize("language", LANGUAGES)
def test_tenant_engineer_sees_one_month_to_date_on_the_portal_and_its_budget(sign_in, language):
    s = sign_in("acme-engineer")
    page = s.page
    with speaking(page, language):
        assert page.url.endswith("/tenants/acme/"), page.url
        month_to_date = _amounts(page.get_by_test_id("mtd-cost").inner_text())
        budget = page.get_by_test_id("budget-status").inner_text()
        # "N % used (X USD)": the budget card's spend is the portal's month to date.
        assert month_to_date, (month_to_date, budget)
        assert month_to_date[-1] in _amounts(budget), (month_to_date, budget)
        expect(page.get_by_test_id("forecast")).to_contain_text("USD")
        expect(page.get_by_test_id("forecast-definition")).not_to_be_empty()
        s.shot(f"tenant-portal-forecast-{language}")
