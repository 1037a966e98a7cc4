"""The paired report for people: its savings tables, the paired test's rows, the definitions of every
figure (shared by the page, the CSV and the PDF) and the PDF itself (reportlab; Chinese text through
the shipped font subset)."""

from __future__ import annotations

import io
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from typing import Any

from django.utils.formats import date_format
from django.utils.translation import gettext as _

from billing.csv_files import number
from billing.models import PairedReport
from billing.money import display_amount, money_text
from billing.pdf_fonts import pdf_font

__all__ = ["SAVINGS_CSV_COLUMNS", "CostComparison", "SavingsTables", "definitions", "partial_days_note", "period_text",
           "render_paired_report_pdf", "savings_csv_rows", "savings_tables", "study_rows", "summary_rows"]

# The reference study's reported figures (docs/design.md, The study), shown beside ours, never in their place.
_STUDY = {
    "cost_reduction_pct": "−37 %",
    "containers_per_card": "2.8×",
    "sm_utilisation": "12–18 % → 63–71 %",
    "idle_memory": "82.3 % → 11.7 %",
    "efficiency": "> 2.1×",
}


def _fmt(value: Any, suffix: str = "") -> str:
    """Figures to 2 places with grouping; counts stay whole."""
    if value is None:
        return "—"
    if isinstance(value, int):
        return f"{value:,}{suffix}"
    try:
        number = Decimal(str(value))
    except InvalidOperation:
        return f"{value}{suffix}"
    return f"{number:,.2f}{suffix}"


def _amount(value: Any, currency: str) -> str:
    """An amount of the report in its currency, to the currency's minor unit ("—" when missing)."""
    return "—" if value is None else money_text(value, currency)


@dataclass(frozen=True)
class CostComparison:
    """One row of a savings table: the same thing priced under whole-card and dynamic allocation,
    each rounded once to the currency's minor unit; a total row is the sum of the rounded rows
    above it, so every table adds up as shown."""

    label: str
    whole_card: Decimal
    dynamic: Decimal
    is_total: bool = False

    @property
    def saving(self) -> Decimal:
        return self.whole_card - self.dynamic

    @property
    def reduction_pct(self) -> Decimal | None:
        """Saving as a share of the whole-card amount, percent (None when that is 0)."""
        return self.saving / self.whole_card * 100 if self.whole_card else None


@dataclass(frozen=True)
class SavingsTables:
    currency: str
    fleet: tuple[CostComparison, ...]  # the organisation's cost; the last row is the fleet total
    chargeback: tuple[CostComparison, ...]  # per tenant, the platform, and the total (last)

    @property
    def fleet_total(self) -> CostComparison:
        return self.fleet[-1]


def _rows_with_total(rows: list[CostComparison], total_label: str, currency: str) -> tuple[CostComparison, ...]:
    rounded = [CostComparison(r.label, display_amount(r.whole_card, currency), display_amount(r.dynamic, currency))
               for r in rows]
    total = CostComparison(total_label, sum((r.whole_card for r in rounded), Decimal(0)),
                           sum((r.dynamic for r in rounded), Decimal(0)), is_total=True)
    return (*rounded, total)


def savings_tables(result: dict[str, Any], tenant_names: dict[str, str]) -> SavingsTables | None:
    """The organisation's view of a report (None for a report computed before it existed)."""
    fleet, chargeback = result.get("fleet"), result.get("chargeback")
    if not fleet or not chargeback:
        return None
    currency = str(result.get("currency") or "")
    whole, dynamic = fleet["whole_card"], fleet["dynamic"]
    fleet_rows = _rows_with_total([
        CostComparison(_("Cards with workloads on them"), Decimal(whole["workload_cards"]), Decimal(dynamic["busy_cards"])),
        CostComparison(_("Cards with no workload (idle either way)"), Decimal(whole["empty_cards"]),
                       Decimal(dynamic["empty_cards"])),
    ], _("Fleet cost"), currency)
    tenant_rows = [CostComparison(tenant_names.get(t["tenant"], t["tenant"]), Decimal(t["whole_card"]),
                                  Decimal(t["dynamic"])) for t in chargeback["tenants"]]
    platform = chargeback["platform"]
    charge_rows = _rows_with_total([
        *sorted(tenant_rows, key=lambda r: (-r.whole_card, r.label)),
        CostComparison(_("Platform (idle no tenant was charged)"), Decimal(platform["whole_card"]),
                       Decimal(platform["dynamic"])),
    ], _("Fleet cost"), currency)
    return SavingsTables(currency, fleet_rows, charge_rows)


def summary_rows(result: dict[str, Any]) -> list[tuple[str, str]]:
    """(label, value) rows of the paired test, shared by the page and the PDF."""
    s = result["summary"]
    t = result["test_whole_vs_dynamic"]
    ci = t.get("ci95") or [None, None]
    currency = str(result.get("currency") or "")
    # A report computed before the test kept to complete days says what it counted.
    complete = "per_workload_day" in result
    return [
        (_("Complete workload-days compared (n)") if complete else _("Workload-days compared (n)"), _fmt(t.get("n"))),
        (_("Static cost, whole cards"), _amount(s["static_whole_cost"], currency)),
        (_("Static cost, fixed profiles"), _amount(s["static_profile_cost"], currency)),
        (_("Dynamic cost (charged)"), _amount(s["dynamic_cost"], currency)),
        (_("Chargeback reduction vs whole cards"), _fmt(s["cost_reduction_pct"], " %")),
        (_("Chargeback reduction vs fixed profiles"), _fmt(s["cost_reduction_vs_profile_pct"], " %")),
        (_("Mean saving per complete workload-day") if complete else _("Mean saving per workload-day"),
         _amount(t.get("mean_saving"), currency)),
        (_("Confidence interval (95 per cent)"), f"{_amount(ci[0], currency)} … {_amount(ci[1], currency)}"),
        (_("p-value (paired t-test)"), "—" if t.get("p_value") is None else f"{t['p_value']:.3g}"),
        (_("Containers per card"), _fmt(s["containers_per_card"])),
        (_("SM utilisation, static → dynamic"),
         f"{_fmt(s['sm_utilisation_static_pct'], ' %')} → {_fmt(s['sm_utilisation_dynamic_pct'], ' %')}"),
        (_("Idle memory, static → dynamic"),
         f"{_fmt(s['idle_memory_share_static_pct'], ' %')} → {_fmt(s['idle_memory_share_dynamic_pct'], ' %')}"),
        (_("Resource optimisation efficiency"), _fmt(s["resource_optimisation_efficiency"], "×")),
    ]


def partial_days_note(result: dict[str, Any]) -> str:
    """Which workload-days the per-workload-day figures leave out, and why ("" when none)."""
    info = result.get("per_workload_day") or {}
    days = info.get("partial_days_excluded") or []
    if not days:
        return ""
    return _("%(n)s workload-day(s) of %(days)s are left out of the per-workload-day figures: the day was "
             "not over when the report was computed.") % {"n": info.get("partial_units_excluded", 0),
                                                           "days": ", ".join(days)}


def definitions(cold_start_minutes: int) -> list[tuple[str, str]]:
    """(term, definition) of every figure, shown on the report pages and in the PDF."""
    return [
        (_("Whole-card allocation"), _("Each workload (one container of one pod) holds a whole GPU for every "
                                       "second it runs; a workload on two GPUs holds two cards.")),
        (_("Dynamic allocation"), _("Workloads share cards; each is charged its measured share of the card "
                                    "(memory and SMs), as the ledger bills it.")),
        (_("Fleet cost"), _("What the organisation pays for the cards it holds, busy or idle: under dynamic "
                            "allocation, every metered card-minute of the fleet at its rate card; under "
                            "whole-card allocation, one card per workload for every second it ran, plus the "
                            "card-minutes no workload was on (held either way). Unpriced GPU models are left out.")),
        (_("Idle"), _("Card time nobody used. Under dynamic allocation, the part of a card's cost not charged "
                      "for use: spread onto tenants when the idle policy says so, else the platform's. Cards "
                      "with no workload are idle under both allocations.")),
        (_("Chargeback"), _("What each tenant is charged: under whole-card allocation its workloads' cards, "
                            "under dynamic allocation its charges plus any idle spread onto it. The platform row "
                            "is the rest of the fleet cost, so the rows add up to it.")),
        (_("Saving and reduction"), _("Saving = whole-card amount − dynamic amount; reduction % = saving ÷ "
                                      "whole-card amount × 100, from the amounts shown.")),
        (_("Workload-day and the paired test"), _(
            "One workload on one UTC day; only days that were over when the report was computed count. "
            "The first %(cold)s minutes of each workload are left out (cold start). For each workload-day, "
            "x = its whole-card cost, y = what it was charged; a paired t-test of x against y gives the mean "
            "saving per workload-day, its 95 per cent confidence interval and the p-value.") % {
            "cold": cold_start_minutes}),
        (_("Rounding"), _("Each amount is rounded once to the currency's minor unit; a total is the sum of the "
                          "rounded rows above it.")),
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


SAVINGS_CSV_COLUMNS = ("section", "row", "whole_card", "dynamic", "saving", "reduction_pct", "currency")


def _csv_amount(value: Decimal | None, currency: str) -> str:
    """An amount already rounded to the minor unit, written with exactly the currency's decimals."""
    return "" if value is None else number(f"{display_amount(value, currency):f}")


def savings_csv_rows(result: dict[str, Any], tenant_names: dict[str, str]) -> list[list[str]]:
    """The report's tables as CSV rows (SAVINGS_CSV_COLUMNS): the amounts the page shows, each to
    the currency's minor unit, percentages to 2 places, the currency on every row."""
    currency = str(result.get("currency") or "")
    tables = savings_tables(result, tenant_names)
    out: list[list[str]] = []
    if tables:
        for section, rows in (("fleet", tables.fleet), ("chargeback", tables.chargeback)):
            out += [[section, r.label, _csv_amount(r.whole_card, currency), _csv_amount(r.dynamic, currency),
                     _csv_amount(r.saving, currency),
                     "" if r.reduction_pct is None else number(f"{r.reduction_pct:.2f}"), currency] for r in rows]
    test = result["test_whole_vs_dynamic"]
    ci = test.get("ci95") or [None, None]
    for label, value in (("mean_saving_per_complete_workload_day", test.get("mean_saving")),
                         ("ci95_low", ci[0]), ("ci95_high", ci[1])):
        amount = None if value is None else Decimal(str(value))
        out.append(["paired_test", label, "", "", _csv_amount(amount, currency), "", currency])
    out.append(["paired_test", "complete_workload_days_n", "", "", number(str(test.get("n") or 0)), "", ""])
    return out


def period_text(report: PairedReport) -> str:
    """"2026-11-20 – 2026-12-01 (UTC, both days included)": the last day the user asked for, not the
    instant after it that the report stores."""
    return _("%(start)s – %(last)s (UTC, both days included)") % {
        "start": date_format(report.period_start.date(), "DATE_FORMAT"),
        "last": date_format(report.last_day, "DATE_FORMAT")}


def _comparison_cells(rows: tuple[CostComparison, ...], currency: str) -> list[list[str]]:
    return [[r.label, money_text(r.whole_card, currency), money_text(r.dynamic, currency), money_text(r.saving, currency),
             _fmt(r.reduction_pct, " %")] for r in rows]


def render_paired_report_pdf(report: PairedReport, *, tenant_names: dict[str, str]) -> bytes:
    from reportlab.lib import colors
    from reportlab.lib.pagesizes import A4
    from reportlab.lib.styles import ParagraphStyle
    from reportlab.platypus import SimpleDocTemplate, Spacer, Table, TableStyle

    if report.result is None:
        raise ValueError("the report has no result yet")
    result = report.result
    title = _("Paired static-vs-dynamic cost report")
    period = period_text(report)
    currency = str(result.get("currency") or "")
    tables = savings_tables(result, tenant_names)
    header = [_("Amounts in %(currency)s") % {"currency": currency} if currency else "", _("Whole-card"),
              _("Dynamic"), _("Saving"), _("Reduction")]
    fleet = [header, *_comparison_cells(tables.fleet, currency)] if tables else []
    chargeback = [[_("Chargeback per tenant"), *header[1:]], *_comparison_cells(tables.chargeback, currency)] \
        if tables else []
    rows = summary_rows(result)
    note = partial_days_note(result)
    study = study_rows(result)
    study_title = _("The study's figures beside ours")
    terms = definitions(int(result["method"]["cold_start_excluded_minutes"]))
    study_head = ["", _("Study"), _("Ours")]
    # Every string drawn goes into the font subset (the "Ours" header once did not, so its "O"
    # was drawn as the empty .notdef glyph); PdfFont.paragraph refuses any character left out.
    font = pdf_font([title, period, note, study_title, *header, *study_head,
                     *(c for row in fleet + chargeback for c in row), *(a + b for a, b in rows),
                     *(a + b + c for a, b, c in study), *(f"{a}: {b}" for a, b in terms),
                     _("The organisation's view: fleet cost"), _("Per workload-day (steady state, paired test)"),
                     _("Definitions")])
    body = ParagraphStyle("body", fontName=font.name, fontSize=9, leading=12)
    heading = ParagraphStyle("heading", fontName=font.name, fontSize=16, leading=20, spaceAfter=6)
    grid = TableStyle([*font.table_commands(), ("GRID", (0, 0), (-1, -1), 0.3, colors.grey),
                       ("VALIGN", (0, 0), (-1, -1), "TOP")])

    def table(cells: list[list[str]], widths: list[int]) -> Table:
        # Cells are text, never markup: a tenant named "R&D <lab>" prints as it is named.
        out = Table([[font.paragraph(c, body) for c in row] for row in cells], colWidths=widths)
        out.setStyle(grid)
        return out

    story: list[Any] = [font.paragraph(title, heading), font.paragraph(period, body), Spacer(1, 8)]
    if tables:
        widths = [150, 85, 85, 85, 65]
        story += [font.paragraph(_("The organisation's view: fleet cost"), body), table(fleet, widths), Spacer(1, 8),
                  table(chargeback, widths), Spacer(1, 8)]
    story += [font.paragraph(_("Per workload-day (steady state, paired test)"), body),
              table([[a, b] for a, b in rows], [250, 220])]
    if note:
        story.append(font.paragraph(note, body))
    story += [Spacer(1, 8), font.paragraph(study_title, body), table([study_head, *([a, b, c] for a, b, c in study)],
                                                                      [210, 130, 130]),
              Spacer(1, 8), font.paragraph(_("Definitions"), body)]
    story += [font.paragraph(f"{term}: {text}", body) for term, text in terms]
    buffer = io.BytesIO()
    SimpleDocTemplate(buffer, pagesize=A4, title=title, **font.template_options()).build(story)
    return buffer.getvalue()
