"""Budgets: spend that acts. Month-to-date spend and its forecast (the one definition every page
shares), budget states and their transitions, the notifications (e-mail, signed webhooks to checked
destinations), and the admission webhook that refuses new GPU pods of an enforced tenant.

The facade: code outside this package imports from here, never from its modules."""

from __future__ import annotations

from billing.services.budgets.admission import AdmissionDecision, review_pod
from billing.services.budgets.spend import (
    FORECAST_OVER_EVENT,
    BudgetEvent,
    ForecastOverBudget,
    MonthSpend,
    budget_key,
    budget_scope,
    check_notify_emails,
    check_webhook_url,
    evaluate_budgets,
    get_budget_spends,
    get_month_spend,
    get_month_spends,
    get_month_to_date_parts,
    set_budget,
    shown_spend,
    sign_webhook,
    webhook_body,
)
from billing.services.budgets.webhooks import (
    DestinationRefused,
    WebhookRefused,
    WebhookRetry,
    forbidden_reason,
    parse_allow_list,
    post_to_destination,
    record_webhook_refusal,
    resolve_destination,
    send_webhook,
)

__all__ = [
    "FORECAST_OVER_EVENT",
    "AdmissionDecision",
    "BudgetEvent",
    "DestinationRefused",
    "ForecastOverBudget",
    "MonthSpend",
    "WebhookRefused",
    "WebhookRetry",
    "budget_key",
    "budget_scope",
    "check_notify_emails",
    "check_webhook_url",
    "evaluate_budgets",
    "forbidden_reason",
    "get_budget_spends",
    "get_month_spend",
    "get_month_spends",
    "get_month_to_date_parts",
    "parse_allow_list",
    "post_to_destination",
    "record_webhook_refusal",
    "resolve_destination",
    "review_pod",
    "send_webhook",
    "set_budget",
    "shown_spend",
    "sign_webhook",
    "webhook_body",
]
