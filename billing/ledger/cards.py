"""The fleet's cards over a period, one row per GPU (the fleet view, docs/billing.md "Fleet view"):
what each card cost, what of it was charged to workloads and what stood idle, how busy it was, the
energy it drew (and what it cost and emitted), how many pod instances ran on it, and its costliest
workloads. Two statements, whatever the fleet's size: one over the GPU rows (with the usage they carry
for utilisation and the count of pod instances), one over the usage rows of the cards a page shows for
their costliest workloads (whole months from the month ledger: billing.ledger.reads.usage_rows).
Raw ledger sums in ledger units; rounding and ratios are the caller's.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from typing import Any

from billing.ledger import reads
from billing.ledger.allocation import CONTROLLER_SQL
from billing.ledger.energy import co2e_sql, energy_cost_sql, energy_rate_join
from billing.ledger.models import WorkloadMeta
from billing.ledger.reads import fetch_rows, period_read_cursor
from billing.models.fleet import Gpu, Node

__all__ = ["CardRow", "CardWorkloadRow", "list_card_workloads", "list_cards"]

_META = WorkloadMeta._meta.db_table
_GPU = Gpu._meta.db_table
_NODE = Node._meta.db_table


@dataclass(frozen=True)
class CardRow:
    """One GPU on one node over the period. Per GPU-hour the ledger keeps charged + idle_cost =
    card_cost, so the sums here do too."""

    node: str
    gpu_uuid: str
    gpu_model: str
    card_cost: Decimal
    charged: Decimal  # Σ workloads' charge on the card
    idle_cost: Decimal  # the rest of the card's cost (some of it spread onto tenants: idle_allocated)
    idle_allocated: Decimal
    metered_seconds: Decimal
    energy_j: Decimal
    # The card's whole energy (its idle draw included) × its node's price / CO2e factor per kWh on
    # each day (billing.ledger.energy): J·price and J·kg, None where some of it had no price (factor).
    energy_cost_jp: Decimal | None
    co2e_jkg: Decimal | None
    sm_used_s: Decimal
    mem_used_mb_s: Decimal
    # sm_count / memory_mb (the inventory's) × metered seconds; None for a GPU missing from it.
    sm_capacity_s: Decimal | None
    mem_capacity_mb_s: Decimal | None
    workloads: int  # pod instances with usage on the card


# Usage summed per card before the join, so a card's row is one GPU row sum and one usage sum (no
# fan-out); capacity from the inventory as billing.ledger.series counts it. The energy is priced on
# the GPU rows (the card's whole draw, idle too), each row at its own node and date. The pod
# instances are counted here, in the pass that sums the card's usage anyway, so a page sorts and
# totals every card by them and ranks workloads only for the cards it shows (list_card_workloads).
_CARDS = """
WITH cards AS (
    SELECT g.node_id, g.gpu_uuid, max(g.gpu_model) AS gpu_model, sum(g.card_cost) AS card_cost,
           sum(g.charged) AS charged, sum(g.idle_cost) AS idle_cost, sum(g.idle_allocated) AS idle_allocated,
           sum(g.metered_seconds) AS metered_seconds, sum(g.energy_j) AS energy_j,
           {energy_cost} AS energy_cost_jp, {co2e} AS co2e_jkg
    FROM {gpu_table} g {rate_join} WHERE g.{at} >= %(start)s AND g.{at} < %(end)s
    GROUP BY g.node_id, g.gpu_uuid
), per_pod AS (
    SELECT node_id, gpu_uuid, sum(sm_used_s) AS sm, sum(mem_used_mb_s) AS mem
    FROM {usage_rows} u
    GROUP BY node_id, gpu_uuid, tenant, namespace, pod, pod_uid
), used AS (
    SELECT node_id, gpu_uuid, sum(sm) AS sm, sum(mem) AS mem, count(*) AS workloads
    FROM per_pod
    GROUP BY node_id, gpu_uuid
)
SELECT n.name AS node, c.gpu_uuid, c.gpu_model, c.card_cost, c.charged, c.idle_cost, c.idle_allocated,
       c.metered_seconds, c.energy_j, c.energy_cost_jp, c.co2e_jkg, coalesce(u.sm, 0) AS sm_used_s,
       coalesce(u.mem, 0) AS mem_used_mb_s,
       c.metered_seconds * gp.sm_count AS sm_capacity_s, c.metered_seconds * gp.memory_mb AS mem_capacity_mb_s,
       coalesce(u.workloads, 0) AS workloads
FROM cards c JOIN {node_table} n ON n.id = c.node_id
LEFT JOIN used u ON u.node_id = c.node_id AND u.gpu_uuid = c.gpu_uuid
LEFT JOIN {inventory} gp ON gp.uuid = c.gpu_uuid
ORDER BY n.name, c.gpu_uuid
"""


def list_cards(*, start: datetime, end: datetime) -> list[CardRow]:
    """Every GPU with GPU rows in [start, end), by node name and GPU."""
    ledger = reads.ledger_for(start, end)
    params: dict[str, Any] = {"start": start, "end": end, "tenants": None}
    sql = _CARDS.format(at=ledger.at, gpu_table=ledger.gpu_table, node_table=_NODE, inventory=_GPU,
                        usage_rows=reads.usage_rows(ledger, start, end, params, months=reads.month_range(ledger, start, end)),
                        rate_join=energy_rate_join("g", ledger.at), energy_cost=energy_cost_sql("g"), co2e=co2e_sql("g"))
    with period_read_cursor() as cur:
        cur.execute(sql, params)
        return fetch_rows(cur, CardRow)


@dataclass(frozen=True)
class CardWorkloadRow:
    """One of a card's costliest pod instances over the period."""

    node: str
    gpu_uuid: str
    tenant: str
    namespace: str
    controller: str  # as Explore's path names it; UNALLOCATED when no agent reported one
    pod: str
    pod_uid: str
    cost: Decimal  # charge + idle share on this card
    rank: int  # 1 = the costliest on the card


# Ranked per card in the statement, so only `top` rows per card leave the database; the controller
# is joined for those rows alone, on the ledger's key and node as billing.ledger.allocation joins it.
# With `cards` (node name, GPU), only those cards' usage rows are grouped and ranked: a page ranks
# the cards it shows, not the fleet's (the ranking's sort was most of the statement at 1,000 GPUs).
_WORKLOADS = """
WITH per_pod AS (
    SELECT u.node_id, u.gpu_uuid, u.tenant, u.namespace, u.pod, u.pod_uid, sum(u.charge) + sum(u.idle_share) AS cost
    FROM {usage_rows} u {only_cards}
    GROUP BY u.node_id, u.gpu_uuid, u.tenant, u.namespace, u.pod, u.pod_uid
), ranked AS (
    SELECT p.*, row_number() OVER (PARTITION BY node_id, gpu_uuid ORDER BY cost DESC, tenant, namespace, pod, pod_uid) AS rank
    FROM per_pod p
)
SELECT n.name AS node, r.gpu_uuid, r.tenant, r.namespace, {controller} AS controller, r.pod, r.pod_uid, r.cost, r.rank
FROM ranked r JOIN {node_table} n ON n.id = r.node_id
LEFT JOIN {meta_table} m ON m.node_id = r.node_id AND m.namespace = r.namespace AND m.pod = r.pod AND m.pod_uid = r.pod_uid
WHERE r.rank <= %(top)s
ORDER BY n.name, r.gpu_uuid, r.rank
"""
_ONLY_CARDS = """
    WHERE (u.node_id, u.gpu_uuid) IN (
        SELECT n.id, c.gpu_uuid FROM unnest(%(card_nodes)s::text[], %(card_gpus)s::text[]) AS c(node, gpu_uuid)
        JOIN {node_table} n ON n.name = c.node)
"""


def list_card_workloads(*, start: datetime, end: datetime, top: int,
                        cards: Collection[tuple[str, str]] | None = None) -> list[CardWorkloadRow]:
    """Per GPU with usage in [start, end), of `cards` ((node name, GPU UUID) pairs; None: every
    card), its `top` costliest pod instances (ties by name)."""
    ledger = reads.ledger_for(start, end)
    params: dict[str, Any] = {"top": top, "tenants": None}
    if cards is not None:
        params["card_nodes"], params["card_gpus"] = [node for node, _ in cards], [gpu for _, gpu in cards]
    sql = _WORKLOADS.format(node_table=_NODE, meta_table=_META, controller=CONTROLLER_SQL,
                            only_cards="" if cards is None else _ONLY_CARDS.format(node_table=_NODE),
                            usage_rows=reads.usage_rows(ledger, start, end, params, months=reads.month_range(ledger, start, end)))
    with period_read_cursor() as cur:
        cur.execute(sql, params)
        return fetch_rows(cur, CardWorkloadRow)
