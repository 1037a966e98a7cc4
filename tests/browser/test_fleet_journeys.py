"""The fleet view in a real browser, in English and Simplified Chinese (docs/billing.md, Fleet view):
finance opens Fleet from the navigation, reads each node's card cost and idle cost, the energy cost,
and the comparison with the previous period (then opens it), opens a node's GPUs, and follows one of
a card's workloads into Explore. Selectors are test ids, never texts."""

from __future__ import annotations

import re

import pytest
from playwright.sync_api import expect

from tests.browser.test_forms_journeys import LANGUAGES, session_in  # noqa: F401 - the fixture, shared

pytestmark = [pytest.mark.browser, pytest.mark.timeout(600)]

MONEY = re.compile(r"^\d[\d,]*\.\d{2} USD$")
PCT = re.compile(r"^(—|[+-]?\d[\d,]*\.\d %)$")


@pytest.mark.parametrize("language", LANGUAGES)
def test_finance_finds_a_cards_idle_cost_and_follows_its_workload_to_explore(session_in, language):  # noqa: F811 - the fixture
    s = session_in("finance", language)
    page = s.page
    page.get_by_test_id("nav-fleet").click()
    expect(page.get_by_test_id("fleet-table")).to_be_visible()
    expect(page.get_by_test_id("sort-idle_cost").locator("xpath=..")).to_have_attribute("aria-sort", "descending")
    total = page.get_by_test_id("fleet-total-card-cost").inner_text().strip()
    assert MONEY.match(total), total
    # Every demo node has a located price: the fleet's energy cost is a figure, never "—".
    assert MONEY.match(page.get_by_test_id("fleet-total-energy-cost").inner_text().strip())
    previous = page.get_by_test_id("fleet-previous-card-cost").inner_text().strip()
    assert MONEY.match(previous), previous
    assert PCT.match(page.get_by_test_id("fleet-card-change-pct").inner_text().strip())
    expect(page.get_by_test_id("comparison-period")).to_be_visible()
    # A node whose cards ran workloads (the demo's simulated agents): open its GPUs.
    node = page.locator("[data-testid=fleet-node]:has([data-testid=fleet-workload])").first
    expect(node.get_by_test_id("node-idle-cost")).to_be_visible()
    gpus = node.get_by_test_id("fleet-node-gpus")
    expect(gpus.get_by_test_id("fleet-gpu").first).to_be_hidden()
    gpus.locator("summary").click()
    gpu = gpus.locator("[data-testid=fleet-gpu]:has([data-testid=fleet-workload])").first
    expect(gpu).to_be_visible()
    for cell in ("gpu-card-cost", "gpu-attributed", "gpu-idle-cost"):
        assert MONEY.match(gpu.get_by_test_id(cell).inner_text().strip()), cell
    s.shot(f"fleet-{language}")
    gpu.get_by_test_id("fleet-workload").first.click()
    # Explore, at the workload's own level: the GPUs its pod ran on.
    expect(page.get_by_test_id("explore-table")).to_have_attribute("data-level", "gpu")
    expect(page.get_by_test_id("explore-row").first).to_contain_text("GPU-")
    expect(page.locator("html")).to_have_attribute("lang", language)
    # The previous period, opened from the comparison, shows the figure the comparison read.
    page.go_back()
    page.get_by_test_id("comparison-open-previous").click()
    page.wait_for_load_state()
    if previous == "0.00 USD":
        expect(page.get_by_test_id("fleet-empty")).to_be_visible()
    else:
        expect(page.get_by_test_id("fleet-total-card-cost")).to_have_text(previous)
