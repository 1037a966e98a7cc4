"""Budgets that act: month-to-date spend → ok / warned / enforced, audited and notified.

Spend is the tenant's charges plus any idle spread onto it: the closed days of the month from the
day ledger, today's hours from the hour ledger (the current hour is rolled up continuously). The forecast adds the recent rate (last 24 h),
carried to the end of the month, to the month-to-date spend. States move both ways: raising a budget or a new month
brings a tenant back to ok.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import json
from collections.abc import Collection
from dataclasses import dataclass
from datetime import datetime, timedelta
from decimal import Decimal, InvalidOperation
from typing import Any
from urllib.parse import urlsplit

from django.conf import settings
from django.core.exceptions import ValidationError
from django.core.validators import URLValidator, validate_email
from django.db import transaction
from django.utils.translation import gettext as _

from billing.currencies import check_currency
from billing.errors import InvalidInput
from billing.ledger.spend import get_recent_spend, list_month_to_date_spends
from billing.models import Budget, BudgetState, BudgetStatus, Tenant
from billing.services.audit import record_audit_event
from billing.services.invoicing import month_bounds
from billing.services.webhooks import parse_allow_list

__all__ = [
    "BudgetTransition",
    "budget_state_for",
    "check_budget_values",
    "evaluate_budgets",
    "forecast_month_end",
    "get_month_to_date_spend",
    "get_month_to_date_spends",
    "set_budget",
    "sign_webhook",
]

_BUDGET_FIELDS = ("amount", "currency", "soft_threshold_pct", "hard_threshold_pct", "hard_action",
                  "throttle_factor", "owner", "notify_emails", "webhook_url")


@dataclass(frozen=True)
class BudgetTransition:
    budget_id: int
    tenant: str
    month: str
    before: str
    after: str
    spend: Decimal
    forecast: Decimal
    amount: Decimal
    currency: str
    action: str
    owner: str
    at: datetime

    def payload(self) -> dict[str, Any]:
        return {
            "event": "budget.state_changed", "tenant": self.tenant, "month": self.month, "from": self.before,
            "to": self.after, "spend": str(self.spend.quantize(Decimal("0.01"))),
            "forecast": str(self.forecast.quantize(Decimal("0.01"))), "amount": str(self.amount),
            "currency": self.currency, "action": self.action if self.after == BudgetState.ENFORCED else None,
            "owner": self.owner, "at": self.at.isoformat(),
        }


def budget_state_for(*, spend: Decimal, amount: Decimal, soft_pct: Decimal, hard_pct: Decimal) -> str:
    """The state a spend puts a budget in: thresholds are inclusive."""
    used_pct = spend / amount * 100
    if used_pct >= hard_pct:
        return BudgetState.ENFORCED
    if used_pct >= soft_pct:
        return BudgetState.WARNED
    return BudgetState.OK


def _month_start(now: datetime) -> datetime:
    start, _ = month_bounds(now.date().replace(day=1))
    return start


def get_month_to_date_spend(*, tenant: str, now: datetime) -> Decimal:
    return get_month_to_date_spends(tenants=[tenant], now=now)[tenant]


def get_month_to_date_spends(*, tenants: Collection[str], now: datetime) -> dict[str, Decimal]:
    """Month-to-date spend (charge + idle share, ledger hours from the first of the month up to and
    including the hour of `now`) of each of `tenants`, in one query: closed days from the day ledger,
    today's hours from the hour ledger (billing.ledger.spend)."""
    return {s.tenant: s.spend for s in list_month_to_date_spends(tenants=tenants, start=_month_start(now), now=now)}


FORECAST_WINDOW = timedelta(hours=24)


def forecast_month_end(*, tenant: str, spend: Decimal, now: datetime) -> Decimal:
    """Month-to-date spend plus the recent rate (the last 24 h, or since the tenant's first
    usage this month if that is shorter) carried to the end of the month. A linear
    extrapolation from the first of the month would understate a tenant that started late."""
    month_start, month_end = month_bounds(now.date().replace(day=1))
    window_start = max(month_start, now - FORECAST_WINDOW)
    recent = get_recent_spend(tenant=tenant, since=window_start.replace(minute=0, second=0, microsecond=0), now=now)
    if recent.first_hour is None:
        return spend
    observed = Decimal(max((now - max(recent.first_hour, window_start)).total_seconds(), 3600))
    remaining = Decimal(max((month_end - now).total_seconds(), 0))
    return spend + recent.spend / observed * remaining


MAX_NOTIFY_EMAILS = 20


def _notify_emails(text: str) -> str:
    """A comma-separated list of addresses, each checked; stored as "a@x, b@y"."""
    addresses = [a.strip() for a in text.replace(";", ",").split(",") if a.strip()]
    for address in addresses:
        try:
            validate_email(address)
        except ValidationError as exc:
            raise InvalidInput(_("notify emails: %(address)r is not an email address") % {"address": address}) from exc
    if len(addresses) > MAX_NOTIFY_EMAILS:
        raise InvalidInput(_("notify emails: at most %(n)s addresses") % {"n": MAX_NOTIFY_EMAILS})
    return ", ".join(addresses)


def _webhook_url(text: str) -> str:
    """An https URL with a host. Plain http only to a host the operator allow-listed in
    VGPU_WEBHOOK_ALLOWED_HOSTS (a receiver inside the cluster, as the demo's)."""
    url = text.strip()
    if not url:
        return ""
    not_a_url = InvalidInput(_("webhook URL %(url)r is not a URL with a host, such as "
                               "https://hooks.example.com/budget") % {"url": url})
    try:
        parts = urlsplit(url)
        scheme, host = parts.scheme.lower(), parts.hostname or ""
    except ValueError as exc:  # e.g. an unclosed [IPv6 literal
        raise not_a_url from exc
    if scheme != "https" and not (scheme == "http" and _allow_listed(host)):
        raise InvalidInput(_("webhook URL %(url)r must use https: the payload names the tenant and its spend "
                             "(plain http only to a host an operator lists in VGPU_WEBHOOK_ALLOWED_HOSTS)")
                           % {"url": url})
    try:
        URLValidator(schemes=["https", "http"])(url)
    except ValidationError as exc:
        raise not_a_url from exc
    return url


def _allow_listed(host: str) -> bool:
    allow = parse_allow_list(settings.VGPU_WEBHOOK_ALLOWED_HOSTS)
    try:
        return host in allow.hosts or allow.allows_address(ipaddress.ip_address(host))
    except ValueError:
        return False


def check_budget_values(values: dict[str, Any]) -> dict[str, Any]:
    """The rules a form alone cannot be trusted with, for every caller (form, command, API):
    an ISO 4217 currency, email addresses, an https webhook, warn at or below enforce."""
    checked = dict(values)
    if "currency" in checked:
        checked["currency"] = check_currency(str(checked["currency"]))
    if "notify_emails" in checked:
        checked["notify_emails"] = _notify_emails(str(checked["notify_emails"] or ""))
    if "webhook_url" in checked:
        checked["webhook_url"] = _webhook_url(str(checked["webhook_url"] or ""))
    return checked


def _check_thresholds(budget: Budget) -> None:
    try:
        soft, hard = Decimal(str(budget.soft_threshold_pct)), Decimal(str(budget.hard_threshold_pct))
    except InvalidOperation:
        return  # not numbers: full_clean names the field
    if soft > hard:
        raise InvalidInput(_("warn at (%(soft)s %%) must not be above enforce at (%(hard)s %%): a budget warns "
                             "before it acts") % {"soft": budget.soft_threshold_pct, "hard": budget.hard_threshold_pct})


def set_budget(*, tenant_slug: str, values: dict[str, Any], now: datetime, actor_label: str,
               actor_id: int | None = None) -> Budget:
    """Create or change a tenant's budget, validated and audited in one transaction."""
    unknown = set(values) - set(_BUDGET_FIELDS) - {"webhook_secret"}
    if unknown:
        raise InvalidInput(f"unknown budget fields: {', '.join(sorted(unknown))}")
    values = check_budget_values(values)
    with transaction.atomic():
        tenant = Tenant.objects.filter(slug=tenant_slug).first()
        if tenant is None:
            raise InvalidInput(f"no tenant {tenant_slug!r}")
        budget = Budget.objects.select_for_update().filter(tenant=tenant).first()
        before = {f: str(getattr(budget, f)) for f in _BUDGET_FIELDS} if budget else None
        budget = budget or Budget(tenant=tenant)
        for key, value in values.items():
            setattr(budget, key, value)
        _check_thresholds(budget)
        try:
            budget.full_clean()
        except ValidationError as exc:
            raise InvalidInput("; ".join(f"{k}: {' '.join(v)}" for k, v in exc.message_dict.items())) from exc
        budget.save()
        record_audit_event(
            at=now, actor_id=actor_id, actor_label=actor_label, action="budget.set", object_type="budget",
            object_id=tenant.slug, before=before, after={f: str(getattr(budget, f)) for f in _BUDGET_FIELDS},
        )
    return budget


def evaluate_budgets(*, now: datetime) -> list[BudgetTransition]:
    """Recompute every budget's month-to-date state; audit each change. Returns the transitions
    (the caller notifies after commit)."""
    month = now.date().replace(day=1)
    transitions = []
    for budget in Budget.objects.select_related("tenant").order_by("pk"):
        spend = get_month_to_date_spend(tenant=budget.tenant.slug, now=now)
        forecast = forecast_month_end(tenant=budget.tenant.slug, spend=spend, now=now)
        state = budget_state_for(spend=spend, amount=budget.amount, soft_pct=budget.soft_threshold_pct,
                                 hard_pct=budget.hard_threshold_pct)
        with transaction.atomic():
            status, _ = BudgetStatus.objects.select_for_update().get_or_create(
                budget=budget, month=month, defaults={"evaluated_at": now, "changed_at": now}
            )
            before = status.state
            status.spend, status.forecast, status.evaluated_at = spend, forecast, now
            if state != before:
                status.state, status.changed_at = state, now
                transition = BudgetTransition(
                    budget_id=budget.pk, tenant=budget.tenant.slug, month=f"{month:%Y-%m}", before=before,
                    after=state, spend=spend, forecast=forecast, amount=budget.amount, currency=budget.currency,
                    action=budget.hard_action, owner=budget.owner, at=now,
                )
                record_audit_event(
                    at=now, actor_label="system", action="budget.state_changed", object_type="budget",
                    object_id=budget.tenant.slug, before={"state": before},
                    after={"state": state, "spend": str(spend.quantize(Decimal("0.01"))),
                           "amount": str(budget.amount), "action": budget.hard_action},
                )
                transitions.append(transition)
            status.save()
    return transitions


def sign_webhook(*, secret: str, timestamp: str, body: bytes) -> str:
    """HMAC-SHA256 over "<timestamp>.<body>", hex; receivers recompute it and compare in constant time."""
    mac = hmac.new(secret.encode(), timestamp.encode() + b"." + body, hashlib.sha256)
    return "sha256=" + mac.hexdigest()


def webhook_body(transition_payload: dict[str, Any]) -> bytes:
    return json.dumps(transition_payload, sort_keys=True, separators=(",", ":")).encode()
