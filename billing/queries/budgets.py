"""Budget status for pages, scoped like every tenant read."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal

from billing.models import Budget, BudgetAction, BudgetState, BudgetStatus
from billing.scope import Scope

__all__ = ["BudgetView", "list_budgets"]


@dataclass(frozen=True)
class BudgetView:
    tenant: str
    tenant_name: str
    amount: Decimal
    currency: str
    hard_action: str
    owner: str
    state: str
    spend: Decimal
    forecast: Decimal
    used_pct: Decimal

    @property
    def state_label(self) -> str:
        return str(BudgetState(self.state).label)

    @property
    def action_label(self) -> str:
        return str(BudgetAction(self.hard_action).label)


def list_budgets(*, scope: Scope, now: datetime) -> list[BudgetView]:
    budgets = Budget.objects.select_related("tenant").order_by("tenant__slug")
    if scope.tenants is not None:
        budgets = budgets.filter(tenant__slug__in=scope.tenants)
    month = now.date().replace(day=1)
    statuses = {s.budget_id: s for s in BudgetStatus.objects.filter(month=month, budget__in=budgets)}
    views = []
    for b in budgets:
        status = statuses.get(b.pk)
        spend = status.spend if status else Decimal(0)
        views.append(BudgetView(
            tenant=b.tenant.slug, tenant_name=b.tenant.name, amount=b.amount, currency=b.currency,
            hard_action=b.hard_action, owner=b.owner, state=status.state if status else BudgetState.OK,
            spend=spend, forecast=status.forecast if status else Decimal(0),
            used_pct=(spend / b.amount * 100) if b.amount else Decimal(0),
        ))
    return views
