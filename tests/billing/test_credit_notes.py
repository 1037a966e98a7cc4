"""Invoices a finance team accepts: the issuer, terms, PO number, cost centre and tax copied onto an
invoice when it is issued (later changes leave it alone); tax rounded once on the subtotal; credit
notes numbered in their own sequence, immutable, never exceeding the invoice, issued from the web
(finance and admins, CSRF, audited) and the command, downloadable as PDF, CSV and FOCUS; a tenant's
invoice terms edited by admins; every PDF passes qpdf with its fonts embedded and no glyph missing."""

from __future__ import annotations

import csv
import io
import re
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal
from io import StringIO

import pytest
from django.core.management import CommandError, call_command
from django.db import IntegrityError, transaction
from django.test import Client
from django.utils import translation
from hypothesis import HealthCheck, given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st

from billing.checks import check_invoice_issuer
from billing.ledger.rollup import rollup_usage
from billing.models import AuditEvent, BillingPeriod, CreditNote, Invoice, InvoiceLine, PairedReport, Tenant
from billing.scope import ADMIN_GROUP, FINANCE_GROUP, Scope
from billing.services.exports import export_credit_note, export_invoice
from billing.services.invoicing.close import close_period, preview_invoice, tax_minor_units
from billing.services.invoicing.credit_notes import CreditRoom, credit_tax_minor, issue_credit_note
from billing.services.savings.report_pdf import render_paired_report_pdf
from tests import clock
from tests.billing.savings_results import report_result
from tests.conftest import SHARED_GPU_WORKLOADS, make_batch, user_in
from tests.pdf_check import check_pdf

pytestmark = pytest.mark.django_db

NOV = date(2026, 11, 1)
AFTER_NOV = datetime(2026, 12, 2, 9, tzinfo=UTC)
EVERYONE = Scope(tenants=None, is_finance=True, is_admin=True)
ISSUER = {"VGPU_ISSUER_NAME": "星河 GPU Cloud Ltd", "VGPU_ISSUER_ADDRESS": "1 Quay St\nLondon EC1", "VGPU_ISSUER_TAX_ID": "GB123456789"}


@pytest.fixture(autouse=True)
def _fixed_dates_stay_billable(settings):
    settings.VGPU_LATE_USAGE_HORIZON = timedelta(days=36500)


@pytest.fixture
def issuer(settings):
    for name, value in ISSUER.items():
        setattr(settings, name, value)


def finalized_invoice(*, slug: str = "acme", subtotal_minor: int = 10_000, rate_pct: str = "20",
                      currency: str = "USD") -> Invoice:
    """A finalized invoice of one usage line, as a close leaves it (lines go in while it is a draft)."""
    tenant, _ = Tenant.objects.get_or_create(slug=slug, defaults={"name": slug.title()})
    period, _ = BillingPeriod.objects.get_or_create(month=NOV, defaults={"status": BillingPeriod.Status.CLOSED})
    rate = Decimal(rate_pct)
    tax = tax_minor_units(subtotal_minor, rate, currency)
    invoice = Invoice.objects.create(tenant=tenant, period=period, number=f"VGL-202611-{slug}", currency=currency,
                                     created_at=AFTER_NOV)
    InvoiceLine.objects.create(invoice=invoice, kind="usage", gpu_model="A100", sla_tier="gold", usage_month=NOV,
                               gpu_hours=Decimal("12.345678"), amount=Decimal(subtotal_minor).scaleb(-2),
                               amount_minor=subtotal_minor)
    Invoice.objects.filter(pk=invoice.pk).update(
        status=Invoice.Status.FINALIZED, finalized_at=AFTER_NOV, total_minor=subtotal_minor + tax, tax_minor=tax,
        tax_rate_pct=rate, issue_date=AFTER_NOV.date(), due_date=AFTER_NOV.date() + timedelta(days=30),
        payment_terms_days=30, issuer_name="Issuer Ltd", bill_to_name=tenant.name, po_number="PO-1")
    return Invoice.objects.get(pk=invoice.pk)


def credit(invoice: Invoice, amount: str, reason: str = "GPU outage on 2026-11-20", **kw):
    return issue_credit_note(invoice_number=invoice.number, amount_text=amount, reason=reason, now=AFTER_NOV,
                             actor_label="finance-1", **kw)


# --- Issue-time copies and tax ---------------------------------------------------------------------

def test_an_issued_invoice_copies_issuer_terms_and_tax_and_later_changes_never_change_its_pdf(
        post_batch, one_usd_per_gpu_second, issuer, settings, tmp_path):
    Tenant.objects.create(slug="acme", name="Acme Research", tax_rate_pct=Decimal("20"), payment_terms_days=14,
                          po_number="PO-4711", cost_centre="CC-ML-7")
    Tenant.objects.create(slug="globex", name="Globex")  # no terms of its own: the default, no tax
    assert post_batch(make_batch(start=datetime(2026, 11, 15, 12, tzinfo=UTC), seq=1, seconds=3600,
                                 workloads=SHARED_GPU_WORKLOADS)).status_code == 201
    rollup_usage(now=clock.now())
    upcoming = preview_invoice(tenant="acme", month=NOV, now=AFTER_NOV)
    close_period(month=NOV, now=AFTER_NOV)

    acme = Invoice.objects.get(tenant__slug="acme")
    # The upcoming invoice said what the close finalized, tax included.
    assert (upcoming.tax_rate_pct, upcoming.tax_minor, upcoming.total_minor) == (
        Decimal(20), acme.tax_minor, acme.total_minor)
    lines_minor = sum(acme.lines.values_list("amount_minor", flat=True))
    assert acme.subtotal_minor == lines_minor
    assert acme.tax_minor == tax_minor_units(lines_minor, Decimal(20), "USD")
    assert acme.total_minor == lines_minor + acme.tax_minor
    assert acme.tax_minor > 0
    assert (acme.issue_date, acme.due_date, acme.payment_terms_days) == (date(2026, 12, 2), date(2026, 12, 16), 14)
    assert (acme.issuer_name, acme.issuer_tax_id, acme.po_number, acme.cost_centre) == (
        ISSUER["VGPU_ISSUER_NAME"], "GB123456789", "PO-4711", "CC-ML-7")
    globex = Invoice.objects.get(tenant__slug="globex")
    assert (globex.tax_minor, globex.payment_terms_days, globex.due_date) == (0, 30, date(2027, 1, 1))
    audit = AuditEvent.objects.get(action="invoice.finalized", object_id=acme.number)
    assert audit.after is not None
    assert audit.after["tax_minor"] == acme.tax_minor
    assert audit.after["total_minor"] == acme.total_minor

    facts = check_pdf(export_invoice(scope=EVERYONE, number=acme.number, fmt="pdf").content, tmp_path)
    before = facts.text
    for shown in ("星河 GPU Cloud Ltd", "1 Quay St, London EC1", "GB123456789", "Issue date2026-12-02",
                  "Due date2026-12-16", "Net 14 days", "PO-4711", "CC-ML-7", "Tax (20 %)", "Subtotal"):
        assert shown in before, shown
    assert "GPU-hours are shown to 6 decimal places, as the line stores them" in facts.words
    # Settings and the tenant change after issue: the issued invoice's document does not.
    settings.VGPU_ISSUER_NAME, settings.VGPU_ISSUER_TAX_ID = "Someone Else GmbH", "DE999"
    Tenant.objects.filter(slug="acme").update(name="Renamed", tax_rate_pct=Decimal(5), po_number="PO-NEW")
    after = check_pdf(export_invoice(scope=EVERYONE, number=acme.number, fmt="pdf").content, tmp_path).text
    assert after == before


def test_tax_is_rounded_once_on_the_subtotal_half_even():
    # 20 % of 0.05 + 0.05 + 0.05 line by line would be 0.01 x 3; on the subtotal 0.15: 0.03.
    assert tax_minor_units(15, Decimal(20), "USD") == 3
    assert tax_minor_units(25, Decimal(10), "USD") == 2  # 0.025 -> 0.02 (half to even)
    assert tax_minor_units(35, Decimal(10), "USD") == 4  # 0.035 -> 0.04
    assert tax_minor_units(1999, Decimal(0), "USD") == 0
    assert tax_minor_units(1001, Decimal("8.5"), "JPY") == 85  # no minor unit: 85.085 -> 85


# --- Credit notes: the rules -----------------------------------------------------------------------

def test_credit_notes_are_numbered_in_their_own_sequence_and_credit_tax_at_the_invoice_rate():
    invoice = finalized_invoice()
    first = credit(invoice, "12.50")
    second = credit(invoice, "10")
    assert (first.number, second.number) == ("CN-2026-0001", "CN-2026-0002")
    assert (first.amount_minor, first.tax_minor, first.total_minor) == (1250, 250, 1500)
    assert (second.amount_minor, second.tax_minor, second.total_minor) == (1000, 200, 1200)
    note = CreditNote.objects.get(number="CN-2026-0001")
    assert note.invoice_id == invoice.pk
    assert note.reason == "GPU outage on 2026-11-20"
    # A new year starts the sequence again.
    later = issue_credit_note(invoice_number=invoice.number, amount_text="1", reason="r",
                              now=datetime(2027, 1, 3, tzinfo=UTC), actor_label="finance-1")
    assert later.number == "CN-2027-0001"


def test_a_credit_note_never_exceeds_what_is_left_and_the_last_credit_takes_the_last_of_the_tax():
    invoice = finalized_invoice(subtotal_minor=10_001, rate_pct="7.5")  # tax 750.075 -> 7.50
    credit(invoice, "33.33")
    with pytest.raises(Exception, match=re.escape("exceeds what is left to credit on VGL-202611-acme: 66.68 USD")):
        credit(invoice, "66.69")
    credit(invoice, "66.68")
    assert invoice.credit_notes.count() == 2
    assert sum(invoice.credit_notes.values_list("total_minor", flat=True)) == invoice.total_minor
    with pytest.raises(Exception, match=re.escape("what is left to credit on VGL-202611-acme: 0.00 USD")):
        credit(invoice, "0.01")


@hypothesis_settings(suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(parts=st.lists(st.integers(min_value=1, max_value=10_000), min_size=1, max_size=12),
       subtotal=st.integers(min_value=1, max_value=10_000_000), rate=st.decimals(min_value=0, max_value=100, places=3))
def test_credits_in_any_parts_never_exceed_the_invoice_and_in_full_credit_exactly_its_total(parts, subtotal, rate):
    tax = tax_minor_units(subtotal, rate, "USD")
    room = CreditRoom(currency="USD", net_minor=subtotal, tax_minor=tax)
    credited_net = credited_tax = 0
    for part in [*parts, subtotal]:  # the last credit takes whatever is left
        amount = min(part, room.net_minor)
        if amount == 0:
            break
        part_tax = credit_tax_minor(amount_minor=amount, room=room, rate_pct=rate)
        assert 0 <= part_tax <= room.tax_minor
        credited_net, credited_tax = credited_net + amount, credited_tax + part_tax
        room = CreditRoom(currency="USD", net_minor=subtotal - credited_net, tax_minor=tax - credited_tax)
    assert (credited_net, credited_tax) == (subtotal, tax)


@pytest.mark.parametrize(("amount", "reason", "message"), [
    ("abc", "r", "is not a number"),
    ("0", "r", "must be more than zero"),
    ("-5", "r", "must be more than zero"),
    ("1.234", "r", "has more decimals than USD has (2)"),
    ("NaN", "r", "must be more than zero"),
    ("5", "   ", "Give the reason"),
    ("5", "x" * 501, "at most 500 fit"),
])
def test_a_bad_credit_note_is_refused_with_the_reason_and_nothing_is_written(amount, reason, message):
    invoice = finalized_invoice()
    with pytest.raises(Exception, match=re.escape(message)):
        credit(invoice, amount, reason)
    assert not CreditNote.objects.exists()
    assert not AuditEvent.objects.filter(action="credit_note.issued").exists()


def test_only_an_issued_invoice_can_be_credited():
    with pytest.raises(Exception, match="There is no invoice VGL-209901-nobody"):
        issue_credit_note(invoice_number="VGL-209901-nobody", amount_text="1", reason="r", now=AFTER_NOV,
                          actor_label="f")
    invoice = finalized_invoice()
    Invoice.objects.create(tenant=invoice.tenant, period=BillingPeriod.objects.create(month=date(2026, 12, 1)),
                           number="VGL-202612-acme", currency="USD", created_at=AFTER_NOV)
    with pytest.raises(Exception, match="is a draft"):
        issue_credit_note(invoice_number="VGL-202612-acme", amount_text="1", reason="r", now=AFTER_NOV, actor_label="f")


def test_a_credit_note_is_immutable_in_the_database_and_audited():
    invoice = finalized_invoice()
    issued = credit(invoice, "5")
    event = AuditEvent.objects.get(action="credit_note.issued", object_id=issued.number)
    assert event.after == {"invoice": invoice.number, "amount": "5.00", "tax": "1.00", "total": "6.00",
                           "currency": "USD", "reason": "GPU outage on 2026-11-20"}
    for change in (lambda: CreditNote.objects.filter(number=issued.number).update(reason="edited"),
                   lambda: CreditNote.objects.filter(number=issued.number).delete()):
        with pytest.raises(IntegrityError, match="credit note CN-2026-0001 is issued and immutable"), transaction.atomic():
            change()
    with pytest.raises(IntegrityError), transaction.atomic():  # the total is net + tax, in the database too
        CreditNote.objects.create(number="CN-2026-0999", invoice=invoice, currency="USD", amount_minor=1, tax_minor=0,
                                  total_minor=5, reason="r", issued_at=AFTER_NOV, issue_date=AFTER_NOV.date(),
                                  issued_by_label="x", issuer_name="x")


# --- Credit notes: the documents -------------------------------------------------------------------

def test_credit_note_pdf_csv_and_focus_name_the_invoice_they_correct(issuer, tmp_path):
    invoice = finalized_invoice()
    issued = credit(invoice, "12.50")
    pdf = export_credit_note(scope=EVERYONE, number=issued.number, fmt="pdf")
    assert pdf.filename == "CN-2026-0001.pdf"
    text = check_pdf(pdf.content, tmp_path).text
    for shown in ("Credit note CN-2026-0001", "Corrects invoiceVGL-202611-acme, issued 2026-12-02",
                  "星河 GPU Cloud Ltd", "GB123456789", "ReasonGPU outage on 2026-11-20", "-12.50", "Tax (20 %)-2.50",
                  "Total credited-15.00 USD", "PO-1"):
        assert shown in text, shown

    rows = list(csv.DictReader(io.StringIO(export_credit_note(scope=EVERYONE, number=issued.number,
                                                              fmt="csv").content.decode("utf-8-sig"))))
    assert [(r["credit_note_number"], r["corrects_invoice"], r["amount"], r["tax"], r["total"], r["currency"])
            for r in rows] == [("CN-2026-0001", "VGL-202611-acme", "12.50", "2.50", "15.00", "USD")]

    content = export_credit_note(scope=EVERYONE, number=issued.number, fmt="focus").content.decode("utf-8-sig")
    focus = list(csv.DictReader(io.StringIO(content)))
    assert [(r["ChargeCategory"], r["ChargeClass"], r["BilledCost"]) for r in focus] == [
        ("Credit", "Correction", "-12.5"), ("Tax", "Correction", "-2.5")]
    for r in focus:
        assert r["InvoiceId"] == "CN-2026-0001"
        assert r["x_CorrectsInvoiceId"] == "VGL-202611-acme"
        assert r["InvoiceIssuerName"] == "星河 GPU Cloud Ltd"
        assert r["ChargeFrequency"] == "One-Time"
        # Billed in the month it is issued, charged to the month the invoice billed (a Correction).
        assert (r["BillingPeriodStart"], r["ChargePeriodStart"], r["ChargePeriodEnd"]) == (
            "2026-12-01T00:00:00Z", "2026-11-01T00:00:00Z", "2026-12-01T00:00:00Z")
    assert sum(Decimal(r["BilledCost"]) for r in focus) == Decimal("-15.00")


def test_invoice_focus_has_a_tax_row_and_still_adds_up_to_the_invoice_total():
    invoice = finalized_invoice(subtotal_minor=333, rate_pct="20")
    content = export_invoice(scope=EVERYONE, number=invoice.number, fmt="focus").content.decode("utf-8-sig")
    rows = list(csv.DictReader(io.StringIO(content)))
    tax = [r for r in rows if r["ChargeCategory"] == "Tax"]
    assert [r["BilledCost"] for r in tax] == ["0.67"]
    assert tax[0]["ChargePeriodStart"] == "2026-11-01T00:00:00Z"
    assert sum(Decimal(r["BilledCost"]) for r in rows) == Decimal(invoice.total_minor).scaleb(-2) == Decimal("4.00")


def test_invoice_and_credit_note_pdfs_in_simplified_chinese_embed_every_glyph_they_draw(issuer, tmp_path):
    invoice = finalized_invoice()
    issued = credit(invoice, "3")
    with translation.override("zh-hans"):
        invoice_text = check_pdf(export_invoice(scope=EVERYONE, number=invoice.number, fmt="pdf").content,
                                 tmp_path).text
        note_text = check_pdf(export_credit_note(scope=EVERYONE, number=issued.number, fmt="pdf").content,
                              tmp_path).text
    for shown in ("开具日期2026年12月2日", "到期日2027年1月1日", "30 天内付款", "税额（20 %）", "开票方Issuer Ltd"):
        assert shown in invoice_text, shown
    for shown in ("贷项通知单 CN-2026-0001", "更正的发票VGL-202611-acme", "贷记总额-3.60 USD", "星河 GPU Cloud Ltd"):
        assert shown in note_text, shown
    # Months as the pages write them in Chinese, never the ISO "2026-11" (the lines' usage month, the
    # credit note's billing period).
    assert "2026年11月" in invoice_text
    assert "2026年11月" in note_text
    for text in (invoice_text, note_text):  # (the reason a person wrote, "GPU outage on 2026-11-20", as written)
        assert not re.findall(r".{20}2026-11(?!-\d).{20}", text)


def test_paired_report_pdf_draws_every_string_in_its_embedded_font(tmp_path):
    report = PairedReport(period_start=datetime(2026, 11, 1, tzinfo=UTC), period_end=datetime(2026, 12, 1, tzinfo=UTC),
                          result=report_result(costs={"whole_card": None, "request_fraction": "120.5",
                                                      "fixed_profile": "140"}, dynamic="100.25"))
    facts = check_pdf(render_paired_report_pdf(report, tenant_names={}), tmp_path)
    # "Ours" was once drawn with a glyph missing from the subset, and the page named Helvetica.
    assert "StudyOurs" in facts.text
    assert len(facts.fonts) == 1


# --- Web and command -------------------------------------------------------------------------------

def test_finance_issues_a_credit_note_from_the_invoice_page_with_csrf_and_the_page_lists_it():
    invoice = finalized_invoice()
    browser = Client(enforce_csrf_checks=True)
    browser.force_login(user_in(group=FINANCE_GROUP))
    page = browser.get(f"/invoices/{invoice.number}/")
    assert page.status_code == 200
    assert 'data-testid="credit-note-form"' in page.content.decode()
    assert "At most 100.00 USD (net, before tax) is left to credit" in page.content.decode()
    url = f"/invoices/{invoice.number}/credit-notes/"
    assert browser.post(url, {"amount": "5", "reason": "outage"}).status_code == 403  # no CSRF token
    token = page.cookies["csrftoken"].value
    refused = browser.post(url, {"amount": "500", "reason": "outage", "csrfmiddlewaretoken": token})
    assert refused.status_code == 400
    assert "exceeds what is left to credit" in refused.content.decode()
    # First the note as it would be issued, nothing written; then its confirmation issues it.
    review = browser.post(url, {"amount": "5", "reason": "outage", "csrfmiddlewaretoken": token})
    assert review.status_code == 200
    preview = review.context["preview"]
    assert (preview.amount_minor, preview.tax_minor, preview.total_minor) == (500, 100, 600)  # 20 % tax
    assert 'data-testid="credit-note-confirm"' in review.content.decode()
    assert not CreditNote.objects.exists()
    confirm = {"amount": "5", "reason": "outage", "confirmed_credited_minor": "0", "csrfmiddlewaretoken": token}
    done = browser.post(url, {**confirm, "confirm": "1"}, follow=True)
    body = done.content.decode()
    assert "Credit note CN-2026-0001 issued against VGL-202611-acme." in body
    assert 'data-testid="credit-note-row"' in body
    assert "/credit-notes/CN-2026-0001.pdf" in body
    assert AuditEvent.objects.get(action="credit_note.issued").actor_label.startswith("u-finance")


def test_a_confirmation_issues_once_and_a_stale_one_is_refused_and_change_keeps_what_was_typed():
    invoice = finalized_invoice()
    client = Client()
    client.force_login(user_in(group=FINANCE_GROUP))
    url = f"/invoices/{invoice.number}/credit-notes/"
    typed = {"amount": "12.50", "reason": "GPU outage\non the 3rd"}
    review = client.post(url, typed)
    assert review.status_code == 200
    body = review.content.decode()
    for shown in ("12.50 USD", "2.50 USD", "15.00 USD", "87.50 USD", "GPU outage<br>on the 3rd"):
        assert shown in body, shown
    assert not AuditEvent.objects.filter(action="credit_note.issued").exists()
    changed = client.post(url, {**typed, "confirmed_credited_minor": "0", "edit": "1"})
    assert changed.status_code == 200
    assert changed.context["form"].initial["amount"] == "12.50"
    assert not CreditNote.objects.exists()
    confirm = {**typed, "confirmed_credited_minor": "0", "confirm": "1"}
    assert client.post(url, confirm).status_code == 302
    twice = client.post(url, confirm)  # a double click, or the same confirmation in a second tab
    assert twice.status_code == 400
    assert "was credited since you reviewed this credit note" in twice.content.decode()
    assert CreditNote.objects.count() == 1
    assert client.post(url, {**typed, "confirmed_credited_minor": "-1", "confirm": "1"}).status_code == 400


def test_tenants_read_their_own_credit_notes_but_never_issue_one_and_others_are_404():
    acme, globex = finalized_invoice(slug="acme"), finalized_invoice(slug="globex")
    note, other = credit(acme, "5"), credit(globex, "5")
    client = Client()
    client.force_login(user_in(tenant="acme"))
    page = client.get(f"/invoices/{acme.number}/").content.decode()
    assert note.number in page
    assert 'data-testid="credit-note-form"' not in page
    assert client.get(f"/credit-notes/{note.number}.pdf").status_code == 200
    assert client.post(f"/invoices/{acme.number}/credit-notes/", {"amount": "1", "reason": "r"}).status_code == 403
    for url in (f"/credit-notes/{other.number}.pdf", f"/invoices/{globex.number}/", "/credit-notes/CN-2099-0001.csv"):
        assert client.get(url).status_code == 404
    assert CreditNote.objects.count() == 2


def test_issue_credit_note_command_issues_and_refuses_with_the_reason():
    invoice = finalized_invoice()
    out = StringIO()
    call_command("issue_credit_note", "--invoice", invoice.number, "--amount", "10", "--reason", "goodwill",
                 stdout=out)
    assert out.getvalue().strip() == "CN-2026-0001: credits 12.00 USD (10.00 net + 2.00 tax) on VGL-202611-acme"
    assert "manage.py issue_credit_note" in AuditEvent.objects.get(action="credit_note.issued").actor_label
    with pytest.raises(CommandError, match="exceeds what is left to credit"):
        call_command("issue_credit_note", "--invoice", invoice.number, "--amount", "95", "--reason", "again")


def test_admins_edit_a_tenants_invoice_terms_audited_and_others_may_not():
    Tenant.objects.create(slug="acme", name="Acme")
    url = "/tenants/acme/billing/"
    client = Client()
    client.force_login(user_in(group=FINANCE_GROUP))
    assert client.get(url).status_code == 403
    client.force_login(user_in(group=ADMIN_GROUP))
    assert client.get(url).status_code == 200
    bad = client.post(url, {"tax_rate_pct": "120", "payment_terms_days": "", "po_number": "", "cost_centre": ""})
    assert bad.status_code == 400
    assert Tenant.objects.get(slug="acme").tax_rate_pct == 0
    resp = client.post(url, {"tax_rate_pct": "19.5", "payment_terms_days": "45", "po_number": " PO-9 ",
                             "cost_centre": "CC-1"}, follow=True)
    assert "Invoice terms of Acme saved" in resp.content.decode()
    acme = Tenant.objects.get(slug="acme")
    assert (acme.tax_rate_pct, acme.payment_terms_days, acme.po_number, acme.cost_centre) == (
        Decimal("19.5"), 45, "PO-9", "CC-1")
    event = AuditEvent.objects.get(action="tenant.billing_updated")
    assert event.before is not None
    assert event.after is not None
    assert event.before["tax_rate_pct"] == "0.000"
    assert event.after["tax_rate_pct"] == "19.500"
    assert event.after["po_number"] == "PO-9"


def test_production_warns_when_the_invoice_issuer_is_not_configured(settings):
    settings.PRODUCTION = True
    settings.VGPU_ISSUER_NAME, settings.VGPU_ISSUER_ADDRESS, settings.VGPU_ISSUER_TAX_ID = "Example Ltd", "", ""
    (warning,) = check_invoice_issuer()
    assert warning.id == "billing.W010"
    assert "VGPU_ISSUER_ADDRESS, VGPU_ISSUER_TAX_ID unset" in warning.msg
    for name, value in ISSUER.items():
        setattr(settings, name, value)
    assert check_invoice_issuer() == []
    settings.PRODUCTION, settings.VGPU_ISSUER_NAME = False, ""
    assert check_invoice_issuer() == []
