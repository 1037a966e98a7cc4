"""Enforcement actions reported by agents (POST /api/v1/nodes/{node}/events) land in the audit log."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from django.db import transaction

from billing.errors import FieldError, InvalidBatch
from billing.models import AuditEvent, Node
from billing.services.input_limits import json_problem, max_length, text_problem

__all__ = ["ACTION_MAX", "DETAIL_MAX_DEPTH", "MAX_EVENTS", "TARGET_MAX", "record_node_events"]

MAX_EVENTS = 1000
_ACTION_PREFIX = "agent."
# Bounds of the audit columns the event lands in.
ACTION_MAX = max_length(AuditEvent, "action") - len(_ACTION_PREFIX)
TARGET_MAX = max_length(AuditEvent, "object_id")
DETAIL_MAX_DEPTH = 16


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
        except (TypeError, ValueError, OverflowError):
            errors.append(FieldError(f"{path}.at", "must be an ISO-8601 timestamp"))
            continue
        if at > now + timedelta(minutes=5):
            errors.append(FieldError(f"{path}.at", "is in the future"))
        if not isinstance(action, str) or not 1 <= len(action) <= ACTION_MAX or text_problem(action):
            errors.append(FieldError(f"{path}.action", f"must be a string of 1 to {ACTION_MAX} characters "
                                                       "without NUL or lone surrogates"))
        if not isinstance(target, str) or not 1 <= len(target) <= TARGET_MAX or text_problem(target):
            errors.append(FieldError(f"{path}.target", f"must name what was acted on (1 to {TARGET_MAX} "
                                                       "characters, without NUL or lone surrogates)"))
        if not isinstance(detail, dict):
            errors.append(FieldError(f"{path}.detail", "must be an object"))
        elif problem := json_problem(detail, max_depth=DETAIL_MAX_DEPTH):
            errors.append(FieldError(f"{path}.detail", problem))
        rows.append(
            AuditEvent(
                at=at,
                actor_label=f"node:{node.name}",
                action=f"{_ACTION_PREFIX}{action}",
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
