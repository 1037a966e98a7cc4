"""SLA tier changes by admins: create a tier, change its name, description or weight.

Every rule is checked before anything is written, and a broken one raises `InvalidInput`
naming the field. Each change is audited with before and after in its own transaction:
`sla_tier.created`; `sla_tier.weight_changed` when only the weight changes and
`sla_tier.miss_targets_changed` when only the miss targets do (agents act on both);
`sla_tier.changed` otherwise, with the changed fields only. A change that changes nothing
writes nothing. Agents see tiers and weights through the node policy API
(`billing.services.ingest.policy.get_node_policy` lists every tier) on their next poll; a new tier
changes the policy's ETag like a new weight does.

A tier's miss targets (`miss_target_memory`, `miss_target_sm`) are the share of its workloads'
seconds whose use may exceed the grant: memory, an out-of-memory failure; SMs, a slowdown
(allocator.risk). Each lies strictly between 0 and 1 with at most MISS_TARGET_PLACES decimals; a
new tier starts at allocator.risk's default for its slug.

Retiring a tier (`retire_sla_tier`, audited `sla_tier.retired`) withdraws it: it can no longer be
edited, and it is shown as retired. It stays in the node policy, because agents refuse a pod
labelled with a tier they do not know, and pods that still carry its label keep its weight. A
tier some tenant uses by default is refused (change those tenants first), and so is
`best-effort`, the tier agents fall back to and `evict-best-effort` budgets evict.
"""

from __future__ import annotations

from datetime import datetime
from decimal import Decimal, InvalidOperation
from typing import Any

from django.core.exceptions import ValidationError
from django.db import IntegrityError, transaction
from django.utils.translation import gettext as _

from billing.errors import InvalidInput
from billing.models import SlaTier
from billing.models.tenancy import MISS_TARGET_PLACES, default_miss_targets, slug_validator
from billing.services.audit import record_audit_event

__all__ = [
    "MAX_DESCRIPTION_LENGTH",
    "MAX_NAME_LENGTH",
    "MAX_WEIGHT",
    "MIN_WEIGHT",
    "change_sla_tier",
    "create_sla_tier",
    "retire_sla_tier",
    "set_sla_tier_weight",
]

FALLBACK_TIER = "best-effort"  # agents' tier for tenants without one (agents.policy_client.BEST_EFFORT_TIER)
_REASON_MAX_LENGTH = 500

MIN_WEIGHT = Decimal("0.001")
MAX_WEIGHT = Decimal("1000")
_WEIGHT_PLACES = 3  # SlaTier.weight: decimal_places=3
MAX_NAME_LENGTH = 100  # SlaTier.name: max_length=100
MAX_DESCRIPTION_LENGTH = 2000  # a TextField, but a tier's description is a sentence or two
_MISS_TARGET_FIELDS = ("miss_target_memory", "miss_target_sm")


def _weight(value: str | Decimal) -> Decimal:
    text = str(value).strip()
    try:
        weight = Decimal(text)
    except InvalidOperation as exc:
        raise InvalidInput(_("weight %(value)r is not a number") % {"value": text}) from exc
    if not weight.is_finite() or not MIN_WEIGHT <= weight <= MAX_WEIGHT:
        raise InvalidInput(_("weight must lie between %(min)s and %(max)s, not %(value)s")
                           % {"min": MIN_WEIGHT, "max": MAX_WEIGHT, "value": text})
    quantum = Decimal(1).scaleb(-_WEIGHT_PLACES)
    if weight != weight.quantize(quantum):
        raise InvalidInput(_("weight may have at most %(places)s decimal places, not %(value)s")
                           % {"places": _WEIGHT_PLACES, "value": text})
    return weight.quantize(quantum)


def _miss_target(value: str | Decimal, field: str) -> Decimal:
    """A share of workload-seconds in (0, 1), as typed ("0.00001" or "1e-5"); `field` names it."""
    label = _("memory miss target") if field == "miss_target_memory" else _("SM miss target")
    text = str(value).strip()
    try:
        share = Decimal(text)
    except InvalidOperation as exc:
        raise InvalidInput(_("%(field)s %(value)r is not a number") % {"field": label, "value": text[:40]}) from exc
    if not share.is_finite() or not 0 < share < 1:
        raise InvalidInput(_("%(field)s must lie between 0 and 1, both excluded (a share of workload-seconds), "
                             "not %(value)s") % {"field": label, "value": text[:40]})
    quantum = Decimal(1).scaleb(-MISS_TARGET_PLACES)
    if share != share.quantize(quantum):
        raise InvalidInput(_("%(field)s may have at most %(places)s decimal places (1 in 10,000,000,000 seconds), "
                             "not %(value)s") % {"field": label, "places": MISS_TARGET_PLACES, "value": text[:40]})
    return share.quantize(quantum)


def _name(value: str) -> str:
    name = " ".join(value.split())
    if not name:
        raise InvalidInput(_("name must not be blank"))
    if len(name) > MAX_NAME_LENGTH:
        raise InvalidInput(_("name may have at most %(max)s characters, not %(length)s")
                           % {"max": MAX_NAME_LENGTH, "length": len(name)})
    return name


def _description(value: str) -> str:
    # Browsers send a textarea's line breaks as CRLF; stored as LF so an unchanged form changes nothing.
    description = value.replace("\r\n", "\n").strip()
    if len(description) > MAX_DESCRIPTION_LENGTH:
        raise InvalidInput(_("description may have at most %(max)s characters, not %(length)s")
                           % {"max": MAX_DESCRIPTION_LENGTH, "length": len(description)})
    return description


def _slug(value: str) -> str:
    slug = value.strip()
    if not slug:
        raise InvalidInput(_("slug must not be blank"))
    try:
        slug_validator(slug)
    except ValidationError as exc:
        raise InvalidInput(_("slug %(slug)r: %(rule)s") % {"slug": slug, "rule": slug_validator.message}) from exc
    return slug


def _known_shape(slug: str) -> None:
    """A value that is no slug names no tier. Refused before the query: Postgres refuses a NUL in a
    string literal with a ValueError, which would be a 500 (the weight form posts the slug as typed)."""
    try:
        slug_validator(slug)
    except ValidationError as exc:
        raise InvalidInput(_("no SLA tier %(slug)r") % {"slug": slug[:80]}) from exc


def _snapshot(tier: SlaTier) -> dict[str, Any]:
    return {"slug": tier.slug, "name": tier.name, "weight": str(tier.weight), "description": tier.description,
            **{field: str(getattr(tier, field)) for field in _MISS_TARGET_FIELDS}}


def create_sla_tier(*, slug: str, name: str, weight: str | Decimal, description: str = "", now: datetime,
                    actor_label: str, actor_id: int | None = None, miss_target_memory: str | Decimal | None = None,
                    miss_target_sm: str | Decimal | None = None) -> SlaTier:
    """A new tier, in the node policy from the next poll; audited as `sla_tier.created`. A miss
    target not given starts at allocator.risk's default for the slug."""
    tier = SlaTier(slug=_slug(slug), name=_name(name), weight=_weight(weight), description=_description(description))
    given = {"miss_target_memory": miss_target_memory, "miss_target_sm": miss_target_sm}
    for field, default in default_miss_targets(tier.slug).items():
        value = given[field]
        setattr(tier, field, default if value is None else _miss_target(value, field))
    with transaction.atomic():
        if SlaTier.objects.filter(slug=tier.slug).exists():
            raise InvalidInput(_("an SLA tier with slug %(slug)r already exists") % {"slug": tier.slug})
        try:
            with transaction.atomic():
                tier.save()
        except IntegrityError as exc:  # another admin created the same slug in between
            raise InvalidInput(_("an SLA tier with slug %(slug)r already exists") % {"slug": tier.slug}) from exc
        record_audit_event(at=now, actor_id=actor_id, actor_label=actor_label, action="sla_tier.created",
                           object_type="sla_tier", object_id=tier.slug, before=None, after=_snapshot(tier))
    return tier


def change_sla_tier(*, slug: str, now: datetime, actor_label: str, actor_id: int | None = None,
                    name: str | None = None, description: str | None = None,
                    weight: str | Decimal | None = None, miss_target_memory: str | Decimal | None = None,
                    miss_target_sm: str | Decimal | None = None) -> SlaTier:
    """Change the given fields of tier `slug` (None: keep). The slug never changes: pods and
    samples name tiers by it. Every value is checked before anything is written. Audited with the
    changed fields' before and after."""
    wanted: dict[str, Any] = {}
    if name is not None:
        wanted["name"] = _name(name)
    if description is not None:
        wanted["description"] = _description(description)
    if weight is not None:
        wanted["weight"] = _weight(weight)
    for field, value in (("miss_target_memory", miss_target_memory), ("miss_target_sm", miss_target_sm)):
        if value is not None:
            wanted[field] = _miss_target(value, field)
    _known_shape(slug)
    with transaction.atomic():
        tier = SlaTier.objects.select_for_update().filter(slug=slug).first()
        if tier is None:
            raise InvalidInput(_("no SLA tier %(slug)r") % {"slug": slug})
        if tier.retired_at is not None:
            raise InvalidInput(_("SLA tier %(slug)r is retired; it cannot be changed") % {"slug": slug})
        changed = [field for field, value in wanted.items() if getattr(tier, field) != value]
        if not changed:
            return tier
        before = {field: str(getattr(tier, field)) for field in changed}
        for field in changed:
            setattr(tier, field, wanted[field])
        tier.save(update_fields=[*changed, "updated_at"])
        after = {field: str(getattr(tier, field)) for field in changed}
        action = _change_action(changed)
        record_audit_event(at=now, actor_id=actor_id, actor_label=actor_label, action=action,
                           object_type="sla_tier", object_id=slug, before=before, after=after)
    return tier


def _change_action(changed: list[str]) -> str:
    """The audit action of a change: the two agents act on have their own."""
    if changed == ["weight"]:
        return "sla_tier.weight_changed"
    if set(changed) <= set(_MISS_TARGET_FIELDS):
        return "sla_tier.miss_targets_changed"
    return "sla_tier.changed"


def set_sla_tier_weight(*, slug: str, weight: str | Decimal, now: datetime, actor_label: str,
                        actor_id: int | None = None) -> SlaTier:
    """Change only the weight (audited as `sla_tier.weight_changed`)."""
    return change_sla_tier(slug=slug, weight=weight, now=now, actor_label=actor_label, actor_id=actor_id)


def retire_sla_tier(*, slug: str, reason: str, now: datetime, actor_label: str,
                    actor_id: int | None = None) -> SlaTier:
    """Withdraw tier `slug` (see the module docstring); audited as `sla_tier.retired`."""
    why = " ".join(reason.split())
    if not why:
        raise InvalidInput(_("say why the tier is retired: the reason is kept in the audit log and shown on the page"))
    if len(why) > _REASON_MAX_LENGTH:
        raise InvalidInput(_("the reason may have at most %(n)s characters") % {"n": _REASON_MAX_LENGTH})
    with transaction.atomic():
        tier = SlaTier.objects.select_for_update().filter(slug=slug).first()
        if tier is None:
            raise InvalidInput(_("no SLA tier %(slug)r") % {"slug": slug})
        if tier.retired_at is not None:
            raise InvalidInput(_("SLA tier %(slug)r was already retired at %(at)s")
                               % {"slug": slug, "at": tier.retired_at.isoformat()})
        if slug == FALLBACK_TIER:
            raise InvalidInput(_("SLA tier %(slug)r cannot be retired: agents run every pod without a tier in it, "
                                 "and evict-best-effort budgets evict its pods") % {"slug": slug})
        tenants = list(tier.tenant_set.order_by("slug").values_list("slug", flat=True))
        if tenants:
            raise InvalidInput(_("SLA tier %(slug)r is the default tier of %(tenants)s; give them another default "
                                 "tier before retiring it") % {"slug": slug, "tenants": ", ".join(tenants)})
        tier.retired_at, tier.retired_by, tier.retire_reason = now, actor_label, why
        tier.save(update_fields=["retired_at", "retired_by", "retire_reason", "updated_at"])
        record_audit_event(at=now, actor_id=actor_id, actor_label=actor_label, action="sla_tier.retired",
                           object_type="sla_tier", object_id=slug, before=_snapshot(tier) | {"retired_at": None},
                           after=_snapshot(tier) | {"retired_at": now.isoformat(), "retire_reason": why})
    return tier

