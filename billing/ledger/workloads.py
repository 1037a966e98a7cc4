"""What Kubernetes said about each pod (WorkloadMeta: controller, allow-listed labels, requests),
read for a set of the ledger's pod keys. The optional batch fields land there at ingest
(billing.ledger.batches); this is the small read beside it, for callers that hold ledger rows and
want their pods' metadata. A query grouping the ledger by controller or label joins the table
itself, on the same key plus the node (each node describes only the pods it runs), inside
billing.ledger. A pod that ran on several nodes has a row from each; this read answers with the
one reported last."""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

from django.db import connection

from billing.ledger.reads import fetch_rows

__all__ = ["PodKey", "WorkloadMetaRow", "workload_meta"]

PodKey = tuple[str, str, str]  # (namespace, pod, pod_uid): the ledger rows' key of a pod


@dataclass(frozen=True)
class WorkloadMetaRow:
    namespace: str
    pod: str
    pod_uid: str
    controller_kind: str  # "" when no agent reported one
    controller_name: str
    labels: dict[str, str]
    requests: dict[str, dict[str, Any]]  # container -> {"mem_mb": int, "sm": number}, each key optional
    first_seen: datetime
    last_seen: datetime

    @property
    def key(self) -> PodKey:
        return (self.namespace, self.pod, self.pod_uid)


def workload_meta(keys: Iterable[PodKey]) -> dict[PodKey, WorkloadMetaRow]:
    """The stored metadata of the pods among `keys` that have any (one index read per key, one
    round trip), from the node that reported each last; pods never reported are absent."""
    wanted = sorted(set(keys))
    if not wanted:
        return {}
    with connection.cursor() as cur:
        cur.execute(
            "SELECT DISTINCT ON (w.namespace, w.pod, w.pod_uid) w.namespace, w.pod, w.pod_uid, w.controller_kind, w.controller_name, w.labels, w.requests, "
            "w.first_seen, w.last_seen FROM billing_workloadmeta w "
            "JOIN unnest(%s::varchar[], %s::varchar[], %s::varchar[]) AS k(namespace, pod, pod_uid) "
            "ON (w.namespace, w.pod, w.pod_uid) = (k.namespace, k.pod, k.pod_uid) "
            "ORDER BY w.namespace, w.pod, w.pod_uid, w.last_seen DESC, w.id DESC",
            [[k[0] for k in wanted], [k[1] for k in wanted], [k[2] for k in wanted]],
        )
        rows = fetch_rows(cur, WorkloadMetaRow)
    # Django's connection hands jsonb over as text (it decodes only through model fields).
    return {row.key: replace(row, labels=_json(row.labels), requests=_json(row.requests)) for row in rows}


def _json(value: Any) -> Any:
    return json.loads(value) if isinstance(value, str) else value
