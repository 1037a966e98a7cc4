"""Energy per workload in a real browser, in English and Simplified Chinese: a tenant engineer reads the
kWh each workload drew beside its cost on the portal (and on Explore), metered by the demo's simulated agents and split
by the ledger as the cost is. Selectors are test ids, never texts."""

from __future__ import annotations

import re
import time

import pytest
from playwright.sync_api import expect

from tests.browser.test_forms_journeys import LANGUAGES, session_in  # noqa: F401 - the fixture, shared

pytestmark = [pytest.mark.browser, pytest.mark.timeout(600)]

NUMBER = re.compile(r"^\d[\d,]*\.\d{2}$")


@pytest.mark.parametrize("language", LANGUAGES)
def test_a_tenant_reads_kwh_per_workload_beside_its_cost(session_in, language):  # noqa: F811 - the fixture
    s = session_in("acme-engineer", language)
    deadline = time.monotonic() + 300
    while True:  # the live agents' first minutes reach the ledger within a rollup cycle or two
        page = s.goto("/tenants/acme/")
        cells = page.get_by_test_id("workload-kwh")
        values = [t.strip() for t in cells.all_inner_texts()]
        if (values and any(float(v.replace(",", "")) > 0 for v in values)) or time.monotonic() > deadline:
            break
        time.sleep(5)
    expect(cells.first).to_be_visible()
    assert values, "no workload rows"
    assert all(NUMBER.match(v) for v in values), values
    assert any(float(v.replace(",", "")) > 0 for v in values), values
    s.shot(f"portal-energy-{language}")


@pytest.mark.parametrize("language", LANGUAGES)
def test_an_admin_prices_a_locations_energy_and_a_tenant_reads_its_cost_and_co2e(session_in, language):  # noqa: F811 - the fixture
    """An admin sets eu-west-dc1's price per kWh and CO2e factor from tomorrow (the earliest: nothing shown
    is re-priced) and sees it listed as upcoming; a tenant engineer reads kWh, energy cost and kg CO2e per
    workload, priced by the demo's locations since its first day."""
    admin = session_in("admin", language)
    page = admin.goto("/locations/")
    form = page.get_by_test_id("location-rate-form-eu-west-dc1")
    tomorrow = form.locator("input[name=effective_from]").input_value()
    form.locator("input[name=price_per_kwh]").fill("0.23")
    form.locator("input[name=co2e_kg_per_kwh]").fill("0.2")
    form.locator("button[type=submit]").click()
    page.wait_for_load_state()
    assert page.url.endswith("/locations/"), page.url
    upcoming = page.get_by_test_id(f"location-rate-eu-west-dc1-{tomorrow}")
    expect(upcoming).to_have_attribute("data-state", "upcoming")
    expect(upcoming.get_by_test_id("rate-price")).to_contain_text("0.230000")
    expect(upcoming.get_by_test_id("rate-co2e")).to_contain_text("0.200")
    admin.shot(f"locations-{language}")
    # A bad number is refused with its reason, in the page's language, and saves nothing.
    form = page.get_by_test_id("location-rate-form-eu-west-dc1")
    form.locator("input[name=price_per_kwh]").fill("-1")
    form.locator("button[type=submit]").click()
    page.wait_for_load_state()
    expect(page.get_by_test_id("location-rate-error")).to_be_visible()

    s = session_in("acme-engineer", language)
    deadline = time.monotonic() + 300
    while True:  # the live agents' energy reaches the ledger within a rollup cycle or two
        page = s.goto("/tenants/acme/")
        kwh = [t.strip() for t in page.get_by_test_id("workload-kwh").all_inner_texts()]
        if any(NUMBER.match(v) and float(v.replace(",", "")) > 0 for v in kwh) or time.monotonic() > deadline:
            break
        time.sleep(5)
    costs = [t.strip() for t in page.get_by_test_id("workload-energy-cost").all_inner_texts()]
    co2e = [t.strip() for t in page.get_by_test_id("workload-co2e").all_inner_texts()]
    assert len(kwh) == len(costs) == len(co2e) > 0, (kwh, costs, co2e)
    # Every node of the demo has a location with a price and a factor: no "—".
    assert all(re.search(r"\d", c) and "—" not in c for c in costs), costs
    assert all(NUMBER.match(c) for c in co2e), co2e
    assert any(float(c.replace(",", "")) > 0 for c in co2e), co2e
    expect(page.get_by_test_id("energy-cost-note")).to_be_visible()
    s.shot(f"portal-energy-cost-{language}")

    # Explore shows the same three columns beside the cost, and its totals row.
    page = s.goto("/explore/")
    kwh = [t.strip() for t in page.get_by_test_id("explore-kwh").all_inner_texts()]
    costs = [t.strip() for t in page.get_by_test_id("explore-energy-cost").all_inner_texts()]
    assert kwh, "no Explore rows"
    assert all(NUMBER.match(v) for v in kwh), kwh
    assert any(float(v.replace(",", "")) > 0 for v in kwh), kwh
    assert len(costs) == len(kwh), (kwh, costs)
    assert all(re.search(r"\d", c) and "—" not in c for c in costs), costs
    expect(page.get_by_test_id("explore-kwh-total")).to_have_text(re.compile(r"\d"))
    expect(page.get_by_test_id("explore-energy-cost-total")).to_have_text(re.compile(r"\d"))
    s.shot(f"explore-energy-{language}")
