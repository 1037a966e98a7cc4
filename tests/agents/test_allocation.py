"""One allocation round: SLA weights, memory floors, capacity, budget throttling, prediction."""

from __future__ import annotations

import math
from dataclasses import replace
from datetime import UTC, datetime

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agents.allocation import PREDICTION_HORIZON_S, CurrentUsePredictor, Policy, compute_grants
from agents.interfaces import Entitlement, GpuInfo, Prediction, UsageReading, Workload
from allocator import GpuCapacity, PredictedPeak, Resources, WorkloadState, allocate_gpu

NOW = datetime(2026, 11, 30, 3, 0, 0, tzinfo=UTC)
GPU = GpuInfo(uuid="GPU-a", model="NVIDIA A100-SXM4-80GB", memory_mb=81920, sm_count=108)


def reading(
    pod: str,
    tier: str,
    *,
    mem: float,
    sm: float,
    entitlement: Entitlement | None = None,
    tenant: str = "t",
    pcie: float = 0.0,
) -> UsageReading:
    return UsageReading(
        workload=Workload(tenant=tenant, namespace="ns", pod=pod, container="c", pod_uid=pod, sla_tier=tier),
        gpu=GPU.uuid,
        mem_used_mb=mem,
        sm_used=sm,
        pcie_mb_per_s=pcie,
        entitlement=entitlement or Entitlement(),
    )


def grants_of(readings: list[UsageReading], policy: Policy | None = None) -> dict[str, tuple[float, float]]:
    result = compute_grants(
        gpus=[GPU], readings=readings, policy=policy or Policy(headroom=0.2), predictor=CurrentUsePredictor(), now=NOW
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


class _ShortPredictor:
    """A batch predictor that drops a reading: the round must refuse, not grant the rest."""

    def predict(self, *, reading: UsageReading, now: datetime) -> Prediction:
        return Prediction(mem_peak_mb=reading.mem_used_mb, sm_peak=reading.sm_used)

    def predict_many(self, *, readings: list[UsageReading], now: datetime) -> list[Prediction]:
        return [self.predict(reading=r, now=now) for r in readings[1:]]


def test_a_predictor_that_answers_for_fewer_readings_is_refused() -> None:
    readings = [reading("x", "gold", mem=1, sm=1), reading("y", "gold", mem=1, sm=1)]
    with pytest.raises(ValueError, match="the predictor gave 1 predictions for 2 readings"):
        compute_grants(gpus=[GPU], readings=readings, policy=Policy(), predictor=_ShortPredictor(), now=NOW)


def test_a_reading_of_a_gpu_the_node_does_not_have_is_refused() -> None:
    stray = replace(reading("x", "gold", mem=1, sm=1), gpu="GPU-elsewhere")
    with pytest.raises(ValueError, match="reading for unknown GPU 'GPU-elsewhere'"):
        grants_of([stray])


def test_policy_rejects_non_positive_weights() -> None:
    with pytest.raises(ValueError, match="SLA tier 'gold': weight must be finite and > 0"):
        Policy(sla_weights={"gold": 0.0})


def test_policy_rejects_a_throttle_factor_outside_zero_to_one() -> None:
    with pytest.raises(ValueError, match=r"throttle_weight_factor must be in \(0, 1\], got 2.0"):
        Policy(throttle_weight_factor=2.0)


def test_policy_rejects_negative_headroom() -> None:
    with pytest.raises(ValueError, match=r"headroom must be finite and >= 0, got -0\.5"):
        Policy(headroom=-0.5)


def test_a_throttled_tenant_gets_its_guarantee_and_memory_in_use_but_no_burst() -> None:
    policy = Policy(throttled_tenants=frozenset({"over-budget"}), headroom=0.2)
    grants = grants_of(
        [
            reading(
                "spender", "gold", mem=10_000, sm=50, tenant="over-budget", entitlement=Entitlement(guarantee_sm=8)
            ),
            reading("payer", "bronze", mem=10_000, sm=50, tenant="paying"),
        ],
        policy,
    )
    assert grants["spender"] == pytest.approx((10_000.0, 8.0))
    assert grants["payer"] == pytest.approx((12_000.0, 60.0))


def test_a_throttled_tenant_loses_weight_when_guarantees_contend() -> None:
    policy = Policy(throttled_tenants=frozenset({"over-budget"}), throttle_weight_factor=0.25)
    full = Entitlement(guarantee_sm=108)
    grants = grants_of(
        [
            reading("spender", "bronze", mem=1, sm=1, tenant="over-budget", entitlement=full),
            reading("payer", "bronze", mem=1, sm=1, tenant="paying", entitlement=full),
        ],
        policy,
    )
    assert grants["payer"][1] == pytest.approx(4 * grants["spender"][1])
    assert grants["payer"][1] + grants["spender"][1] == pytest.approx(108.0)


class RisingPredictor:
    """Expects every workload to double its use within the look-ahead."""

    def predict(self, *, reading: UsageReading, now: datetime) -> Prediction:
        return Prediction(mem_peak_mb=reading.mem_used_mb * 2, sm_peak=reading.sm_used * 2)


def test_a_predicted_peak_is_granted_before_it_arrives() -> None:
    result = compute_grants(
        gpus=[GPU],
        readings=[reading("llm", "gold", mem=1000, sm=10)],
        policy=Policy(headroom=0.2),
        predictor=RisingPredictor(),
        now=NOW,
    )
    assert (result.grants[0].mem_mb, result.grants[0].sm) == pytest.approx((2400.0, 24.0))


def test_pcie_traffic_does_not_limit_grants_while_bandwidth_is_unconstrained() -> None:
    grants = grants_of([reading("copy-heavy", "bronze", mem=100, sm=2, pcie=1_000_000.0)])
    assert grants["copy-heavy"] == pytest.approx((120.0, 2.4))


def test_grants_on_each_gpu_stay_within_its_capacity_and_headroom_is_the_rest() -> None:
    readings = [reading(f"p{i}", tier, mem=8000 + 300 * i, sm=20 + i) for i, tier in enumerate(["gold", "silver"] * 4)]
    result = compute_grants(gpus=[GPU], readings=readings, policy=Policy(headroom=0.2), predictor=CurrentUsePredictor(), now=NOW)
    mem = math.fsum(g.mem_mb for g in result.grants)
    sm = math.fsum(g.sm for g in result.grants)
    assert mem <= GPU.memory_mb
    assert sm <= GPU.sm_count
    assert mem + result.mem_headroom_mb[GPU.uuid] == pytest.approx(GPU.memory_mb)
    assert sm + result.sm_headroom[GPU.uuid] == pytest.approx(GPU.sm_count)


def test_a_throttled_namespace_loses_weight_and_under_a_throttled_tenant_too_the_smaller_factor_wins() -> None:
    full = Entitlement(guarantee_sm=108)

    def spender_share(policy: Policy) -> float:
        spender = reading("spender", "bronze", mem=1, sm=1, tenant="acme", entitlement=full)
        spender = UsageReading(workload=Workload(tenant="acme", namespace="acme-prod", pod="spender", container="c",
                                                 pod_uid="spender", sla_tier="bronze"),
                               gpu=spender.gpu, mem_used_mb=1, sm_used=1, pcie_mb_per_s=0.0, entitlement=full)
        grants = grants_of([spender, reading("payer", "bronze", mem=1, sm=1, tenant="paying", entitlement=full)],
                           policy)
        return grants["spender"][1] / grants["payer"][1]

    assert spender_share(Policy()) == pytest.approx(1.0)
    assert spender_share(Policy(namespace_throttle_factors={"acme-prod": 0.25})) == pytest.approx(0.25)
    assert spender_share(Policy(namespace_throttle_factors={"other": 0.25})) == pytest.approx(1.0)
    both = Policy(throttled_tenants=frozenset({"acme"}), tenant_throttle_factors={"acme": 0.5},
                  namespace_throttle_factors={"acme-prod": 0.2})
    assert spender_share(both) == pytest.approx(0.2)
    with pytest.raises(ValueError, match="namespace 'acme-prod': throttle factor"):
        Policy(namespace_throttle_factors={"acme-prod": 1.5})


class _Peaks:
    """Serves each reading's drawn peak."""

    def __init__(self, peaks: dict[tuple[str, str], Prediction]) -> None:
        self.peaks = peaks

    def predict(self, *, reading: UsageReading, now: datetime) -> Prediction:
        return self.peaks[(reading.workload.key, reading.gpu)]


def _as_state(r: UsageReading, peak: Prediction, policy: Policy) -> WorkloadState:
    """A reading as the allocator's WorkloadState, as docs/allocation.md describes the agent's mapping."""
    e, w = r.entitlement, r.workload
    factors = [policy.tenant_throttle_factors.get(w.tenant, policy.throttle_weight_factor)] * (
        w.tenant in policy.throttled_tenants
    ) + ([policy.namespace_throttle_factors[w.namespace]] if w.namespace in policy.namespace_throttle_factors else [])
    weight = e.weight if e.weight is not None else policy.weight_for(w.sla_tier)
    if factors:
        weight *= min(factors) / policy.throttle_weight_factor
    return WorkloadState(
        key=w.key,
        weight=weight,
        current=Resources(r.mem_used_mb, r.sm_used, r.pcie_mb_per_s),
        predicted=(PredictedPeak(PREDICTION_HORIZON_S, Resources(peak.mem_peak_mb, peak.sm_peak, 0.0)),),
        guarantee=Resources(e.guarantee_mem_mb, e.guarantee_sm, 0.0),
        limit=Resources(
            math.inf if e.limit_mem_mb is None else e.limit_mem_mb, math.inf if e.limit_sm is None else e.limit_sm, math.inf
        ),
        throttled=bool(factors),
    )


@st.composite
def _round(draw: st.DrawFn) -> tuple[list[UsageReading], dict[tuple[str, str], Prediction], Policy]:
    gpus = (GPU, GPU_SMALL)
    amount = st.floats(min_value=0.0, max_value=50_000.0)
    readings, peaks = [], {}
    for k in draw(st.permutations(range(draw(st.integers(min_value=0, max_value=10))))):
        gpu = gpus[draw(st.integers(0, 1))]
        guarantee_mem, guarantee_sm = draw(amount), draw(st.floats(0.0, 60.0))
        entitlement = Entitlement(
            guarantee_mem_mb=guarantee_mem,
            limit_mem_mb=draw(st.none() | st.floats(guarantee_mem, 90_000.0)),
            guarantee_sm=guarantee_sm,
            limit_sm=draw(st.none() | st.floats(guarantee_sm, 120.0)),
            weight=draw(st.none() | st.floats(0.1, 8.0)),
        )
        workload = Workload(
            tenant=draw(st.sampled_from(["t1", "t2", "t3"])), namespace=draw(st.sampled_from(["a", "b"])),
            pod=f"p{k}", container="c", pod_uid=f"u{k}", sla_tier=draw(st.sampled_from(["gold", "bronze"])),
        )
        readings.append(UsageReading(workload, gpu.uuid, draw(amount), draw(st.floats(0.0, 120.0)), draw(amount), entitlement))
        peaks[(workload.key, gpu.uuid)] = Prediction(draw(amount), draw(st.floats(0.0, 150.0)))
    policy = Policy(
        headroom=draw(st.sampled_from([0.0, 0.2])),
        throttled_tenants=frozenset(draw(st.sets(st.sampled_from(["t1", "t2"])))),
        tenant_throttle_factors={"t1": 0.3},
        namespace_throttle_factors=draw(st.sampled_from([{}, {"b": 0.4}])),
    )
    return readings, peaks, policy


GPU_SMALL = GpuInfo(uuid="GPU-b", model="half an A100", memory_mb=40960, sm_count=54)


@settings(max_examples=25)
@given(_round())
def test_a_round_grants_what_the_allocator_grants_the_readings_as_workload_states_to_the_bit(
    case: tuple[list[UsageReading], dict[tuple[str, str], Prediction], Policy],
) -> None:
    """The agent hands the allocator columns, not objects: the same grants, in the readings' order."""
    readings, peaks, policy = case
    result = compute_grants(gpus=[GPU, GPU_SMALL], readings=readings, policy=policy, predictor=_Peaks(peaks), now=NOW)
    expected = []
    for gpu in (GPU, GPU_SMALL):
        on_gpu = [r for r in readings if r.gpu == gpu.uuid]
        states = [_as_state(r, peaks[(r.workload.key, r.gpu)], policy) for r in on_gpu]
        bare = allocate_gpu(
            capacity=GpuCapacity(mem_mb=float(gpu.memory_mb), sm=float(gpu.sm_count)),
            workloads=states,
            policy=policy.allocation_policy(),
        )
        expected += [(r.workload, gpu.uuid, bare.memory.grants[r.workload.key].hex(), bare.sm.grants[r.workload.key].hex())
                     for r in on_gpu]
        assert result.mem_headroom_mb[gpu.uuid] == bare.memory.headroom
        assert result.sm_headroom[gpu.uuid] == bare.sm.headroom
    assert [(g.workload, g.gpu, g.mem_mb.hex(), g.sm.hex()) for g in result.grants] == expected


def test_a_workloads_key_is_set_once_and_follows_a_replaced_identity() -> None:
    """``Workload.key`` is a field set at construction (read per reading every tick): it must
    follow ``dataclasses.replace`` and take no part in equality, hashing or ``repr``."""
    w = Workload(tenant="t", namespace="ns", pod="p", container="c", pod_uid="u", sla_tier="gold")
    assert w.key == "ns/p/c"
    moved = replace(w, pod="q")
    assert moved.key == "ns/q/c"
    assert replace(moved, pod="p") == w
    assert hash(replace(moved, pod="p")) == hash(w)
    assert "key" not in repr(w)
    with pytest.raises(ValueError, match="init=False"):
        replace(w, key="other")  # derived from the identity, never given
