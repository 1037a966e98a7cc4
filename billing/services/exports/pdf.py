"""The invoice as a PDF (reportlab), with its Chinese text in an embedded font subset
(billing.services.exports.fonts)."""

from __future__ import annotations

import io
from datetime import timedelta
from xml.sax.saxutils import escape

from django.utils.translation import gettext as _

from billing.models import InvoiceLine
from billing.money import format_minor_units
from billing.services.exports.fonts import cjk_font_name
from billing.services.exports.invoices import InvoiceDocument
from billing.services.exports.numbers import plain_decimal

__all__ = ["render_invoice_pdf"]


def render_invoice_pdf(doc: InvoiceDocument) -> bytes:
    from reportlab.lib import colors
    from reportlab.lib.enums import TA_RIGHT
    from reportlab.lib.pagesizes import A4
    from reportlab.lib.styles import ParagraphStyle
    from reportlab.lib.units import mm
    from reportlab.platypus import Paragraph, SimpleDocTemplate, Spacer, Table, TableStyle

    start, end = doc.period_bounds
    header = [
        (_("Issuer"), doc.issuer_name),
        (_("Tenant"), f"{doc.tenant_name} ({doc.tenant_slug})"),
        (_("Invoice number"), doc.number),
        (_("Billing period"), f"{start:%Y-%m-%d} – {end - timedelta(days=1):%Y-%m-%d} (UTC)"),
        (_("Currency"), doc.currency),
        (_("Status"), doc.status_label + (f" {doc.finalized_at:%Y-%m-%d %H:%M} UTC" if doc.finalized_at else "")),
    ]
    table = [[_("Line"), _("GPU model"), _("SLA tier"), _("Usage month"), _("GPU-hours"), _("Amount")]]
    for line in doc.lines:
        table.append([line.kind_label, line.gpu_model, line.sla_tier, f"{line.usage_month:%Y-%m}",
                      plain_decimal(line.gpu_hours) if line.kind == InvoiceLine.Kind.USAGE else "",
                      format_minor_units(line.amount_minor, doc.currency)])
    total = format_minor_units(doc.total_minor, doc.currency)
    table.append([_("Total"), "", "", "", "", f"{total} {doc.currency}"])
    title = _("Invoice")
    note = _("Amounts are rounded once per invoice line to the currency's minor unit (round half to even); "
             "the total is the sum of the rounded lines. Late usage for a month already invoiced appears as an "
             "adjustment on a later invoice.")
    strings = [title, note, *(s for pair in header for s in pair), *(c for row in table for c in row)]
    font = cjk_font_name("".join(strings))

    body = ParagraphStyle("body", fontName=font, fontSize=9, leading=12)
    number_style = ParagraphStyle("number", parent=body, alignment=TA_RIGHT)
    heading = ParagraphStyle("heading", fontName=font, fontSize=18, leading=22, spaceAfter=8)
    buf = io.BytesIO()
    pdf = SimpleDocTemplate(buf, pagesize=A4, title=f"{title} {doc.number}", author=doc.issuer_name,
                            subject=f"{doc.number} {doc.tenant_slug} {doc.month:%Y-%m}",
                            leftMargin=18 * mm, rightMargin=18 * mm, topMargin=18 * mm, bottomMargin=18 * mm)
    head_table = Table([[Paragraph(escape(k), body), Paragraph(escape(v), body)] for k, v in header],
                       colWidths=[40 * mm, 130 * mm])
    head_table.setStyle(TableStyle([("VALIGN", (0, 0), (-1, -1), "TOP"), ("TEXTCOLOR", (0, 0), (0, -1), colors.grey)]))
    lines_table = Table([[Paragraph(escape(c), number_style if i >= 4 else body) for i, c in enumerate(row)]
                         for row in table],
                        colWidths=[36 * mm, 46 * mm, 20 * mm, 20 * mm, 22 * mm, 30 * mm], repeatRows=1)
    lines_table.setStyle(TableStyle([
        ("LINEBELOW", (0, 0), (-1, 0), 0.6, colors.black),
        ("LINEABOVE", (0, -1), (-1, -1), 0.6, colors.black),
        ("VALIGN", (0, 0), (-1, -1), "TOP"),
    ]))
    story = [Paragraph(escape(title), heading), head_table, Spacer(1, 8 * mm), lines_table, Spacer(1, 6 * mm),
             Paragraph(escape(note), body)]
    pdf.build(story)
    return buf.getvalue()

