"""The paired static-vs-dynamic report: exact figures on a hand-computable fleet, cold start
excluded, the paired t-test, and the job that reports progress and can run twice."""

from __future__ import annotations

import csv
import io
import json
import re
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from io import StringIO

import pytest
from django.core.management import call_command
from django.utils import translation

from billing.errors import InvalidInput
from billing.ledger.rollup import rollup_usage
from billing.models import AuditEvent, PairedReport, Tenant
from billing.services.savings.paired_report import compute_paired_report, profile_fraction
from billing.services.savings.report_pdf import render_paired_report_pdf
from billing.services.savings.reports import request_paired_report, run_paired_report
from tests import clock
from tests.conftest import SHARED_GPU_WORKLOADS, make_batch

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def _fixed_dates_stay_billable(settings):
    """These tests post usage on fixed past dates; keep them inside the late-usage horizon."""
    settings.VGPU_LATE_USAGE_HORIZON = timedelta(days=36500)

START = datetime(2026, 11, 20, 10, 0, tzinfo=UTC)


@pytest.fixture
def fifteen_minutes(post_batch, one_usd_per_gpu_second):
    for i in range(15):  # one 60 s batch per minute: p = 1 USD per GPU-second
        batch = make_batch(start=START + timedelta(minutes=i), seq=i + 1, seconds=60, workloads=SHARED_GPU_WORKLOADS)
        assert post_batch(batch).status_code == 201
    rollup_usage(now=clock.now())


@pytest.mark.parametrize(("peak_mb", "fraction"), [(8192, "1/7"), (10240, "1/7"), (10241, "2/7"), (30000, "3/7"),
                                                    (50000, "7/7")])
def test_profile_is_the_smallest_that_holds_the_peak(peak_mb, fraction):
    num, den = fraction.split("/")
    assert profile_fraction(peak_mem_mb=Decimal(peak_mb), memory_mb=81920) == Decimal(num) / Decimal(den)


def test_report_figures_on_a_hand_computable_fleet_with_cold_start_excluded(fifteen_minutes):
    report = compute_paired_report(start=START, end=START + timedelta(hours=1), now=clock.now())
    # Each workload ran 15 minutes; its first 5 are cold start: 600 s count.
    assert report["n_units"] == 2
    summary = report["summary"]
    assert Decimal(summary["static_whole_cost"]) == Decimal(1200)  # 2 × 600 s × 1 USD
    assert Decimal(summary["dynamic_cost"]) == Decimal(180)  # 600 × (0.1 + 0.2)
    assert Decimal(summary["static_profile_cost"]).quantize(Decimal("0.01")) == Decimal("257.14")  # 600/7 + 1200/7
    assert summary["cost_reduction_pct"] == pytest.approx(85.0)
    assert summary["containers_per_card"] == pytest.approx(2.0)
    assert summary["sm_utilisation_dynamic_pct"] == pytest.approx(30.0)
    assert summary["sm_utilisation_static_pct"] == pytest.approx(15.0)
    assert summary["idle_memory_share_dynamic_pct"] == pytest.approx(70.0)
    assert summary["resource_optimisation_efficiency"] == pytest.approx(1200 / 180)
    test = report["test_whole_vs_dynamic"]
    assert test["n"] == 2
    assert test["mean_saving"] == pytest.approx((540 + 480) / 2)
    low, high = test["ci95"]
    assert low < test["mean_saving"] < high
    assert 0 <= test["p_value"] <= 1


def test_the_report_reads_minutes_planned_on_their_statistics(fifteen_minutes):
    """A day just metered has no statistics until ANALYZE; the report analyses the minute days it
    reads first (on three fresh demo days its main read took 115 s unplanned, 4 s analysed)."""
    from django.db import connection

    partitions = [f"billing_{table}_p{START:%Y%m%d}" for table in ("usageminute", "gpuminute")]

    def reltuples() -> dict[str, float]:
        with connection.cursor() as cur:
            cur.execute("SELECT relname, reltuples FROM pg_class WHERE relname = ANY(%s)", [partitions])
            return dict(cur.fetchall())

    assert reltuples() == dict.fromkeys(partitions, -1.0)  # never analysed: the rollup analyses raw days only
    compute_paired_report(start=START, end=START + timedelta(hours=1), now=clock.now())
    assert all(n > 0 for n in reltuples().values()), reltuples()


def test_report_job_reports_progress_stores_the_result_and_runs_twice_safely(fifteen_minutes):
    report, _ = request_paired_report(start=START, end=START + timedelta(hours=1), now=clock.now(),
                                      actor_label="test")
    assert report.status == PairedReport.Status.PENDING
    from billing import tasks

    first = tasks.run_paired_report.apply(args=(report.pk,)).get()
    second = tasks.run_paired_report.apply(args=(report.pk,)).get()
    assert first == second == {"report": report.pk, "status": "done"}
    stored = PairedReport.objects.get(pk=report.pk)
    assert stored.progress_pct == 100
    assert stored.result is not None
    assert stored.result["n_units"] == 2


def test_bad_periods_are_refused_with_the_reason():
    now = clock.now()
    with pytest.raises(InvalidInput, match="after its start"):
        request_paired_report(start=now, end=now - timedelta(days=1), now=now, actor_label="test")
    with pytest.raises(InvalidInput, match="at most"):
        request_paired_report(start=now - timedelta(days=200), end=now, now=now, actor_label="test")
    assert not PairedReport.objects.exists()


def test_command_prints_the_report_as_json(fifteen_minutes):
    out = StringIO()
    call_command("paired_report", "--from", "2026-11-20", "--to", "2026-11-21", "--json", stdout=out)
    doc = json.loads(out.getvalue())
    assert doc["n_units"] == 2
    assert doc["test_whole_vs_dynamic"]["n"] == 2
    assert run_paired_report(report_id=doc["report"]).status == "done"


@pytest.fixture
def with_an_empty_card(post_batch, one_usd_per_gpu_second):
    """The fifteen minutes on GPU 0 while GPU 1 of the node is metered with no workload on it."""
    for i in range(15):
        batch = make_batch(start=START + timedelta(minutes=i), seq=i + 1, seconds=60, gpus=2,
                           workloads=SHARED_GPU_WORKLOADS)
        assert post_batch(batch).status_code == 201
    rollup_usage(now=clock.now())


def test_the_organisations_view_counts_every_card_it_holds_idle_or_not(with_an_empty_card):
    report = compute_paired_report(start=START, end=START + timedelta(hours=1), now=clock.now())
    assert report["currency"] == "USD"
    fleet = report["fleet"]
    # Whole cards: each of the two workloads holds a card 900 s (cold start included: the
    # organisation pays for it), plus GPU 1's 900 s with no workload, held either way.
    assert {k: Decimal(v) for k, v in fleet["whole_card"].items()} == {
        "workload_cards": Decimal(1800), "empty_cards": Decimal(900), "total": Decimal(2700)}
    # Dynamic: the two cards the fleet held, busy or idle, 900 s each.
    assert {k: Decimal(v) for k, v in fleet["dynamic"].items()} == {
        "busy_cards": Decimal(900), "empty_cards": Decimal(900), "total": Decimal(1800)}
    assert Decimal(fleet["saving"]) == 900
    assert fleet["reduction_pct"] == pytest.approx(100 / 3)
    # Chargeback: acme holds 10 % and globex 20 % of GPU 0; the platform keeps the rest.
    tenants = {t["tenant"]: (Decimal(t["whole_card"]), Decimal(t["dynamic"])) for t in report["chargeback"]["tenants"]}
    assert tenants == {"acme": (Decimal(900), Decimal(90)), "globex": (Decimal(900), Decimal(180))}
    platform = report["chargeback"]["platform"]
    assert (Decimal(platform["whole_card"]), Decimal(platform["dynamic"])) == (Decimal(900), Decimal(1530))
    # The rows add up to the fleet's cost under each allocation, exactly.
    assert sum(w for w, _ in tenants.values()) + Decimal(platform["whole_card"]) == Decimal(fleet["whole_card"]["total"])
    assert sum(d for _, d in tenants.values()) + Decimal(platform["dynamic"]) == Decimal(fleet["dynamic"]["total"])


def test_per_workload_day_figures_count_complete_days_only(fifteen_minutes):
    same_day = START + timedelta(hours=2)  # 2026-11-20 is not over yet
    report = compute_paired_report(start=START.replace(hour=0), end=START.replace(hour=0) + timedelta(days=1),
                                   now=same_day)
    assert report["n_units"] == 2
    assert report["test_whole_vs_dynamic"]["n"] == 0
    assert report["per_workload_day"] == {"complete_until": START.replace(hour=0).isoformat(),
                                          "partial_units_excluded": 2, "partial_days_excluded": ["2026-11-20"]}
    # The totals still cover the period as it stood.
    assert Decimal(report["summary"]["static_whole_cost"]) == Decimal(1200)
    next_day = compute_paired_report(start=START.replace(hour=0), end=START.replace(hour=0) + timedelta(days=1),
                                     now=START + timedelta(days=1))
    assert next_day["test_whole_vs_dynamic"]["n"] == 2
    assert next_day["per_workload_day"]["partial_units_excluded"] == 0


def test_a_report_shows_the_last_day_asked_for_its_currency_and_its_definitions(
        with_an_empty_card, client, time_machine):
    from billing.scope import FINANCE_GROUP
    from tests.conftest import user_in

    Tenant.objects.create(slug="acme", name="Acme Robotics")
    client.force_login(user_in(FINANCE_GROUP))
    report, _ = request_paired_report(start=START.replace(hour=0), end=START.replace(hour=0) + timedelta(days=1),
                                      now=clock.now(), actor_label="test")
    time_machine.move_to(START + timedelta(hours=3), tick=False)  # computed on the day itself
    run_paired_report(report_id=report.pk)
    html = client.get(f"/reports/{report.pk}/").content.decode()
    # Asked "from 2026-11-20 to 2026-11-20 inclusive": the page says so, never 2026-11-21.
    assert "2026-11-20 – 2026-11-20 (UTC, both days included)" in html
    assert "2026-11-21" not in html
    fleet = html.split('data-testid="fleet-cost"')[1].split("</table>")[0]
    assert "2,700.00 USD" in fleet
    assert "1,800.00 USD" in fleet
    assert "900.00 USD" in fleet
    assert "33.3 %" in fleet
    chargeback = html.split('data-testid="chargeback"')[1].split("</table>")[0]
    assert "Acme Robotics" in chargeback
    assert "globex" in chargeback
    assert "1,530.00 USD" in chargeback
    summary = html.split('data-testid="report-summary"')[1].split("</table>")[0]
    cells = dict(re.findall(r"<tr><th>(.*?)</th><td class=\"num\">(.*?)</td></tr>", summary))
    assert cells["Static cost, whole cards"] == "1,200.00 USD"
    assert cells["Dynamic cost (charged)"] == "180.00 USD"
    assert cells["Static cost, fixed profiles"] == "257.14 USD"
    # Computed on 2026-11-20 itself: no complete workload-day yet, so no mean saving.
    assert cells["Complete workload-days compared (n)"] == "0"
    assert cells["Mean saving per complete workload-day"] == "—"
    assert "2026-11-20 are left out of the per-workload-day figures" in html
    # Nothing a web user cannot open.
    assert 'id="definitions"' in html
    assert "Fleet cost" in html
    assert "Chargeback" in html
    assert "docs/" not in html
    assert ".md" not in html

    rows = list(csv.reader(io.StringIO(client.get(f"/reports/{report.pk}.csv").content.decode("utf-8-sig"))))
    assert rows[0] == ["section", "row", "whole_card", "dynamic", "saving", "reduction_pct", "currency"]
    fleet_total = next(r for r in rows if r[0] == "fleet" and r[1] == "Fleet cost")
    assert fleet_total == ["fleet", "Fleet cost", "2700.00", "1800.00", "900.00", "33.33", "USD"]
    for row in rows[1:]:
        for amount in row[2:5]:
            assert amount == "" or re.fullmatch(r"-?\d+(\.\d{2})?", amount), row
    pdf = client.get(f"/reports/{report.pk}.pdf")
    assert pdf.status_code == 200
    assert pdf.content.startswith(b"%PDF")
    with translation.override("zh-hans"):  # and a tenant name that is not markup
        stored = PairedReport.objects.get(pk=report.pk)
        assert render_paired_report_pdf(stored, tenant_names={"acme": "R&D <lab>"}).startswith(b"%PDF")


def test_report_pages_request_show_progress_then_results_and_a_pdf(fifteen_minutes, client, django_capture_on_commit_callbacks):
    from django.contrib.auth.models import Group, User

    from billing.scope import FINANCE_GROUP

    user = User.objects.create_user(username="fin", password="pw-not-used-123")
    user.groups.add(Group.objects.get_or_create(name=FINANCE_GROUP)[0])
    client.force_login(user)
    from unittest import mock

    with mock.patch("billing.tasks.run_paired_report.delay") as enqueue, \
            django_capture_on_commit_callbacks(execute=True):
        resp = client.post("/reports/", {"start": "2026-11-20", "end": "2026-11-20"})
    report = PairedReport.objects.get()
    assert resp.status_code == 302
    assert resp["Location"] == f"/reports/{report.pk}/"
    enqueue.assert_called_once_with(report.pk)
    pending = client.get(f"/reports/{report.pk}/").content.decode()
    assert 'data-testid="report-progress"' in pending
    assert 'http-equiv="refresh"' in pending
    run_paired_report(report_id=report.pk)
    done = client.get(f"/reports/{report.pk}/").content.decode()
    assert 'data-testid="report-summary"' in done
    assert "85.00 %" in done
    assert 'data-testid="study-comparison"' in done
    assert "−37 %" in done
    assert "−85.0 %" in done
    pdf = client.get(f"/reports/{report.pk}.pdf")
    assert pdf.status_code == 200
    assert pdf.content.startswith(b"%PDF")


def test_a_period_already_being_computed_is_joined_not_computed_twice(fifteen_minutes, client, time_machine,
                                                                      django_capture_on_commit_callbacks):
    from unittest import mock

    from django.contrib.auth.models import Group, User

    from billing.scope import FINANCE_GROUP
    from billing.services.savings.reports import IN_FLIGHT_REUSE

    user = User.objects.create_user(username="fin", password="pw-not-used-123")
    user.groups.add(Group.objects.get_or_create(name=FINANCE_GROUP)[0])
    client.force_login(user)
    period = {"start": "2026-11-20", "end": "2026-11-20"}

    def post(data: dict[str, str]):
        with mock.patch("billing.tasks.run_paired_report.delay") as enqueue, \
                django_capture_on_commit_callbacks(execute=True):
            resp = client.post("/reports/", data, follow=True)
        return resp, enqueue

    first, enqueued = post(period)
    report = PairedReport.objects.get()
    assert first.redirect_chain == [(f"/reports/{report.pk}/", 302)]
    assert 'data-testid="message"' not in first.content.decode()
    enqueued.assert_called_once_with(report.pk)
    # A second click while it is pending, and one while it runs: the same report, nothing enqueued.
    for status in (PairedReport.Status.PENDING, PairedReport.Status.RUNNING):
        PairedReport.objects.filter(pk=report.pk).update(status=status)
        again, enqueued = post(period)
        assert again.redirect_chain == [(f"/reports/{report.pk}/", 302)]
        assert 'data-testid="message"' in again.content.decode()
        enqueued.assert_not_called()
    assert PairedReport.objects.count() == 1
    # Another period is a report of its own.
    _, enqueued = post({"start": "2026-11-19", "end": "2026-11-20"})
    assert PairedReport.objects.count() == 2
    enqueued.assert_called_once()
    # Once done, the same period asks for a new report (the ledger may have grown since).
    run_paired_report(report_id=report.pk)
    _, enqueued = post(period)
    newer = PairedReport.objects.exclude(pk=report.pk).get(period_start=report.period_start,
                                                           period_end=report.period_end)
    enqueued.assert_called_once_with(newer.pk)
    # One in flight for longer than IN_FLIGHT_REUSE is taken for lost: a new report is computed.
    time_machine.move_to(clock.now() + IN_FLIGHT_REUSE + timedelta(minutes=1), tick=False)
    _, enqueued = post(period)
    assert PairedReport.objects.filter(period_start=report.period_start, period_end=report.period_end).count() == 3
    enqueued.assert_called_once()
    assert AuditEvent.objects.filter(action="paired_report.requested").count() == 4


def test_report_pages_are_for_finance_and_admins_only(client):
    from django.contrib.auth.models import User

    client.force_login(User.objects.create_user(username="tenant-user", password="pw-not-used-123"))
    assert client.get("/reports/").status_code == 403
