"""FinOps workflows in a real browser against `make demo`, each journey in English and Simplified
Chinese: finance receives the alert of the demo's scripted spend spike (on the alerts page, by
e-mail and in the Slack-compatible channel) and opens its Explore link; finance sets a budget on a
namespace."""

from __future__ import annotations

import json
import time
from email import message_from_string
from email.message import EmailMessage
from email.policy import default
from pathlib import Path

import pytest
from playwright.sync_api import expect

pytestmark = [pytest.mark.browser, pytest.mark.timeout(900)]


def _set_language(page, language: str) -> None:
    page.select_option("form.lang select", language)
    page.wait_for_load_state()
    expect(page.locator("html")).to_have_attribute("lang", language)


SPIKE_KEY = "globex/globex-training"  # the demo's scripted spike (config/demo.py, burst_scenario)


def _alert_mail(mail_dir: Path, timeout_s: float) -> str:
    """The body of the alert's e-mail, once the worker has written it."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for path in sorted(mail_dir.glob("*.log")) if mail_dir.exists() else []:
            for raw in path.read_text().split("\n" + "-" * 79 + "\n"):
                message = message_from_string(raw.strip(), policy=default)
                if isinstance(message, EmailMessage) and f"Spend anomaly: {SPIKE_KEY}" in str(message["Subject"]):
                    return str(message.get_content())
        time.sleep(3)
    raise AssertionError(f"no alert e-mail in {mail_dir}")


def test_finance_receives_the_scripted_spike_alert_and_opens_it_in_explore_in_both_languages(sign_in, demo):
    s = sign_in("finance")
    page = s.page
    deadline = time.monotonic() + 300  # the spike is metered with the history; alerts are evaluated every minute
    row = page.locator(f"tr[data-testid='alert-row'][data-key='{SPIKE_KEY}']")
    s.goto("/alerts/")
    while row.count() == 0 and time.monotonic() < deadline:
        time.sleep(5)
        s.goto("/alerts/")
    expect(row).to_have_count(1)
    expect(row).to_contain_text("robust z-score")
    explore = row.get_by_test_id("alert-explore")
    link = explore.get_attribute("href")
    assert link is not None
    assert "namespace=globex-training" in link
    s.shot("alerts")

    # Told by e-mail and in the Slack-compatible channel, each with the same Explore link.
    body = _alert_mail(demo.data_dir / "mail", timeout_s=120)
    assert f"{demo.base}{link}" in body
    slack = demo.data_dir / "slack.jsonl"
    messages = [json.loads(line)["message"] for line in slack.read_text().splitlines()] if slack.exists() else []
    assert any(f"{demo.base}{link}" in m["text"] for m in messages), messages

    try:
        _set_language(page, "zh-hans")
        row = page.locator(f"tr[data-testid='alert-row'][data-key='{SPIKE_KEY}']")
        expect(row).to_contain_text("花费异常")
        expect(row).to_contain_text("稳健 z 分数")
        row.get_by_test_id("alert-explore").click()
        page.wait_for_load_state()
        assert page.url.endswith(link), page.url
        # Explore shows the namespace's day: the training job's controller and its cost.
        expect(page.get_by_test_id("explore-table")).to_contain_text("nightly-finetune")
        s.shot("alert-explore-zh-hans")
    finally:
        _set_language(page, "en")


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
