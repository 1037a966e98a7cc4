"""Ledger rows behind the FOCUS exports: each workload on each GPU per UTC day under the rate
card in effect (hour ledger sums), of one tenant (an invoice's file) or of every tenant (the fleet
dataset); each GPU-day's whole-card cost that split allocation divides (the origin charge); and
the idle each GPU-day leaves to the platform. Priced hours only: unpriced ones cost nothing.

Invoices are kept for good, so these reads answer every day: a day whose hours retention pruned is
read from its day rows (billing.ledger.retention.PRUNED_HOUR_DAYS), every other day from its hours,
in one statement. A pruned day had one rate card per model and one price per GPU all day (retention
keeps the hours of any other day), so its day rows give the rows its hours gave. Only a period that
cuts a pruned day is refused (HoursPruned): a day row cannot be cut.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal

from django.db import connection

from billing.ledger.energy import co2e_sql, energy_cost_sql, energy_rate_join
from billing.ledger.reads import fetch_rows
from billing.ledger.retention import PRUNED_HOUR_DAYS, require_hours_where_days_cannot_answer

__all__ = ["FleetFocusLedgerRow", "FocusLedgerRow", "OriginCost", "PlatformIdleRow", "list_fleet_focus_ledger_rows",
           "list_focus_ledger_rows", "list_origin_costs", "list_platform_idle"]


@dataclass(frozen=True)
class FocusLedgerRow:
    """One workload on one GPU for one UTC day under one rate card (hour ledger sums)."""

    day: datetime
    gpu_uuid: str
    gpu_model: str
    node: str
    namespace: str
    pod: str
    container: str
    pod_uid: str
    sla_tier: str
    rate_card_id: int | None
    price_per_gpu_hour: Decimal
    alpha: Decimal
    billed_basis: str
    idle_policy: str
    memory_mb: int | None  # from the GPU inventory; None for a GPU it no longer holds
    sm_count: int | None
    mem_billed_mb_s: Decimal
    sm_billed_s: Decimal
    share_gpu_s: Decimal
    charge: Decimal
    idle_share: Decimal
    energy_j: Decimal  # attributed to the workload (its share and any idle spread onto it)
    # Σ joules × price per kWh (× kg CO2e per kWh) of its node's location on each hour's date; None where
    # some energy had none (billing.ledger.energy).
    energy_cost_jp: Decimal | None
    co2e_jkg: Decimal | None

    @property
    def origin_key(self) -> tuple[datetime, str, int | None]:
        return (self.day, self.gpu_uuid, self.rate_card_id)


# The rate card of an hour is the latest one that overlaps it (an hour that straddles a price
# change is shown at the new unit price; its ledger amounts are exact either way). A pruned day's
# rows take its first hour's card: no card of its models began or ended inside it.
def _card_of(at: str) -> str:
    return (
        "LEFT JOIN LATERAL (SELECT r.id, r.price_per_gpu_hour, r.alpha, r.billed_basis, r.idle_policy "  # noqa: S608 - constant SQL
        f"FROM billing_ratecard r WHERE r.gpu_model = g.gpu_model AND r.effective_from < g.{at} + interval '1 hour' "
        f"AND (r.effective_to IS NULL OR r.effective_to > g.{at}) ORDER BY r.effective_from DESC LIMIT 1) rc ON true "
    )


@dataclass(frozen=True)
class _Ledger:
    """The tables and time column of one grain: hours, or the days whose hours were pruned."""

    usage: str
    gpu: str
    at: str
    # The rows of [%(start)s, %(end)s) this grain answers, on table alias `alias`.
    period: str

    def of_period(self, alias: str) -> str:
        return self.period.replace("{a}", alias)


_HOURS = _Ledger("billing_usagehour", "billing_gpuhour", "hour", "{a}.hour >= %(start)s AND {a}.hour < %(end)s ")
_DAYS = _Ledger("billing_usageday", "billing_gpuday", "day",
                "{a}.day >= %(start)s AND {a}.day < %(end)s AND {a}.day IN (SELECT day FROM pruned) ")
_WITH_PRUNED = f"WITH pruned AS ({PRUNED_HOUR_DAYS}) "


def _per_day(select: Callable[[_Ledger], str], order: str) -> str:
    """The hours' rows and the pruned days' rows of one grouped SELECT, in one statement."""
    return f"{_WITH_PRUNED}{select(_HOURS)} UNION ALL {select(_DAYS)} ORDER BY {order}"


# Where no card is in effect any more, a rate card's defaults (docs/design.md, Billing semantics: α 0.5, billed max,
# idle to the platform) and a zero unit price describe the row.
def _focus_columns(at: str) -> str:
    return (
        f"date_trunc('day', u.{at}) AS day, u.gpu_uuid, g.gpu_model, n.name AS node, u.namespace, u.pod, "
        "u.container, u.pod_uid, u.sla_tier, rc.id AS rate_card_id, "
        "coalesce(rc.price_per_gpu_hour, 0) AS price_per_gpu_hour, coalesce(rc.alpha, 0.5) AS alpha, "
        "coalesce(rc.billed_basis, 'max') AS billed_basis, coalesce(rc.idle_policy, 'platform') AS idle_policy, "
        "gpu.memory_mb, gpu.sm_count, sum(u.mem_billed_mb_s) AS mem_billed_mb_s, sum(u.sm_billed_s) AS sm_billed_s, "
        "sum(u.share_gpu_s) AS share_gpu_s, sum(u.charge) AS charge, sum(u.idle_share) AS idle_share, "
        f"sum(u.energy_j) AS energy_j, {energy_cost_sql()} AS energy_cost_jp, {co2e_sql()} AS co2e_jkg "
    )


def _focus_from(ledger: _Ledger) -> str:
    return (
        f"FROM {ledger.usage} u JOIN {ledger.gpu} g ON g.node_id = u.node_id AND g.gpu_uuid = u.gpu_uuid "
        f"AND g.{ledger.at} = u.{ledger.at} "
        "JOIN billing_node n ON n.id = u.node_id LEFT JOIN billing_gpu gpu ON gpu.uuid = u.gpu_uuid "
        + _card_of(ledger.at) + energy_rate_join("u", ledger.at)
        + "WHERE " + ledger.of_period("u") + "AND g.priced "
    )


def _focus_rows(ledger: _Ledger) -> str:
    return ("SELECT " + _focus_columns(ledger.at) + _focus_from(ledger)
            + "AND u.tenant = %(tenant)s GROUP BY 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16")


_FOCUS_ROWS = _per_day(_focus_rows, "1, 2, 5, 6, 7, 8, 9, 10")


def list_focus_ledger_rows(*, tenant: str, start: datetime, end: datetime) -> list[FocusLedgerRow]:
    """The tenant's priced usage in [start, end), per (day, GPU, workload, card), in that order."""
    require_hours_where_days_cannot_answer(start=start, end=end)
    with connection.cursor() as cur:
        cur.execute(_FOCUS_ROWS, {"tenant": tenant, "start": start, "end": end})
        return fetch_rows(cur, FocusLedgerRow)


@dataclass(frozen=True)
class OriginCost:
    """One GPU's priced hours of one UTC day under one rate card."""

    day: datetime
    gpu_uuid: str
    rate_card_id: int | None
    card_cost: Decimal
    metered_seconds: Decimal

    @property
    def key(self) -> tuple[datetime, str, int | None]:
        return (self.day, self.gpu_uuid, self.rate_card_id)


def _origin_costs(ledger: _Ledger) -> str:
    return (
        f"SELECT date_trunc('day', g.{ledger.at}) AS day, g.gpu_uuid, rc.id AS rate_card_id, "  # noqa: S608 - constant SQL
        f"sum(g.card_cost) AS card_cost, sum(g.metered_seconds) AS metered_seconds FROM {ledger.gpu} g "
        + _card_of(ledger.at)
        + "WHERE " + ledger.of_period("g") + "AND g.priced AND g.gpu_uuid = ANY(%(gpus)s) GROUP BY 1, 2, 3"
    )


_ORIGIN_COSTS = _per_day(_origin_costs, "1, 2, 3")


def list_origin_costs(*, start: datetime, end: datetime, gpus: Iterable[str]) -> list[OriginCost]:
    """The origin charge of these GPUs per (day, GPU, card) in [start, end)."""
    require_hours_where_days_cannot_answer(start=start, end=end)
    with connection.cursor() as cur:
        cur.execute(_ORIGIN_COSTS, {"start": start, "end": end, "gpus": sorted(set(gpus))})
        return fetch_rows(cur, OriginCost)


@dataclass(frozen=True)
class FleetFocusLedgerRow(FocusLedgerRow):
    """A FocusLedgerRow of any tenant, with the tenant and the currency its hours were priced in."""

    tenant: str
    currency: str


# The same rows as an invoice's, for every tenant; the currency is the GPU-hour's (its rate card's).
def _fleet_focus_rows(ledger: _Ledger) -> str:
    return ("SELECT " + _focus_columns(ledger.at) + ", u.tenant, g.currency " + _focus_from(ledger)
            + "GROUP BY 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 25, 26")


_FLEET_FOCUS_ROWS = _per_day(_fleet_focus_rows, "25, 1, 2, 5, 6, 7, 8, 9, 10")


def list_fleet_focus_ledger_rows(*, start: datetime, end: datetime) -> list[FleetFocusLedgerRow]:
    """Every tenant's priced usage in [start, end), per (tenant, day, GPU, workload, card)."""
    require_hours_where_days_cannot_answer(start=start, end=end)
    with connection.cursor() as cur:
        cur.execute(_FLEET_FOCUS_ROWS, {"start": start, "end": end})
        return fetch_rows(cur, FleetFocusLedgerRow)


@dataclass(frozen=True)
class PlatformIdleRow:
    """The idle one GPU leaves to the platform on one node, one UTC day, under one rate card: Σ of
    its priced hours' idle_cost − idle_allocated (everything under the `platform` idle policy, the
    rounding remainder under `proportional`), with the GPU-day's whole-card cost beside it."""

    day: datetime
    gpu_uuid: str
    gpu_model: str
    node: str
    rate_card_id: int | None
    price_per_gpu_hour: Decimal
    idle_policy: str
    currency: str
    idle: Decimal
    card_cost: Decimal
    metered_seconds: Decimal
    idle_energy_j: Decimal  # the energy no workload is attributed
    energy_cost_jp: Decimal | None  # Σ its joules × its location's price per kWh (None: some had no price)
    co2e_jkg: Decimal | None  # Σ its joules × kg CO2e per kWh (None: some had no factor)


def _platform_idle(ledger: _Ledger) -> str:
    return (
        f"SELECT date_trunc('day', g.{ledger.at}) AS day, g.gpu_uuid, g.gpu_model, n.name AS node, "  # noqa: S608 - constant SQL
        "rc.id AS rate_card_id, coalesce(rc.price_per_gpu_hour, 0) AS price_per_gpu_hour, "
        "coalesce(rc.idle_policy, 'platform') AS idle_policy, "
        "g.currency, sum(g.idle_cost - g.idle_allocated) AS idle, sum(g.card_cost) AS card_cost, "
        "sum(g.metered_seconds) AS metered_seconds, sum(g.idle_energy_j) AS idle_energy_j, "
        f"{energy_cost_sql('g', 'idle_energy_j')} AS energy_cost_jp, {co2e_sql('g', 'idle_energy_j')} AS co2e_jkg "
        f"FROM {ledger.gpu} g JOIN billing_node n ON n.id = g.node_id "
        + _card_of(ledger.at) + energy_rate_join("g", ledger.at)
        + "WHERE " + ledger.of_period("g") + "AND g.priced GROUP BY 1, 2, 3, 4, 5, 6, 7, 8"
    )


_PLATFORM_IDLE = _per_day(_platform_idle, "1, 2, 4, 5")


def list_platform_idle(*, start: datetime, end: datetime) -> list[PlatformIdleRow]:
    """Every GPU-day's platform idle in [start, end), zero ones included (the caller decides)."""
    require_hours_where_days_cannot_answer(start=start, end=end)
    with connection.cursor() as cur:
        cur.execute(_PLATFORM_IDLE, {"start": start, "end": end})
        return fetch_rows(cur, PlatformIdleRow)
