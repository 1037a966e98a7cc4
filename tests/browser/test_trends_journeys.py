"""Trends in a real browser against the shared demo, in English and in Simplified Chinese: finance
shows this month on the dashboard and compares it with last month (the demo meters a day of each),
opens last month and finds the same figures there (the tenants' and the whole GPU cost), reads
the months' chart; then sorts and searches
Explore, whose level total is still the sum of its rows."""

from __future__ import annotations

import re
from datetime import date, timedelta
from decimal import Decimal

import pytest
from playwright.sync_api import Page, expect

from tests import clock
from tests.browser.test_savings_journeys import LANGUAGES, speaking

pytestmark = [pytest.mark.browser, pytest.mark.timeout(900)]


def _amount(text: str) -> Decimal:
    match = re.search(r"[−-]?\d[\d,]*\.\d+", text)
    assert match, text
    return Decimal(match.group(0).replace(",", "").replace("−", "-"))


def _day(day: date, language: str) -> str:
    return f"{day.year}年{day.month}月{day.day}日" if language == "zh-hans" else f"{day:%Y-%m-%d}"


def _show(page: Page, first: date, last: date) -> None:
    page.fill("form.period input[name=start]", f"{first:%Y-%m-%d}")
    page.fill("form.period input[name=end]", f"{last:%Y-%m-%d}")
    page.locator("form.period button[type=submit]").click()
    page.wait_for_load_state()


@pytest.mark.parametrize("language", LANGUAGES)
def test_finance_compares_a_month_with_the_month_before_and_sorts_and_searches_explore(sign_in, language):
    s = sign_in("finance")
    page = s.page
    today = clock.now().date()
    first = today.replace(day=1)
    last = (first + timedelta(days=32)).replace(day=1) - timedelta(days=1)
    before_last = first - timedelta(days=1)
    before_first = before_last.replace(day=1)
    with speaking(page, language):
        s.goto("/finance/")
        _show(page, first, last)
        period = page.get_by_test_id("comparison-period")
        expect(period).to_contain_text(_day(before_first, language))
        expect(period).to_contain_text(_day(before_last, language))
        table = page.get_by_test_id("comparison")
        current = _amount(table.get_by_test_id("comparison-current").inner_text())
        previous = _amount(table.get_by_test_id("comparison-previous").inner_text())
        assert current == _amount(page.get_by_test_id("attributed-cost").inner_text())
        assert _amount(table.get_by_test_id("comparison-total-change").inner_text()) == current - previous
        pct = table.get_by_test_id("comparison-total-change-pct").inner_text()
        if previous:
            assert _amount(pct) == round((current - previous) / previous * 100, 1), pct
        else:
            assert pct.strip() == "—"
        # Finance also sees the platform's idle and the fleet's whole GPU cost against the month before.
        fleet = _amount(table.get_by_test_id("comparison-fleet-current").inner_text())
        fleet_before = _amount(table.get_by_test_id("comparison-fleet-previous").inner_text())
        assert fleet == _amount(page.get_by_test_id("total-gpu-cost").inner_text())
        expect(page.get_by_test_id("months-chart").locator("svg.chart")).to_be_visible()
        months = page.get_by_test_id("months-table").get_by_test_id("month-total")
        expect(months).to_have_count(6)
        last_month_bar = _amount(months.nth(4).inner_text())
        s.shot(f"trends-dashboard-{language}")
        # Last month, opened from the comparison: the same figure as the previous period's and its bar.
        page.get_by_test_id("comparison-open-previous").click()
        page.wait_for_load_state()
        assert _amount(page.get_by_test_id("attributed-cost").inner_text()) == previous == last_month_bar
        assert _amount(page.get_by_test_id("total-gpu-cost").inner_text()) == fleet_before

        # Explore: sort by name, then search; the total is the rows shown.
        s.goto(f"/explore/?start={first:%Y-%m-%d}&end={last:%Y-%m-%d}")
        page.get_by_test_id("sort-name").click()
        page.wait_for_load_state()
        names = page.get_by_test_id("explore-row").evaluate_all("rows => rows.map(r => r.dataset.name)")
        labels = [page.get_by_test_id("explore-row").nth(i).locator("td").first.inner_text().casefold()
                  for i in range(len(names))]
        assert labels == sorted(labels), labels
        assert page.get_by_test_id("sort-name").locator("xpath=..").get_attribute("aria-sort") == "ascending"
        expect(page.get_by_test_id("explore-chart").locator("svg.chart")).to_be_visible()
        page.fill("form.period input[name=q]", "ACME")
        page.locator("form.period button[type=submit]").click()
        page.wait_for_load_state()
        rows = page.get_by_test_id("explore-row")
        expect(rows).to_have_count(1)
        assert rows.first.get_attribute("data-name") == "acme"
        expect(page.get_by_test_id("explore-search-note")).to_contain_text("ACME")
        row_cost = _amount(rows.first.locator("[data-sum=explore-cost]").inner_text())
        assert _amount(page.get_by_test_id("explore-total").inner_text()) == row_cost
        expect(rows.first.get_by_test_id("explore-change")).to_be_visible()
        s.shot(f"trends-explore-{language}")
        # An unknown column is refused with the reason.
        s.goto("/explore/?sort=price")
        assert s.last_status == 400
        expect(page.locator("body")).to_contain_text("sort")
        expect(page.locator("body")).to_contain_text("price")
