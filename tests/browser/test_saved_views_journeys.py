"""Saved views and scheduled reports in a real browser against `make demo`, in English and
Simplified Chinese: the demo's own scheduled report has reached its mail folder; finance saves the
dashboard's last 7 days, schedules it, sends it now and sees it sent in the history and in the mail
folder, opens it again from the list, and deletes it. Selectors are test ids and field names."""

from __future__ import annotations

import time
from email import message_from_bytes
from email.message import EmailMessage
from email.policy import default
from pathlib import Path

import pytest
from playwright.sync_api import Page, expect

from billing.services.demo import DEMO_REPORT_RECIPIENT, DEMO_SAVED_VIEW

pytestmark = [pytest.mark.browser, pytest.mark.timeout(900)]

LANGUAGES = ["en", "zh-hans"]
BROWSER_LOCALE = {"en": "en-US", "zh-hans": "zh-CN"}
TITLE = {"en": "Saved views", "zh-hans": "已保存视图"}


def _mails(mail_dir: Path, subject: str, timeout_s: float) -> list[EmailMessage]:
    """The e-mails whose subject starts with `subject`, once the demo has written one."""
    deadline = time.monotonic() + timeout_s
    while True:
        found = []
        for path in sorted(mail_dir.glob("*.log")) if mail_dir.exists() else []:
            for raw in path.read_text().split("\n" + "-" * 79 + "\n"):
                # As bytes: the CSV is 8-bit UTF-8 text, which the str parser would escape.
                message = message_from_bytes(raw.strip().encode(), policy=default)
                if isinstance(message, EmailMessage) and str(message["Subject"] or "").startswith(subject):
                    found.append(message)
        if found or time.monotonic() > deadline:
            return found
        time.sleep(2)


def _switch(page: Page, language: str) -> None:
    page.select_option("form.lang select", language)
    page.wait_for_load_state()
    expect(page.locator("html")).to_have_attribute("lang", language)


def test_the_demos_scheduled_report_lands_in_its_mail_folder(demo):
    [report, *_rest] = _mails(demo.data_dir / "mail", f"Report: {DEMO_SAVED_VIEW}", timeout_s=120)
    assert report["To"] == DEMO_REPORT_RECIPIENT
    [attachment] = list(report.iter_attachments())
    assert attachment.get_content_type() == "text/csv"
    assert attachment.get_content().lstrip("\ufeff").splitlines()[0].startswith("tenant,name,charge")  # after the BOM


@pytest.mark.parametrize("language", LANGUAGES)
def test_finance_saves_schedules_and_sends_a_view(sign_in, demo, language):
    s = sign_in("finance", locale=BROWSER_LOCALE[language])
    page = s.page
    name = f"Last 7 days ({language})"
    try:
        _switch(page, language)
        s.goto("/finance/")
        page.get_by_test_id("period-last-7-days").click()
        page.wait_for_load_state()
        period = page.url.split("?", 1)[1]
        page.get_by_test_id("save-view").locator("summary").click()
        page.get_by_test_id("save-view-name").fill(name)
        page.get_by_test_id("save-view-submit").click()
        page.wait_for_load_state()
        expect(page.get_by_test_id("saved-view-name")).to_have_text(name)
        expect(page.locator("h2").first).to_have_text({"en": "Scheduled report", "zh-hans": "定期报告"}[language])

        form = page.get_by_test_id("schedule-form")
        form.locator("select[name=frequency]").select_option("weekly")
        form.locator("select[name=weekday]").select_option("0")
        form.locator("input[name=hour]").fill("7")
        form.locator("input[name=recipients]").fill("cfo@example.com, ops@example.com")
        page.get_by_test_id("schedule-submit").click()
        page.wait_for_load_state()
        expect(page.get_by_test_id("saved-view-next")).to_contain_text("cfo@example.com, ops@example.com")

        page.get_by_test_id("send-now").locator("button").click()
        page.wait_for_load_state()
        expect(page.locator("tr[data-testid='send-row'][data-status='sent']")).to_have_count(1)
        s.shot(f"saved-view-{language}")
        [mail] = _mails(demo.data_dir / "mail", f"Report: {name}", timeout_s=10)
        assert mail["To"] == "cfo@example.com, ops@example.com"

        page.locator("header.top details.menu.me summary").click()
        page.get_by_test_id("nav-saved-views").click()
        page.wait_for_load_state()
        expect(page.locator("h1")).to_have_text(TITLE[language])
        row = page.locator(f"tr[data-testid='saved-view-row'][data-name='{name}']")
        row.get_by_test_id("saved-view-open").click()
        page.wait_for_load_state()
        assert page.url.endswith(f"/finance/?{period}"), page.url
        expect(page.get_by_test_id("period-last-7-days")).to_have_attribute("aria-current", "true")
    finally:
        s.goto("/views/")
        row = page.locator(f"tr[data-testid='saved-view-row'][data-name='{name}']")
        if row.count():
            row.locator("a").first.click()
            page.wait_for_load_state()
            page.get_by_test_id("saved-view-delete").locator("xpath=..").locator("summary").click()
            page.get_by_test_id("saved-view-delete").locator("button").click()
            page.wait_for_load_state()
            expect(page.locator(f"tr[data-testid='saved-view-row'][data-name='{name}']")).to_have_count(0)
        _switch(page, "en")
