"""Ledger rows behind the FOCUS exports: each workload on each GPU per UTC day under the rate
card in effect (hour ledger sums), of one tenant (an invoice's file) or of every tenant (the fleet
dataset); each GPU-day's whole-card cost that split allocation divides (the origin charge); and
the idle each GPU-day leaves to the platform. Priced hours only: unpriced ones cost nothing.
Each read is refused (HoursPruned) for a period starting before the earliest hour kept.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal

from django.db import connection

from billing.ledger.energy import co2e_sql, energy_cost_sql, energy_rate_join
from billing.ledger.reads import fetch_rows
from billing.ledger.retention import require_hours_retained

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
# change is shown at the new unit price; its ledger amounts are exact either way).
_CARD_OF_HOUR = (
    "LEFT JOIN LATERAL (SELECT r.id, r.price_per_gpu_hour, r.alpha, r.billed_basis, r.idle_policy "
    "FROM billing_ratecard r WHERE r.gpu_model = g.gpu_model AND r.effective_from < g.hour + interval '1 hour' "
    "AND (r.effective_to IS NULL OR r.effective_to > g.hour) ORDER BY r.effective_from DESC LIMIT 1) rc ON true "
)

# Where no card is in effect any more, a rate card's defaults (docs/design.md, Billing semantics: α 0.5, billed max,
# idle to the platform) and a zero unit price describe the row.
_FOCUS_COLUMNS = (
    "date_trunc('day', u.hour) AS day, u.gpu_uuid, g.gpu_model, n.name AS node, u.namespace, u.pod, "
    "u.container, u.pod_uid, u.sla_tier, rc.id AS rate_card_id, "
    "coalesce(rc.price_per_gpu_hour, 0) AS price_per_gpu_hour, coalesce(rc.alpha, 0.5) AS alpha, "
    "coalesce(rc.billed_basis, 'max') AS billed_basis, coalesce(rc.idle_policy, 'platform') AS idle_policy, "
    "gpu.memory_mb, gpu.sm_count, sum(u.mem_billed_mb_s) AS mem_billed_mb_s, sum(u.sm_billed_s) AS sm_billed_s, "
    "sum(u.share_gpu_s) AS share_gpu_s, sum(u.charge) AS charge, sum(u.idle_share) AS idle_share, "
    f"sum(u.energy_j) AS energy_j, {energy_cost_sql()} AS energy_cost_jp, {co2e_sql()} AS co2e_jkg "
)
_FOCUS_FROM = (
    "FROM billing_usagehour u JOIN billing_gpuhour g ON g.node_id = u.node_id AND g.gpu_uuid = u.gpu_uuid AND g.hour = u.hour "
    "JOIN billing_node n ON n.id = u.node_id LEFT JOIN billing_gpu gpu ON gpu.uuid = u.gpu_uuid "
    + _CARD_OF_HOUR + energy_rate_join("u", "hour")
)
_FOCUS_ROWS = (
    "SELECT " + _FOCUS_COLUMNS + _FOCUS_FROM
    + "WHERE u.tenant = %s AND u.hour >= %s AND u.hour < %s AND g.priced "
    "GROUP BY 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16 ORDER BY 1, 2, 5, 6, 7, 8, 9, 10"
)


def list_focus_ledger_rows(*, tenant: str, start: datetime, end: datetime) -> list[FocusLedgerRow]:
    """The tenant's priced usage in [start, end), per (day, GPU, workload, card), in that order."""
    require_hours_retained(start=start)
    with connection.cursor() as cur:
        cur.execute(_FOCUS_ROWS, [tenant, start, end])
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


_ORIGIN_COSTS = (
    "SELECT date_trunc('day', g.hour) AS day, g.gpu_uuid, rc.id AS rate_card_id, "  # noqa: S608 - constant SQL
    "sum(g.card_cost) AS card_cost, sum(g.metered_seconds) AS metered_seconds FROM billing_gpuhour g "
    + _CARD_OF_HOUR
    + "WHERE g.hour >= %s AND g.hour < %s AND g.priced AND g.gpu_uuid = ANY(%s) GROUP BY 1, 2, 3"
)


def list_origin_costs(*, start: datetime, end: datetime, gpus: Iterable[str]) -> list[OriginCost]:
    """The origin charge of these GPUs per (day, GPU, card) in [start, end)."""
    require_hours_retained(start=start)
    with connection.cursor() as cur:
        cur.execute(_ORIGIN_COSTS, [start, end, sorted(set(gpus))])
        return fetch_rows(cur, OriginCost)


@dataclass(frozen=True)
class FleetFocusLedgerRow(FocusLedgerRow):
    """A FocusLedgerRow of any tenant, with the tenant and the currency its hours were priced in."""

    tenant: str
    currency: str


# The same rows as an invoice's, for every tenant; the currency is the GPU-hour's (its rate card's).
_FLEET_FOCUS_ROWS = (
    "SELECT " + _FOCUS_COLUMNS + ", u.tenant, g.currency " + _FOCUS_FROM
    + "WHERE u.hour >= %s AND u.hour < %s AND g.priced "
    "GROUP BY 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 25, 26 ORDER BY 25, 1, 2, 5, 6, 7, 8, 9, 10"
)


def list_fleet_focus_ledger_rows(*, start: datetime, end: datetime) -> list[FleetFocusLedgerRow]:
    """Every tenant's priced usage in [start, end), per (tenant, day, GPU, workload, card)."""
    require_hours_retained(start=start)
    with connection.cursor() as cur:
        cur.execute(_FLEET_FOCUS_ROWS, [start, end])
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


_PLATFORM_IDLE = (
    "SELECT date_trunc('day', g.hour) AS day, g.gpu_uuid, g.gpu_model, n.name AS node, rc.id AS rate_card_id, "  # noqa: S608 - constant SQL
    "coalesce(rc.price_per_gpu_hour, 0) AS price_per_gpu_hour, coalesce(rc.idle_policy, 'platform') AS idle_policy, "
    "g.currency, sum(g.idle_cost - g.idle_allocated) AS idle, sum(g.card_cost) AS card_cost, "
    "sum(g.metered_seconds) AS metered_seconds, sum(g.idle_energy_j) AS idle_energy_j, "
    f"{energy_cost_sql('g', 'idle_energy_j')} AS energy_cost_jp, {co2e_sql('g', 'idle_energy_j')} AS co2e_jkg "
    "FROM billing_gpuhour g JOIN billing_node n ON n.id = g.node_id "
    + _CARD_OF_HOUR + energy_rate_join("g", "hour")
    + "WHERE g.hour >= %s AND g.hour < %s AND g.priced GROUP BY 1, 2, 3, 4, 5, 6, 7, 8 ORDER BY 1, 2, 4, 5"
)


def list_platform_idle(*, start: datetime, end: datetime) -> list[PlatformIdleRow]:
    """Every GPU-day's platform idle in [start, end), zero ones included (the caller decides)."""
    require_hours_retained(start=start)
    with connection.cursor() as cur:
        cur.execute(_PLATFORM_IDLE, [start, end])
        return fetch_rows(cur, PlatformIdleRow)
