"""The tenant portal and the landing redirect. Thin: scope from the user, one query, render.

A tenant outside the user's scope answers 404, exactly like one that does not exist; so does the
CSV of its upcoming invoice (`?format=upcoming-csv`).
"""

from __future__ import annotations

from datetime import date, datetime
from decimal import Decimal

from django.contrib.auth.decorators import login_required
from django.contrib.auth.views import redirect_to_login
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.utils import timezone
from django.utils.formats import date_format
from django.utils.safestring import SafeString
from django.utils.translation import gettext as _

from billing.csv_files import amount_cell, csv_writer, download_name, minor_cell, quantity_cell
from billing.errors import InvalidInput
from billing.models import BudgetAction
from billing.money import QUANTITY_PLACES
from billing.queries.finance import PAGE_PLACES
from billing.queries.portal import (
    WORKLOAD_TABLE_ROWS,
    TenantNotFound,
    TenantPortal,
    get_tenant_portal,
    get_upcoming_invoice,
    list_tenant_portals,
)
from billing.queries.snapshot import one_snapshot
from billing.scope import get_scope
from billing.services.exports import (
    EXPORT_FORMATS,
    NO_UNIT_PRICE_CELLS,
    UNIT_PRICE_COLUMNS,
    line_number_cells,
    plain_decimal,
    unit_price_cells,
)
from billing.services.fleet import HEADROOM
from billing.services.invoicing import InvoicePreview
from billing.web.access import landing_url
from billing.web.charts import Series, line_chart, stacked_bar_chart
from billing.web.forms import PeriodForm
from billing.web.trends import months_chart

_WORKLOAD_CSV_COLUMNS = (
    "namespace", "pod", "pod_uid", "containers", "sla_tiers", "cost", "currency", "gpu_hours_equivalent",
    "mem_used_gb_h", "mem_granted_gb_h", "sm_used_h", "sm_granted_h", "energy_kwh", "first_hour", "last_hour",
    # Appended, so scripts reading the columns before them by position keep working; empty where unknown.
    "energy_cost", "co2e_kg",
)
_WORKLOAD_QUANTITIES = ("gpu_hours_equivalent", "mem_used_gb_h", "mem_granted_gb_h", "sm_used_h", "sm_granted_h",
                        "energy_kwh")
# Like the invoice CSV (billing.services.exports.INVOICE_CSV_COLUMNS), with no invoice number yet.
_UPCOMING_CSV_COLUMNS = (
    "status", "tenant", "billing_period", "as_of", "line", "kind", "gpu_model", "sla_tier", "usage_month",
    "gpu_hours", "amount_ledger", "amount_minor", "amount", "currency", *UNIT_PRICE_COLUMNS,
)


def home(request: HttpRequest) -> HttpResponse:
    """The root URL lands each user on the page for their role."""
    if not request.user.is_authenticated:
        return redirect_to_login(request.get_full_path())
    return redirect(landing_url(get_scope(request.user)))


@login_required
@one_snapshot()
def tenant_list(request: HttpRequest) -> HttpResponse:
    scope = get_scope(request.user)
    if scope.tenants is not None and len(scope.tenants) == 1:
        return redirect("tenant-portal", slug=next(iter(scope.tenants)))
    rows = list_tenant_portals(scope=scope, now=timezone.now())
    return render(request, "billing/portal.html", {"tenants": rows})


@login_required
@one_snapshot()
def tenant_portal(request: HttpRequest, slug: str) -> HttpResponse:
    now = timezone.now()
    if request.GET.get("format") == "upcoming-csv":
        return _upcoming_csv(request, slug, now)
    default = PeriodForm.default_initial(now.date())
    form = PeriodForm(request.GET if {"start", "end"} & set(request.GET) else default)
    valid = form.is_valid()
    # An invalid period still reads the tenant (at the default period) so that a 400 is never
    # answered for a tenant the user may not see: scope first, then the period's error.
    start, end = form.bounds() if valid else _default_bounds(default)
    scope = get_scope(request.user)
    try:
        # The page's table shows the costliest workloads; the CSV has every one, to more places.
        as_csv = valid and request.GET.get("format") == "csv"
        portal = get_tenant_portal(scope=scope, slug=slug, start=start, end=end, now=now,
                                   places=QUANTITY_PLACES["gpu_hours"] if as_csv else PAGE_PLACES,
                                   workload_limit=None if as_csv else WORKLOAD_TABLE_ROWS, reasons=not as_csv,
                                   trends=not as_csv)
    except TenantNotFound as exc:
        raise Http404("no such tenant") from exc
    if as_csv:
        return _workloads_csv(portal)
    budget = portal.budget
    context = {
        # The navigation's scope (billing.web.context reads it again otherwise).
        "scope": scope,
        "portal": portal, "form": form, "period_valid": valid, "formats": EXPORT_FORMATS,
        "budget_bar_pct": min(int(budget.used_pct), 100) if budget else 0,
        "budget_action_label": BudgetAction(budget.hard_action).label if budget else "",
        "cost_chart": _cost_chart(portal) if valid and portal.workloads else None,
        "memory_chart": _memory_chart(portal) if valid and portal.workloads else None,
        "headroom_pct": HEADROOM * 100,
        "months_chart": (months_chart(portal.months, unit=portal.currency, names={portal.slug: portal.name})
                         if portal.months is not None else None),
    }
    return render(request, "billing/portal.html", context, status=200 if valid else 400)


def _default_bounds(default: dict[str, date]) -> tuple[datetime, datetime]:
    form = PeriodForm(default)
    form.is_valid()
    return form.bounds()


def _series_names(portal: TenantPortal) -> list[str]:
    return list(portal.daily.names) + ([_("Other workloads")] if portal.daily.has_other else [])


def _cost_chart(portal: TenantPortal) -> SafeString:
    daily = portal.daily
    return stacked_bar_chart(
        [date_format(d, "MONTH_DAY_FORMAT") for d in daily.days],
        [Series(name, values) for name, values in zip(_series_names(portal), daily.cost, strict=True)],
        label=_("Daily cost per workload"), unit=portal.currency,
    )


def _memory_chart(portal: TenantPortal) -> SafeString:
    daily = portal.daily
    return line_chart(
        [date_format(d, "MONTH_DAY_FORMAT") for d in daily.days],
        [Series(name, values) for name, values in zip(_series_names(portal), daily.mem_used_gb_h, strict=True)],
        label=_("Daily memory used per workload"), unit=_("GB·h"),
    )


def _workloads_csv(portal: TenantPortal) -> HttpResponse:
    """The workload table, every workload as every page shows it (cost to the currency's minor unit,
    quantities to 4 places), then a total row that is the sum of the rows as written, and the
    tenant's figure of the period (docs/exports.md)."""
    response = HttpResponse(content_type="text/csv; charset=utf-8")
    name = download_name(f"{portal.slug}-workloads", portal.start, portal.end)
    response["Content-Disposition"] = f'attachment; filename="{name}"'
    writer = csv_writer(response)
    writer.writerow(_WORKLOAD_CSV_COLUMNS)
    currency, places = portal.currency, QUANTITY_PLACES["gpu_hours"]
    for w in portal.workloads:
        writer.writerow([
            w.namespace, w.pod, w.pod_uid, " ".join(w.containers), " ".join(w.sla_tiers),
            amount_cell(w.cost, currency), currency, *(quantity_cell(getattr(w, q), places) for q in _WORKLOAD_QUANTITIES),
            w.first_hour.isoformat(), w.last_hour.isoformat(), *_energy_cells(w.energy_cost, w.co2e_kg, currency, places),
        ])
    writer.writerow(["(total)", "", "", "", "", amount_cell(portal.period_cost, currency), currency,
                     *(quantity_cell(portal.period_quantities[q], places) for q in _WORKLOAD_QUANTITIES), "", "",
                     *_energy_cells(portal.period_energy_cost, portal.period_co2e_kg, currency, places)])
    return response


def _energy_cells(cost: Decimal | None, co2e_kg: Decimal | None, currency: str, places: int) -> list[object]:
    """Energy cost (to the currency's minor unit) and kg CO2e (at the quantities' places); empty where unknown."""
    return ["" if cost is None else amount_cell(cost, currency), "" if co2e_kg is None else quantity_cell(co2e_kg, places)]


def _upcoming_csv(request: HttpRequest, slug: str, now: datetime) -> HttpResponse:
    """The upcoming invoice as CSV: one row per line, then the total; marked as a preview."""
    try:
        preview = get_upcoming_invoice(scope=get_scope(request.user), slug=slug, now=now)
    except TenantNotFound as exc:
        raise Http404("no such tenant") from exc
    except InvalidInput as exc:
        return HttpResponse(str(exc), status=400, content_type="text/plain; charset=utf-8")
    response = HttpResponse(content_type="text/csv; charset=utf-8")
    response["Content-Disposition"] = f'attachment; filename="{slug}-upcoming-{preview.month:%Y-%m}.csv"'
    writer = csv_writer(response)
    writer.writerow(_UPCOMING_CSV_COLUMNS)
    head = _upcoming_head(preview)
    for i, line in enumerate(preview.lines, start=1):
        writer.writerow([
            *head, i, line.kind, line.gpu_model, line.sla_tier, f"{line.usage_month:%Y-%m}",
            *line_number_cells(line.gpu_hours, line.amount, line.amount_minor, preview.currency), preview.currency,
            *unit_price_cells(line),
        ])
    if preview.tax_minor:
        writer.writerow([*head, "tax", f"tax {plain_decimal(preview.tax_rate_pct)}%", "", "", "", "", "",
                         preview.tax_minor, minor_cell(preview.tax_minor, preview.currency), preview.currency,
                         *NO_UNIT_PRICE_CELLS])
    writer.writerow([*head, "total", "", "", "", "", "", "", preview.total_minor,
                     minor_cell(preview.total_minor, preview.currency), preview.currency, *NO_UNIT_PRICE_CELLS])
    return response


def _upcoming_head(preview: InvoicePreview) -> list[object]:
    return ["preview", preview.tenant, f"{preview.month:%Y-%m}", preview.as_of.isoformat() if preview.as_of else ""]
