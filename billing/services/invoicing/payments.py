"""An invoice's payment status: issued, sent, paid or overdue, with the dates (docs/exports.md,
Payment status).

Finance records what happened to an issued invoice, each on the day it happened: sent to the
customer, paid, or a payment reversed (recorded in error, or returned). The records are append-only
(`InvoiceStatusChange`, immutable in the database), because a finalized invoice is immutable and its
status cannot be a field on it. The status shown is derived from those records and the invoice's due
date *at the moment it is shown*: overdue is never stored, so it is never stale.

- draft: not issued yet (a month still closing); nothing can be recorded.
- paid: the last payment recorded and not reversed.
- overdue: not paid, something is still due (the total less its credit notes), and today (UTC) is
  after the due date.
- sent: not paid, not overdue, and sent on a recorded day.
- issued: none of the above.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import date, datetime

from django.db import transaction
from django.utils.translation import gettext, gettext_lazy

from billing.errors import InvalidInput
from billing.models import Invoice, InvoiceStatusChange
from billing.services.audit import record_audit_event
from billing.services.input_limits import max_length, text_problem
from billing.services.invoicing.balance import payment_in_force

__all__ = ["NOTE_MAX_CHARS", "PAYMENT_STATES", "PaymentStatus", "invoice_issue_date", "payment_status",
           "record_invoice_status"]

NOTE_MAX_CHARS = max_length(InvoiceStatusChange, "note")

# Shown states; the recorded ones are InvoiceStatusChange.Status.
PAYMENT_STATES = {
    "draft": gettext_lazy("draft"),
    "issued": gettext_lazy("issued"),
    "sent": gettext_lazy("sent"),
    "paid": gettext_lazy("paid"),
    "overdue": gettext_lazy("overdue"),
}


@dataclass(frozen=True)
class PaymentStatus:
    """Where an invoice stands on `today`, from its recorded changes."""

    state: str  # a key of PAYMENT_STATES
    issue_date: date | None
    due_date: date | None
    sent_on: date | None  # the last day it was sent, if ever
    paid_on: date | None  # the day of the payment in force (None once reversed)
    days_overdue: int  # 0 unless overdue

    @property
    def label(self) -> str:
        return str(PAYMENT_STATES[self.state])

    @property
    def is_overdue(self) -> bool:
        return self.state == "overdue"

    @property
    def state_date(self) -> date | None:
        """The date that goes with the state: sent, paid, due (overdue since), or issued."""
        return {"paid": self.paid_on, "sent": self.sent_on, "overdue": self.due_date,
                "issued": self.issue_date}.get(self.state)


def payment_status(*, finalized: bool, issue_date: date | None, due_date: date | None, due_minor: int,
                   changes: Iterable[tuple[str, date]], today: date) -> PaymentStatus:
    """The status of an invoice on `today` (pure). `changes`: its recorded (status, on_date), in the
    order recorded; `due_minor`: what is still to pay unless paid (InvoiceBalance.unpaid_minor: the
    total less its credit notes), so an invoice credited in full is never overdue."""
    changes = list(changes)
    sent_on: date | None = None
    for status, on_date in changes:
        if status == InvoiceStatusChange.Status.SENT:
            sent_on = on_date
    paid_on = payment_in_force(changes)
    days_overdue = 0
    if not finalized:
        state = "draft"
    elif paid_on is not None:
        state = "paid"
    elif due_date is not None and today > due_date and due_minor > 0:
        state, days_overdue = "overdue", (today - due_date).days
    elif sent_on is not None:
        state = "sent"
    else:
        state = "issued"
    return PaymentStatus(state=state, issue_date=issue_date, due_date=due_date, sent_on=sent_on, paid_on=paid_on,
                         days_overdue=days_overdue)


def invoice_issue_date(invoice: Invoice) -> date | None:
    """The issue date as the invoice's document states it (invoices finalized before issue dates
    were copied onto them: the day of finalization)."""
    return invoice.issue_date or (invoice.finalized_at.date() if invoice.finalized_at else None)


def _check_change(invoice: Invoice, *, status: str, on_date: date, today: date, paid: bool) -> None:
    if invoice.status != Invoice.Status.FINALIZED:
        raise InvalidInput(gettext("Invoice %(number)s is a draft: a payment status is recorded on an issued "
                                   "invoice.") % {"number": invoice.number})
    issued = invoice_issue_date(invoice)
    if issued is not None and on_date < issued:
        raise InvalidInput(gettext("%(date)s is before the invoice's issue date, %(issued)s.")
                           % {"date": on_date.isoformat(), "issued": issued.isoformat()})
    if on_date > today:
        raise InvalidInput(gettext("%(date)s is in the future: record a status on the day it happened, today "
                                   "(%(today)s) at the latest.") % {"date": on_date.isoformat(),
                                                                    "today": today.isoformat()})
    if status in (InvoiceStatusChange.Status.SENT, InvoiceStatusChange.Status.PAID) and paid:
        raise InvalidInput(gettext("Invoice %(number)s is already paid; if that payment was recorded in error or "
                                   "returned, record the payment as reversed first.") % {"number": invoice.number})
    if status == InvoiceStatusChange.Status.PAYMENT_REVERSED and not paid:
        raise InvalidInput(gettext("Invoice %(number)s has no payment to reverse.") % {"number": invoice.number})


def _note(text: str) -> str:
    note = text.strip()
    if len(note) > NOTE_MAX_CHARS:
        raise InvalidInput(gettext("The note is %(n)s characters long; at most %(max)s.")
                           % {"n": len(note), "max": NOTE_MAX_CHARS})
    if problem := text_problem(note):
        raise InvalidInput(gettext("The note cannot be stored: it %(problem)s.") % {"problem": problem})
    return note


def record_invoice_status(*, invoice_number: str, status: str, on_date: date, note: str, now: datetime,
                          actor_label: str, actor_id: int | None = None) -> InvoiceStatusChange:
    """Record that an issued invoice was sent, paid, or its payment reversed, on `on_date`; audited
    (`invoice.status_recorded`) in the same transaction. Refused (InvalidInput, nothing written) for
    an unknown or draft invoice, an unknown status, a day before the issue date or after today
    (UTC), a payment on a paid invoice, a reversal with no payment, or a note too long."""
    if status not in InvoiceStatusChange.Status.values:
        raise InvalidInput(gettext("%(status)s is not a payment status; one of: %(choices)s.")
                           % {"status": repr(status), "choices": ", ".join(InvoiceStatusChange.Status.values)})
    note = _note(note)
    today = now.date()
    with transaction.atomic():
        # Two finance users at once: the second waits and sees the first one's record.
        invoice = Invoice.objects.select_for_update().filter(number=invoice_number).first()
        if invoice is None:
            raise InvalidInput(gettext("There is no invoice %(number)s.") % {"number": invoice_number})
        changes = list(invoice.status_changes.order_by("recorded_at", "id").values_list("status", "on_date"))
        before = payment_status(finalized=invoice.status == Invoice.Status.FINALIZED, issue_date=invoice_issue_date(invoice),
                                due_date=invoice.due_date, due_minor=1, changes=changes, today=today)
        _check_change(invoice, status=status, on_date=on_date, today=today, paid=before.paid_on is not None)
        change = InvoiceStatusChange.objects.create(invoice=invoice, status=status, on_date=on_date, note=note,
                                                    recorded_at=now, recorded_by=actor_label)
        record_audit_event(
            at=now, actor_id=actor_id, actor_label=actor_label, action="invoice.status_recorded",
            object_type="invoice", object_id=invoice.number,
            before={"sent_on": _iso(before.sent_on), "paid_on": _iso(before.paid_on)},
            after={"status": status, "on_date": on_date.isoformat(), "note": note},
        )
    return change


def _iso(day: date | None) -> str | None:
    return None if day is None else day.isoformat()
