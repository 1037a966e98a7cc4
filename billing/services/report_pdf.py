"""The paired report as a PDF (reportlab; Chinese text through the shipped font subset)."""

from __future__ import annotations

import io
from decimal import Decimal, InvalidOperation
from typing import Any

from django.utils.translation import gettext as _

from billing.models import PairedReport
from billing.services.exports.fonts import pdf_font

__all__ = ["render_paired_report_pdf", "study_rows", "summary_rows"]

# The reference study's reported figures (MISSION.md), shown beside ours, never in their place.
_STUDY = {
    "cost_reduction_pct": "−37 %",
    "containers_per_card": "2.8×",
    "sm_utilisation": "12–18 % → 63–71 %",
    "idle_memory": "82.3 % → 11.7 %",
    "efficiency": "> 2.1×",
}


def _fmt(value: Any, suffix: str = "") -> str:
    """Figures to 2 places with grouping (amounts are stored as exact decimal strings); counts
    stay whole."""
    if value is None:
        return "—"
    if isinstance(value, int):
        return f"{value:,}{suffix}"
    try:
        number = Decimal(str(value))
    except InvalidOperation:
        return f"{value}{suffix}"
    return f"{number:,.2f}{suffix}"


def summary_rows(result: dict[str, Any]) -> list[tuple[str, str]]:
    """(label, value) rows shared by the page and the PDF."""
    s = result["summary"]
    t = result["test_whole_vs_dynamic"]
    ci = t.get("ci95") or [None, None]
    return [
        (_("Workload-days compared (n)"), _fmt(t.get("n"))),
        (_("Static cost, whole cards"), _fmt(s["static_whole_cost"])),
        (_("Static cost, fixed profiles"), _fmt(s["static_profile_cost"])),
        (_("Dynamic cost"), _fmt(s["dynamic_cost"])),
        (_("Cost reduction vs whole cards"), _fmt(s["cost_reduction_pct"], " %")),
        (_("Cost reduction vs fixed profiles"), _fmt(s["cost_reduction_vs_profile_pct"], " %")),
        (_("Mean saving per workload-day"), _fmt(t.get("mean_saving"))),
        (_("Confidence interval (95 per cent)"), f"{_fmt(ci[0])} … {_fmt(ci[1])}"),
        (_("p-value (paired t-test)"), "—" if t.get("p_value") is None else f"{t['p_value']:.3g}"),
        (_("Containers per card"), _fmt(s["containers_per_card"])),
        (_("SM utilisation, static → dynamic"),
         f"{_fmt(s['sm_utilisation_static_pct'], ' %')} → {_fmt(s['sm_utilisation_dynamic_pct'], ' %')}"),
        (_("Idle memory, static → dynamic"),
         f"{_fmt(s['idle_memory_share_static_pct'], ' %')} → {_fmt(s['idle_memory_share_dynamic_pct'], ' %')}"),
        (_("Resource optimisation efficiency"), _fmt(s["resource_optimisation_efficiency"], "×")),
    ]


def study_rows(result: dict[str, Any]) -> list[tuple[str, str, str]]:
    """(figure, the study's, ours) for the figures the study reports."""
    s = result["summary"]
    reduction = s["cost_reduction_pct"]
    return [
        (_("Container GPU cost"), _STUDY["cost_reduction_pct"], "—" if reduction is None else f"−{reduction:.1f} %"),
        (_("Containers per card"), _STUDY["containers_per_card"], _fmt(s["containers_per_card"], "×")),
        (_("GPU (SM) utilisation, static → dynamic"), _STUDY["sm_utilisation"],
         f"{_fmt(s['sm_utilisation_static_pct'], ' %')} → {_fmt(s['sm_utilisation_dynamic_pct'], ' %')}"),
        (_("Idle GPU memory, static → dynamic"), _STUDY["idle_memory"],
         f"{_fmt(s['idle_memory_share_static_pct'], ' %')} → {_fmt(s['idle_memory_share_dynamic_pct'], ' %')}"),
        (_("Resource optimisation efficiency"), _STUDY["efficiency"], _fmt(s["resource_optimisation_efficiency"], "×")),
    ]


def render_paired_report_pdf(report: PairedReport) -> bytes:
    from reportlab.lib import colors
    from reportlab.lib.pagesizes import A4
    from reportlab.lib.styles import ParagraphStyle
    from reportlab.platypus import SimpleDocTemplate, Spacer, Table, TableStyle

    if report.result is None:
        raise ValueError("the report has no result yet")
    title = _("Paired static-vs-dynamic cost report")
    period = f"{report.period_start:%Y-%m-%d} – {report.period_end:%Y-%m-%d} UTC"
    rows = summary_rows(report.result)
    method = _(
        "Unit: one workload on one UTC day. The first %(cold)s minutes of each workload are excluded "
        "(cold start). Definitions: docs/billing.md."
    ) % {"cold": int(report.result["method"]["cold_start_excluded_minutes"])}
    study = study_rows(report.result)
    study_title = _("The study's figures beside ours")
    study_head = ("", _("Study"), _("Ours"))
    # Every string drawn goes into the font subset (the "Ours" header once did not, so its "O"
    # was drawn as the empty .notdef glyph); PdfFont.paragraph refuses any character left out.
    font = pdf_font([title, period, method, study_title, *study_head, *(a + b for a, b in rows),
                     *(a + b + c for a, b, c in study)])
    body = ParagraphStyle("body", fontName=font.name, fontSize=9, leading=12)
    heading = ParagraphStyle("heading", fontName=font.name, fontSize=16, leading=20, spaceAfter=6)
    buffer = io.BytesIO()
    doc = SimpleDocTemplate(buffer, pagesize=A4, title=title, **font.template_options())
    table = Table([[font.paragraph(a, body), font.paragraph(b, body)] for a, b in rows], colWidths=[250, 220])
    table.setStyle(TableStyle([*font.table_commands(), ("GRID", (0, 0), (-1, -1), 0.3, colors.grey),
                               ("VALIGN", (0, 0), (-1, -1), "TOP")]))
    comparison = Table([[font.paragraph(x, body) for x in study_head]]
                       + [[font.paragraph(a, body), font.paragraph(b, body), font.paragraph(c, body)]
                          for a, b, c in study],
                       colWidths=[210, 130, 130])
    comparison.setStyle(TableStyle([*font.table_commands(), ("GRID", (0, 0), (-1, -1), 0.3, colors.grey)]))
    doc.build([font.paragraph(title, heading), font.paragraph(period, body), Spacer(1, 8), table, Spacer(1, 8),
               font.paragraph(study_title, body), comparison, Spacer(1, 8), font.paragraph(method, body)])
    return buffer.getvalue()
