"""The alerts page's reads: the alerts raised (newest first) and the rules, for finance and admins
(the page checks the role; alerts name every tenant)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from typing import Any

from django.db.models import Max

from billing.models import AlertEvent, AlertGrouping, AlertKind, AlertRule
from billing.services.alerts import CHANNELS, alert_summary

__all__ = ["AlertRuleView", "AlertView", "get_alert_rule", "list_alert_rules", "list_alerts"]


@dataclass(frozen=True)
class AlertView:
    id: int
    rule: str
    kind: str
    kind_label: str
    key: str
    period_start: datetime
    period_end: datetime
    title: str
    text: str
    explore_path: str
    fired_at: datetime
    sent: tuple[str, ...]  # the ways it was told so far: email, webhook, slack


@dataclass(frozen=True)
class AlertRuleView:
    id: int
    name: str
    kind: str
    kind_label: str
    tenant: str  # "" for every tenant
    group_label: str
    threshold: Decimal
    min_amount: Decimal
    currency: str
    destinations: tuple[str, ...]  # email, webhook, slack: the ways it tells
    enabled: bool
    last_fired_at: datetime | None
    initial: dict[str, Any]  # the edit form's values (secrets left empty: never shown back)


def list_alerts(*, limit: int) -> list[AlertView]:
    views = []
    for event in AlertEvent.objects.select_related("rule").order_by("-fired_at", "-pk")[:limit]:
        title, text = alert_summary(event)
        views.append(AlertView(
            id=event.pk, rule=event.rule.name, kind=event.kind, kind_label=str(AlertKind(event.kind).label),
            key=event.key, period_start=event.period_start, period_end=event.period_end, title=title, text=text,
            explore_path=event.explore_path, fired_at=event.fired_at,
            sent=tuple(c for c in CHANNELS if getattr(event, f"{c}_sent_at") is not None),
        ))
    return views


def _view(rule: AlertRule, last_fired_at: datetime | None) -> AlertRuleView:
    destinations = tuple(name for name, on in (("email", rule.notify_emails), ("webhook", rule.webhook_url),
                                               ("slack", rule.slack_webhook_url)) if on)
    initial = {f: getattr(rule, f) for f in ("name", "kind", "group_by", "granularity", "baseline_weeks", "threshold",
                                            "min_amount", "currency", "window_hours", "resource", "notify_emails",
                                            "webhook_url", "enabled")}
    initial["tenant"] = rule.tenant.slug if rule.tenant else ""
    return AlertRuleView(
        id=rule.pk, name=rule.name, kind=rule.kind, kind_label=str(AlertKind(rule.kind).label),
        tenant=rule.tenant.slug if rule.tenant else "", group_label=str(AlertGrouping(rule.group_by).label),
        threshold=rule.threshold, min_amount=rule.min_amount, currency=rule.currency, destinations=destinations,
        enabled=rule.enabled, last_fired_at=last_fired_at, initial=initial,
    )


def list_alert_rules() -> list[AlertRuleView]:
    rules = AlertRule.objects.select_related("tenant").annotate(last_fired_at=Max("events__fired_at")).order_by("name", "pk")
    return [_view(rule, rule.last_fired_at) for rule in rules]


def get_alert_rule(rule_id: int) -> AlertRuleView | None:
    rule = AlertRule.objects.select_related("tenant").annotate(last_fired_at=Max("events__fired_at")).filter(
        pk=rule_id).first()
    return None if rule is None else _view(rule, rule.last_fired_at)
