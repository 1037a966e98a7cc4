"""Money: the one place where amounts are converted and rounded.

- Ledger amounts carry LEDGER_PLACES decimal places (a millionth of a millionth of a
  currency unit). Quantizing to it is storage precision, not customer rounding; the
  reconciliation invariant holds exactly at this precision because idle is a remainder
  and shares are allocated with the largest-remainder method.
- Customer-facing amounts (invoice lines) are rounded exactly once, to the currency's
  minor unit, with ROUND_HALF_EVEN (`to_minor_units`).
- Integer minor units go back to major units exactly (`from_minor_units`, no rounding) and are
  written with the currency's number of decimals (`format_minor_units`). Pages show ledger
  amounts to the currency's minor unit (`display_amount`): display only, never stored.
- How shown numbers add (one rule for every table, page and CSV): each amount is rounded once
  to the currency's minor unit; a total, across a row or down a column, is the sum of the
  rounded amounts it totals (`round_parts`), so the parts shown always add to the total shown,
  as an invoice's lines add to its total. Quantities follow the same rule at a stated number
  of places (`round_quantities`, `QUANTITY_PLACES`). Percentage shares use the largest
  remainder so they add to exactly 100 (`shares_percent`). CSVs write amounts with the
  currency's decimals (`amount_text`) and quantities with their stated places (`quantity_text`).
- How a shown figure opens into its parts (a tenant into its namespaces, a namespace into its
  controllers...): the parent's shown figure is split over the children in proportion to their
  unrounded figures by the largest remainder (`apportion`), so the children shown add up exactly to
  the row that opened them, and each stays within one unit of the last place of its own figure.
"""

from __future__ import annotations

import functools
import heapq
from collections.abc import Sequence
from decimal import ROUND_FLOOR, ROUND_HALF_EVEN, Context, Decimal, InvalidOperation, localcontext

from django.utils.formats import get_format, number_format
from django.utils.translation import get_language

from billing.currencies import MINOR_UNITS

__all__ = [
    "LEDGER_PLACES",
    "MINOR_UNIT_EXPONENT",
    "QUANTITY_PLACES",
    "allocate",
    "amount_text",
    "apportion",
    "apportion_units",
    "display_amount",
    "format_minor_units",
    "from_minor_units",
    "grouped_text",
    "ledger_amount",
    "minor_unit_exponent",
    "money_text",
    "quantity_text",
    "round_parts",
    "round_quantities",
    "shares_percent",
    "to_minor_units",
    "unit_price",
]

LEDGER_PLACES = 12
# A price per unit (per GPU-hour) keeps 6 places, as rate cards store it.
PRICE_PLACES = 6
# ISO 4217 minor units (billing.currencies, the one list); an unknown code gets 2.
MINOR_UNIT_EXPONENT = MINOR_UNITS
_CONTEXT = Context(prec=50)
# The stated precision of each kind of quantity on the pages and in the CSVs (docs/exports.md):
# GPU-hours and GB·h / SM·h to 4 places (0.36 s of a card), seconds, MB·s and SM·s to whole
# units, percentages to 1 place.
QUANTITY_PLACES = {"gpu_hours": 4, "gb_h": 4, "sm_h": 4, "seconds": 0, "mb_s": 0, "sm_s": 0, "percent": 1}


@functools.cache
def _quantum(places: int) -> Decimal:
    return Decimal(1).scaleb(-places)


def _half_even(value: Decimal, places: int) -> Decimal:
    """`value` rounded once, half-even, to `places` decimals, in _CONTEXT. The context is passed, not
    entered: a per-pod month's answer or CSV rounds ~100k figures, and entering a local context
    for each was as long as the rounding (the flags it sets are never read)."""
    return value.quantize(_quantum(places), rounding=ROUND_HALF_EVEN, context=_CONTEXT)


def ledger_amount(value: Decimal) -> Decimal:
    """Quantize a computed amount to ledger precision (half-even)."""
    return _half_even(value, LEDGER_PLACES)


def unit_price(value: Decimal) -> Decimal:
    """A derived price per unit (an amortised rate per GPU-hour) rounded once, half-even, to
    PRICE_PLACES: the precision every stored price has."""
    return _half_even(value, PRICE_PLACES)


def minor_unit_exponent(currency: str) -> int:
    return MINOR_UNIT_EXPONENT.get(currency.upper(), 2)


def to_minor_units(amount: Decimal, currency: str) -> int:
    """Round an amount once, half-even, to integer minor units (cents, fen...)."""
    exponent = minor_unit_exponent(currency)
    with localcontext(_CONTEXT):
        return int(amount.scaleb(exponent).quantize(Decimal(1), rounding=ROUND_HALF_EVEN))


def from_minor_units(minor: int, currency: str) -> Decimal:
    """Integer minor units as an exact Decimal in major units: `12345, "USD"` -> `123.45`."""
    return Decimal(minor).scaleb(-minor_unit_exponent(currency))


def format_minor_units(minor: int, currency: str) -> str:
    """`12345, "USD"` -> `"123.45"`, `500, "JPY"` -> `"500"`: exact, with the currency's decimals."""
    return f"{from_minor_units(minor, currency):.{minor_unit_exponent(currency)}f}"


def display_amount(amount: Decimal, currency: str = "") -> Decimal:
    """A ledger amount rounded (half-even) to the currency's minor unit, for showing only; an
    unknown or empty currency shows 2 places. Stored amounts are never rounded here."""
    return _half_even(amount, minor_unit_exponent(currency))


def money_text(value: object, currency: str = "") -> str:
    """An amount as pages and PDFs show it: `display_amount`, then grouping and separators in the
    active language ("1,234.57 USD"); an empty string for None, so a missing figure never shows as 0."""
    if value is None or value == "":
        return ""
    try:
        amount = display_amount(Decimal(str(value)), currency)
    except InvalidOperation:
        return str(value)
    text = grouped_text(amount, minor_unit_exponent(currency))
    return f"{text} {currency}".strip()


def grouped_text(amount: Decimal, places: int) -> str:
    """`amount`, a Decimal of at most `places` decimals, with `places` decimals and its thousands
    grouped in the active language's format: what Django's number_format(amount, places,
    use_l10n=True, force_grouping=True) writes, without its walk over the digits where the language
    groups by threes (a month's portal writes ~3,000 numbers at 1,000 GPUs)."""
    table = _separators(get_language())
    _sign, digits, exponent = amount.as_tuple()
    if table is None or not isinstance(exponent, int) or -exponent > places or abs(exponent) + len(digits) > 200:
        return number_format(amount, places, use_l10n=True, force_grouping=True)
    if not amount:
        amount = Decimal(0)  # no "-0.00": number_format writes any zero as 0
    text = f"{amount:,.{places}f}"
    return text.translate(table) if table else text


@functools.lru_cache(maxsize=16)
def _separators(language: str | None) -> dict[int, str] | None:
    """What turns a format spec's "." and "," into a language's decimal and thousands separators
    (empty where they are those), where the language groups digits by threes; else None."""
    if get_format("NUMBER_GROUPING", language, use_l10n=True) != 3:
        return None
    decimal, thousands = (str(get_format(name, language, use_l10n=True))
                          for name in ("DECIMAL_SEPARATOR", "THOUSAND_SEPARATOR"))
    return {} if (decimal, thousands) == (".", ",") else {ord("."): decimal, ord(","): thousands}


def allocate(total: Decimal, weights: Sequence[Decimal]) -> list[Decimal]:
    """Split `total` (a ledger amount) over `weights` pro rata, at ledger precision.

    Largest-remainder method: the parts are ledger amounts, never negative when the
    total and weights are not, and they add up to `total` exactly.
    """
    if total < 0:
        raise ValueError(f"cannot allocate a negative total {total}")
    if any(w < 0 for w in weights):
        raise ValueError("allocation weights must not be negative")
    weight_sum = sum(weights, Decimal(0))
    if not weights:
        return []
    if weight_sum == 0:
        weights = [Decimal(1)] * len(weights)
        weight_sum = Decimal(len(weights))
    with localcontext(_CONTEXT):
        units = int(total.scaleb(LEDGER_PLACES).to_integral_value(rounding=ROUND_HALF_EVEN))
        exact = [Decimal(units) * w / weight_sum for w in weights]
        floors = [int(x.to_integral_value(rounding=ROUND_FLOOR)) for x in exact]
        left = units - sum(floors)
        if left:
            # Hand the left-over units to the largest fractional parts; ties by position, as apportion
            # ranks them (a heap for a few of many, a sort of the positions by fraction for more).
            # Shared idle splits a card's idle over every pod on it: a per-pod month's 39k at 1,000 GPUs,
            # where a key of (-fraction, position) per part made the sort most of this function.
            fractions = [x - f for x, f in zip(exact, floors, strict=True)]
            size = len(fractions)
            for i in (heapq.nlargest(left, range(size), key=fractions.__getitem__) if left * 8 < size
                      else sorted(range(size), key=fractions.__getitem__, reverse=True)[:left]):
                floors[i] += 1
        return [Decimal(u).scaleb(-LEDGER_PLACES) for u in floors]


def apportion(total: Decimal, parts: Sequence[Decimal], places: int) -> list[Decimal]:
    """Split a shown figure `total` (a multiple of 10^-places) over `parts` (their unrounded
    figures) in proportion to them, at `places` decimals, by the largest remainder (Hamilton's
    method): the results add up to `total` exactly, and each differs from its part scaled to the
    total (part × total ÷ Σ parts) by less than one unit of the last place. Ties go to the earlier
    part, so the same figures always split the same way.

    `total` and `parts` share a sign (an empty or all-zero `parts` with a zero total gives zeros; a
    non-zero total over parts that sum to zero is split evenly, the remainder to the first ones).
    Money passes the currency's minor-unit exponent as `places`."""
    if parts and (total < 0 or min(parts) < 0):
        if total > 0 or max(parts) > 0:
            raise ValueError("apportion needs the total and its parts on one side of zero")
        return [-x for x in apportion(-total, [-p for p in parts], places)]
    # Decimal(u).scaleb(-places) has exactly `places` decimals (the exponent -places).
    return [Decimal(u).scaleb(-places) for u in apportion_units(total, parts, places)]


def apportion_units(total: Decimal, parts: Sequence[Decimal], places: int) -> list[int]:
    """`apportion` of a total and parts that are not negative, each share as a whole number of units
    of 10^-places: for a caller that writes few of many shares (a page opens a figure into thousands
    of parts and shows a hundred; making each a Decimal was a third of the split)."""
    if not parts:
        if total:
            raise ValueError(f"cannot apportion {total} over no parts")
        return []
    if total < 0 or min(parts) < 0:
        raise ValueError("apportion_units needs a total and parts that are not negative")
    with localcontext(_CONTEXT):
        units = total.scaleb(places)
        if units != units.to_integral_value():
            raise ValueError(f"{total} is not a multiple of 10^-{places}")
        units_int = int(units)
        if not units_int:
            # Nothing to split: every share's floor is 0 and no unit is left over. A figure a fleet
            # does not meter (energy without its readings) is 0 at every node a page opens.
            return [0] * len(parts)
        if len(parts) == 1:
            # The whole to its one part (what the split below gives it): a figure tree opens every pod
            # into its one instance, ~100k of these for a tenant's CSV of a month at 1,000 GPUs.
            return [units_int]
        weight_sum = sum(parts, Decimal(0))
        weights = list(parts) if weight_sum else [Decimal(1)] * len(parts)
        weight_sum = weight_sum or Decimal(len(parts))
        scaled = Decimal(units_int)
        # Each share as its floor and remainder (units × part = floor × Σ parts + remainder, exactly):
        # one division per part, and the remainders rank the fractional parts exactly (they share
        # the denominator Σ parts). A page opens figures into thousands of parts (bench/web_pages.py):
        # only the few left-over units need ranking, not a sort.
        shares = [divmod(scaled * w, weight_sum) for w in weights]
        floors = [int(q) for q, _r in shares]
        left = units_int - sum(floors)
        if left:
            # Hand the left-over units to the largest fractional parts; ties by position (both ways
            # are sorted(..., reverse=True)[:left], which keeps equal remainders in order). A heap for
            # a few of many, a sort for more: over 490 parts, 27-37 us against 97 for 1-5 units,
            # 98 against 113-209 for 66-245 (and a heap of (remainder, position) tuples, 59-337).
            remainders = [r for _q, r in shares]
            size = len(remainders)
            for i in (heapq.nlargest(left, range(size), key=remainders.__getitem__) if left * 8 < size
                      else sorted(range(size), key=remainders.__getitem__, reverse=True)[:left]):
                floors[i] += 1
        return floors


def round_parts(parts: Sequence[Decimal], currency: str = "") -> tuple[list[Decimal], Decimal]:
    """The one rule for a table of amounts and its total: each part rounded once (half-even) to
    the currency's minor unit, the total the exact sum of those rounded parts. So the figures a
    page or CSV shows always add to the total it shows (a total may then differ from the
    unrounded total rounded, by at most half a minor unit per part)."""
    rounded = [display_amount(p, currency) for p in parts]
    return rounded, _exact_sum(rounded, minor_unit_exponent(currency))


def round_quantities(parts: Sequence[Decimal], places: int) -> tuple[list[Decimal], Decimal]:
    """`round_parts` for quantities (GPU-hours, GB·h...): each to `places` decimals, half-even,
    and the total the sum of the rounded parts."""
    rounded = [_half_even(p, places) for p in parts]
    return rounded, _exact_sum(rounded, places)


def shares_percent(parts: Sequence[Decimal], places: int = 1) -> list[Decimal]:
    """Each part's share of their sum in percent, to `places` decimals, by the largest remainder
    (`apportion` of 100 %): the shares add to exactly 100 (all zero when the parts sum to zero).
    Parts must not be negative: a share of a negative amount is not a share."""
    if any(p < 0 for p in parts):
        raise ValueError("shares of negative amounts are undefined")
    if not parts or sum(parts, Decimal(0)) == 0:
        return [Decimal(0).scaleb(-places) for _ in parts]
    return apportion(Decimal(100), parts, places)


def amount_text(amount: Decimal, currency: str) -> str:
    """An amount as a CSV writes it: rounded once (half-even) to the currency's minor unit and
    written with exactly its decimals, no grouping, no exponent: `2949.119999988480` -> `2949.12`."""
    return f"{display_amount(amount, currency):.{minor_unit_exponent(currency)}f}"


def quantity_text(value: Decimal, places: int) -> str:
    """A quantity as a CSV writes it: `places` decimals (half-even), no grouping, no exponent."""
    return f"{_half_even(value, places):.{places}f}"


def _exact_sum(values: Sequence[Decimal], places: int) -> Decimal:
    with localcontext(_CONTEXT):
        return sum(values, Decimal(0)).quantize(Decimal(1).scaleb(-places))
