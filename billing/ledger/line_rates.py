"""Which rates priced an invoice line: the rate cards and commitment pools whose price the ledger
applied to a tenant's usage of one GPU model and SLA tier in a period (docs/billing.md, Unit prices).

A GPU-minute is priced by the card of its model in force at the start of the minute, or, on a card a
commitment covers, by the commitment pool's rate (billing.ledger.pricing). So the rates of a line
follow from the rate cards' and commitments' effective intervals and the hours the line has usage
in, read cheaply:

- a model with one card over the whole period and no commitment in it: that card, no ledger read;
- otherwise the line's priced usage hours from the hour ledger, each with whether a commitment
  covered some of its GPU-minutes and whether the market card priced some; a card is counted in the
  hours its interval overlaps and a pool in the hours it covered;
- an hour two cards share (a card replaced from a minute inside it) is settled from its minutes
  (`GpuMinute.rate_card`): only the cards that priced the line's minutes count. If those minutes
  were pruned, every card of the hour counts.

Only priced usage counts, as on the invoice (a GPU-hour not wholly priced is left off it).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Collection, Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any

from django.db import connection

from billing.ledger.pricing import PricedCard, RateCards, load_rate_cards
from billing.ledger.retention import require_hours_retained

__all__ = ["AppliedRate", "LineKey", "list_line_rates"]

_HOUR = timedelta(hours=1)
# (tenant, GPU model, SLA tier): one invoice line's usage.
LineKey = tuple[str, str, str]


@dataclass(frozen=True)
class AppliedRate:
    """A price per GPU-hour that priced some of a line's usage, over [start, end): a rate card's
    interval within the period, or the hours a commitment pool at this rate covered the line's usage.
    `billed_basis` and `alpha` are the market card's (a commitment prices with them too)."""

    price_per_gpu_hour: Decimal
    start: datetime
    end: datetime
    commitment: bool
    billed_basis: str
    alpha: Decimal


def list_line_rates(*, start: datetime, end: datetime, keys: Collection[LineKey]) -> dict[LineKey, tuple[AppliedRate, ...]]:
    """The rates that priced each line's usage in [start, end), in time order (cards, then pools)."""
    cards = load_rate_cards()
    out: dict[LineKey, tuple[AppliedRate, ...]] = {}
    read: list[LineKey] = []
    for key in keys:
        model = key[1]
        in_period = _cards_in(cards, model, start, end)
        if len(in_period) == 1 and not _commitments_in(cards, model, start, end):
            out[key] = (_card_rate(in_period[0], start, end),)
        else:
            read.append(key)
    if read:
        out.update(_read_line_rates(cards, start=start, end=end, keys=read))
    return out


def _cards_in(cards: RateCards, model: str, start: datetime, end: datetime) -> list[PricedCard]:
    return [c for c in cards.by_model.get(model, ())
            if c.start < end and (c.end is None or c.end > start) and c.end != c.start]


def _commitments_in(cards: RateCards, model: str, start: datetime, end: datetime) -> bool:
    return any(c.start < end and c.end > start for c in cards.commitments.get(model, ()))


def _card_rate(card: PricedCard, start: datetime, end: datetime) -> AppliedRate:
    return AppliedRate(price_per_gpu_hour=card.rate.price_per_gpu_hour, start=max(card.start, start),
                       end=min(card.end, end) if card.end is not None else end, commitment=False,
                       billed_basis=card.rate.billed_basis, alpha=card.rate.alpha)


_HOURS_SQL = (
    "SELECT u.tenant, g.gpu_model, u.sla_tier, u.hour, bool_or(g.committed_seconds > 0),"
    " bool_or(g.committed_seconds < g.metered_seconds)"
    " FROM billing_usagehour u JOIN billing_gpuhour g"
    " ON g.node_id = u.node_id AND g.gpu_uuid = u.gpu_uuid AND g.hour = u.hour"
    " WHERE u.hour >= %(start)s AND u.hour < %(end)s AND g.hour >= %(start)s AND g.hour < %(end)s"
    " AND g.priced AND u.share_gpu_s > 0 AND u.tenant = ANY(%(tenants)s) AND g.gpu_model = ANY(%(models)s)"
    " GROUP BY 1, 2, 3, 4"
)
_MINUTE_CARDS_SQL = (
    "SELECT DISTINCT g.rate_card_id FROM billing_usageminute u JOIN billing_gpuminute g"
    " ON g.node_id = u.node_id AND g.gpu_uuid = u.gpu_uuid AND g.minute = u.minute"
    " WHERE u.minute >= %(hour)s AND u.minute < %(hour_end)s AND g.minute >= %(hour)s AND g.minute < %(hour_end)s"
    " AND u.tenant = %(tenant)s AND u.sla_tier = %(tier)s AND g.gpu_model = %(model)s AND g.priced"
    " AND g.committed_seconds < g.metered_seconds AND u.share_gpu_s > 0"
)


def _fetch(sql: str, params: dict[str, Any]) -> list[tuple[Any, ...]]:
    with connection.cursor() as cur:
        cur.execute(sql, params)
        return list(cur.fetchall())


def _read_line_rates(
    cards: RateCards, *, start: datetime, end: datetime, keys: list[LineKey]
) -> dict[LineKey, tuple[AppliedRate, ...]]:
    wanted = set(keys)
    require_hours_retained(start=start)
    rows = _fetch(_HOURS_SQL, {"start": start, "end": end, "tenants": sorted({k[0] for k in keys}),
                               "models": sorted({k[1] for k in keys})})
    used_cards: dict[LineKey, set[int]] = defaultdict(set)
    pool_hours: dict[LineKey, dict[tuple[Decimal, str, Decimal], list[datetime]]] = defaultdict(lambda: defaultdict(list))
    for tenant, model, tier, hour, committed, market in rows:
        key = (tenant, model, tier)
        if key not in wanted:
            continue
        if market:
            used_cards[key] |= _market_cards(cards, key, hour)
        pool = cards.pool_for(model, hour) if committed else None
        if pool is not None:
            base = cards.card_for(model, hour)
            basis, alpha = (base.rate.billed_basis, base.rate.alpha) if base else ("max", Decimal("0.5"))
            pool_hours[key][(pool.price_per_gpu_hour, basis, alpha)].append(hour)
    out = {}
    for key in keys:
        by_id = {c.id: c for c in cards.by_model.get(key[1], ())}
        rates = [_card_rate(by_id[i], start, end) for i in used_cards.get(key, ()) if i in by_id]
        rates += _pool_rates(pool_hours.get(key, {}).items())
        out[key] = tuple(sorted(rates, key=lambda r: (r.commitment, r.start, r.price_per_gpu_hour)))
    return out


def _market_cards(cards: RateCards, key: LineKey, hour: datetime) -> set[int]:
    """The cards that priced the line's market-rate minutes of `hour`."""
    tenant, model, tier = key
    overlapping = _cards_in(cards, model, hour, hour + _HOUR)
    if len(overlapping) <= 1:
        return {c.id for c in overlapping}
    found = {r[0] for r in _fetch(_MINUTE_CARDS_SQL, {"hour": hour, "hour_end": hour + _HOUR, "tenant": tenant,
                                                      "tier": tier, "model": model}) if r[0] is not None}
    return found or {c.id for c in overlapping}


def _pool_rates(groups: Iterable[tuple[tuple[Decimal, str, Decimal], list[datetime]]]) -> list[AppliedRate]:
    return [AppliedRate(price_per_gpu_hour=price, start=min(hours), end=max(hours) + _HOUR, commitment=True,
                        billed_basis=basis, alpha=alpha)
            for (price, basis, alpha), hours in groups]
