"""The dashboard's savings card names its own period and reads only a report of exactly that
period: finished, it shows its figures; being computed, its progress; neither, a button that
requests one for that period (a second click joins it). Bad dates on the button's POST are a
400 with nothing created; tenants never see the card nor may press it. English and Simplified
Chinese."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, date, datetime, timedelta

import pytest
from django.http import HttpResponse
from django.test import Client
from django.utils import translation

from billing.models import AuditEvent, PairedReport
from billing.scope import ADMIN_GROUP, FINANCE_GROUP
from billing.services.savings.reports import IN_FLIGHT_REUSE
from tests import clock
from tests.billing.savings_results import report_result
from tests.conftest import user_in

pytestmark = pytest.mark.django_db

NOVEMBER = {"start": "2026-11-01", "end": "2026-11-30"}
NOVEMBER_BOUNDS = (datetime(2026, 11, 1, tzinfo=UTC), datetime(2026, 12, 1, tzinfo=UTC))


@pytest.fixture(autouse=True)
def _english_afterwards() -> Iterator[None]:
    # A request in Chinese leaves the thread's language active; the tests after this one read English.
    yield
    translation.activate("en")


def card(response: HttpResponse) -> str:
    html = response.content.decode()
    assert 'data-testid="savings-vs-static"' in html, html[:2000]
    return html.split('data-testid="savings-vs-static"')[1].split("</section>")[0]


@pytest.fixture
def finance(client: Client) -> Client:
    client.force_login(user_in(FINANCE_GROUP))
    return client


def test_no_report_of_the_period_offers_a_button_for_exactly_that_period(finance):
    # A finished report of another period, the latest of all: not this period's.
    PairedReport.objects.create(created_at=clock.now(), finished_at=clock.now(), status="done", progress_pct=100,
                                period_start=datetime(2026, 11, 30, tzinfo=UTC),
                                period_end=datetime(2026, 12, 3, tzinfo=UTC),
                                result=report_result(costs={"whole_card": "15000", "request_fraction": None,
                                                            "fixed_profile": None}, dynamic="2923.16"))
    block = card(finance.get("/finance/", NOVEMBER))
    assert 'data-testid="savings-period">2026-11-01 – 2026-11-30 (UTC, both days included)<' in block
    assert "No savings report for this period." in block
    assert "12,076.84" not in block
    form = block.split('data-testid="savings-request"')[1].split("</form>")[0]
    assert 'name="csrfmiddlewaretoken"' in form
    assert '<input type="hidden" name="start" value="2026-11-01">' in form
    assert '<input type="hidden" name="end" value="2026-11-30">' in form
    assert 'action="/finance/?start=2026-11-01&amp;end=2026-11-30"' in block
    assert "Compute the report for this period" in form


def test_the_button_creates_one_report_of_the_period_and_a_second_click_joins_it(
        finance, django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks() as queued:
        resp = finance.post("/finance/?start=2026-11-01&end=2026-11-30", NOVEMBER)
    assert resp.status_code == 302
    assert resp["Location"] == "/finance/?start=2026-11-01&end=2026-11-30#savings"
    assert len(queued) == 1  # its job, enqueued once the row is committed
    report = PairedReport.objects.get()
    assert (report.period_start, report.period_end, report.status) == (*NOVEMBER_BOUNDS, "pending")
    assert report.last_day == date(2026, 11, 30)

    with django_capture_on_commit_callbacks() as queued:
        again = finance.post("/finance/?start=2026-11-01&end=2026-11-30", NOVEMBER)
    assert again.status_code == 302
    assert queued == []
    assert PairedReport.objects.get() == report  # joined, not duplicated
    assert AuditEvent.objects.filter(action="paired_report.requested").count() == 1

    page = finance.get(again["Location"])
    block = card(page)
    assert "already being computed" in page.content.decode()
    assert '<progress max="100" value="0" data-testid="savings-progress">' in block
    assert f"Paired report {report.pk} of this period is being computed (0 %)." in block
    assert f'href="/reports/{report.pk}/" data-testid="savings-report-link"' in block
    # A past period's page does not refresh: the card says how to see the result.
    assert "Reload the page to see it when it is ready." in block
    assert 'data-testid="savings-request"' not in block


def test_a_report_being_computed_for_the_month_to_date_shows_its_progress_live(finance):
    now = clock.now()
    first = now.date().replace(day=1)
    start = datetime(first.year, first.month, first.day, tzinfo=UTC)
    end = datetime(now.year, now.month, now.day, tzinfo=UTC) + timedelta(days=1)
    running = PairedReport.objects.create(created_at=now, period_start=start, period_end=end, status="running",
                                          progress_pct=60)
    # Another period's report in flight is not this one's.
    PairedReport.objects.create(created_at=now, period_start=start, period_end=end + timedelta(days=1),
                                status="running", progress_pct=90)
    resp = finance.get("/finance/")  # the month to date
    html = resp.content.decode()
    assert '<meta name="live-refresh" content="15">' in html
    block = card(resp)
    assert f"{first:%Y-%m-%d} – {now.date():%Y-%m-%d} (UTC, both days included)" in block
    assert '<progress max="100" value="60" data-testid="savings-progress">' in block
    assert f"Paired report {running.pk} of this period is being computed (60 %)." in block
    assert "This card refreshes with the figures." in block
    assert f'href="/reports/{running.pk}/"' in block
    # The card lives in the region the page swaps in on each refresh.
    region = html.split('<div data-live="dashboard">')[1]
    assert 'data-testid="savings-progress"' in region

    # One in flight longer than IN_FLIGHT_REUSE is taken for lost: a new one may be requested.
    PairedReport.objects.filter(pk=running.pk).update(created_at=now - IN_FLIGHT_REUSE - timedelta(minutes=1))
    block = card(finance.get("/finance/"))
    assert 'data-testid="savings-progress"' not in block
    assert 'data-testid="savings-request"' in block


def test_a_failed_report_of_the_period_leaves_the_button(finance):
    PairedReport.objects.create(created_at=clock.now(), period_start=NOVEMBER_BOUNDS[0],
                                period_end=NOVEMBER_BOUNDS[1], status="failed", error="boom")
    block = card(finance.get("/finance/", NOVEMBER))
    assert "No savings report for this period." in block
    assert 'data-testid="savings-request"' in block


@pytest.mark.parametrize(("form", "why"), [
    ({"start": "9999-12-31", "end": "9999-12-31"}, "2199-12-31"),
    ({"start": "2026-02-30", "end": "2026-03-01"}, "2026-01-31"),
    ({"start": "NaN", "end": "2026-11-30"}, "2026-01-31"),
    ({"start": "2026-11-30", "end": "2026-11-01"}, "must not be before"),
    ({"start": "2026-11-01"}, "required"),
    ({"start": "2026-11-01\x00", "end": "2026-11-30"}, "2026-01-31"),
    ({"start": "2025-01-01", "end": "2026-11-30"}, "at most 366 days"),  # longer than any dashboard period
])
def test_forged_dates_are_the_period_form_s_400_and_create_nothing(finance, form, why):
    resp = finance.post("/finance/", form)
    assert resp.status_code == 400
    assert why in resp.content.decode()
    assert not PairedReport.objects.exists()


@pytest.mark.parametrize(("form", "why"), [
    # A dashboard period, but longer than a paired report may be.
    ({"start": "2026-01-01", "end": "2026-11-30"}, "A paired report covers at most 92 days."),
    ({"start": "2199-01-01", "end": "2199-01-02"}, "The report&#x27;s period starts in the future."),
])
def test_a_period_no_report_may_cover_is_the_card_s_400_and_creates_nothing(finance, form, why):
    resp = finance.post("/finance/", form)
    assert resp.status_code == 400
    block = card(resp)
    assert why in block.split('data-testid="savings-error"')[1]
    assert not PairedReport.objects.exists()
    # The page itself says so before anyone presses: no button, the reason instead.
    block = card(finance.get("/finance/", form))
    assert 'data-testid="savings-request"' not in block
    assert why in block.split('data-testid="savings-refusal"')[1]


def test_tenant_members_neither_see_the_card_nor_may_press_it(client):
    client.force_login(user_in(tenant="acme"))
    assert 'data-testid="savings-vs-static"' not in client.get("/finance/", NOVEMBER).content.decode()
    assert client.post("/finance/", NOVEMBER).status_code == 403
    client.logout()
    resp = client.post("/finance/", NOVEMBER)
    assert resp.status_code == 302
    assert resp["Location"].startswith("/accounts/login/")
    assert not PairedReport.objects.exists()


def test_the_button_needs_the_page_s_csrf_token():
    client = Client(enforce_csrf_checks=True)
    client.force_login(user_in(ADMIN_GROUP))
    assert client.post("/finance/", NOVEMBER).status_code == 403
    assert not PairedReport.objects.exists()


def test_the_card_speaks_simplified_chinese(finance):
    zh = {"HTTP_ACCEPT_LANGUAGE": "zh-hans"}
    block = card(finance.get("/finance/", NOVEMBER, **zh))
    assert "2026年11月1日 – 2026年11月30日（UTC" in block  # then a fullwidth comma, "both days included"
    assert "含首尾两天）" in block
    assert "该区间暂无节省报告。" in block
    assert "生成该区间的报告" in block
    finance.post("/finance/", NOVEMBER, **zh)
    report = PairedReport.objects.get()
    block = card(finance.get("/finance/", NOVEMBER, **zh))
    assert f"该区间的配对报告 {report.pk} 正在计算（0 %）。" in block
    assert "报告完成后重新加载本页即可查看。" in block
    assert "查看报告进度" in block
    PairedReport.objects.filter(pk=report.pk).update(
        status="done", progress_pct=100, finished_at=datetime(2026, 12, 1, 3, tzinfo=UTC),
        result=report_result(costs=dict.fromkeys(("whole_card", "request_fraction", "fixed_profile")),
                             dynamic="2949.12", n=1, mean=None, p_value=None))
    block = card(finance.get("/finance/", NOVEMBER, **zh))
    assert "2026年11月1日 – 2026年11月30日" in block
    assert f"来自配对报告 {report.pk}" in block
    assert "计算于 2026年12月1日" in block
    resp = finance.post("/finance/", {"start": "2026-01-01", "end": "2026-11-30"}, **zh)
    assert resp.status_code == 400
    assert "一份配对报告最多覆盖 92 天。" in card(resp)


def _done(result: dict) -> PairedReport:
    start, end = NOVEMBER_BOUNDS
    return PairedReport.objects.create(created_at=clock.now(), finished_at=clock.now(), status="done",
                                       progress_pct=100, period_start=start, period_end=end, result=result)


def test_no_feasible_alternative_prices_nothing_and_counts_the_fleet_in_one_minute(finance):
    # The fleet metered 32 cards at its busiest minute (a burst node on), 24 when each static
    # alternative fell short. Nothing is compared: no paired test against an alternative that
    # needs cards the fleet did not have, and no "the fleet's 32" beside "the fleet metered 24".
    result = report_result(costs=dict.fromkeys(("whole_card", "request_fraction", "fixed_profile")),
                           dynamic="11837.44", fleet_cards=24)
    result["fleet"]["held"]["peak_cards"] = 32
    result["fleet"]["dynamic"].update(peak_cards=30, fleet_cards_at_peak=32)
    report = _done(result)
    block = card(finance.get("/finance/", NOVEMBER))
    assert "No static alternative fits on this fleet" in block
    sentence = block.split('data-testid="savings-headline-sentence">')[1].split("</div>")[0]
    assert "11,837.44 USD" in sentence  # what dynamic cost, still said
    assert "32" not in sentence
    assert "24" not in sentence
    assert "30 of 32 cards" in block  # dynamic at its busiest minute, of the cards metered then
    for key in ("whole_card", "request_fraction", "fixed_profile"):
        row = block.split(f'data-testid="savings-alternative-{key}">')[1].split("</dd>")[0]
        assert "the fleet metered 24 in that minute" in row
        assert "USD" not in row
    assert 'data-testid="savings-paired"' not in block
    assert 'data-testid="savings-mean"' not in block
    # The report page, its CSV and its PDF price none of them either.
    page = finance.get(f"/reports/{report.pk}/").content.decode()
    paired = page.split('data-testid="paired-tests"')[1].split("</table>")[0]
    assert paired.count('data-testid="paired-infeasible-') == 3
    assert "USD" not in paired
    study = page.split('data-testid="study-comparison"')[1].split("</table>")[0]
    assert "50.0 %" not in study
    assert "Not feasible" in study
    rows = finance.get(f"/reports/{report.pk}.csv").content.decode("utf-8-sig").splitlines()
    assert [r for r in rows if r.startswith("paired_test,")] == [
        f"paired_test,not_feasible,{key},no,,,,,,," for key in ("whole_card", "request_fraction", "fixed_profile")]
    assert finance.get(f"/reports/{report.pk}.pdf").content.startswith(b"%PDF")


def test_the_card_tests_only_against_the_feasible_baseline(finance):
    _done(report_result(costs={"whole_card": None, "request_fraction": "1788.47", "fixed_profile": None},
                        dynamic="1820.70"))
    block = card(finance.get("/finance/", NOVEMBER))
    paired = block.split('data-testid="savings-paired"')[1].split("</dl>")[0]
    assert "Request fractions" in paired
    assert "Whole cards" not in paired
