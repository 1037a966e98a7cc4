"""Celery entry points. Thin, idempotent, ids / ISO dates in, never ORM objects."""

from __future__ import annotations

from datetime import timedelta

from celery import shared_task
from django.conf import settings
from django.db import OperationalError, transaction
from django.utils import timezone

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
