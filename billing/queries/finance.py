"""Cost by tenant, idle and total GPU cost for a period, from the hour ledger."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal

from django.db import connection
from django.db.models import Q, Sum

from billing.models import GpuHour, Tenant
from billing.queries.scope import Scope

__all__ = ["CostSummary", "TenantCost", "get_cost_summary"]

_ZERO = Decimal(0)
_MB_PER_GB = Decimal(1024)
_S_PER_H = Decimal(3600)


@dataclass(frozen=True)
class TenantCost:
    tenant: str
    name: str
    charge: Decimal
    idle_share: Decimal
    gpu_hours_equivalent: Decimal
    mem_used_gb_h: Decimal
    sm_used_h: Decimal
    workloads: int

    @property
    def total(self) -> Decimal:
        return self.charge + self.idle_share


@dataclass(frozen=True)
class CostSummary:
    start: datetime
    end: datetime
    currency: str
    tenants: list[TenantCost]
    attributed: Decimal
    # Whole-card cost and idle are platform figures: None for a tenant-scoped caller.
    total_gpu_cost: Decimal | None
    idle_platform: Decimal | None
    idle_total: Decimal | None
    metered_gpu_hours: Decimal | None
    unpriced_gpu_hours: Decimal | None
    last_data_at: datetime | None

    @property
    def idle_share_pct(self) -> Decimal | None:
        if not self.total_gpu_cost or self.idle_total is None:
            return None
        return self.idle_total / self.total_gpu_cost * 100


def get_cost_summary(*, scope: Scope, start: datetime, end: datetime) -> CostSummary:
    # Per (tenant, pod) first, then per tenant with count(*): no count(DISTINCT pod_uid) over every
    # usage row of the period (~12 % faster at 3.4M rows, bench/web_pages.py).
    with connection.cursor() as cur:
        cur.execute(
            "SELECT tenant, sum(charge), sum(idle_share), sum(share), sum(mem), sum(sm), count(*) FROM ("
            " SELECT tenant, pod_uid, sum(charge) AS charge, sum(idle_share) AS idle_share,"
            " sum(share_gpu_s) AS share, sum(mem_used_mb_s) AS mem, sum(sm_used_s) AS sm"
            " FROM billing_usagehour WHERE hour >= %(start)s AND hour < %(end)s"
            " AND (%(tenants)s::text[] IS NULL OR tenant = ANY(%(tenants)s::text[])) GROUP BY 1, 2"
            ") per_pod GROUP BY 1",
            {"start": start, "end": end, "tenants": None if scope.tenants is None else sorted(scope.tenants)},
        )
        keys = ("tenant", "charge", "idle_share", "share", "mem", "sm", "workloads")
        rows = [dict(zip(keys, r, strict=True)) for r in cur.fetchall()]
    names = dict(Tenant.objects.values_list("slug", "name"))
    tenants = [
        TenantCost(
            tenant=r["tenant"],
            name=names.get(r["tenant"], r["tenant"]),
            charge=r["charge"] or _ZERO,
            idle_share=r["idle_share"] or _ZERO,
            gpu_hours_equivalent=(r["share"] or _ZERO) / _S_PER_H,
            mem_used_gb_h=(r["mem"] or _ZERO) / _MB_PER_GB / _S_PER_H,
            sm_used_h=(r["sm"] or _ZERO) / _S_PER_H,
            workloads=r["workloads"],
        )
        for r in rows
    ]
    tenants.sort(key=lambda t: (-t.total, t.tenant))
    attributed = sum((t.total for t in tenants), _ZERO)
    gpu = GpuHour.objects.filter(hour__gte=start, hour__lt=end)
    currency = gpu.filter(priced=True).values_list("currency", flat=True).first() or ""
    if not scope.sees_platform:
        return CostSummary(start, end, currency, tenants, attributed, None, None, None, None, None, None)
    agg = gpu.aggregate(
        card=Sum("card_cost"),
        idle=Sum("idle_cost"),
        idle_allocated=Sum("idle_allocated"),
        seconds=Sum("metered_seconds"),
        unpriced=Sum("metered_seconds", filter=Q(priced=False)),
    )
    last = GpuHour.objects.order_by("-hour").values_list("hour", flat=True).first()
    idle_total = agg["idle"] or _ZERO
    return CostSummary(
        start=start,
        end=end,
        currency=currency,
        tenants=tenants,
        attributed=attributed,
        total_gpu_cost=agg["card"] or _ZERO,
        idle_platform=idle_total - (agg["idle_allocated"] or _ZERO),
        idle_total=idle_total,
        metered_gpu_hours=(agg["seconds"] or _ZERO) / _S_PER_H,
        unpriced_gpu_hours=(agg["unpriced"] or _ZERO) / _S_PER_H,
        last_data_at=last,
    )
