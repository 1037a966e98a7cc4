"""The tenant portal: one tenant's spend, budget, workloads and invoices, scoped like every read.

A tenant outside the caller's scope raises `TenantNotFound`, exactly like a tenant that does not
exist, so the portal never reveals which tenants there are. Month-to-date spend and the forecast
are the budgets' one definition (billing.services.budgets.spend.get_month_spends): charge plus idle spread
onto the tenant; the budget card reads the same, so both show one number.
A workload is one pod instance: (namespace, pod, pod_uid). The workloads of the period are the
period's figure tree (billing.figures): each shows what it shows on every page, and they
add up to the tenant's figure, which is the dashboard's. The daily chart reads the closed UTC days
of the period from the day ledger and the rest from the hour ledger (billing.ledger.spend).

The upcoming invoice of the month in progress is `billing.services.invoicing.close.preview_invoice`:
the close's own lines and rounding over the ledger as it is now; nothing is written.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal
from typing import TypeVar

from django.db.models import Q, QuerySet

from billing.errors import DomainError, InvalidInput
from billing.figures import FigureNode, FigureTree
from billing.ledger.reads import no_cycle_collection
from billing.ledger.spend import TenantSpend, WorkloadDay, list_workload_days
from billing.models import BudgetAction, BudgetScope, RateCard, Tenant
from billing.money import apportion
from billing.queries.budgets import BudgetView, list_budgets
from billing.queries.cost_reasons import CostReasons, get_cost_reasons
from billing.queries.figures import get_figure_tree, get_top_figure_tree
from billing.queries.finance import PAGE_PLACES
from billing.queries.snapshot import alongside
from billing.queries.trends import Comparison, MonthCost, get_comparison_and_months
from billing.scope import Scope
from billing.services.budgets import get_month_spend, get_month_to_date_parts, shown_spend
from billing.services.exports import InvoiceSummary, list_invoices
from billing.services.fleet import percent_of
from billing.services.invoicing import InvoicePreview, preview_invoice, preview_invoices

__all__ = [
    "CHART_SERIES",
    "WORKLOAD_TABLE_ROWS",
    "DailyWorkloadSeries",
    "TenantNotFound",
    "TenantPortal",
    "TenantPortalRow",
    "UpcomingInvoiceRow",
    "UpcomingInvoices",
    "WorkloadUsage",
    "get_tenant_portal",
    "get_upcoming_invoice",
    "list_tenant_portals",
    "list_upcoming_invoices",
]

# Series in the charts: every workload when they fit, else the costliest CHART_SERIES - 1 and one
# "other" series summing the rest, so no two series share a colour (charts.py has 8; the 8th, grey,
# is the other series).
CHART_SERIES = 8
# Rows of the workload table on the page: the costliest, the CSV has every workload. A big tenant
# runs thousands of pods a month (7,686 for the biggest at 800 GPUs, bench/web_pages.py), and
# rendering them all took ~4 s.
WORKLOAD_TABLE_ROWS = 100

_ZERO = Decimal(0)
_S = TypeVar("_S")
_MB_PER_GB = Decimal(1024)
_S_PER_H = Decimal(3600)


class TenantNotFound(DomainError):
    """No such tenant in the caller's scope (a 404 that does not reveal existence)."""


@dataclass(frozen=True)
class WorkloadUsage:
    namespace: str
    pod: str
    pod_uid: str
    containers: tuple[str, ...]
    sla_tiers: tuple[str, ...]
    cost: Decimal  # charge + idle share, as every page shows it (billing.figures)
    gpu_hours_equivalent: Decimal  # this and the quantities below: as shown, at the portal's places
    mem_used_gb_h: Decimal
    mem_granted_gb_h: Decimal
    sm_used_h: Decimal  # SM-hours (one SM busy for one hour)
    sm_granted_h: Decimal
    first_hour: datetime  # start of the first ledger hour with usage (hour granularity)
    last_hour: datetime  # start of the last ledger hour with usage
    # "namespace/pod", with the start of the pod UID where two pod instances share a name.
    label: str = ""
    energy_kwh: Decimal = Decimal(0)  # GPU energy attributed to it, as shown (docs/billing.md, Energy)
    # What that energy cost and emitted at its nodes' locations, as shown; None where some of it had no
    # price (no CO2e factor). Information beside `cost`, never part of it.
    energy_cost: Decimal | None = None
    co2e_kg: Decimal | None = None
    # What its pod asked for per GPU × its metered seconds, as shown; None where a container's
    # request was never reported (the portal says so rather than guess).
    mem_requested_gb_h: Decimal | None = None
    sm_requested_h: Decimal | None = None
    exact_cost: Decimal = Decimal(0)  # `cost` at ledger precision, for percentages of it
    # Why it costs what it does (billing.queries.cost_reasons): the listed workloads of a page only.
    reasons: CostReasons | None = None

    @property
    def overgranted_pct(self) -> Decimal | None:
        """The share of its cost due to over-granting, in percent (None without reasons or cost)."""
        return self.reasons.overgranted_pct(self.exact_cost) if self.reasons else None

    @property
    def mem_used_of_granted_pct(self) -> Decimal | None:
        return percent_of(self.mem_used_gb_h, self.mem_granted_gb_h)

    @property
    def sm_used_of_granted_pct(self) -> Decimal | None:
        return percent_of(self.sm_used_h, self.sm_granted_h)

    @property
    def key(self) -> tuple[str, str, str]:
        return (self.namespace, self.pod, self.pod_uid)


@dataclass(frozen=True)
class DailyWorkloadSeries:
    """Per-day figures of the top workloads (chart order) and of the rest summed; `None` for a day
    that has not begun yet (no data is not zero)."""

    days: tuple[date, ...]
    names: tuple[str, ...]
    cost: tuple[tuple[Decimal | None, ...], ...]
    mem_used_gb_h: tuple[tuple[Decimal | None, ...], ...]
    has_other: bool


@dataclass(frozen=True)
class TenantPortal:
    slug: str
    name: str
    currency: str
    now: datetime
    month_to_date: Decimal  # ledger precision
    month_to_date_shown: Decimal  # as every page shows it (MonthSpend.month_to_date_shown)
    forecast: Decimal
    forecast_rate_hours: int  # complete hours the forecast's rate is taken over (0: forecast = month to date)
    budget: BudgetView | None  # the tenant's own
    scoped_budgets: tuple[BudgetView, ...]  # its namespaces' and labels'
    start: datetime
    end: datetime
    # The costliest workloads of [start, end): all of them, or the first `workload_limit` asked for.
    workloads: tuple[WorkloadUsage, ...]
    workload_count: int  # every workload of the period
    period_cost: Decimal  # the tenant's figure of the period: Σ of every workload's cost as shown
    # Σ of every workload's quantities as shown (gpu_hours_equivalent, mem_used_gb_h, ...).
    period_quantities: dict[str, Decimal]
    daily: DailyWorkloadSeries
    invoices: tuple[InvoiceSummary, ...]
    # The month in progress as its invoice would be if closed now; None with `upcoming_error` set
    # when it cannot be computed (e.g. usage priced in two currencies, which the close refuses too).
    upcoming: InvoicePreview | None
    upcoming_error: str = ""
    # The tenant's energy cost and kg CO2e of the period, as shown (None: some energy had no price, no factor).
    period_energy_cost: Decimal | None = None
    period_co2e_kg: Decimal | None = None
    # The period's cost against the previous period's, and the last months' (None: not asked, as by the CSV).
    comparison: Comparison | None = None
    months: tuple[MonthCost, ...] | None = None

    @property
    def overdue_invoices(self) -> tuple[InvoiceSummary, ...]:
        """The invoices overdue as of the page's `now` (computed, never stored)."""
        return tuple(i for i in self.invoices if i.payment.is_overdue)

    @property
    def scoped_budget_throttles(self) -> bool:
        """Some namespace budget throttles when enforced: the page says what throttling does."""
        return any(b.hard_action == BudgetAction.THROTTLE for b in self.scoped_budgets)

    @property
    def workloads_cut(self) -> bool:
        """The table shows the costliest workloads only (the CSV has them all)."""
        return self.workload_count > len(self.workloads)

    @property
    def month_start(self) -> datetime:
        return self.now.replace(day=1, hour=0, minute=0, second=0, microsecond=0)

    @property
    def shows_month_to_date(self) -> bool:
        """The workloads' period is the month in progress up to now (or past it): its total is the
        month to date, the same figure as the month-to-date tile and the upcoming invoice's subtotal."""
        return self.start == self.month_start and self.end >= self.now


@dataclass(frozen=True)
class UpcomingInvoiceRow:
    slug: str
    name: str
    # False for a tenant known only from the ledger (no Tenant row yet): it has no portal page.
    has_portal: bool
    # None: no charges so far this month.
    preview: InvoicePreview | None


@dataclass(frozen=True)
class UpcomingInvoices:
    month: date
    rows: tuple[UpcomingInvoiceRow, ...]
    error: str = ""


@dataclass(frozen=True)
class TenantPortalRow:
    slug: str
    name: str
    month_to_date: Decimal  # as every page shows it (MonthSpend.month_to_date_shown)
    currency: str
    budget: BudgetView | None


def _visible_tenants(scope: Scope) -> QuerySet[Tenant]:
    tenants = Tenant.objects.order_by("slug")
    if scope.tenants is not None:
        tenants = tenants.filter(slug__in=scope.tenants)
    return tenants


def _currency(now: datetime) -> str:
    """The currency of the rate cards in effect now (one fleet bills in one currency; invoices
    enforce that), else of the newest card, else "" (nothing is priced yet)."""
    cards = RateCard.objects.order_by("-effective_from", "gpu_model")
    current = cards.filter(Q(effective_to__isnull=True) | Q(effective_to__gt=now), effective_from__lte=now)
    return (current.values_list("currency", flat=True).first()
            or cards.values_list("currency", flat=True).first() or "")


def list_tenant_portals(*, scope: Scope, now: datetime) -> list[TenantPortalRow]:
    """Every tenant the caller may see, with month-to-date spend and budget state."""
    budgets = {b.tenant: b for b in list_budgets(scope=scope, now=now) if b.scope == BudgetScope.TENANT}
    currency = _currency(now)
    tenants = list(_visible_tenants(scope).values_list("slug", "name"))
    # One grouped query, the same figures as get_month_to_date_spend per tenant.
    spends = get_month_to_date_parts(tenants=[slug for slug, _name in tenants], now=now)
    return [
        TenantPortalRow(slug=slug, name=name, month_to_date=shown_spend(spends[slug], currency),
                        currency=currency, budget=budgets.get(slug))
        for slug, name in tenants
    ]


# Its figure rows and tree are tens of thousands of objects: no cycle collections while it reads them.
@no_cycle_collection()
def get_tenant_portal(*, scope: Scope, slug: str, start: datetime, end: datetime, now: datetime,
                      places: int = PAGE_PLACES, workload_limit: int | None = None,
                      reasons: bool = True, trends: bool = True) -> TenantPortal:
    """One tenant's portal: month-to-date spend and forecast at `now`, budget, workloads used in
    [start, end) (the costliest `workload_limit`, or all; quantities shown at `places`; with
    `reasons`, why each costs what it does), with `trends` the period against the previous one and
    the last months' cost (billing.queries.trends), and invoices. Raises TenantNotFound outside the
    caller's scope."""
    tenant = _visible_tenants(scope).filter(slug=slug).values_list("slug", "name").first()
    if tenant is None:
        raise TenantNotFound(f"no tenant {slug!r}")
    # Everything below reads this one tenant only, whatever the caller may see besides.
    own = dataclasses.replace(scope, tenants=frozenset({slug}))
    # The month in progress as its invoice would be now needs nothing else the page reads.
    upcoming_read = alongside(functools.partial(_upcoming, slug, now))
    # A page lists the costliest few (and charts at most CHART_SERIES): only those are read with what
    # their figures are apportioned among; a CSV (no limit) reads every one.
    read = None if workload_limit is None else max(workload_limit, CHART_SERIES)
    if read is None:
        tree = get_figure_tree(scope=own, start=start, end=end, places=places, depth="pod_uid")
        count = len(tree.nodes("pod_uid"))
    else:
        tree, counts = get_top_figure_tree(scope=own, start=start, end=end, places=places, top_pods=read,
                                           top_order=_WORKLOAD_ORDER)
        count = counts.get(slug, 0)
    # Which workloads the page lists and charts (the costliest) is known from the tree's exact
    # figures: why they cost what they do and their days are read beside the figures they show.
    ranked = _ranked(tree)
    listed_keys = [_key(n) for n in ranked[:workload_limit]]
    reasons_read = alongside(functools.partial(get_cost_reasons, tenant=slug, start=start, end=end, now=now,
                                               workloads=listed_keys)) if reasons else None
    days_read = alongside(functools.partial(list_workload_days, tenant=slug, start=start, end=end, now=now,
                                            workloads=[_key(n) for n in _chart_series(ranked, count)]))
    # Showing the month to date (TenantPortal.shows_month_to_date), the tree's invoice lines are the
    # month to date's (one figure, docs/billing.md): read once.
    month_start = now.replace(day=1, hour=0, minute=0, second=0, microsecond=0)
    spend = get_month_spend(tenant=slug, now=now,
                            month_to_date=_month_to_date(tree, slug) if start == month_start and end >= now else None)
    currency = _currency(now)
    budgets = list_budgets(scope=own, now=now, spends={slug: spend})
    budget = next((b for b in budgets if b.scope == BudgetScope.TENANT), None)
    workloads = _workloads(tree, ranked, read)
    listed = workloads[:workload_limit]
    if reasons_read is not None:
        # The listed workloads only: the panel explains what the table shows.
        listed = _with_reasons(listed, reasons_read())
    root = tree.roots.get(slug)
    shown = tree.shown(root) if root is not None else None
    comparison, months = None, None
    if trends:
        comparison, month_list = get_comparison_and_months(
            scope=own, start=start, end=end, current={slug: shown.cost} if shown else {}, currency=tree.currency)
        months = tuple(month_list)
    upcoming, upcoming_error = upcoming_read()
    return TenantPortal(
        slug=slug, name=tenant[1], currency=currency, now=now, month_to_date=spend.month_to_date,
        month_to_date_shown=spend.month_to_date_shown(currency),
        forecast=spend.forecast, forecast_rate_hours=spend.rate_hours, budget=budget,
        scoped_budgets=tuple(b for b in budgets if b.scope != BudgetScope.TENANT), start=start, end=end,
        workloads=listed, workload_count=count,
        period_cost=shown.cost if shown else Decimal(0),
        period_quantities={name: getattr(shown, attr) if shown else Decimal(0) for name, attr in _QUANTITIES},
        daily=_daily(workloads, count, shown.cost if shown else Decimal(0), days_read(), start=start, end=end, now=now,
                     money_places=tree.money_places),
        invoices=tuple(i for i in list_invoices(scope=own, today=now.date()) if i.tenant_slug == slug),
        upcoming=upcoming, upcoming_error=upcoming_error, comparison=comparison, months=months,
        period_energy_cost=shown.energy_cost if shown else None, period_co2e_kg=shown.co2e_kg if shown else None,
    )


def _upcoming(slug: str, now: datetime) -> tuple[InvoicePreview | None, str]:
    """The tenant's upcoming invoice, or None and why it cannot be computed."""
    try:
        return preview_invoice(tenant=slug, month=_current_month(now), now=now), ""
    except InvalidInput as exc:
        return None, str(exc)


def _current_month(now: datetime) -> date:
    return now.astimezone(UTC).date().replace(day=1)


def _month_to_date(tree: FigureTree, slug: str) -> TenantSpend:
    """The tenant's month to date from the figure tree of its month to date: the exact sums of its
    invoice lines (get_month_to_date_parts sums the same usage rows by the same lines)."""
    lines = tree.line_sums.get(slug, ())
    return TenantSpend(slug, sum((c for c, _i in lines), _ZERO), sum((i for _c, i in lines), _ZERO), lines)


def get_upcoming_invoice(*, scope: Scope, slug: str, now: datetime) -> InvoicePreview:
    """The upcoming invoice of one tenant for the month in progress at `now`. Raises TenantNotFound
    outside the caller's scope (before anything else is read), InvalidInput when it cannot be
    computed."""
    if not _visible_tenants(scope).filter(slug=slug).exists():
        raise TenantNotFound(f"no tenant {slug!r}")
    return preview_invoice(tenant=slug, month=_current_month(now), now=now)


def list_upcoming_invoices(*, scope: Scope, now: datetime) -> UpcomingInvoices:
    """The upcoming invoice total of every tenant the caller may see, for the month in progress:
    each tenant with a Tenant row in scope, and, for a platform scope, tenants that so far exist only
    in the ledger (they are invoiced all the same)."""
    month = _current_month(now)
    names = dict(_visible_tenants(scope).values_list("slug", "name"))
    try:
        previews = preview_invoices(month=month, now=now, tenants=scope.tenants)
    except InvalidInput as exc:
        return UpcomingInvoices(month, (), error=str(exc))
    return UpcomingInvoices(month, tuple(
        UpcomingInvoiceRow(slug=slug, name=names.get(slug, slug), has_portal=slug in names,
                           preview=previews[slug] if previews.get(slug) and previews[slug].lines else None)
        for slug in sorted(set(names) | set(previews))
    ))


# A workload's quantity -> the figure it shows.
_QUANTITIES = (("gpu_hours_equivalent", "gpu_hours"), ("mem_used_gb_h", "mem_used_gb_h"),
               ("mem_granted_gb_h", "mem_granted_gb_h"), ("sm_used_h", "sm_used_h"), ("sm_granted_h", "sm_granted_h"),
               ("energy_kwh", "energy_kwh"))


# Workloads of equal cost order by these (a pod instance's controller last: two nodes may disagree on it).
_WORKLOAD_ORDER = ("tenant", "namespace", "pod", "pod_uid", "controller")


def _ranked(tree: FigureTree) -> list[FigureNode]:
    """The tree's pod instances, costliest first (by exact cost, then _WORKLOAD_ORDER)."""
    return sorted(tree.nodes("pod_uid"), key=lambda n: (-n.exact.cost, *(n.key(level) for level in _WORKLOAD_ORDER)))


def _key(node: FigureNode) -> tuple[str, str, str]:
    """A pod instance's key, as WorkloadUsage.key."""
    return (node.key("namespace"), node.key("pod"), node.key("pod_uid"))


def _chart_series(ranked: Sequence[_S], count: int) -> Sequence[_S]:
    """The workloads the charts draw a series of: all of them when they fit, else the costliest
    CHART_SERIES - 1 (the rest are one "other" series)."""
    return ranked if count <= CHART_SERIES else ranked[:CHART_SERIES - 1]


def _workloads(tree: FigureTree, ranked: list[FigureNode], limit: int | None) -> tuple[WorkloadUsage, ...]:
    """The `limit` first of `ranked` (the tree's pod instances, _ranked; None: all), labelled apart
    from the tree's other instances of the same pod name."""
    same_name: dict[tuple[str, str], int] = {}
    for n in ranked:
        same_name[(n.key("namespace"), n.key("pod"))] = same_name.get((n.key("namespace"), n.key("pod")), 0) + 1
    return tuple(_workload(tree, n, same_name[(n.key("namespace"), n.key("pod"))]) for n in ranked[:limit])


def _workload(tree: FigureTree, node: FigureNode, same_name_instances: int) -> WorkloadUsage:
    shown = tree.shown(node)
    namespace, pod, pod_uid = node.key("namespace"), node.key("pod"), node.key("pod_uid")
    if node.first_hour is None or node.last_hour is None:
        raise ValueError("a pod instance of the ledger has a first and a last hour")
    return WorkloadUsage(
        namespace=namespace, pod=pod, pod_uid=pod_uid, containers=node.containers, sla_tiers=node.sla_tiers,
        cost=shown.cost, gpu_hours_equivalent=shown.gpu_hours, mem_used_gb_h=shown.mem_used_gb_h,
        mem_granted_gb_h=shown.mem_granted_gb_h, sm_used_h=shown.sm_used_h, sm_granted_h=shown.sm_granted_h,
        first_hour=node.first_hour, last_hour=node.last_hour,
        label=f"{namespace}/{pod}" + (f" ({pod_uid[:8]})" if same_name_instances > 1 else ""),
        energy_kwh=shown.energy_kwh, energy_cost=shown.energy_cost, co2e_kg=shown.co2e_kg,
        mem_requested_gb_h=shown.mem_requested_gb_h, sm_requested_h=shown.sm_requested_h,
        exact_cost=node.exact.cost,
    )


def _with_reasons(workloads: tuple[WorkloadUsage, ...],
                  reasons: dict[tuple[str, str, str], CostReasons]) -> tuple[WorkloadUsage, ...]:
    return tuple(dataclasses.replace(w, reasons=reasons.get(w.key)) for w in workloads)


def _daily(workloads: tuple[WorkloadUsage, ...], count: int, total: Decimal, rows: Sequence[WorkloadDay], *,
           start: datetime, end: datetime, now: datetime, money_places: int) -> DailyWorkloadSeries:
    """`workloads`: the costliest first (at least CHART_SERIES of them when there are); `count`: all of
    them; `total`: the tenant's figure, which its workloads' figures add up to (billing.figures);
    `rows`: list_workload_days of the charted ones (_chart_series).
    A series' days add up to the figure the workload table shows (the other series: to the sum of the
    figures of the workloads it gathers), as a figure opens into its parts (`_apportion_days`)."""
    # The chart stops at today: days that have not begun are not drawn (nor their zeros).
    days = tuple(d for d in (start.date() + timedelta(days=i) for i in range((end - start).days))
                 if datetime(d.year, d.month, d.day, tzinfo=UTC) <= now)
    top = _chart_series(workloads, count)
    index = {w.key: i for i, w in enumerate(top)}
    has_other = count > len(top)
    n_series = len(top) + has_other
    day_index = {d: i for i, d in enumerate(days)}
    # One more cost cell per series past the drawn days: usage the ledger holds beyond them still
    # takes its part of the figure, so the drawn days never claim it.
    cost = [[_ZERO] * (len(days) + 1) for _ in range(n_series)]
    mem = [[_ZERO] * len(days) for _ in range(n_series)]
    for r in rows:
        series = len(top) if r.workload is None else index[r.workload]
        d = day_index.get(r.day)
        if d is None:
            cost[series][-1] += r.cost
            continue
        cost[series][d] += r.cost
        mem[series][d] += r.mem_used_mb_s / _MB_PER_GB / _S_PER_H
    # The other series: the figures of the workloads it gathers, which with the top ones make the total.
    shown = [w.cost for w in top] + ([total - sum((w.cost for w in top), _ZERO)] if has_other else [])
    return DailyWorkloadSeries(
        days=days, names=tuple(w.label for w in top),
        cost=tuple(_apportion_days(figure, days_cost, money_places) for figure, days_cost in zip(shown, cost, strict=True)),
        mem_used_gb_h=tuple(tuple(v) for v in mem), has_other=has_other,
    )


def _apportion_days(figure: Decimal, days: list[Decimal], places: int) -> tuple[Decimal, ...]:
    """A workload's shown figure split over its days in proportion to their exact cost, by the largest
    remainder (billing.money.apportion) at the figure's places (the tree's currency), so the days shown
    add up to the figure shown: rounding each day on its own could differ from the table by a cent
    (a one-day workload showed 39.25 against 39.26). `days` ends with the cost beyond the drawn days,
    which takes its part and is not returned."""
    *drawn, undrawn = days
    if not drawn:
        return ()
    return tuple(apportion(figure, [*drawn, undrawn], places)[:-1])
