"""What a tenant's workloads were billed on: per pod instance and rate card, the hour ledger's charge
and its billed and used memory and SMs in card-seconds, with the card's α and billed basis — what
the portal's "why this costs what it does" prices again on use alone (billing.queries.cost_reasons);
and per container, its use, requests and peak hours, which right-sizing sizes them by.

A card-second of memory is one second holding all of a card's memory (MB·s ÷ the GPU's memory),
of SMs one second holding all of its SMs: the units the pricing formula weighs with α
(billing.ledger.pricing), so workloads on cards of different sizes add up. Each GPU's MB·s and SM·s
are summed first and divided once, so the figure does not depend on whether its hours were read one
by one or as day rows.

An hour row is matched to the card in force at the hour's last minute. A card's price changes on a
whole minute, so an hour in which a card was replaced is priced by two cards and is matched to the
later one; the figures drawn from it are then approximate for that one hour.

Both reads are of the workloads a page lists, not of every workload of the tenant: the portal
explains its costliest 100, and a big tenant runs thousands of pods a month (at 200 GPUs, reading
all of them cost the portal 1.7 s of its 2.9 s; docs/benchmarks.md).

- The billed basis reads closed days from the day ledger and the rest from hours, as the upcoming
  invoice does (billing.ledger.spend.priced_split: the days on which a GPU-day cannot name the card of
  each of its hours come from hours); to the ledger unit the same as reading every hour
  (tests/billing/test_page_reads_equivalence.py).
- Right-sizing needs each container's peak hour. A day row holds its hours' highest mean
  (UsageDay.peak_hour_mean_mb), which is the container's for that day where each of the pod's
  containers ran on one GPU and SLA tier all day (one hour row per hour): those days are read from
  their day rows. The others (a container on two GPUs or tiers, a day the period cuts) are read from
  their hours, found through their day rows (node, GPU and the first and last hour of each day), which
  the hour ledger's (node, GPU, hour) index answers, instead of scanning the tenant's month of hours.
  tests/billing/test_page_reads_equivalence.py holds both to the hour rows.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

from django.db import connection

from billing.ledger.models import GpuDay, GpuHour, UsageDay, UsageHour, WorkloadMeta
from billing.ledger.reads import fetch_rows
from billing.ledger.requests import row_requested_sql
from billing.ledger.spend import hour_ranges_sql, priced_split
from billing.models.fleet import Gpu
from billing.models.pricing import RateCard

__all__ = ["BilledBasisRow", "ContainerUseRow", "list_billed_basis_rows", "list_container_use"]

_USAGE = UsageHour._meta.db_table
_GPU_HOUR = GpuHour._meta.db_table
_USAGE_DAY = UsageDay._meta.db_table
_GPU_DAY = GpuDay._meta.db_table
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


def _workloads_sql(alias: str, workloads: Sequence[tuple[str, str, str]], params: dict[str, Any]) -> str:
    """`JOIN ... k`: the rows of `alias` of the (namespace, pod, pod UID) keys `workloads` only."""
    keys = sorted(set(workloads))
    params["namespaces"], params["pods"], params["pod_uids"] = ([k[i] for k in keys] for i in range(3))
    return (" JOIN unnest(%(namespaces)s::text[], %(pods)s::text[], %(pod_uids)s::text[]) AS k(namespace, pod, pod_uid)"
            f" ON k.namespace = {alias}.namespace AND k.pod = {alias}.pod AND k.pod_uid = {alias}.pod_uid")


def _card_sql(at: str) -> str:
    """The rate card in force at `at` for the GPU row `g`, when `g` was priced."""
    return (f"LEFT JOIN {_CARD} rc ON g.priced AND rc.gpu_model = g.gpu_model AND rc.effective_from <= {at} "
            f"AND (rc.effective_to IS NULL OR rc.effective_to > {at})")


_HOUR_CARD = _card_sql("u.hour + interval '59 minutes'")
# A day without a card change inside has one card all day (per GPU model): the one at any of its
# hours' last minutes, e.g. the first hour's; priced_split sends the other days to hours.
_DAY_CARD = _card_sql("u.day + interval '59 minutes'")
# A usage row's part of a billed-basis row: raw sums per GPU, divided by the GPU's size once summed.
_BASIS_COLUMNS = ("u.namespace, u.pod, u.pod_uid, u.gpu_uuid, rc.id AS rate_card, rc.alpha, rc.billed_basis, u.charge, "
                  "u.mem_used_mb_s, u.mem_billed_mb_s, u.sm_used_s, u.sm_billed_s")


def list_billed_basis_rows(*, tenant: str, start: datetime, end: datetime, now: datetime,
                           workloads: Sequence[tuple[str, str, str]]) -> list[BilledBasisRow]:
    """The rows of `tenant`'s hours in [start, end) of `workloads` ((namespace, pod, pod UID) keys),
    one per pod instance and rate card, read at `now` from closed days plus hours (module docstring).
    Unordered."""
    split = priced_split(start, end, now)
    params: dict[str, Any] = {"tenant": tenant, "days_from": split.days_from, "days_to": split.days_to,
                              "hour_days": list(split.hour_days)}
    days = (
        f"SELECT {_BASIS_COLUMNS} FROM {_USAGE_DAY} u{_workloads_sql('u', workloads, params)} "  # noqa: S608 - fixed SQL
        f"LEFT JOIN {_GPU_DAY} g ON g.node_id = u.node_id AND g.gpu_uuid = u.gpu_uuid AND g.day = u.day "
        f"{_DAY_CARD} "
        "WHERE u.tenant = %(tenant)s AND u.day >= %(days_from)s AND u.day < %(days_to)s "
        "AND NOT (u.day = ANY(%(hour_days)s::timestamptz[]))"
    )
    hours = (
        f"SELECT {_BASIS_COLUMNS} FROM {_USAGE} u{_workloads_sql('u', workloads, params)} "  # noqa: S608 - fixed SQL
        f"LEFT JOIN {_GPU_HOUR} g ON g.node_id = u.node_id AND g.gpu_uuid = u.gpu_uuid AND g.hour = u.hour "
        f"{_HOUR_CARD} "
        f"WHERE u.tenant = %(tenant)s AND {hour_ranges_sql(split.hour_ranges, 'u.hour', params)}"
    )
    sql = (
        "SELECT p.namespace, p.pod, p.pod_uid, p.rate_card, p.alpha, p.billed_basis, sum(p.charge) AS charge, "  # noqa: S608 - fixed SQL
        "coalesce(sum(p.mem_used / nullif(gp.memory_mb, 0)), 0) AS mem_used_card_s, "
        "coalesce(sum(p.mem_billed / nullif(gp.memory_mb, 0)), 0) AS mem_billed_card_s, "
        "coalesce(sum(p.sm_used / nullif(gp.sm_count, 0)), 0) AS sm_used_card_s, "
        "coalesce(sum(p.sm_billed / nullif(gp.sm_count, 0)), 0) AS sm_billed_card_s "
        "FROM (SELECT namespace, pod, pod_uid, gpu_uuid, rate_card, alpha, billed_basis, sum(charge) AS charge, "
        "sum(mem_used_mb_s) AS mem_used, sum(mem_billed_mb_s) AS mem_billed, sum(sm_used_s) AS sm_used, "
        f"sum(sm_billed_s) AS sm_billed FROM ({days} UNION ALL {hours}) r "
        "GROUP BY namespace, pod, pod_uid, gpu_uuid, rate_card, alpha, billed_basis) p "
        f"LEFT JOIN {_GPU} gp ON gp.uuid = p.gpu_uuid "
        "GROUP BY p.namespace, p.pod, p.pod_uid, p.rate_card, p.alpha, p.billed_basis"
    )
    # Not under the period-read settings, as list_container_use: the listed workloads' rows are few,
    # and a nested loop probing the GPU rows' index for each is the point. Without nested loops the
    # GPU-hours and GPU-days of the whole period were hashed: 0.37-0.42 s against 0.07 s for a page's
    # 100 workloads at 1,000 GPUs x 31 days (docs/benchmarks.md).
    with connection.cursor() as cur:
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


def list_container_use(*, tenant: str, start: datetime, end: datetime,
                       workloads: Sequence[tuple[str, str, str]]) -> list[ContainerUseRow]:
    """The rows of `tenant`'s containers in [start, end) of `workloads` ((namespace, pod, pod UID)
    keys), one per pod instance and container. Unordered."""
    params: dict[str, Any] = {"tenant": tenant, "start": start, "end": end,
                              "first_day": start.astimezone(UTC).replace(hour=0, minute=0, second=0, microsecond=0)}
    # The stored requested figures of a row `u` (an hour or a day row), its pod's metadata's where the
    # figures are behind it (billing.ledger.requests).
    mem_req, sm_req = row_requested_sql("mem_mb"), row_requested_sql("sm")
    sql = (
        # The listed workloads' day rows, each with its pod instance's number `w` (the containers are
        # grouped by it instead of its three names) and whether its pod's day is `stored`: read from
        # the day rows themselves, peaks included (UsageDay.peak_hour_mean_mb), because each of the
        # pod's containers ran on one GPU and SLA tier that day (one day row each, so its every hour
        # is one hour row, whose mean the day row's peak is), the day is wholly in the period, and
        # the peaks were derived from the hours. The other days are read from their hours below.
        "WITH day_rows AS (SELECT u.*, m.requests_changed, "  # noqa: S608 - fixed SQL
        f"{mem_req} AS mem_req, {sm_req} AS sm_req, "
        "count(*) OVER (PARTITION BY u.namespace, u.pod, u.pod_uid, u.container, u.day) = 1 "
        "AND u.day >= %(start)s AND u.day + interval '1 day' <= %(end)s "
        "AND (u.peak_hour_mean_mb IS NOT NULL OR u.seconds = 0) AS alone "
        f"FROM {_USAGE_DAY} u{_workloads_sql('u', workloads, params)} "
        f"LEFT JOIN {_META} m ON m.node_id = u.node_id AND m.namespace = u.namespace AND m.pod = u.pod "
        "AND m.pod_uid = u.pod_uid WHERE u.tenant = %(tenant)s AND u.day >= %(first_day)s AND u.day < %(end)s), "
        "days AS MATERIALIZED (SELECT *, dense_rank() OVER (ORDER BY namespace, pod, pod_uid) AS w, "
        "bool_and(alone) OVER (PARTITION BY namespace, pod, pod_uid, day) AS stored FROM day_rows), "
        # Where the other days' workloads ran, one span of hours per node, GPU and day (the pod's
        # containers and tiers merged, so that no hour is read twice), which the hour ledger's (node,
        # GPU, hour) index answers. The day ledger holds every hour's day (billing.ledger.models), so
        # the spans cover every hour of these days.
        "spans AS (SELECT node_id, gpu_uuid, namespace, pod, pod_uid, w, min(first_hour) AS first_hour, "
        "max(last_hour) AS last_hour FROM days WHERE NOT stored "
        "GROUP BY node_id, gpu_uuid, namespace, pod, pod_uid, w, day), "
        "hours AS (SELECT s.w, u.container, sum(u.seconds) AS s, sum(u.mem_used_mb_s) AS mem, "
        "sum(u.sm_used_s) AS sm, sum(u.mem_granted_mb_s) AS mem_granted, sum(u.sm_granted_s) AS sm_granted, "
        f"bool_and({mem_req} IS NOT NULL) AS mem_known, sum({mem_req}) AS mem_req, "
        f"bool_and({sm_req} IS NOT NULL) AS sm_known, sum({sm_req}) AS sm_req "
        f"FROM spans s JOIN {_USAGE} u ON u.node_id = s.node_id AND u.gpu_uuid = s.gpu_uuid "
        "AND u.hour >= s.first_hour AND u.hour <= s.last_hour AND u.namespace = s.namespace AND u.pod = s.pod "
        f"AND u.pod_uid = s.pod_uid LEFT JOIN {_META} m ON m.node_id = s.node_id AND m.namespace = s.namespace "
        "AND m.pod = s.pod AND m.pod_uid = s.pod_uid "
        "WHERE u.tenant = %(tenant)s AND u.hour >= %(start)s AND u.hour < %(end)s "
        "GROUP BY s.w, u.container, u.hour), "
        # Each container's hours of the other days and its stored days, one row each with its mean
        # (an hour's) or highest mean (a day's).
        "parts AS (SELECT w, container, s, mem, sm, mem_granted, sm_granted, mem_known, mem_req, sm_known, sm_req, "
        "mem / nullif(s, 0) AS peak_mb, sm / nullif(s, 0) AS peak_sm FROM hours "
        "UNION ALL SELECT w, container, seconds, mem_used_mb_s, sm_used_s, mem_granted_mb_s, sm_granted_s, "
        "mem_req IS NOT NULL, mem_req, sm_req IS NOT NULL, sm_req, peak_hour_mean_mb, peak_hour_mean_sm "
        "FROM days WHERE stored), "
        "containers AS (SELECT w, container, sum(s) AS seconds, sum(mem) AS mem_used_mb_s, sum(sm) AS sm_used_s, "
        "CASE WHEN bool_and(mem_known) THEN sum(mem_req) END AS mem_requested_mb_s, "
        "CASE WHEN bool_and(sm_known) THEN sum(sm_req) END AS sm_requested_s, "
        "coalesce(max(peak_mb), 0) AS peak_hour_mean_mb, coalesce(max(peak_sm), 0) AS peak_hour_mean_sm, "
        "sum(mem_granted) AS mem_granted_mb_s, sum(sm_granted) AS sm_granted_s FROM parts GROUP BY w, container) "
        "SELECT p.namespace, p.pod, p.pod_uid, c.container, c.seconds, c.mem_used_mb_s, c.sm_used_s, "
        "c.mem_requested_mb_s, c.sm_requested_s, c.peak_hour_mean_mb, c.peak_hour_mean_sm, c.mem_granted_mb_s, "
        "c.sm_granted_s FROM containers c JOIN (SELECT DISTINCT w, namespace, pod, pod_uid FROM days) p ON p.w = c.w"
    )
    # Not under the period-read settings: they turn nested loops off, and a nested loop over the
    # spans probing the hour ledger's index is the point (bench/web_pages.py measured the scan of the
    # tenant's month 2x dearer at 200 GPUs).
    with connection.cursor() as cur:
        cur.execute(sql, params)
        return fetch_rows(cur, ContainerUseRow)
