"""Time series of the ledger: sums per UTC hour or day bucket over a period. Hour buckets read
the hour ledger; day buckets read the day ledger when the period is whole UTC days
(billing.ledger.reads.bucketed_ledger). One SQL statement per function; buckets without rows are
absent (the caller lays out every bucket of the period).
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import Decimal

from django.db import connection
from django.db.models import F, Sum
from django.db.models.functions import Trunc

from billing.ledger.reads import Granularity, bucketed_ledger, fetch_rows

__all__ = [
    "IdleBucket",
    "TenantCostBucket",
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


def list_tenant_cost_buckets(*, start: datetime, end: datetime, granularity: Granularity,
                             tenants: Collection[str] | None) -> list[TenantCostBucket]:
    """One row per (bucket, tenant) with usage; `tenants` only unless None."""
    ledger = bucketed_ledger(start, end, granularity)
    usage = ledger.usage_rows(start, end)
    if tenants is not None:
        usage = usage.filter(tenant__in=tenants)
    rows = (usage.annotate(bucket=Trunc(ledger.at, granularity, tzinfo=UTC)).values("bucket", "tenant")
            .annotate(cost=Sum(F("charge") + F("idle_share"))).order_by())
    return [TenantCostBucket(bucket=r["bucket"], tenant=r["tenant"], cost=r["cost"] or _ZERO) for r in rows]


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
# missing from it is left out as well, so a ratio never mixes a numerator without its denominator.
_UTILISATION = """
WITH cap AS (
    SELECT date_trunc(%(kind)s, h.{at}, 'UTC') AS bucket, sum(h.metered_seconds) AS seconds,
           sum(h.metered_seconds * g.sm_count) AS sm_cap, sum(h.metered_seconds * g.memory_mb) AS mem_cap
    FROM {gpu_table} h JOIN billing_gpu g ON g.uuid = h.gpu_uuid
    WHERE h.{at} >= %(start)s AND h.{at} < %(end)s
    GROUP BY 1
), used AS (
    SELECT date_trunc(%(kind)s, u.{at}, 'UTC') AS bucket, sum(u.sm_used_s) AS sm, sum(u.mem_used_mb_s) AS mem
    FROM {usage_table} u JOIN billing_gpu g ON g.uuid = u.gpu_uuid
    WHERE u.{at} >= %(start)s AND u.{at} < %(end)s
    GROUP BY 1
)
SELECT cap.bucket, cap.seconds AS metered_gpu_s, coalesce(used.sm, 0) AS sm_used_s, cap.sm_cap AS sm_capacity_s,
       coalesce(used.mem, 0) AS mem_used_mb_s, cap.mem_cap AS mem_capacity_mb_s
FROM cap LEFT JOIN used ON used.bucket = cap.bucket
ORDER BY cap.bucket
"""


def list_utilisation_buckets(*, start: datetime, end: datetime, granularity: Granularity) -> list[UtilisationBucket]:
    """Buckets with metered GPU time, in time order."""
    ledger = bucketed_ledger(start, end, granularity)
    sql = _UTILISATION.format(at=ledger.at, gpu_table=ledger.gpu_table, usage_table=ledger.usage_table)
    with connection.cursor() as cur:
        cur.execute(sql, {"kind": granularity, "start": start, "end": end})
        return fetch_rows(cur, UtilisationBucket)
