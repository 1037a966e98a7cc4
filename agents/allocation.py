"""One allocation round on a node: readings -> fair-share grants per GPU (docs/design.md, Weighted fair sharing)."""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from itertools import repeat
from types import MappingProxyType
from typing import cast

from agents.interfaces import BatchPredictor, GpuInfo, Grant, Prediction, Predictor, UsageReading, Workload
from allocator import AllocationPolicy, GpuCapacity, GpuColumns, ResourceColumns, allocate_columns
from allocator.risk import DEFAULT_MISS_TARGET, DEFAULT_MISS_TARGETS, MissTarget

__all__ = [
    "DEFAULT_SLA_WEIGHTS",
    "PREDICTION_HORIZON_S",
    "AllocationRound",
    "CurrentUsePredictor",
    "Policy",
    "compute_grants",
]

DEFAULT_SLA_WEIGHTS: Mapping[str, float] = MappingProxyType(
    {"gold": 4.0, "silver": 2.0, "bronze": 1.0, "best-effort": 0.5}
)

# ``Predictor.predict`` returns one peak over the whole look-ahead (0.5-2 s, interfaces.Prediction):
# it is handed to the allocator as the peak of its longest horizon.
PREDICTION_HORIZON_S = 2.0


@dataclass(frozen=True, slots=True)
class Policy:
    """Node allocation policy; ``agents.policy_client`` builds it from the service's policy API."""

    sla_weights: Mapping[str, float] = field(default_factory=lambda: DEFAULT_SLA_WEIGHTS)
    # demand = predicted peak x (1 + headroom), on top of the predictor's own margin. 0: the default
    # predictor (agents.prediction.MarginPredictor) calibrates a margin per workload instead.
    headroom: float = 0.0
    throttled_tenants: frozenset[str] = frozenset()  # budgets in ``throttle`` state (docs/design.md, Enforcement)
    throttle_weight_factor: float = 0.5  # a throttled tenant's weight x this; in (0, 1]
    # Per throttled tenant, its budget's own factor (the policy API's ``throttle_factor``);
    # a throttled tenant missing here gets ``throttle_weight_factor``. Each in (0, 1].
    tenant_throttle_factors: Mapping[str, float] = field(default_factory=dict)
    # Namespaces whose own budget is enforced with ``throttle`` -> its factor, in (0, 1]. A
    # workload under a throttled tenant and a throttled namespace gets the smaller factor.
    namespace_throttle_factors: Mapping[str, float] = field(default_factory=dict)
    # Per SLA tier, the share of seconds a grant may fall short of use, per resource
    # (``allocator.risk``); the service's SLA tiers send them with the weights.
    miss_targets: Mapping[str, MissTarget] = field(default_factory=lambda: DEFAULT_MISS_TARGETS)

    def __post_init__(self) -> None:
        for tier, weight in self.sla_weights.items():
            if not math.isfinite(weight) or weight <= 0:
                raise ValueError(f"SLA tier {tier!r}: weight must be finite and > 0, got {weight!r}")
        for kind, factors in (("tenant", self.tenant_throttle_factors), ("namespace", self.namespace_throttle_factors)):
            for name, factor in factors.items():
                if not (math.isfinite(factor) and 0 < factor <= 1):
                    raise ValueError(f"{kind} {name!r}: throttle factor must be in (0, 1], got {factor!r}")
        self.allocation_policy()  # validates headroom and throttle_weight_factor

    def weight_for(self, tier: str) -> float:
        try:
            return self.sla_weights[tier]
        except KeyError:
            known = ", ".join(sorted(self.sla_weights))
            raise ValueError(f"unknown SLA tier {tier!r} (known: {known})") from None

    def miss_target_for(self, tier: str) -> MissTarget:
        """A tier's miss targets; a tier the policy does not name gets ``DEFAULT_MISS_TARGET``."""
        return self.miss_targets.get(tier, DEFAULT_MISS_TARGET)

    def allocation_policy(self) -> AllocationPolicy:
        """The allocator's policy: the ``Predictor``'s one peak stands for the whole look-ahead."""
        return _allocation_policy(self.headroom, self.throttle_weight_factor)


@functools.lru_cache(maxsize=16)
def _allocation_policy(headroom: float, throttle_weight_factor: float) -> AllocationPolicy:
    # Built and validated once per pair rather than every round: the policy changes rarely.
    return AllocationPolicy(
        headroom=headroom, horizons_s=(PREDICTION_HORIZON_S,), throttle_weight_factor=throttle_weight_factor
    )


def _throttle_factor(policy: Policy, workload: Workload) -> float | None:
    """The weight factor of a workload whose tenant or namespace budget throttles it (the smaller
    when both do); None when neither does."""
    factors = []
    if workload.tenant in policy.throttled_tenants:
        factors.append(policy.tenant_throttle_factors.get(workload.tenant, policy.throttle_weight_factor))
    namespace = policy.namespace_throttle_factors.get(workload.namespace)
    if namespace is not None:
        factors.append(namespace)
    return min(factors) if factors else None


class CurrentUsePredictor:
    """``Predictor`` that expects the next seconds to look like now."""

    def predict(self, *, reading: UsageReading, now: datetime) -> Prediction:
        return Prediction(mem_peak_mb=reading.mem_used_mb, sm_peak=reading.sm_used)


@dataclass(frozen=True, slots=True)
class AllocationRound:
    grants: tuple[Grant, ...]
    mem_headroom_mb: Mapping[str, float]  # per GPU uuid: memory left unclaimed
    sm_headroom: Mapping[str, float]  # per GPU uuid: SMs left unclaimed
    mem_overcommitted: tuple[str, ...]  # GPU uuids whose memory in use exceeds capacity


def compute_grants(
    *,
    gpus: Sequence[GpuInfo],
    readings: Sequence[UsageReading],
    policy: Policy,
    predictor: Predictor,
    now: datetime,
) -> AllocationRound:
    """Fair-share memory (non-preemptible) and SMs (preemptible) on every GPU.

    PCIe bandwidth is carried (current use) but not constrained: ``GpuInfo`` has no
    link capacity and ``Grant`` no bandwidth field, so nothing could enforce it yet.
    """
    by_gpu: dict[str, list[int]] = {g.uuid: [] for g in gpus}  # each GPU's readings, by position
    for i, reading in enumerate(readings):
        on_gpu = by_gpu.get(reading.gpu)
        if on_gpu is None:
            raise ValueError(f"reading for unknown GPU {reading.gpu!r} ({reading.workload.key})")
        on_gpu.append(i)
    # One call for the whole round where the predictor batches (one LSTM pass for every workload).
    if _batches(type(predictor)):
        peaks = cast(BatchPredictor, predictor).predict_many(readings=readings, now=now)
    else:
        peaks = [predictor.predict(reading=r, now=now) for r in readings]
    if len(peaks) != len(readings):
        raise ValueError(f"the predictor gave {len(peaks)} predictions for {len(readings)} readings")

    allocation_policy = policy.allocation_policy()
    grants: list[Grant] = []
    mem_headroom: dict[str, float] = {}
    sm_headroom: dict[str, float] = {}
    overcommitted: list[str] = []
    for gpu in gpus:
        at = by_gpu[gpu.uuid]
        on_gpu_readings = [readings[i] for i in at]
        # The allocator takes the workloads in key order; grants go out in the readings' order.
        keys = [r.workload.key for r in on_gpu_readings]
        order = sorted(range(len(keys)), key=keys.__getitem__)
        result = allocate_columns(
            capacity=GpuCapacity(float(gpu.memory_mb), float(gpu.sm_count)),
            columns=_columns(
                [keys[j] for j in order], [on_gpu_readings[j] for j in order], [peaks[at[j]] for j in order], policy
            ),
            policy=allocation_policy,
        )
        mem_headroom[gpu.uuid] = result.memory.headroom
        sm_headroom[gpu.uuid] = result.sm.headroom
        if result.memory.overcommitted:
            overcommitted.append(gpu.uuid)
        mem, sm = result.memory.grants, result.sm.grants
        rank = sorted(range(len(order)), key=order.__getitem__)  # each reading's place in key order
        # Each Grant built from a zipped row by tuple.__new__ (what ``Grant._make`` does, without its
        # Python-level call): the loop stays in C, one Grant per reading every tick.
        rows_out = zip(
            [r.workload for r in on_gpu_readings], repeat(gpu.uuid), map(mem.__getitem__, rank), map(sm.__getitem__, rank)
        )
        grants.extend(map(tuple.__new__, repeat(Grant), rows_out))
    return AllocationRound(
        grants=tuple(grants),
        mem_headroom_mb=MappingProxyType(mem_headroom),
        sm_headroom=MappingProxyType(sm_headroom),
        mem_overcommitted=tuple(overcommitted),
    )


@functools.cache
def _batches(kind: type) -> bool:
    # isinstance() on a runtime-checkable protocol inspects its members on every call (~20 µs on
    # the bench machine, a tenth of the tick budget); whether a class batches does not change.
    return issubclass(kind, BatchPredictor)


def _weights(readings: list[UsageReading], policy: Policy) -> tuple[list[float], list[bool]]:
    """Each reading's weight and whether a budget throttles it: the tier's weight where the
    entitlement states none, and the throttle factors only for the readings some budget throttles.
    Comprehensions, not a loop body per reading: every workload, every tick."""
    tiers = policy.sla_weights
    try:
        weights = [w if (w := r.entitlement.weight) is not None else tiers[r.workload.sla_tier] for r in readings]
    except KeyError:
        weights = [w if (w := r.entitlement.weight) is not None else policy.weight_for(r.workload.sla_tier) for r in readings]
    tenants, namespaces = policy.throttled_tenants, policy.namespace_throttle_factors
    if not (tenants or namespaces):
        return weights, [False] * len(readings)
    throttled = [r.workload.tenant in tenants or r.workload.namespace in namespaces for r in readings]
    node_factor = policy.throttle_weight_factor
    for i, reading in enumerate(readings):
        if throttled[i]:
            factor = _throttle_factor(policy, reading.workload)
            if factor is not None and factor != node_factor:
                # The allocator multiplies every throttled weight by the one node-wide factor; a budget
                # with its own factor gets weight x its factor overall.
                weights[i] *= factor / node_factor
    return weights, throttled


def _columns(keys: list[str], readings: list[UsageReading], peaks: list[Prediction], policy: Policy) -> GpuColumns:
    """The allocator's view of one GPU's readings and their predictions, in key order: a list per
    attribute rather than an object per workload (every workload, every tick). The prediction is the
    peak of the policy's one horizon; PCIe is carried by the readings but not shared (see
    ``compute_grants``)."""
    entitlements = [r.entitlement for r in readings]
    weights, throttled = _weights(readings, policy)
    return GpuColumns(
        keys,
        weights,
        throttled,
        ResourceColumns(
            [r.mem_used_mb for r in readings],
            [p.mem_peak_mb for p in peaks],
            [e.guarantee_mem_mb for e in entitlements],
            [math.inf if e.limit_mem_mb is None else e.limit_mem_mb for e in entitlements],
        ),
        ResourceColumns(
            [r.sm_used for r in readings],
            [p.sm_peak for p in peaks],
            [e.guarantee_sm for e in entitlements],
            [math.inf if e.limit_sm is None else e.limit_sm for e in entitlements],
        ),
    )
