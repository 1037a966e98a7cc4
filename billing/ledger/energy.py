"""Energy priced and its emissions, in the ledger's reads (docs/billing.md, Energy).

Each usage row of a node-hour (or a node-day: a row of the day ledger) is joined to its node's
location on the row's UTC date and that location's rate on the same date (billing.models.Location,
LocationRate, NodeLocation: dates are whole UTC days, so every hour of a day has one rate and the
day ledger's row is the sum of its hours' rows, priced alike). The reads sum joules × price per kWh
and joules × kg per kWh, exact; callers divide by 3.6 MJ per kWh and round once (billing.money).

A sum is unknown (NULL) where any of its rows drew energy at a node-date with no price (or no
factor): a location not set, or a rate without the figure. Rows that drew no energy never make it
unknown. Energy cost is information beside the GPU cost: no invoice reads it.
"""

from __future__ import annotations

from decimal import Decimal

from billing.models.fleet import LocationRate, NodeLocation

__all__ = ["J_PER_KWH", "co2e_sql", "energy_cost_sql", "energy_rate_join"]

J_PER_KWH = Decimal(3_600_000)
_NODE_LOCATION = NodeLocation._meta.db_table
_RATE = LocationRate._meta.db_table


def energy_rate_join(usage: str, at: str) -> str:
    """LEFT JOINs giving each row of `usage` (alias) its location's rate as `er` (price_per_kwh,
    co2e_kg_per_kwh; NULLs where none), on the UTC date of its column `at`."""
    day = f"({usage}.{at} AT TIME ZONE 'UTC')::date"
    return (
        f" LEFT JOIN LATERAL (SELECT nl.location_id FROM {_NODE_LOCATION} nl "  # noqa: S608 - fixed SQL
        f"WHERE nl.node_id = {usage}.node_id AND nl.effective_from <= {day} "
        "ORDER BY nl.effective_from DESC LIMIT 1) nl ON TRUE "
        f"LEFT JOIN LATERAL (SELECT r.price_per_kwh, r.co2e_kg_per_kwh FROM {_RATE} r "
        f"WHERE r.location_id = nl.location_id AND r.effective_from <= {day} "
        "ORDER BY r.effective_from DESC LIMIT 1) er ON TRUE "
    )


def _known_sum(usage: str, energy: str, factor: str) -> str:
    return (f"CASE WHEN bool_and({usage}.{energy} = 0 OR er.{factor} IS NOT NULL) "
            f"THEN sum({usage}.{energy} * coalesce(er.{factor}, 0)) END")


def energy_cost_sql(usage: str = "u", energy: str = "energy_j") -> str:
    """Σ joules × price per kWh of the group, NULL where any energy had no price."""
    return _known_sum(usage, energy, "price_per_kwh")


def co2e_sql(usage: str = "u", energy: str = "energy_j") -> str:
    """Σ joules × kg CO2e per kWh of the group, NULL where any energy had no factor."""
    return _known_sum(usage, energy, "co2e_kg_per_kwh")
