"""Unit prices of invoice lines (docs/billing.md, Unit prices): what a usage line states besides its
amount, so a reader can see why it costs what it does.

A usage line is per GPU model and SLA tier; its quantity is GPU-hours (equivalent whole GPUs), its
unit the GPU-hour. Its unit price:

- **one rate** priced all of its usage (one rate card over the month, no commitment): that rate, so
  quantity × unit price = amount, to the rounding shown;
- **several rates** (a card replaced from a minute inside the month, or part of the usage on a
  commitment's rate): the average, amount ÷ GPU-hours, rounded once to the 6 places of a price
  (`billing.money.unit_price`), marked "average", with the rates that applied listed. The line is
  not split by rate: lines (GPU model, SLA tier, each rounded once) are what every figure of a
  tenant adds up (docs/billing.md, One figure everywhere).

Idle and adjustment lines have none: idle is the card's unbilled time spread by charge, and an
adjustment the difference to what an earlier invoice charged. The rates are copied onto the line
when it is finalized (`rates_to_json`), so an issued invoice states the same unit prices whatever
happens to rate cards later.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from decimal import Decimal
from typing import Any

from django.utils.formats import date_format
from django.utils.translation import gettext as _

from billing.ledger.line_rates import AppliedRate
from billing.models import InvoiceLine
from billing.money import unit_price

__all__ = [
    "AppliedRate",
    "billing_rule_text",
    "is_average",
    "line_rules",
    "line_unit_price",
    "no_unit_price_reason",
    "price_text",
    "rates_from_json",
    "rates_text",
    "rates_to_json",
    "shared_rule",
]


def _plain(value: Decimal) -> str:
    """A price or weight without exponent or trailing zeros ("5.12", "0.5"). Local rather than the
    exports' helper of the same name: the exports import this package."""
    return "0" if value == 0 else format(value.normalize(), "f")


def price_text(value: Decimal) -> str:
    """A unit price as the documents state it: at least the 2 decimals of a price, at most the 6 it
    is kept to ("5.12", "5.287534")."""
    text = _plain(value)
    decimals = len(text.partition(".")[2])
    return f"{value:.{max(2, decimals)}f}"


def is_average(rates: Sequence[AppliedRate]) -> bool:
    """True when more than one price priced the line: its unit price is then an average."""
    return len({r.price_per_gpu_hour for r in rates}) > 1


def line_unit_price(*, kind: str, gpu_hours: Decimal, amount: Decimal, rates: Sequence[AppliedRate]) -> Decimal | None:
    """The unit price a line states (module docstring); None for idle and adjustment lines, a line
    without a known rate, or an average of no GPU-hours."""
    if kind != InvoiceLine.Kind.USAGE or not rates:
        return None
    if not is_average(rates):
        return unit_price(rates[0].price_per_gpu_hour)
    return unit_price(amount / gpu_hours) if gpu_hours else None


def rates_to_json(rates: Sequence[AppliedRate]) -> list[dict[str, Any]]:
    """The rates as the line stores them: decimals and instants as exact strings."""
    return [{"price": _plain(unit_price(r.price_per_gpu_hour)), "start": r.start.isoformat(),
             "end": r.end.isoformat(), "commitment": r.commitment, "billed_basis": r.billed_basis,
             "alpha": _plain(r.alpha)} for r in rates]


def rates_from_json(data: Any) -> tuple[AppliedRate, ...]:
    """A stored line's rates (`rates_to_json`); nothing for a line finalized before they were kept."""
    if not isinstance(data, list):
        return ()
    return tuple(AppliedRate(price_per_gpu_hour=Decimal(r["price"]), start=datetime.fromisoformat(r["start"]),
                             end=datetime.fromisoformat(r["end"]), commitment=bool(r["commitment"]),
                             billed_basis=str(r["billed_basis"]), alpha=Decimal(r["alpha"])) for r in data)


def _instant(at: datetime) -> str:
    return f"{date_format(at, 'DATE_FORMAT')} {at:%H:%M} UTC"


def rates_text(rates: Sequence[AppliedRate], *, period_end: datetime) -> str:
    """The rates of an average, in the reader's language: "5.12 until 2026-12-03 14:05 UTC, then 5.50"
    for the market cards in turn, then each commitment rate ("4.10 on committed cards")."""
    market = [r for r in rates if not r.commitment]
    parts = []
    for i, r in enumerate(market):
        price = price_text(r.price_per_gpu_hour)
        if r.end < period_end:
            text = (_("%(price)s until %(end)s") if i == 0 else _("then %(price)s until %(end)s")) % {
                "price": price, "end": _instant(r.end)}
        else:
            text = price if i == 0 else _("then %(price)s") % {"price": price}
        parts.append(text)
    committed = [_("%(price)s on committed cards") % {"price": price_text(r.price_per_gpu_hour)}
                 for r in rates if r.commitment]
    return "; ".join(p for p in (", ".join(parts), "; ".join(committed)) if p)


def billing_rule_text(billed_basis: str, alpha: Decimal) -> str:
    """How a GPU-hour was counted: the billed basis and the memory weight α."""
    basis = {"max": _("max(used, granted)"), "granted": _("granted"), "used": _("used")}.get(billed_basis,
                                                                                           billed_basis)
    return _("%(basis)s memory and SMs, memory weight α = %(alpha)s, SM weight 1 − α") % {
        "basis": basis, "alpha": _plain(alpha)}


def line_rules(rates: Sequence[AppliedRate]) -> tuple[tuple[str, Decimal], ...]:
    """The (billed basis, α) pairs a line's rates counted GPU-hours by, each once, in order."""
    return tuple(dict.fromkeys((r.billed_basis, r.alpha) for r in rates))


def shared_rule(lines_rates: Sequence[Sequence[AppliedRate]]) -> tuple[str, Decimal] | None:
    """The one rule every priced usage line was billed by, stated once above the table; None when
    they differ (each line then states its own) or no line has rates."""
    rules = {rule for rates in lines_rates for rule in line_rules(rates)}
    return next(iter(rules)) if len(rules) == 1 else None


def no_unit_price_reason(kind: str) -> str:
    """Why a line has no unit price (empty for a usage line)."""
    if kind == InvoiceLine.Kind.IDLE:
        return _("no unit price: idle time of the cards, shared in proportion to charges")
    if kind == InvoiceLine.Kind.ADJUSTMENT:
        return _("no unit price: difference to the amount invoiced earlier for that month")
    return ""
