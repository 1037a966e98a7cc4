"""A paired report's stored result, written by hand for tests of what shows it (the dashboard's
card, the PDF): the shape `compute_paired_report` stores, with the figures a test chooses. The
headline's baseline is chosen by the report's own rule (`choose_baseline`)."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

from billing.services.savings.static_alternatives import ALTERNATIVES, choose_baseline

A100 = "NVIDIA A100-SXM4-80GB"


def report_result(*, costs: dict[str, str | None], dynamic: str, empty: str = "0", fleet_cards: int = 24,
                  mean: float | None = 4.5, n: int = 12, p_value: float | None = 0.0004,
                  tenants: dict[str, dict[str, str]] | None = None, currency: str = "USD") -> dict[str, Any]:
    """`costs`: each static alternative's cost on the fleet (None: not feasible, one card short);
    `dynamic`: dynamic allocation's; `tenants`: slug -> {"dynamic": ..., alternative: ...}. The
    paired test of every alternative has the same `mean` (± 1 for its interval)."""
    tenants = tenants or {}
    busy = Decimal(dynamic)
    exact = {a: None if c is None else Decimal(c) for a, c in costs.items()}
    baseline = choose_baseline(exact)
    chosen = exact[baseline] if baseline else None
    alternatives = {
        a: {"feasible": cost is not None, "cost": None if cost is None else str(cost),
            "card_hours": None if cost is None else "1", "peak_cards": fleet_cards + (cost is None),
            "peak_at": "2026-11-01T00:00:00+00:00", "fleet_cards_at_peak": fleet_cards,
            "shortfall": None if cost is not None else {"at": "2026-11-01T00:00:00+00:00", "model": A100,
                                                        "needed": fleet_cards + 1, "had": fleet_cards}}
        for a, cost in exact.items()}
    rows = [{"tenant": t, "dynamic": v["dynamic"], **{a: v.get(a) if exact[a] is not None else None
                                                       for a in ALTERNATIVES}} for t, v in sorted(tenants.items())]

    def rest(allocation: str, total: Decimal | None) -> str | None:
        return None if total is None else str(total - sum((Decimal(r[allocation] or 0) for r in rows), Decimal(0)))

    test = {"n": n, "mean_saving": mean, "ci95": None if mean is None else [mean - 1, mean + 1], "p_value": p_value,
            "t": None}
    return {
        "currency": currency,
        "method": {"unit": "workload x UTC day", "cold_start_excluded_minutes": 5.0, "lookback_days": 7,
                   "alpha": "0.5"},
        "per_workload_day": {"complete_until": "2026-12-01T00:00:00+00:00", "partial_units_excluded": 0,
                             "partial_days_excluded": []},
        "fleet": {
            "held": {"busy_cards": dynamic, "empty_cards": empty, "total": str(busy + Decimal(empty)),
                     "peak_cards": fleet_cards},
            "dynamic": {"cost": dynamic, "card_hours": "1", "peak_cards": fleet_cards},
            "alternatives": alternatives,
            "baseline": baseline,
            "saving": None if chosen is None else str(chosen - busy),
            "reduction_pct": None if chosen is None else float((1 - busy / chosen) * 100),
        },
        "chargeback": {"tenants": rows, "platform": {"dynamic": rest("dynamic", busy),
                                                     **{a: rest(a, exact[a]) for a in ALTERNATIVES}}},
        "profiles": {},
        "summary": {"static_cost": dict.fromkeys(ALTERNATIVES, "100"), "dynamic_cost": "50",
                    "chargeback_reduction_pct": dict.fromkeys(ALTERNATIVES, 50.0), "containers_per_card": 2.8,
                    "sm_utilisation_static_pct": 12, "sm_utilisation_dynamic_pct": 60,
                    "memory_utilisation_static_pct": 20, "memory_utilisation_dynamic_pct": 90,
                    "idle_memory_share_static_pct": 80, "idle_memory_share_dynamic_pct": 10,
                    "resource_optimisation_efficiency": 2.2},
        "tests": {a: dict(test) for a in ALTERNATIVES},
    }
