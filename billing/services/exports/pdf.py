"""The invoice and the credit note as PDFs (reportlab), every string in one embedded font subset
(billing.pdf_fonts.PdfFont: no standard font referenced, no glyph missing)."""

from __future__ import annotations

import io
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import date, timedelta
from decimal import Decimal
from typing import Any

from django.utils.formats import date_format
from django.utils.translation import gettext as _

from billing.money import format_minor_units
from billing.pdf_fonts import PdfFont, pdf_font
from billing.services.exports.invoices import (
    GPU_HOURS_PLACES,
    LINE_QUANTITY_PLACES,
    CreditNoteDocument,
    InvoiceDocument,
    LineRow,
)
from billing.services.exports.numbers import plain_decimal

__all__ = ["BODY_SIZE", "MM", "invoice_pdf_layout", "render_credit_note_pdf", "render_invoice_pdf", "tax_label",
           "text_width_pt"]

MM = 72 / 25.4  # points per millimetre
# Body text size in points, and the padding left and right of a table cell's text: the small padding
# leaves room for a header label on one line in both languages (tests/billing/test_exports.py measures
# each label against its column).
BODY_SIZE = 9
CELL_PADDING_PT = 3


def tax_label(rate_pct: Decimal) -> str:
    return _("Tax (%(rate)s %%)") % {"rate": plain_decimal(rate_pct)}


def _day(value: date | None) -> str:
    # The reader's date format, as the pages write it (config/formats).
    return date_format(value, "DATE_FORMAT") if value else "—"


def _month(value: date) -> str:
    # A month as the pages write it in the reader's language ("2026-11", "2026年11月").
    return date_format(value, "YEAR_MONTH_FORMAT")


def _issuer_rows(name: str, address: str, tax_id: str) -> list[tuple[str, str]]:
    return [(_("Issuer"), name), (_("Issuer address"), address.replace("\n", ", ") or "—"),
            (_("Issuer tax ID"), tax_id or "—")]


def _bill_to_rows(doc: InvoiceDocument) -> list[tuple[str, str]]:
    """The customer's address and tax ID as issued, and, on an invoice taxed at 0 %, why (the
    exemption or reverse-charge note; "—" when none was given)."""
    rows = [(_("Billing address"), doc.bill_to_address.replace("\n", ", ") or "—"),
            (_("Customer tax ID"), doc.bill_to_tax_id or "—")]
    if doc.tax_rate_pct == 0:
        rows.append((_("Tax note"), doc.tax_exemption_note or "—"))
    return rows


def _terms_text(days: int | None) -> str:
    return "—" if days is None else _("Net %(days)s days") % {"days": days}


@dataclass(frozen=True)
class _Appendix:
    """A page after the document's notes: a heading, a paragraph and a table whose last row is its total."""

    heading: str
    intro: str
    table: Sequence[Sequence[str]]
    col_widths_mm: Sequence[float]
    numeric_from: int


@dataclass(frozen=True)
class _Layout:
    """One document: a title, label/value rows, a table whose last `totals` rows are totals (its
    columns from `numeric_from` on right-aligned) and notes under it."""

    title: str
    subject: str
    author: str
    header: Sequence[tuple[str, str]]
    table: Sequence[Sequence[str]]
    col_widths_mm: Sequence[float]
    numeric_from: int
    totals: int
    notes: Sequence[str]
    # Paragraphs between the header and the table (what the table's columns mean).
    intro: Sequence[str] = ()
    appendix: _Appendix | None = None

    def text_width_pt(self, column: int) -> float:
        """The width a cell's text has in `column`: the column less the padding either side."""
        return text_width_pt(self.col_widths_mm, column)


def text_width_pt(col_widths_mm: Sequence[float], column: int) -> float:
    """The width a cell's text has in a table's `column`: the column less the padding either side."""
    return col_widths_mm[column] * MM - 2 * CELL_PADDING_PT


def _render(layout: _Layout) -> bytes:
    from reportlab.lib import colors
    from reportlab.lib.enums import TA_RIGHT
    from reportlab.lib.pagesizes import A4
    from reportlab.lib.styles import ParagraphStyle
    from reportlab.platypus import PageBreak, SimpleDocTemplate, Spacer, Table, TableStyle

    extra = layout.appendix
    font = pdf_font([layout.title, *layout.intro, *layout.notes, *(s for pair in layout.header for s in pair),
                     *(c for row in layout.table for c in row),
                     *((extra.heading, extra.intro, *(c for row in extra.table for c in row)) if extra else ())])
    body = ParagraphStyle("body", fontName=font.name, fontSize=BODY_SIZE, leading=12)
    number_style = ParagraphStyle("number", parent=body, alignment=TA_RIGHT)
    heading = ParagraphStyle("heading", fontName=font.name, fontSize=18, leading=22, spaceAfter=8)
    buf = io.BytesIO()
    pdf = SimpleDocTemplate(buf, pagesize=A4, title=layout.title, author=layout.author, subject=layout.subject,
                            leftMargin=18 * MM, rightMargin=18 * MM, topMargin=18 * MM, bottomMargin=18 * MM,
                            **font.template_options())
    head_table = Table([[font.paragraph(k, body), font.paragraph(v, body)] for k, v in layout.header],
                       colWidths=[40 * MM, 134 * MM])
    head_table.setStyle(TableStyle([*font.table_commands(), ("VALIGN", (0, 0), (-1, -1), "TOP"),
                                    ("TEXTCOLOR", (0, 0), (0, -1), colors.grey)]))
    lines_table = _table(font, layout.table, layout.col_widths_mm, numeric_from=layout.numeric_from,
                         totals=layout.totals, styles=(body, number_style))
    story = [font.paragraph(layout.title, heading), head_table, Spacer(1, 8 * MM)]
    story += [font.paragraph(text, body) for text in layout.intro]
    story += [Spacer(1, 2 * MM), lines_table, Spacer(1, 6 * MM)] if layout.intro else [lines_table, Spacer(1, 6 * MM)]
    story += [font.paragraph(note, body) for note in layout.notes]
    if extra is not None:
        subheading = ParagraphStyle("subheading", parent=heading, fontSize=14, leading=18)
        story += [PageBreak(), font.paragraph(extra.heading, subheading), font.paragraph(extra.intro, body),
                  Spacer(1, 2 * MM),
                  _table(font, extra.table, extra.col_widths_mm, numeric_from=extra.numeric_from, totals=1,
                         styles=(body, number_style))]
    pdf.build(story)
    return buf.getvalue()


def _table(font: PdfFont, rows: Sequence[Sequence[str]], widths_mm: Sequence[float], *, numeric_from: int,
           totals: int, styles: tuple[Any, Any]) -> Any:
    """A table set in the document's font: a header row, then rows whose last `totals` are totals;
    `styles` are the text's and the numbers' (right-aligned) paragraph styles."""
    body, number_style = styles
    from reportlab.lib import colors
    from reportlab.platypus import Table, TableStyle

    table = Table([[font.paragraph(c, number_style if i >= numeric_from else body) for i, c in enumerate(row)]
                   for row in rows], colWidths=[w * MM for w in widths_mm], repeatRows=1)
    table.setStyle(TableStyle([
        *font.table_commands(),
        ("LEFTPADDING", (0, 0), (-1, -1), CELL_PADDING_PT),
        ("RIGHTPADDING", (0, 0), (-1, -1), CELL_PADDING_PT),
        ("LINEBELOW", (0, 0), (-1, 0), 0.6, colors.black),
        ("LINEABOVE", (0, -totals), (-1, -totals), 0.6, colors.black),
        ("VALIGN", (0, 0), (-1, -1), "TOP"),
    ]))
    return table


def render_invoice_pdf(doc: InvoiceDocument) -> bytes:
    return _render(invoice_pdf_layout(doc))


def invoice_pdf_layout(doc: InvoiceDocument) -> _Layout:
    """What the invoice PDF draws, in the active language."""
    start, end = doc.period_bounds
    money = doc.currency
    header = [
        *_issuer_rows(doc.issuer_name, doc.issuer_address, doc.issuer_tax_id),
        (_("Bill to"), f"{doc.tenant_name} ({doc.tenant_slug})"),
        *_bill_to_rows(doc),
        (_("Invoice number"), doc.number),
        (_("Issue date"), _day(doc.issue_date)),
        (_("Due date"), _day(doc.due_date)),
        (_("Payment terms"), _terms_text(doc.payment_terms_days)),
        (_("PO number"), doc.po_number or "—"),
        (_("Cost centre"), doc.cost_centre or "—"),
        (_("Billing period"), f"{_day(start)} – {_day(end - timedelta(days=1))} (UTC)"),
        (_("Currency"), money),
        (_("Status"), doc.status_label + (f" {date_format(doc.finalized_at, 'DATETIME_FORMAT')} UTC"
                                           if doc.finalized_at else "")),
    ]
    rows = doc.line_rows
    # The quantity's header names its unit; "Quantity (GPU-hours)" would not fit on one line.
    table = [[_("Line"), _("GPU model"), _("SLA tier"), _("Usage month"), _("GPU-hours"), _("Unit price"), _("Amount")]]
    table.extend([row.line.kind_label, row.line.gpu_model, row.line.sla_tier_label, _month(row.line.usage_month),
                  row.hours, _unit_price_cell(row), row.amount] for row in rows)
    table += [
        [_("Subtotal"), "", "", "", "", "", format_minor_units(doc.subtotal_minor, money)],
        [tax_label(doc.tax_rate_pct), "", "", "", "", "", format_minor_units(doc.tax_minor, money)],
        [_("Total"), "", "", "", "", "", f"{format_minor_units(doc.total_minor, money)} {money}"],
    ]
    notes = [
        *_line_notes(rows),
        _("Amounts are rounded once per invoice line to the currency's minor unit (round half to even); the "
          "subtotal is the sum of the rounded lines, the tax is rounded once on the subtotal, and the total is "
          "subtotal + tax. A line's GPU-hours are shown to %(places)s decimal places, as the line stores them, so "
          "GPU-hours × unit price gives its amount to the cent. Late usage for a month already invoiced appears "
          "as an adjustment on a later invoice; a correction of this invoice is a credit note that names it.")
        % {"places": LINE_QUANTITY_PLACES},
    ]
    title = _("Invoice")
    return _Layout(title=f"{title} {doc.number}", subject=f"{doc.number} {doc.tenant_slug} {doc.month:%Y-%m}",
                   author=doc.issuer_name, header=header, table=table,
                   col_widths_mm=[26, 28, 16, 22, 23, 24, 35], numeric_from=4, totals=3, notes=notes,
                   intro=[_unit_price_intro(doc)], appendix=_workload_appendix(doc))


def _workload_appendix(doc: InvoiceDocument) -> _Appendix | None:
    """The usage by workload, on a page of its own; none for an invoice closed before it was kept."""
    if not doc.workloads:
        return None
    table = [[_("Namespace"), _("Workload"), _("GPU-hours"), _("Amount")]]
    table.extend([w.namespace_label, w.workload_label, hours, amount] for w, hours, amount in doc.workload_rows)
    table.append([_("Lines of the month"), "", "", f"{doc.month_lines_display} {doc.currency}"])
    intro = _("Each namespace and controller of the month as the drill-down shows it: the lines of the month "
              "(usage and the idle spread onto it) apportioned to namespaces, then to their controllers, by the "
              "largest remainder. The workloads add up to those lines together, not line by line, and have no GPU "
              "model or SLA tier of their own. GPU-hours to %(places)s decimal places. Copied at the close: it "
              "never changes.") % {"places": GPU_HOURS_PLACES}
    return _Appendix(heading=_("Usage by workload"), intro=intro, table=table, col_widths_mm=[50, 72, 19, 33],
                     numeric_from=2)


def _unit_price_intro(doc: InvoiceDocument) -> str:
    """What quantity and unit price mean, and the billing rule when every line shares one."""
    text = _("Quantity: GPU-hours, the hours of equivalent whole GPUs a line's usage held. Unit price: per "
             "GPU-hour, in %(currency)s; the rate that priced the line, or, where more than one rate did, the "
             "average (amount ÷ GPU-hours), marked as such with the rates that applied.") % {"currency": doc.currency}
    if doc.billing_rule_text:
        text += " " + _("GPU-hours billed by %(rule)s.") % {"rule": doc.billing_rule_text}
    return text


def _unit_price_cell(row: LineRow) -> str:
    if not row.unit_price:
        return "—"
    return _("%(price)s (average)") % {"price": row.unit_price} if row.average else row.unit_price


def _line_notes(rows: Sequence[LineRow]) -> list[str]:
    """One note per line whose unit price needs one (the rates of an average, its own billing rule,
    why it has none), naming the line as its row does."""
    return [f"{row.line.kind_label}, {row.line.gpu_model}, {row.line.sla_tier_label}, {_month(row.line.usage_month)}: "
            + "; ".join(row.notes) for row in rows if row.notes]


def render_credit_note_pdf(note: CreditNoteDocument) -> bytes:
    invoice = note.invoice
    money = note.currency
    header = [
        *_issuer_rows(note.issuer_name, note.issuer_address, note.issuer_tax_id),
        (_("Bill to"), f"{invoice.tenant_name} ({invoice.tenant_slug})"),
        (_("Credit note number"), note.number),
        (_("Issue date"), _day(note.issue_date)),
        (_("Corrects invoice"), _("%(number)s, issued %(date)s") % {"number": invoice.number,
                                                                      "date": _day(invoice.issue_date)}),
        (_("Billing period"), _month(invoice.month)),
        (_("PO number"), invoice.po_number or "—"),
        (_("Cost centre"), invoice.cost_centre or "—"),
        (_("Currency"), money),
        (_("Reason"), note.reason),
    ]
    table = [
        [_("Description"), _("Amount")],
        [_("Credit against invoice %(number)s") % {"number": invoice.number},
         f"-{format_minor_units(note.amount_minor, money)}"],
        [tax_label(invoice.tax_rate_pct), f"-{format_minor_units(note.tax_minor, money)}"],
        [_("Total credited"), f"-{format_minor_units(note.total_minor, money)} {money}"],
    ]
    notes = [_("This credit note reduces the amount due on invoice %(number)s by the total credited. It is a "
               "document of its own: it is never changed, and a further correction is a further credit note.")
             % {"number": invoice.number}]
    title = _("Credit note")
    return _render(_Layout(title=f"{title} {note.number}", subject=f"{note.number} {invoice.number}",
                           author=note.issuer_name, header=header, table=table, col_widths_mm=[134, 40],
                           numeric_from=1, totals=1, notes=notes))
