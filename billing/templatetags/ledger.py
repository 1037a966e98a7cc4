"""Display filters. Display only: amounts are shown to the currency's minor unit (2 places when
no currency is given) in the active language's number format; money records themselves are
rounded once, in billing.money, which also holds this display rounding."""

from __future__ import annotations

from datetime import datetime
from decimal import ROUND_HALF_EVEN, Decimal, InvalidOperation

from django import template
from django.utils.safestring import mark_safe

from billing.figures import figure_key
from billing.money import grouped_text, money_text
from billing.seeded import seeded_text
from billing.services.fleet import gib

register = template.Library()


@register.filter
def seeded(value: str) -> str:
    """`{{ tier.name|seeded }}`: a name or description the product seeded (the demo's SLA tiers, the
    tenant of unattributed processes), still as seeded, in the reader's language; anything an
    admin wrote, as written (billing.seeded)."""
    return seeded_text(value)


@register.filter
def money(value: object, currency: str = "") -> str:
    """`{{ amount|money:currency }}`: billing.money.money_text, the one way amounts are shown."""
    return money_text(value, currency)


@register.filter
def number(value: object, places: int = 2) -> str:
    """A quantity with grouping and `places` decimals in the active language's format."""
    if value is None or value == "":
        return ""
    try:
        amount = Decimal(str(value)).quantize(Decimal(1).scaleb(-int(places)), rounding=ROUND_HALF_EVEN)
    except InvalidOperation:
        return str(value)
    return grouped_text(amount, int(places))


@register.simple_tag(takes_context=True)
def current(context: template.Context, *url_names: str) -> str:
    """` aria-current="page"` when the request resolved to one of `url_names` (nav highlighting)."""
    match = getattr(context.get("request"), "resolver_match", None)
    return mark_safe(' aria-current="page"') if match and match.url_name in url_names else ""


@register.simple_tag(takes_context=True)
def current_in(context: template.Context, *url_names: str) -> str:
    """` aria-current="true"` on a menu holding the current page (one of `url_names`): the menu is
    not the page, it contains it."""
    match = getattr(context.get("request"), "resolver_match", None)
    return mark_safe(' aria-current="true"') if match and match.url_name in url_names else ""


@register.filter(name="gib")
def gib_filter(value: Decimal | None) -> Decimal | None:
    """`{{ mb|gib }}`: MB as GiB, by the right-sizing rule's one conversion."""
    return gib(value)


@register.simple_tag(name="figure_key")
def figure_key_tag(kind: str, start: datetime | None = None, end: datetime | None = None, **scope: object) -> str:
    """`data-figure="{% figure_key 'cost' start end tenant=slug %}"`: billing.figures.figure_key."""
    return figure_key(kind, start, end, **scope)
