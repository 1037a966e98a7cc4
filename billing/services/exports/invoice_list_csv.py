"""The invoice list's CSV (`/invoices/?format=csv`, docs/exports.md): one row per invoice with the
columns the list shows (subtotal, tax, total, credited, balance due, payment status), each amount in
integer minor units and in major units with the currency's decimals (billing.money), then a
`(total)` row of the column sums when the list is one billing period in one currency, as the list's
footer. A draft's balance due is empty: nothing is due on an invoice not issued."""

from __future__ import annotations

import io
from collections.abc import Sequence
from datetime import date

from billing.csv_files import csv_writer, minor_cell
from billing.services.exports.invoices import InvoiceSummary, invoice_list_total
from billing.services.invoicing import InvoiceBalance

__all__ = ["INVOICE_LIST_CSV_COLUMNS", "invoice_list_csv_name", "render_invoice_list_csv"]

_MONEY = ("subtotal", "tax", "total", "credited", "balance_due")
INVOICE_LIST_CSV_COLUMNS = (
    "invoice_number", "tenant", "tenant_name", "billing_period", "currency",
    *(f"{m}_minor" for m in _MONEY), *_MONEY, "payment_status", "payment_status_date",
)


def invoice_list_csv_name(today: date) -> str:
    """The list as of `today`: balances and payment statuses change from day to day."""
    return f"invoices-{today:%Y%m%d}.csv"


def _money_cells(balance: InvoiceBalance) -> list[object]:
    minors = [balance.subtotal_minor, balance.tax_minor, balance.total_minor, balance.credited_minor,
              balance.due_minor]
    return [*("" if m is None else m for m in minors),
            *("" if m is None else minor_cell(m, balance.currency) for m in minors)]


def render_invoice_list_csv(invoices: Sequence[InvoiceSummary]) -> bytes:
    out = io.StringIO()
    writer = csv_writer(out, lineterminator="\n")
    writer.writerow(INVOICE_LIST_CSV_COLUMNS)
    for i in invoices:
        when = i.payment.state_date
        writer.writerow([i.number, i.tenant_slug, i.tenant_name, i.period_key, i.currency, *_money_cells(i.balance),
                         i.payment.state, when.isoformat() if when else ""])
    total = invoice_list_total(invoices)
    if total is not None:
        writer.writerow(["(total)", "", "", invoices[0].period_key, total.currency, *_money_cells(total), "", ""])
    return out.getvalue().encode("utf-8")
