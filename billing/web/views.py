"""Server-rendered pages. Thin: parse the request, call one query, render."""

from __future__ import annotations

from collections.abc import Callable
from datetime import date, datetime, timedelta
from decimal import Decimal
from typing import Any
from urllib.parse import urlencode

from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse, HttpResponseBadRequest
from django.shortcuts import redirect, render
from django.urls import reverse
from django.utils import timezone
from django.utils.formats import date_format
from django.utils.safestring import SafeString
from django.utils.translation import gettext as _

from billing.csv_files import amount_cell, csv_writer, download_name, number, quantity_cell
from billing.errors import InvalidInput
from billing.money import QUANTITY_PLACES, round_quantities
from billing.queries.dashboard import IDLE_KEY, CostTimeline, FinanceDashboard, UtilisationPoint, get_finance_dashboard
from billing.queries.finance import PAGE_PLACES, CostSummary
from billing.queries.snapshot import one_snapshot
from billing.scope import get_scope
from billing.web.access import require_platform
from billing.web.charts import Series, line_chart, stacked_bar_chart
from billing.web.forms import PeriodForm
from billing.web.reports import request_report
from billing.web.tables import shown_costs
from billing.web.trends import months_chart


@login_required
def finance_overview(request: HttpRequest) -> HttpResponse:
    if request.method == "POST":  # the savings card's button
        return _request_savings_report(request)
    return _overview(request)


@one_snapshot()
def _overview(request: HttpRequest) -> HttpResponse:
    # No query string: the month to date.
    form = PeriodForm(request.GET or PeriodForm.default_initial(timezone.now().date()))
    as_csv = request.GET.get("format") == "csv"
    table = request.GET.get("table") or "tenants"
    if as_csv and table not in _CSV_TABLES:
        return HttpResponseBadRequest(
            _("Unknown table “%(table)s”: choose one of %(tables)s.") % {"table": table, "tables": ", ".join(_CSV_TABLES)},
            content_type="text/plain; charset=utf-8",
        )
    dashboard = None
    if form.is_valid():
        start, end = form.bounds()
        # The CSVs state quantities to more places than the page (docs/exports.md).
        places = QUANTITY_PLACES["gpu_hours"] if as_csv else PAGE_PLACES
        dashboard = get_finance_dashboard(scope=get_scope(request.user), start=start, end=end, places=places,
                                          trends=not as_csv)
        if as_csv:
            return _CSV_TABLES[table](dashboard)
    return _dashboard_page(request, form, dashboard)


def _request_savings_report(request: HttpRequest) -> HttpResponse:
    """The savings card's button: a paired report of exactly the period the dashboard shows (its
    first and last day, posted back as the page's period form has them), joining one of that period
    already being computed; then the dashboard of that period, whose card shows its progress. Bad
    dates are the period form's errors and a refused period the card's, both a 400 with nothing
    created. Finance and admins only, as the card."""
    require_platform(request, "paired reports cover every tenant: finance and admins only")
    form = PeriodForm(request.POST)
    if not form.is_valid():
        return _dashboard_page(request, form, None)
    try:
        request_report(request, form)
    except InvalidInput as exc:
        start, end = form.bounds()
        dashboard = get_finance_dashboard(scope=get_scope(request.user), start=start, end=end)
        return _dashboard_page(request, form, dashboard, savings_error=str(exc))
    query = urlencode({"start": form.cleaned_data["start"].isoformat(), "end": form.cleaned_data["end"].isoformat()})
    return redirect(f"{reverse('finance-overview')}?{query}#savings")


def _dashboard_page(request: HttpRequest, form: PeriodForm, dashboard: FinanceDashboard | None, *,
                    savings_error: str = "") -> HttpResponse:
    today = timezone.now().date()
    summary = dashboard.summary if dashboard else None
    live = summary is not None and summary.end > timezone.now()
    shown = shown_costs(summary) if summary else None
    context: dict[str, object] = {
        "form": form, "dashboard": dashboard, "summary": summary, "live": live, "shown": shown,
        "max_total": shown.max_row_total if shown else 0, "quick_periods": quick_periods(today, form),
        "savings_error": savings_error,
    }
    if dashboard is not None:
        context.update(_charts(dashboard))
        context["period_query"] = urlencode({"start": form.cleaned_data["start"].isoformat(),
                                             "end": form.cleaned_data["end"].isoformat()})
        if dashboard.comparison is not None:
            c = dashboard.comparison
            context["previous_query"] = urlencode({"start": c.previous_first.isoformat(),
                                                   "end": c.previous_last.isoformat()})
    status = 200 if form.is_valid() and not savings_error else 400
    return render(request, "billing/finance_overview.html", context, status=status)


def quick_periods(today: date, form: PeriodForm) -> list[dict[str, object]]:
    """This month, last month, the last 7 days: links for a period form (the drill-down uses them too)."""
    first = today.replace(day=1)
    last_month_end = first - timedelta(days=1)
    chosen = (form.cleaned_data.get("start"), form.cleaned_data.get("end")) if form.is_valid() else None
    periods = [
        ("this-month", _("This month"), first, today),
        ("last-month", _("Last month"), last_month_end.replace(day=1), last_month_end),
        ("last-7-days", _("Last 7 days"), today - timedelta(days=6), today),
    ]
    return [
        {"key": key, "label": label, "query": urlencode({"start": lo.isoformat(), "end": hi.isoformat()}),
         "active": chosen == (lo, hi)}
        for key, label, lo, hi in periods
    ]


def _bucket_label(at: datetime, timeline: CostTimeline) -> str:
    # Hours show the day at midnight so a two-day chart says where the day changes.
    if timeline.granularity == "day" or at.hour == 0:
        return date_format(at, "MONTH_DAY_FORMAT")
    return f"{at:%H}:00"


def _charts(dashboard: FinanceDashboard) -> dict[str, SafeString]:
    timeline = dashboard.timeline
    categories = [_bucket_label(b, timeline) for b in timeline.buckets]
    out = {
        "cost_chart": stacked_bar_chart(
            categories, [Series(s.name, s.values) for s in timeline.series],
            label=_("Cost by tenant over time"), unit=dashboard.summary.currency,
        ),
    }
    if dashboard.months is not None and dashboard.comparison is not None:
        out["months_chart"] = months_chart(dashboard.months, unit=dashboard.summary.currency,
                                           names=dashboard.comparison.names)
    if dashboard.utilisation is not None:
        by_bucket = {p.bucket: p for p in dashboard.utilisation}
        points: list[UtilisationPoint | None] = [by_bucket.get(b) for b in timeline.buckets]
        out["utilisation_chart"] = line_chart(
            categories,
            [Series(_("SM utilisation"), [p.sm_utilisation_pct if p else None for p in points]),
             Series(_("Idle memory"), [p.idle_memory_pct if p else None for p in points])],
            label=_("Utilisation and idle memory"), unit="%", y_max=100,
        )
    return out


def _csv_response(summary: CostSummary, table: str) -> tuple[HttpResponse, Any]:  # Any: csv's writer type is private
    response = HttpResponse(content_type="text/csv; charset=utf-8")
    suffix = "" if table == "tenants" else f"-{table}"
    name = download_name(f"gpu-cost{suffix}", summary.start, summary.end)
    response["Content-Disposition"] = f'attachment; filename="{name}"'
    return response, csv_writer(response)


def _tenants_csv(dashboard: FinanceDashboard) -> HttpResponse:
    """The page's table as it shows it: amounts to the currency's minor unit, quantities to 4
    places; a last row totals every column (docs/exports.md, "How totals add")."""
    summary = dashboard.summary
    currency, shown = summary.currency, shown_costs(summary)
    response, writer = _csv_response(summary, "tenants")
    writer.writerow(["tenant", "name", "charge", "idle_share", "total", "currency", "gpu_hours_equivalent",
                     "mem_used_gb_h", "sm_used_h", "workloads", "metered_gpu_hours",
                     # Appended, so scripts reading the columns before them by position keep working.
                     "energy_kwh", "energy_cost", "co2e_kg"])
    places = summary.places
    quantities = [round_quantities([getattr(r.tenant, name) for r in shown.rows], places)
                  for name in ("gpu_hours_equivalent", "mem_used_gb_h", "sm_used_h")]
    for i, r in enumerate(shown.rows):
        writer.writerow([r.tenant.tenant, r.tenant.name, amount_cell(r.charge, currency),
                         amount_cell(r.idle_share, currency), amount_cell(r.total, currency), currency,
                         *(number(f"{q[0][i]:.{places}f}") for q in quantities), r.tenant.workloads, "",
                         *_energy_cells(r.tenant.energy_kwh, r.tenant.energy_cost, r.tenant.co2e_kg, currency, places)])
    sums = [number(f"{q[1]:.{places}f}") for q in quantities]
    workloads = sum(r.tenant.workloads for r in shown.rows)
    energy = _energy_cells(shown.energy_kwh, shown.energy_cost, shown.co2e_kg, currency, places)
    if shown.total_gpu_cost is None or shown.idle_platform is None or summary.metered_gpu_hours is None:
        writer.writerow(["(total)", _("Your cost"), amount_cell(shown.charge, currency),
                         amount_cell(shown.idle_share, currency), amount_cell(shown.attributed, currency),
                         currency, *sums, workloads, "", *energy])
        return response
    # Idle nobody was charged for sits in the charge column, so every column still adds.
    idle = amount_cell(shown.idle_platform, currency)
    writer.writerow([IDLE_KEY, _("Idle (platform)"), idle, "", idle, currency, "", "", "", "", "", "", "", ""])
    writer.writerow(["(total)", _("Total GPU cost"), amount_cell(shown.charge + shown.idle_platform, currency),
                     amount_cell(shown.idle_share, currency), amount_cell(shown.total_gpu_cost, currency),
                     currency, *sums, workloads, quantity_cell(summary.metered_gpu_hours, places), *energy])
    return response


def _energy_cells(kwh: Decimal, cost: Decimal | None, co2e_kg: Decimal | None, currency: str,
                  places: int) -> list[object]:
    """kWh and kg CO2e at the quantities' places, energy cost to the currency's minor unit, as the
    portal's CSV writes them; empty where unknown."""
    return [quantity_cell(kwh, places), "" if cost is None else amount_cell(cost, currency),
            "" if co2e_kg is None else quantity_cell(co2e_kg, places)]


def _timeline_csv(dashboard: FinanceDashboard) -> HttpResponse:
    """Long format: one row per bucket and series (tenant slug, "(other tenants)", "(idle, platform)");
    each cost rounded once to the currency's minor unit."""
    timeline, currency = dashboard.timeline, dashboard.summary.currency
    response, writer = _csv_response(dashboard.summary, "timeline")
    writer.writerow(["bucket_start", "granularity", "series", "name", "cost", "currency"])
    for i, bucket in enumerate(timeline.buckets):
        for s in timeline.series:
            writer.writerow([bucket.isoformat(), timeline.granularity, s.key, s.name, amount_cell(s.values[i], currency),
                             currency])
    return response


def _utilisation_csv(dashboard: FinanceDashboard) -> HttpResponse:
    if dashboard.utilisation is None:
        raise PermissionDenied(_("Fleet utilisation covers every tenant: finance and admins only."))
    response, writer = _csv_response(dashboard.summary, "utilisation")
    writer.writerow(["bucket_start", "granularity", "metered_gpu_s", "sm_used_s", "sm_capacity_s",
                     "sm_utilisation_pct", "mem_used_mb_s", "mem_capacity_mb_s", "idle_memory_pct"])
    whole, pct = QUANTITY_PLACES["mb_s"], QUANTITY_PLACES["percent"]  # seconds, MB·s and SM·s alike
    for p in dashboard.utilisation:
        writer.writerow([p.bucket.isoformat(), dashboard.timeline.granularity, quantity_cell(p.metered_gpu_s, whole),
                         quantity_cell(p.sm_used_s, whole), quantity_cell(p.sm_capacity_s, whole),
                         _percent(p.sm_utilisation_pct, pct), quantity_cell(p.mem_used_mb_s, whole),
                         quantity_cell(p.mem_capacity_mb_s, whole), _percent(p.idle_memory_pct, pct)])
    return response


def _workloads_csv(dashboard: FinanceDashboard) -> HttpResponse:
    response, writer = _csv_response(dashboard.summary, "workloads")
    writer.writerow(["rank", "tenant", "name", "namespace", "pod", "pod_uid", "sla_tier", "cost", "currency",
                     "gpu_hours_equivalent", "mem_used_gb_h", "sm_used_h"])
    currency, places = dashboard.summary.currency, dashboard.summary.places
    for rank, w in enumerate(dashboard.top_workloads, start=1):
        writer.writerow([rank, w.tenant, w.name, w.namespace, w.pod, w.pod_uid, w.sla_tier, amount_cell(w.cost, currency),
                         currency, quantity_cell(w.gpu_hours_equivalent, places), quantity_cell(w.mem_used_gb_h, places),
                         quantity_cell(w.sm_used_h, places)])
    return response


def _percent(value: Decimal | None, places: int) -> str:
    return "" if value is None else quantity_cell(value, places)


_CSV_TABLES: dict[str, Callable[[FinanceDashboard], HttpResponse]] = {
    "tenants": _tenants_csv,
    "timeline": _timeline_csv,
    "utilisation": _utilisation_csv,
    "workloads": _workloads_csv,
}
