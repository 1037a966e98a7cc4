"""One allocation round on a node: readings -> fair-share grants per GPU (DESIGN §5)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from types import MappingProxyType

from agents.interfaces import GpuInfo, Grant, Prediction, Predictor, UsageReading
from allocator import Claim, fair_share

__all__ = [
    "DEFAULT_SLA_WEIGHTS",
    "AllocationRound",
    "CurrentUsePredictor",
    "Policy",
    "compute_grants",
]

DEFAULT_SLA_WEIGHTS: Mapping[str, float] = MappingProxyType(
    {"gold": 4.0, "silver": 2.0, "bronze": 1.0, "best-effort": 0.5}
)


@dataclass(frozen=True, slots=True)
class Policy:
    """Node allocation policy; the service's policy API will supply it per node."""

    sla_weights: Mapping[str, float] = field(default_factory=lambda: DEFAULT_SLA_WEIGHTS)
    headroom: float = 0.2  # demand = predicted peak x (1 + headroom)

    def __post_init__(self) -> None:
        if not math.isfinite(self.headroom) or self.headroom < 0:
            raise ValueError(f"headroom must be finite and >= 0, got {self.headroom!r}")
        for tier, weight in self.sla_weights.items():
            if not math.isfinite(weight) or weight <= 0:
                raise ValueError(f"SLA tier {tier!r}: weight must be finite and > 0, got {weight!r}")

    def weight_for(self, tier: str) -> float:
        try:
            return self.sla_weights[tier]
        except KeyError:
            known = ", ".join(sorted(self.sla_weights))
            raise ValueError(f"unknown SLA tier {tier!r} (known: {known})") from None


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
    """Fair-share memory (non-preemptible) and SMs (preemptible) on every GPU."""
    by_gpu: dict[str, list[UsageReading]] = {g.uuid: [] for g in gpus}
    for reading in readings:
        if reading.gpu not in by_gpu:
            raise ValueError(f"reading for unknown GPU {reading.gpu!r} ({reading.workload.key})")
        by_gpu[reading.gpu].append(reading)

    grants: list[Grant] = []
    mem_headroom: dict[str, float] = {}
    sm_headroom: dict[str, float] = {}
    overcommitted: list[str] = []
    grow = 1.0 + policy.headroom
    for gpu in gpus:
        on_gpu = by_gpu[gpu.uuid]
        mem_claims: list[Claim] = []
        sm_claims: list[Claim] = []
        for r in on_gpu:
            e = r.entitlement
            weight = e.weight if e.weight is not None else policy.weight_for(r.workload.sla_tier)
            peak = predictor.predict(reading=r, now=now)
            mem_claims.append(
                Claim(
                    key=r.workload.key,
                    weight=weight,
                    demand=max(r.mem_used_mb, peak.mem_peak_mb) * grow,
                    guarantee=e.guarantee_mem_mb,
                    limit=e.limit_mem_mb if e.limit_mem_mb is not None else math.inf,
                    current_use=r.mem_used_mb,
                    preemptible=False,
                )
            )
            sm_claims.append(
                Claim(
                    key=r.workload.key,
                    weight=weight,
                    demand=max(r.sm_used, peak.sm_peak) * grow,
                    guarantee=e.guarantee_sm,
                    limit=e.limit_sm if e.limit_sm is not None else math.inf,
                    current_use=r.sm_used,
                    preemptible=True,
                )
            )
        mem = fair_share(capacity=float(gpu.memory_mb), claims=mem_claims)
        sm = fair_share(capacity=float(gpu.sm_count), claims=sm_claims)
        mem_headroom[gpu.uuid] = mem.headroom
        sm_headroom[gpu.uuid] = sm.headroom
        if mem.overcommitted:
            overcommitted.append(gpu.uuid)
        grants.extend(
            Grant(
                workload=r.workload,
                gpu=gpu.uuid,
                mem_mb=mem.grants[r.workload.key],
                sm=sm.grants[r.workload.key],
            )
            for r in on_gpu
        )
    return AllocationRound(
        grants=tuple(grants),
        mem_headroom_mb=MappingProxyType(mem_headroom),
        sm_headroom=MappingProxyType(sm_headroom),
        mem_overcommitted=tuple(overcommitted),
    )
