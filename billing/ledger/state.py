"""Where the ledger's intake stands: batches waiting for the rollup, quarantined batches, and
which undelivered-batch reports a stored batch has resolved. Reads only, each one indexed
statement (the partial indexes on rolled_up_at IS NULL and quarantined_at IS NOT NULL keep them to
the batches not yet billed, however many were).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import cast

from django.db import connection
from django.db.models import Exists, OuterRef, QuerySet

from billing.ledger.models import UsageBatch
from billing.ledger.reads import fetch_rows
from billing.models import UndeliveredBatch

__all__ = ["BatchBacklog", "QuarantinedBatch", "get_batch_backlog", "list_quarantined_batches", "stored_digests",
           "unresolved"]


@dataclass(frozen=True)
class BatchBacklog:
    pending: int  # stored, waiting for the rollup (not quarantined)
    oldest_pending_received_at: datetime | None
    quarantined: int

    def rollup_lag_s(self, now: datetime) -> float:
        """How long ago the oldest pending batch arrived; 0 when none is pending."""
        oldest = self.oldest_pending_received_at
        return max(0.0, (now - oldest).total_seconds()) if oldest else 0.0


def get_batch_backlog() -> BatchBacklog:
    with connection.cursor() as cur:
        cur.execute(
            "SELECT count(*) FILTER (WHERE quarantined_at IS NULL) AS pending, "
            "min(received_at) FILTER (WHERE quarantined_at IS NULL) AS oldest_pending_received_at, "
            "count(*) FILTER (WHERE quarantined_at IS NOT NULL) AS quarantined "
            "FROM billing_usagebatch WHERE rolled_up_at IS NULL"
        )
        (backlog,) = fetch_rows(cur, BatchBacklog)
    return backlog


@dataclass(frozen=True)
class QuarantinedBatch:
    batch_id: int
    node_id: int
    node: str  # node name
    batch_seq: int
    window_start: datetime
    window_end: datetime
    quarantined_at: datetime
    error: str


def list_quarantined_batches() -> list[QuarantinedBatch]:
    """Every quarantined batch, by node id then batch_seq (so also in id order per node)."""
    rows = (UsageBatch.objects.filter(quarantined_at__isnull=False).order_by("node_id", "batch_seq")
            .values_list("pk", "node_id", "node__name", "batch_seq", "window_start", "window_end",
                         "quarantined_at", "quarantine_error", named=True))
    return [
        QuarantinedBatch(batch_id=r.pk, node_id=r.node_id, node=r.node__name, batch_seq=r.batch_seq,
                         window_start=r.window_start, window_end=r.window_end,
                         # Never None: the filter above.
                         quarantined_at=cast(datetime, r.quarantined_at),
                         error=r.quarantine_error)
        for r in rows
    ]


def stored_digests(*, node_id: int, batch_seqs: list[int]) -> dict[int, str]:
    """batch_seq → content SHA-256 of the node's stored batches among `batch_seqs` (one indexed read):
    what an undelivered report is checked against before it is believed."""
    rows = UsageBatch.objects.filter(node_id=node_id, batch_seq__in=batch_seqs).values_list("batch_seq",
                                                                                            "content_sha256")
    return {int(seq): str(sha) for seq, sha in rows}


def unresolved(reports: QuerySet[UndeliveredBatch]) -> QuerySet[UndeliveredBatch]:
    """The reports no stored batch resolves: none with the report's `batch_seq` and content (a
    re-drive of the same bytes), none numbered `superseded_by` (a re-drive that renumbered it).
    Still a query of reports (no ledger row leaves), so callers keep composing it."""
    same_bytes = UsageBatch.objects.filter(
        node_id=OuterRef("node_id"), batch_seq=OuterRef("batch_seq"), content_sha256=OuterRef("content_sha256")
    )
    renumbered = UsageBatch.objects.filter(node_id=OuterRef("node_id"), batch_seq=OuterRef("superseded_by"))
    return reports.filter(~Exists(same_bytes), ~Exists(renumbered))
