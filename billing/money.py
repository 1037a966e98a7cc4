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
"""

from __future__ import annotations

from collections.abc import Sequence
from decimal import ROUND_FLOOR, ROUND_HALF_EVEN, Context, Decimal, localcontext

from billing.currencies import MINOR_UNITS

__all__ = [
    "LEDGER_PLACES",
    "LEDGER_QUANTUM",
    "MINOR_UNIT_EXPONENT",
    "allocate",
    "display_amount",
    "format_minor_units",
    "from_minor_units",
    "ledger_amount",
    "minor_unit_exponent",
    "to_minor_units",
]

LEDGER_PLACES = 12
LEDGER_QUANTUM = Decimal(1).scaleb(-LEDGER_PLACES)
# ISO 4217 minor units (billing.currencies, the one list); an unknown code gets 2.
MINOR_UNIT_EXPONENT = MINOR_UNITS
_CONTEXT = Context(prec=50)


def ledger_amount(value: Decimal) -> Decimal:
    """Quantize a computed amount to ledger precision (half-even)."""
    with localcontext(_CONTEXT):
        return value.quantize(LEDGER_QUANTUM, rounding=ROUND_HALF_EVEN)


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
    with localcontext(_CONTEXT):
        return amount.quantize(Decimal(1).scaleb(-minor_unit_exponent(currency)), rounding=ROUND_HALF_EVEN)


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
        # Hand the left-over units to the largest fractional parts; ties by position.
        order = sorted(range(len(exact)), key=lambda i: (-(exact[i] - floors[i]), i))
        for i in order[:left]:
            floors[i] += 1
        return [Decimal(u).scaleb(-LEDGER_PLACES) for u in floors]
