"""Time series of the ledger: sums per UTC hour or day bucket over a period. Hour buckets read
the hour ledger; day buckets read the day ledger when the period is whole UTC days
(billing.ledger.reads.bucketed_ledger). One SQL statement per function; buckets without rows are
absent (the caller lays out every bucket of the period).
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import Decimal

from django.db import connection
from django.db.models import F, Sum
from django.db.models.functions import Trunc

from billing.ledger.reads import Granularity, bucketed_ledger

__all__ = [
    "IdleBucket",
    "TenantCostBucket",
    "UsedBucket",
    "UtilisationBucket",
    "list_platform_idle_buckets",
    "list_tenant_cost_buckets",
    "list_utilisation_buckets",
]

_ZERO = Decimal(0)


@dataclass(frozen=True)
class TenantCostBucket:
    bucket: datetime  # bucket start, UTC
    tenant: str
    cost: Decimal  # charge + idle share, ledger precision


@dataclass(frozen=True)
class UsedBucket:
    """What the workloads of one bucket used of the GPUs in the inventory (billing_gpu)."""

    bucket: datetime
    sm_used_s: Decimal
    mem_used_mb_s: Decimal


# The cost chart's and the fleet's use per bucket in one pass over the period's usage rows: they
# were a read each of the same rows (a month's 218k usage-days at 1,000 GPUs: 0.45 s for the two
# statements, 0.36 s for this and the capacity's, wall time on the loaded 2-core machine). Each
# bucket's use is its tenants' summed (exact; GROUPING SETS over the rows took 0.44 s on its own:
# it sorts them all). A row on a GPU missing from the inventory counts in its tenant's cost and
# never in the use (its capacity is unknown: list_utilisation_buckets).
_COST_AND_USE = """
WITH t AS (
    SELECT date_trunc(%(kind)s, u.{at}, 'UTC') AS bucket, u.tenant, sum(u.charge + u.idle_share) AS cost,
           coalesce(sum(u.sm_used_s) FILTER (WHERE g.uuid IS NOT NULL), 0) AS sm_used_s,
           coalesce(sum(u.mem_used_mb_s) FILTER (WHERE g.uuid IS NOT NULL), 0) AS mem_used_mb_s
    FROM {usage_table} u LEFT JOIN billing_gpu g ON g.uuid = u.gpu_uuid
    WHERE u.{at} >= %(start)s AND u.{at} < %(end)s
      AND (%(tenants)s::text[] IS NULL OR u.tenant = ANY(%(tenants)s::text[]))
    GROUP BY 1, 2
)
SELECT bucket, tenant, cost, NULL::numeric AS sm_used_s, NULL::numeric AS mem_used_mb_s FROM t
UNION ALL
SELECT bucket, NULL, NULL, sum(sm_used_s), sum(mem_used_mb_s) FROM t GROUP BY 1
"""


def list_tenant_cost_buckets(*, start: datetime, end: datetime, granularity: Granularity,
                             tenants: Collection[str] | None) -> tuple[list[TenantCostBucket], list[UsedBucket]]:
    """One row per (bucket, tenant) with usage, `tenants` only unless None; and per bucket with
    usage what those tenants' workloads used (with every tenant's, the fleet's use:
    list_utilisation_buckets)."""
    ledger = bucketed_ledger(start, end, granularity)
    costs, used = [], []
    with connection.cursor() as cur:
        cur.execute(_COST_AND_USE.format(at=ledger.at, usage_table=ledger.usage_table),
                    {"kind": granularity, "start": start, "end": end,
                     "tenants": None if tenants is None else sorted(tenants)})
        for bucket, tenant, cost, sm_used_s, mem_used_mb_s in cur.fetchall():
            if tenant is None:  # a bucket's use (no usage row lacks its tenant)
                used.append(UsedBucket(bucket, sm_used_s, mem_used_mb_s))
            else:
                costs.append(TenantCostBucket(bucket, tenant, cost))
    return costs, used


@dataclass(frozen=True)
class IdleBucket:
    bucket: datetime
    idle_platform: Decimal  # idle cost not spread onto tenants


def list_platform_idle_buckets(*, start: datetime, end: datetime, granularity: Granularity) -> list[IdleBucket]:
    ledger = bucketed_ledger(start, end, granularity)
    rows = (ledger.gpu_rows(start, end).annotate(bucket=Trunc(ledger.at, granularity, tzinfo=UTC)).values("bucket")
            .annotate(idle=Sum(F("idle_cost") - F("idle_allocated"))).order_by())
    return [IdleBucket(bucket=r["bucket"], idle_platform=r["idle"] or _ZERO) for r in rows]


@dataclass(frozen=True)
class UtilisationBucket:
    """Fleet figures for one bucket. SM·s: one SM busy for one second (docs/protocol.md); MB are MiB as
    NVML reports them."""

    bucket: datetime
    metered_gpu_s: Decimal  # Σ GPU-seconds metered (every GPU of every batch, busy or not)
    sm_used_s: Decimal  # Σ SM·s used by workloads
    sm_capacity_s: Decimal  # Σ sm_count × metered seconds
    mem_used_mb_s: Decimal  # Σ MB·s used by workloads
    mem_capacity_mb_s: Decimal  # Σ memory_mb × metered seconds


# GPU capacity comes from the inventory (billing_gpu: memory_mb, sm_count per uuid); usage on a GPU
# missing from it is left out of the use as well (list_tenant_cost_buckets), so a ratio never mixes
# a numerator without its denominator.
_CAPACITY = """
SELECT date_trunc(%(kind)s, h.{at}, 'UTC') AS bucket, sum(h.metered_seconds) AS seconds,
       sum(h.metered_seconds * g.sm_count) AS sm_cap, sum(h.metered_seconds * g.memory_mb) AS mem_cap
FROM {gpu_table} h JOIN billing_gpu g ON g.uuid = h.gpu_uuid
WHERE h.{at} >= %(start)s AND h.{at} < %(end)s
GROUP BY 1
ORDER BY 1
"""


def list_utilisation_buckets(*, start: datetime, end: datetime, granularity: Granularity,
                             used: Sequence[UsedBucket]) -> list[UtilisationBucket]:
    """Buckets with metered GPU time, in time order: their GPU rows' capacity and what workloads
    used of it, from `used` (list_tenant_cost_buckets' of every tenant, same period and buckets)."""
    ledger = bucketed_ledger(start, end, granularity)
    by_bucket = {u.bucket: u for u in used}
    with connection.cursor() as cur:
        cur.execute(_CAPACITY.format(at=ledger.at, gpu_table=ledger.gpu_table),
                    {"kind": granularity, "start": start, "end": end})
        rows = cur.fetchall()
    out = []
    for bucket, seconds, sm_cap, mem_cap in rows:
        use = by_bucket.get(bucket, UsedBucket(bucket, _ZERO, _ZERO))
        out.append(UtilisationBucket(bucket=bucket, metered_gpu_s=seconds, sm_used_s=use.sm_used_s,
                                     sm_capacity_s=sm_cap, mem_used_mb_s=use.mem_used_mb_s, mem_capacity_mb_s=mem_cap))
    return out
