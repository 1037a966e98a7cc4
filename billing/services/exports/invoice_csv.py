"""The invoice CSV: one row per invoice line, then a total row; amounts in minor units and in
formatted major units (billing.money), GPU-hours to QUANTITY_PLACES["gpu_hours"] places.
`line_number_cells` writes a line's numbers for this CSV and for the upcoming invoice's."""

from __future__ import annotations

import csv
import io
from decimal import Decimal

from billing.money import QUANTITY_PLACES, format_minor_units, quantity_text
from billing.services.exports.invoices import InvoiceDocument
from billing.services.exports.numbers import plain_decimal

__all__ = ["INVOICE_CSV_COLUMNS", "line_number_cells", "render_invoice_csv"]

INVOICE_CSV_COLUMNS = (
    "invoice_number", "tenant", "tenant_name", "billing_period", "line", "kind", "gpu_model", "sla_tier",
    "usage_month", "gpu_hours", "amount_ledger", "amount_minor", "amount", "currency",
)


def render_invoice_csv(doc: InvoiceDocument) -> bytes:
    """One row per invoice line, then a total row; amounts in minor units and formatted major units."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(INVOICE_CSV_COLUMNS)
    head = [doc.number, doc.tenant_slug, doc.tenant_name, f"{doc.month:%Y-%m}"]
    for i, line in enumerate(doc.lines, start=1):
        writer.writerow(head + [
            i, line.kind, line.gpu_model, line.sla_tier, f"{line.usage_month:%Y-%m}",
            *line_number_cells(line.gpu_hours, line.amount, line.amount_minor, doc.currency), doc.currency,
        ])
    writer.writerow(head + ["total", "", "", "", "", "", "", doc.total_minor,
                            format_minor_units(doc.total_minor, doc.currency), doc.currency])
    return out.getvalue().encode("utf-8")



def line_number_cells(gpu_hours: Decimal, amount: Decimal, amount_minor: int, currency: str) -> list[object]:
    """`gpu_hours`, `amount_ledger`, `amount_minor`, `amount` of one line: GPU-hours to 4 places,
    the ledger amount exactly (what the one rounding started from; docs/exports.md), the rounded
    amount in minor units and in major units with the currency's decimals."""
    return [quantity_text(gpu_hours, QUANTITY_PLACES["gpu_hours"]), plain_decimal(amount), amount_minor,
            format_minor_units(amount_minor, currency)]
