"""Paired report objects: requested by a user or a command, computed by a Celery job that
reports its progress on the row (so a page can show it and survive a reload)."""

from __future__ import annotations

import json
from datetime import datetime, timedelta

from django.db import connection, transaction
from django.utils import timezone
from django.utils.translation import gettext as _

from billing.errors import InvalidInput
from billing.ledger.retention import require_minutes_retained
from billing.models import PairedReport, Tenant
from billing.services.audit import record_audit_event
from billing.services.savings.paired_report import LOOKBACK, compute_paired_report

__all__ = ["IN_FLIGHT_REUSE", "MAX_REPORT_DAYS", "check_report_period", "find_in_flight_report", "request_paired_report",
           "run_paired_report", "tenant_names"]

MAX_REPORT_DAYS = 92
# A report of the same period still pending or running answers a second request for it (a double
# click, two analysts, a page and its reload): the worker computes a period once, not once per
# click, and the second requester watches the first one's progress. One older than this is taken
# for lost (its worker died and the broker did not hand the job on) and a new report is computed.
IN_FLIGHT_REUSE = timedelta(hours=1)
# Serialises requests, so two at once cannot both miss the other's in-flight report.
_REQUEST_LOCK = "paired_report.request"


def request_paired_report(*, start: datetime, end: datetime, now: datetime, actor_label: str,
                          actor_id: int | None = None, join_in_flight: bool = False) -> tuple[PairedReport, bool]:
    """The report for [start, end) and whether it is new. With `join_in_flight`, a pending or
    running report of the same period (younger than IN_FLIGHT_REUSE) is returned instead of a new
    one; only a new one needs its job enqueued."""
    check_report_period(start=start, end=end, now=now)  # said on the form, not later by the job
    with transaction.atomic():
        if join_in_flight:
            with connection.cursor() as cursor:
                cursor.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", [_REQUEST_LOCK])
            in_flight = find_in_flight_report(start=start, end=end, now=now)
            if in_flight is not None:
                return in_flight, False
        report = PairedReport.objects.create(created_at=now, created_by_id=actor_id, period_start=start,
                                             period_end=end)
        record_audit_event(at=now, actor_id=actor_id, actor_label=actor_label, action="paired_report.requested",
                           object_type="paired_report", object_id=str(report.pk), before=None,
                           after={"start": start.isoformat(), "end": end.isoformat()})
    return report, True


def check_report_period(*, start: datetime, end: datetime, now: datetime) -> None:
    """Raise InvalidInput (in the user's language) unless a report of [start, end) may be requested
    at `now`: a page asks before it offers the button, and the request asks again."""
    if end <= start:
        raise InvalidInput(_("The report's end must be after its start."))
    if end - start > timedelta(days=MAX_REPORT_DAYS):
        raise InvalidInput(_("A paired report covers at most %(days)s days.") % {"days": MAX_REPORT_DAYS})
    if start > now:
        raise InvalidInput(_("The report's period starts in the future."))
    require_minutes_retained(start=start, lookback=LOOKBACK)


def find_in_flight_report(*, start: datetime, end: datetime, now: datetime) -> PairedReport | None:
    """The newest report of exactly [start, end) still pending or running and younger than
    IN_FLIGHT_REUSE: the one a request for that period joins."""
    return (PairedReport.objects
            .filter(period_start=start, period_end=end, created_at__gte=now - IN_FLIGHT_REUSE,
                    status__in=(PairedReport.Status.PENDING, PairedReport.Status.RUNNING))
            .order_by("-created_at").first())


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
