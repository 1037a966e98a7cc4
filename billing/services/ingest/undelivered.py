"""Batches an agent could not deliver (POST /api/v1/nodes/{node}/undelivered).

An agent keeps every batch this service refused (400/409/413/415) and reports each one here, so
usage that is not billed is visible on the service (the nodes page, /healthz), not only in an
agent's log. Reports are validated as a whole and upserted on (node, batch_seq) in one
transaction: sending the same report twice changes nothing, and a later report of the same
batch (refused again, or renumbered by a re-drive) replaces the earlier one.

A node speaks only for itself, and only about what the service does not hold: a report is checked
against the node's stored batches. One naming a batch the node already delivered (same number and
content, or renumbered to a stored batch) is not undelivered and opens nothing (a report already
open is updated, which resolves it); a window no batch of
the node could have had (longer than a batch may span, or ending in the future beyond the allowed
clock skew) is refused with the rest of the request. A report degrades /healthz only past
VGPU_HEALTH_MAX_UNDELIVERED_BATCHES (billing.web.health).
"""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import transaction

from billing.errors import FieldError, InvalidBatch
from billing.ledger.state import stored_digests
from billing.models import Node, UndeliveredBatch

__all__ = ["MAX_REASON_CHARS", "MAX_REPORTS", "record_undelivered_batches"]

MAX_REPORTS = 100
MAX_REASON_CHARS = 4096  # the agent keeps this much of a refusal
_SEQ_LIMIT = 2**63  # batch_seq is a bigint, as on the batch itself
_MAX_WINDOW = timedelta(hours=1)  # as a batch's window (docs/protocol.md)
_SHA256_RE = re.compile(r"^[0-9a-f]{64}$")
_UPDATED = ("content_sha256", "window_start", "window_end", "sample_count", "size_bytes", "status_code", "reason",
            "superseded_by", "last_reported_at")


def record_undelivered_batches(*, node: Node, payload: Any, now: datetime) -> int:
    """Validate every report, then upsert them all in one transaction (all or nothing)."""
    reports = payload.get("batches") if isinstance(payload, dict) else None
    if not isinstance(reports, list) or not 1 <= len(reports) <= MAX_REPORTS:
        raise InvalidBatch([FieldError("$.batches", f"must be a list of 1 to {MAX_REPORTS} reports")])
    errors: list[FieldError] = []
    rows: dict[int, UndeliveredBatch] = {}
    for i, report in enumerate(reports):
        row = _row(node=node, report=report, path=f"$.batches[{i}]", now=now, errors=errors)
        if row is None:
            continue
        if row.batch_seq in rows:
            errors.append(FieldError(f"$.batches[{i}].batch_seq", "is reported twice in this request"))
        rows[row.batch_seq] = row
    if errors:
        raise InvalidBatch(errors[:50])
    # A delivered batch is not undelivered: no report of it is opened. One already open is still
    # updated (a re-drive reports the number it renumbered the batch to), which resolves it.
    delivered = _delivered(node, rows)
    held = set(UndeliveredBatch.objects.filter(node=node, batch_seq__in=delivered).values_list("batch_seq", flat=True))
    for seq in delivered - held:
        del rows[seq]
    if not rows:
        return 0
    with transaction.atomic():
        UndeliveredBatch.objects.bulk_create(
            list(rows.values()), update_conflicts=True, unique_fields=["node", "batch_seq"], update_fields=_UPDATED
        )
    return len(rows)


def _delivered(node: Node, rows: dict[int, UndeliveredBatch]) -> set[int]:
    """The reported batch numbers that the node's stored batches already resolve (one query)."""
    renumbered = [r.superseded_by for r in rows.values() if r.superseded_by is not None]
    stored = stored_digests(node_id=node.pk, batch_seqs=[*rows, *renumbered])
    return {seq for seq, row in rows.items()
            if stored.get(seq) == row.content_sha256 or (row.superseded_by is not None and row.superseded_by in stored)}


def _row(*, node: Node, report: Any, path: str, now: datetime, errors: list[FieldError]) -> UndeliveredBatch | None:
    if not isinstance(report, dict):
        errors.append(FieldError(path, "must be an object"))
        return None
    before = len(errors)
    seq = _integer(report.get("batch_seq"), f"{path}.batch_seq", 0, _SEQ_LIMIT, errors)
    window = report.get("window")
    start = end = None
    if not isinstance(window, dict):
        errors.append(FieldError(f"{path}.window", "must be an object with start and end"))
    else:
        start = _time(window.get("start"), f"{path}.window.start", errors)
        end = _time(window.get("end"), f"{path}.window.end", errors)
        if start is not None and end is not None and not start < end:
            errors.append(FieldError(f"{path}.window", "start must be before end"))
        elif start is not None and end is not None and end - start > _MAX_WINDOW:
            errors.append(FieldError(f"{path}.window", "spans more than one hour; no batch of this node can have "
                                                       "such a window"))
        if end is not None and end > now + settings.VGPU_INGEST_MAX_CLOCK_SKEW:
            errors.append(FieldError(f"{path}.window.end", "is in the future beyond the allowed clock skew; no "
                                                           "batch of this node can have been refused for it yet"))
    samples = _integer(report.get("samples"), f"{path}.samples", 0, 2**31, errors)
    size = _integer(report.get("size_bytes"), f"{path}.size_bytes", 0, _SEQ_LIMIT, errors)
    status = _integer(report.get("status"), f"{path}.status", 400, 500, errors)
    reason = report.get("reason")
    if not isinstance(reason, str) or len(reason) > MAX_REASON_CHARS or "\x00" in reason:
        errors.append(FieldError(f"{path}.reason", f"must be a string of at most {MAX_REASON_CHARS} characters"))
    sha = report.get("content_sha256")
    if not isinstance(sha, str) or not _SHA256_RE.match(sha):
        errors.append(FieldError(f"{path}.content_sha256", "must be 64 lowercase hexadecimal digits"))
    superseded = report.get("superseded_by")
    if superseded is not None:
        superseded = _integer(superseded, f"{path}.superseded_by", 0, _SEQ_LIMIT, errors)
        if superseded is not None and superseded == seq:
            errors.append(FieldError(f"{path}.superseded_by", "must differ from batch_seq"))
    # The None checks only narrow types: each None already added an error.
    if (len(errors) > before or seq is None or start is None or end is None or samples is None or size is None
            or status is None or not isinstance(reason, str) or not isinstance(sha, str)):
        return None
    return UndeliveredBatch(
        node=node, batch_seq=seq, content_sha256=sha, window_start=start, window_end=end, sample_count=samples,
        size_bytes=size, status_code=status, reason=reason, superseded_by=superseded, first_reported_at=now,
        last_reported_at=now,
    )


def _integer(value: Any, path: str, low: int, high: int, errors: list[FieldError]) -> int | None:
    """An integer in [low, high); JSON booleans are not integers."""
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value < high:
        errors.append(FieldError(path, f"must be an integer in [{low}, {high})"))
        return None
    number: int = value
    return number


def _time(value: Any, path: str, errors: list[FieldError]) -> datetime | None:
    """An ISO-8601 UTC instant written with Z, as in a batch's window."""
    if not isinstance(value, str) or not value.endswith("Z"):
        errors.append(FieldError(path, "must be an ISO-8601 UTC timestamp ending in Z"))
        return None
    try:
        return datetime.fromisoformat(value[:-1]).replace(tzinfo=UTC)
    except ValueError:
        errors.append(FieldError(path, "must be an ISO-8601 UTC timestamp ending in Z"))
        return None
