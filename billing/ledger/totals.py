"""Totals over a period of the hour or day ledger (billing.ledger.reads picks which): per tenant,
per workload, per GPU, per month. Raw ledger sums in ledger units (currency amounts at ledger
precision, seconds, MB·s, SM·s); turning them into GPU-hours or GB-hours is the caller's.

Every function is one SQL statement, so a page's query count is the number of calls it makes
(tests/billing/test_web_pages_queries.py counts them).
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass
from datetime import UTC, date, datetime
from decimal import Decimal
from typing import Any

from django.db.models import Sum
from django.db.models.functions import TruncMonth

from billing.ledger import reads
from billing.ledger.models import GpuDay, GpuHour, UsageDay
from billing.ledger.reads import fetch_rows, period_read_cursor

__all__ = [
    "DayLedgerTotals",
    "GpuTotals",
    "LineShareSeconds",
    "MonthSeconds",
    "PeriodLineCost",
    "TenantTotals",
    "WorkloadSummary",
    "WorkloadTotals",
    "get_gpu_totals",
    "get_last_ledger_hour",
    "get_priced_currency",
    "list_day_ledger_totals",
    "list_gpu_totals_by_node",
    "list_monthly_card_seconds",
    "list_monthly_line_share_seconds",
    "list_monthly_share_seconds",
    "list_period_line_costs",
    "summarise_workloads",
]

_ZERO = Decimal(0)


def _tenant_list(tenants: Collection[str] | None) -> list[str] | None:
    """`None` (every tenant) or the slugs, sorted so the statement text and plan are stable."""
    return None if tenants is None else sorted(tenants)


@dataclass(frozen=True)
class TenantTotals:
    """One tenant's usage over a period (every GPU, every workload)."""

    tenant: str
    charge: Decimal
    idle_share: Decimal
    share_gpu_s: Decimal
    mem_used_mb_s: Decimal
    sm_used_s: Decimal
    workloads: int  # pod instances (pod_uid) with usage


@dataclass(frozen=True)
class GpuTotals:
    """The fleet's cards over a period: whole-card cost and its idle part."""

    card_cost: Decimal
    idle_cost: Decimal
    idle_allocated: Decimal  # idle spread onto tenants (proportional idle policy)
    metered_seconds: Decimal
    unpriced_seconds: Decimal  # metered seconds no rate card covered

    @property
    def idle_platform(self) -> Decimal:
        return self.idle_cost - self.idle_allocated


def get_priced_currency(*, start: datetime, end: datetime) -> str:
    """The currency of the period's priced GPU rows, "" when nothing is priced (one fleet bills in
    one currency; the close enforces it)."""
    ledger = reads.ledger_for(start, end)
    # Any one row, not .first(): that orders by id, sorting every priced GPU row of the period (160k
    # for a week of hours at 1,000 GPUs: 0.2 s) to take one currency they all share.
    rows = ledger.gpu_rows(start, end).filter(ledger.priced_rows()).values_list("currency", flat=True)[:1]
    return str(next(iter(rows), ""))


def get_gpu_totals(*, start: datetime, end: datetime) -> GpuTotals:
    ledger = reads.ledger_for(start, end)
    agg = ledger.gpu_rows(start, end).aggregate(
        card=Sum("card_cost"), idle=Sum("idle_cost"), idle_allocated=Sum("idle_allocated"),
        seconds=Sum("metered_seconds"), unpriced=ledger.unpriced_seconds(),
    )
    return GpuTotals(card_cost=agg["card"] or _ZERO, idle_cost=agg["idle"] or _ZERO,
                     idle_allocated=agg["idle_allocated"] or _ZERO, metered_seconds=agg["seconds"] or _ZERO,
                     unpriced_seconds=agg["unpriced"] or _ZERO)


def list_gpu_totals_by_node(*, start: datetime, end: datetime) -> dict[str, GpuTotals]:
    """`get_gpu_totals` per node (by node name), for the nodes with GPU rows in [start, end)."""
    ledger = reads.ledger_for(start, end)
    rows = ledger.gpu_rows(start, end).values("node__name").annotate(
        card=Sum("card_cost"), idle=Sum("idle_cost"), idle_allocated=Sum("idle_allocated"),
        seconds=Sum("metered_seconds"), unpriced=ledger.unpriced_seconds(),
    ).order_by("node__name")
    return {row["node__name"]: GpuTotals(card_cost=row["card"] or _ZERO, idle_cost=row["idle"] or _ZERO,
                                         idle_allocated=row["idle_allocated"] or _ZERO,
                                         metered_seconds=row["seconds"] or _ZERO, unpriced_seconds=row["unpriced"] or _ZERO)
            for row in rows}


def get_last_ledger_hour() -> datetime | None:
    """The start of the newest GPU-hour in the ledger (hour precision, whichever ledger a page
    summed): how current the figures are."""
    last: datetime | None = GpuHour.objects.order_by("-hour").values_list("hour", flat=True).first()
    return last


@dataclass(frozen=True)
class WorkloadTotals:
    """One pod instance (all its containers, on every GPU) over a period."""

    tenant: str
    namespace: str
    pod: str
    pod_uid: str
    sla_tiers: str  # comma-separated when the pod changed tier during the period
    cost: Decimal  # charge + idle share
    share_gpu_s: Decimal
    mem_used_mb_s: Decimal
    sm_used_s: Decimal


@dataclass(frozen=True)
class WorkloadSummary:
    """A period's usage per tenant, and its costliest pod instances."""

    tenants: list[TenantTotals]  # unordered
    top: list[WorkloadTotals]  # costliest first


# One statement for both, because both are sums over the same per-pod groups and the aggregation of
# a month's usage rows is most of a dashboard's time (bench/web_pages.py: the two apart took ~1 s at
# 800 GPUs x 31 days). Per (pod, tier) first, then per pod over those rows, whose tiers are already
# distinct: no string_agg(DISTINCT ...) over every usage row; the tiers are joined for the top rows only.
_WORKLOAD_SUMMARY = """
WITH per_tier AS MATERIALIZED (
    SELECT tenant, namespace, pod, pod_uid, sla_tier, sum(charge) AS charge, sum(idle_share) AS idle_share,
           sum(share_gpu_s) AS share, sum(mem_used_mb_s) AS mem, sum(sm_used_s) AS sm
    FROM {usage_rows} u
    GROUP BY pod_uid, sla_tier, tenant, namespace, pod
), per_pod AS MATERIALIZED (
    SELECT tenant, namespace, pod, pod_uid, sum(charge) AS charge, sum(idle_share) AS idle_share,
           sum(share) AS share, sum(mem) AS mem, sum(sm) AS sm
    FROM per_tier GROUP BY pod_uid, tenant, namespace, pod
), top AS (
    SELECT * FROM per_pod ORDER BY charge + idle_share DESC, tenant, namespace, pod, pod_uid LIMIT %(limit)s
)
SELECT 'tenant' AS kind, tenant, '' AS namespace, '' AS pod, '' AS pod_uid, '' AS sla_tiers,
       sum(charge) + sum(idle_share) AS cost, sum(charge) AS charge, sum(idle_share) AS idle_share, sum(share) AS share_gpu_s, sum(mem) AS mem_used_mb_s,
       sum(sm) AS sm_used_s, count(DISTINCT pod_uid) AS workloads
FROM per_pod GROUP BY tenant
UNION ALL
SELECT 'workload', t.tenant, t.namespace, t.pod, t.pod_uid,
       (SELECT string_agg(p.sla_tier, ', ' ORDER BY p.sla_tier) FROM per_tier p WHERE p.pod_uid = t.pod_uid
        AND p.tenant = t.tenant AND p.namespace = t.namespace AND p.pod = t.pod),
       t.charge + t.idle_share, t.charge, t.idle_share, t.share, t.mem, t.sm, 1
FROM top t
ORDER BY kind, cost DESC, tenant, namespace, pod, pod_uid
"""


@dataclass(frozen=True)
class _SummaryRow:
    kind: str  # "tenant" | "workload"
    tenant: str
    namespace: str
    pod: str
    pod_uid: str
    sla_tiers: str
    cost: Decimal
    charge: Decimal
    idle_share: Decimal
    share_gpu_s: Decimal
    mem_used_mb_s: Decimal
    sm_used_s: Decimal
    workloads: int


def summarise_workloads(*, start: datetime, end: datetime, tenants: Collection[str] | None,
                        top: int) -> WorkloadSummary:
    """Per tenant over [start, end) (`tenants` only unless None), and the `top` costliest pod
    instances, in one statement under the period-read planner settings."""
    ledger = reads.ledger_for(start, end)
    params = {"tenants": _tenant_list(tenants), "limit": top}
    with reads.period_read_cursor() as cur:
        cur.execute(_WORKLOAD_SUMMARY.format(usage_rows=reads.usage_rows(ledger, start, end, params, months=reads.month_range(ledger, start, end))),
                    params)
        rows = fetch_rows(cur, _SummaryRow)
    return WorkloadSummary(
        tenants=[TenantTotals(tenant=r.tenant, charge=r.charge, idle_share=r.idle_share, share_gpu_s=r.share_gpu_s,
                              mem_used_mb_s=r.mem_used_mb_s, sm_used_s=r.sm_used_s, workloads=r.workloads)
                 for r in rows if r.kind == "tenant"],
        top=[WorkloadTotals(tenant=r.tenant, namespace=r.namespace, pod=r.pod, pod_uid=r.pod_uid,
                            sla_tiers=r.sla_tiers, cost=r.cost, share_gpu_s=r.share_gpu_s,
                            mem_used_mb_s=r.mem_used_mb_s, sm_used_s=r.sm_used_s)
             for r in rows if r.kind == "workload"],
    )


@dataclass(frozen=True)
class MonthSeconds:
    """GPU-seconds of one UTC month."""

    month: date  # the 1st
    seconds: Decimal
    unpriced_seconds: Decimal  # card seconds no rate card covered; 0 for tenants' share


def list_monthly_card_seconds(*, start: datetime | None, end: datetime | None) -> list[MonthSeconds]:
    """Metered card-seconds per month of the GPU day ledger (months are whole UTC days, and days are
    kept for good while hours are pruned), within [start, end) (whole months) when given."""
    cards = GpuDay.objects.all()
    if start is not None and end is not None:
        cards = cards.filter(day__gte=start, day__lt=end)
    rows = (cards.annotate(m=TruncMonth("day", tzinfo=UTC)).values("m")
            .annotate(metered=Sum("metered_seconds"), unpriced=Sum("unpriced_seconds")))
    return [MonthSeconds(month=r["m"].date(), seconds=r["metered"] or _ZERO, unpriced_seconds=r["unpriced"] or _ZERO)
            for r in rows]


def list_monthly_share_seconds(*, start: datetime | None, end: datetime | None,
                               tenants: Collection[str] | None) -> list[MonthSeconds]:
    """Σ share_gpu_s per month of these tenants' day-ledger usage, within [start, end) (whole months)
    when given."""
    usage = UsageDay.objects.all()
    if start is not None and end is not None:
        usage = usage.filter(day__gte=start, day__lt=end)
    if tenants is not None:
        usage = usage.filter(tenant__in=tenants)
    rows = usage.annotate(m=TruncMonth("day", tzinfo=UTC)).values("m").annotate(share=Sum("share_gpu_s"))
    return [MonthSeconds(month=r["m"].date(), seconds=r["share"] or _ZERO, unpriced_seconds=_ZERO) for r in rows]


@dataclass(frozen=True)
class LineShareSeconds:
    """Σ share_gpu_s of one UTC month on one invoice line: tenant, GPU model ("" when the usage row
    has no GPU row) and SLA tier."""

    month: date  # the 1st
    tenant: str
    gpu_model: str
    sla_tier: str
    share_gpu_s: Decimal


def list_monthly_line_share_seconds(*, start: datetime | None, end: datetime | None,
                                    tenants: Collection[str] | None) -> list[LineShareSeconds]:
    """Per month and invoice line, Σ share_gpu_s of these tenants (None: all), within [start, end)
    (whole months) when given: the lines of each month's figure tree
    (billing.ledger.allocation.list_figure_rows, level 0), summed as it sums them, from the day ledger
    as it reads a month (whole UTC days), in one statement for every month rather than a tree per
    month. Unordered."""
    params = {"start": start, "end": end, "tenants": _tenant_list(tenants)}
    sql = (
        # Left: a usage row always has its GPU row (the rollup writes both), but a model only names a line.
        "SELECT (date_trunc('month', u.day, 'UTC'))::date AS month, u.tenant, coalesce(g.gpu_model, '') AS gpu_model, "  # noqa: S608 - fixed names
        "u.sla_tier, sum(u.share_gpu_s) AS share_gpu_s "
        f"FROM {reads.DAYS.usage_table} u LEFT JOIN {reads.DAYS.gpu_table} g ON g.node_id = u.node_id "
        "AND g.gpu_uuid = u.gpu_uuid AND g.day = u.day "
        "WHERE (%(start)s::timestamptz IS NULL OR u.day >= %(start)s) AND (%(end)s::timestamptz IS NULL OR u.day < %(end)s) "
        "AND (%(tenants)s::text[] IS NULL OR u.tenant = ANY(%(tenants)s::text[])) GROUP BY 1, 2, 3, 4"
    )
    with period_read_cursor() as cur:
        cur.execute(sql, params)
        return fetch_rows(cur, LineShareSeconds)


@dataclass(frozen=True)
class DayLedgerTotals:
    """GPU-day rows of a period summed by (currency, priced)."""

    currency: str
    priced: bool
    metered_seconds: Decimal
    card_cost: Decimal
    charged: Decimal
    idle_cost: Decimal


def list_day_ledger_totals(*, start: datetime, end: datetime) -> list[DayLedgerTotals]:
    """From the day ledger (GPUs x days rows; the rollup keeps it current with the hours), ordered
    by (currency, priced)."""
    rows = (GpuDay.objects.filter(day__gte=start, day__lt=end).values("currency", "priced")
            .annotate(seconds=Sum("metered_seconds"), card=Sum("card_cost"), charged=Sum("charged"),
                      idle=Sum("idle_cost")).order_by("currency", "priced"))
    return [
        DayLedgerTotals(currency=r["currency"], priced=r["priced"], metered_seconds=r["seconds"] or _ZERO,
                        card_cost=r["card"] or _ZERO, charged=r["charged"] or _ZERO, idle_cost=r["idle"] or _ZERO)
        for r in rows
    ]


@dataclass(frozen=True)
class PeriodLineCost:
    """Charge and idle share of one invoice line (tenant, GPU model, SLA tier) in one of several
    periods, ledger precision, with the currency of that period's priced GPU rows ("" when none)."""

    period: int  # index into the periods asked for
    currency: str
    tenant: str
    gpu_model: str
    sla_tier: str
    charge: Decimal
    idle_share: Decimal


def list_period_line_costs(*, periods: Sequence[tuple[datetime, datetime]],
                           tenants: Collection[str] | None) -> list[PeriodLineCost]:
    """Per period of whole UTC days and per invoice line, the sums a figure tree of that period
    holds at its line level (billing.ledger.allocation.list_figure_rows, level 0: the same usage rows,
    whole months from the month ledger and the rest from days, and their GPU rows' model), of
    `tenants` (None: all): six months and a previous period in one statement instead of a tree each,
    which would also read every workload. Unordered; a period without usage has no rows."""
    params: dict[str, Any] = {"tenants": _tenant_list(tenants)}
    parts = []
    for i, ((lo, hi), months) in enumerate(zip(periods, reads.month_ranges(reads.DAYS, periods), strict=True)):
        rows = reads.usage_rows(reads.DAYS, lo, hi, params, months=months, model=True, name=f"p{i}")
        params[f"p{i}_lo"], params[f"p{i}_hi"] = lo, hi
        parts.append(
            # The period's currency as get_priced_currency picks it: a GPU-day with some priced hour.
            f"SELECT {i} AS period, coalesce((SELECT g.currency FROM {reads.DAYS.gpu_table} g "  # noqa: S608 - fixed names; values are parameters
            f"WHERE g.day >= %(p{i}_lo)s AND g.day < %(p{i}_hi)s AND g.metered_seconds > g.unpriced_seconds LIMIT 1), '') "
            # A usage row always has its GPU row (the rollup writes both), but a model only names a line.
            "AS currency, u.tenant, coalesce(u.gpu_model, '') AS gpu_model, u.sla_tier, sum(u.charge) AS charge, "
            f"sum(u.idle_share) AS idle_share FROM {rows} u GROUP BY 1, 2, 3, 4, 5")
    if not parts:
        return []
    with period_read_cursor() as cur:
        cur.execute(" UNION ALL ".join(parts), params)
        return fetch_rows(cur, PeriodLineCost)
