"""Display of audit values (billing.queries.audit): money and prices with their currency, instants
and days in the active language's date formats (config/formats), yes/no translated."""

from __future__ import annotations

from datetime import date, datetime
from decimal import Decimal

from django import template
from django.utils import timezone
from django.utils.formats import date_format, time_format
from django.utils.translation import gettext as _

from billing.money import grouped_text, minor_unit_exponent
from billing.queries.audit import AuditValue
from billing.templatetags.ledger import money

register = template.Library()


@register.filter
def audit_value(value: AuditValue) -> str:
    if value.kind == "none":
        return "—"
    if value.kind == "bool":
        return _("yes") if value.value else _("no")
    if value.kind == "money":
        return money(value.value, value.currency)
    if value.kind == "rate" and isinstance(value.value, Decimal):
        return _rate(value.value, value.currency)
    if value.kind == "instant" and isinstance(value.value, datetime):
        at = timezone.localtime(value.value) if timezone.is_aware(value.value) else value.value
        return f"{date_format(at, 'DATE_FORMAT')} {time_format(at, 'TIME_FORMAT')}"
    if value.kind == "day" and isinstance(value.value, date):
        return date_format(value.value, "DATE_FORMAT")
    return str(value.value)


def _rate(price: Decimal, currency: str) -> str:
    """Every decimal the price was set with, and at least the currency's minor unit."""
    exponent = price.as_tuple().exponent
    places = max(-exponent if isinstance(exponent, int) else 0, minor_unit_exponent(currency))
    text = grouped_text(price, places)
    return f"{text} {currency}".strip()
