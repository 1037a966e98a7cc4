"""The paired static-vs-dynamic cost report (definitions in docs/billing.md).

The organisation's view (`fleet`, `chargeback`), every priced GPU-minute of the period, cold start
included, since the organisation pays for those minutes too:
  dynamic (as run)      = the cost of the card-minutes that held at least one workload
  each static alternative (whole cards, request fractions, fixed profiles; static_alternatives)
                        = placed on the fleet's own cards (a card is the fleet's in the minutes it
                          metered), first-fit: the cost of the card-minutes
                          that held at least one of its slices, or "not feasible" with the cards
                          it lacked when the fleet's cards were not enough (never priced)
  the headline          = the saving of dynamic against the cheapest feasible alternative
                          (negative when dynamic cost more); none when no alternative fits
  fleet held            = every card-minute the fleet metered, busy or idle (the dashboard's
                          total GPU cost): busy (dynamic's figure above) + cards with no workload
  chargeback per tenant = what the ledger charged (charge + idle spread onto it), and each
                          alternative's slices of the tenant's workloads at the card's price; the
                          platform row is the rest of each allocation's cost.

The paired test, per workload-day: one workload (tenant/namespace/pod/container/pod UID) on one
UTC day, its first COLD_START minutes excluded (from the first minute it appears in the ledger,
looking back LOOKBACK before the period), over complete days only (the UTC days that were over
when the report was computed). For each unit and each alternative:
  x_A = its slice's share of the card × the card's price × every second it was present
  y   = what the ledger charged it (usage charge + any idle spread onto it)
and scipy.stats.ttest_rel(x_A, y): mean saving, 95 % CI, p-value, n.
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal
from typing import Any

from billing.ledger.minutes import (
    CardSpan,
    WorkloadSpan,
    get_busy_card_time,
    get_fleet_card_cost,
    list_card_spans,
    list_steady_workload_gpu_days,
    list_workload_spans,
    price_card_time,
)
from billing.ledger.retention import require_minutes_retained
from billing.ledger.totals import get_priced_currency
from billing.money import ledger_amount
from billing.services.savings.static_alternatives import (
    ALPHA,
    ALTERNATIVES,
    FleetCard,
    Placement,
    WorkloadSlice,
    choose_baseline,
    place,
)

__all__ = ["COLD_START", "LOOKBACK", "compute_paired_report", "workload_slices"]

COLD_START = timedelta(minutes=5)
LOOKBACK = timedelta(days=7)
_MINUTE = timedelta(minutes=1)
_S_PER_H = Decimal(3600)


@dataclass
class _Unit:
    static_whole: Decimal = Decimal(0)
    static: dict[str, Decimal] = field(default_factory=lambda: dict.fromkeys(ALTERNATIVES, Decimal(0)))
    dynamic: Decimal = Decimal(0)
    seconds: Decimal = Decimal(0)
    used_gpu_s: Decimal = Decimal(0)
    mem_used_mb_s: Decimal = Decimal(0)
    sm_used_s: Decimal = Decimal(0)
    static_mem_mb_s: Decimal = Decimal(0)
    static_sm_s: Decimal = Decimal(0)
    dynamic_billed_gpu_s: Decimal = Decimal(0)

    def add(self, other: _Unit) -> None:
        for name in ("static_whole", "dynamic", "seconds", "used_gpu_s", "mem_used_mb_s", "sm_used_s",
                     "static_mem_mb_s", "static_sm_s", "dynamic_billed_gpu_s"):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        for alternative in ALTERNATIVES:
            self.static[alternative] += other.static[alternative]


def _ratio(a: Decimal, b: Decimal) -> float | None:
    return float(a / b) if b else None


def _paired_test(x: list[float], y: list[float]) -> dict[str, Any]:
    n = len(x)
    if n < 2:
        return {"n": n, "mean_saving": None, "ci95": None, "p_value": None, "t": None,
                "note": "fewer than 2 pairs: no test"}
    diffs = [a - b for a, b in zip(x, y, strict=True)]
    mean = sum(diffs) / n
    sd = math.sqrt(sum((d - mean) ** 2 for d in diffs) / (n - 1))
    if sd == 0:
        return {"n": n, "mean_saving": mean, "ci95": [mean, mean], "p_value": 0.0 if mean else 1.0, "t": None,
                "note": "every pair saved the same amount"}
    from scipy import stats  # loads only here: see pyproject.toml (PLC0415)

    result = stats.ttest_rel(x, y)
    half = float(stats.t.ppf(0.975, n - 1)) * sd / math.sqrt(n)
    return {"n": n, "mean_saving": mean, "ci95": [mean - half, mean + half], "p_value": float(result.pvalue),
            "t": float(result.statistic)}


def workload_slices(spans: Sequence[WorkloadSpan]) -> list[WorkloadSlice]:
    """Each workload on each GPU as a static slice for each unbroken run of its minutes: from the
    run's first minute to the minute after its last (a stretch the ledger has no minute of it,
    e.g. its node's agent was down, it held no card; its card held none either), needing the
    larger of its request and its busiest minute in the period, per resource (a resource it did
    not ask for: its busiest minute), the same size in every run as a static pod's size is fixed."""
    return [
        WorkloadSlice(
            key=(w.tenant, w.namespace, w.pod, w.container, w.pod_uid, w.gpu_uuid), model=w.model,
            memory_mb=w.memory_mb, sm_count=w.sm_count, start=first, end=last + _MINUTE,
            mem_mb=max(w.peak_mem_mb, w.requested_mem_mb or Decimal(0)),
            sm=max(w.peak_sm, w.requested_sm or Decimal(0)),
        )
        for w in spans
        for first, last in zip(w.run_firsts, w.run_lasts, strict=True)
    ]


def _fleet_cards(cards: Sequence[CardSpan]) -> list[FleetCard]:
    return [FleetCard(node_id=c.node_id, node=c.node, uuid=c.gpu_uuid, model=c.model, memory_mb=c.memory_mb,
                      sm_count=c.sm_count, start=c.first_minute, end=c.last_minute + _MINUTE) for c in cards]


def compute_paired_report(
    *, start: datetime, end: datetime, now: datetime, progress: Callable[[int], None] = lambda pct: None
) -> dict[str, Any]:
    if end <= start:
        raise ValueError("the period's end must be after its start")
    # Pruned minutes would read as no usage: refuse with the earliest start that has them all.
    require_minutes_retained(start=start, lookback=LOOKBACK)
    rows = list_steady_workload_gpu_days(start=start, end=end, lookback=LOOKBACK, cold_start=COLD_START)
    progress(40)
    busy = get_busy_card_time(start=start, end=end, lookback=LOOKBACK, cold_start=COLD_START)
    spans = list_workload_spans(start=start, end=end)
    cards = _fleet_cards(list_card_spans(start=start, end=end))
    progress(55)
    slices = workload_slices(spans)
    placements = {alternative: place(alternative, cards, slices) for alternative in ALTERNATIVES}
    progress(70)
    organisation = _organisation_view(start=start, end=end, spans=spans, placements=placements)
    progress(80)
    units: dict[tuple[str, str, str, str, str, date], _Unit] = defaultdict(_Unit)
    for r in rows:
        unit = units[(r.tenant, r.namespace, r.pod, r.container, r.pod_uid, r.day)]
        slice_key = (r.tenant, r.namespace, r.pod, r.container, r.pod_uid, r.gpu_uuid)
        unit.dynamic += r.dynamic_cost
        unit.static_whole += r.static_whole_cost
        for alternative, placement in placements.items():
            unit.static[alternative] += r.static_whole_cost * placement.shares.get(slice_key, Decimal(1))
        unit.seconds += r.seconds
        unit.mem_used_mb_s += r.mem_used_mb_s
        unit.sm_used_s += r.sm_used_s
        unit.static_mem_mb_s += r.seconds * r.memory_mb
        unit.static_sm_s += r.seconds * r.sm_count
        unit.used_gpu_s += ALPHA * r.mem_used_mb_s / r.memory_mb + (1 - ALPHA) * r.sm_used_s / r.sm_count
        unit.dynamic_billed_gpu_s += r.dynamic_billed_gpu_s or Decimal(0)
    # Per workload-day figures count the days that were over at `now` only.
    today = now.astimezone(UTC).replace(hour=0, minute=0, second=0, microsecond=0)
    complete_until = min(end, today)
    partial = sorted({k for k in units if k[5] >= today.date()})
    tested = sorted(set(units) - set(partial))
    keys = sorted(units)
    y = [float(units[k].dynamic) for k in tested]
    total = _Unit()
    for u in units.values():
        total.add(u)
    static_billed_gpu_s = total.seconds  # whole cards: one billed GPU-second per present second
    summary = {
        "static_cost": {a: str(total.static[a].quantize(Decimal("0.000001"))) for a in ALTERNATIVES},
        "dynamic_cost": str(total.dynamic.quantize(Decimal("0.000001"))),
        "chargeback_reduction_pct": {a: _reduction(total.dynamic, total.static[a]) for a in ALTERNATIVES},
        "containers_per_card": _ratio(total.seconds, busy.seconds),
        "sm_utilisation_dynamic_pct": _pct(total.sm_used_s, busy.sm_s),
        "sm_utilisation_static_pct": _pct(total.sm_used_s, total.static_sm_s),
        "memory_utilisation_dynamic_pct": _pct(total.mem_used_mb_s, busy.mem_mb_s),
        "memory_utilisation_static_pct": _pct(total.mem_used_mb_s, total.static_mem_mb_s),
        "idle_memory_share_dynamic_pct": _complement(_pct(total.mem_used_mb_s, busy.mem_mb_s)),
        "idle_memory_share_static_pct": _complement(_pct(total.mem_used_mb_s, total.static_mem_mb_s)),
        "resource_optimisation_efficiency": _ratio(
            total.used_gpu_s / total.dynamic_billed_gpu_s if total.dynamic_billed_gpu_s else Decimal(0),
            total.used_gpu_s / static_billed_gpu_s if static_billed_gpu_s else Decimal(0),
        ),
    }
    result = {
        "period": {"start": start.isoformat(), "end": end.isoformat()},
        "as_of": now.isoformat(),
        "currency": get_priced_currency(start=start, end=end),
        "method": {"unit": "workload x UTC day", "cold_start_excluded_minutes": COLD_START.total_seconds() / 60,
                   "lookback_days": LOOKBACK.days, "alpha": str(ALPHA)},
        "n_units": len(keys),
        "workloads": len({k[:5] for k in keys}),
        "per_workload_day": {"complete_until": complete_until.isoformat(), "partial_units_excluded": len(partial),
                             "partial_days_excluded": sorted({k[5].isoformat() for k in partial})},
        **organisation,
        "summary": summary,
        "tests": {a: _paired_test([float(units[k].static[a]) for k in tested], y) for a in ALTERNATIVES},
    }
    progress(100)
    return result


def _organisation_view(*, start: datetime, end: datetime, spans: Sequence[WorkloadSpan],
                       placements: dict[str, Placement]) -> dict[str, Any]:
    """The fleet's cost as run and under each static alternative placed on it, the headline, and
    each tenant's chargeback under each (module docstring), as exact ledger amounts (strings)."""
    fleet = get_fleet_card_cost(start=start, end=end)
    busy = fleet.card_cost - fleet.empty_card_cost
    priced = price_card_time(start=start, end=end, intervals=[
        (alternative, *stretch) for alternative, placement in placements.items() if placement.feasible
        for stretch in placement.occupied])
    alternatives: dict[str, dict[str, Any]] = {}
    costs: dict[str, Decimal] = {}
    for alternative, placement in placements.items():
        card_time = priced.get(alternative)
        if placement.feasible:
            costs[alternative] = card_time.cost if card_time else Decimal(0)
        shortfall = placement.shortfall
        alternatives[alternative] = {
            "feasible": placement.feasible,
            "cost": str(costs[alternative]) if placement.feasible else None,
            "card_hours": str(card_time.seconds / _S_PER_H) if card_time else ("0" if placement.feasible else None),
            "peak_cards": placement.peak_cards,
            "peak_at": placement.peak_at.isoformat() if placement.peak_at else None,
            "fleet_cards_at_peak": placement.fleet_cards_at_peak,
            "shortfall": None if shortfall is None else {
                "at": shortfall.at.isoformat(), "model": shortfall.model, "needed": shortfall.needed,
                "had": shortfall.had},
        }
    baseline = choose_baseline({a: costs.get(a) for a in ALTERNATIVES})
    tenants: dict[str, dict[str, Decimal]] = defaultdict(lambda: defaultdict(Decimal))
    models: dict[tuple[str, ...], str] = {}
    for w in spans:
        key: tuple[str, ...] = (w.tenant, w.namespace, w.pod, w.container, w.pod_uid, w.gpu_uuid)
        models[key] = w.model
        charged = tenants[w.tenant]
        charged["dynamic"] += w.dynamic_cost
        for alternative, placement in placements.items():
            charged[alternative] = charged[alternative] + ledger_amount(w.whole_card_cost * placement.shares[key])
    # The platform holds the rest of each allocation's cost: the idle on busy cards that no tenant
    # was charged (dynamic), the part of the cards a slice left free (static).
    totals = {"dynamic": busy, **costs}
    platform = {a: str(totals[a] - sum((t[a] for t in tenants.values()), Decimal(0))) if a in totals else None
                for a in ("dynamic", *ALTERNATIVES)}
    chargeback_tenants = [{"tenant": tenant, **{a: str(amounts[a]) if a in totals else None
                                                for a in ("dynamic", *ALTERNATIVES)}}
                          for tenant, amounts in sorted(tenants.items())]
    profiles: dict[str, Counter[str]] = defaultdict(Counter)
    for slice_key, name in placements["fixed_profile"].profiles.items():
        profiles[models[slice_key]][name] += 1
    return {
        "fleet": {
            "held": {"busy_cards": str(busy), "empty_cards": str(fleet.empty_card_cost), "total": str(fleet.card_cost),
                     "peak_cards": fleet.peak_cards},
            "dynamic": {"cost": str(busy), "card_hours": str(fleet.busy_seconds / _S_PER_H),
                        "peak_cards": fleet.peak_busy_cards,
                        "peak_at": fleet.peak_busy_at.isoformat() if fleet.peak_busy_at else None,
                        "fleet_cards_at_peak": fleet.cards_at_peak_busy},
            "alternatives": alternatives,
            "baseline": baseline,
            "saving": None if baseline is None else str(costs[baseline] - busy),
            "reduction_pct": None if baseline is None else _reduction(busy, costs[baseline]),
        },
        "chargeback": {"tenants": chargeback_tenants, "platform": platform},
        "profiles": {model: dict(sorted(names.items())) for model, names in sorted(profiles.items())},
    }


def _reduction(dynamic: Decimal, static: Decimal) -> float | None:
    """Cost reduction of dynamic against static, percent (negative: dynamic cost more)."""
    return float((1 - dynamic / static) * 100) if static else None


def _pct(num: Decimal, den: Decimal) -> float | None:
    return float(num / den * 100) if den else None


def _complement(pct: float | None) -> float | None:
    return None if pct is None else 100 - pct
