"""SLA tier changes by admins: validated, audited with before and after, visible to agents
through the node policy API on their next poll."""

from __future__ import annotations

from datetime import datetime
from decimal import Decimal, InvalidOperation

from django.db import transaction

from billing.errors import InvalidInput
from billing.models import SlaTier
from billing.services.audit import record_audit_event

__all__ = ["MAX_WEIGHT", "set_sla_tier_weight"]

MAX_WEIGHT = Decimal("1000")


def set_sla_tier_weight(*, slug: str, weight: str | Decimal, now: datetime, actor_label: str,
                        actor_id: int | None = None) -> SlaTier:
    try:
        value = Decimal(str(weight)).quantize(Decimal("0.001"))
    except InvalidOperation as exc:
        raise InvalidInput(f"weight {weight!r} is not a number") from exc
    if not Decimal("0.001") <= value <= MAX_WEIGHT:
        raise InvalidInput(f"weight must lie between 0.001 and {MAX_WEIGHT}, not {value}")
    with transaction.atomic():
        tier = SlaTier.objects.select_for_update().filter(slug=slug).first()
        if tier is None:
            raise InvalidInput(f"no SLA tier {slug!r}")
        before = str(tier.weight)
        if tier.weight == value:
            return tier
        tier.weight = value
        tier.save(update_fields=["weight", "updated_at"])
        record_audit_event(at=now, actor_id=actor_id, actor_label=actor_label, action="sla_tier.weight_changed",
                           object_type="sla_tier", object_id=slug, before={"weight": before},
                           after={"weight": str(value)})
    return tier
