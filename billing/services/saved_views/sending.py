"""Sending scheduled reports: each due occurrence exactly once, by e-mail through Django's mail
backend (the path budget and alert e-mails take).

The claim is a row: a worker locks the schedule (skipping one another worker holds), finds its
latest occurrence due and unsent, writes that occurrence's ReportSend row and sends, all in one
transaction. The pair (schedule, occurrence) is unique, so a second worker, a retried task or a beat
that fires twice finds the row and sends nothing. A send that fails (the mail server refuses) is
recorded as failed with its error and not retried: the next occurrence is the next try. When the
beat was down over several occurrences, only the latest is sent.

The report is rendered by the caller's `render` (the page's own CSV, billing.web.saved_views), as
the view's owner sees the page now: never more than the owner may see, and refused when the owner
no longer may see the view's tenant."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from datetime import date, datetime
from urllib.parse import parse_qs

from django.conf import settings
from django.core.mail import EmailMessage
from django.db import transaction
from django.utils import translation
from django.utils.translation import gettext as _

from billing.errors import InvalidInput
from billing.models import ReportSchedule, ReportSend, SavedView
from billing.services.audit import record_audit_event
from billing.services.saved_views.recurrence import Recurrence, latest_occurrence, report_period
from billing.services.saved_views.views import owned_view

__all__ = ["Render", "Report", "recurrence_of", "saved_dates", "send_due_reports", "send_now"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Report:
    """A rendered report: the attachment, and the page it came from (path and query string)."""

    filename: str
    content: bytes
    mimetype: str
    link: str


# (the view, the first and last day of the period) -> the report; InvalidInput: the owner may not
# see it (any other exception is recorded as a failure).
Render = Callable[[SavedView, date, date], Report]


def recurrence_of(schedule: ReportSchedule) -> Recurrence:
    return Recurrence(frequency=schedule.frequency, hour=schedule.hour, weekday=schedule.weekday,
                      day_of_month=schedule.day_of_month)


def saved_dates(view: SavedView) -> tuple[date, date]:
    """The dates the view was saved with (its query string's start and end, checked when saved)."""
    query = parse_qs(view.query)
    start, end = query.get("start", [""])[0], query.get("end", [""])[0]
    return date.fromisoformat(start), date.fromisoformat(end)


def send_due_reports(*, now: datetime, render: Render) -> list[dict[str, object]]:
    """Send every schedule's latest occurrence that is due and not yet sent; what was done, per send."""
    outcomes = []
    for schedule_id in ReportSchedule.objects.filter(active_from__lte=now).values_list("pk", flat=True):
        outcome = _send_if_due(schedule_id, now=now, render=render)
        if outcome is not None:
            outcomes.append(outcome)
    return outcomes


def _send_if_due(schedule_id: int, *, now: datetime, render: Render) -> dict[str, object] | None:
    with transaction.atomic():
        schedule = (ReportSchedule.objects.select_for_update(skip_locked=True, of=("self",))
                    .select_related("view").filter(pk=schedule_id).first())
        if schedule is None:  # deleted, or another worker is sending it
            return None
        occurrence = latest_occurrence(recurrence_of(schedule), now)
        if occurrence < schedule.active_from:
            return None
        if ReportSend.objects.filter(schedule=schedule, occurrence=occurrence).exists():
            return None
        send = _send(schedule, occurrence=occurrence, now=now, render=render, trigger="schedule")
    return {"schedule": schedule_id, "occurrence": occurrence.isoformat(), "status": send.status}


def send_now(*, view_id: int, owner_id: int, now: datetime, actor_label: str, render: Render) -> ReportSend:
    """The owner's "Send now": the report of this instant to the schedule's recipients, audited; an
    occurrence of its own, so the schedule's next one is still sent."""
    with transaction.atomic():
        view = owned_view(view_id=view_id, owner_id=owner_id)
        schedule = ReportSchedule.objects.select_for_update().filter(view=view).first()
        if schedule is None:
            raise InvalidInput(_("The view “%(name)s” has no schedule: set one first.") % {"name": view.name})
        send = _send(schedule, occurrence=now, now=now, render=render, trigger=actor_label)
        record_audit_event(at=now, actor_id=owner_id, actor_label=actor_label, action="report_schedule.sent_now",
                           object_type="saved_view", object_id=str(view.pk), before=None,
                           after={"status": send.status, "recipients": send.recipients, "error": send.error})
    return send


def _send(schedule: ReportSchedule, *, occurrence: datetime, now: datetime, render: Render,
          trigger: str) -> ReportSend:
    """Claim the occurrence (its row, in the caller's transaction), render and mail it."""
    view = schedule.view
    start, end = report_period(view.period, on=occurrence.date(), saved=saved_dates(view))
    send = ReportSend.objects.create(schedule=schedule, occurrence=occurrence, at=now,
                                     recipients=list(schedule.recipients), status=ReportSend.Status.FAILED,
                                     period_start=start, period_end=end, trigger=trigger)
    # Mail in the service's language, whoever pressed "Send now" (as alerts' e-mails).
    with translation.override(settings.LANGUAGE_CODE):
        try:
            with transaction.atomic():  # a failed render leaves the claim, rolled back to here
                report = render(view, start, end)
        except InvalidInput as exc:
            send.status, send.error = ReportSend.Status.REFUSED, str(exc)
        except Exception as exc:
            log.exception("event=report_render_failed view=%s", view.pk)
            send.error = f"{type(exc).__name__}: {exc}"
        else:
            send.status, send.error = _mail(view, report, start, end, list(schedule.recipients))
    send.save(update_fields=["status", "error"])
    log.info("event=report_sent view=%s occurrence=%s status=%s", view.pk, occurrence.isoformat(), send.status)
    return send


def _mail(view: SavedView, report: Report, start: date, end: date, recipients: list[str]) -> tuple[str, str]:
    base = settings.VGPU_PUBLIC_URL.rstrip("/")
    subject = _("Report: %(name)s, %(start)s to %(end)s") % {"name": view.name, "start": start.isoformat(),
                                                             "end": end.isoformat()}
    body = _("Your saved view “%(name)s” from %(start)s to %(end)s (UTC days, both included) is attached as %(file)s.\n\n"
             "Open the page: %(link)s\nChange or stop this report: %(manage)s\n") % {
        "name": view.name, "start": start.isoformat(), "end": end.isoformat(), "file": report.filename,
        "link": base + report.link, "manage": f"{base}/views/{view.pk}/"}
    message = EmailMessage(subject, body, None, recipients)
    message.attach(report.filename, report.content, report.mimetype)
    try:
        message.send()
    except OSError as exc:  # smtplib's errors are OSErrors: the server refused or could not be reached
        return ReportSend.Status.FAILED, f"{type(exc).__name__}: {exc}"
    return ReportSend.Status.SENT, ""
