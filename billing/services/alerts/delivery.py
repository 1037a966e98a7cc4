"""Telling people about an alert: e-mail, a signed webhook, a Slack-compatible incoming webhook,
through the same paths as budget notifications (Django's mail backend; the webhook destinations
checked at send time, billing.services.budgets.send_webhook).

Each way is done once per alert: the alert's row is locked while it is sent and the time it was
sent written in the same transaction, so a delivery task that runs twice (a redelivered message,
a retry after the send went through) finds it done. A receiver's 429 or 5xx, or a network error,
raises WebhookRetry and marks nothing, for the task to try again."""

from __future__ import annotations

import logging
import time
from datetime import datetime

from django.core.mail import send_mail
from django.db import transaction

from billing.models import AlertEvent
from billing.services.alerts.messages import alert_payload, email_message, slack_message
from billing.services.audit import record_audit_event
from billing.services.budgets import WebhookRefused, send_webhook, sign_webhook, webhook_body

__all__ = ["CHANNELS", "deliver_alert"]

log = logging.getLogger(__name__)

CHANNELS = ("email", "webhook", "slack")


def deliver_alert(*, event_id: int, channel: str, now: datetime) -> str:
    """Send alert `event_id` by `channel` (email, webhook or slack) unless it was sent that way
    already; returns what happened: sent, already sent, not configured, refused (audited)."""
    if channel not in CHANNELS:
        raise ValueError(f"unknown channel {channel!r}")
    with transaction.atomic():
        event = AlertEvent.objects.select_for_update().select_related("rule").filter(pk=event_id).first()
        if event is None:
            return "no such alert"
        if getattr(event, f"{channel}_sent_at") is not None:
            return "already sent"
        outcome = {"email": _email, "webhook": _webhook, "slack": _slack}[channel](event, now)
        if outcome == "sent":
            setattr(event, f"{channel}_sent_at", now)
            event.save(update_fields=[f"{channel}_sent_at"])
        return outcome


def _email(event: AlertEvent, now: datetime) -> str:
    recipients = [a.strip() for a in event.rule.notify_emails.split(",") if a.strip()]
    if not recipients:
        return "not configured"
    subject, body = email_message(event)
    send_mail(subject, body, None, recipients)
    return "sent"


def _webhook(event: AlertEvent, now: datetime) -> str:
    rule = event.rule
    if not rule.webhook_url:
        return "not configured"
    payload = alert_payload(event)
    body = webhook_body(payload)
    timestamp = str(int(time.time()))
    headers = {"Content-Type": "application/json", "X-VGPU-Timestamp": timestamp, "X-VGPU-Event": payload["event"]}
    if rule.webhook_secret:
        headers["X-VGPU-Signature"] = sign_webhook(secret=rule.webhook_secret, timestamp=timestamp, body=body)
    return _post(event, rule.webhook_url, body=body, headers=headers, now=now)


def _slack(event: AlertEvent, now: datetime) -> str:
    url = event.rule.slack_webhook_url
    if not url:
        return "not configured"
    body = webhook_body(slack_message(event))
    return _post(event, url, body=body, headers={"Content-Type": "application/json"}, now=now, shown_url="slack")


def _post(event: AlertEvent, url: str, *, body: bytes, headers: dict[str, str], now: datetime,
          shown_url: str | None = None) -> str:
    """POST through the one checked path; a refusal (a destination not allowed, a redirect, a 4xx)
    is audited and not retried. `shown_url` stands in for a URL that is itself a credential."""
    try:
        send_webhook(url, body=body, headers=headers)
    except WebhookRefused as exc:
        reason = str(exc).replace(url, shown_url) if shown_url else str(exc)
        log.error("event=alert_delivery_refused alert=%s channel=%s reason=%s", event.pk, shown_url or "webhook", reason)
        record_audit_event(at=now, actor_label="system", action="alert.delivery_refused", object_type="alert_rule",
                           object_id=str(event.rule_id), before=None,
                           after={"event": event.pk, "channel": shown_url or "webhook",
                                  "url": shown_url or url, "reason": reason})
        return "refused"
    return "sent"
