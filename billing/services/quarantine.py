"""Batches the rollup could not roll up (issue 12): kept with their error, left out of the ledger,
shown to operators (node page, /healthz, audit log), and re-driven once the cause is fixed."""

from __future__ import annotations

import logging
from datetime import datetime

from django.db import transaction

from billing.errors import InvalidInput
from billing.models import UsageBatch
from billing.services.audit import record_audit_event

__all__ = ["quarantine_batch", "redrive_batches"]

log = logging.getLogger(__name__)
_ERROR_MAX_CHARS = 2000


def quarantine_batch(*, batch_id: int, error: str, now: datetime) -> None:
    """Called by the rollup inside its transaction, after the failed savepoint rolled back."""
    batch = UsageBatch.objects.select_related("node").get(pk=batch_id)
    batch.quarantined_at = now
    batch.quarantine_error = error[:_ERROR_MAX_CHARS]
    batch.save(update_fields=["quarantined_at", "quarantine_error"])
    record_audit_event(at=now, actor_label="system", action="usage_batch.quarantined", object_type="usage_batch",
                       object_id=f"{batch.node.name}/{batch.batch_seq}", before=None,
                       after={"batch_id": batch_id, "error": batch.quarantine_error})
    # An SRE reads logs before pages: say which batch and why, once.
    log.error("event=batch_quarantined node=%s batch_seq=%s batch_id=%s error=%s",
              batch.node.name, batch.batch_seq, batch_id, batch.quarantine_error)


def redrive_batches(*, batch_ids: list[int] | None, node: str | None, now: datetime, actor_label: str,
                    actor_id: int | None = None) -> int:
    """Give quarantined batches back to the rollup (by id, or every one of `node`, or all when both
    are None). Audited per batch; returns how many."""
    with transaction.atomic():
        batches = UsageBatch.objects.select_for_update().select_related("node").filter(quarantined_at__isnull=False)
        if batch_ids is not None:
            batches = batches.filter(pk__in=batch_ids)
        if node is not None:
            batches = batches.filter(node__name=node)
        chosen = list(batches.order_by("pk"))
        if batch_ids is not None and len(chosen) != len(set(batch_ids)):
            missing = sorted(set(batch_ids) - {b.pk for b in chosen})
            raise InvalidInput(f"batch ids {missing} are not quarantined")
        for batch in chosen:
            record_audit_event(at=now, actor_id=actor_id, actor_label=actor_label, action="usage_batch.redriven",
                               object_type="usage_batch", object_id=f"{batch.node.name}/{batch.batch_seq}",
                               before={"error": batch.quarantine_error}, after=None)
        UsageBatch.objects.filter(pk__in=[b.pk for b in chosen]).update(quarantined_at=None, quarantine_error="")
    return len(chosen)
