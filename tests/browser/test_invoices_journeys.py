"""Invoices for a finance team, in a real browser against `make demo`, in English and in
Simplified Chinese: a finance user opens last month's invoice, sees its issuer, dates, terms, PO
number, cost centre and tax, downloads its PDF, issues a credit note through the form and
downloads the credit note's PDF; both PDFs pass qpdf with every font embedded and show the fields."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from playwright.sync_api import expect

from tests.pdf_check import check_pdf

pytestmark = [pytest.mark.browser, pytest.mark.timeout(1800)]

# What the demo configures (config/demo.py, billing/services/demo.py DEMO_INVOICE_TERMS).
ISSUER = "Example GPU Cloud Ltd"
ISSUER_TAX_ID = "GB 123 4567 89"
ACME_PO, ACME_COST_CENTRE = "PO-2026-0142", "CC-ROBOTICS-7"
LABELS = {
    "en": {"issue": "Issue date", "due": "Due date", "terms": "Net 30 days", "tax": "Tax (20 %)",
           "credit_title": "Credit note", "corrects": "Corrects invoice", "issued": "issued against"},
    "zh-hans": {"issue": "开具日期", "due": "到期日", "terms": "30 天内付款", "tax": "税额（20 %）",
                "credit_title": "贷项通知单", "corrects": "更正的发票", "issued": "已针对"},
}


def _set_language(page, language: str) -> None:
    page.select_option("form.lang select", language)
    page.wait_for_load_state()
    expect(page.locator("html")).to_have_attribute("lang", language)


def _download_pdf(page, link, tmp_path: Path):
    with page.expect_download() as download:
        link.click()
    return check_pdf(Path(download.value.path()).read_bytes(), tmp_path)


@pytest.mark.parametrize("language", ["en", "zh-hans"])
def test_finance_downloads_an_invoice_and_issues_and_downloads_a_credit_note(sign_in, demo, tmp_path, language):
    s = sign_in("finance")
    page = s.page
    _set_language(page, language)
    words = LABELS[language]
    try:
        s.goto("/invoices/")
        link = page.get_by_test_id("invoices").locator("a[href$='-acme/']").first
        number = link.inner_text()
        link.click()
        page.wait_for_load_state()
        terms = page.get_by_test_id("invoice-terms")
        for shown in (ISSUER, ISSUER_TAX_ID, ACME_PO, ACME_COST_CENTRE, words["terms"]):
            expect(terms).to_contain_text(shown)
        issue_date = page.get_by_test_id("issue-date").inner_text()
        assert re.fullmatch(r"\d{4}-\d{2}-\d{2}|\d{4}年\d{1,2}月\d{1,2}日", issue_date), issue_date
        s.shot(f"invoice-detail-{language}")

        invoice = _download_pdf(page, page.locator(f"a[href='/invoices/{number}.pdf']").first, tmp_path)
        for shown in (number, ISSUER, ISSUER_TAX_ID, ACME_PO, ACME_COST_CENTRE, words["issue"] + issue_date,
                      words["due"], words["terms"], words["tax"]):
            assert shown in invoice.text, (shown, invoice.text[:3000])

        form = page.get_by_test_id("credit-note-form")
        form.locator("input[name=amount]").fill("1.00")
        form.locator("textarea[name=reason]").fill(f"Browser journey credit ({language})")
        form.locator("button[type=submit]").click()
        page.wait_for_load_state()
        # Nothing is issued before the note, as it would be issued, is confirmed.
        expect(page.get_by_test_id("preview-total")).to_contain_text("1.20 USD")
        page.get_by_test_id("credit-note-confirm").click()
        page.wait_for_load_state()
        expect(page.get_by_test_id("message")).to_contain_text(words["issued"])
        message = page.get_by_test_id("message").inner_text()
        found = re.search(r"CN-\d{4}-\d{4}", message)
        assert found is not None, message
        credit_number = found.group(0)
        row = page.get_by_test_id("credit-note-row").filter(has_text=credit_number)
        expect(row).to_contain_text("1.00")
        s.shot(f"credit-note-{language}")

        note = _download_pdf(page, row.locator(f"a[href='/credit-notes/{credit_number}.pdf']"), tmp_path)
        for shown in (words["credit_title"], credit_number, words["corrects"], number, ISSUER, ISSUER_TAX_ID,
                      ACME_PO, f"Browser journey credit ({language})", "-1.00", "-0.20", "-1.20 USD"):
            assert shown in note.text, (shown, note.text[:3000])
    finally:
        # The language is the user's preference, kept across sessions: leave finance in English.
        if language != "en":
            _set_language(page, "en")


def test_finance_records_an_invoice_sent_in_english_and_paid_in_chinese(sign_in, demo):
    """One journey, both languages: the payment status form on globex's invoice (the credit note
    journeys use acme's), the message, the history, and the status in the invoice list."""
    s = sign_in("finance")
    page = s.page
    try:
        s.goto("/invoices/")
        link = page.get_by_test_id("invoices").locator("a[href$='-globex/']").first
        number = link.inner_text()
        expect(page.get_by_test_id(f"payment-status-{number}")).to_have_attribute("data-state", "issued")
        link.click()
        page.wait_for_load_state()
        form = page.get_by_test_id("invoice-status-form")
        form.locator("select[name=status]").select_option("sent")
        form.locator("button[type=submit]").click()
        page.wait_for_load_state()
        expect(page.get_by_test_id("message")).to_contain_text(f"Invoice {number} recorded as sent")
        expect(page.get_by_test_id(f"payment-status-{number}")).to_have_attribute("data-state", "sent")

        _set_language(page, "zh-hans")
        form = page.get_by_test_id("invoice-status-form")
        form.locator("select[name=status]").select_option("paid")
        form.locator("input[name=note]").fill("银行转账 4471")
        form.locator("button[type=submit]").click()
        page.wait_for_load_state()
        expect(page.get_by_test_id("message")).to_contain_text("已付款")
        history = page.get_by_test_id("payment-history-row")
        expect(history).to_have_count(2)
        expect(history.nth(1)).to_contain_text("银行转账 4471")
        s.shot("invoice-paid-zh-hans")
        s.goto("/invoices/")
        status = page.get_by_test_id(f"payment-status-{number}")
        expect(status).to_have_attribute("data-state", "paid")
        expect(status).to_contain_text("已付款")
    finally:
        _set_language(page, "en")
