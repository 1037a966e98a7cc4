"""Cost by tenant, idle and total GPU cost for a period, from the day ledger when the period is
whole UTC days, else from the hour ledger (billing.ledger.reads.ledger_for picks the table; the
sums are billing.ledger.totals)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal

from billing.ledger import totals
from billing.models import Tenant
from billing.scope import Scope

__all__ = ["CostSummary", "TenantCost", "get_cost_summary", "get_cost_summary_and_top"]

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
    return get_cost_summary_and_top(scope=scope, start=start, end=end, top=0)[0]


def get_cost_summary_and_top(*, scope: Scope, start: datetime, end: datetime,
                             top: int) -> tuple[CostSummary, list[totals.WorkloadTotals]]:
    """The cost summary and the `top` costliest workloads, from one pass over the period's usage."""
    names = dict(Tenant.objects.values_list("slug", "name"))
    workloads = totals.summarise_workloads(start=start, end=end, tenants=scope.tenants, top=top)
    rows = workloads.tenants
    tenants = [
        TenantCost(
            tenant=r.tenant,
            name=names.get(r.tenant, r.tenant),
            charge=r.charge,
            idle_share=r.idle_share,
            gpu_hours_equivalent=r.share_gpu_s / _S_PER_H,
            mem_used_gb_h=r.mem_used_mb_s / _MB_PER_GB / _S_PER_H,
            sm_used_h=r.sm_used_s / _S_PER_H,
            workloads=r.workloads,
        )
        for r in rows
    ]
    tenants.sort(key=lambda t: (-t.total, t.tenant))
    attributed = sum((t.total for t in tenants), _ZERO)
    currency = totals.get_priced_currency(start=start, end=end)
    if not scope.sees_platform:
        return CostSummary(start, end, currency, tenants, attributed, None, None, None, None, None, None), workloads.top
    gpu = totals.get_gpu_totals(start=start, end=end)
    return CostSummary(
        start=start,
        end=end,
        currency=currency,
        tenants=tenants,
        attributed=attributed,
        total_gpu_cost=gpu.card_cost,
        idle_platform=gpu.idle_platform,
        idle_total=gpu.idle_cost,
        metered_gpu_hours=gpu.metered_seconds / _S_PER_H,
        unpriced_gpu_hours=gpu.unpriced_seconds / _S_PER_H,
        last_data_at=totals.get_last_ledger_hour(),
    ), workloads.top
