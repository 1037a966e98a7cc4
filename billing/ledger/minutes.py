"""Reads of the minute ledger (billing_usageminute, billing_gpuminute): the per-minute detail the
paired report, the pool rebalance and a rate-card change need, which the hour and day ledgers
have summed away. Each function is one statement; rows are frozen dataclasses.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass
from datetime import date, datetime, timedelta
from decimal import Decimal

from django.db import connection
from django.db.models import F, Max, Sum

from billing.ledger.models import GpuMinute, UsageMinute
from billing.ledger.reads import fetch_rows
from billing.ledger.statistics import analyze_minute_days

__all__ = [
    "BusyCardTime",
    "CardSpan",
    "CardTime",
    "FleetCardCost",
    "PodMinuteDemand",
    "PodPlacement",
    "SteadyWorkloadGpuDay",
    "WorkloadSpan",
    "get_busy_card_time",
    "get_fleet_card_cost",
    "get_last_ledger_minute",
    "list_card_spans",
    "list_pod_minute_demand",
    "list_recent_placements",
    "list_steady_workload_gpu_days",
    "list_workload_spans",
    "price_card_time",
]


# -- the paired report ---------------------------------------------------------------------

# Steady state: a workload's minutes from `cold` after its first minute in the ledger (looking
# back to `lookback`), within [start, end), on priced GPU-minutes with metered time.
_STEADY = """
WITH m AS (
    SELECT u.tenant, u.namespace, u.pod, u.container, u.pod_uid, u.gpu_uuid, u.minute, u.seconds,
           u.charge + u.idle_share AS dyn, u.mem_used_mb_s, u.sm_used_s,
           g.card_cost / g.metered_seconds AS price_per_s, g.metered_seconds, b.memory_mb, b.sm_count,
           min(u.minute) OVER (PARTITION BY u.tenant, u.namespace, u.pod, u.container, u.pod_uid) AS first_minute
    FROM billing_usageminute u
    JOIN billing_gpuminute g ON g.node_id = u.node_id AND g.gpu_uuid = u.gpu_uuid AND g.minute = u.minute
    JOIN billing_gpu b ON b.uuid = u.gpu_uuid
    WHERE u.minute >= %(lookback)s AND u.minute < %(end)s AND g.priced AND g.metered_seconds > 0
), steady AS (
    SELECT * FROM m WHERE minute >= %(start)s AND minute >= first_minute + %(cold)s::interval
)
"""

_WORKLOAD_GPU_DAYS = _STEADY + """
SELECT tenant, namespace, pod, container, pod_uid, (minute AT TIME ZONE 'UTC')::date AS day, gpu_uuid,
       sum(dyn) AS dynamic_cost, sum(price_per_s * seconds) AS static_whole_cost, sum(seconds) AS seconds,
       max(mem_used_mb_s / seconds) AS peak_mem_mb, sum(mem_used_mb_s) AS mem_used_mb_s,
       sum(sm_used_s) AS sm_used_s, max(memory_mb) AS memory_mb, max(sm_count) AS sm_count,
       sum(dyn / nullif(price_per_s, 0)) AS dynamic_billed_gpu_s
FROM steady
GROUP BY 1, 2, 3, 4, 5, 6, 7
"""

# Busy card time under dynamic allocation: GPU-minutes with at least one steady-state workload.
_BUSY = _STEADY + """
SELECT coalesce(sum(metered_seconds), 0) AS seconds, coalesce(sum(metered_seconds * memory_mb), 0) AS mem_mb_s,
       coalesce(sum(metered_seconds * sm_count), 0) AS sm_s
FROM (SELECT DISTINCT gpu_uuid, minute, metered_seconds, memory_mb, sm_count FROM steady) busy
"""  # noqa: S608 - constant SQL text; values are bound parameters


@dataclass(frozen=True)
class SteadyWorkloadGpuDay:
    """One workload (container instance) on one GPU for one UTC day, steady-state minutes only."""

    tenant: str
    namespace: str
    pod: str
    container: str
    pod_uid: str
    day: date
    gpu_uuid: str
    dynamic_cost: Decimal  # charge + idle share
    static_whole_cost: Decimal  # the card's price for every second the workload was present
    seconds: Decimal
    peak_mem_mb: Decimal  # the largest minute mean
    mem_used_mb_s: Decimal
    sm_used_s: Decimal
    memory_mb: int
    sm_count: int
    dynamic_billed_gpu_s: Decimal | None  # dynamic cost in GPU-seconds at the card's price


@dataclass(frozen=True)
class BusyCardTime:
    """Card time of the GPU-minutes with a steady-state workload."""

    seconds: Decimal
    mem_mb_s: Decimal  # Σ memory_mb × metered seconds
    sm_s: Decimal  # Σ sm_count × metered seconds


def _steady_params(*, start: datetime, end: datetime, lookback: timedelta,
                   cold_start: timedelta) -> dict[str, datetime | str]:
    return {"start": start, "end": end, "lookback": start - lookback,
            "cold": f"{int(cold_start.total_seconds())} seconds"}


def list_steady_workload_gpu_days(*, start: datetime, end: datetime, lookback: timedelta,
                                  cold_start: timedelta) -> list[SteadyWorkloadGpuDay]:
    """The paired report's first and longest read: it analyses the days it reads that are stale,
    so it and the report's later reads of the same days are planned on their real size."""
    analyze_minute_days(start=start - lookback, end=end)
    with connection.cursor() as cur:
        cur.execute(_WORKLOAD_GPU_DAYS, _steady_params(start=start, end=end, lookback=lookback, cold_start=cold_start))
        return fetch_rows(cur, SteadyWorkloadGpuDay)


def get_busy_card_time(*, start: datetime, end: datetime, lookback: timedelta, cold_start: timedelta) -> BusyCardTime:
    with connection.cursor() as cur:
        cur.execute(_BUSY, _steady_params(start=start, end=end, lookback=lookback, cold_start=cold_start))
        (busy,) = fetch_rows(cur, BusyCardTime)
    return busy


# The organisation's view: every priced GPU-minute of [start, end) with metered time, cold start
# included (the organisation pays for those minutes too).
_FLEET = """
WITH cards AS (
    SELECT g.minute, g.card_cost, g.metered_seconds, EXISTS (
               SELECT 1 FROM billing_usageminute u
               WHERE u.node_id = g.node_id AND u.gpu_uuid = g.gpu_uuid AND u.minute = g.minute
                 AND u.minute >= %(start)s AND u.minute < %(end)s) AS busy
    FROM billing_gpuminute g
    WHERE g.minute >= %(start)s AND g.minute < %(end)s AND g.priced AND g.metered_seconds > 0
), per_minute AS (
    SELECT minute, count(*) AS cards, count(*) FILTER (WHERE busy) AS busy_cards FROM cards GROUP BY minute
), busiest AS (
    -- the first minute with the most busy cards, and the cards metered in that same minute
    SELECT minute, cards FROM per_minute ORDER BY busy_cards DESC, minute LIMIT 1
)
SELECT (SELECT coalesce(sum(card_cost), 0) FROM cards) AS card_cost,
       (SELECT coalesce(sum(card_cost) FILTER (WHERE NOT busy), 0) FROM cards) AS empty_card_cost,
       (SELECT coalesce(sum(metered_seconds) FILTER (WHERE busy), 0) FROM cards) AS busy_seconds,
       (SELECT coalesce(max(cards), 0) FROM per_minute) AS peak_cards,
       (SELECT coalesce(max(busy_cards), 0) FROM per_minute) AS peak_busy_cards,
       (SELECT minute FROM busiest) AS peak_busy_at,
       (SELECT coalesce(max(cards), 0) FROM busiest) AS cards_at_peak_busy
"""


@dataclass(frozen=True)
class FleetCardCost:
    """What the organisation paid for its priced cards in a period, busy or idle."""

    card_cost: Decimal  # every priced GPU-minute with metered time
    empty_card_cost: Decimal  # the GPU-minutes no workload was on
    busy_seconds: Decimal  # metered seconds of the GPU-minutes a workload was on
    peak_cards: int  # the most cards metered in one minute
    peak_busy_cards: int  # the most cards with a workload on them in one minute
    peak_busy_at: datetime | None  # the first such minute
    cards_at_peak_busy: int  # the cards metered in that minute


def get_fleet_card_cost(*, start: datetime, end: datetime) -> FleetCardCost:
    with connection.cursor() as cur:
        cur.execute(_FLEET, {"start": start, "end": end})
        (fleet,) = fetch_rows(cur, FleetCardCost)
    return fleet


# -- static alternatives on the actual fleet --------------------------------------------------

# Each unbroken run of minutes a card of the fleet metered in [start, end) on priced minutes: from
# its first minute to its last. A card is in the fleet in the minutes it metered only: a burst node
# metered some hours of a day is several spans, not one from its first hour to its last, so the
# fleet's cards at any minute are the cards metered in that minute (gaps and islands: minutes in a
# run less their rank in it are one constant).
_CARD_SPANS = """
WITH metered AS (
    SELECT g.node_id, g.gpu_uuid, g.gpu_model, g.minute,
           g.minute - row_number() OVER (PARTITION BY g.node_id, g.gpu_uuid ORDER BY g.minute)
                      * interval '1 minute' AS run
    FROM billing_gpuminute g
    WHERE g.minute >= %(start)s AND g.minute < %(end)s AND g.priced AND g.metered_seconds > 0
)
SELECT m.node_id, n.name AS node, m.gpu_uuid, max(m.gpu_model) AS model, max(b.memory_mb) AS memory_mb,
       max(b.sm_count) AS sm_count, min(m.minute) AS first_minute, max(m.minute) AS last_minute
FROM metered m
JOIN billing_node n ON n.id = m.node_id
JOIN billing_gpu b ON b.uuid = m.gpu_uuid
GROUP BY m.node_id, n.name, m.gpu_uuid, m.run
ORDER BY n.name, m.gpu_uuid, min(m.minute)
"""

# Each workload (container instance) on each GPU in [start, end), priced minutes: the unbroken runs
# of minutes it ran (a workload metered before and after a stretch with no minute of it, e.g. the
# node's agent down, held no card in that stretch), the most it used in one minute (per-minute
# means), what it asked for (WorkloadMeta's requests of its container, when the agent sent them),
# its card's cost for every second it was present, and what the ledger charged it.
_WORKLOAD_SPANS = """
WITH m AS (
    SELECT u.tenant, u.namespace, u.pod, u.container, u.pod_uid, u.node_id, u.gpu_uuid, u.minute,
           g.gpu_model, u.mem_used_mb_s / u.seconds AS mem_mb, u.sm_used_s / u.seconds AS sm,
           u.seconds * g.card_cost / g.metered_seconds AS whole_card_cost, u.charge + u.idle_share AS dynamic_cost,
           u.minute - dense_rank() OVER (PARTITION BY u.tenant, u.namespace, u.pod, u.container, u.pod_uid,
                                                      u.node_id, u.gpu_uuid ORDER BY u.minute)
                      * interval '1 minute' AS run
    FROM billing_usageminute u
    JOIN billing_gpuminute g ON g.node_id = u.node_id AND g.gpu_uuid = u.gpu_uuid AND g.minute = u.minute
    WHERE u.minute >= %(start)s AND u.minute < %(end)s AND g.minute >= %(start)s AND g.minute < %(end)s
      AND g.priced AND g.metered_seconds > 0 AND u.seconds > 0
), runs AS (
    SELECT tenant, namespace, pod, container, pod_uid, node_id, gpu_uuid, max(gpu_model) AS model,
           min(minute) AS first_minute, max(minute) AS last_minute, max(mem_mb) AS peak_mem_mb,
           max(sm) AS peak_sm, sum(whole_card_cost) AS whole_card_cost, sum(dynamic_cost) AS dynamic_cost
    FROM m
    GROUP BY tenant, namespace, pod, container, pod_uid, node_id, gpu_uuid, run
), w AS (
    SELECT tenant, namespace, pod, container, pod_uid, node_id, gpu_uuid, max(model) AS model,
           array_agg(first_minute ORDER BY first_minute) AS run_firsts,
           array_agg(last_minute ORDER BY first_minute) AS run_lasts,
           max(peak_mem_mb) AS peak_mem_mb, max(peak_sm) AS peak_sm,
           sum(whole_card_cost) AS whole_card_cost, sum(dynamic_cost) AS dynamic_cost
    FROM runs
    GROUP BY tenant, namespace, pod, container, pod_uid, node_id, gpu_uuid
)
SELECT w.tenant, w.namespace, w.pod, w.container, w.pod_uid, w.gpu_uuid, w.model,
       b.memory_mb, b.sm_count, w.run_firsts, w.run_lasts, w.peak_mem_mb, w.peak_sm,
       (m.requests -> w.container ->> 'mem_mb')::numeric AS requested_mem_mb,
       (m.requests -> w.container ->> 'sm')::numeric AS requested_sm,
       w.whole_card_cost, w.dynamic_cost
FROM w
JOIN billing_gpu b ON b.uuid = w.gpu_uuid
LEFT JOIN billing_workloadmeta m
       ON m.node_id = w.node_id AND m.namespace = w.namespace AND m.pod = w.pod AND m.pod_uid = w.pod_uid
ORDER BY w.tenant, w.namespace, w.pod, w.container, w.pod_uid, w.gpu_uuid
"""

# The card time of [start, end) inside given intervals of given cards: every priced, metered
# GPU-minute of the card that starts in one of its intervals, summed per label.
_CARD_TIME = """
SELECT t.label, coalesce(sum(g.card_cost), 0) AS cost, coalesce(sum(g.metered_seconds), 0) AS seconds
FROM unnest(%(labels)s::text[], %(nodes)s::bigint[], %(uuids)s::text[], %(starts)s::timestamptz[],
            %(ends)s::timestamptz[]) AS t(label, node_id, gpu_uuid, since, until)
JOIN billing_gpuminute g ON g.node_id = t.node_id AND g.gpu_uuid = t.gpu_uuid
                        AND g.minute >= t.since AND g.minute < t.until
WHERE g.minute >= %(start)s AND g.minute < %(end)s AND g.priced AND g.metered_seconds > 0
GROUP BY t.label
"""


@dataclass(frozen=True)
class CardSpan:
    """One unbroken run of a card's metered, priced minutes in a period: its first and its last."""

    node_id: int
    node: str
    gpu_uuid: str
    model: str
    memory_mb: int
    sm_count: int
    first_minute: datetime
    last_minute: datetime


@dataclass(frozen=True)
class WorkloadSpan:
    """One workload (container instance) on one GPU in a period, priced minutes only."""

    tenant: str
    namespace: str
    pod: str
    container: str
    pod_uid: str
    gpu_uuid: str
    model: str
    memory_mb: int  # of the card it ran on
    sm_count: int
    run_firsts: list[datetime]  # the first minute of each unbroken run of its minutes, in order
    run_lasts: list[datetime]  # the last minute of each run
    peak_mem_mb: Decimal  # the largest minute mean
    peak_sm: Decimal  # SMs busy, the largest minute mean
    requested_mem_mb: Decimal | None  # per GPU, as the agent resolved the container's request
    requested_sm: Decimal | None
    whole_card_cost: Decimal  # the card's price for every second it was present
    dynamic_cost: Decimal  # charge + idle share


@dataclass(frozen=True)
class CardTime:
    """Card time found inside a label's intervals: its cost and metered seconds."""

    label: str
    cost: Decimal
    seconds: Decimal


def list_card_spans(*, start: datetime, end: datetime) -> list[CardSpan]:
    """Every card with priced, metered minutes in [start, end), by node name and UUID."""
    with connection.cursor() as cur:
        cur.execute(_CARD_SPANS, {"start": start, "end": end})
        return fetch_rows(cur, CardSpan)


def list_workload_spans(*, start: datetime, end: datetime) -> list[WorkloadSpan]:
    """Every workload on every GPU with priced usage in [start, end), with its request."""
    with connection.cursor() as cur:
        cur.execute(_WORKLOAD_SPANS, {"start": start, "end": end})
        return fetch_rows(cur, WorkloadSpan)


def price_card_time(*, start: datetime, end: datetime,
                    intervals: Sequence[tuple[str, int, str, datetime, datetime]]) -> dict[str, CardTime]:
    """What the card-minutes of [start, end) inside `intervals` (label, node id, GPU UUID, since,
    until) cost, per label, exactly as the ledger priced each minute; a label whose intervals hold
    no priced minute is absent."""
    if not intervals:
        return {}
    labels, nodes, uuids, starts, ends = (list(column) for column in zip(*intervals, strict=True))
    with connection.cursor() as cur:
        cur.execute(_CARD_TIME, {"start": start, "end": end, "labels": labels, "nodes": nodes, "uuids": uuids,
                                 "starts": starts, "ends": ends})
        return {row.label: row for row in fetch_rows(cur, CardTime)}


# -- the pool rebalance ----------------------------------------------------------------------

@dataclass(frozen=True)
class PodMinuteDemand:
    """One pod on one GPU in one minute: the sum over its containers of their mean billed amount,
    max(used, granted) per second, i.e. what the agent reserved for them or, above it, what they used."""

    pod_uid: str
    gpu_uuid: str
    minute: datetime
    mem_mb: Decimal
    sm: Decimal  # SMs (SM·s per second)


def list_pod_minute_demand(*, start: datetime, end: datetime, gpus: Collection[str]) -> list[PodMinuteDemand]:
    """Minutes in [start, end) with metered time, on these GPUs (the days read analysed first when
    stale, as for the paired report)."""
    analyze_minute_days(start=start, end=end)
    rows = (
        UsageMinute.objects.filter(minute__gte=start, minute__lt=end, seconds__gt=0, gpu_uuid__in=list(gpus))
        .values("pod_uid", "gpu_uuid", "minute")
        .annotate(mem=Sum(F("mem_billed_mb_s") / F("seconds")), sm=Sum(F("sm_billed_s") / F("seconds")))
    )
    return [PodMinuteDemand(pod_uid=r["pod_uid"], gpu_uuid=r["gpu_uuid"], minute=r["minute"],
                            mem_mb=Decimal(r["mem"]), sm=Decimal(r["sm"])) for r in rows]


@dataclass(frozen=True)
class PodPlacement:
    """A pod seen on a GPU (one row per pod identity and GPU)."""

    pod_uid: str
    gpu_uuid: str
    namespace: str
    pod: str
    tenant: str


def list_recent_placements(*, start: datetime, end: datetime, gpus: Collection[str]) -> list[PodPlacement]:
    """Who ran where in [start, end), on these GPUs."""
    rows = (
        UsageMinute.objects.filter(minute__gte=start, minute__lt=end, gpu_uuid__in=list(gpus))
        .values("pod_uid", "gpu_uuid", "namespace", "pod", "tenant")
        .distinct()
    )
    return [PodPlacement(**r) for r in rows]


# -- rate cards ------------------------------------------------------------------------------

def get_last_ledger_minute(*, gpu_model: str, since: datetime) -> datetime | None:
    """The newest ledger minute of `gpu_model` at or after `since`: how far a price change must
    re-price the ledger."""
    last: datetime | None = (GpuMinute.objects.filter(gpu_model=gpu_model, minute__gte=since)
                             .aggregate(last=Max("minute"))["last"])
    return last
