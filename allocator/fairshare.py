"""Weighted max-min fair share (water-filling) of a GPU's memory, SMs and PCIe bandwidth.

docs/design.md (Weighted fair sharing; Enforcement), per GPU and per resource:

- demand = clamp(max(current, predicted peak) x (1 + headroom), guarantee, limit); the
  predicted peak is the largest over the horizons the policy selects, so demand rises
  *before* the peak arrives (pre-reservation);
- a tenant whose budget is in ``throttle`` gets its weight x ``throttle_weight_factor``
  and no burst: its demand is capped at its guarantee (memory: at its current use when
  that is above the guarantee, because memory cannot be taken back);
- guarantees are served first (shared by weight when they alone exceed capacity); the
  rest is water-filled by weight up to each demand;
- memory is not preemptible: no grant is below current use, so contention is only over
  the growth above it; SMs and PCIe bandwidth are preemptible;
- whatever is not granted is reported as headroom, never given away.

:func:`fair_share` is the one-resource primitive; :func:`allocate_gpu` is one GPU tick
over the three resources. Both are pure and deterministic: the result depends on the
set of inputs, not their order (workloads are processed in key order; ties in the
water-filling are broken by key). Plain Python loops: at <= 64 workloads they beat
numpy's per-call overhead (docs/allocation.md has the measurements).
"""

from __future__ import annotations

import math
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from itertools import accumulate, pairwise
from types import MappingProxyType

__all__ = [
    "UNLIMITED",
    "Allocation",
    "AllocationPolicy",
    "Claim",
    "GpuCapacity",
    "GpuGrants",
    "PredictedPeak",
    "Resources",
    "WorkloadState",
    "allocate_gpu",
    "fair_share",
    "workload_demand",
]

_RESOURCES = ("mem_mb", "sm", "pcie_mbps")
_MAX = sys.float_info.max  # 0 <= x <= _MAX: finite and >= 0 in one comparison


# --------------------------------------------------------------------------- one resource


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
    """Share ``capacity`` of one resource among ``claims``; deterministic for equal inputs.

    Units are the caller's; every quantity of one call is in the unit of ``capacity``.
    """
    _check_capacity("capacity", capacity)
    _validate_claims(claims)
    ordered = sorted(claims, key=lambda c: c.key)  # float sums below then ignore input order
    floors = [0.0 if c.preemptible else c.current_use for c in ordered]
    targets = [max(min(max(c.demand, c.guarantee), c.limit), f) for c, f in zip(ordered, floors, strict=True)]
    grants, headroom, overcommitted = _share(
        capacity=capacity,
        weights=[c.weight for c in ordered],
        targets=targets,
        guarantees=[c.guarantee for c in ordered],
        floors=floors,
    )
    return Allocation(
        grants=MappingProxyType({c.key: g for c, g in zip(ordered, grants, strict=True)}),
        headroom=headroom,
        overcommitted=overcommitted,
    )


def _share(
    *,
    capacity: float,
    weights: list[float],
    targets: list[float],
    guarantees: list[float],
    floors: list[float] | None,
) -> tuple[list[float], float, bool]:
    """Grants (same order as the inputs), headroom, overcommitted.

    ``floors`` is None for a preemptible resource (no floor). Preconditions (callers
    establish them): ``floors[i] <= targets[i]``, weights > 0, everything finite and
    >= 0, inputs in key order. Comprehensions and conditionals rather than min/max
    calls: this runs three times per GPU every tick.
    """
    wanted = math.fsum(targets)
    if wanted <= capacity:
        # Uncontended (the common tick): everyone gets the clamped demand.
        return list(targets), capacity - wanted, False
    # Guarantee phase: each up to min(guarantee, target), never below its floor.
    base = [g if g < t else t for g, t in zip(guarantees, targets, strict=True)]
    if floors is None:
        floor_total = 0.0
    else:
        floor_total = math.fsum(floors)
        if floor_total > capacity:
            # Memory already in use cannot be reclaimed: report it, never invent capacity.
            return list(floors), 0.0, True
        base = [b if b > f else f for b, f in zip(base, floors, strict=True)]
    if math.fsum(base) > capacity:  # guarantees alone exceed capacity: share them by weight
        if floors is None:
            base = _water_fill(available=capacity, caps=base, weights=weights)
        else:
            above = _water_fill(
                available=capacity - floor_total,
                caps=[b - f for b, f in zip(base, floors, strict=True)],
                weights=weights,
            )
            base = [f + a for f, a in zip(floors, above, strict=True)]
        grants = base
    else:
        # Burst phase: what is left, by weight, up to each target.
        extra = _water_fill(
            available=capacity - math.fsum(base),
            caps=[t - b for t, b in zip(targets, base, strict=True)],
            weights=weights,
        )
        # b + (t - b) can round one ulp above t: a grant never exceeds its target (the demand).
        grants = [t if b + e > t else b + e for b, e, t in zip(base, extra, targets, strict=True)]
    granted = _trim_to_capacity(grants=grants, floors=floors, capacity=capacity)
    left = capacity - granted
    return grants, (left if left > 0 else 0.0), False


def _water_fill(*, available: float, caps: list[float], weights: list[float]) -> list[float]:
    """Weighted max-min split of ``available`` with item ``i`` capped at ``caps[i]``.

    Items saturate in order of cap per unit weight (ties: input order, i.e. key order);
    once one does not, everyone left gets the same amount per unit weight (the level).
    """
    if math.fsum(caps) <= available:
        return list(caps)
    ratios = [c / w for c, w in zip(caps, weights, strict=True)]
    order = sorted(range(len(caps)), key=ratios.__getitem__)  # stable: ties keep key order
    # Weight still unsaturated from each position on, summed from the end (no cancellation).
    weight_from = list(accumulate([weights[i] for i in reversed(order)]))
    weight_from.reverse()
    shares = [0.0] * len(caps)
    remaining = available if available > 0 else 0.0
    for pos, i in enumerate(order):
        if ratios[i] * weight_from[pos] <= remaining:  # its cap is within the fair level
            cap = caps[i]
            shares[i] = cap
            remaining = remaining - cap if remaining > cap else 0.0
            continue
        level = remaining / weight_from[pos]  # grant per unit weight for everyone left
        for j in order[pos:]:
            fair = level * weights[j]
            shares[j] = fair if fair < caps[j] else caps[j]
        break
    return shares


def _trim_to_capacity(*, grants: list[float], floors: list[float] | None, capacity: float) -> float:
    """Remove float rounding excess in place so that neither sum nor fsum exceeds capacity.

    Returns ``fsum(grants)`` after trimming.
    """
    lows = floors if floors is not None else [0.0] * len(grants)
    while (excess := max(total := math.fsum(grants), sum(grants)) - capacity) > 0:
        # The largest grant above its floor gives up the excess; ties: the last key.
        i = max(range(len(grants)), key=lambda k: (grants[k] - lows[k], k))
        if grants[i] <= lows[i]:
            break  # nothing above the floors left; only the overcommit path gets here
        trimmed = max(lows[i], grants[i] - excess)
        if trimmed == grants[i]:
            trimmed = max(lows[i], math.nextafter(grants[i], -math.inf))
        grants[i] = trimmed
    return total


def _validate_claims(claims: Sequence[Claim]) -> None:
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


def _check_capacity(name: str, value: float) -> None:
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"{name} must be finite and > 0, got {value!r}")


# --------------------------------------------------------------------------- one GPU tick


@dataclass(frozen=True, slots=True)
class Resources:
    """An amount of each resource of one GPU: memory MiB, SMs, PCIe MB/s."""

    mem_mb: float = 0.0
    sm: float = 0.0  # streaming multiprocessors (utilisation x SM count)
    pcie_mbps: float = 0.0  # host<->device bandwidth, MB/s


UNLIMITED = Resources(mem_mb=math.inf, sm=math.inf, pcie_mbps=math.inf)


@dataclass(frozen=True, slots=True)
class GpuCapacity:
    """What one GPU has to share."""

    mem_mb: float  # > 0
    sm: float  # > 0
    pcie_mbps: float | None = None  # > 0; None: bandwidth not constrained (capacity unknown)

    def __post_init__(self) -> None:
        _check_capacity("capacity mem_mb", self.mem_mb)
        _check_capacity("capacity sm", self.sm)
        if self.pcie_mbps is not None:
            _check_capacity("capacity pcie_mbps", self.pcie_mbps)


@dataclass(frozen=True, slots=True)
class PredictedPeak:
    """A workload's predicted peak use over the next ``horizon_s`` seconds."""

    horizon_s: float  # > 0, e.g. 0.5, 1 or 2
    peak: Resources  # each >= 0


@dataclass(frozen=True, slots=True)
class WorkloadState:
    """One workload on one GPU at this tick: use, prediction, entitlement, budget."""

    key: str  # unique on the GPU; also the tie-break order
    weight: float  # > 0; SLA weight (before throttling)
    current: Resources  # use now, each >= 0
    predicted: tuple[PredictedPeak, ...] = ()  # peaks per horizon; at most one per horizon
    guarantee: Resources = Resources()  # each >= 0
    limit: Resources = UNLIMITED  # each >= the guarantee; inf: up to the card
    throttled: bool = False  # the tenant's budget is in ``throttle`` state (docs/design.md, Enforcement)

    def __post_init__(self) -> None:
        # One chained comparison per value (NaN and inf fail ``0 <= x <= _MAX``): the agent
        # builds every workload every tick. Anything off goes to the slow path for the message.
        c, g, lim = self.current, self.guarantee, self.limit
        if not (
            self.key
            and 0.0 < self.weight <= _MAX
            and 0.0 <= c.mem_mb <= _MAX
            and 0.0 <= c.sm <= _MAX
            and 0.0 <= c.pcie_mbps <= _MAX
            and 0.0 <= g.mem_mb <= lim.mem_mb
            and 0.0 <= g.sm <= lim.sm
            and 0.0 <= g.pcie_mbps <= lim.pcie_mbps
            and g.mem_mb <= _MAX
            and g.sm <= _MAX
            and g.pcie_mbps <= _MAX
            and (len(self.predicted) < 2 or len({p.horizon_s for p in self.predicted}) == len(self.predicted))
        ):
            self._raise_invalid()
        for p in self.predicted:  # a loop, not all(<generator>): a generator per workload costs as much as the rest
            peak = p.peak
            if not (
                0.0 < p.horizon_s <= _MAX
                and 0.0 <= peak.mem_mb <= _MAX
                and 0.0 <= peak.sm <= _MAX
                and 0.0 <= peak.pcie_mbps <= _MAX
            ):
                self._raise_invalid()

    def _raise_invalid(self) -> None:
        where = f"workload {self.key!r}"
        if not self.key:
            raise ValueError("workload key must not be empty")
        if not math.isfinite(self.weight) or self.weight <= 0:
            raise ValueError(f"{where}: weight must be finite and > 0, got {self.weight!r}")
        _check_amounts(where, "current", self.current)
        _check_amounts(where, "guarantee", self.guarantee)
        for name in _RESOURCES:
            limit, guarantee = getattr(self.limit, name), getattr(self.guarantee, name)
            if math.isnan(limit) or limit < guarantee:
                raise ValueError(f"{where}: limit.{name} {limit!r} must be >= guarantee.{name} {guarantee!r}")
        horizons: set[float] = set()
        for p in self.predicted:
            if not math.isfinite(p.horizon_s) or p.horizon_s <= 0:
                raise ValueError(f"{where}: prediction horizon_s must be finite and > 0, got {p.horizon_s!r}")
            if p.horizon_s in horizons:
                raise ValueError(f"{where}: more than one prediction for horizon {p.horizon_s!r} s")
            horizons.add(p.horizon_s)
            _check_amounts(where, f"predicted peak at {p.horizon_s!r} s", p.peak)
        raise ValueError(f"{where}: invalid state {self!r}")  # the checks above mirror the fast path


@dataclass(frozen=True, slots=True)
class AllocationPolicy:
    """How demand is derived from use and prediction; validated at construction."""

    headroom: float = 0.2  # demand = peak x (1 + headroom); >= 0
    horizons_s: tuple[float, ...] = (0.5, 1.0, 2.0)  # predictions that pre-reserve; others ignored
    throttle_weight_factor: float = 0.5  # weight x this for throttled tenants; in (0, 1]

    def __post_init__(self) -> None:
        if not math.isfinite(self.headroom) or self.headroom < 0:
            raise ValueError(f"headroom must be finite and >= 0, got {self.headroom!r}")
        if not self.horizons_s:
            raise ValueError("horizons_s must select at least one horizon")
        for h in self.horizons_s:
            if not math.isfinite(h) or h <= 0:
                raise ValueError(f"horizons_s must be finite and > 0, got {h!r}")
        f = self.throttle_weight_factor
        if not math.isfinite(f) or not 0 < f <= 1:
            raise ValueError(f"throttle_weight_factor must be in (0, 1], got {f!r}")


@dataclass(frozen=True, slots=True)
class GpuGrants:
    """One GPU's grants for the next tick, one :class:`Allocation` per resource.

    Invariants: per resource, sum of grants <= capacity (memory: unless current use alone
    exceeds it; then ``memory.overcommitted`` and every memory grant equals current use);
    every memory grant >= current use; every grant <= the workload's demand.
    """

    memory: Allocation  # MiB per workload key
    sm: Allocation  # SMs per workload key
    pcie: Allocation | None  # MB/s per workload key; None: bandwidth not constrained

    def for_workload(self, key: str) -> Resources:
        """One workload's grants (PCIe: its demand when bandwidth is not constrained)."""
        pcie = self.pcie.grants[key] if self.pcie is not None else math.inf
        return Resources(mem_mb=self.memory.grants[key], sm=self.sm.grants[key], pcie_mbps=pcie)


def workload_demand(workload: WorkloadState, policy: AllocationPolicy) -> Resources:
    """The demand ``allocate_gpu`` shares for ``workload`` (memory: never below current use)."""
    _, mem, sm, pcie = _demand(
        workload,
        grow=1.0 + policy.headroom,
        horizons=policy.horizons_s,
        factor=policy.throttle_weight_factor,
    )
    return Resources(mem_mb=mem, sm=sm, pcie_mbps=pcie)


def allocate_gpu(
    *,
    capacity: GpuCapacity,
    workloads: Sequence[WorkloadState],
    policy: AllocationPolicy,
) -> GpuGrants:
    """Fair-share one GPU's memory, SMs and PCIe bandwidth among its workloads (docs/allocation.md)."""
    ordered = sorted(workloads, key=lambda w: w.key)
    keys = [w.key for w in ordered]
    for a, b in pairwise(keys):
        if a == b:
            raise ValueError(f"workload key {a!r} appears more than once")
    grow = 1.0 + policy.headroom
    horizons = policy.horizons_s
    factor = policy.throttle_weight_factor
    n = len(ordered)
    weights = [0.0] * n
    mem_t, sm_t, pcie_t = [0.0] * n, [0.0] * n, [0.0] * n  # targets: the clamped demands
    for i, w in enumerate(ordered):
        weights[i], mem_t[i], sm_t[i], pcie_t[i] = _demand(w, grow=grow, horizons=horizons, factor=factor)
    memory = _allocation(
        keys,
        *_share(
            capacity=capacity.mem_mb,
            weights=weights,
            targets=mem_t,
            guarantees=[w.guarantee.mem_mb for w in ordered],
            floors=[w.current.mem_mb for w in ordered],
        ),
    )
    sm = _allocation(
        keys,
        *_share(
            capacity=capacity.sm,
            weights=weights,
            targets=sm_t,
            guarantees=[w.guarantee.sm for w in ordered],
            floors=None,
        ),
    )
    pcie = None
    if capacity.pcie_mbps is not None:
        pcie = _allocation(
            keys,
            *_share(
                capacity=capacity.pcie_mbps,
                weights=weights,
                targets=pcie_t,
                guarantees=[w.guarantee.pcie_mbps for w in ordered],
                floors=None,
            ),
        )
    return GpuGrants(memory=memory, sm=sm, pcie=pcie)


def _demand(
    w: WorkloadState, *, grow: float, horizons: tuple[float, ...], factor: float
) -> tuple[float, float, float, float]:
    """(weight, memory, SM, PCIe demand) of one workload; conditionals, not min/max: hot path."""
    cur, g, lim = w.current, w.guarantee, w.limit
    mem, sm, pcie = cur.mem_mb, cur.sm, cur.pcie_mbps
    for p in w.predicted:
        if p.horizon_s in horizons:  # pre-reservation: demand rises before the peak arrives
            peak = p.peak
            if peak.mem_mb > mem:
                mem = peak.mem_mb
            if peak.sm > sm:
                sm = peak.sm
            if peak.pcie_mbps > pcie:
                pcie = peak.pcie_mbps
    mem, sm, pcie = mem * grow, sm * grow, pcie * grow
    # Clamped between the guarantee and the limit; limit >= guarantee is validated.
    mem = g.mem_mb if mem < g.mem_mb else lim.mem_mb if mem > lim.mem_mb else mem
    sm = g.sm if sm < g.sm else lim.sm if sm > lim.sm else sm
    pcie = g.pcie_mbps if pcie < g.pcie_mbps else lim.pcie_mbps if pcie > lim.pcie_mbps else pcie
    weight = w.weight
    if w.throttled:  # no burst above the guarantee; memory in use cannot be taken back anyway
        weight *= factor
        cap = g.mem_mb if g.mem_mb > cur.mem_mb else cur.mem_mb
        if mem > cap:
            mem = cap
        sm, pcie = g.sm, g.pcie_mbps
    if mem < cur.mem_mb:  # memory is not preemptible: never below use, even above the limit
        mem = cur.mem_mb
    return weight, mem, sm, pcie


def _allocation(keys: list[str], grants: list[float], headroom: float, overcommitted: bool) -> Allocation:
    return Allocation(
        grants=MappingProxyType(dict(zip(keys, grants, strict=True))),
        headroom=headroom,
        overcommitted=overcommitted,
    )


def _check_amounts(where: str, what: str, amounts: Resources) -> None:
    for name in _RESOURCES:
        value = getattr(amounts, name)
        if not math.isfinite(value) or value < 0:
            raise ValueError(f"{where}: {what}.{name} must be finite and >= 0, got {value!r}")
