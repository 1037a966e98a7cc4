"""Celery entry points. Thin, idempotent, ids / ISO dates in, never ORM objects."""

from __future__ import annotations

from datetime import timedelta

from celery import shared_task
from django.conf import settings
from django.db import OperationalError, transaction
from django.utils import timezone

from billing.services.invoicing import close_period as _close_period
from billing.services.invoicing import parse_month
from billing.services.partitions import ensure_raw_partitions as _ensure_raw_partitions
from billing.services.rollup import rollup_usage as _rollup_usage


@shared_task(
    name="billing.tasks.rollup_usage",
    acks_late=True,
    autoretry_for=(OperationalError,),
    retry_backoff=True,
    max_retries=5,
)
def rollup_usage() -> dict:
    result = _rollup_usage(now=timezone.now())
    return {"batches": result.batches, "gpu_minutes": result.gpu_minutes, "gpu_hours": result.gpu_hours,
            "skipped": result.skipped}


@shared_task(
    name="billing.tasks.ensure_raw_partitions",
    acks_late=True,
    autoretry_for=(OperationalError,),
    retry_backoff=True,
    max_retries=5,
)
def ensure_raw_partitions() -> list[str]:
    today = timezone.now().date()
    days = [today + timedelta(days=i) for i in range(-1, settings.VGPU_PARTITION_DAYS_AHEAD + 1)]
    with transaction.atomic():
        created = _ensure_raw_partitions(days)
    return [d.isoformat() for d in created]


@shared_task(
    name="billing.tasks.close_period",
    acks_late=True,
    autoretry_for=(OperationalError,),
    retry_backoff=True,
    max_retries=5,
)
def close_period(month: str) -> dict[str, object]:
    """Close a month given as YYYY-MM; rerunning after a crash resumes where it stopped."""
    result = _close_period(month=parse_month(month), now=timezone.now())
    return {"month": month, "finalized": result.invoices_finalized, "already_final": result.invoices_already_final,
            "already_closed": result.already_closed}


@shared_task(name="billing.tasks.close_previous_month", acks_late=True)
def close_previous_month() -> dict[str, object]:
    """Beat entry: on the 2nd of each month close the month before (late usage then becomes adjustments)."""
    first = timezone.now().date().replace(day=1)
    previous = (first - timedelta(days=1)).replace(day=1)
    return close_period(f"{previous:%Y-%m}")
