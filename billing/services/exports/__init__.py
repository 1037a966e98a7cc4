"""Invoice and credit note downloads: PDF, CSV and a FOCUS 1.3 cost-and-usage CSV (docs/exports.md).

Reads, and the destinations of the fleet dataset, one module per concern: the scoped invoice reads (`invoices`), the invoice CSV
(`invoice_csv`), the invoice list's CSV (`invoice_list_csv`), the FOCUS rows and file (`focus`, from billing.ledger.exports), the PDF
(`pdf`, drawing through billing.pdf_fonts), the FOCUS dataset files (`focus_dataset`), and their
delivery to object storage (`delivery`, to the `destinations` admins manage, whose keys `credentials`
seals). Every entry point takes the caller's `Scope` and
filters in the query, so an invoice outside the scope is indistinguishable from one that does
not exist.

Reconciliation (docs/billing.md): an invoice line is rounded once, half-even, to minor units.
The FOCUS rows of a usage or idle line carry ledger amounts (12 decimal places) that add up
to the line's unrounded amount exactly; one "rounding" row per line carries the difference
to the rounded amount. So Σ BilledCost over the file = Σ amount_minor = the invoice total.
"""

from __future__ import annotations

from dataclasses import dataclass

from billing.errors import InvalidInput
from billing.scope import Scope
from billing.services.exports.credentials import CredentialsUnreadable
from billing.services.exports.credentials import readable as credentials_readable
from billing.services.exports.delivery import deliver_focus_dataset, object_keys
from billing.services.exports.destinations import DestinationInput, check_endpoint, retire_destination, save_destination
from billing.services.exports.focus import (
    ALLOCATED_METHOD_ID,
    FOCUS_COLUMNS,
    build_credit_note_focus_rows,
    build_focus_rows,
    render_credit_note_focus_csv,
    render_focus_csv,
)
from billing.services.exports.focus_dataset import write_changing_months, write_fleet_dataset
from billing.services.exports.invoice_csv import (
    CREDIT_NOTE_CSV_COLUMNS,
    INVOICE_CSV_COLUMNS,
    NO_UNIT_PRICE_CELLS,
    UNIT_PRICE_COLUMNS,
    line_number_cells,
    render_credit_note_csv,
    render_invoice_csv,
    unit_price_cells,
)
from billing.services.exports.invoice_list_csv import (
    INVOICE_LIST_CSV_COLUMNS,
    invoice_list_csv_name,
    render_invoice_list_csv,
)
from billing.services.exports.invoices import (
    GPU_HOURS_PLACES,
    LINE_QUANTITY_PLACES,
    CreditNoteDocument,
    CreditNoteNotFound,
    CreditNoteSummary,
    InvoiceDocument,
    InvoiceLineView,
    InvoiceNotFound,
    InvoiceSummary,
    find_invoice_number,
    get_credit_note_document,
    get_invoice_document,
    invoice_list_total,
    list_invoices,
)
from billing.services.exports.numbers import plain_decimal
from billing.services.exports.pdf import render_credit_note_pdf, render_invoice_pdf

__all__ = [
    "ALLOCATED_METHOD_ID",
    "CREDIT_NOTE_CSV_COLUMNS",
    "EXPORT_FORMATS",
    "FOCUS_COLUMNS",
    "GPU_HOURS_PLACES",
    "INVOICE_CSV_COLUMNS",
    "INVOICE_LIST_CSV_COLUMNS",
    "LINE_QUANTITY_PLACES",
    "NO_UNIT_PRICE_CELLS",
    "UNIT_PRICE_COLUMNS",
    "CredentialsUnreadable",
    "CreditNoteDocument",
    "CreditNoteNotFound",
    "CreditNoteSummary",
    "DestinationInput",
    "ExportFile",
    "InvoiceDocument",
    "InvoiceLineView",
    "InvoiceNotFound",
    "InvoiceSummary",
    "build_credit_note_focus_rows",
    "build_focus_rows",
    "check_endpoint",
    "credentials_readable",
    "deliver_focus_dataset",
    "export_credit_note",
    "export_invoice",
    "find_invoice_number",
    "get_credit_note_document",
    "get_invoice_document",
    "invoice_list_csv_name",
    "invoice_list_total",
    "line_number_cells",
    "list_invoices",
    "object_keys",
    "plain_decimal",
    "render_credit_note_csv",
    "render_credit_note_focus_csv",
    "render_credit_note_pdf",
    "render_focus_csv",
    "render_invoice_csv",
    "render_invoice_list_csv",
    "render_invoice_pdf",
    "retire_destination",
    "save_destination",
    "unit_price_cells",
    "write_changing_months",
    "write_fleet_dataset",
]

EXPORT_FORMATS = ("pdf", "csv", "focus")


@dataclass(frozen=True)
class ExportFile:
    filename: str
    content_type: str
    content: bytes


def export_invoice(*, scope: Scope, number: str, fmt: str) -> ExportFile:
    """Render one invoice in `fmt` (pdf, csv or focus) for a caller with `scope`."""
    _check_format(fmt)
    doc = get_invoice_document(scope=scope, number=number)
    return _document_file(doc.number, fmt, {"pdf": render_invoice_pdf, "csv": render_invoice_csv,
                                            "focus": render_focus_csv}[fmt](doc))


def export_credit_note(*, scope: Scope, number: str, fmt: str) -> ExportFile:
    """Render one credit note in `fmt` (pdf, csv or focus) for a caller with `scope`."""
    _check_format(fmt)
    note = get_credit_note_document(scope=scope, number=number)
    return _document_file(note.number, fmt, {"pdf": render_credit_note_pdf, "csv": render_credit_note_csv,
                                             "focus": render_credit_note_focus_csv}[fmt](note))


def _check_format(fmt: str) -> None:
    # Before the document is read: an unknown format is a 400 whether or not the number exists.
    if fmt not in EXPORT_FORMATS:
        raise InvalidInput(f"format {fmt!r} must be one of {', '.join(EXPORT_FORMATS)}")


def _document_file(number: str, fmt: str, content: bytes) -> ExportFile:
    """A document's download: one file name and content type per format, for invoices and credit notes."""
    if fmt == "pdf":
        return ExportFile(f"{number}.pdf", "application/pdf", content)
    suffix = ".csv" if fmt == "csv" else "-focus-1.3.csv"
    return ExportFile(f"{number}{suffix}", "text/csv; charset=utf-8", content)
