"""Energy priced and its emissions, in the ledger's reads (docs/billing.md, Energy).

Each usage row of a node-hour (or a node-day: a row of the day ledger) is joined to its node's
location on the row's UTC date and that location's rate on the same date (billing.models.Location,
LocationRate, NodeLocation: dates are whole UTC days, so every hour of a day has one rate and the
day ledger's row is the sum of its hours' rows, priced alike). The reads sum joules × price per kWh
and joules × kg per kWh, exact; callers divide by 3.6 MJ per kWh and round once (billing.money).
The grouped reads of a window (the allocation API's) join nothing where the window meets a few
rates: each row's rate is a class, and a group's joules are summed per class (window_energy).

A sum is unknown (NULL) where any of its rows drew energy at a node-date with no price (or no
factor): a location not set, or a rate without the figure. Rows that drew no energy never make it
unknown. Energy cost is information beside the GPU cost: no invoice reads it.
"""

from __future__ import annotations

from datetime import UTC, date, datetime, timedelta
from decimal import Decimal
from typing import Any, NamedTuple

from django.db import connection

from billing.models.fleet import LocationRate, NodeLocation

__all__ = ["J_PER_KWH", "EnergySums", "any_energy_rate", "co2e_sql", "energy_cost_sql", "energy_rate_join",
           "window_energy"]

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
    connection: in one snapshot with it where the caller holds one (billing.queries.snapshot). The
    pages' figure read joins so (its leaves take each row's price); a grouped read of a window needs
    no join where the window meets few rates (window_energy)."""
    if not rates:
        return _NO_RATE
    if within is None:
        return _range_join(usage, at, f"({_RATES_BY_NODE}) er")
    return _arrays_join(usage, at, within, _ranges_meeting(within["start"], within["end"]))


def _range_join(usage: str, at: str, ranges: str) -> str:
    day = _utc_date(usage, at)
    return f" LEFT JOIN {ranges} ON er.node_id = {usage}.node_id AND {day} >= er.f AND {day} < er.t "


def _utc_date(usage: str, at: str) -> str:
    return f"({usage}.{at} AT TIME ZONE 'UTC')::date"


def _arrays_join(usage: str, at: str, within: dict[str, Any], found: list[_Range]) -> str:
    """The ranges `found` joined as arrays put in `within` (energy_rate_join's `within`). The dates
    as text: a range open to the future ends at 'infinity', which no Python date holds."""
    within.update(er_node=[r.node_id for r in found], er_f=[r.f.isoformat() for r in found],
                  er_t=["infinity" if r.t == date.max else r.t.isoformat() for r in found],
                  er_price=[r.price for r in found], er_co2e=[r.co2e for r in found])
    return _range_join(usage, at, _RANGES_AS_ARRAYS)


# _ranges_meeting's arrays as the rows of `er`.
_RANGES_AS_ARRAYS = ("unnest(%(er_node)s::bigint[], %(er_f)s::date[], %(er_t)s::date[], %(er_price)s::numeric[], "
                     "%(er_co2e)s::numeric[]) er(node_id, f, t, price_per_kwh, co2e_kg_per_kwh)")

# The rate ranges that meet the UTC dates of [%(start)s, %(end)s): a range [f, t) holds a row's date d
# only if f <= d < t, and start's date <= d <= end's date.
_IN_WINDOW = (" AND er.t > (%(start)s::timestamptz AT TIME ZONE 'UTC')::date "
              "AND er.f <= (%(end)s::timestamptz AT TIME ZONE 'UTC')::date")


class _Range(NamedTuple):
    """A node's rate from f until t (dates; date.max: no end yet), its price and factor (None: unknown)."""

    node_id: int
    f: date
    t: date
    price: Decimal | None
    co2e: Decimal | None


def _ranges_meeting(start: datetime, end: datetime) -> list[_Range]:
    """Each node's rate ranges that meet [start, end)'s dates. The dates read as text: a range open to
    the future ends at 'infinity', which no Python date holds (read as date.max)."""
    with connection.cursor() as cur:
        cur.execute(f"SELECT er.node_id, er.f::text, er.t::text, er.price_per_kwh, er.co2e_kg_per_kwh "  # noqa: S608 - fixed SQL
                    f"FROM ({_RATES_BY_NODE}) er WHERE TRUE{_IN_WINDOW}", {"start": start, "end": end})
        found = cur.fetchall()
    return [_Range(node, date.fromisoformat(f), date.max if t == "infinity" else date.fromisoformat(t), price, co2e)
            for node, f, t, price, co2e in found]


class EnergySums(NamedTuple):
    """A window read's energy: what its FROM adds (`join`), and its groups' Σ joules × price per kWh
    (`cost`) and × kg CO2e per kWh (`co2e`), NULL where any energy had none (energy_cost_sql's)."""

    join: str
    cost: str
    co2e: str


def window_energy(usage: str, at: str, energy: str, *, rates: bool, within: dict[str, Any]) -> EnergySums:
    """The energy sums of a grouped read of `usage` (alias) over [within["start"], within["end"]),
    `energy` its joules' column, `rates` as energy_rate_join's.

    Where the rates that meet the window are few (_MAX_CLASSES distinct prices and factors, in a
    few date segments), no join: each row's rate is a class, an integer looked up by its node id in
    an array per date segment (_rate_classes), and a group's Σ joules × price is Σ over the classes
    of the class's price × the group's joules of that class, summed per class (FILTER), exact as the
    products per row (numeric arithmetic adds and multiplies without rounding). The join of every
    row to its node's ranges and a product per row were 0.23-0.27 s of a week's hourly sets at 1,000
    GPUs (1.16-1.20 -> 0.93 s; docs/benchmarks.md, "Energy rates as classes"); a price looked up per
    row without the join gained nothing. Else the ranges are joined as arrays (energy_rate_join's
    `within`)."""
    if not rates:
        return EnergySums("", energy_cost_sql(usage, energy, rates=False), co2e_sql(usage, energy, rates=False))
    found = _ranges_meeting(within["start"], within["end"])
    classes = _rate_classes(usage, at, within, found)
    if classes is None:
        return EnergySums(_arrays_join(usage, at, within, found), energy_cost_sql(usage, energy),
                          co2e_sql(usage, energy))
    segments, prices, factors = classes
    return EnergySums(f" CROSS JOIN LATERAL (SELECT {segments} AS rate_class) erc ",
                      _class_sum(usage, energy, prices, "rc_price", within),
                      _class_sum(usage, energy, factors, "rc_co2e", within))


# At most this many distinct (price, factor) pairs among the ranges a window meets: each class is a
# FILTER per group that evaluates the row's class again, and at 8 the week's hourly statement gained
# only a tenth over the join (2: a quarter; docs/benchmarks.md, "Energy rates as classes"). A fleet
# prices its sites in a handful of tariffs. And at most this many array elements (nodes x date
# segments) written into the statement. Beyond either, the arrays' join.
_MAX_CLASSES = 8
_MAX_ELEMENTS = 100_000


def _rate_classes(usage: str, at: str, within: dict[str, Any],
                  found: list[_Range]) -> tuple[str, list[Decimal | None], list[Decimal | None]] | None:
    """Each row's rate class as SQL (0: no range, no price nor factor; k >= 1: the k-th distinct
    pair), and each class's price and factor, or None where the window's ranges are too many.

    The window's dates are cut at every range's start and end inside it, so no range starts or
    ends inside a segment: each node has one class per segment, an element of that segment's array
    of classes indexed by node id."""
    first = within["start"].astimezone(UTC).date()
    last = (within["end"] - timedelta(microseconds=1)).astimezone(UTC).date()
    cuts = sorted({d for r in found for d in (r.f, r.t) if first < d <= last})
    pairs = list(dict.fromkeys((r.price, r.co2e) for r in found))
    top = max((r.node_id for r in found), default=0)
    if len(pairs) > _MAX_CLASSES or top * (len(cuts) + 1) > _MAX_ELEMENTS or any(r.node_id < 1 for r in found):
        return None
    arrays = [[0] * top for _ in range(len(cuts) + 1)]
    for r in found:
        pair = pairs.index((r.price, r.co2e)) + 1
        for i, begins in enumerate([first, *cuts]):
            if r.f <= begins < r.t:
                arrays[i][r.node_id - 1] = pair
    lookups = []
    for i, array in enumerate(arrays):
        within[f"rc_{i}"] = array
        lookups.append(f"(%(rc_{i})s::int[])[{usage}.node_id]")
    day = _utc_date(usage, at)
    cases = []
    for i, cut in enumerate(cuts):
        within[f"rc_cut_{i}"] = cut
        cases.append(f"WHEN {day} < %(rc_cut_{i})s::date THEN {lookups[i]}")
    lookup = f"CASE {' '.join(cases)} ELSE {lookups[-1]} END" if cases else lookups[0]
    # A node beyond the arrays (no range in the window) is class 0.
    return f"coalesce({lookup}, 0)", [p for p, _ in pairs], [c for _, c in pairs]


def _class_sum(usage: str, energy: str, values: list[Decimal | None], name: str, within: dict[str, Any]) -> str:
    """Σ joules × the class's value over a group, NULL where a class without one drew energy."""
    unknown = ", ".join(["0", *(str(k) for k, v in enumerate(values, 1) if v is None)])
    terms = [f"sum({usage}.{energy}) * 0"]  # 0 at the joules' scale where no class has a value
    for k, value in enumerate(values, 1):
        if value is not None:
            within[f"{name}_{k}"] = value
            terms.append(f"coalesce(sum({usage}.{energy}) FILTER (WHERE erc.rate_class = {k}), 0) * %({name}_{k})s")
    return (f"CASE WHEN coalesce(bool_and({usage}.{energy} = 0) FILTER (WHERE erc.rate_class IN ({unknown})), true) "
            f"THEN {' + '.join(terms)} END")


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
