"""Reads for the SLA tiers admin page: each tier with how many tenants default to it and its
last recorded change (from the audit log). Admins only; anyone else gets nothing back."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal

from django.db.models import Count

from billing.models import AuditEvent, SlaTier
from billing.scope import Scope

__all__ = ["SlaTierView", "get_sla_tier", "list_sla_tiers"]


@dataclass(frozen=True)
class SlaTierView:
    slug: str
    name: str
    weight: Decimal
    description: str
    # Tenants whose default tier this is (pods without a tier label run in it).
    default_tenant_count: int
    # The newest audit event of the tier; None when none was recorded (e.g. seeded by a migration).
    last_changed_at: datetime | None
    last_changed_by: str | None
    last_change_action: str | None
    retired_at: datetime | None = None
    retired_by: str = ""
    retire_reason: str = ""
    # Shares of workload-seconds in (0, 1) whose use may exceed the grant (SlaTier).
    miss_target_memory: Decimal = Decimal(0)
    miss_target_sm: Decimal = Decimal(0)

    @property
    def memory_one_in(self) -> int | None:
        """The memory target in plain words: 1 second short in this many (None: no target)."""
        return _one_in(self.miss_target_memory)

    @property
    def sm_one_in(self) -> int | None:
        return _one_in(self.miss_target_sm)


def _one_in(share: Decimal) -> int | None:
    return round(1 / share) if share > 0 else None


def _views(scope: Scope, *, slug: str | None = None) -> list[SlaTierView]:
    if not scope.is_admin:
        return []
    tiers = SlaTier.objects.annotate(default_tenant_count=Count("tenant")).order_by("-weight", "slug")
    events = AuditEvent.objects.filter(object_type="sla_tier")
    if slug is not None:
        tiers, events = tiers.filter(slug=slug), events.filter(object_id=slug)
    # DISTINCT ON (object_id): the newest event of each tier.
    last = {e.object_id: e for e in events.order_by("object_id", "-at", "-id").distinct("object_id")}
    views = []
    for t in tiers:
        event = last.get(t.slug)
        views.append(SlaTierView(
            slug=t.slug, name=t.name, weight=t.weight, description=t.description,
            default_tenant_count=t.default_tenant_count,
            last_changed_at=event.at if event else None,
            last_changed_by=event.actor_label if event else None,
            last_change_action=event.action if event else None,
            retired_at=t.retired_at, retired_by=t.retired_by, retire_reason=t.retire_reason,
            miss_target_memory=t.miss_target_memory, miss_target_sm=t.miss_target_sm,
        ))
    return views


def list_sla_tiers(*, scope: Scope) -> list[SlaTierView]:
    """Every tier, heaviest first (retired ones too, marked)."""
    return _views(scope)


def get_sla_tier(*, scope: Scope, slug: str) -> SlaTierView | None:
    found = _views(scope, slug=slug)
    return found[0] if found else None
