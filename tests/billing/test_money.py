"""One money conversion (billing/money.py): minor <-> major units and display rounding live in
billing.money, and the pages, the invoice CSV and the FOCUS export all go through it."""

from __future__ import annotations

import math
from decimal import Decimal
from fractions import Fraction

import pytest
from django.utils import translation
from django.utils.formats import number_format
from hypothesis import given
from hypothesis import strategies as st

from billing.money import (
    MINOR_UNIT_EXPONENT,
    QUANTITY_PLACES,
    amount_text,
    apportion,
    display_amount,
    format_minor_units,
    from_minor_units,
    grouped_text,
    minor_unit_exponent,
    quantity_text,
    round_parts,
    round_quantities,
    shares_percent,
    to_minor_units,
)
from billing.templatetags.ledger import money

currencies = st.sampled_from([*MINOR_UNIT_EXPONENT, "", "XYZ"])
ledger_amounts = st.decimals(min_value=Decimal("-1e9"), max_value=Decimal("1e9"), places=12, allow_nan=False,
                             allow_infinity=False)


@given(minor=st.integers(min_value=-(10**15), max_value=10**15), currency=currencies)
def test_minor_units_go_to_major_units_and_back_exactly(minor: int, currency: str) -> None:
    major = from_minor_units(minor, currency)
    assert major == Decimal(minor) / Decimal(10) ** minor_unit_exponent(currency)
    assert to_minor_units(major, currency) == minor
    # The written form is that same number with the currency's decimals, no exponent.
    text = format_minor_units(minor, currency)
    assert Decimal(text) == major
    assert "E" not in text
    assert len(text.partition(".")[2]) == minor_unit_exponent(currency)


@given(amount=ledger_amounts, currency=currencies)
def test_a_displayed_amount_is_the_amount_an_invoice_line_rounds_to(amount: Decimal, currency: str) -> None:
    # Pages and invoices round with one rule: half-even to the currency's minor unit.
    assert display_amount(amount, currency) == from_minor_units(to_minor_units(amount, currency), currency)
    assert abs(display_amount(amount, currency) - amount) <= Decimal(1).scaleb(-minor_unit_exponent(currency)) / 2


def test_amounts_show_with_the_currencys_decimals() -> None:
    assert format_minor_units(12345, "USD") == "123.45"
    assert format_minor_units(500, "JPY") == "500"
    assert format_minor_units(-5, "EUR") == "-0.05"
    with translation.override("en"):
        assert money(Decimal("1234.565"), "USD") == "1,234.56 USD"  # half-even
        assert money(Decimal("1234.5"), "JPY") == "1,234 JPY"  # yen have no minor unit
        assert money(Decimal("0.125")) == "0.12"  # no currency: 2 places
        assert money(None, "USD") == ""


# How shown numbers add (docs/billing.md, How totals add): each part rounded once, a total is the sum of the rounded parts.
amount_lists = st.lists(ledger_amounts, max_size=30)


@given(parts=amount_lists, currency=currencies)
def test_rounded_parts_add_to_the_total_shown(parts: list[Decimal], currency: str) -> None:
    rounded, total = round_parts(parts, currency)
    assert rounded == [display_amount(p, currency) for p in parts]
    assert total == sum(rounded, Decimal(0))
    # The total carries the currency's decimals, as it is shown, and strays from the exact total
    # by at most half a minor unit per part.
    assert total.as_tuple().exponent == -minor_unit_exponent(currency)
    half = Decimal(1).scaleb(-minor_unit_exponent(currency)) / 2
    assert abs(total - sum(parts, Decimal(0))) <= half * len(parts)


def test_the_issue_case_adds_up() -> None:
    # November's tenant rows summed to 951.02 while "Attributed" said 951.04 (each rounded alone).
    parts = [Decimal("317.006"), Decimal("317.006"), Decimal("317.006")]
    assert display_amount(sum(parts, Decimal(0)), "USD") == Decimal("951.02")
    rounded, total = round_parts(parts, "USD")
    assert rounded == [Decimal("317.01")] * 3
    assert total == Decimal("951.03")
    assert round_parts([], "JPY") == ([], Decimal(0))
    assert str(round_parts([Decimal("1.5"), Decimal("2.5")], "JPY")[1]) == "4"


@given(parts=st.lists(st.decimals(min_value=0, max_value=Decimal("1e6"), places=6), max_size=12),
       places=st.integers(min_value=0, max_value=4))
def test_rounded_quantities_add_to_their_total(parts: list[Decimal], places: int) -> None:
    rounded, total = round_quantities(parts, places)
    assert total == sum(rounded, Decimal(0))
    assert total.as_tuple().exponent == -places
    assert all(abs(r - p) <= Decimal(1).scaleb(-places) / 2 for r, p in zip(rounded, parts, strict=True))


@given(parts=st.lists(st.decimals(min_value=0, max_value=Decimal("1e9"), places=6), min_size=1, max_size=20),
       places=st.integers(min_value=0, max_value=3))
def test_shares_add_to_exactly_one_hundred_percent(parts: list[Decimal], places: int) -> None:
    shares = shares_percent(parts, places)
    unit = Decimal(1).scaleb(-places)
    if sum(parts, Decimal(0)) == 0:
        assert all(s == 0 for s in shares)
        return
    assert sum(shares, Decimal(0)) == 100
    # Each share is its exact share rounded down or up by less than one unit, never negative.
    exact = [100 * p / sum(parts, Decimal(0)) for p in parts]
    assert all(s >= 0 and abs(s - e) < unit for s, e in zip(shares, exact, strict=True))


def test_shares_use_the_largest_remainder() -> None:
    # Thirds rounded alone show 33.3 + 33.3 + 33.3 = 99.9; the first largest remainder takes the 0.1.
    assert shares_percent([Decimal(1)] * 3) == [Decimal("33.4"), Decimal("33.3"), Decimal("33.3")]
    assert shares_percent([Decimal(2), Decimal(1)], 0) == [Decimal(67), Decimal(33)]
    assert shares_percent([]) == []
    with pytest.raises(ValueError, match="negative"):
        shares_percent([Decimal(-1), Decimal(2)])


# How a shown figure opens into its parts (docs/billing.md, How totals add: drill-downs).
@given(parts=st.lists(st.decimals(min_value=0, max_value=Decimal("1e7"), places=12), min_size=1, max_size=25),
       places=st.integers(min_value=0, max_value=4), nudge=st.integers(min_value=-40, max_value=40))
def test_children_add_up_exactly_to_the_row_that_opened_them(parts: list[Decimal], places: int, nudge: int) -> None:
    """Any unrounded children and any shown parent (their sum rounded, or off by a few units as a
    parent built from rounded lines is): the children shown add to the parent shown, each within
    one unit of its proportional share and never below zero."""
    unit = Decimal(1).scaleb(-places)
    total = max(round_quantities([sum(parts, Decimal(0))], places)[1] + nudge * unit, Decimal(0))
    shown = apportion(total, parts, places)
    assert sum(shown, Decimal(0)) == total
    assert all(s.as_tuple().exponent == -places and s >= 0 for s in shown)
    weight = sum(parts, Decimal(0))
    exact = [p * total / weight if weight else total / len(parts) for p in parts]
    assert all(abs(s - e) < unit for s, e in zip(shown, exact, strict=True))
    # Deterministic: the same figures split the same way.
    assert apportion(total, parts, places) == shown


@given(parts=st.lists(st.decimals(min_value=0, max_value=Decimal("1e7"), places=12), min_size=1, max_size=40),
       places=st.integers(min_value=0, max_value=4), nudge=st.integers(min_value=-40, max_value=40))
def test_apportion_is_the_largest_remainder_with_ties_to_the_earlier_part(parts: list[Decimal], places: int,
                                                                       nudge: int) -> None:
    """The split is Hamilton's, computed here in exact fractions: every part gets the floor of its
    share, the units left over go one each to the largest remainders, equal remainders to the
    earlier part. (apportion ranks only the few units left over instead of sorting every part.)"""
    unit = Decimal(1).scaleb(-places)
    total = max(round_quantities([sum(parts, Decimal(0))], places)[1] + nudge * unit, Decimal(0))
    units = int(total.scaleb(places))
    weights = [Fraction(p) for p in parts] if any(parts) else [Fraction(1)] * len(parts)
    shares = [units * w / sum(weights) for w in weights]
    floors = [math.floor(s) for s in shares]
    for i in sorted(range(len(parts)), key=lambda i: (floors[i] - shares[i], i))[:units - sum(floors)]:
        floors[i] += 1
    assert apportion(total, parts, places) == [Decimal(u).scaleb(-places) for u in floors]
    assert apportion(Decimal("0.02"), [Decimal(1)] * 3, 2) == [Decimal("0.01"), Decimal("0.01"), Decimal("0.00")]


def test_apportion_follows_the_issue_case_and_refuses_what_it_cannot_split() -> None:
    # acme-prod's controllers: 214.954 + 261.694 = 476.648; a parent shown as 476.65 opens into
    # children that add to 476.65, not the 214.95 + 261.69 = 476.64 of rounding each alone.
    assert apportion(Decimal("476.65"), [Decimal("214.954"), Decimal("261.694")], 2) == [Decimal("214.95"),
                                                                                        Decimal("261.70")]
    assert apportion(Decimal("-3.00"), [Decimal(-1), Decimal(-2)], 2) == [Decimal("-1.00"), Decimal("-2.00")]
    assert apportion(Decimal("0.01"), [Decimal(0), Decimal(0)], 2) == [Decimal("0.01"), Decimal("0.00")]
    assert apportion(Decimal(0), [], 2) == []
    assert str(apportion(Decimal(0), [Decimal(1)], 2)[0]) == "0.00"
    with pytest.raises(ValueError, match="one side"):
        apportion(Decimal(1), [Decimal(-1), Decimal(2)], 2)
    with pytest.raises(ValueError, match="multiple"):
        apportion(Decimal("1.005"), [Decimal(1)], 2)
    with pytest.raises(ValueError, match="no parts"):
        apportion(Decimal(1), [], 2)


@given(amount=ledger_amounts, currency=currencies)
def test_csv_amounts_carry_the_currencys_minor_precision(amount: Decimal, currency: str) -> None:
    text = amount_text(amount, currency)
    assert Decimal(text) == display_amount(amount, currency)
    assert "E" not in text
    assert "," not in text
    assert len(text.partition(".")[2]) == minor_unit_exponent(currency)


def test_csv_numbers_are_written_plainly() -> None:
    assert amount_text(Decimal("2949.119999988480"), "USD") == "2949.12"
    assert amount_text(Decimal("1234.5"), "JPY") == "1234"
    assert amount_text(Decimal(0), "USD") == "0.00"
    assert quantity_text(Decimal("12.345678"), QUANTITY_PLACES["gpu_hours"]) == "12.3457"
    assert quantity_text(Decimal("1E+3"), 0) == "1000"


@given(amount=st.decimals(min_value=Decimal("-1e15"), max_value=Decimal("1e15"), places=6, allow_nan=False,
                          allow_infinity=False),
       places=st.integers(min_value=0, max_value=6), language=st.sampled_from(["en", "zh-hans"]))
def test_grouped_text_writes_what_djangos_number_format_writes(amount: Decimal, places: int, language: str) -> None:
    """The pages' one number writer: the same text as Django's number_format with grouping, negative
    zeros and amounts that need no decimals included, in every language the product speaks."""
    shown = display_amount(amount, "") if places == 2 else amount.quantize(Decimal(1).scaleb(-places))
    with translation.override(language):
        assert grouped_text(shown, places) == number_format(shown, places, use_l10n=True, force_grouping=True)
        assert grouped_text(-shown, places) == number_format(-shown, places, use_l10n=True, force_grouping=True)
