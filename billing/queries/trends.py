"""Trends and comparisons (docs/billing.md, Previous period and month over month): a period's cost
against the previous period's, and the cost of the last six months, per tenant.

Every figure here is the one the finance dashboard shows for that period (billing.figures): a
tenant's cost is its invoice lines for the period, each rounded once to the currency's minor unit,
added; a total is the sum of its tenants' figures. The lines of every period asked for come from
one day-ledger read (billing.ledger.totals.list_period_line_costs), not a figure tree per period:
the sums are the tree's line sums to the ledger unit, and the rounding is the tree's; so a month the
page shows whole is its own figures, not read again.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal

from billing.calendar import month_bounds, previous_month
from billing.ledger import totals
from billing.models import Tenant
from billing.money import round_parts
from billing.scope import Scope

__all__ = [
    "MONTHS",
    "Change",
    "Comparison",
    "MonthCost",
    "PeriodCosts",
    "PreviousPeriod",
    "TenantChange",
    "day_bounds",
    "get_comparison_and_months",
    "get_period_costs",
    "previous_period",
]

# Months in a month-over-month chart, the month shown included.
MONTHS = 6
_ZERO = Decimal(0)
_DAY = timedelta(days=1)


def _month_end(day: date) -> date:
    """The last day of `day`'s month."""
    return (day.replace(day=28) + timedelta(days=4)).replace(day=1) - _DAY


def _months_back(month: date, n: int) -> date:
    for _ in range(n):
        month = previous_month(month)
    return month


def previous_period(first: date, last: date) -> tuple[date, date]:
    """The period a period is compared with, both ends included (docs/billing.md): whole months
    are compared with as many whole months before them; a month's first days (a month to date)
    with the same days of the previous month, cut at its end (1–30 March against all of February);
    any other period with as many days just before it."""
    if first.day == 1 and last == _month_end(last) and last >= first:
        months = (last.year - first.year) * 12 + last.month - first.month + 1
        return _months_back(first, months), first - _DAY
    if first.day == 1 and (first.year, first.month) == (last.year, last.month):
        before = previous_month(first)
        return before, before.replace(day=min(last.day, _month_end(before).day))
    days = (last - first).days + 1
    return first - days * _DAY, first - _DAY


def day_bounds(first: date, last: date) -> tuple[datetime, datetime]:
    """[start, end) of whole UTC days, as the period form gives them."""
    start = datetime(first.year, first.month, first.day, tzinfo=UTC)
    return start, datetime(last.year, last.month, last.day, tzinfo=UTC) + _DAY


@dataclass(frozen=True)
class Change:
    """A figure against the previous period's: the absolute change and the change in percent of
    the previous figure (None when that is 0: no percentage of nothing)."""

    current: Decimal
    previous: Decimal

    @property
    def delta(self) -> Decimal:
        return self.current - self.previous

    @property
    def pct(self) -> Decimal | None:
        return self.delta / self.previous * 100 if self.previous else None


@dataclass(frozen=True)
class PeriodCosts:
    """Each tenant's cost of [start, end) as every page shows it, and their total."""

    start: datetime
    end: datetime
    currency: str
    tenants: dict[str, Decimal]

    @property
    def total(self) -> Decimal:
        return sum(self.tenants.values(), _ZERO)

    @property
    def has_usage(self) -> bool:
        return bool(self.tenants)


def get_period_costs(*, scope: Scope, periods: Sequence[tuple[datetime, datetime]]) -> list[PeriodCosts]:
    """The tenants' figures of each period (whole UTC days) in the caller's scope, in one read."""
    if scope.tenants is not None and not scope.tenants:
        return [PeriodCosts(start, end, "", {}) for start, end in periods]
    charges: dict[tuple[int, str], list[Decimal]] = defaultdict(list)
    idles: dict[tuple[int, str], list[Decimal]] = defaultdict(list)
    currencies: dict[int, str] = {}
    for line in totals.list_period_line_costs(periods=periods, tenants=scope.tenants):
        charges[line.period, line.tenant].append(line.charge)
        idles[line.period, line.tenant].append(line.idle_share)
        currencies[line.period] = line.currency
    out = []
    for i, (start, end) in enumerate(periods):
        currency = currencies.get(i, "")
        # As the figure tree shows a tenant (billing.figures.TenantLines): usage lines and idle lines
        # each rounded once, then added.
        figures = {tenant: round_parts(charges[p, tenant], currency)[1] + round_parts(idles[p, tenant], currency)[1]
                   for p, tenant in charges if p == i}
        out.append(PeriodCosts(start, end, currency, figures))
    return out


@dataclass(frozen=True)
class TenantChange:
    tenant: str
    name: str
    change: Change


@dataclass(frozen=True)
class PreviousPeriod:
    """The previous period of a comparison, [previous_start, previous_end), and its first and last
    day as a page names them (both included)."""

    previous_start: datetime
    previous_end: datetime

    @property
    def previous_first(self) -> date:
        return self.previous_start.date()

    @property
    def previous_last(self) -> date:
        return (self.previous_end - _DAY).date()


@dataclass(frozen=True)
class Comparison(PreviousPeriod):
    """The period shown against the previous period: the total and each tenant's cost (the tenants
    of either period: current order, then those with cost only before)."""

    total: Change
    tenants: list[TenantChange]
    names: dict[str, str]  # slug -> name of every tenant of the comparison and of the months
    # The platform's idle (finance and admins only; None for a tenant-scoped caller), shown as the
    # dashboard's tile shows it: rounded once.
    idle_platform: Change | None = None

    @property
    def total_gpu_cost(self) -> Change | None:
        """The fleet's whole GPU cost: the tenants' figures and the platform's idle, as the tile adds them."""
        if self.idle_platform is None:
            return None
        return Change(self.total.current + self.idle_platform.current, self.total.previous + self.idle_platform.previous)


@dataclass(frozen=True)
class MonthCost:
    """One month of a month-over-month chart: each tenant's figure of the whole month (to date
    for the month in progress: the month's days not yet begun have no usage)."""

    month: date  # its first day
    costs: PeriodCosts


def get_comparison_and_months(*, scope: Scope, start: datetime, end: datetime, current: Mapping[str, Decimal],
                              currency: str) -> tuple[Comparison, list[MonthCost]]:
    """[start, end) (whole UTC days) against its previous period, given the tenants' figures of
    [start, end) the page shows (`current`, slug -> figure, in the page's order; `currency`, theirs:
    their figure tree's), and the MONTHS months up to the one of the period's last day: one ledger
    read for all of them. A period that is the last of those months (a page showing a month) is its
    bar as the page shows it, not read again; a previous period that is one of them is read once."""
    first, last = start.astimezone(UTC).date(), (end.astimezone(UTC) - _DAY).date()
    previous = day_bounds(*previous_period(first, last))
    months = [_months_back(last.replace(day=1), n) for n in range(MONTHS - 1, -1, -1)]
    periods = [previous, *(month_bounds(m) for m in months)]
    # The tenants of the page's figure tree are the tenants with usage lines in the period, and each
    # figure is its lines rounded once as get_period_costs rounds them: the same PeriodCosts.
    shown = {periods[-1]: PeriodCosts(*periods[-1], currency, dict(current))} if (start, end) == periods[-1] else {}
    unread = list(dict.fromkeys(p for p in periods if p not in shown))
    read = dict(zip(unread, get_period_costs(scope=scope, periods=unread), strict=True))
    costs = [shown[p] if p in shown else read[p] for p in periods]
    before = costs[0].tenants
    order = [*current, *sorted(t for t in before if t not in current)]
    slugs = set(order).union(*(c.tenants for c in costs))
    names = dict(Tenant.objects.filter(slug__in=slugs).values_list("slug", "name")) if slugs else {}
    tenants = [TenantChange(t, names.get(t, t), Change(current.get(t, _ZERO), before.get(t, _ZERO))) for t in order]
    comparison = Comparison(previous[0], previous[1], Change(sum(current.values(), _ZERO), costs[0].total), tenants,
                            names)
    return comparison, [MonthCost(m, c) for m, c in zip(months, costs[1:], strict=True)]
