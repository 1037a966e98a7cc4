"""Alerts beyond budgets: spend anomalies, idle share above a threshold, over-granting; the rules
finance and admins set, their evaluation, and telling people by e-mail, signed webhook and a
Slack-compatible incoming webhook (docs/alerts.md).

The facade: code outside this package imports from here, never from its modules."""

from __future__ import annotations

from billing.services.alerts.delivery import CHANNELS, deliver_alert
from billing.services.alerts.detect import AnomalyVerdict, anomaly_verdict, idle_share_pct, over_granting_ratio
from billing.services.alerts.evaluate import CHECKED_PERIODS, evaluate_alerts
from billing.services.alerts.messages import alert_payload, email_message, explore_url, slack_message
from billing.services.alerts.messages import summary as alert_summary
from billing.services.alerts.rules import RULE_FIELDS, save_alert_rule

__all__ = [
    "CHANNELS",
    "CHECKED_PERIODS",
    "RULE_FIELDS",
    "AnomalyVerdict",
    "alert_payload",
    "alert_summary",
    "anomaly_verdict",
    "deliver_alert",
    "email_message",
    "evaluate_alerts",
    "explore_url",
    "idle_share_pct",
    "over_granting_ratio",
    "save_alert_rule",
    "slack_message",
]
