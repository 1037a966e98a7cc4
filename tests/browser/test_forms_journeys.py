"""Every form of the product submitted in a real browser, in English and in Simplified Chinese
(forms that refuse what they cannot keep): login, the language switch, the date ranges of the finance dashboard, the tenant
portal and the savings reports (their inputs written as the chosen language writes a date, not in
the browser's locale, and read back), a budget (refused while warn is above enforce or an email is not one),
a rate card (a price of 0 only once confirmed; a mistaken card retired with a confirmation), and
an SLA tier created, edited and retired. Selectors are test ids and field names, never texts."""

from __future__ import annotations

import re
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from urllib.parse import parse_qs, urlsplit

import pytest
from playwright.sync_api import Page, expect

pytestmark = [pytest.mark.browser, pytest.mark.timeout(900)]

LANGUAGES = ["en", "zh-hans"]
BROWSER_LOCALE = {"en": "en-US", "zh-hans": "zh-CN"}
# A date as each language writes it on the page (config/formats).
DATE_IN = {"en": re.compile(r"^\d{4}-\d{2}-\d{2}$"), "zh-hans": re.compile(r"^\d{4}年\d{1,2}月\d{1,2}日$")}


@pytest.fixture
def session_in(sign_in) -> Iterator:
    """Sign in with the browser's locale set to `language`, choose `language` in the switch, and
    switch back to English afterwards: the choice is stored on the demo's user, which the other
    journeys share."""
    used = []

    def open_session(username: str, language: str):
        session = sign_in(username, locale=BROWSER_LOCALE[language])
        used.append(session)
        switch_language(session.page, language)
        return session

    yield open_session
    for session in used:
        switch_language(session.page, "en")


def switch_language(page: Page, language: str) -> None:
    page.select_option("form.lang select", language)
    page.wait_for_load_state()
    expect(page.locator("html")).to_have_attribute("lang", language)


def submit_period(page: Page, language: str) -> tuple[str, str]:
    """Submit the page's date range as it is prefilled: both inputs written the language's way."""
    start, end = page.locator("form.period input[name=start]"), page.locator("form.period input[name=end]")
    values = start.input_value(), end.input_value()
    assert all(DATE_IN[language].match(v) for v in values), values
    page.locator("form.period:has(input[name=start]) button[type=submit]").click()
    page.wait_for_load_state()
    return values


@pytest.mark.parametrize("language", LANGUAGES)
def test_date_ranges_submit_in_every_language(session_in, language):
    s = session_in("finance", language)
    page = s.goto("/finance/")
    start, end = submit_period(page, language)
    assert parse_qs(urlsplit(page.url).query) == {"start": [start], "end": [end]}, page.url
    expect(page.get_by_test_id("total-gpu-cost")).to_be_visible()
    assert (page.locator("form.period input[name=start]").input_value(), page.locator("form.period input[name=end]").input_value()) == (
        start, end)
    # Last month through the quick link (ISO in the link), then the same range again through the form.
    page.get_by_test_id("period-last-month").click()
    page.wait_for_load_state()
    start, end = submit_period(page, language)
    assert parse_qs(urlsplit(page.url).query)["start"] == [start], page.url
    assert start.endswith(("-01", "月1日")), start

    page = s.goto("/tenants/acme/")
    start, end = submit_period(page, language)
    assert parse_qs(urlsplit(page.url).query)["start"] == [start], page.url
    expect(page.get_by_test_id("mtd-cost")).to_be_visible()

    page = s.goto("/reports/")
    submit_period(page, language)
    assert re.search(r"/reports/\d+/$", page.url), page.url
    s.shot(f"forms-dates-{language}")


def fill_budget(page: Page, **values: str) -> None:
    for name, value in values.items():
        field = page.locator(f"[name={name}]")
        if field.evaluate("e => e.tagName") == "SELECT":
            field.select_option(value)
        else:
            field.fill(value)
    page.get_by_test_id("budget-submit").click()
    page.wait_for_load_state()


@pytest.mark.parametrize("language", LANGUAGES)
def test_budget_form_refuses_what_it_cannot_keep_then_saves(session_in, language):
    s = session_in("admin", language)
    page = s.goto("/budgets/initech/")
    valid = {"amount": "1500", "currency": "USD", "soft_threshold_pct": "80", "hard_threshold_pct": "100",
             "hard_action": "throttle", "throttle_factor": "0.5", "owner": "finops@initech.example",
             "notify_emails": "finops@initech.example", "webhook_url": ""}
    fill_budget(page, **{**valid, "soft_threshold_pct": "120"})
    expect(page.get_by_test_id("budget-form-error")).to_contain_text("120")
    assert page.url.endswith("/budgets/initech/")
    fill_budget(page, **{**valid, "notify_emails": "finops@initech.example, not-an-address"})
    expect(page.get_by_test_id("budget-form-error")).to_contain_text("not-an-address")
    fill_budget(page, **valid)
    expect(page.get_by_test_id("message")).to_contain_text("initech")
    assert page.url.endswith("/budgets/")


def _an_hour_after_the_earliest(page: Page) -> str:
    earliest = page.get_by_test_id("rate-card-form").locator("input[name=effective_from]").get_attribute("data-earliest")
    assert earliest
    # The input's value is UTC (the form reads it so).
    at = datetime.strptime(earliest, "%Y-%m-%dT%H:%M").replace(tzinfo=UTC) + timedelta(hours=1)
    return at.strftime("%Y-%m-%dT%H:%M")


@pytest.mark.parametrize("language", LANGUAGES)
def test_a_free_price_needs_its_confirmation_and_a_mistaken_card_is_retired(session_in, language):
    s = session_in("admin", language)
    model = f"NVIDIA L4 journey {language}"
    # Only an approved model reaches the rate-card form.
    page = s.goto("/gpu-models/")
    page.get_by_test_id("gpu-model-approve-form").locator("input[name=name]").fill(model)
    page.get_by_test_id("gpu-model-approve").click()
    page.wait_for_load_state()
    expect(page.get_by_test_id("message")).to_contain_text(model)
    page = s.goto("/rate-cards/")
    form = page.get_by_test_id("rate-card-form")
    form.locator("select[name=gpu_model]").select_option(model)
    form.locator("input[name=price_per_gpu_hour]").fill("0")
    form.locator("select[name=currency]").select_option("USD")
    form.locator("input[name=effective_from]").fill(_an_hour_after_the_earliest(page))
    form.locator("input[name=source_url]").fill("https://example.com/internal-test-cards")
    form.locator("[name=source_note]").fill("Internal test cards are free, browser journey")
    page.get_by_test_id("rate-card-submit").click()
    page.wait_for_load_state()
    expect(page.get_by_test_id("rate-card-form-error")).to_contain_text(model)
    # The form keeps what was typed; the confirmation is what was missing.
    form = page.get_by_test_id("rate-card-form")
    assert form.locator("select[name=gpu_model]").input_value() == model
    form.locator("input[name=confirm_free]").check()
    page.get_by_test_id("rate-card-submit").click()
    page.wait_for_load_state()
    message = page.get_by_test_id("message").inner_text()
    card_id = re.search(r"#(\d+)", message)
    assert card_id, message
    card = card_id.group(1)

    retire = page.get_by_test_id(f"retire-rate-card-{card}")
    retire.locator("input[name=reason]").fill("created by mistake")
    retire.locator("input[name=confirm]").check()
    retire.get_by_role("button").click()
    page.wait_for_load_state()
    expect(page.get_by_test_id("message")).to_contain_text(f"#{card}")
    expect(page.get_by_test_id(f"rate-card-retired-{card}")).to_be_visible()
    expect(page.get_by_test_id(f"rate-card-{card}")).to_contain_text("created by mistake")
    s.shot(f"forms-rate-card-retired-{language}")


@pytest.mark.parametrize("language", LANGUAGES)
def test_an_sla_tier_is_created_edited_and_retired(session_in, language):
    s = session_in("admin", language)
    slug = f"journey-{language}"
    page = s.goto("/sla-tiers/")
    create = page.get_by_test_id("sla-create-form")
    create.locator("input[name=slug]").fill(slug)
    create.locator("input[name=name]").fill(f"Journey {language}")
    create.locator("input[name=weight]").fill("1.5")
    create.locator("[name=description]").fill("Created by the forms journey")
    page.get_by_test_id("sla-create-submit").click()
    page.wait_for_load_state()
    expect(page.get_by_test_id("message")).to_contain_text(slug)

    page.get_by_test_id(f"sla-edit-{slug}").click()
    page.wait_for_load_state()
    page.get_by_test_id("sla-tier-edit-form").locator("input[name=name]").fill(f"Journey {language} (renamed)")
    page.get_by_test_id("sla-tier-edit-submit").click()
    page.wait_for_load_state()
    expect(page.get_by_test_id("message")).to_contain_text(slug)
    expect(page.get_by_test_id(f"sla-tier-{slug}")).to_contain_text("(renamed)")

    # Gold is acme's default tier: refused, with the tenant named.
    gold = page.get_by_test_id("sla-retire-gold")
    gold.locator("input[name=reason]").fill("try")
    gold.locator("input[name=confirm]").check()
    gold.get_by_role("button").click()
    page.wait_for_load_state()
    expect(page.get_by_test_id("sla-retire-error")).to_contain_text("acme")

    retire = page.get_by_test_id(f"sla-retire-{slug}")
    retire.locator("input[name=reason]").fill("journey done")
    retire.locator("input[name=confirm]").check()
    retire.get_by_role("button").click()
    page.wait_for_load_state()
    expect(page.get_by_test_id("message")).to_contain_text(slug)
    expect(page.get_by_test_id(f"sla-retired-{slug}")).to_be_visible()
    expect(page.get_by_test_id(f"sla-edit-{slug}")).to_have_count(0)
    s.shot(f"forms-sla-tier-retired-{language}")
