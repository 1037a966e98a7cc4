"""The saved views pages: a user's own views (never another's, whatever their role), one view with
its schedule, its next occurrence and what was sent (docs/saved-views.md)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import date, datetime

from billing.models import ReportSchedule, ReportSend, SavedView, Tenant
from billing.scope import Scope
from billing.services.saved_views import next_occurrence, recurrence_of

__all__ = ["HISTORY", "SavedViewPage", "SendRow", "ViewNotFound", "ViewRow", "get_saved_view", "list_saved_views",
           "tenant_visible"]

HISTORY = 50


class ViewNotFound(Exception):
    """No view of that id belongs to the user (another user's is not found either)."""


@dataclass(frozen=True)
class ViewRow:
    id: int
    name: str
    path: str
    query: str
    period: str
    period_label: str
    schedule: ReportSchedule | None
    next_send: datetime | None


@dataclass(frozen=True)
class SendRow:
    at: datetime
    occurrence: datetime
    recipients: list[str]
    status: str
    status_label: str
    error: str
    period_start: date | None
    period_end: date | None
    trigger: str


@dataclass(frozen=True)
class SavedViewPage:
    view: ViewRow
    sends: list[SendRow]


def _row(view: SavedView, now: datetime) -> ViewRow:
    schedule = ReportSchedule.objects.filter(view=view).first()
    return ViewRow(id=view.pk, name=view.name, path=view.path, query=view.query, period=view.period,
                   period_label=str(SavedView.Period(view.period).label), schedule=schedule,
                   next_send=next_occurrence(recurrence_of(schedule), now) if schedule else None)


def list_saved_views(*, owner_id: int, now: datetime) -> list[ViewRow]:
    return [_row(v, now) for v in SavedView.objects.filter(owner_id=owner_id)]


def get_saved_view(*, owner_id: int, view_id: int, now: datetime) -> SavedViewPage:
    view = SavedView.objects.filter(pk=view_id, owner_id=owner_id).first()
    if view is None:
        raise ViewNotFound(view_id)
    sends = [SendRow(at=s.at, occurrence=s.occurrence, recipients=list(s.recipients), status=s.status,
                     status_label=str(ReportSend.Status(s.status).label), error=s.error, period_start=s.period_start,
                     period_end=s.period_end, trigger=s.trigger)
             for s in ReportSend.objects.filter(schedule__view=view)[:HISTORY]]
    return SavedViewPage(view=_row(view, now), sends=sends)


def tenant_visible(scope: Scope, slug: str) -> bool:
    """A tenant that exists and is in the scope (a portal that would not answer 404)."""
    if scope.tenants is not None and slug not in scope.tenants:
        return False
    return Tenant.objects.filter(slug=slug).exists()
