"""One money conversion (issue 14): minor <-> major units and display rounding live in
billing.money, and the pages, the invoice CSV and the FOCUS export all go through it."""

from __future__ import annotations

from decimal import Decimal

from django.utils import translation
from hypothesis import given
from hypothesis import strategies as st

from billing.money import (
    MINOR_UNIT_EXPONENT,
    display_amount,
    format_minor_units,
    from_minor_units,
    minor_unit_exponent,
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
    assert Decimal(text) == major and "E" not in text
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
