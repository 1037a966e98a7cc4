"""The invoice CSV: one row per invoice line, then subtotal, tax and total rows; amounts in minor
units and in formatted major units (billing.money), GPU-hours to the documents' GPU_HOURS_PLACES.
Each row repeats the invoice's header fields (number, tenant, period, issue and due dates, payment
terms, PO number, cost centre) and, in its last columns, the customer's billing address, tax ID and
tax exemption note. `line_number_cells` writes a line's numbers for this CSV and for the
upcoming invoice's. The credit note CSV: one row per credit note, in the same money columns."""

from __future__ import annotations

import io
from collections.abc import Sequence
from datetime import date
from decimal import Decimal
from typing import Protocol

from billing.csv_files import csv_writer, number
from billing.models import InvoiceLine
from billing.money import format_minor_units
from billing.services.exports.invoices import CreditNoteDocument, InvoiceDocument, gpu_hours_text
from billing.services.exports.numbers import plain_decimal
from billing.services.invoicing import AppliedRate

__all__ = ["CREDIT_NOTE_CSV_COLUMNS", "INVOICE_CSV_COLUMNS", "NO_UNIT_PRICE_CELLS", "UNIT_PRICE_COLUMNS",
           "line_number_cells", "render_credit_note_csv", "render_invoice_csv", "unit_price_cells"]

_HEADER_COLUMNS = ("invoice_number", "tenant", "tenant_name", "billing_period", "issue_date", "due_date",
                   "payment_terms_days", "po_number", "cost_centre")
# A line's quantity, unit, unit price and billing rule (`unit_price_cells`), on the invoice CSV and the
# upcoming invoice's alike.
UNIT_PRICE_COLUMNS = ("quantity", "unit", "unit_price", "unit_price_kind", "rates", "billed_basis", "alpha",
                      "no_unit_price_reason")
INVOICE_CSV_COLUMNS = (
    *_HEADER_COLUMNS, "line", "kind", "gpu_model", "sla_tier",
    "usage_month", "gpu_hours", "amount_ledger", "amount_minor", "amount", "currency",
    # Appended, so readers of the columns above are undisturbed (docs/exports.md, Invoice CSV).
    *UNIT_PRICE_COLUMNS,
    # The customer's billing details as issued, on every row like the header fields above.
    *("bill_to_address", "bill_to_tax_id", "tax_exemption_note"),
)
CREDIT_NOTE_CSV_COLUMNS = (
    "credit_note_number", "issue_date", "corrects_invoice", "tenant", "tenant_name", "billing_period", "reason",
    "tax_rate_pct", "amount_minor", "tax_minor", "total_minor", "amount", "tax", "total", "currency",
)


def _day(value: object) -> str:
    return f"{value:%Y-%m-%d}" if value else ""


def _head(doc: InvoiceDocument) -> list[object]:
    terms = "" if doc.payment_terms_days is None else doc.payment_terms_days
    return [doc.number, doc.tenant_slug, doc.tenant_name, f"{doc.month:%Y-%m}", _day(doc.issue_date),
            _day(doc.due_date), terms, doc.po_number, doc.cost_centre]


def _bill_to(doc: InvoiceDocument) -> list[object]:
    # The address keeps its line breaks inside one quoted cell.
    return [doc.bill_to_address, doc.bill_to_tax_id, doc.tax_exemption_note]


def render_invoice_csv(doc: InvoiceDocument) -> bytes:
    """One row per invoice line, then subtotal, tax and total rows; GPU-hours to the documents'
    stated places, amounts in minor units and formatted major units."""
    out = io.StringIO()
    writer = csv_writer(out, lineterminator="\n")
    writer.writerow(INVOICE_CSV_COLUMNS)
    head, bill_to = _head(doc), _bill_to(doc)
    for i, line in enumerate(doc.lines, start=1):
        writer.writerow([
            *head, i, line.kind, line.gpu_model, line.sla_tier, f"{line.usage_month:%Y-%m}",
            *line_number_cells(line.gpu_hours, line.amount, line.amount_minor, doc.currency), doc.currency,
            *unit_price_cells(line), *bill_to,
        ])
    # The tax row's kind column carries its rate, e.g. "tax 20%".
    for label, kind, minor in (("subtotal", "", doc.subtotal_minor),
                               ("tax", f"tax {plain_decimal(doc.tax_rate_pct)}%", doc.tax_minor)):
        writer.writerow([*head, label, kind, "", "", "", "", "", minor, number(format_minor_units(minor, doc.currency)),
                         doc.currency, *NO_UNIT_PRICE_CELLS, *bill_to])
    writer.writerow([*head, "total", "", "", "", "", "", "", doc.total_minor,
                     number(format_minor_units(doc.total_minor, doc.currency)), doc.currency, *NO_UNIT_PRICE_CELLS,
                     *bill_to])
    return out.getvalue().encode("utf-8")



# The unit-price columns of a row that is no line (subtotal, tax, total).
NO_UNIT_PRICE_CELLS = ("",) * len(UNIT_PRICE_COLUMNS)
# `no_unit_price_reason` of each line kind without one; a usage line finalized before unit prices were
# recorded says "not_recorded".
_REASONS: dict[str, str] = {InvoiceLine.Kind.IDLE: "idle", InvoiceLine.Kind.ADJUSTMENT: "adjustment"}


class _Line(Protocol):
    """A line as an issued invoice (InvoiceLineView) or the upcoming one (PricedLine) holds it."""

    @property
    def kind(self) -> str: ...
    @property
    def usage_month(self) -> date: ...
    @property
    def gpu_hours(self) -> Decimal: ...
    @property
    def unit_price(self) -> Decimal | None: ...
    @property
    def rates(self) -> Sequence[AppliedRate]: ...
    @property
    def unit_price_is_average(self) -> bool: ...


def unit_price_cells(line: _Line) -> list[object]:
    """`quantity` … `no_unit_price_reason` of one line (docs/exports.md): the GPU-hours as stored
    (6 places, so quantity × unit_price meets amount_ledger), the unit, the unit price, whether it is
    the one rate or an average, the rates that priced the line ("5.12 from … until …", ISO instants,
    "committed" for a commitment's rate), the billing rule, and why a line has no unit price."""
    usage = line.kind == InvoiceLine.Kind.USAGE
    if not usage or line.unit_price is None:
        reason = _REASONS.get(line.kind, "not_recorded")
        return [number(f"{line.gpu_hours:.6f}") if usage else "", "GPU-hour" if usage else "", "", "", "", "", "",
                reason]
    rules = list(dict.fromkeys((r.billed_basis, plain_decimal(r.alpha)) for r in line.rates))
    rates = "; ".join(f"{plain_decimal(r.price_per_gpu_hour)} from {r.start:%Y-%m-%dT%H:%MZ} until {r.end:%Y-%m-%dT%H:%MZ}"
                      + (" committed" if r.commitment else "") for r in line.rates)
    return [number(f"{line.gpu_hours:.6f}"), "GPU-hour", number(f"{line.unit_price:.6f}"),
            "average" if line.unit_price_is_average else "rate", rates, " / ".join(b for b, _ in rules),
            " / ".join(a for _, a in rules), ""]


def line_number_cells(gpu_hours: Decimal, amount: Decimal, amount_minor: int, currency: str) -> list[object]:
    """`gpu_hours`, `amount_ledger`, `amount_minor`, `amount` of one line: GPU-hours to the documents' places,
    the ledger amount exactly (what the one rounding started from; docs/exports.md), the rounded
    amount in minor units and in major units with the currency's decimals."""
    return [number(gpu_hours_text(gpu_hours)), number(plain_decimal(amount)), amount_minor,
            number(format_minor_units(amount_minor, currency))]


def render_credit_note_csv(note: CreditNoteDocument) -> bytes:
    """The credit note as one row: positive amounts credited, net, tax and total."""
    out = io.StringIO()
    writer = csv_writer(out, lineterminator="\n")
    writer.writerow(CREDIT_NOTE_CSV_COLUMNS)
    invoice = note.invoice
    writer.writerow([
        note.number, _day(note.issue_date), invoice.number, invoice.tenant_slug, invoice.tenant_name,
        f"{invoice.month:%Y-%m}", note.reason, number(plain_decimal(invoice.tax_rate_pct)), note.amount_minor,
        note.tax_minor, note.total_minor, *(number(format_minor_units(m, note.currency))
                                            for m in (note.amount_minor, note.tax_minor, note.total_minor)),
        note.currency,
    ])
    return out.getvalue().encode("utf-8")
