"""The paired static-vs-dynamic cost report (definitions in docs/billing.md).

Unit: one workload (tenant/namespace/pod/container/pod UID) on one UTC day. For each unit:
  x  = static whole-card cost: every GPU-second the workload was present, at the card's price
  x' = static fixed-profile cost: the same seconds on the smallest A100-style MIG profile
       whose memory holds the workload's peak memory (minute means) on that card
  y  = dynamic cost: what the ledger charged (usage charge + any idle spread onto it)
Cold start: a workload's first COLD_START minutes (from the first minute it appears in the
ledger, looking back LOOKBACK before the period) are excluded from every figure of the paired test.
Paired t-test (scipy.stats.ttest_rel) of x against y: mean saving, 95 % CI, p-value, n, over the
complete workload-days only: the UTC days that were over when the report was computed (a report
that reaches today leaves today's workload-days out of every per-workload-day figure).

The organisation's view (`fleet`, `chargeback`), every priced GPU-minute of the period, cold start
included, since the organisation pays for those minutes too:
  fleet cost, whole-card = Σ over workloads of every second on its own card at that card's price
                           + the cost of the card-minutes no workload was on (held either way)
  fleet cost, dynamic    = the cost of every card-minute the fleet held, busy or idle
  chargeback per tenant  = the tenant's workloads priced whole-card, and what the ledger charged
                           (charge + idle spread onto it); the platform row is the rest: the empty
                           cards under whole-card, the idle nobody was charged for under dynamic.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal
from typing import Any

from scipy import stats

from billing.ledger.minutes import (
    get_busy_card_time,
    get_fleet_card_cost,
    list_steady_workload_gpu_days,
    list_tenant_card_costs,
)
from billing.ledger.retention import require_minutes_retained
from billing.ledger.totals import get_priced_currency
from billing.money import ledger_amount

__all__ = ["COLD_START", "LOOKBACK", "PROFILES", "compute_paired_report", "profile_fraction"]

COLD_START = timedelta(minutes=5)
LOOKBACK = timedelta(days=7)
ALPHA = Decimal("0.5")
# (compute slices of 7, share of the card's memory): A100 80GB 1g.10gb, 2g.20gb, 3g.40gb,
# 4g.40gb, 7g.80gb. A profile is priced at its share of compute slices (k/7 of the card).
PROFILES: tuple[tuple[int, Decimal], ...] = (
    (1, Decimal(1) / 8), (2, Decimal(2) / 8), (3, Decimal(4) / 8), (4, Decimal(4) / 8), (7, Decimal(1)),
)


def profile_fraction(*, peak_mem_mb: Decimal, memory_mb: int) -> Decimal:
    """Price fraction of the card for the smallest profile whose memory holds the peak."""
    for slices, mem_share in PROFILES:
        if peak_mem_mb <= mem_share * memory_mb:
            return Decimal(slices) / 7
    return Decimal(1)


@dataclass
class _Unit:
    static_whole: Decimal = Decimal(0)
    static_profile: Decimal = Decimal(0)
    dynamic: Decimal = Decimal(0)
    seconds: Decimal = Decimal(0)
    used_gpu_s: Decimal = Decimal(0)
    mem_used_mb_s: Decimal = Decimal(0)
    sm_used_s: Decimal = Decimal(0)
    static_mem_mb_s: Decimal = Decimal(0)
    static_sm_s: Decimal = Decimal(0)
    dynamic_billed_gpu_s: Decimal = Decimal(0)


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
    result = stats.ttest_rel(x, y)
    half = float(stats.t.ppf(0.975, n - 1)) * sd / math.sqrt(n)
    return {"n": n, "mean_saving": mean, "ci95": [mean - half, mean + half], "p_value": float(result.pvalue),
            "t": float(result.statistic)}


def compute_paired_report(
    *, start: datetime, end: datetime, now: datetime, progress: Callable[[int], None] = lambda pct: None
) -> dict[str, Any]:
    if end <= start:
        raise ValueError("the period's end must be after its start")
    # Pruned minutes would read as no usage: refuse with the earliest start that has them all.
    require_minutes_retained(start=start, lookback=LOOKBACK)
    units: dict[tuple[str, str, str, str, str, date], _Unit] = defaultdict(_Unit)
    rows = list_steady_workload_gpu_days(start=start, end=end, lookback=LOOKBACK, cold_start=COLD_START)
    progress(60)
    busy = get_busy_card_time(start=start, end=end, lookback=LOOKBACK, cold_start=COLD_START)
    workloads_by_day: dict[date, set[tuple[str, ...]]] = defaultdict(set)
    for r in rows:
        unit = units[(r.tenant, r.namespace, r.pod, r.container, r.pod_uid, r.day)]
        unit.dynamic += r.dynamic_cost
        unit.static_whole += r.static_whole_cost
        unit.static_profile += r.static_whole_cost * profile_fraction(peak_mem_mb=r.peak_mem_mb,
                                                                      memory_mb=r.memory_mb)
        unit.seconds += r.seconds
        unit.mem_used_mb_s += r.mem_used_mb_s
        unit.sm_used_s += r.sm_used_s
        unit.static_mem_mb_s += r.seconds * r.memory_mb
        unit.static_sm_s += r.seconds * r.sm_count
        unit.used_gpu_s += ALPHA * r.mem_used_mb_s / r.memory_mb + (1 - ALPHA) * r.sm_used_s / r.sm_count
        unit.dynamic_billed_gpu_s += r.dynamic_billed_gpu_s or Decimal(0)
        workloads_by_day[r.day].add((r.tenant, r.namespace, r.pod, r.container, r.pod_uid))
    progress(70)
    organisation = _organisation_view(start=start, end=end)
    progress(80)
    # Per workload-day figures count the days that were over at `now` only.
    today = now.astimezone(UTC).replace(hour=0, minute=0, second=0, microsecond=0)
    complete_until = min(end, today)
    partial = sorted({k for k in units if k[5] >= today.date()})
    tested = sorted(set(units) - set(partial))
    keys = sorted(units)
    x = [float(units[k].static_whole) for k in tested]
    xp = [float(units[k].static_profile) for k in tested]
    y = [float(units[k].dynamic) for k in tested]
    total = _Unit()
    for u in units.values():
        for f in ("static_whole", "static_profile", "dynamic", "seconds", "used_gpu_s", "mem_used_mb_s",
                  "sm_used_s", "static_mem_mb_s", "static_sm_s", "dynamic_billed_gpu_s"):
            setattr(total, f, getattr(total, f) + getattr(u, f))
    static_billed_gpu_s = total.seconds  # whole cards: one billed GPU-second per present second
    summary = {
        "static_whole_cost": str(total.static_whole.quantize(Decimal("0.000001"))),
        "static_profile_cost": str(total.static_profile.quantize(Decimal("0.000001"))),
        "dynamic_cost": str(total.dynamic.quantize(Decimal("0.000001"))),
        "cost_reduction_pct": _reduction(total.dynamic, total.static_whole),
        "cost_reduction_vs_profile_pct": _reduction(total.dynamic, total.static_profile),
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
        "test_whole_vs_dynamic": _paired_test(x, y),
        "test_profile_vs_dynamic": _paired_test(xp, y),
    }
    progress(100)
    return result


def _organisation_view(*, start: datetime, end: datetime) -> dict[str, Any]:
    """The fleet's cost under whole-card and dynamic allocation, and each tenant's chargeback under
    both (module docstring), as exact ledger amounts (strings); parts add to the totals exactly."""
    fleet = get_fleet_card_cost(start=start, end=end)
    tenants = list_tenant_card_costs(start=start, end=end)
    whole_card = {t.tenant: ledger_amount(t.whole_card_cost) for t in tenants}
    workload_cards = sum(whole_card.values(), Decimal(0))
    charged = sum((t.dynamic_cost for t in tenants), Decimal(0))
    busy = fleet.card_cost - fleet.empty_card_cost
    whole_total = workload_cards + fleet.empty_card_cost
    return {
        "fleet": {
            "whole_card": {"workload_cards": str(workload_cards), "empty_cards": str(fleet.empty_card_cost),
                           "total": str(whole_total)},
            "dynamic": {"busy_cards": str(busy), "empty_cards": str(fleet.empty_card_cost),
                        "total": str(fleet.card_cost)},
            "saving": str(whole_total - fleet.card_cost),
            "reduction_pct": _reduction(fleet.card_cost, whole_total),
        },
        "chargeback": {
            "tenants": [{"tenant": t.tenant, "whole_card": str(whole_card[t.tenant]),
                         "dynamic": str(t.dynamic_cost)} for t in tenants],
            # Under whole cards the platform holds the empty cards; under dynamic, the idle that was
            # not spread onto a tenant.
            "platform": {"whole_card": str(fleet.empty_card_cost), "dynamic": str(fleet.card_cost - charged)},
        },
    }


def _reduction(dynamic: Decimal, static: Decimal) -> float | None:
    """Cost reduction of dynamic against static, percent."""
    return float((1 - dynamic / static) * 100) if static else None


def _pct(num: Decimal, den: Decimal) -> float | None:
    return float(num / den * 100) if den else None


def _complement(pct: float | None) -> float | None:
    return None if pct is None else 100 - pct
