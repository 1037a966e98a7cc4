"""Saved views and scheduled reports (docs/saved-views.md): what may be saved (the pages' own forms
decide, a clear 400 otherwise, nothing created), who sees which view, when a report is due (month
ends, leap years), its period, the owner's scope at send time, exactly one send per occurrence, and
the audit log."""

from __future__ import annotations

import threading
from datetime import UTC, date, datetime, timedelta
from urllib.parse import urlencode

import pytest
from django.core import mail
from django.db import connection
from django.test import Client
from hypothesis import given
from hypothesis import strategies as st

from billing import tasks
from billing.models import AuditEvent, ReportSchedule, ReportSend, SavedView, TenantMembership
from billing.scope import FINANCE_GROUP
from billing.services.demo import DEMO_REPORT_RECIPIENT, DEMO_SAVED_VIEW, load_demo_data
from billing.services.saved_views import (
    Recurrence,
    ScheduleInput,
    create_view,
    latest_occurrence,
    next_occurrence,
    report_period,
    send_due_reports,
    set_schedule,
)
from billing.web.saved_views import render_report
from tests import clock
from tests.conftest import user_in

pytestmark = pytest.mark.django_db


def _client(user) -> Client:
    c = Client()
    c.force_login(user)
    return c


def _save(c: Client, path: str, query: str = "", name: str = "My view"):
    return c.post("/views/", {"name": name, "path": path, "query": query})


def _schedule(view: SavedView, *, now: datetime, frequency: str = "daily", hour: int = 9, weekday: int | None = None,
              day: int | None = None, to: tuple[str, ...] = ("cfo@example.com",)) -> ReportSchedule:
    return set_schedule(view_id=view.pk, owner_id=view.owner_id, now=now, actor_label="t",
                        values=ScheduleInput(frequency=frequency, hour=hour, weekday=weekday, day_of_month=day,
                                             format="csv", recipients=to))


# --- saving: the pages' forms decide --------------------------------------------------------------

@pytest.mark.parametrize(("path", "query", "reason"), [
    ("/invoices/", "", "can be saved"),
    ("/finance/x/", "", "can be saved"),
    ("/finance/", "start=2026-02-30&end=2026-03-01", "Enter a date"),
    ("/finance/", "start=2026-03-05&end=2026-03-01", "must not be before"),
    ("/finance/", "format=csv&start=2026-03-01&end=2026-03-05", "does not take format"),
    ("/finance/", "start=2026-03-01&start=2026-03-02&end=2026-03-05", "more than once"),
    ("/explore/", "namespace=acme-prod", "give tenant too"),
    ("/explore/", "label=not a label", "label: write name=value"),
    ("/explore/", "tenant=nobody", "may not see a tenant"),
    ("/tenants/nobody/", "", "may not see a tenant"),
])
def test_a_view_the_pages_would_refuse_is_a_400_saying_why_and_nothing_is_saved(path, query, reason):
    c = _client(user_in(FINANCE_GROUP))
    response = _save(c, path, query)
    assert response.status_code == 400
    assert reason in response.content.decode()
    assert not SavedView.objects.exists()
    assert not AuditEvent.objects.filter(action__startswith="saved_view").exists()


def test_a_tenant_member_saves_only_views_of_their_own_tenant():
    member = user_in(tenant="acme")
    user_in(tenant="globex")  # globex exists, but is not the member's
    c = _client(member)
    assert _save(c, "/tenants/globex/").status_code == 400
    assert _save(c, "/explore/", "tenant=globex").status_code == 400
    assert not SavedView.objects.exists()
    assert _save(c, "/tenants/acme/", name="Acme").status_code == 302
    assert _save(c, "/explore/", "tenant=acme&namespace=acme-prod", name="Acme prod").status_code == 302
    assert sorted(SavedView.objects.values_list("path", flat=True)) == ["/explore/", "/tenants/acme/"]


def test_names_are_unique_per_user_and_each_user_sees_only_their_own_views():
    finance, other = user_in(FINANCE_GROUP), user_in("platform-admin")
    a, b = _client(finance), _client(other)
    assert _save(a, "/finance/", name="Month").status_code == 302
    refused = _save(a, "/explore/", name="Month")
    assert refused.status_code == 400
    assert "already have a view called" in refused.content.decode()
    assert _save(b, "/finance/", name="Month").status_code == 302  # another user's name is theirs
    mine = SavedView.objects.get(owner=finance)
    assert b.get("/views/").content.decode().count('data-testid="saved-view-row"') == 1
    for url in (f"/views/{mine.pk}/", f"/views/{mine.pk}/open/"):
        assert b.get(url).status_code == 404
    assert b.post(f"/views/{mine.pk}/delete/").status_code == 404  # not found, like a missing one
    assert SavedView.objects.filter(pk=mine.pk).exists()


def test_a_quick_period_is_saved_as_relative_and_opens_on_today(time_machine):
    time_machine.move_to(datetime(2028, 3, 10, 12, tzinfo=UTC), tick=False)
    owner = user_in(FINANCE_GROUP)
    c = _client(owner)
    user_in(tenant="acme")
    _save(c, "/finance/", "start=2028-02-01&end=2028-02-29", name="Last month")
    _save(c, "/explore/", "start=2028-01-03&end=2028-01-09&tenant=acme", name="Fixed week")
    _save(c, "/finance/", "", name="Default")  # no period: the page's, the month to date
    views = {v.name: v for v in SavedView.objects.all()}
    assert {n: v.period for n, v in views.items()} == {"Last month": "last-month", "Fixed week": "fixed",
                                                        "Default": "this-month"}
    time_machine.move_to(datetime(2028, 5, 2, 12, tzinfo=UTC), tick=False)
    c.force_login(owner)  # the session has expired meanwhile
    assert c.get(f"/views/{views['Last month'].pk}/open/")["Location"] == "/finance/?start=2028-04-01&end=2028-04-30"
    assert c.get(f"/views/{views['Default'].pk}/open/")["Location"] == "/finance/?start=2028-05-01&end=2028-05-02"
    assert c.get(f"/views/{views['Fixed week'].pk}/open/")["Location"] == (
        "/explore/?start=2028-01-03&end=2028-01-09&tenant=acme")


def test_rename_and_delete_are_audited():
    c = _client(user_in(FINANCE_GROUP))
    _save(c, "/finance/", name="One")
    view = SavedView.objects.get()
    assert c.post(f"/views/{view.pk}/rename/", {"name": "  Two  "}).status_code == 302
    assert c.post(f"/views/{view.pk}/rename/", {"name": " "}).status_code == 400
    assert SavedView.objects.get().name == "Two"
    assert c.post(f"/views/{view.pk}/delete/").status_code == 302
    assert not SavedView.objects.exists()
    assert list(AuditEvent.objects.order_by("id").values_list("action", flat=True)) == [
        "saved_view.created", "saved_view.renamed", "saved_view.deleted"]


# --- schedules --------------------------------------------------------------------------------------

@pytest.mark.parametrize(("form", "reason"), [
    ({"recipients": "not-an-address"}, "is not an e-mail address"),
    ({"recipients": ", ".join(f"p{i}@example.com" for i in range(21))}, "at most 20 addresses"),
    ({"frequency": "weekly"}, "weekday: choose a day"),
    ({"frequency": "monthly"}, "day of month"),
    ({"hour": "24"}, "less than or equal to 23"),
    ({"format": "pdf"}, "Select a valid choice"),
])
def test_a_schedule_refused_is_a_400_saying_why_and_changes_nothing(form, reason):
    user = user_in(FINANCE_GROUP)
    c = _client(user)
    _save(c, "/finance/")
    view = SavedView.objects.get()
    data = {"frequency": "daily", "hour": "9", "format": "csv", "recipients": "a@example.com", **form}
    response = c.post(f"/views/{view.pk}/schedule/", data)
    assert response.status_code == 400
    assert reason in response.content.decode()
    assert not ReportSchedule.objects.exists()
    assert not AuditEvent.objects.filter(action__startswith="report_schedule").exists()


def test_creating_changing_and_removing_a_schedule_is_audited():
    c = _client(user_in(FINANCE_GROUP))
    _save(c, "/finance/")
    view = SavedView.objects.get()
    form = {"frequency": "weekly", "weekday": "0", "hour": "7", "format": "csv", "recipients": "a@example.com"}
    assert c.post(f"/views/{view.pk}/schedule/", form).status_code == 302
    form.update(frequency="monthly", day_of_month="31", recipients="a@example.com, b@example.com")
    assert c.post(f"/views/{view.pk}/schedule/", form).status_code == 302
    schedule = ReportSchedule.objects.get()
    assert (schedule.frequency, schedule.weekday, schedule.day_of_month) == ("monthly", None, 31)
    assert schedule.recipients == ["a@example.com", "b@example.com"]
    assert c.post(f"/views/{view.pk}/unschedule/").status_code == 302
    events = list(AuditEvent.objects.filter(action__startswith="report_schedule").order_by("id"))
    assert [e.action for e in events] == ["report_schedule.created", "report_schedule.changed",
                                          "report_schedule.deleted"]
    assert (events[1].before or {})["frequency"] == "weekly"
    assert (events[1].after or {})["recipients"] == ["a@example.com", "b@example.com"]


# --- when a report is due ---------------------------------------------------------------------------

rules = st.builds(
    Recurrence, frequency=st.sampled_from(["daily", "weekly", "monthly"]), hour=st.integers(0, 23),
    weekday=st.integers(0, 6), day_of_month=st.integers(1, 31))
instants = st.datetimes(min_value=datetime(2000, 1, 1), max_value=datetime(2199, 1, 1),  # noqa: DTZ001 - hypothesis takes naive bounds
                        timezones=st.just(UTC))


@given(rule=rules, now=instants)
def test_the_latest_occurrence_is_the_last_one_at_or_before_now(rule, now):
    latest, following = latest_occurrence(rule, now), next_occurrence(rule, now)
    assert latest <= now < following
    assert rule.falls_on(latest.date())
    assert latest.hour == rule.hour
    # Nothing falls between them: `following` is the next after `latest` too.
    assert next_occurrence(rule, latest) == following
    # At most a month and a bit apart, so every rule sends every month at least.
    assert following - latest <= timedelta(days=31)


@pytest.mark.parametrize(("day", "now", "expected"), [
    (31, datetime(2027, 2, 28, 9, 30, tzinfo=UTC), datetime(2027, 2, 28, 9, tzinfo=UTC)),  # not a leap year
    (31, datetime(2028, 2, 28, 9, 30, tzinfo=UTC), datetime(2028, 1, 31, 9, tzinfo=UTC)),  # leap: 29th is last
    (31, datetime(2028, 2, 29, 9, 30, tzinfo=UTC), datetime(2028, 2, 29, 9, tzinfo=UTC)),
    (29, datetime(2100, 2, 28, 9, 0, tzinfo=UTC), datetime(2100, 2, 28, 9, tzinfo=UTC)),  # 2100 is no leap year
    (30, datetime(2027, 4, 30, 8, 59, tzinfo=UTC), datetime(2027, 3, 30, 9, tzinfo=UTC)),  # before the hour
    (31, datetime(2027, 12, 31, 23, 59, tzinfo=UTC), datetime(2027, 12, 31, 9, tzinfo=UTC)),
])
def test_a_monthly_day_past_the_months_end_falls_on_its_last_day(day, now, expected):
    assert latest_occurrence(Recurrence("monthly", hour=9, day_of_month=day), now) == expected


@pytest.mark.parametrize(("period", "on", "expected"), [
    ("this-month", date(2028, 2, 29), (date(2028, 2, 1), date(2028, 2, 29))),
    ("last-month", date(2028, 3, 1), (date(2028, 2, 1), date(2028, 2, 29))),
    ("last-month", date(2027, 1, 31), (date(2026, 12, 1), date(2026, 12, 31))),
    ("last-7-days", date(2028, 3, 2), (date(2028, 2, 25), date(2028, 3, 2))),
    ("fixed", date(2028, 3, 2), (date(2026, 1, 1), date(2026, 1, 31))),
])
def test_a_reports_period_is_the_views_quick_period_on_the_day_it_is_sent(period, on, expected):
    assert report_period(period, on=on, saved=(date(2026, 1, 1), date(2026, 1, 31))) == expected


def test_a_monthly_report_on_the_31st_is_sent_on_29_february_of_a_leap_year_once(time_machine):
    time_machine.move_to(datetime(2028, 1, 15, 12, tzinfo=UTC), tick=False)
    owner = user_in(FINANCE_GROUP)
    view = create_view(owner_id=owner.pk, name="Last month", path="/finance/",
                       query="start=2027-12-01&end=2027-12-31", period="last-month", now=clock.now(),
                       actor_label="t")
    _schedule(view, now=clock.now(), frequency="monthly", day=31, hour=6)
    for at, sent in ((datetime(2028, 1, 31, 5, 59, tzinfo=UTC), 0), (datetime(2028, 1, 31, 6, 1, tzinfo=UTC), 1),
                     (datetime(2028, 2, 28, 7, tzinfo=UTC), 1), (datetime(2028, 2, 29, 6, 4, tzinfo=UTC), 2),
                     (datetime(2028, 2, 29, 23, tzinfo=UTC), 2), (datetime(2028, 3, 30, 6, tzinfo=UTC), 2)):
        time_machine.move_to(at, tick=False)
        tasks.send_scheduled_reports.apply().get()
        assert len(mail.outbox) == sent, at
    periods = list(ReportSend.objects.order_by("occurrence").values_list("occurrence", "period_start", "period_end"))
    assert periods == [(datetime(2028, 1, 31, 6, tzinfo=UTC), date(2027, 12, 1), date(2027, 12, 31)),
                       (datetime(2028, 2, 29, 6, tzinfo=UTC), date(2028, 1, 1), date(2028, 1, 31))]
    assert mail.outbox[1].subject == "Report: Last month, 2028-01-01 to 2028-01-31"


def test_an_occurrence_before_the_schedule_was_set_is_not_sent(time_machine):
    time_machine.move_to(datetime(2027, 6, 1, 10, 30, tzinfo=UTC), tick=False)
    owner = user_in(FINANCE_GROUP)
    view = create_view(owner_id=owner.pk, name="V", path="/finance/", query="start=2027-06-01&end=2027-06-01",
                       period="this-month", now=clock.now(), actor_label="t")
    _schedule(view, now=clock.now(), hour=9)  # 09:00 today is past: the first is tomorrow's
    assert send_due_reports(now=clock.now(), render=render_report) == []
    assert send_due_reports(now=datetime(2027, 6, 2, 9, tzinfo=UTC), render=render_report)[0]["status"] == "sent"


# --- sending: the owner's page, their scope, exactly once -------------------------------------------

def test_the_report_is_the_pages_own_csv_as_the_owner_downloads_it(mid_month):
    owner = user_in(FINANCE_GROUP)
    c = _client(owner)
    today = clock.now().date()
    query = urlencode({"start": today.replace(day=1).isoformat(), "end": today.isoformat()})
    _save(c, "/finance/", query)
    view = SavedView.objects.get()
    _schedule(view, now=clock.now() - timedelta(days=2), hour=0, to=("cfo@example.com", "ops@example.com"))
    assert send_due_reports(now=clock.now(), render=render_report)[0]["status"] == "sent"
    [message] = mail.outbox
    assert message.to == ["cfo@example.com", "ops@example.com"]
    [(filename, content, mimetype)] = message.attachments
    page = c.get(f"/finance/?{query}&format=csv")
    assert content == page.content.decode()
    assert filename in page["Content-Disposition"]
    assert mimetype == "text/csv"
    assert f"/finance/?{query}" in message.body


def test_a_report_is_refused_when_its_owner_no_longer_sees_the_tenant(mid_month):
    member = user_in(tenant="acme")
    c = _client(member)
    assert _save(c, "/tenants/acme/").status_code == 302
    view = SavedView.objects.get()
    _schedule(view, now=clock.now() - timedelta(days=2), hour=0)
    TenantMembership.objects.filter(user=member).delete()
    assert send_due_reports(now=clock.now(), render=render_report)[0]["status"] == "refused"
    assert mail.outbox == []
    send = ReportSend.objects.get()
    assert "may not see a tenant" in send.error
    assert "acme" in c.get(f"/views/{view.pk}/").content.decode()  # the history says so


def test_a_tenant_members_report_holds_only_their_tenant(mid_month):
    member = user_in(tenant="acme")
    user_in(tenant="globex")
    c = _client(member)
    _save(c, "/finance/")  # the dashboard as a member sees it: their tenant alone
    _schedule(SavedView.objects.get(), now=clock.now() - timedelta(days=2), hour=0)
    send_due_reports(now=clock.now(), render=render_report)
    csv = mail.outbox[0].attachments[0][1]
    assert "globex" not in csv


def test_send_now_is_audited_and_shown_in_the_history(mid_month):
    c = _client(user_in(FINANCE_GROUP))
    _save(c, "/finance/")
    view = SavedView.objects.get()
    assert c.post(f"/views/{view.pk}/send/").status_code == 400  # no schedule yet
    _schedule(view, now=clock.now(), hour=(clock.now().hour + 1) % 24)
    assert c.post(f"/views/{view.pk}/send/").status_code == 302
    assert len(mail.outbox) == 1
    page = c.get(f"/views/{view.pk}/").content.decode()
    assert page.count('data-testid="send-row" data-status="sent"') == 1
    assert AuditEvent.objects.filter(action="report_schedule.sent_now", object_id=str(view.pk)).count() == 1
    # The schedule's own occurrence is still sent when it comes.
    assert send_due_reports(now=clock.now() + timedelta(hours=1), render=render_report)[0]["status"] == "sent"


def test_a_failed_send_is_recorded_with_its_error_and_not_retried(mid_month, settings):
    settings.EMAIL_BACKEND = "django.core.mail.backends.smtp.EmailBackend"
    settings.EMAIL_HOST, settings.EMAIL_PORT, settings.EMAIL_TIMEOUT = "127.0.0.1", 9, 2  # nothing listens
    owner = user_in(FINANCE_GROUP)
    _save(_client(owner), "/finance/")
    _schedule(SavedView.objects.get(), now=clock.now() - timedelta(days=2), hour=0)
    assert send_due_reports(now=clock.now(), render=render_report)[0]["status"] == "failed"
    assert send_due_reports(now=clock.now(), render=render_report) == []
    assert "Error" in ReportSend.objects.get().error


@pytest.mark.django_db(transaction=True)
def test_two_workers_at_once_send_each_occurrence_once(mid_month):
    owner = user_in(FINANCE_GROUP)
    views = [create_view(owner_id=owner.pk, name=f"V{i}", path="/finance/", query="start=2027-01-01&end=2027-01-31",
                         period="this-month",
                         now=clock.now(), actor_label="t") for i in range(3)]
    for view in views:
        _schedule(view, now=clock.now() - timedelta(days=2), hour=0)
    barrier, errors = threading.Barrier(4), []

    def worker() -> None:
        try:
            barrier.wait()
            for _ in range(2):
                send_due_reports(now=clock.now(), render=render_report)
        except Exception as exc:  # noqa: BLE001 - reported to the test's thread
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert len(mail.outbox) == 3
    assert ReportSend.objects.filter(status="sent").count() == 3


def test_the_demo_schedules_finances_view_due_at_once(settings):
    now = clock.now()
    load_demo_data(now=now)
    load_demo_data(now=now)  # idempotent: one view
    view = SavedView.objects.get(name=DEMO_SAVED_VIEW)
    assert view.owner.username == "finance"
    [outcome] = send_due_reports(now=now, render=render_report)
    assert outcome["status"] == "sent"
    assert mail.outbox[0].to == [DEMO_REPORT_RECIPIENT]
