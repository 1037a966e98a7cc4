"""Weighted max-min fair share (water-filling) of one resource on one GPU.

DESIGN §5: demand is clamped to ``[guarantee, limit]``; guarantees are served
first (shared by weight when they alone exceed capacity); the rest is
water-filled by weight up to each demand. Non-preemptible resources (memory)
are never granted below current use, so contention is only over growth above
it. Whatever is not granted is reported as ``headroom``, never given away.

Units are the caller's (MB for memory, SMs for compute); every quantity of one
call is in the same unit as ``capacity``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType

__all__ = ["Allocation", "Claim", "fair_share"]


@dataclass(frozen=True, slots=True)
class Claim:
    """One workload's request for a share of one resource on one GPU."""

    key: str
    weight: float  # > 0; relative share under contention (SLA weight)
    demand: float  # >= 0; what the workload wants now (before clamping)
    guarantee: float = 0.0  # >= 0; served first whenever capacity allows
    limit: float = math.inf  # >= guarantee; never granted more (unless current use is higher)
    current_use: float = 0.0  # >= 0; the floor of the grant when not preemptible
    preemptible: bool = True  # False for memory: allocations cannot be taken back


@dataclass(frozen=True, slots=True)
class Allocation:
    """Grants per claim key; invariant: sum(grants) <= capacity unless overcommitted."""

    grants: Mapping[str, float]
    headroom: float  # capacity left unclaimed, >= 0
    overcommitted: bool  # current use of non-preemptible claims alone exceeds capacity


def fair_share(*, capacity: float, claims: Sequence[Claim]) -> Allocation:
    """Share ``capacity`` among ``claims``; deterministic for equal inputs."""
    _validate(capacity=capacity, claims=claims)
    claims = sorted(claims, key=lambda c: c.key)  # float sums below then ignore input order
    floors = {c.key: 0.0 if c.preemptible else c.current_use for c in claims}
    if math.fsum(floors.values()) > capacity:
        # Memory already in use cannot be reclaimed: report, never invent capacity.
        return Allocation(grants=MappingProxyType(dict(floors)), headroom=0.0, overcommitted=True)
    weights = {c.key: c.weight for c in claims}
    targets = {c.key: max(min(max(c.demand, c.guarantee), c.limit), floors[c.key]) for c in claims}
    guaranteed = {c.key: max(min(c.guarantee, targets[c.key]), floors[c.key]) for c in claims}

    base = _add(
        floors,
        _water_fill(
            available=capacity - math.fsum(floors.values()),
            caps={k: guaranteed[k] - floors[k] for k in floors},
            weights=weights,
        ),
    )
    grants = _add(
        base,
        _water_fill(
            available=capacity - math.fsum(base.values()),
            caps={k: targets[k] - base[k] for k in base},
            weights=weights,
        ),
    )
    grants = _trim_to_capacity(grants=grants, floors=floors, capacity=capacity)
    headroom = max(0.0, capacity - math.fsum(grants.values()))
    return Allocation(grants=MappingProxyType(grants), headroom=headroom, overcommitted=False)


def _water_fill(*, available: float, caps: Mapping[str, float], weights: Mapping[str, float]) -> dict[str, float]:
    """Weighted max-min split of ``available`` with each key capped at ``caps[key]``."""
    caps = {k: max(0.0, v) for k, v in caps.items()}
    if math.fsum(caps.values()) <= available:
        return dict(caps)
    shares = dict.fromkeys(caps, 0.0)
    remaining = max(0.0, available)
    weight_left = math.fsum(weights[k] for k in caps)
    # Saturate keys in order of cap per unit weight; ties broken by key for determinism.
    order = sorted(caps, key=lambda k: (caps[k] / weights[k], k))
    for index, key in enumerate(order):
        fair = remaining * weights[key] / weight_left
        if caps[key] <= fair:
            shares[key] = caps[key]
            remaining -= caps[key]
            weight_left -= weights[key]
            continue
        level = remaining / weight_left  # grant per unit weight for everyone left
        for rest in order[index:]:
            shares[rest] = min(caps[rest], level * weights[rest])
        break
    return shares


def _trim_to_capacity(*, grants: dict[str, float], floors: Mapping[str, float], capacity: float) -> dict[str, float]:
    """Remove float rounding excess so that the sum never exceeds capacity."""
    while (excess := max(math.fsum(grants.values()), sum(grants.values())) - capacity) > 0:
        key = max(grants, key=lambda k: (grants[k] - floors[k], k))
        if grants[key] <= floors[key]:
            break  # nothing above the floors left to trim; only the overcommit path gets here
        trimmed = max(floors[key], grants[key] - excess)
        if trimmed == grants[key]:
            trimmed = max(floors[key], math.nextafter(grants[key], -math.inf))
        grants[key] = trimmed
    return grants


def _add(a: Mapping[str, float], b: Mapping[str, float]) -> dict[str, float]:
    return {k: a[k] + b[k] for k in a}


def _validate(*, capacity: float, claims: Sequence[Claim]) -> None:
    if not math.isfinite(capacity) or capacity <= 0:
        raise ValueError(f"capacity must be finite and > 0, got {capacity!r}")
    seen: set[str] = set()
    for c in claims:
        if c.key in seen:
            raise ValueError(f"claim key {c.key!r} appears more than once")
        seen.add(c.key)
        if not math.isfinite(c.weight) or c.weight <= 0:
            raise ValueError(f"claim {c.key!r}: weight must be finite and > 0, got {c.weight!r}")
        for name in ("demand", "guarantee", "current_use"):
            value = getattr(c, name)
            if not math.isfinite(value) or value < 0:
                raise ValueError(f"claim {c.key!r}: {name} must be finite and >= 0, got {value!r}")
        if math.isnan(c.limit) or c.limit < c.guarantee:
            raise ValueError(f"claim {c.key!r}: limit {c.limit!r} must be >= guarantee {c.guarantee!r}")
