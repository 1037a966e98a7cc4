"""What a tenant's workloads were billed on: per pod instance and rate card, the hour ledger's charge
and its billed and used memory and SMs in card-seconds, with the card's α and billed basis — what
the portal's "why this costs what it does" prices again on use alone (billing.queries.cost_reasons);
and per container, its use, requests and peak hours, which right-sizing sizes them by.

A card-second of memory is one second holding all of a card's memory (MB·s ÷ the GPU's memory),
of SMs one second holding all of its SMs: the units the pricing formula weighs with α
(billing.ledger.pricing), so workloads on cards of different sizes add up.

An hour row is matched to the card in force at the hour's last minute. A card's price changes on a
whole minute, so an hour in which a card was replaced is priced by two cards and is matched to the
later one; the figures drawn from it are then approximate for that one hour.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from typing import Any

from billing.ledger.allocation import requested_sql
from billing.ledger.models import GpuHour, UsageHour, WorkloadMeta
from billing.ledger.reads import fetch_rows, period_read_cursor
from billing.models.fleet import Gpu
from billing.models.pricing import RateCard

__all__ = ["BilledBasisRow", "ContainerUseRow", "list_billed_basis_rows", "list_container_use"]

_USAGE = UsageHour._meta.db_table
_GPU_HOUR = GpuHour._meta.db_table
_GPU = Gpu._meta.db_table
_CARD = RateCard._meta.db_table
_META = WorkloadMeta._meta.db_table


@dataclass(frozen=True)
class BilledBasisRow:
    """One pod instance's hours priced by one rate card (card None: unpriced hours, charge 0)."""

    namespace: str
    pod: str
    pod_uid: str
    rate_card: int | None
    alpha: Decimal | None
    billed_basis: str | None
    charge: Decimal
    mem_used_card_s: Decimal
    mem_billed_card_s: Decimal
    sm_used_card_s: Decimal
    sm_billed_card_s: Decimal


def list_billed_basis_rows(*, tenant: str, start: datetime, end: datetime) -> list[BilledBasisRow]:
    """The rows of `tenant`'s hours in [start, end), one per pod instance and rate card. Unordered."""
    params: dict[str, Any] = {"tenant": tenant, "start": start, "end": end}
    last_minute = "u.hour + interval '59 minutes'"
    sql = (
        "SELECT u.namespace, u.pod, u.pod_uid, rc.id AS rate_card, rc.alpha, rc.billed_basis, "  # noqa: S608 - fixed SQL
        "sum(u.charge) AS charge, "
        "coalesce(sum(u.mem_used_mb_s / nullif(gp.memory_mb, 0)), 0) AS mem_used_card_s, "
        "coalesce(sum(u.mem_billed_mb_s / nullif(gp.memory_mb, 0)), 0) AS mem_billed_card_s, "
        "coalesce(sum(u.sm_used_s / nullif(gp.sm_count, 0)), 0) AS sm_used_card_s, "
        "coalesce(sum(u.sm_billed_s / nullif(gp.sm_count, 0)), 0) AS sm_billed_card_s "
        f"FROM {_USAGE} u "
        f"LEFT JOIN {_GPU} gp ON gp.uuid = u.gpu_uuid "
        f"LEFT JOIN {_GPU_HOUR} g ON g.node_id = u.node_id AND g.gpu_uuid = u.gpu_uuid AND g.hour = u.hour "
        f"LEFT JOIN {_CARD} rc ON g.priced AND rc.gpu_model = g.gpu_model AND rc.effective_from <= {last_minute} "
        f"AND (rc.effective_to IS NULL OR rc.effective_to > {last_minute}) "
        "WHERE u.tenant = %(tenant)s AND u.hour >= %(start)s AND u.hour < %(end)s "
        "GROUP BY u.namespace, u.pod, u.pod_uid, rc.id, rc.alpha, rc.billed_basis"
    )
    with period_read_cursor() as cur:
        cur.execute(sql, params)
        return fetch_rows(cur, BilledBasisRow)


@dataclass(frozen=True)
class ContainerUseRow:
    """One container of a pod instance over a period, per GPU: its metered seconds, memory and SMs
    used, granted, requested (× seconds; None where any hour's request is unknown), and the highest hourly
    mean of each (Σ used ÷ Σ metered seconds of the hour, over its GPUs): what right-sizing needs."""

    namespace: str
    pod: str
    pod_uid: str
    container: str
    seconds: Decimal
    mem_used_mb_s: Decimal
    sm_used_s: Decimal
    mem_requested_mb_s: Decimal | None
    sm_requested_s: Decimal | None
    peak_hour_mean_mb: Decimal
    peak_hour_mean_sm: Decimal
    mem_granted_mb_s: Decimal
    sm_granted_s: Decimal


def list_container_use(*, tenant: str, start: datetime, end: datetime) -> list[ContainerUseRow]:
    """The rows of `tenant`'s containers in [start, end), one per pod instance and container. Unordered."""
    params: dict[str, Any] = {"tenant": tenant, "start": start, "end": end}
    mem_req, sm_req = requested_sql("mem_mb"), requested_sql("sm")
    sql = (
        "WITH hours AS (SELECT u.namespace, u.pod, u.pod_uid, u.container, u.hour, sum(u.seconds) AS s, "  # noqa: S608 - fixed SQL
        "sum(u.mem_used_mb_s) AS mem, sum(u.sm_used_s) AS sm, "
        "sum(u.mem_granted_mb_s) AS mem_granted, sum(u.sm_granted_s) AS sm_granted, "
        f"bool_and({mem_req} IS NOT NULL) AS mem_known, sum({mem_req}) AS mem_req, "
        f"bool_and({sm_req} IS NOT NULL) AS sm_known, sum({sm_req}) AS sm_req "
        f"FROM {_USAGE} u LEFT JOIN {_META} m ON m.node_id = u.node_id AND m.namespace = u.namespace "
        "AND m.pod = u.pod AND m.pod_uid = u.pod_uid "
        "WHERE u.tenant = %(tenant)s AND u.hour >= %(start)s AND u.hour < %(end)s "
        "GROUP BY u.namespace, u.pod, u.pod_uid, u.container, u.hour) "
        "SELECT namespace, pod, pod_uid, container, sum(s) AS seconds, sum(mem) AS mem_used_mb_s, "
        "sum(sm) AS sm_used_s, CASE WHEN bool_and(mem_known) THEN sum(mem_req) END AS mem_requested_mb_s, "
        "CASE WHEN bool_and(sm_known) THEN sum(sm_req) END AS sm_requested_s, "
        "coalesce(max(mem / nullif(s, 0)), 0) AS peak_hour_mean_mb, "
        "coalesce(max(sm / nullif(s, 0)), 0) AS peak_hour_mean_sm, "
        "sum(mem_granted) AS mem_granted_mb_s, sum(sm_granted) AS sm_granted_s "
        "FROM hours GROUP BY namespace, pod, pod_uid, container"
    )
    with period_read_cursor() as cur:
        cur.execute(sql, params)
        return fetch_rows(cur, ContainerUseRow)
