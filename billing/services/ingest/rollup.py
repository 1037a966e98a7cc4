"""Batches the rollup could not roll up (docs/reliability.md): kept with their error, left out of the ledger,
shown to operators (node page, /healthz, audit log), and re-driven once the cause is fixed.

The ledger (billing.ledger.rollup) marks a batch quarantined and hands it back; this module records
the audit event in the same transaction. `run_rollup` is the rollup as the service runs it: the
ledger's, with every quarantine audited."""

from __future__ import annotations

from datetime import datetime

from django.db import transaction

from billing.ledger import rollup as ledger_rollup
from billing.ledger.rollup import QuarantinedBatch, RollupResult
from billing.services.audit import record_audit_event

__all__ = ["quarantine_batch", "record_quarantine", "redrive_batches", "run_rollup"]


def run_rollup(*, now: datetime, shard: int = 0, shards: int = 1, max_batches: int = 5000) -> RollupResult:
    """Roll up shard `shard` of `shards` (node_id % shards), auditing each batch quarantined."""
    return ledger_rollup.rollup_usage(now=now, shard=shard, shards=shards, max_batches=max_batches,
                                      on_quarantine=lambda batch: record_quarantine(batch, now=now))


def record_quarantine(batch: QuarantinedBatch, *, now: datetime) -> None:
    """The audit event of a quarantine; called inside the transaction that quarantined it."""
    record_audit_event(at=now, actor_label="system", action="usage_batch.quarantined", object_type="usage_batch",
                       object_id=f"{batch.node_name}/{batch.batch_seq}", before=None,
                       after={"batch_id": batch.batch_id, "error": batch.error})


def quarantine_batch(*, batch_id: int, error: str, now: datetime) -> None:
    """Quarantine one batch by hand (an operator, a test), audited."""
    with transaction.atomic():
        record_quarantine(ledger_rollup.quarantine_batch(batch_id=batch_id, error=error, now=now), now=now)


def redrive_batches(*, batch_ids: list[int] | None, node: str | None, now: datetime, actor_label: str,
                    actor_id: int | None = None) -> int:
    """Give quarantined batches back to the rollup (by id, or every one of `node`, or all when both
    are None). Audited per batch; returns how many."""
    with transaction.atomic():
        chosen = ledger_rollup.release_quarantined(batch_ids=batch_ids, node=node)
        for batch in chosen:
            record_audit_event(at=now, actor_id=actor_id, actor_label=actor_label, action="usage_batch.redriven",
                               object_type="usage_batch", object_id=f"{batch.node_name}/{batch.batch_seq}",
                               before={"error": batch.error}, after=None)
    return len(chosen)
