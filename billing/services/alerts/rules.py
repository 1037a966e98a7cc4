"""Alert rules: created and changed by finance and admins, validated for their kind, audited in
the same transaction (docs/alerts.md, Rules)."""

from __future__ import annotations

from datetime import datetime
from decimal import Decimal, InvalidOperation
from typing import Any
from urllib.parse import urlsplit

from django.core.exceptions import ValidationError
from django.db import transaction
from django.utils.translation import gettext as _

from billing.currencies import check_currency
from billing.errors import InvalidInput
from billing.models import AlertGranularity, AlertGrouping, AlertKind, AlertResource, AlertRule, Tenant
from billing.services.audit import record_audit_event
from billing.services.budgets import check_notify_emails, check_webhook_url
from billing.services.input_limits import text_problem

__all__ = ["RULE_FIELDS", "save_alert_rule"]

RULE_FIELDS = ("name", "kind", "tenant", "group_by", "granularity", "baseline_weeks", "threshold", "min_amount",
               "currency", "window_hours", "resource", "notify_emails", "webhook_url", "webhook_secret",
               "slack_webhook_url", "enabled")
# What each kind may be grouped by, and the range of its threshold.
_GROUPINGS = {
    AlertKind.SPEND_ANOMALY: (AlertGrouping.TENANT, AlertGrouping.NAMESPACE),
    AlertKind.IDLE_SHARE: (AlertGrouping.FLEET, AlertGrouping.NODE),
    AlertKind.OVER_GRANTING: (AlertGrouping.CONTROLLER,),
}
_THRESHOLDS = {
    AlertKind.SPEND_ANOMALY: (Decimal(1), Decimal(100)),  # a robust z-score
    AlertKind.IDLE_SHARE: (Decimal("0.1"), Decimal(100)),  # percent
    AlertKind.OVER_GRANTING: (Decimal("1.1"), Decimal(1000)),  # granted ÷ used
}


def _decimal(values: dict[str, Any], name: str) -> Decimal:
    try:
        value = Decimal(str(values[name]))
    except (KeyError, InvalidOperation):
        raise InvalidInput(_("%(field)s: a number is required") % {"field": name}) from None
    if not value.is_finite():
        raise InvalidInput(_("%(field)s: a number is required") % {"field": name})
    return value


def _check_kind(values: dict[str, Any]) -> None:
    """The rules of each kind, naming the field that breaks one."""
    kind = values["kind"]
    if kind not in _GROUPINGS:
        raise InvalidInput(_("kind: one of %(kinds)s") % {"kinds": ", ".join(AlertKind.values)})
    if values["group_by"] not in _GROUPINGS[kind]:
        raise InvalidInput(_("group by: a %(kind)s alert is grouped by %(choices)s")
                           % {"kind": AlertKind(kind).label, "choices": ", ".join(_GROUPINGS[kind])})
    low, high = _THRESHOLDS[kind]
    if not low <= values["threshold"] <= high:
        raise InvalidInput(_("threshold: for a %(kind)s alert, from %(low)s to %(high)s")
                           % {"kind": AlertKind(kind).label, "low": low, "high": high})
    if values["min_amount"] < 0 or (kind == AlertKind.SPEND_ANOMALY and values["min_amount"] <= 0):
        raise InvalidInput(_("minimum amount: above zero for a spend anomaly (the floor below which no spike pages "
                             "anyone), at least zero otherwise"))
    if kind == AlertKind.IDLE_SHARE and values["tenant"] is not None:
        raise InvalidInput(_("tenant: idle capacity is the fleet's, not a tenant's; leave it empty"))
    if values["granularity"] not in AlertGranularity.values:
        raise InvalidInput(_("granularity: hour or day"))
    if values["resource"] not in AlertResource.values:
        raise InvalidInput(_("resource: memory or sm"))


def _checked(values: dict[str, Any]) -> dict[str, Any]:
    unknown = set(values) - set(RULE_FIELDS)
    if unknown:
        raise InvalidInput(f"unknown alert rule fields: {', '.join(sorted(unknown))}")
    checked = {k: ("" if v is None else v) for k, v in values.items()}
    name = str(checked.get("name", "")).strip()
    if not name or len(name) > 100 or text_problem(name):
        raise InvalidInput(_("name: 1 to 100 characters"))
    checked["name"] = name
    slug = checked.get("tenant") or None
    checked["tenant"] = Tenant.objects.filter(slug=slug).first() if slug else None
    if slug and checked["tenant"] is None:
        raise InvalidInput(_("tenant: there is no tenant %(slug)r") % {"slug": slug})
    for field in ("threshold", "min_amount"):
        checked[field] = _decimal(checked, field)
    checked["currency"] = check_currency(str(checked.get("currency", "")))
    checked["notify_emails"] = check_notify_emails(str(checked.get("notify_emails") or ""))
    for field in ("webhook_url", "slack_webhook_url"):
        checked[field] = check_webhook_url(str(checked.get(field) or ""))
    _check_kind(checked)
    return checked


def _snapshot(rule: AlertRule) -> dict[str, Any]:
    """The rule as the audit log keeps it: the webhook secret never, the Slack URL (its credential)
    by its host only."""
    snapshot = {f: str(getattr(rule, f)) for f in RULE_FIELDS if f not in ("tenant", "webhook_secret",
                                                                          "slack_webhook_url")}
    snapshot["tenant"] = rule.tenant.slug if rule.tenant else ""
    slack = rule.slack_webhook_url
    snapshot["slack_webhook_url"] = f"{urlsplit(slack).scheme}://{urlsplit(slack).hostname}/…" if slack else ""
    return snapshot


def save_alert_rule(*, values: dict[str, Any], now: datetime, actor_label: str, actor_id: int | None = None,
                    rule_id: int | None = None) -> AlertRule:
    """Create a rule (`rule_id` None) or change one, validated and audited (`alert_rule.created`,
    `alert_rule.changed`) in one transaction; InvalidInput names what is wrong and nothing changes.
    On a change, an empty webhook secret or Slack URL keeps the one stored (neither is shown back)
    and None removes it."""
    with transaction.atomic():
        rule = None
        if rule_id is not None:
            rule = AlertRule.objects.select_for_update().filter(pk=rule_id).first()
            if rule is None:
                raise InvalidInput(_("there is no alert rule %(id)s") % {"id": rule_id})
            given = values
            values = {**{f: getattr(rule, f) for f in RULE_FIELDS if f != "tenant"},
                      "tenant": rule.tenant.slug if rule.tenant else "", **values}
            for secret in ("webhook_secret", "slack_webhook_url"):
                if given.get(secret, "") == "":
                    values[secret] = getattr(rule, secret)
                elif given[secret] is None:
                    values[secret] = ""
        checked = _checked(values)
        before = _snapshot(rule) if rule else None
        rule = rule or AlertRule(created_at=now)
        for field, value in checked.items():
            setattr(rule, field, value)
        rule.updated_at = now
        try:
            rule.full_clean()
        except ValidationError as exc:
            raise InvalidInput("; ".join(f"{k}: {' '.join(v)}" for k, v in exc.message_dict.items())) from exc
        rule.save()
        record_audit_event(at=now, actor_id=actor_id, actor_label=actor_label,
                           action="alert_rule.changed" if before else "alert_rule.created", object_type="alert_rule",
                           object_id=str(rule.pk), before=before, after=_snapshot(rule))
    return rule
