"""FinOps workflows in a real browser against `make demo`, each journey in English and Simplified
Chinese: finance sets a budget on a namespace."""

from __future__ import annotations

import pytest
from playwright.sync_api import expect

pytestmark = [pytest.mark.browser, pytest.mark.timeout(900)]


def _set_language(page, language: str) -> None:
    page.select_option("form.lang select", language)
    page.wait_for_load_state()
    expect(page.locator("html")).to_have_attribute("lang", language)


def test_finance_sets_a_budget_on_a_namespace_in_chinese_and_reads_it_in_english(sign_in):
    s = sign_in("finance")
    page = s.page
    try:
        _set_language(page, "zh-hans")
        s.goto("/budgets/")
        page.get_by_test_id("budget-new").click()
        page.wait_for_load_state()
        form = page.get_by_test_id("budget-form")
        form.locator("select[name=tenant]").select_option("xinghe")
        form.locator("select[name=scope]").select_option("namespace")
        form.locator("input[name=namespace]").fill("xinghe-staging")
        form.locator("input[name=amount]").fill("90000")  # generous: the shared demo's agents stay unthrottled
        form.locator("select[name=currency]").select_option("USD")
        form.locator("select[name=hard_action]").select_option("throttle")
        form.locator("input[name=owner]").fill("finops@xinghe.example")
        s.shot("budget-new-namespace-zh-hans")
        page.get_by_test_id("budget-submit").click()
        page.wait_for_load_state()
        expect(page.get_by_test_id("message")).to_contain_text("已保存")
        row = page.locator("tr[data-budget='xinghe/namespace/xinghe-staging']")
        expect(row).to_contain_text("命名空间 xinghe-staging")

        _set_language(page, "en")
        row = page.locator("tr[data-budget='xinghe/namespace/xinghe-staging']")
        expect(row).to_contain_text("namespace xinghe-staging")
        expect(row).to_contain_text("90,000.00")
        # The evaluation runs on save: the state is the namespace's own, a month to date beside it.
        expect(page.get_by_test_id("budget-state-xinghe/namespace/xinghe-staging")).to_have_attribute("data-state", "ok")
        s.shot("budgets-namespace")
    finally:
        _set_language(page, "en")
