"""Properties of weighted max-min fair share and of one GPU tick (docs/design.md: Weighted fair sharing, Enforcement)."""

from __future__ import annotations

import dataclasses
import math
import random
from collections.abc import Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from allocator import (
    UNLIMITED,
    Allocation,
    AllocationPolicy,
    Claim,
    GpuCapacity,
    GpuColumns,
    GpuGrants,
    PredictedPeak,
    ResourceColumns,
    Resources,
    Shares,
    WorkloadState,
    allocate_columns,
    allocate_gpu,
    fair_share,
    workload_demand,
)

EPS = 1e-6

quantity = st.floats(min_value=0.0, max_value=200_000.0, allow_nan=False, allow_infinity=False)
weight = st.sampled_from([0.5, 1.0, 2.0, 4.0]) | st.floats(min_value=0.01, max_value=100.0)


@st.composite
def claim(draw: st.DrawFn, key: str, preemptible: bool | None = None) -> Claim:
    guarantee = draw(st.floats(min_value=0.0, max_value=30_000.0))
    limit = draw(st.one_of(st.just(math.inf), st.floats(min_value=guarantee, max_value=200_000.0)))
    return Claim(
        key=key,
        weight=draw(weight),
        demand=draw(quantity),
        guarantee=guarantee,
        limit=limit,
        current_use=draw(quantity),
        preemptible=draw(st.booleans()) if preemptible is None else preemptible,
    )


@st.composite
def problem(draw: st.DrawFn, preemptible: bool | None = None, max_claims: int = 8) -> tuple[float, list[Claim]]:
    capacity = draw(st.floats(min_value=1.0, max_value=100_000.0))
    count = draw(st.integers(min_value=0, max_value=max_claims))
    claims = [draw(claim(f"w{i}", preemptible)) for i in range(count)]
    return capacity, claims


def _floors(claims: list[Claim]) -> float:
    return math.fsum(c.current_use for c in claims if not c.preemptible)


@given(problem())
def test_grants_never_exceed_capacity_unless_memory_in_use_already_does(
    case: tuple[float, list[Claim]],
) -> None:
    capacity, claims = case
    result = fair_share(capacity=capacity, claims=claims)
    if result.overcommitted:
        assert _floors(claims) > capacity
        assert result.headroom == 0.0
    else:
        assert math.fsum(result.grants.values()) <= capacity
        assert sum(result.grants.values()) <= capacity
        assert result.headroom >= 0.0


@given(problem())
def test_every_grant_is_within_zero_and_the_clamped_demand(case: tuple[float, list[Claim]]) -> None:
    capacity, claims = case
    result = fair_share(capacity=capacity, claims=claims)
    for c in claims:
        floor = 0.0 if c.preemptible else c.current_use
        target = max(min(max(c.demand, c.guarantee), c.limit), floor)
        assert floor - EPS <= result.grants[c.key] <= target + EPS


@given(problem(preemptible=False))
def test_memory_grants_never_drop_below_current_use(case: tuple[float, list[Claim]]) -> None:
    capacity, claims = case
    result = fair_share(capacity=capacity, claims=claims)
    for c in claims:
        assert result.grants[c.key] >= c.current_use


@given(problem())
def test_guarantees_are_met_whenever_capacity_allows(case: tuple[float, list[Claim]]) -> None:
    capacity, claims = case
    needed = math.fsum(max(c.guarantee, 0.0 if c.preemptible else c.current_use) for c in claims)
    result = fair_share(capacity=capacity, claims=claims)
    if needed <= capacity * (1 - 1e-9):
        for c in claims:
            assert result.grants[c.key] >= c.guarantee - EPS * max(1.0, c.guarantee)


@given(problem())
def test_same_input_gives_the_same_grants(case: tuple[float, list[Claim]]) -> None:
    capacity, claims = case
    first = fair_share(capacity=capacity, claims=claims)
    second = fair_share(capacity=capacity, claims=list(reversed(claims)))
    assert dict(first.grants) == dict(second.grants)
    assert first.headroom == second.headroom


@given(
    capacity=st.floats(min_value=1.0, max_value=1000.0),
    weights=st.lists(st.floats(min_value=0.1, max_value=10.0), min_size=1, max_size=6),
)
def test_saturated_claims_share_in_proportion_to_their_weights(capacity: float, weights: list[float]) -> None:
    claims = [Claim(key=f"w{i}", weight=w, demand=capacity * 2) for i, w in enumerate(weights)]
    result = fair_share(capacity=capacity, claims=claims)
    per_weight = [result.grants[c.key] / c.weight for c in claims]
    assert max(per_weight) - min(per_weight) <= EPS * max(per_weight)
    assert math.isclose(math.fsum(result.grants.values()), capacity, rel_tol=1e-9)


@settings(max_examples=200)
@given(problem(preemptible=True))
def test_no_unsatisfied_claim_gets_less_per_weight_than_another_above_its_guarantee(
    case: tuple[float, list[Claim]],
) -> None:
    """Max-min fairness: an unsatisfied claim is never starved to feed a bigger share."""
    capacity, claims = case
    if math.fsum(c.guarantee for c in claims) > capacity:
        return  # guarantee contention is a different regime, covered by the guarantee test
    result = fair_share(capacity=capacity, claims=claims)
    for c in claims:
        target = min(max(c.demand, c.guarantee), c.limit)
        if result.grants[c.key] < target - EPS * max(1.0, target):
            level = (result.grants[c.key] - c.guarantee) / c.weight
            for other in claims:
                above = (result.grants[other.key] - other.guarantee) / other.weight
                assert above <= level + EPS * max(1.0, abs(level), capacity)


def test_unclaimed_capacity_is_reported_as_headroom_not_given_away() -> None:
    result = fair_share(
        capacity=108.0,
        claims=[Claim(key="a", weight=4.0, demand=10.0), Claim(key="b", weight=1.0, demand=8.0)],
    )
    assert dict(result.grants) == {"a": 10.0, "b": 8.0}
    assert result.headroom == 90.0


def test_guarantees_exceeding_capacity_are_shared_by_weight() -> None:
    result = fair_share(
        capacity=90.0,
        claims=[
            Claim(key="gold", weight=2.0, demand=0.0, guarantee=100.0),
            Claim(key="bronze", weight=1.0, demand=0.0, guarantee=100.0),
        ],
    )
    assert result.grants["gold"] == pytest.approx(60.0)
    assert result.grants["bronze"] == pytest.approx(30.0)


def test_memory_contention_settles_only_the_growth_above_current_use() -> None:
    result = fair_share(
        capacity=1000.0,
        claims=[
            Claim(key="a", weight=1.0, demand=900.0, current_use=600.0, preemptible=False),
            Claim(key="b", weight=1.0, demand=400.0, current_use=100.0, preemptible=False),
        ],
    )
    # 300 MB free: both want to grow; equal weights split the growth equally.
    assert result.grants["a"] == pytest.approx(750.0)
    assert result.grants["b"] == pytest.approx(250.0)


def test_memory_in_use_beyond_capacity_is_granted_as_is_and_flagged() -> None:
    result = fair_share(
        capacity=100.0,
        claims=[
            Claim(key="a", weight=1.0, demand=0.0, current_use=80.0, preemptible=False),
            Claim(key="b", weight=1.0, demand=50.0, current_use=40.0, preemptible=False),
            Claim(key="c", weight=1.0, demand=50.0),
        ],
    )
    assert result == Allocation(grants={"a": 80.0, "b": 40.0, "c": 0.0}, headroom=0.0, overcommitted=True)


@pytest.mark.parametrize(
    ("claims", "message"),
    [
        ([Claim(key="a", weight=0.0, demand=1.0)], "weight must be finite and > 0"),
        ([Claim(key="a", weight=1.0, demand=-1.0)], "demand must be finite and >= 0"),
        ([Claim(key="a", weight=1.0, demand=math.nan)], "demand must be finite"),
        ([Claim(key="a", weight=1.0, demand=1.0, guarantee=5.0, limit=2.0)], "limit 2.0 must be"),
        (
            [Claim(key="a", weight=1.0, demand=1.0), Claim(key="a", weight=1.0, demand=1.0)],
            "appears more than once",
        ),
    ],
)
def test_invalid_claims_are_rejected_with_a_precise_message(claims: list[Claim], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        fair_share(capacity=10.0, claims=claims)


def test_non_positive_capacity_is_rejected() -> None:
    with pytest.raises(ValueError, match="capacity must be finite and > 0"):
        fair_share(capacity=0.0, claims=[])


# ----------------------------------------------------------------------------- one GPU tick

RESOURCES = ("mem_mb", "sm", "pcie_mbps")
POLICY = AllocationPolicy()
amount = st.floats(min_value=0.0, max_value=100_000.0)


@st.composite
def resources(draw: st.DrawFn, top: float = 100_000.0) -> Resources:
    value = st.floats(min_value=0.0, max_value=top)
    return Resources(mem_mb=draw(value), sm=draw(value), pcie_mbps=draw(value))


@st.composite
def workload(draw: st.DrawFn, key: str) -> WorkloadState:
    guarantee = draw(resources(top=20_000.0))
    limit = Resources(
        **{
            name: draw(st.one_of(st.just(math.inf), st.floats(min_value=getattr(guarantee, name), max_value=150_000.0)))
            for name in RESOURCES
        }
    )
    horizons = draw(st.lists(st.sampled_from([0.5, 1.0, 2.0, 5.0]), unique=True, max_size=3))
    return WorkloadState(
        key=key,
        weight=draw(weight),
        current=draw(resources()),
        predicted=tuple(PredictedPeak(horizon_s=h, peak=draw(resources())) for h in horizons),
        guarantee=guarantee,
        limit=limit,
        throttled=draw(st.booleans()),
    )


@st.composite
def gpu_tick(draw: st.DrawFn, max_workloads: int = 10) -> tuple[GpuCapacity, list[WorkloadState], AllocationPolicy]:
    capacity = GpuCapacity(
        mem_mb=draw(st.floats(min_value=1.0, max_value=200_000.0)),
        sm=draw(st.floats(min_value=1.0, max_value=200_000.0)),
        pcie_mbps=draw(st.none() | st.floats(min_value=1.0, max_value=200_000.0)),
    )
    count = draw(st.integers(min_value=0, max_value=max_workloads))
    policy = AllocationPolicy(
        headroom=draw(st.sampled_from([0.0, 0.2, 1.0])),
        horizons_s=draw(st.sampled_from([(0.5,), (0.5, 1.0, 2.0), (2.0,)])),
        throttle_weight_factor=draw(st.sampled_from([0.25, 0.5, 1.0])),
    )
    return capacity, [draw(workload(f"ns/pod-{i}/c")) for i in range(count)], policy


def _capacity_of(capacity: GpuCapacity, name: str) -> float | None:
    return {"mem_mb": capacity.mem_mb, "sm": capacity.sm, "pcie_mbps": capacity.pcie_mbps}[name]


def _allocations(result: GpuGrants) -> dict[str, Allocation | None]:
    return {"mem_mb": result.memory, "sm": result.sm, "pcie_mbps": result.pcie}


@given(gpu_tick())
def test_a_tick_never_grants_more_than_a_gpu_has(
    case: tuple[GpuCapacity, list[WorkloadState], AllocationPolicy],
) -> None:
    capacity, workloads, policy = case
    result = allocate_gpu(capacity=capacity, workloads=workloads, policy=policy)
    for name, allocation in _allocations(result).items():
        cap = _capacity_of(capacity, name)
        if allocation is None:
            assert cap is None
            continue
        assert cap is not None
        if allocation.overcommitted:
            assert name == "mem_mb"
            assert math.fsum(w.current.mem_mb for w in workloads) > cap
        else:
            assert math.fsum(allocation.grants.values()) <= cap
            assert sum(allocation.grants.values()) <= cap
            assert 0.0 <= allocation.headroom <= cap


@given(gpu_tick())
def test_a_tick_grants_no_workload_more_than_its_demand_nor_less_memory_than_it_uses(
    case: tuple[GpuCapacity, list[WorkloadState], AllocationPolicy],
) -> None:
    capacity, workloads, policy = case
    result = allocate_gpu(capacity=capacity, workloads=workloads, policy=policy)
    for w in workloads:
        demand = workload_demand(w, policy)
        granted = result.for_workload(w.key)
        assert w.current.mem_mb <= granted.mem_mb <= demand.mem_mb
        assert 0.0 <= granted.sm <= demand.sm
        if result.pcie is not None:
            assert 0.0 <= granted.pcie_mbps <= demand.pcie_mbps


@given(gpu_tick())
def test_a_tick_meets_every_guarantee_whenever_the_gpu_can(
    case: tuple[GpuCapacity, list[WorkloadState], AllocationPolicy],
) -> None:
    capacity, workloads, policy = case
    result = allocate_gpu(capacity=capacity, workloads=workloads, policy=policy)
    for name, allocation in _allocations(result).items():
        cap = _capacity_of(capacity, name)
        if allocation is None or cap is None:
            continue
        floor = (lambda w: w.current.mem_mb) if name == "mem_mb" else (lambda w: 0.0)
        needed = math.fsum(max(getattr(w.guarantee, name), floor(w)) for w in workloads)
        if needed <= cap * (1 - 1e-9):
            for w in workloads:
                g = getattr(w.guarantee, name)
                assert allocation.grants[w.key] >= g - EPS * max(1.0, g)


@given(gpu_tick(), st.randoms(use_true_random=False))
def test_a_tick_depends_on_the_workloads_not_on_their_order(
    case: tuple[GpuCapacity, list[WorkloadState], AllocationPolicy], rng: random.Random
) -> None:
    capacity, workloads, policy = case
    shuffled = list(workloads)
    rng.shuffle(shuffled)
    assert allocate_gpu(capacity=capacity, workloads=workloads, policy=policy) == allocate_gpu(
        capacity=capacity, workloads=shuffled, policy=policy
    )


@given(
    weights=st.lists(st.floats(min_value=0.1, max_value=10.0), min_size=1, max_size=8),
    throttled=st.lists(st.booleans(), min_size=8, max_size=8),
)
def test_contended_sms_are_shared_in_proportion_to_effective_weights(
    weights: list[float], throttled: list[bool]
) -> None:
    """Throttled workloads without an SM guarantee get none; the rest split SMs by weight."""
    workloads = [
        WorkloadState(key=f"w{i}", weight=w, current=Resources(sm=500.0), throttled=throttled[i])
        for i, w in enumerate(weights)
    ]
    result = allocate_gpu(capacity=GpuCapacity(mem_mb=1.0, sm=108.0), workloads=workloads, policy=POLICY)
    bursting = [w for w in workloads if not w.throttled]
    for w in workloads:
        if w.throttled:
            assert result.sm.grants[w.key] == 0.0
    if bursting:
        per_weight = [result.sm.grants[w.key] / w.weight for w in bursting]
        assert max(per_weight) - min(per_weight) <= EPS * max(per_weight)
        assert math.fsum(result.sm.grants.values()) == pytest.approx(108.0, rel=1e-9)


def test_guarantee_contention_is_settled_by_weight_times_the_throttle_factor() -> None:
    policy = AllocationPolicy(throttle_weight_factor=0.25)
    result = allocate_gpu(
        capacity=GpuCapacity(mem_mb=1.0, sm=100.0),
        workloads=[
            WorkloadState(key="paying", weight=1.0, current=Resources(), guarantee=Resources(sm=100.0)),
            WorkloadState(
                key="over-budget", weight=1.0, current=Resources(), guarantee=Resources(sm=100.0), throttled=True
            ),
        ],
        policy=policy,
    )
    assert result.sm.grants["paying"] == pytest.approx(80.0)
    assert result.sm.grants["over-budget"] == pytest.approx(20.0)


def test_a_throttled_tenant_keeps_memory_in_use_and_its_guarantees_but_cannot_burst() -> None:
    throttled = WorkloadState(
        key="t",
        weight=4.0,
        current=Resources(mem_mb=6000.0, sm=30.0, pcie_mbps=900.0),
        predicted=(PredictedPeak(horizon_s=1.0, peak=Resources(mem_mb=9000.0, sm=60.0, pcie_mbps=2000.0)),),
        guarantee=Resources(mem_mb=4000.0, sm=10.0, pcie_mbps=500.0),
        throttled=True,
    )
    result = allocate_gpu(
        capacity=GpuCapacity(mem_mb=80_000.0, sm=108.0, pcie_mbps=16_000.0), workloads=[throttled], policy=POLICY
    )
    assert result.for_workload("t") == Resources(mem_mb=6000.0, sm=10.0, pcie_mbps=500.0)
    assert result.sm.headroom == 98.0  # the rest is shown as headroom, not given away


def test_a_predicted_peak_reserves_capacity_before_it_arrives() -> None:
    steady = WorkloadState(key="a", weight=1.0, current=Resources(mem_mb=1000.0, sm=10.0))
    rising = WorkloadState(
        key="a",
        weight=1.0,
        current=Resources(mem_mb=1000.0, sm=10.0),
        predicted=(
            PredictedPeak(horizon_s=0.5, peak=Resources(mem_mb=1500.0, sm=12.0)),
            PredictedPeak(horizon_s=2.0, peak=Resources(mem_mb=3000.0, sm=20.0)),
        ),
    )
    capacity = GpuCapacity(mem_mb=81_920.0, sm=108.0)
    now = allocate_gpu(capacity=capacity, workloads=[steady], policy=POLICY).for_workload("a")
    ahead = allocate_gpu(capacity=capacity, workloads=[rising], policy=POLICY).for_workload("a")
    assert (now.mem_mb, now.sm) == pytest.approx((1200.0, 12.0))
    assert (ahead.mem_mb, ahead.sm) == pytest.approx((3600.0, 24.0))  # max over 0.5, 1 and 2 s, x 1.2


def test_only_the_horizons_the_policy_selects_pre_reserve() -> None:
    rising = WorkloadState(
        key="a",
        weight=1.0,
        current=Resources(mem_mb=1000.0),
        predicted=(
            PredictedPeak(horizon_s=0.5, peak=Resources(mem_mb=1500.0)),
            PredictedPeak(horizon_s=2.0, peak=Resources(mem_mb=3000.0)),
        ),
    )
    policy = AllocationPolicy(headroom=0.0, horizons_s=(0.5,))
    demand = workload_demand(rising, policy)
    assert demand.mem_mb == 1500.0


def test_demand_is_clamped_between_guarantee_and_limit_but_memory_never_below_use() -> None:
    w = WorkloadState(
        key="a",
        weight=1.0,
        current=Resources(mem_mb=5000.0, sm=1.0, pcie_mbps=100.0),
        guarantee=Resources(mem_mb=0.0, sm=8.0, pcie_mbps=0.0),
        limit=Resources(mem_mb=4000.0, sm=50.0, pcie_mbps=50.0),
    )
    assert workload_demand(w, POLICY) == Resources(mem_mb=5000.0, sm=8.0, pcie_mbps=50.0)


def test_unconstrained_bandwidth_is_reported_as_no_pcie_allocation() -> None:
    result = allocate_gpu(
        capacity=GpuCapacity(mem_mb=100.0, sm=10.0),
        workloads=[WorkloadState(key="a", weight=1.0, current=Resources(pcie_mbps=50_000.0))],
        policy=POLICY,
    )
    assert result.pcie is None
    assert result.for_workload("a").pcie_mbps == math.inf


def test_pcie_bandwidth_is_shared_by_weight_when_a_capacity_is_known() -> None:
    result = allocate_gpu(
        capacity=GpuCapacity(mem_mb=100.0, sm=10.0, pcie_mbps=12_000.0),
        workloads=[
            WorkloadState(key="gold", weight=2.0, current=Resources(pcie_mbps=10_000.0)),
            WorkloadState(key="bronze", weight=1.0, current=Resources(pcie_mbps=10_000.0)),
        ],
        policy=POLICY,
    )
    assert result.pcie is not None
    assert dict(result.pcie.grants) == pytest.approx({"gold": 8000.0, "bronze": 4000.0})


def test_memory_in_use_beyond_the_card_is_granted_as_is_and_flagged() -> None:
    result = allocate_gpu(
        capacity=GpuCapacity(mem_mb=1000.0, sm=10.0),
        workloads=[
            WorkloadState(key="a", weight=1.0, current=Resources(mem_mb=700.0, sm=5.0)),
            WorkloadState(key="b", weight=1.0, current=Resources(mem_mb=600.0, sm=5.0)),
        ],
        policy=POLICY,
    )
    assert result.memory == Allocation(grants={"a": 700.0, "b": 600.0}, headroom=0.0, overcommitted=True)
    assert math.fsum(result.sm.grants.values()) <= 10.0


def test_the_worked_example_in_the_docs_holds() -> None:
    """docs/allocation.md, "A worked example": keep the two in step."""
    result = allocate_gpu(
        capacity=GpuCapacity(mem_mb=40_000.0, sm=100.0, pcie_mbps=16_000.0),
        workloads=[
            WorkloadState(
                key="a",
                weight=4.0,
                current=Resources(mem_mb=10_000.0, sm=40.0, pcie_mbps=2000.0),
                predicted=(PredictedPeak(horizon_s=2.0, peak=Resources(mem_mb=15_000.0, sm=35.0, pcie_mbps=1000.0)),),
                guarantee=Resources(sm=20.0),
            ),
            WorkloadState(key="b", weight=1.0, current=Resources(mem_mb=12_000.0, sm=50.0, pcie_mbps=5000.0)),
            WorkloadState(
                key="c",
                weight=2.0,
                current=Resources(mem_mb=8000.0, sm=30.0, pcie_mbps=1000.0),
                guarantee=Resources(mem_mb=10_000.0, sm=10.0, pcie_mbps=500.0),
                throttled=True,
            ),
        ],
        policy=AllocationPolicy(headroom=0.2, throttle_weight_factor=0.5),
    )
    assert dict(result.memory.grants) == pytest.approx({"a": 16_400.0, "b": 13_600.0, "c": 10_000.0})
    assert dict(result.sm.grants) == pytest.approx({"a": 48.0, "b": 42.0, "c": 10.0})
    assert result.pcie is not None
    assert dict(result.pcie.grants) == pytest.approx({"a": 2400.0, "b": 6000.0, "c": 500.0})
    assert (result.memory.headroom, result.sm.headroom, result.pcie.headroom) == pytest.approx((0.0, 0.0, 7100.0))


@given(gpu_tick(max_workloads=6))
def test_a_tick_shares_each_resource_as_fair_share_does_on_the_same_claims(
    case: tuple[GpuCapacity, list[WorkloadState], AllocationPolicy],
) -> None:
    """The one-resource primitive and the tick are one algorithm, not two."""
    capacity, workloads, policy = case
    result = allocate_gpu(capacity=capacity, workloads=workloads, policy=policy)
    demands = {w.key: workload_demand(w, policy) for w in workloads}
    factor = policy.throttle_weight_factor
    memory = fair_share(
        capacity=capacity.mem_mb,
        claims=[
            Claim(
                key=w.key,
                weight=w.weight * (factor if w.throttled else 1.0),
                demand=demands[w.key].mem_mb,
                guarantee=w.guarantee.mem_mb,
                limit=math.inf,
                current_use=w.current.mem_mb,
                preemptible=False,
            )
            for w in workloads
        ],
    )
    sm = fair_share(
        capacity=capacity.sm,
        claims=[
            Claim(
                key=w.key,
                weight=w.weight * (factor if w.throttled else 1.0),
                demand=demands[w.key].sm,
                guarantee=min(w.guarantee.sm, demands[w.key].sm),
            )
            for w in workloads
        ],
    )
    assert result.memory == memory
    assert result.sm == sm


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: GpuCapacity(mem_mb=0.0, sm=1.0), "capacity mem_mb must be finite and > 0, got 0.0"),
        (lambda: GpuCapacity(mem_mb=1.0, sm=math.inf), "capacity sm must be finite and > 0, got inf"),
        (lambda: GpuCapacity(mem_mb=1.0, sm=1.0, pcie_mbps=-5.0), "capacity pcie_mbps must be finite and > 0"),
        (lambda: WorkloadState(key="", weight=1.0, current=Resources()), "workload key must not be empty"),
        (
            lambda: WorkloadState(key="a", weight=-1.0, current=Resources()),
            "workload 'a': weight must be finite and > 0, got -1.0",
        ),
        (
            lambda: WorkloadState(key="a", weight=1.0, current=Resources(sm=math.nan)),
            "workload 'a': current.sm must be finite and >= 0, got nan",
        ),
        (
            lambda: WorkloadState(key="a", weight=1.0, current=Resources(), guarantee=Resources(pcie_mbps=-1.0)),
            "workload 'a': guarantee.pcie_mbps must be finite and >= 0",
        ),
        (
            lambda: WorkloadState(
                key="a",
                weight=1.0,
                current=Resources(),
                guarantee=Resources(mem_mb=10.0),
                limit=dataclasses.replace(UNLIMITED, mem_mb=5.0),
            ),
            "workload 'a': limit.mem_mb 5.0 must be >= guarantee.mem_mb 10.0",
        ),
        (
            lambda: WorkloadState(
                key="a", weight=1.0, current=Resources(), predicted=(PredictedPeak(horizon_s=0.0, peak=Resources()),)
            ),
            "workload 'a': prediction horizon_s must be finite and > 0, got 0.0",
        ),
        (
            lambda: WorkloadState(
                key="a",
                weight=1.0,
                current=Resources(),
                predicted=(
                    PredictedPeak(horizon_s=1.0, peak=Resources()),
                    PredictedPeak(horizon_s=1.0, peak=Resources()),
                ),
            ),
            "workload 'a': more than one prediction for horizon 1.0 s",
        ),
        (
            lambda: WorkloadState(
                key="a",
                weight=1.0,
                current=Resources(),
                predicted=(PredictedPeak(horizon_s=1.0, peak=Resources(mem_mb=-2.0)),),
            ),
            r"workload 'a': predicted peak at 1.0 s.mem_mb must be finite and >= 0",
        ),
        (lambda: AllocationPolicy(headroom=-0.1), "headroom must be finite and >= 0, got -0.1"),
        (lambda: AllocationPolicy(horizons_s=()), "horizons_s must select at least one horizon"),
        (lambda: AllocationPolicy(horizons_s=(1.0, math.inf)), "horizons_s must be finite and > 0, got inf"),
        (lambda: AllocationPolicy(throttle_weight_factor=0.0), r"throttle_weight_factor must be in \(0, 1\], got 0.0"),
        (lambda: AllocationPolicy(throttle_weight_factor=1.5), r"throttle_weight_factor must be in \(0, 1\], got 1.5"),
    ],
)
def test_invalid_tick_inputs_are_rejected_with_a_precise_message(make: Callable[[], object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        make()


def test_a_workload_key_twice_on_one_gpu_is_rejected() -> None:
    w = WorkloadState(key="ns/p/c", weight=1.0, current=Resources())
    with pytest.raises(ValueError, match="workload key 'ns/p/c' appears more than once"):
        allocate_gpu(capacity=GpuCapacity(mem_mb=1.0, sm=1.0), workloads=[w, w], policy=POLICY)


def test_an_idle_gpu_is_all_headroom() -> None:
    result = allocate_gpu(
        capacity=GpuCapacity(mem_mb=81_920.0, sm=108.0, pcie_mbps=25_000.0), workloads=[], policy=POLICY
    )
    assert (result.memory.headroom, result.sm.headroom) == (81_920.0, 108.0)
    assert result.pcie is not None
    assert result.pcie.headroom == 25_000.0


def _columns(workloads: list[WorkloadState], policy: AllocationPolicy) -> GpuColumns:
    """The workloads as a caller builds the columns: key order, each peak the largest selected prediction."""
    ordered = sorted(workloads, key=lambda w: w.key)

    def resource(name: str) -> ResourceColumns:
        used = [getattr(w.current, name) for w in ordered]
        peaks = [
            max([u] + [getattr(p.peak, name) for p in w.predicted if p.horizon_s in policy.horizons_s])
            for u, w in zip(used, ordered, strict=True)
        ]
        return ResourceColumns(
            used, peaks, [getattr(w.guarantee, name) for w in ordered], [getattr(w.limit, name) for w in ordered]
        )

    return GpuColumns(
        keys=[w.key for w in ordered],
        weights=[w.weight for w in ordered],
        throttled=[w.throttled for w in ordered],
        memory=resource("mem_mb"),
        sm=resource("sm"),
        pcie=resource("pcie_mbps"),
    )


def _bits(shares: Shares, keys: list[str]) -> tuple[object, ...]:
    return tuple(zip(keys, map(float.hex, shares.grants), strict=True)), shares.headroom.hex(), shares.overcommitted


def _bits_of(allocation: Allocation, keys: list[str]) -> tuple[object, ...]:
    grants = [allocation.grants[k] for k in keys]
    return tuple(zip(keys, map(float.hex, grants), strict=True)), allocation.headroom.hex(), allocation.overcommitted


@settings(max_examples=40)  # the decision is shared; this holds the columns' meaning (order, peaks), bit for bit
@given(gpu_tick(max_workloads=8), st.randoms(use_true_random=False))
def test_the_columnar_entry_grants_what_allocate_gpu_does_to_the_bit(
    case: tuple[GpuCapacity, list[WorkloadState], AllocationPolicy], rnd: random.Random
) -> None:
    capacity, workloads, policy = case
    shuffled = list(workloads)
    rnd.shuffle(shuffled)
    columns = _columns(workloads, policy)
    keys = list(columns.keys)
    by_states = allocate_gpu(capacity=capacity, workloads=shuffled, policy=policy)
    by_columns = allocate_columns(capacity=capacity, columns=columns, policy=policy)
    assert _bits(by_columns.memory, keys) == _bits_of(by_states.memory, keys)
    assert _bits(by_columns.sm, keys) == _bits_of(by_states.sm, keys)
    if by_states.pcie is None:
        assert by_columns.pcie is None
    else:
        assert by_columns.pcie is not None
        assert _bits(by_columns.pcie, keys) == _bits_of(by_states.pcie, keys)


_TWO = ResourceColumns(used=[1.0, 2.0], peak=[1.0, 3.0], guarantee=[0.0, 1.0], limit=[math.inf, 4.0])
TWO_ROWS = GpuColumns(keys=["a", "b"], weights=[1.0, 2.0], throttled=[False, True], memory=_TWO, sm=_TWO)


def _with(memory: dict[str, list[float]] | None = None, sm: dict[str, list[float]] | None = None, **top: object) -> GpuColumns:
    """``TWO_ROWS`` (two valid workloads) with some columns replaced."""
    return dataclasses.replace(
        TWO_ROWS,
        memory=dataclasses.replace(_TWO, **(memory or {})),
        sm=dataclasses.replace(_TWO, **(sm or {})),
        **top,  # type: ignore[arg-type]
    )


@pytest.mark.parametrize(
    ("columns", "message"),
    [
        (_with(sm={"used": [1.0, math.nan]}), "workload 'b': current.sm must be finite and >= 0, got nan"),
        (_with(memory={"peak": [-1.0, 3.0]}), r"workload 'a': predicted peak at 2.0 s.mem_mb must be finite and >= 0"),
        (_with(sm={"limit": [math.inf, 0.5]}), "workload 'b': limit.sm 0.5 must be >= guarantee.sm 1.0"),
        (_with(weights=[1.0, math.inf]), "workload 'b': weight must be finite and > 0, got inf"),
        (_with(keys=["", "b"]), "workload key must not be empty"),
        (_with(keys=["b", "a"]), "keys must be in order: 'b' before 'a'"),
        (_with(keys=["a", "a"]), "workload key 'a' appears more than once"),
        (_with(throttled=[False]), r"every column must have one entry per workload, got lengths \[1, 2\]"),
    ],
)
def test_bad_columns_are_rejected_as_the_workload_state_of_their_row_would_be(columns: GpuColumns, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        allocate_columns(capacity=GpuCapacity(mem_mb=10.0, sm=10.0), columns=columns, policy=AllocationPolicy(horizons_s=(2.0,)))


def test_a_pcie_capacity_needs_pcie_columns() -> None:
    with pytest.raises(ValueError, match="a PCIe capacity needs the workloads' PCIe columns"):
        allocate_columns(
            capacity=GpuCapacity(mem_mb=10.0, sm=10.0, pcie_mbps=10.0), columns=TWO_ROWS, policy=AllocationPolicy()
        )
