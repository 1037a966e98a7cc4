"""Invoice payment status: finance records that an issued invoice was sent, paid, or its payment
reversed, each on its day (audited, append-only in the database); overdue is computed from the due
date and today on every read, so the invoice list, the invoice page and the tenant's portal say
overdue the day after the due date with nothing recorded, and never say it of a paid invoice."""

from __future__ import annotations

from datetime import UTC, date, datetime, timedelta

import pytest
import time_machine
from django.db import IntegrityError, InternalError, transaction
from django.test import Client
from hypothesis import given
from hypothesis import strategies as st

from billing.errors import InvalidInput
from billing.models import AuditEvent, BillingPeriod, Invoice, InvoiceStatusChange
from billing.scope import ADMIN_GROUP, FINANCE_GROUP, Scope
from billing.services.exports import list_invoices
from billing.services.invoicing import payment_status, record_invoice_status
from tests.billing.test_credit_notes import AFTER_NOV, credit, finalized_invoice
from tests.conftest import user_in

pytestmark = pytest.mark.django_db

EVERYONE = Scope(tenants=None, is_finance=True, is_admin=True)
ISSUED = AFTER_NOV.date()  # 2026-12-02, due 30 days later
DUE = ISSUED + timedelta(days=30)


def at(day: date, hour: int = 12) -> datetime:
    return datetime(day.year, day.month, day.day, hour, tzinfo=UTC)


def record(invoice: Invoice, status: str, on: date, *, now: datetime | None = None, note: str = ""):
    return record_invoice_status(invoice_number=invoice.number, status=status, on_date=on, note=note,
                                 now=now or at(on), actor_label="finance-1")


def shown(day: date):
    return {i.number: i.payment for i in list_invoices(scope=EVERYONE, today=day)}


# --- The status as shown ----------------------------------------------------------------------------

def test_issued_then_overdue_the_day_after_the_due_date_then_paid():
    invoice = finalized_invoice()
    assert shown(DUE)[invoice.number].state == "issued"
    after = shown(DUE + timedelta(days=1))[invoice.number]
    assert (after.state, after.days_overdue, after.due_date) == ("overdue", 1, DUE)
    assert shown(DUE + timedelta(days=10))[invoice.number].days_overdue == 10

    record(invoice, "sent", ISSUED + timedelta(days=1))
    status = shown(ISSUED + timedelta(days=2))[invoice.number]
    assert (status.state, status.sent_on) == ("sent", ISSUED + timedelta(days=1))
    # Sent does not stop it being overdue: it is the due date that counts.
    assert shown(DUE + timedelta(days=3))[invoice.number].state == "overdue"

    record(invoice, "paid", DUE + timedelta(days=3))
    status = shown(DUE + timedelta(days=3))[invoice.number]
    assert (status.state, status.paid_on, status.days_overdue) == ("paid", DUE + timedelta(days=3), 0)
    assert shown(DUE + timedelta(days=400))[invoice.number].state == "paid"


def test_a_reversed_payment_makes_it_due_again_and_a_new_payment_pays_it():
    invoice = finalized_invoice()
    record(invoice, "paid", ISSUED + timedelta(days=5))
    record(invoice, "payment_reversed", ISSUED + timedelta(days=6), note="chargeback")
    assert shown(ISSUED + timedelta(days=7))[invoice.number].state == "issued"
    assert shown(DUE + timedelta(days=2))[invoice.number].state == "overdue"
    record(invoice, "paid", DUE + timedelta(days=2), now=at(DUE + timedelta(days=2)))
    assert shown(DUE + timedelta(days=2))[invoice.number].paid_on == DUE + timedelta(days=2)
    assert [c.status for c in InvoiceStatusChange.objects.filter(invoice=invoice)] == [
        "paid", "payment_reversed", "paid"]


def test_an_invoice_credited_in_full_is_never_overdue():
    invoice = finalized_invoice(subtotal_minor=10_000)
    credit(invoice, "100.00")
    assert shown(DUE + timedelta(days=30))[invoice.number].state == "issued"


def test_a_draft_has_no_payment_status_and_refuses_one():
    invoice = finalized_invoice()
    draft = Invoice.objects.create(tenant=invoice.tenant, number="VGL-202612-acme", currency="USD",
                                   period=BillingPeriod.objects.create(month=date(2026, 12, 1)),
                                   created_at=AFTER_NOV)
    assert shown(DUE + timedelta(days=5))[draft.number].state == "draft"
    with pytest.raises(InvalidInput, match="draft"):
        record(draft, "sent", ISSUED)
    assert not InvoiceStatusChange.objects.filter(invoice=draft).exists()


@given(st.lists(st.tuples(st.sampled_from(["sent", "paid", "payment_reversed"]), st.integers(0, 60)), max_size=8),
       st.integers(0, 90), st.integers(0, 10_000))
def test_the_state_follows_the_last_payment_and_overdue_only_after_the_due_date(changes, today_offset, due_minor):
    """Whatever was recorded: paid exactly when the last payment was not reversed after it; overdue
    exactly when not paid, something is due and today is after the due date; and overdue never
    depends on what was sent."""
    today = ISSUED + timedelta(days=today_offset)
    recorded = [(s, ISSUED + timedelta(days=d)) for s, d in changes]
    status = payment_status(finalized=True, issue_date=ISSUED, due_date=DUE, due_minor=due_minor,
                            changes=recorded, today=today)
    payments = [s for s, _ in recorded if s != "sent"]
    paid = bool(payments) and payments[-1] == "paid"
    assert (status.state == "paid") == paid
    assert (status.state == "overdue") == (not paid and due_minor > 0 and today > DUE)
    assert status.days_overdue == ((today - DUE).days if status.state == "overdue" else 0)
    unsent = payment_status(finalized=True, issue_date=ISSUED, due_date=DUE, due_minor=due_minor,
                            changes=[c for c in recorded if c[0] != "sent"], today=today)
    assert unsent.is_overdue == status.is_overdue


# --- Recording: the rules ---------------------------------------------------------------------------

@pytest.mark.parametrize(("status", "on", "message"), [
    ("sent", ISSUED - timedelta(days=1), "before the invoice's issue date"),
    ("paid", ISSUED + timedelta(days=2), "in the future"),
    ("payment_reversed", ISSUED, "no payment to reverse"),
    ("refunded", ISSUED, "not a payment status"),
])
def test_refused_changes_say_why_and_write_nothing(status, on, message):
    invoice = finalized_invoice()
    with pytest.raises(InvalidInput, match=message):
        record(invoice, status, on, now=at(ISSUED + timedelta(days=1)))
    assert not InvoiceStatusChange.objects.exists()
    assert not AuditEvent.objects.filter(action="invoice.status_recorded").exists()


def test_a_paid_invoice_refuses_another_payment_and_a_send_and_a_long_note():
    invoice = finalized_invoice()
    record(invoice, "paid", ISSUED)
    for status in ("paid", "sent"):
        with pytest.raises(InvalidInput, match="already paid"):
            record(invoice, status, ISSUED)
    with pytest.raises(InvalidInput, match="at most 200"):
        record(invoice, "payment_reversed", ISSUED, note="x" * 201)
    with pytest.raises(InvalidInput, match="no invoice"):
        record_invoice_status(invoice_number="VGL-000000-none", status="paid", on_date=ISSUED, note="",
                              now=at(ISSUED), actor_label="finance-1")
    assert InvoiceStatusChange.objects.count() == 1


def test_each_change_is_audited_with_before_and_after():
    invoice = finalized_invoice()
    record(invoice, "sent", ISSUED)
    record(invoice, "paid", ISSUED + timedelta(days=3), note="wire 4471")
    events = list(AuditEvent.objects.filter(action="invoice.status_recorded").order_by("id"))
    assert [(e.object_id, e.actor_label) for e in events] == [(invoice.number, "finance-1")] * 2
    assert events[1].before == {"sent_on": ISSUED.isoformat(), "paid_on": None}
    assert events[1].after == {"status": "paid", "on_date": (ISSUED + timedelta(days=3)).isoformat(),
                               "note": "wire 4471"}


def test_the_database_keeps_status_changes_append_only_and_on_finalized_invoices_only():
    invoice = finalized_invoice()
    change = record(invoice, "paid", ISSUED)
    with transaction.atomic(), pytest.raises((IntegrityError, InternalError), match="append-only"):
        InvoiceStatusChange.objects.filter(pk=change.pk).update(on_date=ISSUED + timedelta(days=1))
    with transaction.atomic(), pytest.raises((IntegrityError, InternalError), match="append-only"):
        InvoiceStatusChange.objects.filter(pk=change.pk).delete()
    draft = Invoice.objects.create(tenant=invoice.tenant, number="VGL-202612-acme", currency="USD",
                                   period=BillingPeriod.objects.create(month=date(2026, 12, 1)), created_at=AFTER_NOV)
    with transaction.atomic(), pytest.raises((IntegrityError, InternalError), match="finalized invoice only"):
        InvoiceStatusChange.objects.create(invoice=draft, status="paid", on_date=ISSUED, recorded_at=AFTER_NOV,
                                           recorded_by="x")


# --- Pages --------------------------------------------------------------------------------------------

def _client(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def test_finance_marks_an_invoice_paid_from_its_page_and_the_list_and_portal_show_it():
    invoice = finalized_invoice()
    with time_machine.travel(at(DUE + timedelta(days=4)), tick=True):
        # Signed in on the day: a session from the real today may be expired there, or not begun.
        finance = _client(user_in(FINANCE_GROUP))
        member = _client(user_in(tenant="acme"))
        listing = finance.get("/invoices/").content.decode()
        assert 'data-testid="payment-status-VGL-202611-acme" data-state="overdue"' in listing
        portal = member.get("/tenants/acme/").content.decode()
        assert 'data-testid="overdue-invoices"' in portal
        assert 'data-state="overdue"' in portal
        page = finance.get(f"/invoices/{invoice.number}/").content.decode()
        assert 'data-testid="invoice-status-form"' in page
        answer = finance.post(f"/invoices/{invoice.number}/status/",
                              {"status": "paid", "on_date": (DUE + timedelta(days=2)).isoformat(), "note": "wire"})
        assert answer.status_code == 302
        listing = finance.get("/invoices/").content.decode()
        assert 'data-testid="payment-status-VGL-202611-acme" data-state="paid"' in listing
        portal = member.get("/tenants/acme/").content.decode()
        assert 'data-testid="overdue-invoices"' not in portal
        page = finance.get(f"/invoices/{invoice.number}/").content.decode()
        assert 'data-testid="payment-history-row" data-status="paid"' in page


def test_a_tenant_member_sees_the_status_but_cannot_record_one():
    invoice = finalized_invoice()
    member = _client(user_in(tenant="acme"))
    page = member.get(f"/invoices/{invoice.number}/").content.decode()
    assert 'data-testid="payment-status-VGL-202611-acme"' in page
    assert 'data-testid="invoice-status-form"' not in page
    answer = member.post(f"/invoices/{invoice.number}/status/", {"status": "paid", "on_date": ISSUED.isoformat()})
    assert answer.status_code == 403
    assert not InvoiceStatusChange.objects.exists()


def test_bad_input_from_the_page_is_a_400_that_names_it_and_an_unknown_invoice_a_404():
    invoice = finalized_invoice()
    with time_machine.travel(at(ISSUED + timedelta(days=1)), tick=True):
        admin = _client(user_in(ADMIN_GROUP))
        answer = admin.post(f"/invoices/{invoice.number}/status/",
                            {"status": "paid", "on_date": (ISSUED + timedelta(days=5)).isoformat()})
        assert answer.status_code == 400
        assert "in the future" in answer.content.decode()
        answer = admin.post(f"/invoices/{invoice.number}/status/", {"status": "paid", "on_date": "31/12/2026"})
        assert answer.status_code == 400
        assert "Enter a date as 2026-01-31." in answer.content.decode()
        assert admin.post("/invoices/VGL-000000-none/status/",
                          {"status": "paid", "on_date": ISSUED.isoformat()}).status_code == 404
    assert not InvoiceStatusChange.objects.exists()


def test_a_tenant_sees_on_its_portal_what_it_still_owes_with_credits_taken_off():
    """The portal's invoices carry the list's Credited and Balance due, and the overdue banner names the
    amount still due (total less credits), not the total."""
    invoice = finalized_invoice()  # 100.00 + 20 % tax = 120.00
    credit(invoice, "10")  # 10.00 net + 2.00 tax
    with time_machine.travel(at(DUE + timedelta(days=4)), tick=True):
        portal = _client(user_in(tenant="acme")).get("/tenants/acme/").content.decode()
    row = portal.split('data-testid="tenant-invoice-row" data-number="VGL-202611-acme"', 1)[1].split("</tr>", 1)[0]
    assert "120.00" in row
    assert "12.00" in row
    balance = row.split('data-testid="tenant-invoice-balance"', 1)[1].split("</td>", 1)[0]
    assert "108.00" in balance
    banner = portal.split('data-testid="overdue-invoices"', 1)[1].split("</p>", 1)[0]
    assert "108.00 USD" in banner
    assert "120.00" not in banner
