"""An invoice's usage by workload: the exact sums behind each usage line (tenant, GPU model, SLA
tier), split by namespace and workload, read from the same rows the line is (every workload-hour of
the period on a wholly priced GPU-hour, billing.ledger.spend), so a line's workloads add up to its
amount exactly at ledger precision. billing.services.invoicing rounds them.

A workload is the controller that owns the pod (`<kind>:<name>`, lower-case kind, from WorkloadMeta,
as the allocation API names it), or the pod itself (`pod:<name>`) when no controller was reported:
pods of a Deployment come and go over a month under new names, their controller stays.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal

from billing.ledger.models import WorkloadMeta
from billing.ledger.reads import fetch_rows, period_read_cursor

__all__ = ["InvoiceWorkloadRow", "list_invoice_workloads"]

_META = WorkloadMeta._meta.db_table


@dataclass(frozen=True)
class InvoiceWorkloadRow:
    tenant: str
    gpu_model: str
    sla_tier: str
    namespace: str
    workload: str
    charge: Decimal
    share_gpu_s: Decimal


_SQL = (
    "SELECT u.tenant, g.gpu_model, u.sla_tier, u.namespace,"  # noqa: S608 - fixed SQL; values are parameters
    " CASE WHEN coalesce(m.controller_name, '') = '' THEN 'pod:' || u.pod"
    " WHEN coalesce(m.controller_kind, '') = '' THEN m.controller_name"
    " ELSE lower(m.controller_kind) || ':' || m.controller_name END AS workload,"
    " sum(u.charge) AS charge, sum(u.share_gpu_s) AS share_gpu_s"
    " FROM billing_usagehour u JOIN billing_gpuhour g"
    " ON g.node_id = u.node_id AND g.gpu_uuid = u.gpu_uuid AND g.hour = u.hour"
    f" LEFT JOIN {_META} m ON m.node_id = u.node_id AND m.namespace = u.namespace AND m.pod = u.pod"
    " AND m.pod_uid = u.pod_uid"
    " WHERE u.hour >= %(start)s AND u.hour < %(end)s AND g.hour >= %(start)s AND g.hour < %(end)s AND g.priced"
    " AND (%(tenants)s::text[] IS NULL OR u.tenant = ANY(%(tenants)s::text[]))"
    " GROUP BY 1, 2, 3, 4, 5 ORDER BY 1, 2, 3, 4, 5"
)


def list_invoice_workloads(
    *, start: datetime, end: datetime, tenants: Collection[str] | None = None
) -> list[InvoiceWorkloadRow]:
    """Priced usage of [start, end) per (tenant, GPU model, SLA tier, namespace, workload), exact."""
    params = {"start": start, "end": end, "tenants": None if tenants is None else sorted(tenants)}
    with period_read_cursor() as cur:
        cur.execute(_SQL, params)
        return fetch_rows(cur, InvoiceWorkloadRow)
