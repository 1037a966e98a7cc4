"""Paired report objects: requested by a user or a command, computed by a Celery job that
reports its progress on the row (so a page can show it and survive a reload)."""

from __future__ import annotations

import json
from datetime import datetime, timedelta

from django.db import transaction
from django.utils import timezone

from billing.errors import InvalidInput
from billing.ledger.retention import require_minutes_retained
from billing.models import PairedReport, Tenant
from billing.services.audit import record_audit_event
from billing.services.paired_report import LOOKBACK, compute_paired_report

__all__ = ["MAX_REPORT_DAYS", "request_paired_report", "run_paired_report", "tenant_names"]

MAX_REPORT_DAYS = 92


def request_paired_report(*, start: datetime, end: datetime, now: datetime, actor_label: str,
                          actor_id: int | None = None) -> PairedReport:
    if end <= start:
        raise InvalidInput("the report's end must be after its start")
    if end - start > timedelta(days=MAX_REPORT_DAYS):
        raise InvalidInput(f"a paired report covers at most {MAX_REPORT_DAYS} days")
    if start > now:
        raise InvalidInput("the report's period starts in the future")
    require_minutes_retained(start=start, lookback=LOOKBACK)  # said on the form, not later by the job
    with transaction.atomic():
        report = PairedReport.objects.create(created_at=now, created_by_id=actor_id, period_start=start,
                                             period_end=end)
        record_audit_event(at=now, actor_id=actor_id, actor_label=actor_label, action="paired_report.requested",
                           object_type="paired_report", object_id=str(report.pk), before=None,
                           after={"start": start.isoformat(), "end": end.isoformat()})
    return report


def report_not_queued(*, report_id: int, error: Exception) -> None:
    """The report's job could not be enqueued (the broker is down): say so on the report, which
    would otherwise wait as pending forever."""
    PairedReport.objects.filter(pk=report_id, status=PairedReport.Status.PENDING).update(
        status=PairedReport.Status.FAILED, error=f"the job could not be queued ({error}); request the report again")


def run_paired_report(*, report_id: int) -> PairedReport:
    """Compute a report; a finished one is returned as it is (the job may run twice)."""
    report = PairedReport.objects.get(pk=report_id)
    if report.status == PairedReport.Status.DONE:
        return report
    PairedReport.objects.filter(pk=report_id).update(status=PairedReport.Status.RUNNING, progress_pct=5, error="")

    def progress(pct: int) -> None:
        PairedReport.objects.filter(pk=report_id).update(progress_pct=pct)

    try:
        result = compute_paired_report(start=report.period_start, end=report.period_end, now=timezone.now(),
                                       progress=progress)
    except Exception as exc:
        PairedReport.objects.filter(pk=report_id).update(status=PairedReport.Status.FAILED, error=str(exc)[:2000],
                                                         finished_at=timezone.now())
        raise
    # JSON round trip: numbers as the report computed them, money already as strings.
    PairedReport.objects.filter(pk=report_id).update(
        status=PairedReport.Status.DONE, progress_pct=100, result=json.loads(json.dumps(result)),
        finished_at=timezone.now(),
    )
    return PairedReport.objects.get(pk=report_id)


def tenant_names() -> dict[str, str]:
    """Tenant slug → display name, for the report's chargeback rows (a report covers every tenant)."""
    return dict(Tenant.objects.values_list("slug", "name"))
