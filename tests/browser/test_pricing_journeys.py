"""Pricing models in a real browser, in English and Simplified Chinese: finance prices the demo's
A100s by a reserved commitment and by their amortised on-prem cost, reads each rate beside the
market rate card, and retires them again (before they start, so the shared demo's ledger keeps its
prices). Selectors are test ids and field names, never texts."""

from __future__ import annotations

import re
from decimal import ROUND_HALF_UP, Decimal

import pytest
from playwright.sync_api import Page, expect

from tests.browser.test_forms_journeys import LANGUAGES, session_in  # noqa: F401 - the fixture, shared

pytestmark = [pytest.mark.browser, pytest.mark.timeout(600)]

MODEL = "NVIDIA A100-SXM4-80GB"


# How a date field shows today in each language (the page writes dates as the language does).
TODAY_WRITTEN = {"en": r"\d{4}-\d{2}-\d{2}", "zh-hans": r"\d{4}年\d{1,2}月\d{1,2}日"}


def model_prices(page: Page) -> set[Decimal]:
    """The prices of MODEL's current and upcoming rate cards, as the rate cards page shows them
    ("5.12 USD", the row's first number)."""
    rows = page.locator("[data-testid=rate-card-table] tbody").filter(has_text=MODEL).locator(
        "tr.current, tr.future")
    return {Decimal(row.locator("td.num").first.inner_text().split()[0].replace(",", ""))
            for row in rows.all()}


def shown_market(page: Page, commitment: str) -> Decimal:
    """The market rate a commitment's row shows beside its own (six places)."""
    text = page.get_by_test_id(f"commitment-vs-market-{commitment}").inner_text()
    found = re.search(r"\d[\d,]*\.\d{6}", text)
    assert found, text
    return Decimal(found.group().replace(",", ""))


def fill(page: Page, form_id: str, values: dict[str, str]) -> None:
    form = page.get_by_test_id(form_id)
    for name, value in values.items():
        field = form.locator(f"[name={name}]")
        if field.evaluate("e => e.tagName") == "SELECT":
            field.select_option(value)
        else:
            field.fill(value)


def newest_commitment(page: Page) -> str:
    ids = [int(t.rsplit("-", 1)[1]) for t in page.locator("tr[data-testid^=commitment-]").evaluate_all(
        "rows => rows.map(r => r.dataset.testid)") if re.fullmatch(r"commitment-\d+", t)]
    return str(max(ids))


def retire(page: Page, commitment: str) -> None:
    form = page.get_by_test_id(f"retire-commitment-{commitment}")
    form.locator("input[name=reason]").fill("browser journey")
    form.locator("input[name=confirm]").check()
    form.locator("button[type=submit]").click()
    page.wait_for_load_state()
    expect(page.get_by_test_id(f"retire-commitment-{commitment}")).to_have_count(0)
    expect(page.get_by_test_id(f"commitment-{commitment}")).to_be_visible()


@pytest.mark.parametrize("language", LANGUAGES)
def test_finance_prices_cards_by_commitment_and_by_amortised_cost(session_in, language):  # noqa: F811 - the fixture
    s = session_in("finance", language)
    page = s.goto("/rate-cards/")
    # The market rate is the model's card in effect: the demo's 5.12 unless another journey on the
    # shared demo has priced the model since (from the next minute, so it may still be upcoming).
    markets = model_prices(page)
    page.get_by_test_id("rate-cards-commitments").click()
    page.wait_for_load_state()
    assert page.url.endswith("/commitments/")
    today = page.get_by_test_id("reserved-form").locator("input[name=term_start]").input_value()
    assert re.fullmatch(TODAY_WRITTEN[language], today), today  # today, written the language's way

    # A reserved commitment: 8 cards at 2.90 against the market rate.
    fill(page, "reserved-form", {"gpu_model": MODEL, "cards": "8", "price_per_gpu_hour": "2.90", "currency": "USD",
                                 "term_years": "3", "note": "Browser journey: reserved contract R-1"})
    page.get_by_test_id("reserved-submit").click()
    page.wait_for_load_state()
    reserved = newest_commitment(page)
    expect(page.get_by_test_id(f"commitment-rate-{reserved}")).to_contain_text("2.900000")
    market = shown_market(page, reserved)
    assert market in markets, (market, markets)
    below = (1 - Decimal("2.90") / market) * 100
    expect(page.get_by_test_id(f"commitment-vs-market-{reserved}")).to_contain_text(
        f"{below.quantize(Decimal('0.1'), ROUND_HALF_UP)} %")

    # Refused: a commitment in another currency than the model's cards; nothing is saved.
    fill(page, "on-prem-form", {"gpu_model": MODEL, "cards": "4", "purchase_price": "15000", "term_years": "5",
                                "power_watts": "400", "energy_price_per_kwh": "0.15",
                                "facility_cost_per_year": "1200", "currency": "EUR", "note": "Asset record A-9"})
    page.get_by_test_id("on-prem-submit").click()
    page.wait_for_load_state()
    expect(page.get_by_test_id("on-prem-form-error")).to_contain_text("USD")
    assert newest_commitment(page) == reserved
    # The same cards in the model's currency: their amortised rate and its parts beside the market rate.
    fill(page, "on-prem-form", {"currency": "USD"})
    page.get_by_test_id("on-prem-submit").click()
    page.wait_for_load_state()
    on_prem = newest_commitment(page)
    assert on_prem != reserved
    expect(page.get_by_test_id(f"commitment-amortised-{on_prem}")).to_be_visible()
    assert shown_market(page, on_prem) in markets
    s.shot(f"commitments-{language}")

    for commitment in (reserved, on_prem):
        retire(page, commitment)
