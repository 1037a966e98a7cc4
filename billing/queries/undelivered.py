"""Undelivered batches: usage an agent holds that this service refused, until a re-drive lands it.

A report is open while the node has no stored batch that resolves it: one with the report's
`batch_seq` and content (a re-drive of the same bytes), or one numbered `superseded_by` (a
re-drive that renumbered it). Computed when read, so an ingest never has to know about reports.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from django.db.models import Count, QuerySet

from billing.ledger.state import unresolved
from billing.models import UndeliveredBatch

__all__ = ["UndeliveredView", "count_open_undelivered", "count_open_undelivered_by_node", "list_open_undelivered"]


@dataclass(frozen=True)
class UndeliveredView:
    node: str
    batch_seq: int
    window_start: datetime
    window_end: datetime
    sample_count: int
    size_bytes: int
    status_code: int
    reason: str
    superseded_by: int | None
    first_reported_at: datetime
    last_reported_at: datetime


def _open() -> QuerySet[UndeliveredBatch]:
    return unresolved(UndeliveredBatch.objects.all())


def list_open_undelivered() -> dict[str, list[UndeliveredView]]:
    """Open reports by node name, oldest batch first (admins only: the callers check the role)."""
    by_node: dict[str, list[UndeliveredView]] = {}
    for u in _open().select_related("node").order_by("node__name", "batch_seq"):
        by_node.setdefault(u.node.name, []).append(UndeliveredView(
            node=u.node.name, batch_seq=u.batch_seq, window_start=u.window_start, window_end=u.window_end,
            sample_count=u.sample_count, size_bytes=u.size_bytes, status_code=u.status_code, reason=u.reason,
            superseded_by=u.superseded_by, first_reported_at=u.first_reported_at,
            last_reported_at=u.last_reported_at,
        ))
    return by_node


def count_open_undelivered() -> int:
    return _open().count()


def count_open_undelivered_by_node() -> dict[str, int]:
    """Open reports per node name; nodes with none are absent."""
    rows = _open().values_list("node__name").annotate(n=Count("id")).order_by("node__name")
    return {name: int(n) for name, n in rows}
