"""The billing periods page: finance and admins close a finished month as a Celery job and watch
its progress, read from the period row (so it survives a reload and any web process shows it).
A request is recorded once (a second press while closing enqueues nothing), refused months change
nothing, a failed close shows its error and can be retried, tenant members are refused."""

from __future__ import annotations

import time
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal
from unittest import mock

import pytest
from django.contrib.auth.models import User

from billing import tasks
from billing.ledger.rollup import rollup_usage
from billing.models import AuditEvent, BillingPeriod, Invoice, Tenant
from billing.scope import ADMIN_GROUP, FINANCE_GROUP
from billing.services.invoicing.close import CloseResult, close_period
from tests import clock
from tests.conftest import A100, SHARED_GPU_WORKLOADS, make_batch, user_in
from tests.test_page_sums import Walk, _check_page, _marks

pytestmark = pytest.mark.django_db

# The page decides "over" with the clock, so these tests hold it in the middle of a month
# (ticking) whatever day they run on; the edges of a month have tests of their own at the end.
MID_MONTH = datetime(2027, 3, 15, 12, 0, tzinfo=UTC)
THIS_MONTH = date(2027, 3, 1)
LAST_MONTH = date(2027, 2, 1)
LAST = f"{LAST_MONTH:%Y-%m}"
THIS = f"{THIS_MONTH:%Y-%m}"


@pytest.fixture(autouse=True)
def _mid_month(time_machine):
    time_machine.move_to(MID_MONTH, tick=True)


def at(month: date, day: int) -> datetime:
    return datetime(month.year, month.month, day, 12, tzinfo=UTC)


@pytest.fixture
def last_month_usage(post_batch, one_usd_per_gpu_second):
    """acme 10 % and globex 20 % of a card for 10 s at 1 USD per GPU-second: 1.00 and 2.00 USD."""
    assert post_batch(make_batch(start=at(LAST_MONTH, 15), seq=1, workloads=SHARED_GPU_WORKLOADS)).status_code == 201
    rollup_usage(now=clock.now())


def login(client, *, group: str | None = None, tenant: str | None = None) -> User:
    user = user_in(group, tenant)
    client.force_login(user)
    return user


def press_close(client, month: str, django_capture_on_commit_callbacks):
    """POST the close button; returns (response, the mock standing in for the broker)."""
    with mock.patch("billing.tasks.close_period.delay") as enqueue, \
            django_capture_on_commit_callbacks(execute=True):
        resp = client.post(f"/periods/{month}/close")
    return resp, enqueue


def row_html(page: str, month: str) -> str:
    start = page.index(f'data-month="{month}"')
    return page[start:page.index("</tr>", start)]


def test_close_request_is_recorded_audited_enqueued_then_the_task_closes_the_month(
        client, post_batch, last_month_usage, minute_start, django_capture_on_commit_callbacks):
    assert post_batch(make_batch(start=minute_start, seq=2, workloads=SHARED_GPU_WORKLOADS)).status_code == 201
    rollup_usage(now=clock.now())
    user = login(client, group=FINANCE_GROUP)
    ready = client.get("/periods/").content.decode()
    assert 'data-state="ready"' in row_html(ready, LAST)
    assert 'data-testid="close-button"' in row_html(ready, LAST)
    assert f"Close {LAST}" in ready
    current = f"{minute_start:%Y-%m}"  # the month in progress: listed, not closable
    assert 'data-state="open"' in row_html(ready, current)
    assert "close-button" not in row_html(ready, current)

    resp, enqueue = press_close(client, LAST, django_capture_on_commit_callbacks)
    assert resp.status_code == 302
    assert resp["Location"] == "/periods/"
    enqueue.assert_called_once_with(LAST)
    period = BillingPeriod.objects.get(month=LAST_MONTH)
    assert (period.status, period.progress_pct, period.requested_by_id) == ("closing", 0, user.pk)
    audit = AuditEvent.objects.get(action="period.close_requested")
    assert (audit.actor_id, audit.actor_label, audit.object_id) == (user.pk, user.username, LAST)
    assert audit.before == {"status": "open", "error": ""}
    assert audit.after == {"status": "closing"}

    closing = client.get("/periods/").content.decode()  # a reload shows the bar, from the row
    assert 'http-equiv="refresh"' in closing
    row = row_html(closing, LAST)
    assert 'data-testid="close-progress"' in row
    assert 'value="0"' in row
    assert "Waiting for a worker" in row
    assert 'data-testid="close-button"' not in row

    result = tasks.close_period.apply(args=(LAST,)).get()
    assert (result["finalized"], result["already_closed"]) == (2, False)
    period.refresh_from_db()
    assert (period.status, period.progress_pct, period.error) == ("closed", 100, "")
    assert Invoice.objects.filter(period=period, status="finalized").count() == 2

    closed = client.get("/periods/").content.decode()
    assert 'http-equiv="refresh"' not in closed
    row = row_html(closed, LAST)
    assert 'data-state="closed"' in row
    assert "2 invoices" in row
    assert "3.00 USD" in row
    assert 'data-testid="period-invoices-link"' in row
    assert 'href="/invoices/"' in row
    assert 'data-testid="close-button"' not in row


def test_progress_is_written_on_the_row_while_invoices_are_finalized(last_month_usage):
    seen: list[tuple[int, str, int]] = []

    def watch(pct: int) -> None:  # what another web process would read at this moment
        row = BillingPeriod.objects.get(month=LAST_MONTH)
        seen.append((pct, row.status, row.progress_pct))

    close_period(month=LAST_MONTH, now=clock.now(), progress=watch)
    # Lines computed (5 %), acme's invoice (50 %), globex's (95 %), period closed (100 %).
    assert seen == [(5, "closing", 5), (50, "closing", 50), (95, "closing", 95), (100, "closed", 100)]


def test_a_second_press_while_closing_enqueues_nothing_and_records_nothing(
        client, last_month_usage, django_capture_on_commit_callbacks):
    login(client, group=ADMIN_GROUP)
    _, first = press_close(client, LAST, django_capture_on_commit_callbacks)
    resp, second = press_close(client, LAST, django_capture_on_commit_callbacks)
    assert resp.status_code == 302
    first.assert_called_once_with(LAST)
    second.assert_not_called()
    assert AuditEvent.objects.filter(action="period.close_requested").count() == 1
    tasks.close_period.apply(args=(LAST,)).get()
    _, third = press_close(client, LAST, django_capture_on_commit_callbacks)  # closed: nothing again
    third.assert_not_called()
    assert Invoice.objects.count() == 2


def test_an_unfinished_month_is_refused_with_the_reason_and_nothing_is_recorded(
        client, post_batch, one_usd_per_gpu_second, django_capture_on_commit_callbacks):
    login(client, group=FINANCE_GROUP)
    resp, enqueue = press_close(client, THIS, django_capture_on_commit_callbacks)
    assert resp.status_code == 400
    page = resp.content.decode()
    assert 'data-testid="close-error"' in page
    assert f"{THIS} is not over yet" in page
    enqueue.assert_not_called()
    assert not BillingPeriod.objects.exists()
    assert not AuditEvent.objects.filter(action="period.close_requested")
    assert client.post("/periods/2026-13/close").status_code == 400  # not a month


def test_unpriced_usage_is_listed_as_an_item_to_resolve_and_never_holds_the_close(
        client, post_batch, django_capture_on_commit_callbacks):
    assert post_batch(make_batch(start=at(LAST_MONTH, 15), seq=1)).status_code == 201  # no rate card
    rollup_usage(now=clock.now())
    login(client, group=FINANCE_GROUP)
    row = row_html(client.get("/periods/").content.decode(), LAST)
    assert 'data-testid="period-unpriced"' in row
    assert 'data-testid="close-button"' in row
    assert f'data-model="{A100["model"]}"' in row
    assert "tenants affected: acme" in row
    resp, enqueue = press_close(client, LAST, django_capture_on_commit_callbacks)
    assert resp.status_code == 302
    enqueue.assert_called_once_with(LAST)


def test_a_failed_close_shows_its_error_and_retry_resumes_it(
        client, last_month_usage, django_capture_on_commit_callbacks):
    login(client, group=FINANCE_GROUP)
    press_close(client, LAST, django_capture_on_commit_callbacks)

    def crash_after_first_invoice(pct: int) -> None:
        if pct == 50:
            raise RuntimeError("worker lost the database at acme")

    with pytest.raises(RuntimeError):
        close_period(month=LAST_MONTH, now=clock.now(), progress=crash_after_first_invoice)
    period = BillingPeriod.objects.get(month=LAST_MONTH)
    assert (period.status, period.error) == ("failed", "worker lost the database at acme")
    assert Invoice.objects.filter(status="finalized").count() == 1
    page = client.get("/periods/").content.decode()
    row = row_html(page, LAST)
    assert 'data-state="failed"' in row
    assert "worker lost the database at acme" in row
    assert 'data-testid="retry-button"' in row
    assert 'http-equiv="refresh"' not in page

    resp, enqueue = press_close(client, LAST, django_capture_on_commit_callbacks)  # the retry button
    assert resp.status_code == 302
    enqueue.assert_called_once_with(LAST)
    period.refresh_from_db()
    assert (period.status, period.error) == ("closing", "")
    retry_audit = AuditEvent.objects.filter(action="period.close_requested").order_by("-id").first()
    assert retry_audit is not None
    assert retry_audit.before == {"status": "failed",
                                                              "error": "worker lost the database at acme"}
    result = tasks.close_period.apply(args=(LAST,)).get()
    assert (result["finalized"], result["already_final"]) == (1, 1)  # acme's invoice was kept
    period.refresh_from_db()
    assert (period.status, period.progress_pct) == ("closed", 100)


def test_usage_that_becomes_unpriced_after_the_request_is_left_off_the_invoices_and_listed(
        client, post_batch, last_month_usage, django_capture_on_commit_callbacks):
    login(client, group=FINANCE_GROUP)
    press_close(client, LAST, django_capture_on_commit_callbacks)
    late = make_batch(start=at(LAST_MONTH, 16), seq=2, gpus=2, workloads=[
        {"gpu": 1, "tenant": "acme", "pod": "t4-1", "mem_used": 1.0, "mem_granted": 1.0, "sm_used": 1.0,
         "sm_granted": 1.0}])
    late["gpus"][1]["model"] = "NVIDIA T4"  # no rate card for it
    assert post_batch(late).status_code == 201
    rollup_usage(now=clock.now())
    result = tasks.close_period.apply(args=(LAST,)).get()
    assert result["finalized"] == 2
    period = BillingPeriod.objects.get(month=LAST_MONTH)
    assert period.status == "closed"
    # Each tenant is invoiced for its priced usage; the T4 usage is on no invoice and is listed.
    totals = dict(Invoice.objects.values_list("tenant__slug", "total_minor"))
    assert totals == {"acme": 100, "globex": 200}
    row = row_html(client.get("/periods/").content.decode(), LAST)
    assert 'data-model="NVIDIA T4"' in row
    assert "tenants affected: acme" in row
    closed = AuditEvent.objects.get(action="billing_period.closed")
    assert closed.after is not None
    assert [u["gpu_model"] for u in closed.after["unpriced"]] == ["NVIDIA T4"]


def test_status_endpoint_reports_the_rows_state_as_json(client, last_month_usage, django_capture_on_commit_callbacks):
    login(client, group=FINANCE_GROUP)
    assert client.get(f"/periods/{LAST}/status").json()["state"] == "ready"
    assert client.get(f"/periods/{THIS}/status").json()["state"] == "open"
    press_close(client, LAST, django_capture_on_commit_callbacks)
    BillingPeriod.objects.filter(month=LAST_MONTH).update(progress_pct=42)  # as the job writes it
    doc = client.get(f"/periods/{LAST}/status").json()
    assert (doc["month"], doc["state"], doc["progress_pct"], doc["requested_by"]) == (LAST, "closing", 42,
                                                                                      "u-finance-")
    tasks.close_period.apply(args=(LAST,)).get()
    doc = client.get(f"/periods/{LAST}/status").json()
    assert (doc["state"], doc["progress_pct"], doc["invoices"]) == ("closed", 100, 2)
    assert doc["totals"] == [{"currency": "USD", "amount": "3.00", "subtotal": "3.00", "tax": "0.00", "credited": "0.00",
                              "balance_due": "3.00"}]
    assert client.get("/periods/2026-13/status").status_code == 400


def test_tenant_members_are_refused_and_cannot_close(client, last_month_usage):
    login(client, tenant="acme")
    assert client.get("/periods/").status_code == 403
    assert client.get(f"/periods/{LAST}/status").status_code == 403
    with mock.patch("billing.tasks.close_period.delay") as enqueue:
        assert client.post(f"/periods/{LAST}/close").status_code == 403
    enqueue.assert_not_called()
    assert not BillingPeriod.objects.exists()
    assert 'href="/periods/"' not in client.get("/invoices/").content.decode()  # no nav link either


def test_nav_links_the_page_for_finance(client, db):
    login(client, group=FINANCE_GROUP)
    assert 'data-testid="nav-periods"' in client.get("/invoices/").content.decode()


@pytest.fixture
def celery_worker(transactional_db):
    from celery.contrib.testing.worker import start_worker

    from config.celery import app as celery_app

    with start_worker(celery_app, pool="solo", concurrency=1, perform_ping_check=False, shutdown_timeout=30) as worker:
        yield worker


def test_a_real_worker_closes_the_month_requested_from_the_page(client, last_month_usage, celery_worker):
    login(client, group=FINANCE_GROUP)
    assert client.post(f"/periods/{LAST}/close").status_code == 302
    deadline = time.monotonic() + 60
    doc = client.get(f"/periods/{LAST}/status").json()
    while doc["state"] == "closing" and time.monotonic() < deadline:
        time.sleep(0.2)
        doc = client.get(f"/periods/{LAST}/status").json()
    assert (doc["state"], doc["progress_pct"], doc["invoices"]) == ("closed", 100, 2)


# --- A close whose job went quiet: stalled, resumed; two closes at once ------------------------

def backdate_progress(seconds: int) -> datetime:
    """Make the close look quiet for `seconds` (as if its worker died that long ago)."""
    progress_at = clock.now() - timedelta(seconds=seconds)
    BillingPeriod.objects.filter(month=LAST_MONTH).update(progress_at=progress_at)
    return progress_at


def press_resume(client, month: str, django_capture_on_commit_callbacks):
    with mock.patch("billing.tasks.close_period.delay") as enqueue, \
            django_capture_on_commit_callbacks(execute=True):
        resp = client.post(f"/periods/{month}/resume")
    return resp, enqueue


def test_a_close_is_stalled_by_the_clock_once_quiet_for_longer_than_the_setting(
        client, settings, last_month_usage, django_capture_on_commit_callbacks):
    from billing.queries.periods import get_billing_period
    from billing.scope import get_scope

    settings.VGPU_PERIOD_CLOSE_STALE_S = 600
    user = login(client, group=FINANCE_GROUP)
    press_close(client, LAST, django_capture_on_commit_callbacks)
    requested = BillingPeriod.objects.get(month=LAST_MONTH).progress_at
    assert requested is not None  # the request itself is the first sign of life

    def state(now: datetime) -> str:
        return get_billing_period(scope=get_scope(user), month=LAST_MONTH, now=now).state

    assert state(requested + timedelta(seconds=600)) == "closing"
    assert state(requested + timedelta(seconds=601)) == "stalled"
    doc = client.get(f"/periods/{LAST}/status").json()
    assert (doc["state"], doc["progress_at"]) == ("closing", requested.isoformat())


def test_every_progress_write_moves_progress_at(last_month_usage):
    seen: list[datetime] = []

    def watch(pct: int) -> None:
        at = BillingPeriod.objects.get(month=LAST_MONTH).progress_at
        assert at is not None
        seen.append(at)

    start = clock.now()
    month_end = datetime(THIS_MONTH.year, THIS_MONTH.month, 1, tzinfo=UTC)
    close_period(month=LAST_MONTH, now=month_end, progress=watch)  # the heartbeat is the clock, not `now`
    assert len(seen) == 4
    assert seen == sorted(seen)
    assert len(set(seen)) == 4
    assert seen[0] >= start - timedelta(seconds=5)


def test_a_non_stalled_close_shows_no_resume_and_a_resume_post_changes_nothing(
        client, last_month_usage, django_capture_on_commit_callbacks):
    login(client, group=FINANCE_GROUP)
    press_close(client, LAST, django_capture_on_commit_callbacks)
    backdate_progress(60)  # quiet for a minute: still closing
    row = row_html(client.get("/periods/").content.decode(), LAST)
    assert 'data-state="closing"' in row
    assert "resume-button" not in row
    assert "period-stalled" not in row
    resp, enqueue = press_resume(client, LAST, django_capture_on_commit_callbacks)
    assert resp.status_code == 302
    enqueue.assert_not_called()
    assert not AuditEvent.objects.filter(action="period.close_resumed").exists()


def test_a_stalled_close_is_resumed_once_audited_and_then_closes(
        client, last_month_usage, django_capture_on_commit_callbacks):
    user = login(client, group=ADMIN_GROUP)
    press_close(client, LAST, django_capture_on_commit_callbacks)  # its task is "lost": never run
    quiet_since = backdate_progress(901)
    page = client.get("/periods/").content.decode()
    row = row_html(page, LAST)
    assert 'data-state="stalled"' in row
    assert 'data-testid="period-stalled"' in row
    assert 'data-testid="resume-button"' in row
    assert f'action="/periods/{LAST}/resume"' in row
    assert "csrfmiddlewaretoken" in row
    assert 'http-equiv="refresh"' not in page

    resp, enqueue = press_resume(client, LAST, django_capture_on_commit_callbacks)
    assert resp.status_code == 302
    assert resp["Location"] == "/periods/"
    enqueue.assert_called_once_with(LAST)
    period = BillingPeriod.objects.get(month=LAST_MONTH)
    assert period.status == "closing"
    assert period.progress_at is not None
    assert period.progress_at > quiet_since
    audit = AuditEvent.objects.get(action="period.close_resumed")
    assert (audit.actor_id, audit.object_type, audit.object_id) == (user.pk, "billing_period", LAST)
    assert audit.before == {"status": "closing", "progress_pct": 0, "progress_at": quiet_since.isoformat()}
    assert audit.after == {"status": "closing", "progress_pct": 0, "progress_at": period.progress_at.isoformat()}

    _, again = press_resume(client, LAST, django_capture_on_commit_callbacks)  # a double click
    again.assert_not_called()
    assert AuditEvent.objects.filter(action="period.close_resumed").count() == 1
    assert 'data-state="closing"' in row_html(client.get("/periods/").content.decode(), LAST)

    result = tasks.close_period.apply(args=(LAST,)).get()  # what the enqueued task does
    assert (result["finalized"], result["already_closed"]) == (2, False)
    assert BillingPeriod.objects.get(month=LAST_MONTH).status == "closed"


def test_resume_by_the_service_clock_enqueues_only_a_stalled_close(
        last_month_usage, django_capture_on_commit_callbacks):
    from billing.services.invoicing.close import request_period_close, resume_period_close

    calls: list[str] = []
    requested_at = clock.now()
    request_period_close(month=LAST_MONTH, now=requested_at, actor_label="t", actor_id=None, enqueue=calls.append)

    def resume(after_s: int) -> bool:
        with django_capture_on_commit_callbacks(execute=True):
            return resume_period_close(month=LAST_MONTH, now=requested_at + timedelta(seconds=after_s),
                                       actor_label="t", actor_id=None, enqueue=calls.append).enqueued

    assert [resume(900), resume(901), resume(902)] == [False, True, False]  # the resume itself is progress
    assert calls == [LAST]
    assert BillingPeriod.objects.get(month=LAST_MONTH).progress_at == requested_at + timedelta(seconds=901)


def test_resume_is_refused_for_a_month_that_is_not_closing_and_for_tenant_members(
        client, last_month_usage, django_capture_on_commit_callbacks):
    login(client, group=FINANCE_GROUP)
    resp, enqueue = press_resume(client, LAST, django_capture_on_commit_callbacks)
    assert resp.status_code == 400
    assert f"{LAST} is not being closed" in resp.content.decode()
    enqueue.assert_not_called()
    assert not BillingPeriod.objects.exists()
    assert not AuditEvent.objects.filter(object_type="billing_period")
    assert client.get(f"/periods/{LAST}/resume").status_code == 405

    client.logout()
    BillingPeriod.objects.create(month=LAST_MONTH, status="closing", progress_at=clock.now() - timedelta(hours=2))
    login(client, tenant="acme")
    resp, enqueue = press_resume(client, LAST, django_capture_on_commit_callbacks)
    assert resp.status_code == 403
    enqueue.assert_not_called()
    assert not AuditEvent.objects.filter(action="period.close_resumed").exists()


def test_two_closes_running_at_once_finalize_each_invoice_once(last_month_usage, transactional_db):
    """A resumed close whose first job was only slow: both runs compute the lines, then race to
    finalize the same invoices (a barrier holds each until the other has its lines too)."""
    import threading

    from django.db import connection

    for slug in ("acme", "globex"):  # tenants usually exist already (else the Tenant INSERT serializes the runs)
        Tenant.objects.create(slug=slug, name=slug.title())
    barrier = threading.Barrier(2, timeout=30)
    results: list[CloseResult] = []
    errors: list[BaseException] = []

    def wait_for_the_other(pct: int) -> None:
        if pct == 5:  # lines computed, no invoice written yet
            barrier.wait()

    def run() -> None:
        try:
            results.append(close_period(month=LAST_MONTH, now=clock.now(), progress=wait_for_the_other))
        except BaseException as exc:  # noqa: BLE001 - reported by the assertion below
            errors.append(exc)
        finally:
            connection.close()  # each thread had its own connection

    threads = [threading.Thread(target=run) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert errors == []
    assert len(results) == 2
    assert sum(r.invoices_finalized for r in results) == 2
    invoices = {i.tenant.slug: i for i in Invoice.objects.select_related("tenant")}
    assert {s: (i.status, i.total_minor, i.lines.count()) for s, i in invoices.items()} == {
        "acme": ("finalized", 100, 1), "globex": ("finalized", 200, 1)}
    assert BillingPeriod.objects.get(month=LAST_MONTH).status == "closed"
    assert AuditEvent.objects.filter(action="invoice.finalized").count() == 2
    assert AuditEvent.objects.filter(action="billing_period.closed").count() == 1


# The edges of a month, where "this month" and "last month" change under the user.


def test_in_the_last_minute_of_a_month_it_cannot_be_closed_yet(
        client, time_machine, post_batch, one_usd_per_gpu_second, django_capture_on_commit_callbacks):
    time_machine.move_to(datetime(2027, 2, 28, 23, 59, 30, tzinfo=UTC), tick=True)  # 2027 is no leap year
    assert post_batch(make_batch(start=datetime(2027, 2, 28, 23, 58, tzinfo=UTC), seq=1)).status_code == 201
    rollup_usage(now=clock.now())
    login(client, group=FINANCE_GROUP)
    assert 'data-state="open"' in row_html(client.get("/periods/").content.decode(), "2027-02")
    resp, enqueue = press_close(client, "2027-02", django_capture_on_commit_callbacks)
    assert resp.status_code == 400
    assert "2027-02 is not over yet; it can be closed from 2027-03-01 00:00 UTC" in resp.content.decode()
    enqueue.assert_not_called()
    assert not BillingPeriod.objects.exists()


def test_in_the_first_minute_of_a_month_the_month_before_closes_with_its_last_second(
        client, time_machine, post_batch, one_usd_per_gpu_second, django_capture_on_commit_callbacks):
    time_machine.move_to(datetime(2028, 3, 1, 0, 0, 20, tzinfo=UTC), tick=True)  # after 29 February 2028
    last_seconds = datetime(2028, 2, 29, 23, 59, 50, tzinfo=UTC)  # 10 s that end at midnight
    assert post_batch(make_batch(start=last_seconds, seq=1, workloads=SHARED_GPU_WORKLOADS)).status_code == 201
    rollup_usage(now=clock.now())
    login(client, group=FINANCE_GROUP)
    page = client.get("/periods/").content.decode()
    assert 'data-state="ready"' in row_html(page, "2028-02")
    assert "close-button" in row_html(page, "2028-02")
    resp, enqueue = press_close(client, "2028-02", django_capture_on_commit_callbacks)
    assert resp.status_code == 302
    enqueue.assert_called_once_with("2028-02")
    tasks.close_period.apply(args=("2028-02",)).get()
    totals = {i.tenant.slug: i.total_minor for i in Invoice.objects.select_related("tenant")}
    assert totals == {"acme": 100, "globex": 200}  # 10 % and 20 % of a card for the month's last 10 s


# --- The metered GPU-hours reconciled with the invoices -----------------------------------------

@pytest.fixture
def last_month_hour(post_batch, one_usd_per_gpu_second):
    """One A100 metered for an hour of last month: acme used 10 % of it, globex 20 %, the rest idle."""
    assert post_batch(make_batch(start=at(LAST_MONTH, 15), seq=1, seconds=3600,
                                 workloads=SHARED_GPU_WORKLOADS)).status_code == 201
    rollup_usage(now=clock.now())


def figure_text(html: str, testid: str) -> str:
    return html.split(f'data-testid="{testid}"', 1)[1].split(">", 1)[1].split("<", 1)[0]


def test_the_metered_gpu_hours_split_into_the_invoices_gpu_hours_and_idle_with_its_cost(client, last_month_hour):
    """Metered = attributed to tenants + idle, as shown: the attributed GPU-hours are those the month's
    invoices bill, and the idle's cost is the GPU cost page's Idle (platform) for the month."""
    close_period(month=LAST_MONTH, now=clock.now())
    login(client, group=FINANCE_GROUP)
    page = client.get("/periods/").content.decode()
    row = row_html(page, LAST)
    invoiced = sum((round(sum(i.lines.values_list("gpu_hours", flat=True), Decimal(0)), 2)
                    for i in Invoice.objects.filter(period__month=LAST_MONTH)), Decimal(0))
    assert invoiced == Decimal("0.30")  # acme 0.10 + globex 0.20
    assert figure_text(row, "period-attributed-gpu-hours") == "0.30"
    assert figure_text(row, "period-idle-gpu-hours") == "0.70"
    # The idle card time at 1 USD per GPU-second: 0.7 h x 3600 s, billed to nobody.
    assert figure_text(row, "period-idle-cost") == "2,520.00 USD not invoiced"
    assert 'data-testid="period-idle-invoiced"' not in row  # the platform idle policy spreads none
    assert 'data-testid="gpu-hours-split-definition"' in page
    walk = Walk()
    _check_page("/periods/", _marks(page), walk)
    assert f"gpu-hours-{LAST}" in walk.groups_checked  # 1.00 metered = 0.30 + 0.70, as shown
    last_day = LAST_MONTH.replace(day=28)
    finance = client.get("/finance/", {"start": LAST_MONTH.isoformat(), "end": last_day.isoformat()}).content.decode()
    assert figure_text(finance, "idle-cost") == "2,520.00 USD"
    idle_key = next(m.figure for m in _marks(page) if m.figure.startswith("idle_platform|"))
    assert idle_key in {m.figure for m in _marks(finance)}  # one figure, one key on both pages
    chinese = row_html(client.get("/periods/", HTTP_ACCEPT_LANGUAGE="zh-hans").content.decode(), LAST)
    assert figure_text(chinese, "period-idle-cost") == "2,520.00 USD 未开票"
    listed = client.get(f"/periods/{LAST}/status").json()["gpu_hours_split"]
    assert (listed["attributed_gpu_hours"], listed["idle_gpu_hours"]) == ("0.30", "0.70")


def test_the_month_is_written_in_the_readers_language_and_keyed_by_its_iso_month(client, last_month_usage):
    login(client, group=FINANCE_GROUP)
    chinese = row_html(client.get("/periods/", HTTP_ACCEPT_LANGUAGE="zh-hans").content.decode(), LAST)
    assert figure_text(chinese, "period-month") == f"{LAST_MONTH.year}年{LAST_MONTH.month}月"
    english = row_html(client.get("/periods/", HTTP_ACCEPT_LANGUAGE="en").content.decode(), LAST)
    assert figure_text(english, "period-month") == LAST  # the English format is the ISO month
    assert f'data-month="{LAST}"' in english

