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

from datetime import datetime
from decimal import Decimal
from typing import Any

from django.db import connection

from billing.models.fleet import LocationRate, NodeLocation

__all__ = ["J_PER_KWH", "any_energy_rate", "co2e_sql", "energy_cost_sql", "energy_rate_join"]

J_PER_KWH = Decimal(3_600_000)
_NODE_LOCATION = NodeLocation._meta.db_table
_RATE = LocationRate._meta.db_table


# Each node's rate as date ranges [f, t): its location's ranges intersected with that location's rates'
# ranges. A handful of rows, joined to the usage by node (a hash join) rather than looked up row by row.
_RATES_BY_NODE = (
    "SELECT nl.node_id, greatest(nl.f, r.f) AS f, least(nl.t, r.t) AS t, r.price_per_kwh, r.co2e_kg_per_kwh "  # noqa: S608 - fixed SQL
    "FROM (SELECT node_id, location_id, effective_from AS f, coalesce(lead(effective_from) OVER "
    f"(PARTITION BY node_id ORDER BY effective_from), 'infinity'::date) AS t FROM {_NODE_LOCATION}) nl "
    "JOIN (SELECT location_id, price_per_kwh, co2e_kg_per_kwh, effective_from AS f, coalesce(lead(effective_from) "
    f"OVER (PARTITION BY location_id ORDER BY effective_from), 'infinity'::date) AS t FROM {_RATE}) r "
    "ON r.location_id = nl.location_id AND r.f < nl.t AND nl.f < r.t"
)


# Whether any node has a location with a rate: without one, no row has a price or a factor.
_ANY_RATE = (f"SELECT EXISTS (SELECT 1 FROM {_NODE_LOCATION} nl JOIN {_RATE} r "  # noqa: S608 - fixed SQL
             "ON r.location_id = nl.location_id)")
_NO_RATE = " CROSS JOIN (SELECT NULL::numeric AS price_per_kwh, NULL::numeric AS co2e_kg_per_kwh) er "


def any_energy_rate() -> bool:
    """Whether some node has a location with a rate (energy_rate_join's `rates`)."""
    with connection.cursor() as cur:
        cur.execute(_ANY_RATE)
        (found,) = cur.fetchone()
    return bool(found)


def energy_rate_join(usage: str, at: str, *, rates: bool = True, within: dict[str, Any] | None = None) -> str:
    """A LEFT JOIN giving each row of `usage` (alias) its node's rate as `er` (price_per_kwh,
    co2e_kg_per_kwh; NULLs where none), on the UTC date of its column `at`.

    `rates` False (any_energy_rate(), asked by a read as it builds its statement): no node has a
    rate, and `er` is one row of NULLs instead, the same figures without a join and its date test
    per usage row (energy prices are optional, and a fleet that sets none is common; docs/benchmarks.md,
    the hourly sets). A rate set between that question and the read is seen by the next read.

    `within`: the statement's parameters, every row's `at` in [within["start"], within["end"]). The
    rate ranges that meet those dates are read now (_IN_WINDOW: a node's tariffs before the window,
    most nodes have one range in a month or a week, are never probed row by row) and joined as
    arrays put in `within` (an `unnest`), not as the subquery: Postgres keeps a join to a subquery of
    window functions (the ranges' `lead`) and everything above it on the statement's own process,
    while a join to arrays lets it scan, join and aggregate the rows on parallel workers. A week's
    hourly sets at 1,000 GPUs: the statement 2.62-3.29 s -> 1.81-2.10 on the 2-core machine, the
    same rows (docs/benchmarks.md, "Energy rate ranges joined as arrays"). Read on the statement's
    connection: in one snapshot with it where the caller holds one (billing.queries.snapshot)."""
    if not rates:
        return _NO_RATE
    day = f"({usage}.{at} AT TIME ZONE 'UTC')::date"
    if within is None:
        ranges = f"({_RATES_BY_NODE}) er"
    else:
        within.update(_ranges_meeting(within["start"], within["end"]))
        ranges = _RANGES_AS_ARRAYS
    return f" LEFT JOIN {ranges} ON er.node_id = {usage}.node_id AND {day} >= er.f AND {day} < er.t "


# _ranges_meeting's arrays as the rows of `er`.
_RANGES_AS_ARRAYS = ("unnest(%(er_node)s::bigint[], %(er_f)s::date[], %(er_t)s::date[], %(er_price)s::numeric[], "
                     "%(er_co2e)s::numeric[]) er(node_id, f, t, price_per_kwh, co2e_kg_per_kwh)")

# The rate ranges that meet the UTC dates of [%(start)s, %(end)s): a range [f, t) holds a row's date d
# only if f <= d < t, and start's date <= d <= end's date.
_IN_WINDOW = (" AND er.t > (%(start)s::timestamptz AT TIME ZONE 'UTC')::date "
              "AND er.f <= (%(end)s::timestamptz AT TIME ZONE 'UTC')::date")


def _ranges_meeting(start: datetime, end: datetime) -> dict[str, list[Any]]:
    """Each node's rate ranges that meet [start, end)'s dates, as energy_rate_join's array parameters.
    The dates as text: a range open to the future ends at 'infinity', which no Python date holds."""
    with connection.cursor() as cur:
        cur.execute(f"SELECT er.node_id, er.f::text, er.t::text, er.price_per_kwh, er.co2e_kg_per_kwh "  # noqa: S608 - fixed SQL
                    f"FROM ({_RATES_BY_NODE}) er WHERE TRUE{_IN_WINDOW}", {"start": start, "end": end})
        found = cur.fetchall()
    columns = list(zip(*found, strict=True)) if found else [(), (), (), (), ()]
    return {name: list(values) for name, values in zip(("er_node", "er_f", "er_t", "er_price", "er_co2e"), columns,
                                                       strict=True)}


def _known_sum(usage: str, energy: str, factor: str, rates: bool) -> str:
    if not rates:
        # No rate anywhere (energy_rate_join's `rates`): known, and 0, only where no energy was drawn;
        # 0 as the sum of the products would be, at the joules' scale. Postgres computes identical
        # aggregates once (these bool_ands, and the sum beside them), and no product per row.
        return f"CASE WHEN bool_and({usage}.{energy} = 0) THEN sum({usage}.{energy}) * 0 END"
    return (f"CASE WHEN bool_and({usage}.{energy} = 0 OR er.{factor} IS NOT NULL) "
            f"THEN sum({usage}.{energy} * coalesce(er.{factor}, 0)) END")


def energy_cost_sql(usage: str = "u", energy: str = "energy_j", *, rates: bool = True) -> str:
    """Σ joules × price per kWh of the group, NULL where any energy had no price."""
    return _known_sum(usage, energy, "price_per_kwh", rates)


def co2e_sql(usage: str = "u", energy: str = "energy_j", *, rates: bool = True) -> str:
    """Σ joules × kg CO2e per kWh of the group, NULL where any energy had no factor."""
    return _known_sum(usage, energy, "co2e_kg_per_kwh", rates)
