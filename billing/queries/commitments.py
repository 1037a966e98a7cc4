"""The commitments page (finance and admins): each commitment beside its model's market rate, and
what it cost over a month, what of that was used and what went unused (docs/billing.md,
Commitments and on-prem cards).

What a commitment was used for in an hour is its share of what its model's pool covered then: the
pool's covered card-seconds (the hour ledger) × its cards ÷ the pool's cards. Commitments price whole
hours, so a pool never changes inside one. Its cost is its cards × the hour's seconds (up to now) at
its rate, used or not; unused = cost − used cost.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from datetime import date, datetime, timedelta
from decimal import Context, Decimal, localcontext

from django.db.models import Q

from billing.calendar import month_bounds
from billing.ledger.commitments import list_committed_hours
from billing.models import Commitment, CommitmentKind, RateCard
from billing.money import ledger_amount
from billing.scope import Scope
from billing.services.pricing import AmortisedRate, amortised_rate, known_gpu_models

__all__ = ["CommitmentGroup", "CommitmentView", "CommitmentsPage", "MonthUse", "get_commitments_page"]

_HOUR = timedelta(hours=1)
_S_PER_H = Decimal(3600)
_CONTEXT = Context(prec=50)


@dataclass(frozen=True)
class MonthUse:
    """One commitment over the month shown, to now: card-hours and money at ledger precision."""

    card_hours: Decimal
    used_card_hours: Decimal
    cost: Decimal
    used_cost: Decimal
    unused_cost: Decimal

    @property
    def utilisation_percent(self) -> Decimal | None:
        if not self.card_hours:
            return None
        with localcontext(_CONTEXT):
            return (self.used_card_hours / self.card_hours * 100).quantize(Decimal("0.1"))


@dataclass(frozen=True)
class CommitmentView:
    id: int
    gpu_model: str
    kind: str
    kind_label: str
    cards: int
    currency: str
    price_per_gpu_hour: Decimal
    market_price: Decimal | None  # the model's rate card now, in the same currency
    saving_percent: Decimal | None  # of the committed rate against the market rate
    term_start: datetime
    term_end: datetime
    term_years: int
    effective_from: datetime
    effective_to: datetime
    status: str  # upcoming, active, ended, retired
    note: str
    created_by: str
    retired_at: datetime | None
    retired_by: str
    retire_reason: str
    may_retire: bool
    amortised: AmortisedRate | None
    purchase_price: Decimal | None
    power_watts: int | None
    energy_price_per_kwh: Decimal | None
    facility_cost_per_year: Decimal | None
    month: MonthUse


@dataclass(frozen=True)
class CommitmentGroup:
    gpu_model: str
    market_price: Decimal | None
    market_currency: str
    commitments: list[CommitmentView]


@dataclass(frozen=True)
class CommitmentsPage:
    month: date
    groups: list[CommitmentGroup]
    known_models: list[str]
    may_change: bool


def _market(model: str, now: datetime) -> RateCard | None:
    return (RateCard.objects.filter(gpu_model=model, effective_from__lte=now)
            .filter(Q(effective_to__isnull=True) | Q(effective_to__gt=now)).order_by("-effective_from").first())


def _pool_cards(commitments: list[Commitment], start: datetime, end: datetime) -> dict[tuple[str, datetime], int]:
    """Σ cards of each model's commitments in force, per whole hour of [start, end) they price."""
    pools: dict[tuple[str, datetime], int] = defaultdict(int)
    for c in commitments:
        hour = max(c.effective_from, start)
        while hour < min(c.effective_to, end):
            pools[(c.gpu_model, hour)] += c.cards
            hour += _HOUR
    return pools


def _month_use(c: Commitment, *, start: datetime, end: datetime, now: datetime,
               pools: dict[tuple[str, datetime], int], covered: dict[tuple[str, datetime], Decimal]) -> MonthUse:
    lo, hi = max(start, c.effective_from), min(end, c.effective_to, now)
    capacity_s = used_s = Decimal(0)
    with localcontext(_CONTEXT):
        hour = lo
        while hour < hi:
            capacity_s += c.cards * Decimal((min(hour + _HOUR, hi) - hour).total_seconds())
            pool = pools[(c.gpu_model, hour)]
            used_s += covered.get((c.gpu_model, hour), Decimal(0)) * c.cards / pool
            hour += _HOUR
        cost = ledger_amount(capacity_s * c.price_per_gpu_hour / _S_PER_H)
        used_cost = ledger_amount(used_s * c.price_per_gpu_hour / _S_PER_H)
        return MonthUse(card_hours=capacity_s / _S_PER_H, used_card_hours=used_s / _S_PER_H, cost=cost,
                        used_cost=used_cost, unused_cost=cost - used_cost)


def _status(c: Commitment, now: datetime) -> str:
    if c.retired_at is not None:
        return "retired"
    if now < c.effective_from:
        return "upcoming"
    return "active" if now < c.effective_to else "ended"


def _saving(rate: Decimal, market: RateCard | None, currency: str) -> tuple[Decimal | None, Decimal | None]:
    if market is None or market.currency != currency:
        return None, None
    if not market.price_per_gpu_hour:
        return market.price_per_gpu_hour, None
    with localcontext(_CONTEXT):
        saving = ((market.price_per_gpu_hour - rate) / market.price_per_gpu_hour * 100).quantize(Decimal("0.1"))
    return market.price_per_gpu_hour, saving


def _amortised(c: Commitment) -> AmortisedRate | None:
    if c.kind != CommitmentKind.ON_PREM or c.purchase_price is None:
        return None
    return amortised_rate(purchase_price=c.purchase_price, life_years=c.term_years, term=(c.term_start, c.term_end),
                          power_watts=c.power_watts or 0, energy_price_per_kwh=c.energy_price_per_kwh or Decimal(0),
                          facility_cost_per_year=c.facility_cost_per_year or Decimal(0))


def get_commitments_page(*, scope: Scope, now: datetime, month: date) -> CommitmentsPage:
    """Every commitment by GPU model, with its month's use; nothing for a scope that is not the
    platform's (the view answers 403 before asking)."""
    if not scope.sees_platform:
        return CommitmentsPage(month=month, groups=[], known_models=[], may_change=False)
    start, end = month_bounds(month)
    commitments = list(Commitment.objects.order_by("gpu_model", "effective_from", "id"))
    pools = _pool_cards(commitments, start, end)
    covered = {(h.gpu_model, h.hour): h.committed_seconds
               for h in list_committed_hours(gpu_models={c.gpu_model for c in commitments}, start=start, end=end)}
    by_model: dict[str, list[Commitment]] = defaultdict(list)
    for c in commitments:
        by_model[c.gpu_model].append(c)
    groups = []
    for model, items in sorted(by_model.items()):
        market = _market(model, now)
        views = []
        for c in items:
            market_price, saving = _saving(c.price_per_gpu_hour, market, c.currency)
            status = _status(c, now)
            views.append(CommitmentView(
                id=c.pk, gpu_model=c.gpu_model, kind=c.kind, kind_label=str(CommitmentKind(c.kind).label), cards=c.cards,
                currency=c.currency, price_per_gpu_hour=c.price_per_gpu_hour, market_price=market_price,
                saving_percent=saving, term_start=c.term_start, term_end=c.term_end, term_years=c.term_years,
                effective_from=c.effective_from, effective_to=c.effective_to, status=status, note=c.note,
                created_by=c.created_by, retired_at=c.retired_at, retired_by=c.retired_by,
                retire_reason=c.retire_reason, may_retire=status in ("upcoming", "active"),
                amortised=_amortised(c), purchase_price=c.purchase_price, power_watts=c.power_watts,
                energy_price_per_kwh=c.energy_price_per_kwh, facility_cost_per_year=c.facility_cost_per_year,
                month=_month_use(c, start=start, end=end, now=now, pools=pools, covered=covered)))
        groups.append(CommitmentGroup(gpu_model=model, market_price=market.price_per_gpu_hour if market else None,
                                      market_currency=market.currency if market else "", commitments=views))
    return CommitmentsPage(month=month, groups=groups, known_models=known_gpu_models(),
                           may_change=scope.is_admin or scope.is_finance)
