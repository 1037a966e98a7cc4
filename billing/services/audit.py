"""The audit log: one append-only row per change, written inside the change's transaction."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from billing.models import AuditEvent

__all__ = ["record_audit_event"]


def record_audit_event(
    *,
    at: datetime,
    actor_label: str,
    action: str,
    object_type: str,
    object_id: str,
    before: dict[str, Any] | None,
    after: dict[str, Any] | None,
    actor_id: int | None = None,
) -> AuditEvent:
    return AuditEvent.objects.create(
        at=at,
        actor_id=actor_id,
        actor_label=actor_label,
        action=action,
        object_type=object_type,
        object_id=object_id,
        before=before,
        after=after,
    )
