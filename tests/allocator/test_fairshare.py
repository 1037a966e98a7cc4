"""Properties of weighted max-min fair share (DESIGN §5)."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from allocator import Allocation, Claim, fair_share

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
