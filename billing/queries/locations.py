"""Locations and their energy rates (the Locations page), and where each node is (the Nodes page).
Admins only: others get nothing. docs/billing.md, Energy."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from datetime import UTC, date, datetime
from decimal import Decimal

from billing.models import Location, LocationRate, NodeLocation
from billing.scope import Scope
from billing.services.fleet import earliest_energy_change, fleet_currency

__all__ = ["LocationView", "LocationsPage", "NodePlace", "RateView", "get_locations_page", "location_labels", "node_places"]


@dataclass(frozen=True)
class RateView:
    effective_from: date
    price_per_kwh: Decimal | None
    currency: str
    co2e_kg_per_kwh: Decimal | None
    state: str  # "past", "current" or "upcoming" on the page's date


@dataclass(frozen=True)
class LocationView:
    label: str
    created_at: datetime
    rates: tuple[RateView, ...]  # newest first
    nodes: tuple[str, ...]  # nodes there today

    @property
    def current(self) -> RateView | None:
        return next((r for r in self.rates if r.state == "current"), None)


@dataclass(frozen=True)
class LocationsPage:
    locations: tuple[LocationView, ...]
    currency: str  # the fleet's: a new price is in it
    earliest: date  # the first date a new rate may start


@dataclass(frozen=True)
class NodePlace:
    """Where a node is today, and a move planned from a later date (None: none planned)."""

    current: str
    upcoming: tuple[str, date] | None


def node_places(*, scope: Scope, now: datetime) -> dict[str, NodePlace]:
    """Node name -> its location today and any move planned (admins only; nodes without one are absent)."""
    if not scope.is_admin:
        return {}
    today = now.astimezone(UTC).date()
    rows: dict[str, list[NodeLocation]] = defaultdict(list)
    for nl in NodeLocation.objects.select_related("node", "location").order_by("node__name", "effective_from"):
        rows[nl.node.name].append(nl)
    out = {}
    for name, history in rows.items():
        past = [nl for nl in history if nl.effective_from <= today]
        later = [nl for nl in history if nl.effective_from > today]
        out[name] = NodePlace(current=past[-1].location.label if past else "",
                              upcoming=(later[-1].location.label, later[-1].effective_from) if later else None)
    return out


def location_labels(*, scope: Scope) -> list[str]:
    """Every location's label, for the Nodes page's choices (admins only)."""
    return list(Location.objects.order_by("label").values_list("label", flat=True)) if scope.is_admin else []


def get_locations_page(*, scope: Scope, now: datetime) -> LocationsPage:
    """Every location with its rates (newest first) and the nodes there today (admins only)."""
    if not scope.is_admin:
        return LocationsPage((), "", earliest_energy_change(now))
    today = now.astimezone(UTC).date()
    rates: dict[int, list[LocationRate]] = defaultdict(list)
    for r in LocationRate.objects.order_by("location_id", "-effective_from"):
        rates[r.location_id].append(r)
    places = node_places(scope=scope, now=now)
    views = []
    for loc in Location.objects.order_by("label"):
        history = rates.get(loc.pk, [])
        current_from = next((r.effective_from for r in history if r.effective_from <= today), None)
        views.append(LocationView(
            label=loc.label, created_at=loc.created_at,
            rates=tuple(RateView(effective_from=r.effective_from, price_per_kwh=r.price_per_kwh, currency=r.currency,
                                 co2e_kg_per_kwh=r.co2e_kg_per_kwh,
                                 state="upcoming" if r.effective_from > today
                                 else "current" if r.effective_from == current_from else "past")
                        for r in history),
            nodes=tuple(sorted(name for name, p in places.items() if p.current == loc.label)),
        ))
    return LocationsPage(tuple(views), fleet_currency(now), earliest_energy_change(now))
