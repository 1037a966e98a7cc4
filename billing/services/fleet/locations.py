"""Node locations and what energy costs and emits there (docs/billing.md, Energy).

A location ("eu-west-dc1") has rates: a price per kWh (in the fleet's currency) and a CO2e factor
(kg per kWh), each optional, from a UTC date on. A node has a location from a UTC date on. The
energy of a node-hour is priced by the rate of its node's location in effect on that hour's date
(billing.ledger.energy). Both change like rate cards: **a change never re-prices the past**. A rate
or a move starts tomorrow (UTC) at the earliest, so no hour already in the ledger changes price,
with one exception: a node's first location covers its whole past, since that energy had no price
to change (as a GPU model's first rate card may price minutes billed at nothing).

Energy cost is information beside the GPU cost, never an invoice line, so closed periods do not
constrain a change. Every rule failure raises `InvalidInput` before anything is written; each
change is audited ("location.created", "location.rate_set", "node.location_set") with before and
after, in the change's transaction.
"""

from __future__ import annotations

from datetime import UTC, date, datetime, timedelta
from decimal import Decimal, InvalidOperation
from typing import Any

from django.core.exceptions import ValidationError
from django.db import IntegrityError, transaction
from django.db.models import Q
from django.utils.translation import gettext as _

from billing.errors import InvalidInput
from billing.models import Location, LocationRate, Node, NodeLocation, RateCard
from billing.models.fleet import location_label_validator
from billing.services.audit import record_audit_event

__all__ = [
    "FIRST_LOCATION_FROM",
    "add_location",
    "earliest_energy_change",
    "fleet_currency",
    "set_location_rate",
    "set_node_location",
]

# A node's first location covers its whole past: the date every ledger hour is on or after.
FIRST_LOCATION_FROM = date(2000, 1, 1)
_PRICE_PLACES = 6  # LocationRate.price_per_kwh: max_digits=14, decimal_places=6
_PRICE_BELOW = Decimal(10) ** 4  # per kWh: far above any grid's price, in any currency we bill in
_FACTOR_PLACES = 6  # LocationRate.co2e_kg_per_kwh: max_digits=10, decimal_places=6
_FACTOR_BELOW = Decimal(10)  # kg CO2e per kWh: coal is about 1; 10 is a typing mistake


def earliest_energy_change(now: datetime) -> date:
    """The first date a rate or a move may start: tomorrow, UTC (today's hours may be shown already)."""
    return now.astimezone(UTC).date() + timedelta(days=1)


def fleet_currency(now: datetime) -> str:
    """The currency the fleet is priced in: the rate cards' in effect now, else the newest card's,
    else "" (nothing priced yet). One fleet bills in one currency; invoices enforce that."""
    cards = RateCard.objects.order_by("-effective_from", "gpu_model")
    current = cards.filter(Q(effective_to__isnull=True) | Q(effective_to__gt=now), effective_from__lte=now)
    return (current.values_list("currency", flat=True).first()
            or cards.values_list("currency", flat=True).first() or "")


def _label(text: str) -> str:
    label = text.strip()
    try:
        location_label_validator(label)
    except ValidationError as exc:
        raise InvalidInput(_("location %(label)r: %(reason)s") % {"label": label[:80], "reason": " ".join(exc.messages)}
                           ) from exc
    return label


def _amount(text: str | Decimal | None, *, field: str, places: int, below: Decimal) -> Decimal | None:
    """An optional non-negative decimal with at most `places` places, below `below`; blank is None."""
    raw = "" if text is None else str(text).strip()
    if not raw:
        return None
    try:
        value = Decimal(raw)
    except InvalidOperation as exc:
        raise InvalidInput(_("%(field)s: %(value)r is not a number") % {"field": field, "value": raw[:40]}) from exc
    if not value.is_finite() or value < 0 or value >= below:
        raise InvalidInput(_("%(field)s must be from 0 to below %(below)s, not %(value)s")
                           % {"field": field, "below": below, "value": raw[:40]})
    if value != value.quantize(Decimal(1).scaleb(-places)):
        raise InvalidInput(_("%(field)s has at most %(places)s decimal places, not %(value)s")
                           % {"field": field, "places": places, "value": raw[:40]})
    return value


def _rate_snapshot(rate: LocationRate | None) -> dict[str, Any] | None:
    if rate is None:
        return None
    return {"location": rate.location.label, "effective_from": rate.effective_from.isoformat(),
            "price_per_kwh": None if rate.price_per_kwh is None else str(rate.price_per_kwh),
            "currency": rate.currency,
            "co2e_kg_per_kwh": None if rate.co2e_kg_per_kwh is None else str(rate.co2e_kg_per_kwh)}


def add_location(*, label: str, now: datetime, actor_label: str, actor_id: int | None = None) -> Location:
    """A new location, with no rate yet (its energy shows no cost until one starts)."""
    label = _label(label)
    exists = InvalidInput(_("location %(label)s exists already") % {"label": label})
    if Location.objects.filter(label=label).exists():
        raise exists
    try:
        with transaction.atomic():
            location = Location.objects.create(label=label, created_at=now)
            record_audit_event(at=now, actor_label=actor_label, actor_id=actor_id, action="location.created",
                               object_type="location", object_id=label, before=None, after={"label": label})
    except IntegrityError as exc:  # added by another admin in the meantime: the unique label decides
        raise exists from exc
    return location


def set_location_rate(*, label: str, effective_from: date, price_per_kwh: str | Decimal | None,
                      co2e_kg_per_kwh: str | Decimal | None, now: datetime, actor_label: str,
                      actor_id: int | None = None) -> LocationRate:
    """The location's price per kWh and CO2e factor from `effective_from` (tomorrow at the earliest)
    until its next rate; blank leaves that figure unknown from then on. A second rate for the same
    date replaces the first (nothing has been priced by it yet)."""
    price = _amount(price_per_kwh, field=_("price per kWh"), places=_PRICE_PLACES, below=_PRICE_BELOW)
    factor = _amount(co2e_kg_per_kwh, field=_("kg CO2e per kWh"), places=_FACTOR_PLACES, below=_FACTOR_BELOW)
    earliest = earliest_energy_change(now)
    if effective_from < earliest:
        raise InvalidInput(_("a rate starts on %(earliest)s (tomorrow, UTC) at the earliest, not %(date)s: a change "
                             "never re-prices energy already shown") % {"earliest": earliest, "date": effective_from})
    currency = fleet_currency(now) if price is not None else ""
    if price is not None and not currency:
        raise InvalidInput(_("no rate card prices the fleet yet, so its currency is unknown: add a rate card first"))
    with transaction.atomic():
        location = Location.objects.select_for_update().filter(label=label.strip()).first()
        if location is None:
            raise InvalidInput(_("no location %(label)r") % {"label": label.strip()[:80]})
        existing = LocationRate.objects.filter(location=location, effective_from=effective_from).first()
        before = _rate_snapshot(existing)
        rate = existing or LocationRate(location=location, effective_from=effective_from)
        rate.price_per_kwh, rate.currency, rate.co2e_kg_per_kwh, rate.created_at = price, currency, factor, now
        rate.save()
        rate.refresh_from_db()  # the audit records the values as stored (at the column's places)
        record_audit_event(at=now, actor_label=actor_label, actor_id=actor_id, action="location.rate_set",
                           object_type="location", object_id=location.label, before=before, after=_rate_snapshot(rate))
    return rate


def set_node_location(*, node_name: str, label: str, now: datetime, actor_label: str,
                      actor_id: int | None = None) -> NodeLocation:
    """The node's location from tomorrow (UTC) on; a node's first location covers its whole past."""
    with transaction.atomic():
        node = Node.objects.select_for_update().filter(name=node_name.strip()).first()
        if node is None:
            raise InvalidInput(_("no node %(name)r") % {"name": node_name.strip()[:80]})
        location = Location.objects.filter(label=label.strip()).first()
        if location is None:
            raise InvalidInput(_("no location %(label)r: add it on the Locations page first")
                               % {"label": label.strip()[:80]})
        current = NodeLocation.objects.filter(node=node).select_related("location").order_by("-effective_from").first()
        if current is not None and current.location_id == location.pk:
            raise InvalidInput(_("%(node)s is at %(label)s already") % {"node": node.name, "label": location.label})
        start = earliest_energy_change(now) if current is not None else FIRST_LOCATION_FROM
        before = None if current is None else {"location": current.location.label,
                                               "effective_from": current.effective_from.isoformat()}
        # A move planned for tomorrow and changed again today: the newer choice replaces it.
        row, _created = NodeLocation.objects.update_or_create(
            node=node, effective_from=start, defaults={"location": location, "created_at": now})
        record_audit_event(at=now, actor_label=actor_label, actor_id=actor_id, action="node.location_set",
                           object_type="node", object_id=node.name, before=before,
                           after={"location": location.label, "effective_from": start.isoformat()})
    return row
