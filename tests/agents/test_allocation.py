"""One allocation round: SLA weights, memory floors, capacity."""

from __future__ import annotations

import math
from datetime import UTC, datetime

import pytest

from agents.allocation import CurrentUsePredictor, Policy, compute_grants
from agents.interfaces import Entitlement, GpuInfo, UsageReading, Workload

NOW = datetime(2026, 11, 30, 3, 0, 0, tzinfo=UTC)
GPU = GpuInfo(uuid="GPU-a", model="NVIDIA A100-SXM4-80GB", memory_mb=81920, sm_count=108)


def reading(pod: str, tier: str, *, mem: float, sm: float, entitlement: Entitlement | None = None) -> UsageReading:
    return UsageReading(
        workload=Workload(tenant="t", namespace="ns", pod=pod, container="c", pod_uid=pod, sla_tier=tier),
        gpu=GPU.uuid,
        mem_used_mb=mem,
        sm_used=sm,
        pcie_mb_per_s=0.0,
        entitlement=entitlement or Entitlement(),
    )


def grants_of(readings: list[UsageReading], policy: Policy | None = None) -> dict[str, tuple[float, float]]:
    result = compute_grants(
        gpus=[GPU], readings=readings, policy=policy or Policy(), predictor=CurrentUsePredictor(), now=NOW
    )
    return {g.workload.pod: (g.mem_mb, g.sm) for g in result.grants}


def test_uncontended_workloads_get_their_use_plus_twenty_percent_headroom() -> None:
    grants = grants_of([reading("bert", "gold", mem=400, sm=8)])
    assert grants["bert"] == pytest.approx((480.0, 9.6))


def test_contended_sms_are_shared_by_sla_weight() -> None:
    grants = grants_of([reading("gold", "gold", mem=1000, sm=100), reading("bronze", "bronze", mem=1000, sm=100)])
    assert grants["gold"][1] == pytest.approx(4 * grants["bronze"][1])
    assert grants["gold"][1] + grants["bronze"][1] == pytest.approx(108.0)


def test_a_workload_weight_overrides_its_tier() -> None:
    grants = grants_of(
        [
            reading("a", "bronze", mem=1, sm=100, entitlement=Entitlement(weight=3.0)),
            reading("b", "bronze", mem=1, sm=100),
        ]
    )
    assert grants["a"][1] == pytest.approx(3 * grants["b"][1])


def test_policy_weights_replace_the_defaults() -> None:
    policy = Policy(sla_weights={"gold": 1.0, "bronze": 1.0})
    grants = grants_of([reading("gold", "gold", mem=1, sm=100), reading("bronze", "bronze", mem=1, sm=100)], policy)
    assert grants["gold"][1] == pytest.approx(grants["bronze"][1])


def test_memory_is_never_granted_below_use_and_never_above_the_card() -> None:
    readings = [reading(f"p{i}", "silver", mem=20_000, sm=1) for i in range(4)]
    grants = grants_of(readings)
    assert all(mem >= 20_000 for mem, _ in grants.values())
    assert math.fsum(mem for mem, _ in grants.values()) <= GPU.memory_mb


def test_memory_guarantee_is_granted_even_when_use_is_lower() -> None:
    grants = grants_of([reading("llm", "gold", mem=300, sm=1, entitlement=Entitlement(guarantee_mem_mb=4096))])
    assert grants["llm"][0] == 4096.0


def test_unknown_sla_tier_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="unknown SLA tier 'platinum'"):
        grants_of([reading("x", "platinum", mem=1, sm=1)])


def test_policy_rejects_non_positive_weights() -> None:
    with pytest.raises(ValueError, match="SLA tier 'gold': weight must be finite and > 0"):
        Policy(sla_weights={"gold": 0.0})
