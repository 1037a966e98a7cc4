"""The audit log as people read it: each event's before and after snapshots (JSON, as the services
wrote them) turned into one row per field with typed values, so the page shows money as money and
instants as dates in the reader's language instead of raw dicts (`'total_minor': 29020`).

Snapshots are free-form per action; the typing rules below go by field name, the way the services
name fields: `*_minor` is integer minor units of the snapshot's `currency`, a few names are money in
major units, ISO 8601 strings are instants or days. Everything else is shown as written."""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import date, datetime
from decimal import Decimal, InvalidOperation
from typing import Literal

from billing.models import AuditEvent
from billing.money import from_minor_units

__all__ = ["AUDIT_PAGE_ROWS", "AuditChange", "AuditEntry", "AuditValue", "diff_snapshots", "list_audit_events"]

AUDIT_PAGE_ROWS = 200
# Money in major units (a budget's amount and spend, an invoice total); shown to the minor unit.
_MONEY_FIELDS = frozenset({"amount", "spend", "total", "projected_savings"})
# Prices per unit keep every decimal they were set with: rounding a price to cents would misstate it.
_RATE_FIELDS = frozenset({"price_per_gpu_hour"})
_MINOR_SUFFIX = "_minor"
_INSTANT = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}")
_DAY = re.compile(r"^\d{4}-\d{2}-\d{2}$")

Kind = Literal["none", "text", "bool", "money", "rate", "instant", "day"]


@dataclass(frozen=True)
class AuditValue:
    """One side of a field. `value` is a Decimal for money and rates, a datetime for instants, a
    date for days, a bool, or the text as recorded; `currency` only for money and rates."""

    kind: Kind
    value: object = None
    currency: str = ""


@dataclass(frozen=True)
class AuditChange:
    """`field` is the snapshot's key (`*_minor` shown without the suffix, as its value is money)."""

    field: str
    before: AuditValue
    after: AuditValue
    changed: bool


@dataclass(frozen=True)
class AuditEntry:
    at: datetime
    actor: str
    action: str
    object_type: str
    object_id: str
    changes: tuple[AuditChange, ...]


def list_audit_events(*, action_prefix: str = "", limit: int = AUDIT_PAGE_ROWS) -> list[AuditEntry]:
    """The newest events first; `action_prefix` ("budget.") filters by action."""
    events = AuditEvent.objects.select_related("actor").order_by("-at", "-id")
    if action_prefix:
        events = events.filter(action__startswith=action_prefix)
    return [_entry(e) for e in events[:limit]]


def _entry(event: AuditEvent) -> AuditEntry:
    actor = event.actor.get_username() if event.actor is not None else event.actor_label
    return AuditEntry(at=event.at, actor=actor, action=event.action, object_type=event.object_type,
                      object_id=event.object_id, changes=diff_snapshots(event.before, event.after))


def diff_snapshots(before: object, after: object) -> tuple[AuditChange, ...]:
    """Field by field, in the order the snapshots list them (before's first, then fields only after
    has). A side that is absent (a creation has no before) reads as empty on every field."""
    old, new = _as_fields(before), _as_fields(after)
    old_currency, new_currency = _currency(old) or _currency(new), _currency(new) or _currency(old)
    return tuple(
        AuditChange(
            field=key.removesuffix(_MINOR_SUFFIX),
            before=_value(key, old.get(key), old_currency),
            after=_value(key, new.get(key), new_currency),
            changed=key not in old or key not in new or old[key] != new[key],
        )
        for key in [*old, *(k for k in new if k not in old)]
    )


def _as_fields(snapshot: object) -> dict[str, object]:
    if snapshot is None:
        return {}
    if isinstance(snapshot, dict):
        return {str(k): v for k, v in snapshot.items()}
    return {"value": snapshot}  # a service that recorded a bare value


def _currency(fields: dict[str, object]) -> str:
    currency = fields.get("currency")
    return currency if isinstance(currency, str) else ""


def _value(key: str, raw: object, currency: str) -> AuditValue:
    if raw is None or raw == "":
        return AuditValue("none")
    if isinstance(raw, bool):
        return AuditValue("bool", raw)
    if key.endswith(_MINOR_SUFFIX) and isinstance(raw, int) and currency:
        return AuditValue("money", from_minor_units(raw, currency), currency)
    if key in _MONEY_FIELDS or key in _RATE_FIELDS:
        amount = _decimal(raw)
        if amount is not None:
            return AuditValue("rate" if key in _RATE_FIELDS else "money", amount, currency)
    if isinstance(raw, str):
        return _text_or_time(raw)
    if isinstance(raw, list):
        return AuditValue("text", ", ".join(str(item) for item in raw))
    if isinstance(raw, dict):
        return AuditValue("text", ", ".join(f"{k}: {v}" for k, v in raw.items()))
    return AuditValue("text", str(raw))


def _text_or_time(raw: str) -> AuditValue:
    try:
        if _INSTANT.match(raw):
            return AuditValue("instant", datetime.fromisoformat(raw))
        if _DAY.match(raw):
            return AuditValue("day", date.fromisoformat(raw))
    except ValueError:  # shaped like a date but not one (2026-13-01): shown as written
        return AuditValue("text", raw)
    return AuditValue("text", raw)


def _decimal(raw: object) -> Decimal | None:
    if isinstance(raw, bool) or not isinstance(raw, (int, str, Decimal)):
        return None
    try:
        return Decimal(str(raw))
    except InvalidOperation:
        return None
