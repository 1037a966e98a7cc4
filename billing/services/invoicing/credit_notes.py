"""Credit notes: the correction of an issued invoice, as its own document (docs/exports.md, Credit notes).

A credit note credits a net amount of one finalized invoice, with the tax on it at the invoice's
rate, for a stated reason. It is numbered in its own sequence, CN-YYYY-NNNN by the year of issue
(gapless: numbers are taken under a table lock), and immutable once written (the database refuses
an update or a delete, migration 0019). An invoice's credit notes never exceed it: their net
amounts add up to at most its subtotal and their tax to at most its tax. Each credit's tax is
rounded once on its net (billing.services.invoicing.close.tax_minor_units), capped at the tax still
uncredited, and the credit that takes the last of the net takes the last of the tax, so crediting
an invoice in full, in any number of parts, credits exactly its total.

Late usage for a month already invoiced is still an adjustment line on the next invoice
(billing.services.invoicing.close): it is the ledger catching up, found by the close, not a decision.
A credit note is a person's decision about an issued invoice (a dispute, an outage credit, a
mistaken rate) and is audited as one.

Issuing one from the invoice page takes two steps: `preview_credit_note` checks everything issuing
would and states the note (net, tax, total, what is left after it), writing nothing; the person
confirms that, and `issue_credit_note` is given the invoice's credited net the preview showed
(`credited_net_minor`). If another note was issued in between (a second tab, a double click), the
confirmation no longer describes the invoice and is refused rather than issued twice.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import Decimal, InvalidOperation

from django.db import connection, transaction
from django.db.models import Sum
from django.utils.translation import gettext

from billing.errors import InvalidInput
from billing.models import CreditNote, Invoice
from billing.money import format_minor_units, minor_unit_exponent
from billing.pdf_fonts import undrawable
from billing.services.audit import record_audit_event
from billing.services.invoicing.close import current_issuer, tax_minor_units

__all__ = ["MAX_CREDIT_MAJOR", "REASON_MAX_CHARS", "CreditNoteIssued", "CreditNotePreview", "CreditRoom",
           "credit_tax_minor", "get_credit_room", "issue_credit_note", "parse_credit_amount", "preview_credit_note",
           "unprintable_message"]

REASON_MAX_CHARS = 500
# The largest net amount a credit note may state, in major units (an invoice's bigint minor units
# hold far more; this keeps every parsed amount exact in Decimal's default 28 digits).
MAX_CREDIT_MAJOR = Decimal(10) ** 12


@dataclass(frozen=True)
class CreditRoom:
    """What is left to credit on an invoice, in minor units: net (of its subtotal) and tax."""

    currency: str
    net_minor: int
    tax_minor: int

    @property
    def net_display(self) -> str:
        return format_minor_units(max(self.net_minor, 0), self.currency)


@dataclass(frozen=True)
class CreditNotePreview:
    """A credit note as it would be issued now, before anyone confirms it (nothing written)."""

    invoice_number: str
    tenant_name: str
    currency: str
    amount_minor: int
    tax_minor: int
    reason: str
    credited_net_minor: int  # the invoice's credited net before this note: what the confirmation states
    room_after: CreditRoom

    @property
    def total_minor(self) -> int:
        return self.amount_minor + self.tax_minor

    @property
    def amount_display(self) -> str:
        return format_minor_units(self.amount_minor, self.currency)

    @property
    def tax_display(self) -> str:
        return format_minor_units(self.tax_minor, self.currency)

    @property
    def total_display(self) -> str:
        return format_minor_units(self.total_minor, self.currency)


@dataclass(frozen=True)
class CreditNoteIssued:
    number: str
    invoice_number: str
    currency: str
    amount_minor: int
    tax_minor: int
    total_minor: int


def _credited(invoice: Invoice) -> tuple[int, int]:
    sums = invoice.credit_notes.aggregate(net=Sum("amount_minor"), tax=Sum("tax_minor"))
    return int(sums["net"] or 0), int(sums["tax"] or 0)


def _room(invoice: Invoice) -> CreditRoom:
    net, tax = _credited(invoice)
    return CreditRoom(currency=invoice.currency, net_minor=invoice.subtotal_minor - net,
                      tax_minor=invoice.tax_minor - tax)


def credit_tax_minor(*, amount_minor: int, room: CreditRoom, rate_pct: Decimal) -> int:
    """The tax a credit of `amount_minor` (net, 0 < amount <= room.net_minor) credits: rounded once on
    its net, at most the tax still uncredited, and all of it when the credit takes the last of the
    net. So the credits of an invoice never exceed its tax, and crediting it in full credits its
    tax exactly, however it is split."""
    if amount_minor == room.net_minor:
        return room.tax_minor
    return min(tax_minor_units(amount_minor, rate_pct, room.currency), room.tax_minor)


def get_credit_room(*, invoice_number: str) -> CreditRoom:
    """What may still be credited on a finalized invoice (refused for a draft or an unknown one)."""
    return _room(_finalized_invoice(invoice_number))


def _finalized_invoice(number: str) -> Invoice:
    invoice = Invoice.objects.filter(number=number).first()
    if invoice is None:
        raise InvalidInput(gettext("There is no invoice %(number)s.") % {"number": number})
    if invoice.status != Invoice.Status.FINALIZED:
        raise InvalidInput(gettext("Invoice %(number)s is a draft: only an issued invoice can be credited.")
                           % {"number": number})
    return invoice


def parse_credit_amount(text: str, currency: str) -> int:
    """A net amount typed in major units ("12.5", "12.50") as positive minor units; refused with
    the reason when it is not a number, not above zero, or finer than the currency's minor unit."""
    places = minor_unit_exponent(currency)
    try:
        amount = Decimal(text.strip().replace(",", ""))
    except InvalidOperation:
        raise InvalidInput(gettext("The amount %(text)s is not a number; write it like 12.50.")
                           % {"text": repr(text)}) from None
    if not amount.is_finite() or amount <= 0:
        raise InvalidInput(gettext("The amount must be more than zero."))
    # Bounded before any arithmetic: 1e9999999 would overflow the context and 1e-9999999 underflow
    # to a zero credit; no invoice is anywhere near MAX_CREDIT_MAJOR.
    if amount > MAX_CREDIT_MAJOR:
        raise InvalidInput(gettext("The amount may be at most %(max)s.") % {"max": MAX_CREDIT_MAJOR})
    if amount != amount.quantize(Decimal(1).scaleb(-places)):
        raise InvalidInput(gettext("The amount %(text)s has more decimals than %(currency)s has (%(places)s).")
                           % {"text": text.strip(), "currency": currency, "places": places})
    return int(amount.scaleb(places))


def unprintable_message(characters: list[str]) -> str:
    """Why a text that the PDFs cannot print is refused, naming its characters (as U+XXXX, since an
    invisible or control character shows as nothing)."""
    return gettext("The PDF font cannot print %(chars)s; use Latin, Greek, Cyrillic or Chinese letters, "
                   "without emoji or control characters.") % {"chars": ", ".join(f"U+{ord(c):04X}" for c in characters)}


def _next_number(year: int) -> str:
    """CN-YYYY-NNNN: one more than the year's highest (the caller holds the table lock)."""
    prefix = f"CN-{year:04d}-"
    numbers = CreditNote.objects.filter(number__startswith=prefix).values_list("number", flat=True)
    highest = max((int(n.removeprefix(prefix)) for n in numbers), default=0)
    return f"{prefix}{highest + 1:04d}"


def _checked_reason(reason: str) -> str:
    reason = reason.strip()
    if not reason:
        raise InvalidInput(gettext("Give the reason for the credit note; it is printed on it."))
    if len(reason) > REASON_MAX_CHARS:
        raise InvalidInput(gettext("The reason is %(n)s characters long; at most %(max)s fit on the credit note.")
                           % {"n": len(reason), "max": REASON_MAX_CHARS})
    # Refused here, not at rendering: the note is immutable, and its PDF prints the reason.
    if bad := undrawable(reason):
        raise InvalidInput(unprintable_message(bad))
    return reason


def _checked_credit(invoice: Invoice, amount_text: str, reason: str) -> CreditNotePreview:
    """Every rule a credit note of `amount_text` for `reason` on `invoice` must meet, and the note."""
    reason = _checked_reason(reason)
    amount_minor = parse_credit_amount(amount_text, invoice.currency)
    room = _room(invoice)
    if amount_minor > room.net_minor:
        raise InvalidInput(gettext("A credit note of %(amount)s %(currency)s exceeds what is left to credit on "
                                   "%(number)s: %(left)s %(currency)s (net, before tax).")
                           % {"amount": format_minor_units(amount_minor, invoice.currency),
                              "currency": invoice.currency, "number": invoice.number, "left": room.net_display})
    tax_minor = credit_tax_minor(amount_minor=amount_minor, room=room, rate_pct=invoice.tax_rate_pct)
    return CreditNotePreview(
        invoice_number=invoice.number, tenant_name=invoice.bill_to_name or invoice.tenant.name, currency=invoice.currency,
        amount_minor=amount_minor, tax_minor=tax_minor, reason=reason,
        credited_net_minor=invoice.subtotal_minor - room.net_minor,
        room_after=CreditRoom(currency=room.currency, net_minor=room.net_minor - amount_minor,
                              tax_minor=room.tax_minor - tax_minor),
    )


def preview_credit_note(*, invoice_number: str, amount_text: str, reason: str) -> CreditNotePreview:
    """The credit note `issue_credit_note` would issue now, checked by the same rules (InvalidInput
    when it would be refused); writes nothing."""
    return _checked_credit(_finalized_invoice(invoice_number), amount_text, reason)


def issue_credit_note(
    *, invoice_number: str, amount_text: str, reason: str, now: datetime, actor_label: str,
    actor_id: int | None = None, credited_net_minor: int | None = None,
) -> CreditNoteIssued:
    """Issue a credit note of `amount_text` (net, major units) on a finalized invoice, for `reason`,
    numbered, audited (`credit_note.issued`) and written in one transaction. Refused (InvalidInput,
    nothing written) for an unknown or draft invoice, an amount that is not a positive amount of
    the invoice's currency or exceeds what is left to credit, an empty or overlong reason, or, when
    `credited_net_minor` is given (the invoice's credited net a confirmed preview stated), an invoice
    credited differently since."""
    _checked_reason(reason)  # before the lock: a bad reason needs no look at the invoice
    with transaction.atomic():
        # One credit note at a time, fleet-wide: its number is gapless and its invoice's room exact.
        with connection.cursor() as cursor:
            cursor.execute("LOCK TABLE billing_creditnote IN EXCLUSIVE MODE")
        invoice = _finalized_invoice(invoice_number)
        checked = _checked_credit(invoice, amount_text, reason)
        if credited_net_minor is not None and credited_net_minor != checked.credited_net_minor:
            raise InvalidInput(gettext("Invoice %(number)s was credited since you reviewed this credit note "
                                       "(%(then)s %(currency)s credited then, %(now)s now): review it again.")
                               % {"number": invoice.number, "currency": invoice.currency,
                                  "then": format_minor_units(credited_net_minor, invoice.currency),
                                  "now": format_minor_units(checked.credited_net_minor, invoice.currency)})
        amount_minor, tax_minor, reason = checked.amount_minor, checked.tax_minor, checked.reason
        issuer = current_issuer()
        note = CreditNote.objects.create(
            number=_next_number(now.astimezone(UTC).year), invoice=invoice, currency=invoice.currency,
            amount_minor=amount_minor, tax_minor=tax_minor, total_minor=amount_minor + tax_minor, reason=reason,
            issued_at=now, issue_date=now.astimezone(UTC).date(), issued_by_id=actor_id, issued_by_label=actor_label,
            issuer_name=issuer.name, issuer_address=issuer.address, issuer_tax_id=issuer.tax_id,
        )
        record_audit_event(
            at=now, actor_id=actor_id, actor_label=actor_label, action="credit_note.issued",
            object_type="credit_note", object_id=note.number, before=None,
            after={"invoice": invoice.number, "amount": format_minor_units(amount_minor, invoice.currency),
                   "tax": format_minor_units(tax_minor, invoice.currency),
                   "total": format_minor_units(note.total_minor, invoice.currency),
                   "currency": invoice.currency, "reason": reason},
        )
    return CreditNoteIssued(number=note.number, invoice_number=invoice.number, currency=note.currency,
                            amount_minor=note.amount_minor, tax_minor=note.tax_minor, total_minor=note.total_minor)
