"""An invoice's balance due: what the customer still owes on it, or is owed back (docs/billing.md,
Balance due). The one rule every page and CSV shows, and the periods page sums:

- Credited: the sum of its credit notes' totals, tax included.
- Not paid (no payment recorded, or the payment reversed): the total less what is credited.
- Paid: a payment settles what was due on its day, the total less the credit notes issued on or
  before that day, so the balance is 0; a credit note issued after the day of payment is owed back
  to the customer and shows as a negative balance.
- A draft (its month still closing) has no balance yet: nothing is due on an invoice not issued.

Pure, in integer minor units; shown through billing.money."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import date
from typing import Any

from django.db.models import Prefetch, QuerySet, prefetch_related_objects

from billing.models import CreditNote, Invoice, InvoiceStatusChange
from billing.money import format_minor_units, from_minor_units, money_text

__all__ = ["InvoiceBalance", "add_balances", "balance_of", "invoice_balance", "invoice_balances", "payment_in_force",
           "with_balance_records"]


@dataclass(frozen=True)
class InvoiceBalance:
    """An invoice's figures, or the sum of several invoices' figures in one currency."""

    currency: str
    subtotal_minor: int
    tax_minor: int
    total_minor: int  # subtotal + tax
    credited_minor: int  # its credit notes' totals, tax included
    due_minor: int | None  # None for a draft; negative: a credit owed to the customer

    @property
    def unpaid_minor(self) -> int:
        """What would be due if nothing were paid: the total less its credit notes."""
        return self.total_minor - self.credited_minor

    @property
    def owed_to_customer(self) -> bool:
        return self.due_minor is not None and self.due_minor < 0

    @property
    def subtotal_display(self) -> str:
        return format_minor_units(self.subtotal_minor, self.currency)

    @property
    def tax_display(self) -> str:
        return format_minor_units(self.tax_minor, self.currency)

    @property
    def total_display(self) -> str:
        return format_minor_units(self.total_minor, self.currency)

    @property
    def credited_display(self) -> str:
        return format_minor_units(self.credited_minor, self.currency)

    @property
    def due_display(self) -> str:
        return "" if self.due_minor is None else format_minor_units(self.due_minor, self.currency)

    # As pages show money (billing.money.money_text): grouped in the reader's language, with the
    # currency, so a list reads as the rest of the product ("1,827.35 USD"). The *_display texts
    # above stay plain decimals for the places that write their own currency column.
    def _text(self, minor: int | None) -> str:
        return "" if minor is None else money_text(from_minor_units(minor, self.currency), self.currency)

    @property
    def subtotal_text(self) -> str:
        return self._text(self.subtotal_minor)

    @property
    def tax_text(self) -> str:
        return self._text(self.tax_minor)

    @property
    def total_text(self) -> str:
        return self._text(self.total_minor)

    @property
    def credited_text(self) -> str:
        return self._text(self.credited_minor)

    @property
    def due_text(self) -> str:
        return self._text(self.due_minor)


def payment_in_force(changes: Iterable[tuple[str, date]]) -> date | None:
    """The day of the payment in force, from an invoice's recorded (status, on_date) in the order
    recorded: the last payment, unless a reversal was recorded after it."""
    paid_on: date | None = None
    for status, on_date in changes:
        if status == InvoiceStatusChange.Status.PAID:
            paid_on = on_date
        elif status == InvoiceStatusChange.Status.PAYMENT_REVERSED:
            paid_on = None
    return paid_on


def invoice_balance(*, finalized: bool, currency: str, total_minor: int, tax_minor: int,
                    credits: Iterable[tuple[date, int]], paid_on: date | None) -> InvoiceBalance:
    """The balance of one invoice (pure). `credits`: its credit notes' (issue_date, total_minor);
    `paid_on`: the day of the payment in force (`payment_in_force`), None when unpaid."""
    credits = list(credits)
    credited = sum(total for _day, total in credits)
    due: int | None
    if not finalized:
        due = None
    elif paid_on is None:
        due = total_minor - credited
    else:
        # The payment settled the balance of its day; later credit notes are owed back.
        due = -sum(total for day, total in credits if day > paid_on)
    return InvoiceBalance(currency=currency, subtotal_minor=total_minor - tax_minor, tax_minor=tax_minor,
                          total_minor=total_minor, credited_minor=credited, due_minor=due)


def add_balances(currency: str, balances: Sequence[InvoiceBalance]) -> InvoiceBalance:
    """The column sums of invoices in one currency; the balance sums the issued ones (None when
    there is none)."""
    if any(b.currency != currency for b in balances):
        raise ValueError(f"balances in other currencies than {currency} cannot be added")
    dues = [b.due_minor for b in balances if b.due_minor is not None]
    return InvoiceBalance(
        currency=currency, subtotal_minor=sum(b.subtotal_minor for b in balances),
        tax_minor=sum(b.tax_minor for b in balances), total_minor=sum(b.total_minor for b in balances),
        credited_minor=sum(b.credited_minor for b in balances), due_minor=sum(dues) if dues else None,
    )


def _records() -> tuple[Prefetch[Any], Prefetch[Any]]:
    # Status changes in the order recorded: a reversal undoes the payment recorded before it.
    return (Prefetch("credit_notes", queryset=CreditNote.objects.order_by("issued_at", "number")),
            Prefetch("status_changes", queryset=InvoiceStatusChange.objects.order_by("recorded_at", "id")))


def with_balance_records(invoices: QuerySet[Invoice]) -> QuerySet[Invoice]:
    """`invoices` with what their balances read (credit notes, status changes in recorded order)
    prefetched: three queries for any number of invoices."""
    return invoices.prefetch_related(*_records())


def balance_of(invoice: Invoice) -> InvoiceBalance:
    """`invoice_balance` of a stored invoice; reads its credit notes and status changes unless
    `with_balance_records` prefetched them."""
    prefetch_related_objects([invoice], *_records())
    return invoice_balance(
        finalized=invoice.status == Invoice.Status.FINALIZED, currency=invoice.currency,
        total_minor=invoice.total_minor, tax_minor=invoice.tax_minor,
        credits=[(n.issue_date, n.total_minor) for n in invoice.credit_notes.all()],
        paid_on=payment_in_force((c.status, c.on_date) for c in invoice.status_changes.all()),
    )


def invoice_balances(invoices: QuerySet[Invoice]) -> list[tuple[Invoice, InvoiceBalance]]:
    """Each invoice of `invoices` with its balance."""
    return [(invoice, balance_of(invoice)) for invoice in with_balance_records(invoices)]
