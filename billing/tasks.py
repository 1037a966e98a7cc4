"""Celery entry points. Thin, idempotent, ids / ISO dates in, never ORM objects."""

from __future__ import annotations

import logging
import smtplib
import time
from datetime import timedelta
from pathlib import Path

from celery import shared_task
from django.conf import settings
from django.core.mail import send_mail
from django.db import OperationalError
from django.utils import timezone

from billing.calendar import month_of, parse_month, previous_month
from billing.ledger.partitions import ensure_minute_partitions as _ensure_minute_partitions
from billing.ledger.partitions import ensure_raw_partitions as _ensure_raw_partitions
from billing.ledger.retention import apply_retention as _apply_retention
from billing.ledger.statistics import analyze_stale_partitions as _analyze_stale_partitions
from billing.models import Budget
from billing.services.alerts import CHANNELS
from billing.services.alerts import deliver_alert as _deliver_alert
from billing.services.alerts import evaluate_alerts as _evaluate_alerts
from billing.services.budgets import (
    FORECAST_OVER_EVENT,
    WebhookRefused,
    WebhookRetry,
    budget_key,
    record_webhook_refusal,
    send_webhook,
    sign_webhook,
    webhook_body,
)
from billing.services.budgets import evaluate_budgets as _evaluate_budgets
from billing.services.exports import deliver_focus_dataset as _deliver_focus_dataset
from billing.services.exports import write_changing_months
from billing.services.fleet import kube_from_settings, run_execution
from billing.services.fleet import propose_rebalance as _propose
from billing.services.ingest import run_rollup
from billing.services.invoicing import close_period as _close_period
from billing.services.saved_views import send_due_reports
from billing.services.savings import run_paired_report as _run_paired_report
from billing.web.saved_views import render_report

log = logging.getLogger(__name__)

@shared_task(name="billing.tasks.rollup_usage", acks_late=True)
def rollup_usage() -> list[str]:
    """Beat entry: fan the cycle out into VGPU_ROLLUP_SHARDS shard tasks, which any number of
    workers run in parallel (billing.ledger.rollup: no global lock, one worker per node at a time).
    Each task carries its own (shard, shards), so a change of N between beat and workers, or a
    redelivered task, only makes some node's lock be tried twice."""
    shards = settings.VGPU_ROLLUP_SHARDS
    return [rollup_shard.delay(shard, shards).id for shard in range(shards)]


@shared_task(
    name="billing.tasks.rollup_shard",
    acks_late=True,
    autoretry_for=(OperationalError,),
    retry_backoff=True,
    max_retries=5,
)
def rollup_shard(shard: int, shards: int) -> dict[str, object]:
    result = run_rollup(now=timezone.now(), shard=shard, shards=shards, max_batches=settings.VGPU_ROLLUP_MAX_BATCHES)
    return {"shard": shard, "shards": shards, "nodes": result.nodes, "batches": result.batches,
            "gpu_minutes": result.gpu_minutes, "gpu_hours": result.gpu_hours, "quarantined": result.quarantined,
            "skipped": result.skipped}


@shared_task(
    name="billing.tasks.ensure_raw_partitions",
    acks_late=True,
    autoretry_for=(OperationalError,),
    retry_backoff=True,
    max_retries=5,
)
def ensure_raw_partitions() -> list[str]:
    """Hourly: the raw and minute day partitions from yesterday to VGPU_PARTITION_DAYS_AHEAD days
    ahead (the name is kept for running beats' schedules). Returns the days created, ISO."""
    today = timezone.now().date()
    days = [today + timedelta(days=i) for i in range(-1, settings.VGPU_PARTITION_DAYS_AHEAD + 1)]
    # Each table's days in a transaction of their own (billing.ledger.partitions): one transaction
    # would hold the raw days' locks while it waited for the minute tables' partition lock.
    created = set(_ensure_raw_partitions(days)) | set(_ensure_minute_partitions(days))
    return [d.isoformat() for d in sorted(created)]


@shared_task(
    name="billing.tasks.apply_retention",
    acks_late=True,
    autoretry_for=(OperationalError,),
    retry_backoff=True,
    max_retries=5,
)
def apply_retention() -> dict[str, list[str] | int | str | None]:
    """Hourly: drop raw and minute day partitions past their retention, keeping those that hold
    samples of pending or quarantined batches, then the batches whose raw days are gone and the
    workloads whose minute days are, then the days of hours past theirs. Idempotent: a second run
    finds nothing to drop."""
    result = _apply_retention(now=timezone.now())
    hours = result.hours
    return {"dropped": list(result.dropped), "held": [h.name for h in result.held],
            "lock_busy": list(result.lock_busy), "batches_pruned": result.batches_pruned,
            "workloads_pruned": result.workloads_pruned,
            "hour_days_pruned": [d.isoformat() for d in hours.days] if hours else [],
            "hour_rows_pruned": hours.usage_rows + hours.gpu_rows if hours else 0,
            "hour_day_held": hours.held_day.isoformat() if hours and hours.held_day else None,
            "hour_days_kept": [d.isoformat() for d, _ in hours.kept_days] if hours else []}


@shared_task(name="billing.tasks.analyze_ledger_partitions", acks_late=True)
def analyze_ledger_partitions() -> list[str]:
    """Every 5 minutes: ANALYZE the raw and minute partitions with missing or stale statistics."""
    return [a.name for a in _analyze_stale_partitions()]


@shared_task(
    name="billing.tasks.close_period",
    acks_late=True,
    autoretry_for=(OperationalError,),
    retry_backoff=True,
    max_retries=5,
)
def close_period(month: str) -> dict[str, object]:
    """Close a month given as YYYY-MM (beat, or the periods page once a close is requested); the
    service writes progress on the period row. Rerunning after a crash or a failure resumes."""
    result = _close_period(month=parse_month(month), now=timezone.now())
    return {"month": month, "finalized": result.invoices_finalized, "already_final": result.invoices_already_final,
            "already_closed": result.already_closed}


@shared_task(name="billing.tasks.close_previous_month", acks_late=True)
def close_previous_month() -> dict[str, object]:
    """Beat entry: on the 2nd of each month close the month before (late usage then becomes adjustments)."""
    previous = previous_month(month_of(timezone.now()))
    return close_period(f"{previous:%Y-%m}")


@shared_task(name="billing.tasks.write_focus_dataset", acks_late=True, autoretry_for=(OperationalError,),
             retry_backoff=True, max_retries=5)
def write_focus_dataset() -> list[dict[str, object]]:
    """Daily: the fleet FOCUS dataset of this month to date and of every month still taking late
    usage (docs/exports.md). Off, and says so in the log, while VGPU_FOCUS_DATASET_DIR is empty."""
    if not settings.VGPU_FOCUS_DATASET_DIR:
        log.info("fleet FOCUS dataset not written: VGPU_FOCUS_DATASET_DIR is not set")
        return []
    written = write_changing_months(Path(settings.VGPU_FOCUS_DATASET_DIR), now=timezone.now(),
                                    horizon=settings.VGPU_LATE_USAGE_HORIZON)
    return [w.summary() for w in written]


@shared_task(name="billing.tasks.deliver_focus_dataset", acks_late=True, autoretry_for=(OperationalError,),
             retry_backoff=True, max_retries=5)
def deliver_focus_dataset(destination_id: int | None = None, requested_by: str = "") -> list[dict[str, object]]:
    """Daily (and on a destination's "Deliver now"): the fleet FOCUS dataset of every month that can
    still change, to every enabled object-storage destination or to `destination_id` (docs/exports.md).
    Idempotent: what a bucket holds already is not sent again."""
    deliveries = _deliver_focus_dataset(now=timezone.now(), horizon=settings.VGPU_LATE_USAGE_HORIZON,
                                        trigger=requested_by or "schedule",
                                        destination_ids=None if destination_id is None else [destination_id])
    return [{"destination": d.destination_id, "month": f"{d.month:%Y-%m}", "status": d.status,
             "objects": len(d.objects_written)} for d in deliveries]


@shared_task(name="billing.tasks.send_scheduled_reports", acks_late=True, autoretry_for=(OperationalError,),
             retry_backoff=True, max_retries=5)
def send_scheduled_reports() -> list[dict[str, object]]:
    """Every few minutes: each saved view's report that is due and not yet sent (docs/saved-views.md).
    Exactly once per occurrence, however often this runs or how many workers run it."""
    return send_due_reports(now=timezone.now(), render=render_report)


@shared_task(name="billing.tasks.evaluate_budgets", acks_late=True, autoretry_for=(OperationalError,),
             retry_backoff=True, max_retries=5)
def evaluate_budgets() -> list[dict[str, object]]:
    """Every minute: move budgets between ok / warned / enforced, mark those whose forecast is over
    the amount, and notify on each change of state and each crossing of the forecast above the amount."""
    events = _evaluate_budgets(now=timezone.now())
    for e in events:
        payload = e.payload()
        send_budget_email.delay(e.budget_id, payload)
        deliver_budget_webhook.delay(e.budget_id, payload)
    return [e.payload() for e in events]


@shared_task(name="billing.tasks.send_budget_email", acks_late=True,
             autoretry_for=(smtplib.SMTPException, OSError), retry_backoff=True, max_retries=8)
def send_budget_email(budget_id: int, payload: dict[str, object]) -> int:
    budget = Budget.objects.select_related("tenant").filter(pk=budget_id).first()
    if budget is None or not budget.notify_emails.strip():
        return 0
    recipients = [a.strip() for a in budget.notify_emails.split(",") if a.strip()]
    if payload["event"] == FORECAST_OVER_EVENT:
        subject, lines = _forecast_over_mail(budget, payload)
        return send_mail(subject, "\n".join(lines), None, recipients)
    subject = f"[vGPU Ledger] Budget of {_budget_name(budget)}: {payload['to']}"
    lines = [
        f"The GPU budget of {_budget_name(budget)} ({budget.tenant.slug}) moved from {payload['from']} "
        f"to {payload['to']} for {payload['month']}.",
        f"Month-to-date spend: {payload['spend']} {payload['currency']} of {payload['amount']} "
        f"(forecast to month end: {payload['forecast']}).",
    ]
    if payload.get("action"):
        lines.append(f"Enforcement action: {payload['action']}.")
    lines.append(f"To raise the budget, contact {budget.owner}.")
    return send_mail(subject, "\n".join(lines), None, recipients)


def _budget_name(budget: Budget) -> str:
    """Whose budget, as a mail names it: "Acme Robotics", "namespace acme-prod of Acme Robotics"."""
    return f"{budget.scope_text} of {budget.tenant.name}" if budget.scope_text else budget.tenant.name


def _forecast_over_mail(budget: Budget, payload: dict[str, object]) -> tuple[str, list[str]]:
    """The forecast crossed above the budget: a warning, nothing is enforced by it."""
    subject = f"[vGPU Ledger] Budget of {_budget_name(budget)}: forecast over budget"
    lines = [
        f"The GPU budget of {_budget_name(budget)} ({budget.tenant.slug}) is forecast to be exceeded in "
        f"{payload['month']}: forecast to month end {payload['forecast']} {payload['currency']}, "
        f"budget {payload['amount']} {payload['currency']}.",
        f"Month-to-date spend: {payload['spend']} {payload['currency']}; the budget's state is {payload['state']} "
        "and nothing is enforced until the month-to-date spend reaches the enforce threshold.",
        f"To raise the budget, contact {budget.owner}.",
    ]
    return subject, lines


@shared_task(name="billing.tasks.deliver_budget_webhook", acks_late=True, autoretry_for=(WebhookRetry,),
             retry_backoff=True, retry_jitter=True, max_retries=8)
def deliver_budget_webhook(budget_id: int, payload: dict[str, object]) -> int | None:
    """POST the HMAC-signed event to the destination checked at send time (billing.services.budgets.send_webhook);
    retried with backoff on network errors, 429 and 5xx. A refused destination or a redirect is
    audited and not retried: only an admin can change either."""
    budget = Budget.objects.select_related("tenant").filter(pk=budget_id).first()
    if budget is None or not budget.webhook_url:
        return None
    url, event = budget.webhook_url, str(payload["event"])
    body = webhook_body(payload)
    timestamp = str(int(time.time()))
    headers = {"Content-Type": "application/json", "X-VGPU-Timestamp": timestamp, "X-VGPU-Event": event}
    if budget.webhook_secret:
        headers["X-VGPU-Signature"] = sign_webhook(secret=budget.webhook_secret, timestamp=timestamp, body=body)
    try:
        status = send_webhook(url, body=body, headers=headers)
    except WebhookRefused as exc:
        _refuse_webhook(budget_key(budget), url, event, str(exc))
        return exc.status
    if status >= 400:
        log.error("event=budget_webhook_rejected url=%s status=%s", url, status)
    return status


@shared_task(name="billing.tasks.evaluate_alerts", acks_late=True, autoretry_for=(OperationalError,),
             retry_backoff=True, max_retries=5)
def evaluate_alerts() -> list[int]:
    """Every VGPU_ALERTS_EVERY_S (5 minutes): evaluate the alert rules (billing.services.alerts) and
    deliver each alert raised once per way its rule tells. Run twice on the same ledger it raises
    nothing the second time."""
    raised = _evaluate_alerts(now=timezone.now())
    for event_id in raised:
        for channel in CHANNELS:
            deliver_alert.delay(event_id, channel)
    return raised


@shared_task(name="billing.tasks.deliver_alert", acks_late=True,
             autoretry_for=(WebhookRetry, smtplib.SMTPException, OSError), retry_backoff=True, retry_jitter=True,
             max_retries=8)
def deliver_alert(event_id: int, channel: str) -> str:
    """Tell people of one alert by one way (email, webhook, slack), unless that was done already:
    run twice, it sends once."""
    return _deliver_alert(event_id=event_id, channel=channel, now=timezone.now())


def _refuse_webhook(tenant: str, url: str, event: str, reason: str) -> None:
    log.error("event=budget_webhook_refused tenant=%s url=%s reason=%s", tenant, url, reason)
    record_webhook_refusal(tenant=tenant, url=url, event=event, reason=reason, now=timezone.now())


@shared_task(name="billing.tasks.run_paired_report", acks_late=True, autoretry_for=(OperationalError,),
             retry_backoff=True, max_retries=3)
def run_paired_report(report_id: int) -> dict[str, object]:
    report = _run_paired_report(report_id=report_id)
    return {"report": report.pk, "status": report.status}


@shared_task(name="billing.tasks.propose_rebalance", acks_late=True, autoretry_for=(OperationalError,),
             retry_backoff=True, max_retries=3)
def propose_rebalance() -> dict[str, object]:
    """Hourly dry run: store a plan of at most VGPU_REBALANCE_MAX_MOVES moves (nothing executed).
    Running it twice on the same fleet stores one plan."""
    plan = _propose(now=timezone.now(), max_moves=settings.VGPU_REBALANCE_MAX_MOVES,
                    window=timedelta(hours=settings.VGPU_REBALANCE_WINDOW_HOURS))
    if plan is None:
        return {"plan": None}
    return {"plan": plan.pk, "moves": len(plan.moves), "gpus_freed": plan.gpus_freed}


# A plan's calls each time out after 30 s; 10 moves and their nodes stay well within this. Past
# it Celery raises SoftTimeLimitExceeded in the task, and the plan ends failed with that reason.
_EXECUTE_REBALANCE_LIMIT_S = 600


@shared_task(name="billing.tasks.execute_rebalance", acks_late=True, soft_time_limit=_EXECUTE_REBALANCE_LIMIT_S)
def execute_rebalance(plan_id: int) -> dict[str, object]:
    """Execute an approved plan; a finished plan is left as it is (safe to run twice). However it
    fails (no API client, an API error, the time limit), the plan ends failed, saying why."""
    plan = run_execution(plan_id, connect=kube_from_settings, now=timezone.now(),
                         window=timedelta(hours=settings.VGPU_REBALANCE_WINDOW_HOURS))
    return {"plan": plan.pk, "status": plan.status}
