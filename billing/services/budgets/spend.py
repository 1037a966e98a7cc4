"""Budgets that act: month-to-date spend → ok / warned / enforced, audited and notified.

A budget is on a tenant, or on one of its namespaces, or on its workloads carrying a label
(`Budget.scope`; docs/enforcement.md, Budgets by namespace and label); its spend is the part of the
tenant's spend in that scope, read and forecast by the same rules. Spend is the tenant's charges plus any idle spread onto it: the closed days of the month from the
day ledger, today's hours from the hour ledger (the current hour is rolled up continuously). The
forecast (`get_month_spends`, the one definition the portal, the budgets page and the evaluation
share) adds the rate of the recent *complete* hours, carried to the end of the month, to the
month-to-date spend. States move both ways: raising a budget or a new month brings a tenant back to ok.

Beside the state, a budget is *forecast over budget* while its forecast exceeds the amount and the
state is ok or warned (`forecast_over_budget_for`). It is a flag, never a state: the node policy and
admission read the state alone, so a forecast never throttles, blocks or evicts. Crossing above is
audited and notified once (event `budget.forecast_over_budget`); crossing back is audited only.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import json
from collections.abc import Collection
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from decimal import Decimal, InvalidOperation
from typing import Any
from urllib.parse import urlsplit

from django.conf import settings
from django.core.exceptions import ValidationError
from django.core.validators import URLValidator, validate_email
from django.db import transaction
from django.utils.translation import gettext as _

from billing.calendar import month_bounds, month_of
from billing.currencies import check_currency
from billing.errors import InvalidInput
from billing.ledger.spend import (
    SpendScope,
    TenantSpend,
    list_hour_spends,
    list_month_to_date_spends,
    list_scope_hour_spends,
    list_scope_spends,
)
from billing.models import Budget, BudgetAction, BudgetScope, BudgetState, BudgetStatus, Tenant
from billing.money import amount_text, round_parts
from billing.services.audit import record_audit_event
from billing.services.budgets.webhooks import parse_allow_list
from billing.services.ingest import label_problem, tenant_namespaces

__all__ = [
    "FORECAST_CLEARED_EVENT",
    "FORECAST_OVER_EVENT",
    "FORECAST_WINDOW",
    "BudgetEvent",
    "BudgetTransition",
    "ForecastOverBudget",
    "MonthSpend",
    "budget_key",
    "budget_scope",
    "budget_state_for",
    "check_budget_values",
    "check_notify_emails",
    "check_webhook_url",
    "evaluate_budgets",
    "forecast_over_budget_for",
    "get_budget_spends",
    "get_month_spend",
    "get_month_spends",
    "get_month_to_date_parts",
    "get_month_to_date_spend",
    "get_month_to_date_spends",
    "set_budget",
    "shown_spend",
    "sign_webhook",
]

_BUDGET_FIELDS = ("amount", "currency", "soft_threshold_pct", "hard_threshold_pct", "hard_action",
                  "throttle_factor", "owner", "notify_emails", "webhook_url")


_TENANT_SCOPE = {"kind": BudgetScope.TENANT}


def budget_scope(budget: Budget) -> dict[str, str]:
    """What a budget counts, as notifications and the audit log name it."""
    if budget.scope == BudgetScope.NAMESPACE:
        return {"kind": budget.scope, "namespace": budget.namespace}
    if budget.scope == BudgetScope.LABEL:
        return {"kind": budget.scope, "label": f"{budget.label_key}={budget.label_value}"}
    return dict(_TENANT_SCOPE)


def budget_key(budget: Budget) -> str:
    """The audit log's object id of a budget: the tenant's slug, then the scope (acme,
    acme/namespace/acme-prod, acme/label/team=ml)."""
    scope = budget_scope(budget)
    return budget.tenant.slug if budget.scope == BudgetScope.TENANT else \
        f"{budget.tenant.slug}/{budget.scope}/{scope.get('namespace') or scope.get('label')}"


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
    scope: dict[str, str] = field(default_factory=lambda: dict(_TENANT_SCOPE))  # budget_scope()

    def payload(self) -> dict[str, Any]:
        return {
            "event": "budget.state_changed", "tenant": self.tenant, "scope": self.scope, "month": self.month,
            "from": self.before, "to": self.after, "spend": amount_text(self.spend, self.currency),
            "forecast": amount_text(self.forecast, self.currency), "amount": str(self.amount),
            "currency": self.currency, "action": self.action if self.after == BudgetState.ENFORCED else None,
            "owner": self.owner, "at": self.at.isoformat(),
        }


# The webhook event and audit action of a crossing above; the audit action of a crossing back.
FORECAST_OVER_EVENT = "budget.forecast_over_budget"
FORECAST_CLEARED_EVENT = "budget.forecast_over_budget_cleared"


@dataclass(frozen=True)
class ForecastOverBudget:
    """The forecast crossed above the budget's amount while the state is ok or warned; notified
    once per crossing (evaluations while it stays above produce none)."""

    budget_id: int
    tenant: str
    month: str
    state: str
    spend: Decimal
    forecast: Decimal
    amount: Decimal
    currency: str
    owner: str
    at: datetime
    scope: dict[str, str] = field(default_factory=lambda: dict(_TENANT_SCOPE))

    def payload(self) -> dict[str, Any]:
        return {
            "event": FORECAST_OVER_EVENT, "tenant": self.tenant, "scope": self.scope, "month": self.month,
            "state": self.state,
            "spend": amount_text(self.spend, self.currency), "forecast": amount_text(self.forecast, self.currency),
            "amount": str(self.amount), "currency": self.currency, "owner": self.owner, "at": self.at.isoformat(),
        }


# What an evaluation asks its caller to notify (e-mail and webhook), after commit.
BudgetEvent = BudgetTransition | ForecastOverBudget


def forecast_over_budget_for(*, forecast: Decimal, amount: Decimal, state: str) -> bool:
    """Forecast over budget: the forecast (ledger precision) strictly above the amount, while the
    state is ok or warned. An enforced budget never is: enforcement already acts and was notified."""
    return state != BudgetState.ENFORCED and forecast > amount


def budget_state_for(*, spend: Decimal, amount: Decimal, soft_pct: Decimal, hard_pct: Decimal) -> str:
    """The state a spend puts a budget in: thresholds are inclusive."""
    used_pct = spend / amount * 100
    if used_pct >= hard_pct:
        return BudgetState.ENFORCED
    if used_pct >= soft_pct:
        return BudgetState.WARNED
    return BudgetState.OK


def _month_start(now: datetime) -> datetime:
    start, _ = month_bounds(month_of(now))
    return start


def get_month_to_date_spend(*, tenant: str, now: datetime) -> Decimal:
    return get_month_to_date_spends(tenants=[tenant], now=now)[tenant]


def get_month_to_date_spends(*, tenants: Collection[str], now: datetime) -> dict[str, Decimal]:
    """Month-to-date spend (charge + idle share) of each of `tenants` (get_month_to_date_parts)."""
    return {t: s.spend for t, s in get_month_to_date_parts(tenants=tenants, now=now).items()}


def get_month_to_date_parts(*, tenants: Collection[str], now: datetime) -> dict[str, TenantSpend]:
    """Month-to-date charge and idle share (ledger hours from the first of the month up to and
    including the hour of `now`) of each of `tenants`, in one query: closed days from the day ledger,
    today's hours from the hour ledger (billing.ledger.spend)."""
    return {s.tenant: s for s in list_month_to_date_spends(tenants=tenants, start=_month_start(now), now=now)}


FORECAST_WINDOW = timedelta(hours=24)
_HOUR = timedelta(hours=1)


@dataclass(frozen=True)
class MonthSpend:
    """A tenant's month to date at `now` and its forecast to the end of the month.

    forecast = month to date + rate × hours left in the month. The rate is the mean spend per hour
    of the complete UTC hours of the last FORECAST_WINDOW (never before the first of the month),
    counted from the tenant's first hour with usage there; when the tenant's usage began inside the
    window, that first hour is partial (it started during it) and is left out too. The hour in
    progress counts in the month to date, never in the rate: with steady use the forecast stays put
    as the hour goes by (its spend grows as the hours left shrink). Without such a complete hour
    there is no rate, and the forecast is the month to date."""

    tenant: str
    month_to_date: Decimal  # charge + idle_share
    forecast: Decimal
    rate_per_hour: Decimal | None  # None: no complete hour to take a rate from yet
    rate_hours: int  # complete hours the rate is taken over
    charge: Decimal
    idle_share: Decimal
    # (charge, idle share) per invoice line; a budget's part of a tenant (a namespace, a label) has
    # none of its own and shows as one line.
    lines: tuple[tuple[Decimal, Decimal], ...] = ()

    def month_to_date_shown(self, currency: str) -> Decimal:
        return shown_spend(TenantSpend(self.tenant, self.charge, self.idle_share, self.lines), currency)


def shown_spend(spend: TenantSpend, currency: str) -> Decimal:
    """A tenant's spend as every page shows it: as its invoice would, each invoice line's charge and
    idle share rounded once to the currency's minor unit, then added (billing.money.round_parts);
    so the portal, its budget card, the budgets page, the tenant list, the upcoming invoice's
    subtotal and the finance page's tenant row (billing.figures) show one month to date,
    to the cent."""
    lines = spend.lines or ((spend.charge, spend.idle_share),)
    charges, idles = [c for c, _i in lines], [i for _c, i in lines]
    return round_parts(charges, currency)[1] + round_parts(idles, currency)[1]


def get_month_spend(*, tenant: str, now: datetime, month_to_date: TenantSpend | None = None) -> MonthSpend:
    """`get_month_spends` of one tenant. `month_to_date`: its month to date at `now` when the caller
    has read it already (the portal showing the month to date: its figure tree's invoice lines,
    the same sums), else read here; the forecast's hours are read either way."""
    if month_to_date is None:
        return get_month_spends(tenants=[tenant], now=now)[tenant]
    return _month_spend(month_to_date, _window_hours([tenant], now).get(tenant, []), now=now)


def get_month_spends(*, tenants: Collection[str], now: datetime) -> dict[str, MonthSpend]:
    """Month to date and forecast (MonthSpend) of each of `tenants`, in two queries."""
    month_to_date = get_month_to_date_parts(tenants=tenants, now=now)
    hours = _window_hours(tenants, now)
    return {tenant: _month_spend(parts, hours.get(tenant, []), now=now) for tenant, parts in month_to_date.items()}


def _window_hours(tenants: Collection[str], now: datetime) -> dict[str, list[tuple[datetime, Decimal]]]:
    """Each tenant's spend of each complete hour of the forecast's rate window, sorted by hour."""
    window_start, hour = _rate_window(now)
    hours: dict[str, list[tuple[datetime, Decimal]]] = {}
    for row in list_hour_spends(tenants=tenants, since=window_start, until=hour):
        hours.setdefault(row.tenant, []).append((row.hour, row.spend))
    return hours


def get_budget_spends(*, budgets: Collection[Budget], now: datetime,
                      tenant_spends: dict[str, MonthSpend] | None = None) -> dict[int, MonthSpend]:
    """Month to date and forecast of each budget's scope (by budget id): a tenant budget's is its
    tenant's (get_month_spends; `tenant_spends` when the caller has read them already), a namespace's
    or label's the part of the tenant's spend in it, by the same rules, in two queries for them all."""
    budgets = list(budgets)
    tenants = [b.tenant.slug for b in budgets if b.scope == BudgetScope.TENANT]
    known = tenant_spends or {}
    tenant_spends = {**known, **get_month_spends(tenants=[t for t in tenants if t not in known], now=now)}
    spends = {b.pk: tenant_spends[b.tenant.slug] for b in budgets if b.scope == BudgetScope.TENANT}
    scoped = [b for b in budgets if b.scope != BudgetScope.TENANT]
    if not scoped:
        return spends
    scopes = [_spend_scope(b) for b in scoped]
    window_start, hour = _rate_window(now)
    hours: dict[int, list[tuple[datetime, Decimal]]] = {}
    for row in list_scope_hour_spends(scopes=scopes, since=window_start, until=hour):
        hours.setdefault(row.index, []).append((row.hour, row.spend))
    for i, part in enumerate(list_scope_spends(scopes=scopes, start=_month_start(now), now=now)):
        parts = TenantSpend(scoped[i].tenant.slug, part.charge, part.idle_share)
        spends[scoped[i].pk] = _month_spend(parts, hours.get(i, []), now=now)
    return spends


def _spend_scope(budget: Budget) -> SpendScope:
    if budget.scope == BudgetScope.NAMESPACE:
        return SpendScope(tenant=budget.tenant.slug, namespace=budget.namespace)
    return SpendScope(tenant=budget.tenant.slug, label=(budget.label_key, budget.label_value))


def _rate_window(now: datetime) -> tuple[datetime, datetime]:
    """[start, end) of the complete hours the forecast's rate is taken over (MonthSpend)."""
    month_start, _end = month_bounds(month_of(now))
    hour = now.replace(minute=0, second=0, microsecond=0)
    return max(month_start, hour - FORECAST_WINDOW), hour


def _month_spend(parts: TenantSpend, hours: list[tuple[datetime, Decimal]], *, now: datetime) -> MonthSpend:
    """MonthSpend from the month to date and the spend of each hour of the rate window (sorted)."""
    _start, month_end = month_bounds(month_of(now))
    window_start, hour = _rate_window(now)
    rate, rate_hours = _hourly_rate(hours, window_start=window_start, until=hour)
    hours_left = Decimal(max((month_end - now).total_seconds(), 0)) / 3600
    forecast = parts.spend if rate is None else parts.spend + rate * hours_left
    return MonthSpend(parts.tenant, parts.spend, forecast, rate, rate_hours, parts.charge, parts.idle_share,
                      parts.lines)


def _hourly_rate(hours: list[tuple[datetime, Decimal]], *, window_start: datetime,
                 until: datetime) -> tuple[Decimal | None, int]:
    """(mean spend per hour, number of hours) over the complete hours (MonthSpend); `hours`:
    (hour, spend) sorted by hour."""
    if not hours:
        return None, 0
    first = hours[0][0]
    start = first if first == window_start else first + _HOUR  # usage began during `first`
    rate_hours = (until - start) // _HOUR
    if rate_hours <= 0:
        return None, 0
    return sum((spend for at, spend in hours if at >= start), Decimal(0)) / rate_hours, rate_hours


MAX_NOTIFY_EMAILS = 20


def check_notify_emails(text: str) -> str:
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


def check_webhook_url(text: str) -> str:
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
        checked["notify_emails"] = check_notify_emails(str(checked["notify_emails"] or ""))
    if "webhook_url" in checked:
        checked["webhook_url"] = check_webhook_url(str(checked["webhook_url"] or ""))
    return checked


def _check_thresholds(budget: Budget) -> None:
    try:
        soft, hard = Decimal(str(budget.soft_threshold_pct)), Decimal(str(budget.hard_threshold_pct))
    except InvalidOperation:
        return  # not numbers: full_clean names the field
    if soft > hard:
        raise InvalidInput(_("warn at (%(soft)s %%) must not be above enforce at (%(hard)s %%): a budget warns "
                             "before it acts") % {"soft": budget.soft_threshold_pct, "hard": budget.hard_threshold_pct})


def _scope_fields(tenant: Tenant, *, scope: str, namespace: str, label: str) -> dict[str, str]:
    """The fields that say which budget is meant: checked, so a budget never counts a namespace
    that is not the tenant's or a label Kubernetes could not carry."""
    if scope == BudgetScope.TENANT:
        return {"scope": scope, "namespace": "", "label_key": "", "label_value": ""}
    if scope == BudgetScope.NAMESPACE:
        namespace = namespace.strip()
        own = tenant_namespaces(tenant.slug)
        if namespace not in own:
            raise InvalidInput(_("namespace %(namespace)r is not one of %(tenant)s's namespaces (%(own)s); an admin "
                                 "lists a tenant's namespaces on its billing page")
                               % {"namespace": namespace, "tenant": tenant.slug, "own": ", ".join(own) or "—"})
        return {"scope": scope, "namespace": namespace, "label_key": "", "label_value": ""}
    if scope == BudgetScope.LABEL:
        key, sep, value = label.strip().partition("=")
        problem = label_problem(key, value) if sep else "write the label as name=value (team=ml)"
        if problem:
            raise InvalidInput(_("label %(label)r: %(problem)s") % {"label": label, "problem": problem})
        return {"scope": scope, "namespace": "", "label_key": key, "label_value": value}
    raise InvalidInput(_("budget scope %(scope)r is not one of tenant, namespace, label") % {"scope": scope})


def _check_action(budget: Budget) -> None:
    if budget.scope == BudgetScope.LABEL and budget.hard_action != BudgetAction.NOTIFY:
        raise InvalidInput(_("a label budget only notifies: a pod's labels can change while it runs and are known "
                             "only as its node last reported them, so a label cannot decide which pods to throttle, "
                             "block or evict (docs/enforcement.md); choose “notify only”"))


def set_budget(*, tenant_slug: str, values: dict[str, Any], now: datetime, actor_label: str,
               actor_id: int | None = None, scope: str = BudgetScope.TENANT, namespace: str = "",
               label: str = "", must_be_new: bool = False) -> Budget:
    """Create or change a budget, validated and audited in one transaction: the tenant's own
    (`scope` tenant), one of its namespaces' (`namespace`) or its workloads' with a label (`label`,
    name=value; such a budget only notifies, and notifying is its default action). With
    `must_be_new`, a budget that exists already for that scope is refused rather than changed."""
    unknown = set(values) - set(_BUDGET_FIELDS) - {"webhook_secret"}
    if unknown:
        raise InvalidInput(f"unknown budget fields: {', '.join(sorted(unknown))}")
    values = check_budget_values(values)
    with transaction.atomic():
        tenant = Tenant.objects.filter(slug=tenant_slug).first()
        if tenant is None:
            raise InvalidInput(f"no tenant {tenant_slug!r}")
        which = _scope_fields(tenant, scope=scope, namespace=namespace, label=label)
        budget = Budget.objects.select_for_update().filter(tenant=tenant, **which).first()
        if budget is not None and must_be_new:
            raise InvalidInput(_("%(tenant)s already has a budget on %(scope)s; change that one instead")
                               % {"tenant": tenant.slug, "scope": budget.scope_text or _("the whole tenant")})
        before = {f: str(getattr(budget, f)) for f in _BUDGET_FIELDS} if budget else None
        if budget is None:
            budget = Budget(tenant=tenant, **which)
            if scope == BudgetScope.LABEL:
                budget.hard_action = BudgetAction.NOTIFY
        for key, value in values.items():
            setattr(budget, key, value)
        _check_thresholds(budget)
        _check_action(budget)
        try:
            budget.full_clean()
        except ValidationError as exc:
            raise InvalidInput("; ".join(f"{k}: {' '.join(v)}" for k, v in exc.message_dict.items())) from exc
        budget.save()
        after: dict[str, Any] = {f: str(getattr(budget, f)) for f in _BUDGET_FIELDS}
        record_audit_event(
            at=now, actor_id=actor_id, actor_label=actor_label, action="budget.set", object_type="budget",
            object_id=budget_key(budget), before=before,
            after=after if budget.scope == BudgetScope.TENANT else {**after, "scope": budget_scope(budget)},
        )
    return budget


def evaluate_budgets(*, now: datetime) -> list[BudgetEvent]:
    """Recompute every budget's month-to-date state and its forecast-over-budget flag; audit each
    change. Returns what to notify, the caller notifying after commit: each state transition, and
    each crossing of the forecast above the amount (a crossing back is audited, not notified).

    Each budget's row is locked (SELECT ... FOR UPDATE) and compared with what it held: of two
    evaluations at once, the second sees the first one's state and flag and reports no change, so
    a change is audited and notified once."""
    month = month_of(now)
    events: list[BudgetEvent] = []
    budgets = list(Budget.objects.select_related("tenant").order_by("pk"))
    spends = get_budget_spends(budgets=budgets, now=now)
    for budget in budgets:
        spend, forecast = spends[budget.pk].month_to_date, spends[budget.pk].forecast
        state = budget_state_for(spend=spend, amount=budget.amount, soft_pct=budget.soft_threshold_pct,
                                 hard_pct=budget.hard_threshold_pct)
        over = forecast_over_budget_for(forecast=forecast, amount=budget.amount, state=state)
        with transaction.atomic():
            status, _ = BudgetStatus.objects.select_for_update().get_or_create(
                budget=budget, month=month, defaults={"evaluated_at": now, "changed_at": now}
            )
            before, was_over = status.state, status.forecast_over_budget
            status.spend, status.forecast, status.evaluated_at = spend, forecast, now
            status.state, status.forecast_over_budget = state, over
            if state != before:
                status.changed_at = now
                events.append(_state_changed(budget, month=f"{month:%Y-%m}", before=before, after=state,
                                             spend=spend, forecast=forecast, now=now))
            if over != was_over:
                crossing = _forecast_crossed(budget, month=f"{month:%Y-%m}", state=state, over=over,
                                             spend=spend, forecast=forecast, now=now)
                if crossing is not None:
                    events.append(crossing)
            status.save()
    return events


def _state_changed(budget: Budget, *, month: str, before: str, after: str, spend: Decimal, forecast: Decimal,
                   now: datetime) -> BudgetTransition:
    record_audit_event(
        at=now, actor_label="system", action="budget.state_changed", object_type="budget",
        object_id=budget_key(budget), before={"state": before},
        after={"state": after, "spend": amount_text(spend, budget.currency),
               "amount": str(budget.amount), "action": budget.hard_action},
    )
    return BudgetTransition(
        budget_id=budget.pk, tenant=budget.tenant.slug, month=month, before=before, after=after, spend=spend,
        forecast=forecast, amount=budget.amount, currency=budget.currency, action=budget.hard_action,
        owner=budget.owner, at=now, scope=budget_scope(budget),
    )


def _forecast_crossed(budget: Budget, *, month: str, state: str, over: bool, spend: Decimal, forecast: Decimal,
                      now: datetime) -> ForecastOverBudget | None:
    """Audit a change of the flag; the crossing above is returned to be notified. The crossing back
    says why: the forecast fell to or below the amount, or the budget became enforced."""
    after: dict[str, Any] = {"forecast_over_budget": over, "state": state,
                             "forecast": amount_text(forecast, budget.currency), "amount": str(budget.amount)}
    if not over:
        after["reason"] = "enforced" if state == BudgetState.ENFORCED else "forecast within budget"
    record_audit_event(
        at=now, actor_label="system", action=FORECAST_OVER_EVENT if over else FORECAST_CLEARED_EVENT,
        object_type="budget", object_id=budget_key(budget), before={"forecast_over_budget": not over}, after=after,
    )
    if not over:
        return None
    return ForecastOverBudget(
        budget_id=budget.pk, tenant=budget.tenant.slug, month=month, state=state, spend=spend, forecast=forecast,
        amount=budget.amount, currency=budget.currency, owner=budget.owner, at=now, scope=budget_scope(budget),
    )


def sign_webhook(*, secret: str, timestamp: str, body: bytes) -> str:
    """HMAC-SHA256 over "<timestamp>.<body>", hex; receivers recompute it and compare in constant time."""
    mac = hmac.new(secret.encode(), timestamp.encode() + b"." + body, hashlib.sha256)
    return "sha256=" + mac.hexdigest()


def webhook_body(event_payload: dict[str, Any]) -> bytes:
    return json.dumps(event_payload, sort_keys=True, separators=(",", ":")).encode()
