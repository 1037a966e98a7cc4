"""The paired report for people: its tables (the static alternatives on the fleet, the fleet held,
the chargeback against the headline's baseline, the paired tests), the definitions of every figure
and baseline, the CSV rows and the PDF (reportlab; Chinese text through the shipped font subset).
The page, the dashboard's card, the CSV and the PDF all read their figures from `savings_tables`,
so each is rounded once, in one place, and shows the same everywhere."""

from __future__ import annotations

import io
from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import Decimal, InvalidOperation
from typing import Any

from django.utils.formats import date_format
from django.utils.translation import gettext as _
from django.utils.translation import gettext_lazy, ngettext

from billing.csv_files import number
from billing.models import PairedReport
from billing.money import amount_text, apportion, display_amount, minor_unit_exponent, money_text, round_parts
from billing.pdf_fonts import pdf_font
from billing.services.savings.static_alternatives import ALTERNATIVES

__all__ = [
    "ALTERNATIVE_LABELS",
    "SAVINGS_CSV_COLUMNS",
    "STUDY_NAME",
    "AlternativeRow",
    "CostComparison",
    "PairedRow",
    "SavingsTables",
    "cards_text",
    "definitions",
    "headline_text",
    "is_current",
    "p_value_text",
    "paired_rows",
    "partial_days_note",
    "period_text",
    "render_paired_report_pdf",
    "savings_csv_rows",
    "savings_tables",
    "shortfall_text",
    "study_note",
    "study_rows",
    "summary_rows",
]

# The study (docs/design.md, The study) by its name, and the figures it reports, shown beside
# ours, never in their place.
STUDY_NAME = gettext_lazy("Cost management of container services by dynamic allocation of NVIDIA vGPUs through DRA")
_STUDY = {
    "cost_reduction_pct": "−37 %",
    "containers_per_card": "2.8×",
    "sm_utilisation": "12–18 % → 63–71 %",
    "idle_memory": "82.3 % → 11.7 %",
    "efficiency": "> 2.1×",
}
ALTERNATIVE_LABELS = {
    "dynamic": gettext_lazy("Dynamic allocation (as run)"),
    "whole_card": gettext_lazy("Whole cards"),
    "request_fraction": gettext_lazy("Request fractions (time-slicing, HAMi)"),
    "fixed_profile": gettext_lazy("Fixed profiles (MIG)"),
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


def is_current(result: dict[str, Any] | None) -> bool:
    """Whether a report's result has the static alternatives placed on the fleet (a report computed
    by an earlier version has not, and is shown only as "compute it again")."""
    return bool(result) and "alternatives" in (result or {}).get("fleet", {}) and "tests" in (result or {})


@dataclass(frozen=True)
class CostComparison:
    """One row of a chargeback table: the same thing under the headline's static baseline and under
    dynamic allocation, each rounded once to the currency's minor unit (`static` None when no static
    alternative fits the fleet); a total row is the sum of the rounded rows above it."""

    label: str
    static: Decimal | None
    dynamic: Decimal
    is_total: bool = False

    @property
    def saving(self) -> Decimal | None:
        return None if self.static is None else self.static - self.dynamic

    @property
    def reduction_pct(self) -> Decimal | None:
        """Saving as a share of the static amount, percent (None when that is 0 or missing)."""
        return self.saving / self.static * 100 if self.static and self.saving is not None else None


@dataclass(frozen=True)
class AlternativeRow:
    """An allocation on the fleet: dynamic as it ran, or a static alternative placed on it. `cost`
    (rounded once) is None for an alternative that needs cards the fleet does not have."""

    key: str  # "dynamic" or one of ALTERNATIVES
    feasible: bool
    cost: Decimal | None
    dynamic: Decimal  # dynamic's cost, the same figure on every row
    card_hours: Decimal | None
    peak_cards: int  # the most cards it held at once (needed, when not feasible)
    fleet_cards: int  # the fleet's cards at that moment
    shortfall_at: datetime | None
    shortfall_model: str
    is_baseline: bool

    @property
    def label(self) -> str:
        return str(ALTERNATIVE_LABELS[self.key])

    @property
    def cards(self) -> str:
        return cards_text(self)

    @property
    def why_not(self) -> str:
        """Why it is not feasible ("" when it is)."""
        return "" if self.feasible else shortfall_text(self)

    @property
    def saving(self) -> Decimal | None:
        """What dynamic saved against this alternative (negative: dynamic cost more)."""
        return None if self.cost is None or self.key == "dynamic" else self.cost - self.dynamic

    @property
    def reduction_pct(self) -> Decimal | None:
        saving = self.saving
        return saving / self.cost * 100 if saving is not None and self.cost else None


@dataclass(frozen=True)
class SavingsTables:
    currency: str
    alternatives: tuple[AlternativeRow, ...]  # dynamic first, then ALTERNATIVES' order
    held: tuple[CostComparison, ...]  # the fleet held (dynamic column): busy, empty, total
    chargeback: tuple[CostComparison, ...]  # per tenant, the platform, the total (last)
    baseline: str | None  # the cheapest feasible alternative, None when none fits
    profiles: dict[str, dict[str, int]]  # GPU model -> fixed profile -> workloads given it

    @property
    def dynamic(self) -> AlternativeRow:
        return self.alternatives[0]

    @property
    def baseline_row(self) -> AlternativeRow | None:
        return next((r for r in self.alternatives if r.key == self.baseline), None)

    @property
    def feasible(self) -> dict[str, AlternativeRow]:
        """The static alternatives that fit on the fleet, by key."""
        return {r.key: r for r in self.alternatives[1:] if r.feasible}

    def row(self, key: str) -> AlternativeRow:
        return next(r for r in self.alternatives if r.key == key)


def _shown_parts(parts: list[Decimal], total: Decimal, currency: str) -> tuple[list[Decimal], Decimal]:
    """Rows rounded so that they add up to `total`'s own rounded figure (apportioned by the largest
    remainder, billing.money.apportion): a total shown in two tables is the same figure in both.
    Rows on both sides of zero cannot be apportioned: each is then rounded, their sum the total."""
    shown = display_amount(total, currency)
    if (all(p >= 0 for p in parts) and shown >= 0) or (all(p <= 0 for p in parts) and shown <= 0):
        return apportion(shown, parts, minor_unit_exponent(currency)), shown
    return round_parts(parts, currency)


def _rows_with_total(rows: list[tuple[str, Decimal | None, Decimal]], total_label: str, currency: str, *,
                     static_total: Decimal | None, dynamic_total: Decimal) -> tuple[CostComparison, ...]:
    """A table of rows and its total row: each column's rows apportioned to its total's figure."""
    has_static = static_total is not None and all(s is not None for _, s, _ in rows)
    statics, static_shown = _shown_parts([s or Decimal(0) for _, s, _ in rows], static_total or Decimal(0), currency)
    dynamics, dynamic_shown = _shown_parts([d for _, _, d in rows], dynamic_total, currency)
    out = [CostComparison(label, static if has_static else None, dynamic)
           for (label, _, _), static, dynamic in zip(rows, statics, dynamics, strict=True)]
    return (*out, CostComparison(total_label, static_shown if has_static else None, dynamic_shown, is_total=True))


def _instant(text: str | None) -> datetime | None:
    return datetime.fromisoformat(text).astimezone(UTC) if text else None


def savings_tables(result: dict[str, Any] | None, tenant_names: dict[str, str]) -> SavingsTables | None:
    """Every figure of a report's organisation view, each rounded once (None for a report computed
    before static alternatives were placed on the fleet)."""
    if result is None or not is_current(result):
        return None
    currency = str(result.get("currency") or "")
    fleet, chargeback = result["fleet"], result["chargeback"]
    held = fleet["held"]
    held_rows = _rows_with_total([
        (_("Cards with workloads on them"), None, Decimal(held["busy_cards"])),
        (_("Cards with no workload"), None, Decimal(held["empty_cards"])),
    ], _("Fleet cost"), currency, static_total=None, dynamic_total=Decimal(held["total"]))
    dynamic_cost = held_rows[0].dynamic  # the same figure as the busy cards' row above
    baseline = fleet["baseline"]
    dynamic = fleet["dynamic"]
    # The cards dynamic held at its busiest minute, of the cards metered in that same minute (a
    # report computed before stored that minute: the fleet's own busiest minute).
    rows = [AlternativeRow("dynamic", True, dynamic_cost, dynamic_cost, _hours(dynamic.get("card_hours")),
                           int(dynamic["peak_cards"]), int(dynamic.get("fleet_cards_at_peak", held["peak_cards"])),
                           None, "", False)]
    for key in ALTERNATIVES:
        alt = fleet["alternatives"][key]
        shortfall = alt.get("shortfall") or {}
        feasible = bool(alt["feasible"])
        rows.append(AlternativeRow(
            key, feasible, display_amount(Decimal(alt["cost"]), currency) if feasible else None, dynamic_cost,
            _hours(alt.get("card_hours")),
            int(shortfall.get("needed", alt["peak_cards"])),
            int(shortfall.get("had", alt["fleet_cards_at_peak"])),
            _instant(shortfall.get("at")), str(shortfall.get("model", "")), key == baseline))
    tenant_rows = [(tenant_names.get(t["tenant"], t["tenant"]), _decimal(t.get(baseline or "")),
                    Decimal(t["dynamic"])) for t in chargeback["tenants"]]
    platform = chargeback["platform"]
    baseline_row = next((r for r in rows if r.key == baseline), None)
    # The chargeback adds up to the figures of the table above: dynamic's cost and the baseline's.
    charge_rows = _rows_with_total([
        *sorted(tenant_rows, key=lambda r: (-r[2], r[0])),
        (_("Platform (idle no tenant was charged)"), _decimal(platform.get(baseline or "")),
         Decimal(platform["dynamic"])),
    ], _("Total"), currency, static_total=baseline_row.cost if baseline_row else None, dynamic_total=dynamic_cost)
    return SavingsTables(currency, tuple(rows), held_rows, charge_rows, baseline, result.get("profiles") or {})


def _decimal(value: Any) -> Decimal | None:
    return None if value is None or value == "" else Decimal(str(value))


def _hours(value: Any) -> Decimal | None:
    return None if value is None else Decimal(str(value)).quantize(Decimal("0.1"))


def shortfall_text(row: AlternativeRow) -> str:
    """Why an alternative is not feasible, in the reader's language."""
    return _("Not feasible: it needs %(needed)s %(model)s cards at once (%(at)s UTC), the fleet metered "
             "%(had)s in that minute.") % {
        "needed": row.peak_cards, "had": row.fleet_cards, "model": row.shortfall_model,
        "at": date_format(row.shortfall_at, "DATETIME_FORMAT") if row.shortfall_at else "—"}


def headline_text(tables: SavingsTables) -> tuple[str, str]:
    """The report's headline (the figure, the sentence under it): the saving of dynamic allocation
    against the cheapest static alternative that fits on the fleet, said plainly when negative,
    or that none fits."""
    row = tables.baseline_row
    if row is None or row.saving is None:
        # No fleet-wide card count here: each alternative fell short at its own minute, against the
        # cards metered in that minute, and says so on its own row.
        return _("No static alternative fits on this fleet"), _(
            "Each static alternative needs, at some minute, more cards than the fleet metered in that minute "
            "(each one's shortfall is shown), so there is nothing to compare against and none is priced. "
            "Dynamic allocation ran the same workloads on the fleet's own cards for %(cost)s.") % {
            "cost": money_text(tables.dynamic.cost, tables.currency)}
    pct = row.reduction_pct
    figure = money_text(abs(row.saving), tables.currency)
    if pct is not None:
        figure = f"{figure} ({abs(pct):.1f} %)"
    if row.saving < 0:
        return figure, _("more than %(baseline)s, the cheapest static alternative that fits on this fleet: "
                         "dynamic allocation cost more.") % {"baseline": row.label}
    return figure, _("saved against %(baseline)s, the cheapest static alternative that fits on this fleet.") % {
        "baseline": row.label}


@dataclass(frozen=True)
class PairedRow:
    """The paired test of one static alternative against dynamic, over complete workload-days. An
    alternative that does not fit on the fleet has no figures (None), only `why_not`."""

    key: str
    static_cost: Decimal | None  # Σ x, every steady workload-day
    dynamic_cost: Decimal | None  # Σ y
    n: int
    mean_saving: Decimal | None
    ci95_low: Decimal | None
    ci95_high: Decimal | None
    p_value: float | None
    is_baseline: bool
    why_not: str = ""  # why the alternative is not feasible ("" when it is)

    @property
    def feasible(self) -> bool:
        return not self.why_not

    @property
    def label(self) -> str:
        return str(ALTERNATIVE_LABELS[self.key])

    @property
    def p_value_text(self) -> str:
        return p_value_text(self.p_value)

    @property
    def reduction_pct(self) -> Decimal | None:
        if not self.static_cost or self.dynamic_cost is None:
            return None
        return (1 - self.dynamic_cost / self.static_cost) * 100


def paired_rows(result: dict[str, Any], currency: str) -> list[PairedRow]:
    """One row per static alternative: Σ x, Σ y, the mean saving per complete workload-day, its 95 %
    confidence interval, the p-value and n, each amount rounded once to the currency's minor unit.
    An alternative that does not fit on the fleet is priced nowhere, here neither: its row says why."""
    s = result["summary"]
    baseline = result["fleet"].get("baseline")
    tables = savings_tables(result, {})
    rows = []
    for key in ALTERNATIVES:
        if tables is not None and not tables.row(key).feasible:
            rows.append(PairedRow(key, None, None, 0, None, None, None, None, False, tables.row(key).why_not))
            continue
        t = result["tests"][key]
        ci = t.get("ci95") or [None, None]
        mean, low, high = (None if v is None else display_amount(Decimal(str(v)), currency)
                           for v in (t.get("mean_saving"), ci[0], ci[1]))
        rows.append(PairedRow(key, display_amount(Decimal(s["static_cost"][key]), currency),
                              display_amount(Decimal(s["dynamic_cost"]), currency), int(t.get("n") or 0), mean, low,
                              high, t.get("p_value"), key == baseline))
    return rows


def p_value_text(p: float | None) -> str:
    if p is None:
        return "—"
    return "< 0.001" if p < 0.001 else f"{p:.3f}"


def _whole_cards_why_not(result: dict[str, Any]) -> str:
    """Why whole cards do not fit on the fleet ("" when they do): the figures measured against them
    (utilisation and idle memory of whole cards, efficiency, the study's cost reduction) are then
    comparisons with cards the fleet did not have, and are not shown."""
    tables = savings_tables(result, {})
    return "" if tables is None else tables.row("whole_card").why_not


def summary_rows(result: dict[str, Any]) -> list[tuple[str, str]]:
    """(label, value) rows of the figures that are not per alternative, shared by the page and the PDF."""
    s = result["summary"]
    n = max((int(t.get("n") or 0) for t in result["tests"].values()), default=0)
    rows = [
        (_("Complete workload-days compared (n)"), _fmt(n)),
        (_("Containers per card"), _fmt(s["containers_per_card"])),
    ]
    if _whole_cards_why_not(result):
        return [*rows, (_("SM utilisation, dynamic"), _fmt(s["sm_utilisation_dynamic_pct"], " %")),
                (_("Idle memory, dynamic"), _fmt(s["idle_memory_share_dynamic_pct"], " %"))]
    return [
        *rows,
        (_("SM utilisation, whole cards → dynamic"),
         f"{_fmt(s['sm_utilisation_static_pct'], ' %')} → {_fmt(s['sm_utilisation_dynamic_pct'], ' %')}"),
        (_("Idle memory, whole cards → dynamic"),
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
    """(term, definition) of every figure and every baseline, shown on the report pages and in the PDF."""
    return [
        (str(ALTERNATIVE_LABELS["dynamic"]), _(
            "Workloads share cards; each is charged its measured share of the card (memory and SMs, the larger "
            "of used and granted each second), as the ledger bills it. Its cost on the fleet is every "
            "card-minute that held at least one workload, as it ran.")),
        (_("A workload's need"), _(
            "For each workload (one container on one GPU), per resource (memory, SMs): the larger of what it "
            "asked for (its request) and the most it used in any one minute of the period. A static slice is "
            "not lent back and forth, so to run the same work it must hold the workload's busiest minute: less "
            "memory would have stopped it, fewer SMs slowed it. Minute means are below the true peaks, so this "
            "favours the static alternatives.")),
        (str(ALTERNATIVE_LABELS["whole_card"]), _(
            "Each workload holds a whole card for as long as it runs; a workload on two GPUs holds two cards.")),
        (str(ALTERNATIVE_LABELS["request_fraction"]), _(
            "Each workload holds a fixed fraction of a card, its need in memory and in SMs (time-slicing with "
            "HAMi-style memory and core limits); a card holds workloads while their memory and their SMs each "
            "fit.")),
        (str(ALTERNATIVE_LABELS["fixed_profile"]), _(
            "Each workload holds the smallest MIG profile of its card's model whose memory and compute slices "
            "hold its need, at a position NVIDIA's placement rules allow: on A100 and H100 80GB 1g.10gb, "
            "1g.20gb, 2g.20gb, 3g.40gb, 4g.40gb or 7g.80gb (7 compute and 8 memory slices; A100 40GB, H100 "
            "94GB, H200 and A30 in their own sizes). A card model without MIG gives the whole card.")),
        (_("Placed on the actual fleet"), _(
            "Each static alternative is placed on the cards the fleet really had, minute by minute, on cards of "
            "the model the workload ran on: first fit in the fleet's order, the largest slice first among "
            "workloads that start together; a slice stays on its card until its workload ends. An alternative "
            "that needs more cards than the fleet had at some moment is not feasible: the page says how many it "
            "needed and never prices cards the fleet did not have.")),
        (_("The fleet's cards"), _(
            "The cards metered in one minute (priced, with metered time). A card that meters some hours only, "
            "such as a burst node, is part of the fleet in those minutes only: static alternatives are placed on "
            "it then and never when it was not metered. Every count of cards on this page is of one minute: "
            "“N of M cards” is an allocation's cards at its busiest minute of the M the fleet metered in that "
            "minute, and a shortfall names the minute an alternative needed more cards than the fleet metered "
            "then.")),
        (_("Cost of an allocation"), _(
            "Every card-minute that held at least one of its workloads or slices, at the card's rate card, as "
            "the ledger priced that minute. Cards it left empty could have been handed back, so they are not "
            "counted against it.")),
        (_("Headline saving"), _(
            "The cost of the cheapest feasible static alternative − the cost of dynamic allocation; reduction % "
            "= that ÷ the alternative's cost × 100, from the amounts shown. Negative when dynamic allocation "
            "cost more.")),
        (_("Fleet cost"), _(
            "What the organisation paid for the cards it held, busy or idle: every metered card-minute at its "
            "rate card (the finance dashboard's total GPU cost). Unpriced GPU models are left out.")),
        (_("Chargeback"), _(
            "What each tenant pays: under dynamic allocation its charges plus any idle spread onto it; under a "
            "static alternative its workloads' slices, each slice's share of the card (α × its share of the "
            "memory + (1 − α) × its share of the compute, α = 0.5, as the ledger prices use) at the card's "
            "price for every second the workload ran. The platform row is the rest of each allocation's cost, "
            "so the rows add up to it.")),
        (_("Workload-day and the paired test"), _(
            "One workload on one UTC day; only days that were over when the report was computed count. The "
            "first %(cold)s minutes of each workload are left out (cold start). For each workload-day and each "
            "static alternative, x = its chargeback under the alternative, y = what it was charged; a paired "
            "t-test of x against y gives the mean saving per workload-day, its 95 per cent confidence interval "
            "and the p-value.") % {"cold": cold_start_minutes}),
        (_("Rounding"), _("Each amount is rounded once to the currency's minor unit. A table's rows are its "
                          "total's rounded figure split in proportion to them (largest remainder), so they add up "
                          "to it, and a figure shown in two tables, on the dashboard or in a download is the same.")),
    ]


def study_rows(result: dict[str, Any]) -> list[tuple[str, str, str]]:
    """(figure, the study's, ours) for the figures the study reports; its baseline is whole cards.
    When whole cards do not fit on this fleet, each figure measured against them says why instead."""
    s = result["summary"]
    reduction = s["chargeback_reduction_pct"]["whole_card"]
    why_not = _whole_cards_why_not(result)
    if why_not:
        return [
            (_("Container GPU cost against whole cards"), _STUDY["cost_reduction_pct"], why_not),
            (_("Containers per card"), _STUDY["containers_per_card"], _fmt(s["containers_per_card"], "×")),
            (_("GPU (SM) utilisation, static → dynamic"), _STUDY["sm_utilisation"], why_not),
            (_("Idle GPU memory, static → dynamic"), _STUDY["idle_memory"], why_not),
            (_("Resource optimisation efficiency"), _STUDY["efficiency"], why_not),
        ]
    return [
        (_("Container GPU cost against whole cards"), _STUDY["cost_reduction_pct"],
         "—" if reduction is None else f"{-reduction:+.1f} %".replace("-", "−")),
        (_("Containers per card"), _STUDY["containers_per_card"], _fmt(s["containers_per_card"], "×")),
        (_("GPU (SM) utilisation, static → dynamic"), _STUDY["sm_utilisation"],
         f"{_fmt(s['sm_utilisation_static_pct'], ' %')} → {_fmt(s['sm_utilisation_dynamic_pct'], ' %')}"),
        (_("Idle GPU memory, static → dynamic"), _STUDY["idle_memory"],
         f"{_fmt(s['idle_memory_share_static_pct'], ' %')} → {_fmt(s['idle_memory_share_dynamic_pct'], ' %')}"),
        (_("Resource optimisation efficiency"), _STUDY["efficiency"], _fmt(s["resource_optimisation_efficiency"], "×")),
    ]


def study_note() -> str:
    return _("The study: “%(name)s”, dynamic GPU sharing on A100 80GB cards, 142 nodes over 37 days, against "
             "whole cards. Ours: this fleet and period, measured as defined below; where ours are worse, they "
             "are worse.") % {"name": STUDY_NAME}


SAVINGS_CSV_COLUMNS = ("section", "row", "allocation", "feasible", "static", "dynamic", "saving", "reduction_pct",
                       "cards_needed", "cards_in_fleet", "currency")


def _csv_amount(value: Decimal | None, currency: str) -> str:
    """An amount already rounded to the minor unit, written with exactly the currency's decimals."""
    return "" if value is None else number(amount_text(value, currency))


def _csv_pct(value: Decimal | None) -> str:
    return "" if value is None else number(f"{value:.2f}")


def savings_csv_rows(result: dict[str, Any], tenant_names: dict[str, str]) -> list[list[str]]:
    """The report's tables as CSV rows (SAVINGS_CSV_COLUMNS): the figures the page shows, each to the
    currency's minor unit, percentages to 2 places, the currency on every row with an amount."""
    currency = str(result.get("currency") or "")
    tables = savings_tables(result, tenant_names)
    if tables is None:
        return []
    out: list[list[str]] = [
        ["alternatives", r.label, r.key, "yes" if r.feasible else "no",
         _csv_amount(r.cost, currency) if r.key != "dynamic" else "", _csv_amount(r.dynamic, currency),
         _csv_amount(r.saving, currency), _csv_pct(r.reduction_pct), number(str(r.peak_cards)),
         number(str(r.fleet_cards)), currency]
        for r in tables.alternatives]
    out += [["fleet", r.label, "dynamic", "", "", _csv_amount(r.dynamic, currency), "", "", "", "", currency]
            for r in tables.held]
    out += [["chargeback", r.label, tables.baseline or "", "", _csv_amount(r.static, currency),
             _csv_amount(r.dynamic, currency), _csv_amount(r.saving, currency), _csv_pct(r.reduction_pct), "", "",
             currency] for r in tables.chargeback]
    for p in paired_rows(result, currency):
        if not p.feasible:
            out.append(["paired_test", "not_feasible", p.key, "no", "", "", "", "", "", "", ""])
            continue
        for label, value in (("static_cost", p.static_cost), ("dynamic_cost", p.dynamic_cost),
                             ("mean_saving_per_complete_workload_day", p.mean_saving), ("ci95_low", p.ci95_low),
                             ("ci95_high", p.ci95_high)):
            out.append(["paired_test", label, p.key, "", "", "", _csv_amount(value, currency), "", "", "", currency])
        out.append(["paired_test", "p_value", p.key, "", "", "", "" if p.p_value is None else
                    number(f"{p.p_value:.6g}"), "", "", "", ""])
        out.append(["paired_test", "complete_workload_days_n", p.key, "", "", "", number(str(p.n)), "", "", "", ""])
    return out


def period_text(report: PairedReport) -> str:
    """"2026-11-20 – 2026-12-01 (UTC, both days included)": the last day the user asked for, not the
    instant after it that the report stores."""
    return _("%(start)s – %(last)s (UTC, both days included)") % {
        "start": date_format(report.period_start.date(), "DATE_FORMAT"),
        "last": date_format(report.last_day, "DATE_FORMAT")}


def alternative_cells(tables: SavingsTables) -> list[list[str]]:
    """The alternatives table as text cells (the PDF's; the page renders the same rows)."""
    currency = tables.currency
    cells = []
    for r in tables.alternatives:
        if not r.feasible:
            cells.append([r.label, shortfall_text(r), "", "", ""])
            continue
        label = _("%(allocation)s (the headline's baseline)") % {"allocation": r.label} if r.is_baseline else r.label
        cells.append([label, cards_text(r), money_text(r.cost, currency),
                      "" if r.saving is None else money_text(r.saving, currency), _fmt(r.reduction_pct, " %")])
    return cells


def _comparison_cells(rows: tuple[CostComparison, ...], currency: str) -> list[list[str]]:
    return [[r.label, _amount(r.static, currency), money_text(r.dynamic, currency), _amount(r.saving, currency),
             _fmt(r.reduction_pct, " %")] for r in rows]


def _paired_cells(rows: list[PairedRow], currency: str) -> list[list[str]]:
    return [[r.label, _amount(r.static_cost, currency), _amount(r.dynamic_cost, currency),
             _fmt(r.reduction_pct, " %"), _amount(r.mean_saving, currency),
             f"{_amount(r.ci95_low, currency)} … {_amount(r.ci95_high, currency)}", p_value_text(r.p_value),
             _fmt(r.n)] if r.feasible else [r.label, r.why_not, "", "", "", "", "", ""] for r in rows]


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
    tables = savings_tables(result, tenant_names)
    if tables is None:
        raise ValueError("the report was computed before static alternatives were placed on the fleet")
    currency = tables.currency
    amounts = _("Amounts in %(currency)s") % {"currency": currency} if currency else ""
    figure, sentence = headline_text(tables)
    alt_head = [amounts, _("Cards at the busiest moment"), _("Cost"), _("Dynamic saves"), _("Reduction")]
    alternatives = [alt_head, *alternative_cells(tables)]
    baseline_label = tables.baseline_row.label if tables.baseline_row else "—"
    charge_head = [_("Chargeback per tenant"), baseline_label, _("Dynamic"), _("Saving"), _("Reduction")]
    chargeback = [charge_head, *_comparison_cells(tables.chargeback, currency)]
    held = [[_("The fleet held"), _("Cost")], *([r.label, money_text(r.dynamic, currency)] for r in tables.held)]
    paired_head = ["", _("Static"), _("Dynamic"), _("Reduction"), _("Mean saving per workload-day"),
                   _("Confidence interval (95 per cent)"), _("p-value (paired t-test)"), "n"]
    paired = [paired_head, *_paired_cells(paired_rows(result, currency), currency)]
    rows = summary_rows(result)
    note = partial_days_note(result)
    study = study_rows(result)
    study_title = _("The study's figures beside ours")
    study_text = study_note()
    terms = definitions(int(result["method"]["cold_start_excluded_minutes"]))
    study_head = ["", _("Study"), _("Ours")]
    headings = [_("Static alternatives on this fleet"), _("Per workload-day (steady state, paired test)"),
                _("Definitions")]
    # Every string drawn goes into the font subset (the "Ours" header once did not, so its "O"
    # was drawn as the empty .notdef glyph); PdfFont.paragraph refuses any character left out.
    font = pdf_font([title, period, note, study_title, study_text, figure, sentence, *headings,
                     *(c for table in (alternatives, chargeback, held, paired) for row in table for c in row),
                     *(a + b for a, b in rows), *(a + b + c for a, b, c in study), *study_head,
                     *(f"{a}: {b}" for a, b in terms)])
    body = ParagraphStyle("body", fontName=font.name, fontSize=9, leading=12)
    small = ParagraphStyle("small", fontName=font.name, fontSize=7, leading=9)
    heading = ParagraphStyle("heading", fontName=font.name, fontSize=16, leading=20, spaceAfter=6)
    grid = TableStyle([*font.table_commands(), ("GRID", (0, 0), (-1, -1), 0.3, colors.grey),
                       ("VALIGN", (0, 0), (-1, -1), "TOP")])

    def table(cells: list[list[str]], widths: list[int], style: ParagraphStyle = body) -> Table:
        # Cells are text, never markup: a tenant named "R&D <lab>" prints as it is named.
        out = Table([[font.paragraph(c, style) for c in row] for row in cells], colWidths=widths)
        out.setStyle(grid)
        return out

    widths = [150, 85, 85, 85, 65]
    story: list[Any] = [
        font.paragraph(title, heading), font.paragraph(period, body), Spacer(1, 8),
        font.paragraph(f"{figure}: {sentence}", body), Spacer(1, 8),
        font.paragraph(headings[0], body), table(alternatives, widths), Spacer(1, 8),
        table(held, [300, 170]), Spacer(1, 8), table(chargeback, widths), Spacer(1, 8),
        font.paragraph(headings[1], body), table(paired, [90, 60, 60, 45, 60, 100, 45, 25], small),
        table([[a, b] for a, b in rows], [250, 220]),
    ]
    if note:
        story.append(font.paragraph(note, body))
    story += [Spacer(1, 8), font.paragraph(study_title, body),
              table([study_head, *([a, b, c] for a, b, c in study)], [210, 130, 130]),
              font.paragraph(study_text, body), Spacer(1, 8), font.paragraph(headings[2], body)]
    story += [font.paragraph(f"{term}: {text}", body) for term, text in terms]
    buffer = io.BytesIO()
    SimpleDocTemplate(buffer, pagesize=A4, title=title, **font.template_options()).build(story)
    return buffer.getvalue()


def cards_text(row: AlternativeRow) -> str:
    """"24 of 24 cards" at the busiest moment, in the reader's language."""
    return ngettext("%(used)s of %(fleet)s card", "%(used)s of %(fleet)s cards", row.fleet_cards) % {
        "used": row.peak_cards, "fleet": row.fleet_cards}
