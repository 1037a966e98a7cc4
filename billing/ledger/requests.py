"""What each container asked for, with its usage: the requested figures (a container's request per
GPU from its WorkloadMeta.requests, x the seconds it ran), which the allocation API and the
drill-down show beside what was used and granted.

The hour, day and month rows store them (`mem_requested_mb_s`, `sm_requested_s`): a read of a
week's hours at 1,000 GPUs joined each of its 922k rows to the requests, and that join was 0.4 of
the 1.0 s of the hourly allocation sets' statement (docs/architecture.md, "Requests stored in the
ledger rows"). The rollup writes an hour's from the metadata, a day's and a month's as the sums of
their hours' and days' (`requested_sums`).

A pod's requests can change after its rows were written (a later batch reports new ones, a
Kubernetes in-place resize), and the figures read are always those of the requests stored now, as a
join gives them. So the ingest that changes a pod's requests flags its metadata (`requests_changed`),
in the same statement; the rollup of the pod's node stores its rows' figures again and clears the
flag, in its own transaction under the node's lock (`store_changed_requests`); and a read takes the
stored figures only for the pods not flagged, the request from the metadata for the others: a read
that joins each row's metadata anyway reads the flag there (`row_requested_sql`), the others join
the flagged rows only, none or a few (`stored_requested`). Nothing waits for the rollup to be right.

Why this holds without a lock between ingest and rollup: the flag is set and cleared on the metadata
row, whose row lock orders them. A rollup's rows read the requests of their statement's snapshot; an
ingest that commits after it leaves the flag set, and the flag stays set until a later rollup of the
node (the batch that carried the change is pending for that node, so there is one) stores them
again. A pod's rows all lie in its metadata's [first_seen, last_seen) (every pod a batch meters is
upserted with the batch's window), which bounds what storing them again reads.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from django.db import connection
from django.db.backends.utils import CursorWrapper

from billing.ledger.models import Card, UsageDay, UsageHour, UsageMonth, WorkloadMeta

__all__ = ["REQUESTED_COLUMNS", "StoredRequested", "requested_sql", "requested_sums", "row_requested_sql",
           "store_changed_requests", "store_requests", "stored_requested"]

_HOUR = UsageHour._meta.db_table
_DAY = UsageDay._meta.db_table
_MONTH = UsageMonth._meta.db_table
_META = WorkloadMeta._meta.db_table
_CARD = Card._meta.db_table

# The request's key in WorkloadMeta.requests -> the ledger rows' column that stores it x seconds.
REQUESTED_COLUMNS = {"mem_mb": "mem_requested_mb_s", "sm": "sm_requested_s"}
_STORED = ", ".join(REQUESTED_COLUMNS.values())


def _of_pod(meta: str) -> str:
    """The metadata row `meta` of the ledger row `u`: its node's, of its pod instance."""
    return (f"{meta}.node_id = u.node_id AND {meta}.namespace = u.namespace AND {meta}.pod = u.pod "
            f"AND {meta}.pod_uid = u.pod_uid")


def requested_sums(alias: str) -> str:
    """The requested figures of rows `alias` summed into one (a day from its hours, a month from its
    days), unknown where any row's is: the same as the request times the summed seconds, since a
    workload's rows carry one request."""
    return ", ".join(f"CASE WHEN bool_and({alias}.{c} IS NOT NULL) THEN sum({alias}.{c}) END"
                     for c in REQUESTED_COLUMNS.values())


def requested_sql(field: str, *, requests: str = "m.requests", container: str = "u.container",
                  seconds: str = "u.seconds") -> str:
    """A row's requested quantity x its seconds, NULL unless the container's request is a JSON number
    (a malformed one is unknown, not an error). The one expression every writer and reader uses."""
    value = f"{requests} -> {container} -> '{field}'"
    return f"(CASE WHEN jsonb_typeof({value}) = 'number' THEN ({value})::text::numeric * {seconds} END)"


# The pods whose stored figures are behind their requests (`f`), joined to the hour rows `u` of a read.
_CHANGED_JOIN = (
    f" LEFT JOIN (SELECT node_id, namespace, pod, pod_uid, requests FROM {_META} WHERE requests_changed) f "  # noqa: S608 - the model's own table
    f"ON {_of_pod('f')}"
)


@dataclass(frozen=True)
class StoredRequested:
    """What a read of ledger rows `u` adds to its FROM (`join`) and sums (`mem_mb`, `sm`) for its
    requested figures."""

    join: str
    mem_mb: str
    sm: str


def stored_requested() -> StoredRequested:
    """For a read that does not join each row's metadata: the stored figures, and where some pod's
    requests changed since they were stored, that pod's from its metadata instead (a join to the
    flagged rows).

    Asked before the read's statement, not in it: even a join to no rows hashes every row (0.15 s of
    a week's hourly sets at 1,000 GPUs). What a read sees is still one request's figures for each
    pod: a change that commits between the two statements leaves the pod's rows as they were (the
    request before it) until a rollup stores them all again, in one transaction."""
    with connection.cursor() as cur:
        cur.execute(f"SELECT EXISTS (SELECT 1 FROM {_META} WHERE requests_changed)")  # noqa: S608 - the model's own table
        changed = bool(cur.fetchone()[0])
    if not changed:
        return StoredRequested("", *(f"u.{column}" for column in REQUESTED_COLUMNS.values()))
    return StoredRequested(_CHANGED_JOIN, *(
        f"(CASE WHEN f.node_id IS NULL THEN u.{column} ELSE {requested_sql(field, requests='f.requests')} END)"
        for field, column in REQUESTED_COLUMNS.items()))


def row_requested_sql(field: str) -> str:
    """For a read that joins each row `u` its metadata `m` (its labels, its controller): the stored
    figure, or the metadata's where the pod's requests changed since it was stored."""
    return (f"(CASE WHEN m.requests_changed THEN {requested_sql(field, requests='m.requests')} "
            f"ELSE u.{REQUESTED_COLUMNS[field]} END)")


def _values(requests: str) -> str:
    return ", ".join(requested_sql(field, requests=requests) for field in REQUESTED_COLUMNS)


_CLEAR_FLAGS = (
    f"UPDATE {_META} SET requests_changed = false WHERE node_id = ANY(%s) AND requests_changed "  # noqa: S608 - the model's own table
    "RETURNING node_id, namespace, pod, pod_uid, first_seen, last_seen"
)


def _store_changed_in(table: str, at: str, unit: str) -> str:
    """The rows of `table` of the pods listed (arrays: node, namespace, pod, pod UID, first and last
    seen) with their figures from their metadata. Each pod's rows are found by the table's index
    (node, GPU, time), one probe per card of its node over its [first_seen, last_seen), behind a
    fence: joined by the planner, the cards and their rows were hashed for every node of the fleet
    (the whole table), however few the pods."""
    return (
        f"UPDATE {table} u SET ({_STORED}) = (SELECT {_values('m.requests')} "  # noqa: S608 - the models' own tables
        f"FROM {_META} m WHERE {_of_pod('m')}) WHERE u.ctid = ANY(ARRAY(SELECT r.ctid FROM unnest(%s::bigint[], "
        "%s::varchar[], %s::varchar[], %s::varchar[], %s::timestamptz[], %s::timestamptz[]) "
        f"AS c(node_id, namespace, pod, pod_uid, first_seen, last_seen) JOIN {_CARD} k ON k.node_id = c.node_id "
        f"CROSS JOIN LATERAL (SELECT r.ctid FROM {table} r WHERE r.node_id = c.node_id AND r.gpu_uuid = k.gpu_uuid "
        f"AND r.{at} >= date_trunc('{unit}', c.first_seen, 'UTC') AND r.{at} < c.last_seen AND r.namespace = c.namespace "
        "AND r.pod = c.pod AND r.pod_uid = c.pod_uid OFFSET 0) r))"
    )


_STORE_CHANGED = tuple(_store_changed_in(*t) for t in ((_HOUR, "hour", "hour"), (_DAY, "day", "day"),
                                                         (_MONTH, "month", "month")))


def store_changed_requests(cur: CursorWrapper, node_ids: list[int]) -> None:
    """Store again the requested figures of the hour, day and month rows of the pods on `node_ids`
    whose requests changed, and clear their flags. In the rollup's transaction, under the nodes'
    locks, after it wrote its hours and days. One statement when no pod is flagged, as nearly always."""
    cur.execute(_CLEAR_FLAGS, [node_ids])
    pods = cur.fetchall()
    if not pods:
        return
    columns = [list(c) for c in zip(*pods, strict=True)]
    for statement in _STORE_CHANGED:
        cur.execute(statement, columns)


def store_requests(cur: CursorWrapper, *, start: datetime, end: datetime, gpu_uuid: str | None = None) -> None:
    """The requested figures of the hour rows in [start, end) (of one GPU, or of all) from the
    metadata as it is now: for hour rows written other than by the rollup (rebuild_days). A row
    whose pod has no metadata has none (unknown), as a read's join gives it. Only the rows whose
    figures differ are written."""
    gpu = "" if gpu_uuid is None else " AND u.gpu_uuid = %s"
    params: list[datetime | str] = [start, end] if gpu_uuid is None else [start, end, gpu_uuid]
    stored = f"({', '.join(f'u.{c}' for c in REQUESTED_COLUMNS.values())})"
    cur.execute(
        f"UPDATE {_HOUR} u SET ({_STORED}) = ({_values('m.requests')}) FROM {_META} m "  # noqa: S608 - the models' own tables
        f"WHERE {_of_pod('m')} AND u.hour >= %s AND u.hour < %s{gpu} "
        f"AND {stored} IS DISTINCT FROM ({_values('m.requests')})",
        params,
    )
    cur.execute(
        f"UPDATE {_HOUR} u SET ({_STORED}) = (NULL, NULL) WHERE u.hour >= %s AND u.hour < %s{gpu} "  # noqa: S608 - the models' own tables
        f"AND {stored} IS DISTINCT FROM (NULL, NULL) AND NOT EXISTS (SELECT 1 FROM {_META} m WHERE {_of_pod('m')})",
        params,
    )
