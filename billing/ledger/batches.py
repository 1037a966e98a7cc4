"""Accepted batches, their GPUs and their integral rows: how ingest writes them (docs/protocol.md).

One call stores one validated batch inside the caller's transaction: the GPU claims, the batch
row (unique per node and batch_seq), its GPU rows, its integral rows (per workload, GPU and
minute) through COPY into the day-partitioned raw table, the node's cluster and one WorkloadMeta row per pod (the optional
grouping fields, docs/protocol.md). A retry of the same content answers "duplicate" and writes
nothing.
"""

from __future__ import annotations

import io
import json
import logging
from dataclasses import dataclass, field
from datetime import date, datetime, timedelta
from typing import Any

from django.db import connection
from django.db.backends.utils import CursorWrapper

from billing.errors import BatchConflict, Forbidden
from billing.ledger.ids import card_ids
from billing.ledger.partitions import RAW_TABLE, ensure_raw_partitions
from billing.models import Node

__all__ = ["COPY_COLUMNS", "BatchGpuDecl", "IngestResult", "PodMeta", "ValidatedBatch", "overlap_message",
           "prepare_partitions", "store_batch"]

log = logging.getLogger(__name__)

COPY_COLUMNS = (
    "batch_id, node_id, gpu_uuid, start, seconds, tenant, namespace, pod, container, pod_uid, "
    "sla_tier, mem_used_mb_s, mem_granted_mb_s, mem_billed_mb_s, sm_used_s, sm_granted_s, sm_billed_s, pcie_mb"
)


@dataclass(frozen=True)
class BatchGpuDecl:
    uuid: str
    model: str
    memory_mb: int
    sm_count: int
    energy_j: float | None = None  # drawn over the whole window, when the agent metered it


@dataclass(frozen=True)
class PodMeta:
    """What a batch says about one pod beyond the ledger's key: the WorkloadMeta upsert's row.

    Empty means "not reported" (no controller, no labels, no requests), which never erases what
    an agent reported before."""

    namespace: str
    pod: str
    pod_uid: str
    controller_kind: str = ""
    controller_name: str = ""
    labels: dict[str, str] = field(default_factory=dict)
    # container -> {"mem_mb": int, "sm": number}, only the keys the samples carried
    requests: dict[str, dict[str, float]] = field(default_factory=dict)


@dataclass(frozen=True)
class ValidatedBatch:
    node: str
    batch_seq: int
    window_start: datetime
    window_end: datetime
    gpus: tuple[BatchGpuDecl, ...]
    # COPY rows: (gpu_uuid, start, seconds, tenant, namespace, pod, container, pod_uid, sla_tier,
    # mem_used_mb_s, mem_granted_mb_s, mem_billed_mb_s, sm_used_s, sm_granted_s, sm_billed_s, pcie_mb):
    # integrals of one workload on one GPU inside one UTC minute, billed = Σ per-second max(used,
    # granted). A v1 sample that crosses a minute boundary is split pro rata (integrals are assumed
    # uniform inside a sample); ingest then sums a batch's rows per workload-minute where that is
    # exact (billing.services.ingest.batch_validation.summed_per_minute).
    rows: list[tuple[Any, ...]]
    sample_count: int
    cluster: str | None = None  # the batch's optional `cluster`; None: not reported
    pods: tuple[PodMeta, ...] = ()  # one per distinct (namespace, pod, pod_uid) of the samples


@dataclass(frozen=True)
class IngestResult:
    status: str  # "stored" | "duplicate"
    accepted: int
    batch_id: int


def _copy_buffer(batch_id: int, node_id: int, batch: ValidatedBatch) -> io.StringIO:
    # Names were validated against a pattern without tabs, newlines or backslashes, so
    # COPY's text format needs no escaping. Numbers use repr (shortest round-trip form).
    # Timestamps and name tuples repeat across a batch's samples: render each once.
    prefix = f"{batch_id}\t{node_id}\t"
    times: dict[datetime, str] = {}
    names: dict[tuple[str, ...], str] = {}
    lines = []
    for r in batch.rows:
        start = times.get(r[1])
        if start is None:
            start = times[r[1]] = r[1].isoformat()
        key = r[3:9]
        named = names.get(key)
        if named is None:
            named = names[key] = "\t".join(key)
        lines.append(f"{prefix}{r[0]}\t{start}\t{r[2]!r}\t{named}\t{r[9]!r}\t{r[10]!r}\t{r[11]!r}\t{r[12]!r}\t{r[13]!r}"
                     f"\t{r[14]!r}\t{r[15]!r}\n")
    return io.StringIO("".join(lines))


def prepare_partitions(batch: ValidatedBatch) -> None:
    """Create the raw days the batch will be copied into, in a transaction of its own: call it
    before `store_batch`'s transaction (billing.ledger.partitions says why)."""
    if batch.rows:
        ensure_raw_partitions(_partition_days(batch))


def _partition_days(batch: ValidatedBatch) -> set[date]:
    """UTC days the batch window touches; every sample lies inside the window."""
    last = batch.window_end - timedelta(microseconds=1)
    return {batch.window_start.date() + timedelta(days=d) for d in range((last.date() - batch.window_start.date()).days + 1)}


def overlap_message(batch: ValidatedBatch) -> str:
    """Which stored batch holds the GPU-seconds this one declares again (read after the rollback)."""
    with connection.cursor() as cur:
        cur.execute(
            "SELECT c.gpu_uuid, n.name, b.batch_seq, g.window_start, g.window_end FROM billing_card c "
            "JOIN billing_batchgpu g ON g.card_id = c.id JOIN billing_usagebatch b ON b.id = g.batch_id "
            "JOIN billing_node n ON n.id = b.node_id "
            "WHERE c.gpu_uuid = ANY(%s) AND g.window_start < %s AND g.window_end > %s "
            "ORDER BY g.window_start LIMIT 1",
            [[g.uuid for g in batch.gpus], batch.window_end, batch.window_start],
        )
        row = cur.fetchone()
    if row is None:  # the other batch went away since (it cannot: batch GPUs are immutable)
        return "overlaps a stored batch for the same GPU; a GPU-second may be metered once"
    uuid, node, seq, start, end = row
    return (f"overlaps batch_seq {seq} of node {node!r} for GPU {uuid} ({start.isoformat()} to "
            f"{end.isoformat()}); a GPU-second may be metered once")


def _claim_gpus(cur: CursorWrapper, *, node: Node, columns: tuple[list[str], list[str], list[int], list[int]],
                now: datetime) -> None:
    """A GPU belongs to the first node that declares it, until an admin reassigns it
    (billing.services.fleet.gpu_ownership). Another node's batch naming it is refused before anything
    is stored, so it can neither bill usage to that GPU nor block its owner's windows."""
    owners = _owners(cur, columns[0])
    if len(owners) < len(columns[0]):  # a GPU seen for the first time: claim it, then look again
        cur.execute(
            "INSERT INTO billing_gpu (uuid, node_id, model, memory_mb, sm_count, first_seen_at, last_seen_at) "
            "SELECT v.uuid, %s, v.model, v.memory_mb, v.sm_count, %s, %s "
            "FROM unnest(%s::varchar[], %s::varchar[], %s::int[], %s::int[]) AS v(uuid, model, memory_mb, sm_count) "
            "ON CONFLICT (uuid) DO NOTHING",
            [node.pk, now, now, *columns],
        )
        # A statement of its own: it sees a claim that a concurrent first batch committed meanwhile.
        owners = _owners(cur, columns[0])
    foreign = sorted((uuid, name) for uuid, (node_id, name) in owners.items() if node_id != node.pk)
    if foreign:
        raise Forbidden("; ".join(f"GPU {uuid} belongs to node {owner!r}, not {node.name!r}" for uuid, owner in foreign)
                        + " (an admin moves a GPU with `manage.py reassign_gpu`)")


def _owners(cur: CursorWrapper, uuids: list[str]) -> dict[str, tuple[int, str]]:
    """uuid -> (node id, node name) of the GPUs already claimed: one index read per batch."""
    cur.execute("SELECT g.uuid, g.node_id, n.name FROM billing_gpu g JOIN billing_node n ON n.id = g.node_id "
                "WHERE g.uuid = ANY(%s)", [uuids])
    return {uuid: (node_id, name) for uuid, node_id, name in cur.fetchall()}


# GPU inventory and node liveness are written at most once per this interval per web
# process for an unchanged (node, GPUs) declaration: they are inventory, not billing data
# (billing uses each batch's own GPU rows), and rewriting 9 rows per batch costs ingest
# about a millisecond (docs/benchmarks.md).
_SEEN_REFRESH = timedelta(seconds=60)
_seen: dict[tuple[object, ...], datetime] = {}


def store_batch(*, node: Node, batch: ValidatedBatch, digest: str, now: datetime) -> IngestResult:
    # Sorted: the overlap trigger locks per GPU, and one lock order means no deadlocks.
    gpus = sorted(batch.gpus, key=lambda g: g.uuid)
    columns = (
        [g.uuid for g in gpus],
        [g.model for g in gpus],
        [g.memory_mb for g in gpus],
        [g.sm_count for g in gpus],
    )
    with connection.cursor() as cur:
        _claim_gpus(cur, node=node, columns=columns, now=now)
        # The batch's cards (the node's GPUs as declared), made the first time they are seen.
        cards = card_ids(cur, {(node.pk, g.uuid, g.model) for g in gpus})
        # One round trip: the batch row and, only if it is new, its GPU rows.
        cur.execute(
            "WITH b AS (INSERT INTO billing_usagebatch (node_id, batch_seq, content_sha256, window_start, "
            "window_end, sample_count, received_at) VALUES (%s, %s, %s, %s, %s, %s, %s) "
            "ON CONFLICT (node_id, batch_seq) DO NOTHING RETURNING id), "
            "g AS (INSERT INTO billing_batchgpu (batch_id, card_id, memory_mb, sm_count, window_start, window_end, "
            "energy_j) SELECT b.id, v.card_id, v.memory_mb, v.sm_count, %s, %s, v.energy_j::numeric "
            "FROM b, unnest(%s::int[], %s::int[], %s::int[], %s::float8[]) "
            "WITH ORDINALITY AS v(card_id, memory_mb, sm_count, energy_j, ord) ORDER BY v.ord) "
            "SELECT id FROM b",
            [node.pk, batch.batch_seq, digest, batch.window_start, batch.window_end, batch.sample_count, now,
             batch.window_start, batch.window_end, [cards[(node.pk, g.uuid, g.model)] for g in gpus],
             columns[2], columns[3], [g.energy_j for g in gpus]],
        )
        row = cur.fetchone()
        if row is None:
            cur.execute(
                "SELECT id, content_sha256, sample_count FROM billing_usagebatch WHERE node_id = %s AND batch_seq = %s",
                [node.pk, batch.batch_seq],
            )
            existing_id, existing_digest, count = cur.fetchone()
            if existing_digest != digest:
                raise BatchConflict(
                    f"batch_seq {batch.batch_seq} of node {node.name} was already stored with different content"
                )
            return IngestResult(status="duplicate", accepted=count, batch_id=existing_id)
        batch_id = row[0]
        seen_key = (node.pk, *(tuple(c) for c in columns))
        last = _seen.get(seen_key)
        if last is None or now - last >= _SEEN_REFRESH:
            cur.execute(
                "WITH n AS (UPDATE billing_node SET last_seen_at = %s WHERE id = %s) "
                "INSERT INTO billing_gpu (uuid, node_id, model, memory_mb, sm_count, first_seen_at, last_seen_at) "
                "SELECT v.uuid, %s, v.model, v.memory_mb, v.sm_count, %s, %s "
                "FROM unnest(%s::varchar[], %s::varchar[], %s::int[], %s::int[]) AS v(uuid, model, memory_mb, sm_count) "
                "ON CONFLICT (uuid) DO UPDATE SET model = EXCLUDED.model, "
                "memory_mb = EXCLUDED.memory_mb, sm_count = EXCLUDED.sm_count, last_seen_at = EXCLUDED.last_seen_at "
                "WHERE billing_gpu.node_id = EXCLUDED.node_id",
                [now, node.pk, node.pk, now, now, *columns],
            )
            connection.on_commit(lambda: _seen.__setitem__(seen_key, now))
        if batch.rows:
            ensure_raw_partitions(_partition_days(batch))  # done already by `prepare_partitions`: a cache hit
            cur.copy_expert(f"COPY {RAW_TABLE} ({COPY_COLUMNS}) FROM STDIN", _copy_buffer(batch_id, node.pk, batch))
        if batch.cluster is not None:
            _store_cluster(cur, node=node, cluster=batch.cluster)
        if batch.pods:
            _upsert_pods(cur, node, batch)
    return IngestResult(status="stored", accepted=batch.sample_count, batch_id=batch_id)


def _store_cluster(cur: CursorWrapper, *, node: Node, cluster: str) -> None:
    """The node's cluster is the one it last reported. A node that moves to another cluster (a
    re-registered machine keeping its name) moves with all its history: a pod's cluster is its
    node's, kept in one place, so grouping by cluster always shows where the node is now. The
    UPDATE is skipped when nothing changes, so steady batches write no node row."""
    cur.execute("UPDATE billing_node n SET cluster = %s FROM billing_node o "
                "WHERE n.id = %s AND o.id = n.id AND o.cluster <> %s RETURNING o.cluster", [cluster, node.pk, cluster])
    row = cur.fetchone()
    if row is not None:
        log.info("node %s now reports cluster %r (was %r)", node.name, cluster, row[0])


# One statement per batch, whatever its number of pods. On conflict, what the batch did not report
# keeps its stored value (an older agent's batch, or one from before the allow-list named a label,
# erases nothing: no controller, no labels and no requests mean "not reported"), and a batch older
# than what is stored (a spool replayed late, the demo's history) changes only first_seen: the labels
# and controller are those of the newest report. Requests merge per container, the newer report
# winning for a container both name. Rows go in key order, so two batches naming the same pods
# (retries racing each other) lock them in one order and cannot deadlock. The row is the reporting
# node's own (node, namespace, pod, pod_uid): a node describes only the pods it runs, and what it
# says never touches another node's row, whatever pod names its batch carries. A new row has no hour
# rows yet (the rollup writes them from it); a row whose requests this changes is flagged until the
# rollup stores its hours' requested figures again (billing.ledger.requests).
_UPSERT_PODS = """
INSERT INTO billing_workloadmeta AS w
    (node_id, namespace, pod, pod_uid, controller_kind, controller_name, labels, requests, first_seen, last_seen,
     requests_changed)
SELECT %s, v.namespace, v.pod, v.pod_uid, v.kind, v.name, v.labels, v.requests, %s, %s, false
FROM unnest(%s::varchar[], %s::varchar[], %s::varchar[], %s::varchar[], %s::varchar[], %s::jsonb[], %s::jsonb[])
    AS v(namespace, pod, pod_uid, kind, name, labels, requests)
ORDER BY v.namespace, v.pod, v.pod_uid
ON CONFLICT (node_id, namespace, pod, pod_uid) DO UPDATE SET
    controller_kind = CASE WHEN EXCLUDED.controller_kind <> '' AND EXCLUDED.last_seen >= w.last_seen
                           THEN EXCLUDED.controller_kind ELSE w.controller_kind END,
    controller_name = CASE WHEN EXCLUDED.controller_kind <> '' AND EXCLUDED.last_seen >= w.last_seen
                           THEN EXCLUDED.controller_name ELSE w.controller_name END,
    labels = CASE WHEN EXCLUDED.labels <> '{}'::jsonb AND EXCLUDED.last_seen >= w.last_seen
                  THEN EXCLUDED.labels ELSE w.labels END,
    requests = CASE WHEN EXCLUDED.last_seen >= w.last_seen THEN w.requests || EXCLUDED.requests
                    ELSE EXCLUDED.requests || w.requests END,
    requests_changed = w.requests_changed OR CASE WHEN EXCLUDED.last_seen >= w.last_seen
                                                  THEN w.requests || EXCLUDED.requests
                                                  ELSE EXCLUDED.requests || w.requests END <> w.requests,
    first_seen = LEAST(w.first_seen, EXCLUDED.first_seen),
    last_seen = GREATEST(w.last_seen, EXCLUDED.last_seen)
"""


def _upsert_pods(cur: CursorWrapper, node: Node, batch: ValidatedBatch) -> None:
    pods = batch.pods
    cur.execute(_UPSERT_PODS, [
        node.pk, batch.window_start, batch.window_end,
        [p.namespace for p in pods], [p.pod for p in pods], [p.pod_uid for p in pods],
        [p.controller_kind for p in pods], [p.controller_name for p in pods],
        [json.dumps(p.labels, sort_keys=True) for p in pods], [json.dumps(p.requests, sort_keys=True) for p in pods],
    ])
