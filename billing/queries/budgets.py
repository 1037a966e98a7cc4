"""Budget status for pages, scoped like every tenant read.

Spend and forecast are read live with the one definition (billing.services.budgets.spend.get_month_spends)
the portal's month-to-date card uses too, so both show the same number; the state is the one the
last evaluation acted on (evaluate_budgets runs every minute and on every budget change), and so is
the forecast-over-budget flag beside it (the one that was notified)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal

from django.utils.translation import gettext, gettext_lazy

from billing.models import Budget, BudgetAction, BudgetScope, BudgetState, BudgetStatus
from billing.scope import Scope
from billing.services.budgets import MonthSpend, get_budget_spends

__all__ = ["FORECAST_OVER_BUDGET_LABEL", "SHOWN_FORECAST_OVER", "BudgetView", "list_budgets"]

# The forecast-over-budget flag is never a state of enforcement (BudgetStatus): an ok budget whose
# forecast exceeds its amount is still ok to the admission webhook and the node policy. Pages show it
# as the state, though: "ok" beside "forecast over budget" read as a contradiction.
FORECAST_OVER_BUDGET_LABEL = gettext_lazy("forecast over budget")
SHOWN_FORECAST_OVER = "forecast-over"


@dataclass(frozen=True)
class BudgetView:
    id: int
    tenant: str
    tenant_name: str
    scope: str  # BudgetScope
    namespace: str  # scope namespace
    label: str  # scope label: "name=value"
    amount: Decimal
    currency: str
    hard_action: str
    owner: str
    state: str
    spend: Decimal  # month to date, ledger precision (the state and used_pct come from it)
    spend_shown: Decimal  # month to date as every page shows it (MonthSpend.month_to_date_shown)
    forecast: Decimal
    rate_hours: int  # complete hours the forecast's rate is taken over (0: forecast = spend)
    used_pct: Decimal
    forecast_over_budget: bool  # the last evaluation's flag (BudgetStatus.forecast_over_budget)
    # Under `throttle` the tenant's SLA weight on a shared GPU is multiplied by this (docs/allocation.md).
    throttle_factor: Decimal = Decimal(1)

    @property
    def state_label(self) -> str:
        return str(BudgetState(self.state).label)

    @property
    def shown_state(self) -> str:
        """The state every page shows (the one place it is decided): an ok budget whose forecast is
        over its amount shows `forecast-over`, a warning; otherwise the state enforcement acts on.
        Display only: `state` stays what the webhook and the node policy read."""
        if self.state == BudgetState.OK and self.forecast_over_budget:
            return SHOWN_FORECAST_OVER
        return self.state

    @property
    def shown_state_label(self) -> str:
        if self.shown_state == SHOWN_FORECAST_OVER:
            return str(FORECAST_OVER_BUDGET_LABEL)
        return self.state_label

    @property
    def forecast_over_badge(self) -> bool:
        """Whether the flag is shown as a badge beside the shown state: beside warned only (an ok
        budget already shows it as its state; an enforced one never carries it)."""
        return self.forecast_over_budget and self.shown_state != SHOWN_FORECAST_OVER

    @property
    def forecast_over_budget_label(self) -> str:
        return str(FORECAST_OVER_BUDGET_LABEL)

    @property
    def action_label(self) -> str:
        return str(BudgetAction(self.hard_action).label)

    @property
    def applies_to(self) -> str:
        """What the budget counts, in the reader's language."""
        if self.scope == BudgetScope.NAMESPACE:
            return gettext("namespace %(namespace)s") % {"namespace": self.namespace}
        if self.scope == BudgetScope.LABEL:
            return gettext("pods labelled %(label)s") % {"label": self.label}
        return gettext("the whole tenant")

    @property
    def key(self) -> str:
        """A name for the budget unique on a page (test ids): acme, acme/namespace/acme-prod."""
        what = self.namespace or self.label
        return f"{self.tenant}/{self.scope}/{what}" if what else self.tenant


def list_budgets(*, scope: Scope, now: datetime, spends: dict[str, MonthSpend] | None = None,
                 tenant: str | None = None) -> list[BudgetView]:
    """The budgets the caller may see (of one `tenant` only, if given): each tenant's own first, then
    its namespaces' and labels'. `spends`: tenants' month spends already read for this page (the
    portal's own card), so that one read is shown twice rather than two reads that a rollup landing
    between them would tell apart."""
    rows = Budget.objects.select_related("tenant").order_by("tenant__slug", "-scope", "namespace", "label_key",
                                                            "label_value")
    if scope.tenants is not None:
        rows = rows.filter(tenant__slug__in=scope.tenants)
    if tenant is not None:
        rows = rows.filter(tenant__slug=tenant)
    budgets = list(rows)
    month = now.date().replace(day=1)
    statuses = {s.budget_id: s for s in BudgetStatus.objects.filter(month=month, budget__in=budgets)}
    by_budget = get_budget_spends(budgets=budgets, now=now, tenant_spends=spends)
    views = []
    for b in budgets:
        status = statuses.get(b.pk)
        spend = by_budget[b.pk]
        views.append(BudgetView(
            id=b.pk, tenant=b.tenant.slug, tenant_name=b.tenant.name, scope=b.scope, namespace=b.namespace,
            label=f"{b.label_key}={b.label_value}" if b.scope == BudgetScope.LABEL else "",
            amount=b.amount, currency=b.currency,
            hard_action=b.hard_action, owner=b.owner, state=status.state if status else BudgetState.OK,
            spend=spend.month_to_date, spend_shown=spend.month_to_date_shown(b.currency), forecast=spend.forecast,
            rate_hours=spend.rate_hours,
            used_pct=(spend.month_to_date / b.amount * 100) if b.amount else Decimal(0),
            forecast_over_budget=bool(status and status.forecast_over_budget), throttle_factor=b.throttle_factor,
        ))
    return views
