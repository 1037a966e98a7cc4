"""Energy per workload in a real browser, in English and Simplified Chinese: a tenant engineer reads the
kWh each workload drew beside its cost on the portal, metered by the demo's simulated agents and split
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
