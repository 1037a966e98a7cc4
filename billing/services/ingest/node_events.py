"""Enforcement actions reported by agents (POST /api/v1/nodes/{node}/events) land in the audit log.

A node may write only the actions an agent takes (AGENT_ACTIONS, docs/protocol.md "Node events"):
the audit log is what an admin trusts about who did what, so a node's token must not let it put
arbitrary `agent.*` entries there (an invented "agent.tenant.deleted" would read like a fact)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from django.db import transaction

from billing.errors import FieldError, InvalidBatch
from billing.models import AuditEvent, Node
from billing.services.input_limits import json_problem, max_length, text_problem

__all__ = ["ACTION_MAX", "AGENT_ACTIONS", "DETAIL_MAX_DEPTH", "MAX_EVENTS", "TARGET_MAX", "record_node_events"]

MAX_EVENTS = 1000
_ACTION_PREFIX = "agent."
# Bounds of the audit columns the event lands in.
ACTION_MAX = max_length(AuditEvent, "action") - len(_ACTION_PREFIX)
TARGET_MAX = max_length(AuditEvent, "object_id")
DETAIL_MAX_DEPTH = 16
# Every action an agent of this release emits (agents/watchdog.py, agents/budget_enforcement.py,
# agents/mps.py: "mps.<command>" for each MPS control command it sends). A new agent action is
# added here in the same change that makes the agent emit it.
AGENT_ACTIONS = frozenset({
    "watchdog.over_grant", "watchdog.within_grant", "watchdog.evicted", "watchdog.evict_failed",
    "watchdog.sigterm", "watchdog.sigkill", "watchdog.signal_failed",
    "budget.evicted_best_effort", "budget.evict_failed",
    "mps.set_default_active_thread_percentage", "mps.set_default_device_pinned_mem_limit",
    "mps.set_active_thread_percentage", "mps.set_device_pinned_mem_limit",
    "mps.command_failed", "mps.shared_server", "mps.unmanaged_process",
})


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
        elif action not in AGENT_ACTIONS:
            errors.append(FieldError(f"{path}.action", f"{action[:100]!r} is not an action an agent takes; "
                                                       f"allowed: {', '.join(sorted(AGENT_ACTIONS))}"))
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
