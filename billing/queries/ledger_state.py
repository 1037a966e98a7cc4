"""Where the ledger stands, for Prometheus (billing.metrics): what /healthz reports and more.

Read at every scrape from the database, so every web process answers the same whichever one
Prometheus reaches. Each figure is one indexed aggregate over small sets (batches waiting for
the rollup, period and budget rows, this month's GPU-day rows), so a scrape stays cheap as the
ledger grows. No tenant name is in any figure: whoever scrapes sees counts and fleet totals.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal

from billing.calendar import month_bounds, month_of
from billing.ledger.state import get_batch_backlog
from billing.ledger.totals import list_day_ledger_totals
from billing.models import BillingPeriod, Budget, BudgetAction, BudgetState, BudgetStatus
from billing.queries.undelivered import count_open_undelivered_by_node
from billing.services.invoicing import close_is_stalled

__all__ = ["PERIOD_STATES", "LedgerState", "get_ledger_state"]

# A closing period whose job went quiet is reported apart from one that is making progress.
PERIOD_STATES = ("open", "closing", "stalled", "closed", "failed")
COST_PARTS = ("card", "charged", "idle")


@dataclass(frozen=True)
class LedgerState:
    pending_batches: int  # stored, waiting for the rollup (not quarantined)
    rollup_lag_s: float  # how long ago the oldest pending batch arrived; 0 when none
    quarantined_batches: int
    undelivered_by_node: dict[str, int]  # open undelivered reports; nodes with none are absent
    periods_by_state: dict[str, int]  # every PERIOD_STATES key
    budgets_by_state_action: dict[tuple[str, str], int]  # (state, hard action) this month; every pair
    month_cost: dict[tuple[str, str], Decimal]  # (currency, COST_PARTS) this month, major units
    month_gpu_seconds: dict[bool, Decimal]  # priced → metered GPU-seconds this month


def get_ledger_state(*, now: datetime) -> LedgerState:
    backlog = get_batch_backlog()
    month_cost, month_gpu_seconds = _month_ledger(now=now)
    return LedgerState(
        pending_batches=backlog.pending, rollup_lag_s=backlog.rollup_lag_s(now),
        quarantined_batches=backlog.quarantined,
        undelivered_by_node=count_open_undelivered_by_node(), periods_by_state=_periods(now=now),
        budgets_by_state_action=_budgets(now=now), month_cost=month_cost,
        month_gpu_seconds=month_gpu_seconds,
    )


def _periods(*, now: datetime) -> dict[str, int]:
    counts = dict.fromkeys(PERIOD_STATES, 0)
    for status, progress_at in BillingPeriod.objects.values_list("status", "progress_at"):
        stalled = close_is_stalled(status=status, progress_at=progress_at, now=now)
        counts["stalled" if stalled else status] += 1
    return counts


def _budgets(*, now: datetime) -> dict[tuple[str, str], int]:
    """Budgets by this month's state and their hard action. A budget not evaluated yet this month
    is ok: the month's status row starts in state ok (billing.models.BudgetStatus)."""
    month = month_of(now)
    states = dict(BudgetStatus.objects.filter(month=month).values_list("budget_id", "state"))
    counts: Counter[tuple[str, str]] = Counter(
        (states.get(budget_id, BudgetState.OK), action)
        for budget_id, action in Budget.objects.values_list("id", "hard_action")
    )
    return {(s, a): counts[(s, a)] for s in BudgetState.values for a in BudgetAction.values}


def _month_ledger(*, now: datetime) -> tuple[dict[tuple[str, str], Decimal], dict[bool, Decimal]]:
    """This month's cost and metered GPU-seconds from the day ledger (GPUs x days rows; the rollup
    keeps it current with the hours)."""
    start, end = month_bounds(month_of(now))
    cost: dict[tuple[str, str], Decimal] = {}
    seconds = {True: Decimal(0), False: Decimal(0)}
    for row in list_day_ledger_totals(start=start, end=end):
        seconds[row.priced] += row.metered_seconds
        if row.priced and row.currency:
            for part, amount in zip(COST_PARTS, (row.card_cost, row.charged, row.idle_cost), strict=True):
                cost[(row.currency, part)] = cost.get((row.currency, part), Decimal(0)) + amount
    return cost, seconds
