"""The drill-down in a real browser against the shared demo (docs/drilldown.md, "the drill-down pages reach a
pod's GPU"): finance clicks from Explore down through a tenant, a namespace, a controller and a
workload to the GPUs the pod ran on; a tenant engineer finds only their tenant there."""

from __future__ import annotations

import pytest
from playwright.sync_api import expect

pytestmark = [pytest.mark.browser, pytest.mark.timeout(900)]


def test_finance_drills_down_from_the_tenants_to_a_pods_gpus(sign_in):
    s = sign_in("finance")
    page = s.page
    page.get_by_test_id("nav-explore").click()
    table = page.get_by_test_id("explore-table")
    expect(table).to_have_attribute("data-level", "tenant")
    s.shot("explore")
    for level in ("namespace", "controller", "pod", "gpu"):
        page.get_by_test_id("explore-down").first.click()
        expect(table).to_have_attribute("data-level", level)
        if level == "pod":
            expect(page.get_by_test_id("rightsizing").first).to_be_visible()
    # The container's GPUs: nothing further down, a GPU UUID in the rows, crumbs back to every level
    # (tenants, tenant, namespace, controller, pod; the container is where we are).
    assert page.get_by_test_id("explore-down").count() == 0
    expect(page.get_by_test_id("explore-row").first).to_contain_text("GPU-")
    expect(page.get_by_test_id("explore-crumbs").locator("a")).to_have_count(5)
    s.shot("explore-gpus")
    with page.expect_download() as download:
        page.get_by_test_id("explore-csv").click()
    assert download.value.suggested_filename.startswith("explore-gpu-")


def test_a_tenant_engineer_explores_only_their_tenant(sign_in):
    s = sign_in("acme-engineer")
    page = s.page
    page.get_by_test_id("nav-explore").click()
    rows = page.get_by_test_id("explore-row")
    expect(rows).to_have_count(1)
    expect(rows.first.locator("[title=acme]")).to_have_count(1)
    assert s.goto("/explore/?tenant=globex")
    assert s.last_status == 404
