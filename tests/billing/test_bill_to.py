"""The invoice's Bill to as a finance team needs it: the customer's billing address and tax ID, and a
0 % tax that states why (the tax exemption / reverse-charge note), set with the tenant's invoice terms,
copied onto each invoice when it is issued and shown on its page, PDF and CSV; an issued invoice
never changes with the tenant's terms."""

from __future__ import annotations

import csv
import io
from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest
from django.db import DatabaseError, transaction
from django.test import Client

from billing.ledger.rollup import rollup_usage
from billing.models import AuditEvent, Invoice, Tenant
from billing.scope import ADMIN_GROUP, FINANCE_GROUP
from billing.services.exports import export_invoice
from billing.services.invoicing.close import close_period
from tests import clock
from tests.billing.test_credit_notes import AFTER_NOV, EVERYONE, ISSUER, NOV
from tests.conftest import SHARED_GPU_WORKLOADS, make_batch, user_in
from tests.pdf_check import check_pdf

pytestmark = pytest.mark.django_db

URL = "/tenants/acme/billing/"
ADDRESS = "Acme Robotics Ltd\nAccounts Payable\n10 Dock Road\nLondon E16 1AA"
NOTE = "Reverse charge: VAT to be accounted for by the recipient (Art. 196 VAT Directive)"
TERMS = {"tax_rate_pct": "0", "payment_terms_days": "30", "po_number": "PO-1", "cost_centre": "CC-1",
         "billing_address": ADDRESS, "tax_id": "DE811907980", "tax_exemption_note": NOTE}


@pytest.fixture(autouse=True)
def _fixed_dates_stay_billable(settings):
    settings.VGPU_LATE_USAGE_HORIZON = timedelta(days=36500)
    for name, value in ISSUER.items():
        setattr(settings, name, value)


def admin_client() -> Client:
    client = Client()
    client.force_login(user_in(ADMIN_GROUP))
    return client


def test_admins_set_the_customers_address_tax_id_and_tax_note_audited():
    Tenant.objects.create(slug="acme", name="Acme")
    client = admin_client()
    form = client.get(URL).content.decode()
    for field in ("billing_address", "tax_id", "tax_exemption_note"):
        assert f'name="{field}"' in form, field
    resp = client.post(URL, {**TERMS, "billing_address": f"  {ADDRESS.replace(chr(10), chr(13) + chr(10))}\n\n  ",
                             "tax_id": " DE811907980 "}, follow=True)
    assert resp.status_code == 200
    acme = Tenant.objects.get(slug="acme")
    assert (acme.billing_address, acme.tax_id, acme.tax_exemption_note) == (ADDRESS, "DE811907980", NOTE)
    event = AuditEvent.objects.get(action="tenant.billing_updated")
    assert event.after is not None
    assert (event.after["billing_address"], event.after["tax_id"]) == (ADDRESS, "DE811907980")
    # The form shows what is saved.
    assert "Accounts Payable" in client.get(URL).content.decode()


@pytest.mark.parametrize(("field", "value", "says"), [
    ("billing_address", "\n".join(f"line {i}" for i in range(7)), "at most 6 lines"),
    ("billing_address", "x" * 501, "at most 500 characters"),
    ("tax_id", "x" * 65, "at most 64 characters"),
    ("tax_exemption_note", "x" * 301, "at most 300 characters"),
    ("tax_exemption_note", "exempt \u202e", "cannot print U+202E"),
])
def test_bad_billing_details_are_a_400_that_names_them_and_change_nothing(field, value, says):
    Tenant.objects.create(slug="acme", name="Acme")
    resp = admin_client().post(URL, {**TERMS, field: value})
    assert resp.status_code == 400
    assert says in resp.content.decode()
    acme = Tenant.objects.get(slug="acme")
    assert (acme.billing_address, acme.tax_id, acme.tax_exemption_note) == ("", "", "")
    assert not AuditEvent.objects.filter(action="tenant.billing_updated").exists()


def test_finance_may_not_set_billing_details():
    Tenant.objects.create(slug="acme", name="Acme")
    client = Client()
    client.force_login(user_in(FINANCE_GROUP))
    assert client.post(URL, TERMS).status_code == 403
    assert Tenant.objects.get(slug="acme").tax_id == ""


@pytest.fixture
def issued(post_batch, one_usd_per_gpu_second) -> dict[str, Invoice]:
    """November closed: acme at 0 % with its address, tax ID and reverse-charge note; globex taxed at
    20 % with a note that therefore explains nothing and is not copied."""
    Tenant.objects.create(slug="acme", name="Acme Robotics", billing_address=ADDRESS, tax_id="DE811907980",
                          tax_exemption_note=NOTE)
    Tenant.objects.create(slug="globex", name="Globex", tax_rate_pct=Decimal(20), tax_id="GB1",
                          tax_exemption_note="left over from last year")
    assert post_batch(make_batch(start=datetime(2026, 11, 15, 12, tzinfo=UTC), seq=1, seconds=60,
                                 workloads=SHARED_GPU_WORKLOADS)).status_code == 201
    rollup_usage(now=clock.now())
    close_period(month=NOV, now=AFTER_NOV)
    return {i.tenant.slug: i for i in Invoice.objects.select_related("tenant")}


def test_the_close_copies_the_billing_details_and_keeps_a_note_only_at_0_percent(issued):
    acme, globex = issued["acme"], issued["globex"]
    assert (acme.bill_to_address, acme.bill_to_tax_id, acme.tax_exemption_note) == (ADDRESS, "DE811907980", NOTE)
    assert acme.tax_minor == 0
    assert (globex.bill_to_tax_id, globex.tax_exemption_note) == ("GB1", "")


def test_the_page_pdf_and_csv_show_the_bill_to_and_why_the_tax_is_0(issued, tmp_path):
    client = Client()
    client.force_login(user_in(FINANCE_GROUP))
    acme = issued["acme"]
    page = client.get(f"/invoices/{acme.number}/").content.decode()
    bill_to = page.split('data-testid="bill-to">', 1)[1].split("</td>", 1)[0]
    assert "Acme Robotics (acme)" in bill_to
    assert "Accounts Payable<br>10 Dock Road" in bill_to
    assert 'data-testid="bill-to-tax-id">DE811907980<' in page
    assert f'data-testid="tax-exemption-note">{NOTE}<' in page
    globex_page = client.get(f"/invoices/{issued['globex'].number}/").content.decode()
    assert 'data-testid="tax-exemption-note"' not in globex_page  # taxed: nothing to explain
    assert 'data-testid="bill-to-tax-id">GB1<' in globex_page

    pdf = check_pdf(export_invoice(scope=EVERYONE, number=acme.number, fmt="pdf").content, tmp_path)
    for shown in ("Acme Robotics Ltd, Accounts Payable, 10 Dock Road, London E16 1AA", "DE811907980",
                  "Reverse charge: VAT to be accounted for"):
        assert shown in pdf.words, shown
    assert "Tax note" not in check_pdf(export_invoice(scope=EVERYONE, number=issued["globex"].number,
                                                      fmt="pdf").content, tmp_path).words

    body = export_invoice(scope=EVERYONE, number=acme.number, fmt="csv").content.decode("utf-8-sig")
    rows = list(csv.DictReader(io.StringIO(body)))
    assert rows
    for row in rows:  # every row, the line rows and the subtotal, tax and total rows alike
        assert (row["bill_to_address"], row["bill_to_tax_id"], row["tax_exemption_note"]) == (
            ADDRESS, "DE811907980", NOTE)


def test_an_issued_invoice_keeps_its_bill_to_when_the_tenant_changes_and_cannot_be_edited(issued, tmp_path):
    acme = issued["acme"]
    before = check_pdf(export_invoice(scope=EVERYONE, number=acme.number, fmt="pdf").content, tmp_path).text
    Tenant.objects.filter(slug="acme").update(billing_address="Elsewhere 1", tax_id="XX", tax_exemption_note="")
    after = check_pdf(export_invoice(scope=EVERYONE, number=acme.number, fmt="pdf").content, tmp_path).text
    assert after == before
    with pytest.raises(DatabaseError, match="finalized and immutable"), transaction.atomic():
        Invoice.objects.filter(pk=acme.pk).update(bill_to_tax_id="XX")
    assert Invoice.objects.get(pk=acme.pk).bill_to_tax_id == "DE811907980"


def test_an_invoice_in_chinese_names_the_rows(issued):
    client = Client()
    client.force_login(user_in(FINANCE_GROUP))
    page = client.get(f"/invoices/{issued['acme'].number}/", HTTP_ACCEPT_LANGUAGE="zh-hans").content.decode()
    for label in ("客户税号", "税务说明"):
        assert label in page, label
