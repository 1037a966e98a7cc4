"""Enforcement actions reported by agents (POST /api/v1/nodes/{node}/events) land in the audit log."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from django.db import transaction

from billing.errors import FieldError, InvalidBatch
from billing.models import AuditEvent, Node

__all__ = ["record_node_events"]

MAX_EVENTS = 1000


def record_node_events(*, node: Node, payload: Any, now: datetime) -> int:
    """Validate all events, then store them in one transaction (all or nothing)."""
    errors: list[FieldError] = []
    events = payload.get("events") if isinstance(payload, dict) else None
    if not isinstance(events, list) or not events or len(events) > MAX_EVENTS:
        raise InvalidBatch([FieldError("$.events", f"must be a list of 1 to {MAX_EVENTS} events")])
    rows = []
    for i, ev in enumerate(events):
        path = f"$.events[{i}]"
        if not isinstance(ev, dict):
            errors.append(FieldError(path, "must be an object"))
            continue
        action, target, detail = ev.get("action"), ev.get("target"), ev.get("detail", {})
        try:
            at = datetime.fromisoformat(ev.get("at", "")).astimezone(UTC)
        except (TypeError, ValueError):
            errors.append(FieldError(f"{path}.at", "must be an ISO-8601 timestamp"))
            continue
        if at > now + timedelta(minutes=5):
            errors.append(FieldError(f"{path}.at", "is in the future"))
        if not isinstance(action, str) or not 1 <= len(action) <= 90:
            errors.append(FieldError(f"{path}.action", "must be a string of 1 to 90 characters"))
        if not isinstance(target, str) or not 1 <= len(target) <= 200:
            errors.append(FieldError(f"{path}.target", "must name what was acted on (1 to 200 characters)"))
        if not isinstance(detail, dict):
            errors.append(FieldError(f"{path}.detail", "must be an object"))
        rows.append(
            AuditEvent(
                at=at,
                actor_label=f"node:{node.name}",
                action=f"agent.{action}",
                object_type="workload",
                object_id=str(target),
                before=None,
                after=detail if isinstance(detail, dict) else None,
            )
        )
    if errors:
        raise InvalidBatch(errors)
    with transaction.atomic():
        AuditEvent.objects.bulk_create(rows)
    return len(rows)
