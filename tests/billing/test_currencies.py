"""The one ISO 4217 list (billing/currencies.py): codes and minor units, and the one check every path uses."""

from __future__ import annotations

import pytest
from django.utils import translation
from hypothesis import given
from hypothesis import strategies as st

from billing.currencies import CURRENCY_CHOICES, MINOR_UNITS, check_currency
from billing.errors import InvalidInput
from billing.money import format_minor_units, minor_unit_exponent


def test_minor_units_follow_iso_4217() -> None:
    assert {code: MINOR_UNITS[code] for code in ("USD", "EUR", "CNY", "GBP", "JPY", "KRW", "KWD", "BHD", "TND")} == {
        "USD": 2, "EUR": 2, "CNY": 2, "GBP": 2, "JPY": 0, "KRW": 0, "KWD": 3, "BHD": 3, "TND": 3}
    assert all(len(code) == 3 and code.isalpha() and code.isupper() for code in MINOR_UNITS)
    assert list(MINOR_UNITS) == sorted(MINOR_UNITS)


def test_money_rounds_with_the_same_list() -> None:
    assert minor_unit_exponent("kwd") == 3
    assert format_minor_units(12345, "KWD") == "12.345"
    assert format_minor_units(12345, "VND") == "12345"


def test_the_select_offers_every_code_once() -> None:
    assert [code for code, _ in CURRENCY_CHOICES] == list(MINOR_UNITS)


def test_check_currency_normalises_a_known_code() -> None:
    assert check_currency(" usd ") == "USD"


@pytest.mark.parametrize("text", ["zz", "123", "US", "USDD", "", "XAU", "XXX", "HRK", "US1"])
def test_check_currency_refuses_what_is_not_a_currency(text: str) -> None:
    with pytest.raises(InvalidInput, match="ISO 4217"):
        check_currency(text)


def test_check_currency_speaks_chinese() -> None:
    with translation.override("zh-hans"), pytest.raises(InvalidInput, match="ISO 4217") as caught:
        check_currency("zz")
    assert "币种 'zz'" in str(caught.value)


@given(code=st.sampled_from(sorted(MINOR_UNITS)), minor=st.integers(min_value=-(10**12), max_value=10**12))
def test_every_listed_code_is_accepted_in_any_case_and_formats_with_its_minor_unit(code: str, minor: int) -> None:
    assert check_currency(code.lower()) == code
    decimals = format_minor_units(minor, code).lstrip("-").partition(".")[2]
    assert len(decimals) == MINOR_UNITS[code]
