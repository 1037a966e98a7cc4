"""What an alert says, in each way it is told: the e-mail, the signed webhook's JSON, and a Slack
incoming webhook's message (`text`, and `blocks` in Block Kit: a header, a section, the method as
context, and a button to the Explore view). Every one names the scope, the figures, the method and
links to Explore (an absolute link with VGPU_PUBLIC_URL set)."""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal
from typing import Any

from django.conf import settings
from django.utils.translation import gettext

from billing.models import AlertEvent, AlertKind, AlertResource
from billing.money import amount_text

__all__ = ["alert_payload", "email_message", "explore_url", "slack_message", "summary"]

# Slack's limits: a header's text, a section's text, and the blocks of one message.
_HEADER_MAX, _SECTION_MAX = 150, 3000


def explore_url(event: AlertEvent) -> str:
    """The Explore view that shows the alert: absolute with VGPU_PUBLIC_URL, else the path."""
    return settings.VGPU_PUBLIC_URL.rstrip("/") + event.explore_path


def _money(value: Decimal, currency: str) -> str:
    return f"{amount_text(value, currency)} {currency}" if currency else f"{value:.2f}"


def _when(event: AlertEvent) -> str:
    start = event.period_start
    if event.period_end - start == timedelta(hours=1):
        return f"{start:%Y-%m-%d %H:%M}–{event.period_end:%H:%M} UTC"
    if event.period_end - start == timedelta(days=1) and not (start.hour or start.minute):
        return gettext("%(day)s (UTC day)") % {"day": f"{start:%Y-%m-%d}"}
    return f"{start:%Y-%m-%d %H:%M} – {event.period_end:%Y-%m-%d %H:%M} UTC"


def summary(event: AlertEvent) -> tuple[str, str]:
    """(title, one paragraph) in the active language: the page's reader's, or English for the
    e-mail, the webhook and Slack (sent by the worker, whose language is the default)."""
    d = event.details
    if event.kind == AlertKind.SPEND_ANOMALY:
        unit = gettext("hour") if d["granularity"] == "hour" else gettext("day")
        title = gettext("Spend anomaly: %(key)s, %(when)s") % {"key": event.key, "when": _when(event)}
        text = gettext(
            "%(key)s spent %(value)s in %(when)s, against a median of %(median)s for the same %(unit)s of the previous "
            "%(weeks)s weeks: robust z-score %(score)s (alerting at %(threshold)s), %(excess)s above the median "
            "(floor %(floor)s).") % {
            "key": event.key, "value": _money(event.value, event.currency), "when": _when(event),
            "median": _money(event.baseline or Decimal(0), event.currency), "unit": unit, "weeks": d["weeks"],
            "score": d["score"], "threshold": d["threshold"], "excess": _money(Decimal(d["excess"]), event.currency),
            "floor": _money(Decimal(d["floor"]), event.currency)}
    elif event.kind == AlertKind.IDLE_SHARE:
        title = gettext("Idle share %(pct)s %%: %(key)s") % {"pct": d["idle_pct"], "key": event.key}
        text = gettext(
            "%(pct)s %% of the cost of %(key)s's GPUs was idle from %(when)s: %(idle)s idle of %(cost)s (alerting "
            "above %(threshold)s %%, with at least %(floor)s idle).") % {
            "pct": d["idle_pct"], "key": event.key, "when": _when(event),
            "idle": _money(Decimal(d["idle_cost"]), event.currency), "cost": _money(Decimal(d["card_cost"]), event.currency),
            "threshold": d["threshold"], "floor": _money(Decimal(d["floor"]), event.currency)}
    else:
        title = gettext("Over-granting %(ratio)s×: %(key)s") % {"ratio": d["ratio_text"], "key": event.key}
        text = gettext(
            "%(key)s was granted %(ratio)s× the %(resource)s it used from %(when)s (granted %(granted)s, used %(used)s "
            "%(unit)s; alerting above %(threshold)s× for workloads costing at least %(floor)s; it cost %(cost)s).") % {
            "key": event.key, "ratio": d["ratio_text"], "resource": AlertResource(d["resource"]).label, "when": _when(event),
            "granted": d["granted"], "used": d["used"], "unit": d["unit"], "threshold": d["threshold"],
            "floor": _money(Decimal(d["floor"]), event.currency), "cost": _money(Decimal(d["cost"]), event.currency)}
    return f"[{event.rule.name}] {title}", text


def alert_payload(event: AlertEvent) -> dict[str, Any]:
    """The signed webhook's JSON (X-VGPU-Event: alert.<kind>)."""
    title, text = summary(event)
    return {
        "event": f"alert.{event.kind}", "rule": {"id": event.rule_id, "name": event.rule.name}, "key": event.key,
        "period": {"start": event.period_start.isoformat(), "end": event.period_end.isoformat()},
        "value": str(event.value), "baseline": None if event.baseline is None else str(event.baseline),
        "score": None if event.score is None else str(event.score), "currency": event.currency,
        "details": event.details, "title": title, "text": text, "explore_url": explore_url(event),
        "fired_at": event.fired_at.isoformat(),
    }


def email_message(event: AlertEvent) -> tuple[str, str]:
    """(subject, body)."""
    title, text = summary(event)
    return f"[vGPU Ledger] {title}", "\n\n".join([text, gettext("Method: %(method)s") % {"method": event.details["method"]},
                                                   gettext("Open in Explore: %(url)s") % {"url": explore_url(event)}])


def _escape(text: str) -> str:
    """Slack's mrkdwn: &, < and > are control characters; everything else is shown as written."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def slack_message(event: AlertEvent) -> dict[str, Any]:
    """An incoming webhook's message: `text` (the notification and the fallback) and Block Kit
    `blocks`; Slack-compatible receivers (Mattermost, Rocket.Chat) read `text`."""
    title, text = summary(event)
    url = explore_url(event)
    link = f"<{url}|Open in Explore>" if url.startswith(("https://", "http://")) else url
    return {
        "text": _escape(f"{title}: {text}")[:_SECTION_MAX] + f" {link}",
        "blocks": [
            {"type": "header", "text": {"type": "plain_text", "text": title[:_HEADER_MAX], "emoji": False}},
            {"type": "section", "text": {"type": "mrkdwn", "text": _escape(text)[:_SECTION_MAX]}},
            {"type": "context", "elements": [{"type": "mrkdwn",
                                              "text": _escape(f"Method: {event.details['method']}")[:_SECTION_MAX]}]},
            {"type": "section", "text": {"type": "mrkdwn", "text": link}},
        ],
        "unfurl_links": False,
    }
