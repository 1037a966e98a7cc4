"""Savings and forecasts in a real browser against `make demo`, in English
and in Simplified Chinese: finance reads the organisation's savings with their currency, follows the
link to the definitions, requests a report up to today (inclusive) and reads it back with that day
as its last, its tables adding up as shown; a tenant engineer sees one month-to-date figure on the
portal's card and its budget card, and the forecast's definition."""

from __future__ import annotations

import csv
import re
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import date
from decimal import Decimal

import pytest
from playwright.sync_api import Page, expect

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
    for column in range(3):  # whole-card, dynamic, saving
        assert sum(p[column] for p in parts) == total[column], (testid, column, values)


@pytest.mark.parametrize("language", LANGUAGES)
def test_finance_reads_the_fleet_savings_and_requests_a_report_to_today(sign_in, language):
    s = sign_in("finance")
    page = s.page
    with speaking(page, language):
        # Last month holds the demo's simulated day, reported when the demo started.
        page.get_by_test_id("period-last-month").click()
        page.wait_for_load_state()
        block = page.get_by_test_id("savings-vs-static")
        for testid in ("savings-fleet", "savings-fleet-whole", "savings-fleet-dynamic"):
            expect(block.get_by_test_id(testid)).to_contain_text("USD")
        whole, dynamic = (_amounts(block.get_by_test_id(t).inner_text())[0]
                          for t in ("savings-fleet-whole", "savings-fleet-dynamic"))
        assert _amounts(block.get_by_test_id("savings-fleet").inner_text())[0] == whole - dynamic
        block.get_by_test_id("savings-definitions-link").click()
        page.wait_for_load_state()
        assert page.url.endswith("#definitions"), page.url
        expect(page.get_by_test_id("savings-definitions")).to_be_visible()
        _adds_up(page, "fleet-cost")
        _adds_up(page, "chargeback")
        s.shot(f"paired-report-fleet-{language}")

        # A report from the first of the month to today, today included.
        today = clock.now().date()
        s.goto("/reports/")
        page.fill("form.period input[name=start]", f"{today.replace(day=1):%Y-%m-%d}")
        page.fill("form.period input[name=end]", f"{today:%Y-%m-%d}")
        page.locator("form.period button[type=submit]").click()
        page.wait_for_load_state()
        assert re.search(r"/reports/\d+/$", page.url), page.url
        expect(page.get_by_test_id("fleet-cost")).to_be_visible(timeout=180_000)
        expect(page.get_by_test_id("report-period")).to_contain_text(
            f"{_day(today.replace(day=1), language)} – {_day(today, language)}")
        # Today is not over: its workload-days are left out of the per-workload-day figures, and said so.
        expect(page.get_by_test_id("partial-days")).to_contain_text(f"{today:%Y-%m-%d}")
        _adds_up(page, "fleet-cost")
        _adds_up(page, "chargeback")
        with page.expect_download() as download:
            page.get_by_test_id("report-csv").click()
        with open(download.value.path(), encoding="utf-8") as fh:
            rows = list(csv.DictReader(fh))
        money_rows = [r for r in rows if r["section"] in ("fleet", "chargeback")]
        assert money_rows
        assert all(r["currency"] == "USD" for r in money_rows)
        assert all(re.fullmatch(r"-?\d+\.\d{2}", r[c]) for r in money_rows for c in ("whole_card", "dynamic", "saving"))
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
