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

:func:`fair_share` is the one-resource primitive; :func:`allocate_columns` is one GPU tick
over the three resources, its workloads given as columns (one list per attribute, in key
order: what the agent builds every tick, without an object per workload), and
:func:`allocate_gpu` is the same tick over :class:`WorkloadState` objects, through
:func:`allocate_columns`. All are pure and deterministic: the result depends on the set of
inputs, not their order (workloads are processed in key order; ties in the water-filling
are broken by key). Plain Python loops: at <= 64 workloads they beat numpy's per-call
overhead (docs/allocation.md has the measurements).
"""

from __future__ import annotations

import math
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from itertools import accumulate, pairwise
from types import MappingProxyType
from typing import NamedTuple

__all__ = [
    "UNLIMITED",
    "Allocation",
    "AllocationPolicy",
    "Claim",
    "ColumnGrants",
    "GpuCapacity",
    "GpuColumns",
    "GpuGrants",
    "PredictedPeak",
    "ResourceColumns",
    "Resources",
    "Shares",
    "WorkloadState",
    "allocate_columns",
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
    shares = _share(
        capacity=capacity,
        weights=[c.weight for c in ordered],
        targets=targets,
        guarantees=[c.guarantee for c in ordered],
        floors=floors,
    )
    return _allocation([c.key for c in ordered], shares)


class Shares(NamedTuple):
    """One resource of one GPU shared: the grants in the order of the inputs."""

    grants: list[float]
    headroom: float  # capacity left unclaimed, >= 0
    overcommitted: bool  # current use of non-preemptible claims alone exceeds capacity


def _share(
    *,
    capacity: float,
    weights: Sequence[float],
    targets: Sequence[float],
    guarantees: Sequence[float],
    floors: Sequence[float] | None,
) -> Shares:
    """Grants (same order as the inputs), headroom, overcommitted.

    ``floors`` is None for a preemptible resource (no floor). Preconditions (callers
    establish them): ``floors[i] <= targets[i]``, weights > 0, everything finite and
    >= 0, inputs in key order. Comprehensions and conditionals rather than min/max
    calls: this runs three times per GPU every tick.
    """
    wanted = math.fsum(targets)
    if wanted <= capacity:
        # Uncontended (the common tick): everyone gets the clamped demand.
        return Shares(list(targets), capacity - wanted, False)
    # Guarantee phase: each up to min(guarantee, target), never below its floor.
    base = [g if g < t else t for g, t in zip(guarantees, targets, strict=True)]
    if floors is None:
        floor_total = 0.0
    else:
        floor_total = math.fsum(floors)
        if floor_total > capacity:
            # Memory already in use cannot be reclaimed: report it, never invent capacity.
            return Shares(list(floors), 0.0, True)
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
    return Shares(grants, (left if left > 0 else 0.0), False)


def _water_fill(*, available: float, caps: list[float], weights: Sequence[float]) -> list[float]:
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


def _trim_to_capacity(*, grants: list[float], floors: Sequence[float] | None, capacity: float) -> float:
    """Remove float rounding excess in place so that neither sum nor fsum exceeds capacity.

    Returns ``fsum(grants)`` after trimming.
    """
    lows = floors if floors is not None else [0.0] * len(grants)
    while (excess := max(total := math.fsum(grants), sum(grants)) - capacity) > 0:
        # The largest grant above its floor gives up the excess; ties: the last key (a search from the
        # end rather than max() with a key function: no Python-level call per grant).
        above = grants if floors is None else [g - low for g, low in zip(grants, lows, strict=True)]
        i = len(above) - 1 - above[::-1].index(max(above))
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


@dataclass(frozen=True, slots=True)
class ResourceColumns:
    """One resource of a GPU's workloads, one entry per workload in the order of ``GpuColumns.keys``."""

    used: Sequence[float]  # use now, each >= 0
    peak: Sequence[float]  # the largest predicted peak over the policy's horizons (the use when none), >= 0
    guarantee: Sequence[float]  # each >= 0
    limit: Sequence[float]  # each >= its guarantee; inf: up to the card


@dataclass(frozen=True, slots=True)
class GpuColumns:
    """A GPU's workloads as columns (what :class:`WorkloadState` holds, one list per attribute).

    ``keys`` strictly increase: the workloads in key order, each once. Not checked here but by
    :func:`allocate_columns`, which words a bad entry as the ``WorkloadState`` of its row would.
    """

    keys: Sequence[str]
    weights: Sequence[float]  # > 0; SLA weights (before throttling)
    throttled: Sequence[bool]  # the tenant's budget is in ``throttle`` state
    memory: ResourceColumns  # MiB
    sm: ResourceColumns  # SMs
    pcie: ResourceColumns | None = None  # MB/s; needed when the capacity states a PCIe bandwidth


class ColumnGrants(NamedTuple):
    """One GPU's grants for the next tick, per resource in the order of the columns (see :class:`GpuGrants`)."""

    memory: Shares
    sm: Shares
    pcie: Shares | None  # None: bandwidth not constrained


def workload_demand(workload: WorkloadState, policy: AllocationPolicy) -> Resources:
    """The demand ``allocate_gpu`` shares for ``workload`` (memory: never below current use)."""
    mem, sm, pcie = _resources_of([workload], policy.horizons_s)
    grow, throttled = 1.0 + policy.headroom, (workload.throttled,)
    return Resources(
        mem_mb=_memory_targets(mem, throttled, grow)[0],
        sm=_preemptible_targets(sm, throttled, grow)[0],
        pcie_mbps=_preemptible_targets(pcie, throttled, grow)[0],
    )


def allocate_gpu(
    *,
    capacity: GpuCapacity,
    workloads: Sequence[WorkloadState],
    policy: AllocationPolicy,
) -> GpuGrants:
    """Fair-share one GPU's memory, SMs and PCIe bandwidth among its workloads (docs/allocation.md)."""
    columns = _columns_of(sorted(workloads, key=lambda w: w.key), policy.horizons_s)
    result = allocate_columns(capacity=capacity, columns=columns, policy=policy)
    keys = columns.keys
    return GpuGrants(
        memory=_allocation(keys, result.memory),
        sm=_allocation(keys, result.sm),
        pcie=None if result.pcie is None else _allocation(keys, result.pcie),
    )


def allocate_columns(*, capacity: GpuCapacity, columns: GpuColumns, policy: AllocationPolicy) -> ColumnGrants:
    """:func:`allocate_gpu` over columns: the same grants, bit for bit, in the columns' order.

    The agent's tick: no object per workload, and the grants come back as lists it zips with
    its readings. Bandwidth is shared when ``capacity.pcie_mbps`` is set (``columns.pcie`` is
    then required) and not otherwise.
    """
    _check_columns(columns, policy, pcie_needed=capacity.pcie_mbps is not None)
    grow, factor, throttled = 1.0 + policy.headroom, policy.throttle_weight_factor, columns.throttled
    weights = [w * factor if t else w for w, t in zip(columns.weights, throttled, strict=True)]
    mem, sm = columns.memory, columns.sm
    memory = _share(
        capacity=capacity.mem_mb,
        weights=weights,
        targets=_memory_targets(mem, throttled, grow),
        guarantees=mem.guarantee,
        floors=mem.used,
    )
    sms = _share(
        capacity=capacity.sm,
        weights=weights,
        targets=_preemptible_targets(sm, throttled, grow),
        guarantees=sm.guarantee,
        floors=None,
    )
    pcie = None
    if capacity.pcie_mbps is not None and columns.pcie is not None:
        pcie = _share(
            capacity=capacity.pcie_mbps,
            weights=weights,
            targets=_preemptible_targets(columns.pcie, throttled, grow),
            guarantees=columns.pcie.guarantee,
            floors=None,
        )
    return ColumnGrants(memory, sms, pcie)


def _memory_targets(c: ResourceColumns, throttled: Sequence[bool], grow: float) -> list[float]:
    """Memory demands: peak x grow clamped to [guarantee, limit]; a throttled tenant no higher than
    its guarantee or its use; never below use (memory cannot be taken back, even above the limit).
    Conditionals, not min/max: the hot path."""
    targets = []
    for u, p, g, lim, t in zip(c.used, c.peak, c.guarantee, c.limit, throttled, strict=True):
        d = (p if p > u else u) * grow  # pre-reservation: demand rises before the peak arrives
        d = g if d < g else lim if d > lim else d
        if t:
            cap = g if g > u else u
            if d > cap:
                d = cap
        targets.append(u if d < u else d)
    return targets


def _preemptible_targets(c: ResourceColumns, throttled: Sequence[bool], grow: float) -> list[float]:
    """SM and bandwidth demands: peak x grow clamped to [guarantee, limit]; a throttled tenant's is its guarantee."""
    return [
        g if t else g if (d := (p if p > u else u) * grow) < g else lim if d > lim else d
        for u, p, g, lim, t in zip(c.used, c.peak, c.guarantee, c.limit, throttled, strict=True)
    ]


def _check_columns(columns: GpuColumns, policy: AllocationPolicy, *, pcie_needed: bool) -> None:
    """The checks of :class:`WorkloadState`, one chained comparison per value; a row that fails is
    built as a ``WorkloadState``, which words the error."""
    keys, mem, sm, pcie = columns.keys, columns.memory, columns.sm, columns.pcie
    lengths = {
        len(keys), len(columns.weights), len(columns.throttled),
        len(mem.used), len(mem.peak), len(mem.guarantee), len(mem.limit),
        len(sm.used), len(sm.peak), len(sm.guarantee), len(sm.limit),
    }  # a set display, not a generator over the columns: every GPU, every tick
    if pcie is not None:
        lengths.update((len(pcie.used), len(pcie.peak), len(pcie.guarantee), len(pcie.limit)))
    if len(lengths) > 1:
        raise ValueError(f"every column must have one entry per workload, got lengths {sorted(lengths)}")
    if pcie_needed and pcie is None:
        raise ValueError("a PCIe capacity needs the workloads' PCIe columns")
    if keys and not keys[0]:
        raise ValueError("workload key must not be empty")
    for a, b in pairwise(keys):
        if not a < b:
            raise ValueError(
                f"workload key {a!r} appears more than once" if a == b else f"keys must be in order: {a!r} before {b!r}"
            )
    for i, (w, mu, mp, mg, ml, su, sp, sg, sl) in enumerate(
        zip(columns.weights, mem.used, mem.peak, mem.guarantee, mem.limit, sm.used, sm.peak, sm.guarantee, sm.limit, strict=True)
    ):
        if not (
            0.0 < w <= _MAX
            and 0.0 <= mu <= _MAX
            and 0.0 <= mp <= _MAX
            and 0.0 <= mg <= ml
            and mg <= _MAX
            and 0.0 <= su <= _MAX
            and 0.0 <= sp <= _MAX
            and 0.0 <= sg <= sl
            and sg <= _MAX
        ):
            _reject_row(columns, i, policy)
    if pcie is not None:
        for i, (u, p, g, lim) in enumerate(zip(pcie.used, pcie.peak, pcie.guarantee, pcie.limit, strict=True)):
            if not (0.0 <= u <= _MAX and 0.0 <= p <= _MAX and 0.0 <= g <= lim and g <= _MAX):
                _reject_row(columns, i, policy)


def _reject_row(columns: GpuColumns, i: int, policy: AllocationPolicy) -> None:
    """Raise the error ``WorkloadState`` gives for row ``i`` (its peak as the policy's longest horizon's)."""
    mem, sm, pcie = columns.memory, columns.sm, columns.pcie

    def amounts(what: str) -> Resources:
        return Resources(
            getattr(mem, what)[i], getattr(sm, what)[i], 0.0 if pcie is None else getattr(pcie, what)[i]
        )

    WorkloadState(
        columns.keys[i],
        columns.weights[i],
        amounts("used"),
        (PredictedPeak(max(policy.horizons_s), amounts("peak")),),
        amounts("guarantee"),
        amounts("limit") if pcie is not None else Resources(mem.limit[i], sm.limit[i], math.inf),
        columns.throttled[i],
    )
    raise ValueError(f"workload {columns.keys[i]!r}: invalid state")  # WorkloadState checks the same values


def _columns_of(ordered: Sequence[WorkloadState], horizons: tuple[float, ...]) -> GpuColumns:
    """Validated states in key order as columns."""
    mem, sm, pcie = _resources_of(ordered, horizons)
    return GpuColumns(
        keys=[w.key for w in ordered],
        weights=[w.weight for w in ordered],
        throttled=[w.throttled for w in ordered],
        memory=mem,
        sm=sm,
        pcie=pcie,
    )


def _resources_of(
    ordered: Sequence[WorkloadState], horizons: tuple[float, ...]
) -> tuple[ResourceColumns, ResourceColumns, ResourceColumns]:
    """Memory, SM and PCIe columns; each peak is the largest prediction over ``horizons``, from the use up."""
    used: list[list[float]] = [[], [], []]
    peak: list[list[float]] = [[], [], []]
    for w in ordered:
        cur = w.current
        m, s, b = cur.mem_mb, cur.sm, cur.pcie_mbps
        for p in w.predicted:
            if p.horizon_s in horizons:
                top = p.peak
                if top.mem_mb > m:
                    m = top.mem_mb
                if top.sm > s:
                    s = top.sm
                if top.pcie_mbps > b:
                    b = top.pcie_mbps
        for column, value in zip(used, (cur.mem_mb, cur.sm, cur.pcie_mbps), strict=True):
            column.append(value)
        for column, value in zip(peak, (m, s, b), strict=True):
            column.append(value)

    def resource(k: int, name: str) -> ResourceColumns:
        return ResourceColumns(
            used[k], peak[k], [getattr(w.guarantee, name) for w in ordered], [getattr(w.limit, name) for w in ordered]
        )

    return resource(0, "mem_mb"), resource(1, "sm"), resource(2, "pcie_mbps")


def _allocation(keys: Sequence[str], shares: Shares) -> Allocation:
    return Allocation(
        grants=MappingProxyType(dict(zip(keys, shares.grants, strict=True))),
        headroom=shares.headroom,
        overcommitted=shares.overcommitted,
    )


def _check_amounts(where: str, what: str, amounts: Resources) -> None:
    for name in _RESOURCES:
        value = getattr(amounts, name)
        if not math.isfinite(value) or value < 0:
            raise ValueError(f"{where}: {what}.{name} must be finite and >= 0, got {value!r}")
