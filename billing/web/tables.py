"""What the finance page and its CSV show of the cost by tenant and its totals: each tenant's
figures as every page shows them (billing.figures), every total (across a row, down a
column, or of the totals) the sum of the amounts it totals, so the figures shown always add up;
the platform's idle rounded once. Display only: the ledger keeps its precision."""

from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal

from billing.money import display_amount
from billing.queries.finance import CostSummary, TenantCost

__all__ = ["ShownCosts", "ShownTenantCost", "known_sum", "shown_costs"]


@dataclass(frozen=True)
class ShownTenantCost:
    tenant: TenantCost
    charge: Decimal
    idle_share: Decimal
    total: Decimal  # charge + idle_share as shown


@dataclass(frozen=True)
class ShownCosts:
    """The finance page's cost by tenant, its totals and the fleet's: every figure as shown."""

    rows: list[ShownTenantCost]
    charge: Decimal  # Σ rows' charge
    idle_share: Decimal  # Σ rows' idle share
    attributed: Decimal  # Σ rows' total = charge + idle_share
    # Platform figures: None for a tenant-scoped caller.
    idle_platform: Decimal | None
    total_gpu_cost: Decimal | None  # attributed + idle_platform
    # Σ rows' energy as shown; energy cost and kg CO2e None where a row's is (no price, no factor).
    energy_kwh: Decimal = Decimal(0)
    energy_cost: Decimal | None = None
    co2e_kg: Decimal | None = None

    @property
    def max_row_total(self) -> Decimal:
        return max((r.total for r in self.rows), default=Decimal(0))


def shown_costs(summary: CostSummary) -> ShownCosts:
    currency = summary.currency
    rows = [ShownTenantCost(t, t.charge, t.idle_share, t.total) for t in summary.tenants]
    charge = sum((r.charge for r in rows), Decimal(0))
    idle_share = sum((r.idle_share for r in rows), Decimal(0))
    attributed = charge + idle_share
    # The platform's idle energy is no tenant's: these total the tenants' rows only.
    kwh = sum((r.tenant.energy_kwh for r in rows), Decimal(0))
    energy_cost = known_sum([r.tenant.energy_cost for r in rows])
    co2e_kg = known_sum([r.tenant.co2e_kg for r in rows])
    if summary.idle_platform is None:
        return ShownCosts(rows, charge, idle_share, attributed, None, None, kwh, energy_cost, co2e_kg)
    idle_platform = display_amount(summary.idle_platform, currency)
    return ShownCosts(rows, charge, idle_share, attributed, idle_platform, attributed + idle_platform, kwh,
                      energy_cost, co2e_kg)


def known_sum(values: list[Decimal | None]) -> Decimal | None:
    """The sum of figures shown, None where any is unknown (a total over a "—" would be a guess)."""
    if any(v is None for v in values):
        return None
    return sum((v for v in values if v is not None), Decimal(0))
