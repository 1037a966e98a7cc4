"""Saved views and their schedules: create, rename, delete, schedule, unschedule. Each is the
owner's own (a view of another user is not found, like one that does not exist) and each change is
audited in its transaction. The page and query string arrive checked by the page's own form
(billing.web.saved_views); these check the rest: names, the schedule's fields, recipients."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from datetime import datetime
from typing import Any
from urllib.parse import parse_qsl

from django.core.exceptions import ValidationError
from django.core.validators import validate_email
from django.db import IntegrityError, transaction
from django.utils.translation import gettext as _

from billing.errors import InvalidInput
from billing.models import ReportSchedule, SavedView
from billing.services.audit import record_audit_event
from billing.services.input_limits import text_problem
from billing.services.saved_views.recurrence import FREQUENCIES, PERIODS

__all__ = ["MAX_RECIPIENTS", "ScheduleInput", "create_view", "delete_schedule", "delete_view", "owned_view",
           "rename_view", "set_schedule"]

MAX_RECIPIENTS = 20
MAX_NAME = 100


@dataclass(frozen=True)
class ScheduleInput:
    frequency: str
    hour: int
    weekday: int | None
    day_of_month: int | None
    format: str
    recipients: tuple[str, ...]


def owned_view(*, view_id: int, owner_id: int, lock: bool = False) -> SavedView:
    """The owner's view, or InvalidInput: another user's view is answered like a missing one."""
    views = SavedView.objects.filter(pk=view_id, owner_id=owner_id)
    view = (views.select_for_update() if lock else views).first()
    if view is None:
        raise InvalidInput(_("No saved view with id %(id)s.") % {"id": view_id})
    return view


def _check_name(name: str) -> str:
    name = " ".join(name.split())
    if text_problem(name) or any(ord(c) < 32 for c in name):  # the C0 control characters
        raise InvalidInput(_("name: no control characters."))
    if not name:
        raise InvalidInput(_("name: give the view a name."))
    if len(name) > MAX_NAME:
        raise InvalidInput(_("name: at most %(n)s characters.") % {"n": MAX_NAME})
    return name


def _view_fields(view: SavedView) -> dict[str, Any]:
    # The query's parameters one field each (a view's query never repeats one), so the audit log
    # shows a saved date as a date in the reader's language rather than inside a query string.
    return {"name": view.name, "path": view.path, "period": view.period,
            **{f"query.{key}": value for key, value in parse_qsl(view.query, keep_blank_values=True)}}


def _save_unique(view: SavedView) -> None:
    # The unique constraint decides, not a check before it: two tabs saving one name at once.
    try:
        with transaction.atomic():
            view.save()
    except IntegrityError as exc:
        raise InvalidInput(_("name: you already have a view called “%(name)s”.") % {"name": view.name}) from exc


def create_view(*, owner_id: int, name: str, path: str, query: str, period: str, now: datetime,
                actor_label: str) -> SavedView:
    if period not in PERIODS:
        raise ValueError(f"unknown period {period!r}")
    view = SavedView(owner_id=owner_id, name=_check_name(name), path=path, query=query, period=period,
                     created_at=now, updated_at=now)
    with transaction.atomic():
        _save_unique(view)
        record_audit_event(at=now, actor_id=owner_id, actor_label=actor_label, action="saved_view.created",
                           object_type="saved_view", object_id=str(view.pk), before=None, after=_view_fields(view))
    return view


def rename_view(*, view_id: int, owner_id: int, name: str, now: datetime, actor_label: str) -> SavedView:
    with transaction.atomic():
        view = owned_view(view_id=view_id, owner_id=owner_id, lock=True)
        before = _view_fields(view)
        view.name, view.updated_at = _check_name(name), now
        _save_unique(view)
        record_audit_event(at=now, actor_id=owner_id, actor_label=actor_label, action="saved_view.renamed",
                           object_type="saved_view", object_id=str(view.pk), before=before, after=_view_fields(view))
    return view


def delete_view(*, view_id: int, owner_id: int, now: datetime, actor_label: str) -> None:
    """The view goes with its schedule and its history (the audit log keeps what they were)."""
    with transaction.atomic():
        view = owned_view(view_id=view_id, owner_id=owner_id, lock=True)
        before = _view_fields(view)
        schedule = ReportSchedule.objects.filter(view=view).first()
        if schedule is not None:
            before["schedule"] = _schedule_fields(schedule)
        record_audit_event(at=now, actor_id=owner_id, actor_label=actor_label, action="saved_view.deleted",
                           object_type="saved_view", object_id=str(view.pk), before=before, after=None)
        view.delete()


def _check_recipients(recipients: tuple[str, ...]) -> list[str]:
    addresses = list(dict.fromkeys(a.strip() for a in recipients if a.strip()))
    if not addresses:
        raise InvalidInput(_("recipients: give at least one e-mail address."))
    if len(addresses) > MAX_RECIPIENTS:
        raise InvalidInput(_("recipients: at most %(n)s addresses.") % {"n": MAX_RECIPIENTS})
    for address in addresses:
        try:
            validate_email(address)
        except ValidationError as exc:
            raise InvalidInput(_("recipients: “%(address)s” is not an e-mail address.")
                               % {"address": address}) from exc
    return addresses


def _check_schedule(values: ScheduleInput) -> ScheduleInput:
    if values.frequency not in FREQUENCIES:
        raise InvalidInput(_("frequency: choose daily, weekly or monthly."))
    if not 0 <= values.hour <= 23:
        raise InvalidInput(_("hour: a whole hour from 0 to 23 (UTC)."))
    weekday = values.weekday if values.frequency == "weekly" else None
    day = values.day_of_month if values.frequency == "monthly" else None
    if values.frequency == "weekly" and (weekday is None or not 0 <= weekday <= 6):
        raise InvalidInput(_("weekday: choose a day of the week for a weekly report."))
    if values.frequency == "monthly" and (day is None or not 1 <= day <= 31):
        raise InvalidInput(_("day of month: a day from 1 to 31 for a monthly report."))
    if values.format not in ReportSchedule.Format.values:
        raise InvalidInput(_("format: choose one of %(formats)s.") % {"formats": ", ".join(ReportSchedule.Format.values)})
    return ScheduleInput(frequency=values.frequency, hour=values.hour, weekday=weekday, day_of_month=day,
                         format=values.format, recipients=tuple(_check_recipients(values.recipients)))


def _schedule_fields(schedule: ReportSchedule) -> dict[str, Any]:
    return {"frequency": schedule.frequency, "hour": schedule.hour, "weekday": schedule.weekday,
            "day_of_month": schedule.day_of_month, "format": schedule.format, "recipients": list(schedule.recipients)}


def set_schedule(*, view_id: int, owner_id: int, values: ScheduleInput, now: datetime,
                 actor_label: str) -> ReportSchedule:
    """Create or change the view's schedule. It counts from now: an occurrence that fell before
    is not sent (a new 09:00 daily schedule set at 10:00 sends first tomorrow)."""
    checked = _check_schedule(values)
    with transaction.atomic():
        view = owned_view(view_id=view_id, owner_id=owner_id, lock=True)
        schedule = ReportSchedule.objects.filter(view=view).first()
        before = _schedule_fields(schedule) if schedule is not None else None
        fields = {**asdict(checked), "recipients": list(checked.recipients), "active_from": now}
        if schedule is None:
            schedule = ReportSchedule.objects.create(view=view, **fields)
        else:
            for name, value in fields.items():
                setattr(schedule, name, value)
            schedule.save()
        record_audit_event(at=now, actor_id=owner_id, actor_label=actor_label,
                           action="report_schedule.created" if before is None else "report_schedule.changed",
                           object_type="saved_view", object_id=str(view.pk), before=before,
                           after=_schedule_fields(schedule))
    return schedule


def delete_schedule(*, view_id: int, owner_id: int, now: datetime, actor_label: str) -> None:
    with transaction.atomic():
        view = owned_view(view_id=view_id, owner_id=owner_id, lock=True)
        schedule = ReportSchedule.objects.filter(view=view).first()
        if schedule is None:
            raise InvalidInput(_("The view “%(name)s” has no schedule.") % {"name": view.name})
        record_audit_event(at=now, actor_id=owner_id, actor_label=actor_label, action="report_schedule.deleted",
                           object_type="saved_view", object_id=str(view.pk), before=_schedule_fields(schedule),
                           after=None)
        schedule.delete()
