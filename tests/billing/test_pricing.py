"""Pricing (docs/billing.md): the reconciliation invariant and the whole-card rule, as properties."""

from __future__ import annotations

from decimal import ROUND_FLOOR, ROUND_HALF_EVEN, Decimal, localcontext

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from billing import money
from billing.ledger.pricing import GpuWindowUsage, Rate, WorkloadQuantities, price_gpu_window
from billing.money import allocate, to_minor_units

MEM, SM = 81920, 108

quantity = st.decimals(min_value=0, max_value=10**7, places=3, allow_nan=False, allow_infinity=False)


@st.composite
def windows(draw):
    seconds = draw(st.decimals(min_value=0, max_value=3600, places=3))
    n = draw(st.integers(min_value=0, max_value=8))
    workloads = []
    for _ in range(n):
        cap_mem, cap_sm = MEM * seconds, SM * seconds
        mu = draw(st.decimals(min_value=0, max_value=cap_mem, places=3))
        mg = draw(st.decimals(min_value=0, max_value=cap_mem, places=3))
        su = draw(st.decimals(min_value=0, max_value=cap_sm, places=3))
        sg = draw(st.decimals(min_value=0, max_value=cap_sm, places=3))
        workloads.append(WorkloadQuantities(mem_used_mb_s=mu, mem_granted_mb_s=mg, mem_max_mb_s=max(mu, mg),
                                            sm_used_s=su, sm_granted_s=sg, sm_max_s=max(su, sg)))
    return GpuWindowUsage(memory_mb=MEM, sm_count=SM, metered_seconds=seconds, workloads=workloads)


rates = st.builds(
    Rate,
    price_per_gpu_hour=st.decimals(min_value=0, max_value=100, places=6),
    alpha=st.decimals(min_value=0, max_value=1, places=3),
    billed_basis=st.sampled_from(["max", "granted", "used"]),
    idle_policy=st.sampled_from(["platform", "proportional"]),
)


@settings(max_examples=400, deadline=None)
@given(window=windows(), rate=rates)
def test_charges_plus_idle_equal_the_whole_card_exactly_and_nothing_is_negative(window, rate):
    priced = price_gpu_window(window=window, rate=rate)
    assert priced.charged + priced.idle_cost == priced.card_cost
    assert priced.idle_cost >= 0
    assert all(c >= 0 for c in priced.charges)
    assert priced.idle_allocated <= priced.idle_cost
    if rate.idle_policy == "platform":
        assert priced.idle_allocated == 0


@settings(max_examples=200, deadline=None)
@given(seconds=st.integers(min_value=1, max_value=3600), price=st.decimals(min_value=0, max_value=100, places=6),
       alpha=st.decimals(min_value=0, max_value=1, places=3))
def test_a_workload_holding_the_whole_card_pays_exactly_p_times_seconds(seconds, price, alpha):
    s = Decimal(seconds)
    whole = WorkloadQuantities(mem_used_mb_s=MEM * s, mem_granted_mb_s=MEM * s, mem_max_mb_s=MEM * s,
                               sm_used_s=SM * s, sm_granted_s=SM * s, sm_max_s=SM * s)
    priced = price_gpu_window(window=GpuWindowUsage(MEM, SM, s, [whole]), rate=Rate(price, alpha=alpha))
    assert priced.charges == (priced.card_cost,)
    assert priced.idle_cost == 0


def test_overcommitted_max_basis_is_scaled_pro_rata_so_nothing_is_billed_twice():
    # Two workloads each billed at 75 % of the card for 60 s: 150 % > 100 %.
    s = Decimal(60)
    w = WorkloadQuantities(mem_used_mb_s=MEM * s * Decimal("0.75"), mem_granted_mb_s=Decimal(0),
                           mem_max_mb_s=MEM * s * Decimal("0.75"), sm_used_s=Decimal(0),
                           sm_granted_s=SM * s * Decimal("0.75"), sm_max_s=SM * s * Decimal("0.75"))
    priced = price_gpu_window(window=GpuWindowUsage(MEM, SM, s, [w, w]), rate=Rate(Decimal("3.6")))
    assert priced.card_cost == Decimal("0.060000000000")
    assert priced.charges == (Decimal("0.030000000000"), Decimal("0.030000000000"))
    assert priced.idle_cost == 0


def test_alpha_weighs_memory_against_sm():
    s = Decimal(3600)
    half_memory_only = WorkloadQuantities(mem_used_mb_s=MEM * s / 2, mem_granted_mb_s=MEM * s / 2,
                                          mem_max_mb_s=MEM * s / 2, sm_used_s=Decimal(0), sm_granted_s=Decimal(0),
                                          sm_max_s=Decimal(0))
    priced = price_gpu_window(window=GpuWindowUsage(MEM, SM, s, [half_memory_only]),
                              rate=Rate(Decimal("4"), alpha=Decimal("0.5")))
    # α·(½) + (1−α)·0 = ¼ of the card for the hour.
    assert priced.charges == (Decimal("1.000000000000"),)
    assert priced.idle_cost == Decimal("3.000000000000")


def test_proportional_idle_is_spread_by_charge():
    s = Decimal(100)
    small = WorkloadQuantities(Decimal(0), Decimal(0), Decimal(0), SM * s / 10, SM * s / 10, SM * s / 10)
    large = WorkloadQuantities(Decimal(0), Decimal(0), Decimal(0), SM * s * 3 / 10, SM * s * 3 / 10, SM * s * 3 / 10)
    priced = price_gpu_window(window=GpuWindowUsage(MEM, SM, s, [small, large]),
                              rate=Rate(Decimal("36"), alpha=Decimal(0), idle_policy="proportional"))
    assert priced.idle_shares[1] == 3 * priced.idle_shares[0]
    assert priced.idle_allocated == priced.idle_cost


@pytest.mark.parametrize(("basis", "expected"), [("used", "0.5"), ("granted", "1.0"), ("max", "1.0")])
def test_billed_basis_picks_used_granted_or_max(basis, expected):
    s = Decimal(3600)
    w = WorkloadQuantities(Decimal(0), Decimal(0), Decimal(0), SM * s / 4, SM * s / 2, SM * s / 2)
    priced = price_gpu_window(window=GpuWindowUsage(MEM, SM, s, [w]),
                              rate=Rate(Decimal("2"), alpha=Decimal(0), billed_basis=basis))
    assert priced.charges[0] == Decimal(expected)


@given(total=st.decimals(min_value=0, max_value=10**6, places=12),
       weights=st.lists(st.decimals(min_value=0, max_value=10**6, places=6), min_size=1, max_size=20))
def test_allocate_parts_add_up_exactly_and_are_never_negative(total, weights):
    parts = allocate(total, weights)
    assert sum(parts) == total
    assert all(p >= 0 for p in parts)


def test_minor_units_round_once_half_even():
    assert to_minor_units(Decimal("0.125"), "USD") == 12
    assert to_minor_units(Decimal("0.135"), "USD") == 14
    assert to_minor_units(Decimal("12.5"), "JPY") == 12


def _allocate_ranked_by_keys(total: Decimal, weights: list[Decimal]) -> list[Decimal]:
    """allocate as it ranked the left-over units before: a sort of every part by (-fraction, position)."""
    weight_sum = sum(weights, Decimal(0))
    if weight_sum == 0:
        weights, weight_sum = [Decimal(1)] * len(weights), Decimal(len(weights))
    with localcontext(money._CONTEXT):
        units = int(total.scaleb(12).to_integral_value(rounding=ROUND_HALF_EVEN))
        exact = [Decimal(units) * w / weight_sum for w in weights]
        floors = [int(x.to_integral_value(rounding=ROUND_FLOOR)) for x in exact]
        order = sorted(range(len(exact)), key=lambda i: (-(exact[i] - floors[i]), i))
        for i in order[:units - sum(floors)]:
            floors[i] += 1
        return [Decimal(u).scaleb(-12) for u in floors]


# Weights drawn from a few values, so that fractions tie; few or many parts, so that both the heap and
# the sort hand out the units.
@given(total=st.decimals(min_value=0, max_value=10**6, places=12),
       weights=st.lists(st.sampled_from([Decimal(0), Decimal(1), Decimal(3), Decimal("7.5"), Decimal("0.000001")])
                        | st.decimals(min_value=0, max_value=10**6, places=6), min_size=1, max_size=200))
def test_allocate_hands_the_units_left_to_the_parts_the_sorted_keys_did(total, weights):
    assert allocate(total, weights) == _allocate_ranked_by_keys(total, weights)
    assert [p.as_tuple() for p in allocate(total, weights)] == [p.as_tuple() for p in _allocate_ranked_by_keys(total, weights)]
