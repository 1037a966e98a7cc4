"""The part of a charge due to over-granting (billing.queries.cost_reasons.overgranted_charge): pure,
on hand-made numbers. The portal's panel over a real ledger is in tests/billing/test_portal.py."""

from __future__ import annotations

from decimal import Decimal

import pytest

from billing.queries.cost_reasons import CostReasons, PricedUsage, overgranted_charge

D = Decimal


def usage(*, charge: str = "2.70", alpha: str = "0.5", basis: str = "max", mem_used: str = "900",
          mem_billed: str = "1800", sm_used: str = "400", sm_billed: str = "3600") -> PricedUsage:
    """One hour on one card, in card-seconds: by default half the card's memory granted and a quarter
    used, all 108 SMs granted and 12 used (400 of 3600 card-seconds)."""
    return PricedUsage(charge=D(charge), alpha=D(alpha), basis=basis, mem_used_card_s=D(mem_used),
                       mem_billed_card_s=D(mem_billed), sm_used_card_s=D(sm_used), sm_billed_card_s=D(sm_billed))


def test_a_pod_using_a_ninth_of_its_sms_pays_most_of_its_charge_for_the_grant() -> None:
    # Billed share 0.5 × 1800 + 0.5 × 3600 = 2700 card-seconds, used 0.5 × 900 + 0.5 × 400 = 650:
    # billing on use would have charged 2.70 × 650 / 2700 = 0.65, so 2.05 is due to the grant.
    assert overgranted_charge(usage()) == D("2.05")


def test_alpha_weighs_memory_and_sms_as_the_price_does() -> None:
    # α = 1: only memory is priced; a quarter of the card used of half granted is half the charge.
    assert overgranted_charge(usage(alpha="1")) == D("1.35")
    # α = 0: only SMs; 400 of 3600 used, so 8/9 of the charge.
    assert overgranted_charge(usage(alpha="0", charge="9")) == D(8)


def test_a_card_billing_on_use_has_no_over_granting() -> None:
    assert overgranted_charge(usage(basis="used")) == 0


def test_use_above_a_granted_basis_is_no_over_granting_never_a_negative_part() -> None:
    assert overgranted_charge(usage(basis="granted", mem_used="2000", sm_used="3600")) == 0


def test_a_grant_fully_used_and_nothing_billed_both_give_nothing() -> None:
    assert overgranted_charge(usage(mem_used="1800", sm_used="3600")) == 0
    assert overgranted_charge(usage(charge="0", mem_used="0", mem_billed="0", sm_used="0", sm_billed="0")) == 0


def test_the_part_keeps_ledger_precision() -> None:
    # 1.00 × (3600 − 1200) / 3600 = 0.666…, kept to the ledger's 12 places, rounded only when shown.
    assert overgranted_charge(usage(charge="1", alpha="0", sm_used="1200")) == D("0.666666666667")


def test_an_alpha_outside_zero_to_one_is_refused() -> None:
    with pytest.raises(ValueError, match="alpha must lie in"):
        overgranted_charge(usage(alpha="1.5"))


def test_the_percentage_is_of_the_cost_and_unknown_for_a_free_workload() -> None:
    reasons = CostReasons(bases=("max",), alphas=(D("0.5"),), overgranted=D("2.05"), unpriced=False)
    assert reasons.overgranted_pct(D("4.10")) == 50
    assert reasons.overgranted_pct(D(0)) is None
