"""The finance dashboard for a period: cost over time by tenant and idle, fleet utilisation and
idle memory, top workloads, the savings-vs-static card of exactly that period (its finished paired
report, else the one being computed, else whether one may be requested) and the rebalance
recommendation.

Everything is aggregated in SQL from the ledger grouped by UTC hour or day: the day ledger (UsageDay,
GpuDay, ~24x fewer rows) when the period is whole UTC days and the buckets are days or there are no
buckets (summary, top workloads), else the hour ledger (billing.ledger.reads picks; the sums are
billing.ledger.totals and billing.ledger.series). Tenant
members get their tenants' numbers only; platform figures (idle, utilisation, savings, rebalance)
are None for them, decided here and not in templates.
"""

from __future__ import annotations

import functools
from dataclasses import asdict, dataclass, replace
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal
from typing import Any

from django.db.models import F
from django.utils import timezone
from django.utils.translation import gettext as _

from billing.errors import InvalidInput
from billing.figures import FigureTree
from billing.ledger import series, totals
from billing.ledger.reads import Granularity, no_cycle_collection
from billing.ledger.retention import hours_retained_from
from billing.models import PairedReport, RebalancePlan
from billing.models.rebalance import RebalanceStatus
from billing.money import display_amount
from billing.queries.finance import PAGE_PLACES, CostSummary, get_cost_summary_and_tree
from billing.queries.snapshot import alongside
from billing.queries.trends import Change, Comparison, MonthCost, get_comparison_and_months
from billing.scope import Scope
from billing.services.savings import (
    PairedRow,
    SavingsTables,
    check_report_period,
    find_in_flight_report,
    headline_text,
    paired_rows,
    savings_tables,
)

__all__ = [
    "HOURLY_UP_TO",
    "IDLE_KEY",
    "OTHER_KEY",
    "TOP_TENANTS",
    "TOP_WORKLOADS",
    "CostTimeline",
    "FinanceDashboard",
    "RebalanceRecommendation",
    "ReportInFlight",
    "SavingsCard",
    "SavingsHeadline",
    "TimelineSeries",
    "UtilisationPoint",
    "WorkloadCost",
    "get_finance_dashboard",
]

# Periods up to this long are drawn per hour, longer ones per day.
HOURLY_UP_TO = timedelta(days=2)
TOP_TENANTS = 6
TOP_WORKLOADS = 10
# Series keys that are not tenant slugs (slugs cannot contain parentheses); the CSV uses them too.
OTHER_KEY = "(other tenants)"
IDLE_KEY = "(idle, platform)"

_ZERO = Decimal(0)
_S_PER_H = Decimal(3600)
_MB_PER_GB = Decimal(1024)
_STEP = {"hour": timedelta(hours=1), "day": timedelta(days=1)}


@dataclass(frozen=True)
class TimelineSeries:
    key: str  # tenant slug, OTHER_KEY or IDLE_KEY
    name: str  # display name (Tenant.name, may be Chinese) or a translated label
    values: list[Decimal]  # one per bucket, charge + idle share (tenants) or platform idle, ledger precision

    @property
    def total(self) -> Decimal:
        return sum(self.values, _ZERO)


@dataclass(frozen=True)
class CostTimeline:
    granularity: Granularity
    buckets: list[datetime]  # bucket starts, UTC, every bucket of the period (empty ones too)
    series: list[TimelineSeries]  # stacking order: top tenants by cost, other tenants, platform idle


@dataclass(frozen=True)
class UtilisationPoint(series.UtilisationBucket):
    """The ledger's figures for one bucket, with the percentages the dashboard shows."""

    @property
    def sm_utilisation_pct(self) -> Decimal | None:
        return self.sm_used_s / self.sm_capacity_s * 100 if self.sm_capacity_s else None

    @property
    def idle_memory_pct(self) -> Decimal | None:
        return (1 - self.mem_used_mb_s / self.mem_capacity_mb_s) * 100 if self.mem_capacity_mb_s else None


@dataclass(frozen=True)
class WorkloadCost:
    """One pod instance (all its containers, on every GPU) over the period, as every page shows it
    (billing.figures: the portal's row of the same pod shows the same figures)."""

    tenant: str
    name: str
    namespace: str
    pod: str
    pod_uid: str
    sla_tier: str  # comma-separated when the pod changed tier during the period
    cost: Decimal  # charge + idle share, as shown
    gpu_hours_equivalent: Decimal
    mem_used_gb_h: Decimal
    sm_used_h: Decimal


@dataclass(frozen=True)
class SavingsHeadline:
    """A finished paired report of the card's period: its headline (the saving against the cheapest
    static alternative that fits on the fleet, or that none fits), every allocation's cost on the
    fleet and the paired test against the headline's baseline, figures as the report page shows them."""

    report_id: int
    period_start: datetime
    last_day: date  # the period's last day, included
    finished_at: datetime | None
    currency: str
    tables: SavingsTables
    figure: str
    sentence: str
    paired: PairedRow | None  # the paired test against the baseline; None when no alternative fits


@dataclass(frozen=True)
class ReportInFlight:
    """A paired report of the card's period still pending or running (the one a request joins)."""

    report_id: int
    status: str
    progress_pct: int


@dataclass(frozen=True)
class SavingsCard:
    """Savings against static for exactly the dashboard's period, never another report's: the newest
    finished report whose period is the page's (same start, same end); without one, the report of
    that period being computed; without that either, why none may be requested (`refusal`, "" when
    the page may offer to request one)."""

    period_start: date
    last_day: date  # the period's last day, included
    headline: SavingsHeadline | None
    in_flight: ReportInFlight | None
    refusal: str


@dataclass(frozen=True)
class RebalanceRecommendation:
    """The latest proposed plan: the whole nodes it empties, the GPUs they hand back, what that
    saves a month and how many pods it evicts; or, freeing none, the node that could be emptied
    with the fewest evictions (None when none can)."""

    plan_id: int
    created_at: datetime
    nodes_freed: int
    gpus_released: int | None  # None: a plan proposed before plans counted whole nodes only
    projected_savings: Decimal
    currency: str
    evictions: int
    max_moves: int
    smallest_release: dict[str, Any] | None


@dataclass(frozen=True)
class FinanceDashboard:
    summary: CostSummary
    timeline: CostTimeline
    top_workloads: list[WorkloadCost]
    # Platform figures: None for a tenant-scoped caller.
    utilisation: list[UtilisationPoint] | None
    savings: SavingsCard | None
    rebalance: RebalanceRecommendation | None
    # The period against the previous one and the last months' cost (None: not asked, as by the CSVs).
    comparison: Comparison | None = None
    months: list[MonthCost] | None = None

    @property
    def sees_platform(self) -> bool:
        return self.summary.total_gpu_cost is not None


def granularity_for(start: datetime, end: datetime) -> Granularity:
    """Hour buckets for a short period, except where retention pruned its hours: a period of whole
    UTC days (what the period form gives) is then charted by day, from the day ledger, kept for
    good; any other period is refused by the hourly read, naming the earliest hour kept."""
    if end - start > HOURLY_UP_TO:
        return "day"
    pruned_before = hours_retained_from()
    if pruned_before is not None and start < pruned_before and _whole_utc_days(start, end):
        return "day"
    return "hour"


def _whole_utc_days(start: datetime, end: datetime) -> bool:
    return all(at.astimezone(UTC).timetz().replace(tzinfo=None) == datetime.min.time() for at in (start, end))


def _buckets(start: datetime, end: datetime, granularity: Granularity) -> list[datetime]:
    step = _STEP[granularity]
    first = start.astimezone(UTC).replace(minute=0, second=0, microsecond=0)
    if granularity == "day":
        first = first.replace(hour=0)
    out = []
    at = first
    while at < end:
        out.append(at)
        at += step
    return out


def _until_now(start: datetime, end: datetime, granularity: Granularity, now: datetime,
               seen: list[datetime]) -> list[datetime]:
    """The buckets of [start, end) that have begun by `now`: a chart stops at now, and a CSV has no
    rows for hours to come. A bucket with data is kept even past `now` (agents may stamp a few
    seconds ahead of this clock), so every figure of the period is still in some bucket."""
    last = max(seen, default=start)
    return _buckets(start, min(end, max(now, last + timedelta(microseconds=1))), granularity)


def _timeline(scope: Scope, summary: CostSummary, granularity: Granularity, now: datetime,
              rows: list[series.TenantCostBucket]) -> CostTimeline:
    idle_rows = (series.list_platform_idle_buckets(start=summary.start, end=summary.end, granularity=granularity)
                 if scope.sees_platform else [])
    buckets = _until_now(summary.start, summary.end, granularity, now,
                         [r.bucket for r in rows] + [b.bucket for b in idle_rows])
    index = {b: i for i, b in enumerate(buckets)}
    top = summary.tenants[:TOP_TENANTS]
    top_keys = {t.tenant: k for k, t in enumerate(top)}
    values = [[_ZERO] * len(buckets) for _ in top]
    other = [_ZERO] * len(buckets)
    for r in rows:  # one row per (bucket, tenant)
        i = index[r.bucket]
        k = top_keys.get(r.tenant)
        if k is None:
            other[i] += r.cost
        else:
            values[k][i] += r.cost
    lines = [TimelineSeries(t.tenant, t.name, v) for t, v in zip(top, values, strict=True)]
    if len(summary.tenants) > TOP_TENANTS:
        lines.append(TimelineSeries(OTHER_KEY, _("Other tenants"), other))
    if scope.sees_platform:
        idle = [_ZERO] * len(buckets)
        for bucket in idle_rows:
            idle[index[bucket.bucket]] += bucket.idle_platform
        lines.append(TimelineSeries(IDLE_KEY, _("Idle (platform)"), idle))
    return CostTimeline(granularity, buckets, lines)


def _utilisation(start: datetime, end: datetime, granularity: Granularity,
                 used: list[series.UsedBucket]) -> list[UtilisationPoint]:
    return [UtilisationPoint(**asdict(b))
            for b in series.list_utilisation_buckets(start=start, end=end, granularity=granularity, used=used)]


def _top_workloads(summary: CostSummary, tree: FigureTree) -> list[WorkloadCost]:
    """The TOP_WORKLOADS costliest pod instances: the tree holds them and those they are
    apportioned among (get_cost_summary_and_tree's top_pods), ranked here as the read ranked them."""
    names = {t.tenant: t.name for t in summary.tenants}
    pods = sorted(tree.nodes("pod_uid"), key=lambda n: (-n.exact.cost, n.keys))[:TOP_WORKLOADS]
    out = []
    for node in pods:
        shown = tree.shown(node)
        tenant, namespace, _controller, pod, pod_uid = node.keys
        out.append(WorkloadCost(
            tenant=tenant, name=names.get(tenant, tenant), namespace=namespace, pod=pod, pod_uid=pod_uid,
            sla_tier=", ".join(node.sla_tiers), cost=shown.cost, gpu_hours_equivalent=shown.gpu_hours,
            mem_used_gb_h=shown.mem_used_gb_h, sm_used_h=shown.sm_used_h,
        ))
    return out


def _savings(start: datetime, end: datetime, now: datetime) -> SavingsCard:
    period = PairedReport(period_start=start, period_end=end)  # unsaved: its last_day, as a report's
    # Only a report with the static alternatives placed on the fleet: one computed before has no
    # headline a finance team could defend, and the card offers to compute the period again.
    report = (
        PairedReport.objects.filter(status=PairedReport.Status.DONE, result__fleet__has_key="alternatives",
                                    period_start=start, period_end=end)
        .order_by(F("finished_at").desc(nulls_last=True), "-created_at", "-id")
        .first()
    )
    headline = _headline(report) if report is not None else None
    in_flight, refusal = None, ""
    if headline is None:
        running = find_in_flight_report(start=start, end=end, now=now)
        if running is not None:
            in_flight = ReportInFlight(report_id=running.pk, status=running.status,
                                       progress_pct=running.progress_pct)
        else:
            try:
                check_report_period(start=start, end=end, now=now)
            except InvalidInput as exc:
                refusal = str(exc)
    return SavingsCard(period_start=start.astimezone(UTC).date(), last_day=period.last_day, headline=headline,
                       in_flight=in_flight, refusal=refusal)


def _headline(report: PairedReport) -> SavingsHeadline | None:
    result: dict[str, Any] = report.result or {}
    tables = savings_tables(result, {})
    if tables is None:
        return None
    figure, sentence = headline_text(tables)
    # The paired test against the headline's baseline only: an alternative that does not fit on the
    # fleet is compared with nothing (its row on the card says why).
    paired = next((p for p in paired_rows(result, tables.currency) if p.is_baseline and p.feasible), None)
    return SavingsHeadline(report_id=report.pk, period_start=report.period_start, last_day=report.last_day,
                           finished_at=report.finished_at, currency=tables.currency, tables=tables, figure=figure,
                           sentence=sentence, paired=paired)


def _rebalance() -> RebalanceRecommendation | None:
    plan = RebalancePlan.objects.filter(status=RebalanceStatus.PROPOSED).order_by("-created_at", "-id").first()
    if plan is None:
        return None
    return RebalanceRecommendation(plan_id=plan.pk, created_at=plan.created_at, nodes_freed=plan.nodes_freed,
                                   gpus_released=plan.summary.get("gpus_released"),
                                   projected_savings=plan.projected_savings, currency=plan.currency,
                                   evictions=len(plan.moves), max_moves=plan.max_moves,
                                   smallest_release=plan.summary.get("smallest_release"))


def _idle_change(summary: CostSummary, comparison: Comparison) -> Change:
    """The platform's idle of the period against the previous period's, each rounded once as the
    dashboard's tile rounds it (billing.web.tables.shown_costs)."""
    before = totals.get_gpu_totals(start=comparison.previous_start, end=comparison.previous_end)
    currency = summary.currency
    return Change(display_amount(summary.idle_platform or _ZERO, currency), display_amount(before.idle_platform, currency))


# Its figure rows and trees are tens of thousands of objects: no cycle collections while it reads them.
@no_cycle_collection()
def get_finance_dashboard(*, scope: Scope, start: datetime, end: datetime, now: datetime | None = None,
                          places: int = PAGE_PLACES, trends: bool = True) -> FinanceDashboard:
    """`now` (default: the clock) decides where the charts over time stop, which reports are still
    in flight and whether the period may be reported on yet; `places`: of the tenants' and workloads' quantities (the CSVs
    ask for more than the page); `trends`: the comparison with the previous period and the months'
    chart (one more read; the CSVs have neither)."""
    granularity = granularity_for(start, end)
    # The chart's tenants and the fleet's use per bucket in one read (a platform caller's is every
    # tenant's), which needs nothing of the figures: read beside them (billing.queries.snapshot).
    buckets = alongside(functools.partial(series.list_tenant_cost_buckets, start=start, end=end,
                                          granularity=granularity, tenants=scope.tenants))
    summary, tree = get_cost_summary_and_tree(scope=scope, start=start, end=end, places=places, top_pods=TOP_WORKLOADS)
    platform = scope.sees_platform
    now = now or timezone.now()
    comparison, months = None, None
    if trends:
        # The tenants' figures of the period as the table shows them: the comparison starts from them.
        comparison, months = get_comparison_and_months(
            scope=scope, start=start, end=end, current={t.tenant: t.total for t in summary.tenants},
            currency=tree.currency)
        if platform and summary.idle_platform is not None:
            comparison = replace(comparison, idle_platform=_idle_change(summary, comparison))
    costs, used = buckets()
    return FinanceDashboard(
        summary=summary,
        timeline=_timeline(scope, summary, granularity, now, costs),
        top_workloads=_top_workloads(summary, tree),
        utilisation=_utilisation(start, end, granularity, used) if platform else None,
        savings=_savings(start, end, now) if platform else None,
        rebalance=_rebalance() if platform else None,
        comparison=comparison,
        months=months,
    )

