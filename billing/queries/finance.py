"""Cost by tenant, idle and total GPU cost for a period. The tenants' figures are those every page
shows (billing.figures: each tenant's invoice lines rounded once, quantities at the page's
places); the platform's (card cost, idle, metered GPU-hours) are sums of the GPU ledger
(billing.ledger.totals), from the day ledger when the period is whole UTC days, else from hours."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal

from billing.figures import PAGE_PLACES, FigureTree
from billing.ledger import totals
from billing.models import Tenant
from billing.queries.figures import get_top_figure_tree
from billing.scope import Scope

__all__ = ["PAGE_PLACES", "CostSummary", "TenantCost", "get_cost_summary", "get_cost_summary_and_tree"]

_S_PER_H = Decimal(3600)


@dataclass(frozen=True)
class TenantCost:
    """One tenant's row as every page shows it: its invoice lines' usage charges and idle shares,
    each line rounded once to the currency's minor unit, and its quantities at the summary's places."""

    tenant: str
    name: str
    charge: Decimal
    idle_share: Decimal
    gpu_hours_equivalent: Decimal
    mem_used_gb_h: Decimal
    sm_used_h: Decimal
    workloads: int
    # Its GPU energy, and what that cost and emitted where it was drawn, as every page shows them
    # (billing.figures); None where some of it had no price (no CO2e factor). Beside the cost, never in it.
    energy_kwh: Decimal = Decimal(0)
    energy_cost: Decimal | None = None
    co2e_kg: Decimal | None = None

    @property
    def total(self) -> Decimal:
        return self.charge + self.idle_share


@dataclass(frozen=True)
class CostSummary:
    start: datetime
    end: datetime
    currency: str
    places: int  # of the tenants' quantities
    tenants: list[TenantCost]
    attributed: Decimal  # Σ tenants' totals as shown
    # Whole-card cost and idle are platform figures (ledger precision): None for a tenant-scoped caller.
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


def get_cost_summary(*, scope: Scope, start: datetime, end: datetime, places: int = PAGE_PLACES) -> CostSummary:
    return get_cost_summary_and_tree(scope=scope, start=start, end=end, places=places, top_pods=0)[0]


def get_cost_summary_and_tree(*, scope: Scope, start: datetime, end: datetime, places: int = PAGE_PLACES,
                              top_pods: int) -> tuple[CostSummary, FigureTree]:
    """The cost summary and the figure tree it was read from (one pass over the period's usage):
    whole down to controllers, with the pods only where the `top_pods` costliest pod instances
    are shown from (billing.queries.figures.get_top_figure_tree)."""
    names = dict(Tenant.objects.values_list("slug", "name"))
    tree, pod_instances = get_top_figure_tree(scope=scope, start=start, end=end, places=places, top_pods=top_pods)
    tenants = []
    # Costliest first by the exact figure (two tenants shown alike keep the ledger's order).
    for slug, root in sorted(tree.roots.items(), key=lambda item: (-item[1].exact.cost, item[0])):
        shown, lines = tree.shown(root), tree.lines[slug]
        tenants.append(TenantCost(
            tenant=slug, name=names.get(slug, slug), charge=lines.charge, idle_share=lines.idle_share,
            gpu_hours_equivalent=shown.gpu_hours, mem_used_gb_h=shown.mem_used_gb_h, sm_used_h=shown.sm_used_h,
            workloads=pod_instances.get(slug, 0),
            energy_kwh=shown.energy_kwh, energy_cost=shown.energy_cost, co2e_kg=shown.co2e_kg,
        ))
    attributed = sum((t.total for t in tenants), Decimal(0))
    currency = totals.get_priced_currency(start=start, end=end)
    if not scope.sees_platform:
        return CostSummary(start, end, currency, places, tenants, attributed, None, None, None, None, None, None), tree
    gpu = totals.get_gpu_totals(start=start, end=end)
    return CostSummary(
        start=start,
        end=end,
        currency=currency,
        places=places,
        tenants=tenants,
        attributed=attributed,
        total_gpu_cost=gpu.card_cost,
        idle_platform=gpu.idle_platform,
        idle_total=gpu.idle_cost,
        metered_gpu_hours=gpu.metered_seconds / _S_PER_H,
        unpriced_gpu_hours=gpu.unpriced_seconds / _S_PER_H,
        last_data_at=totals.get_last_ledger_hour(),
    ), tree
