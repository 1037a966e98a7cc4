"""The paired static-vs-dynamic report: exact figures on a hand-computable fleet, cold start
excluded, the paired t-test, and the job that reports progress and can run twice."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from io import StringIO

import pytest
from django.core.management import call_command

from billing.errors import InvalidInput
from billing.ledger.rollup import rollup_usage
from billing.models import PairedReport
from billing.services.paired_report import compute_paired_report, profile_fraction
from billing.services.reports import request_paired_report, run_paired_report
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
    report = compute_paired_report(start=START, end=START + timedelta(hours=1))
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
    assert test["n"] == 2 and test["mean_saving"] == pytest.approx((540 + 480) / 2)
    low, high = test["ci95"]
    assert low < test["mean_saving"] < high and 0 <= test["p_value"] <= 1


def test_report_job_reports_progress_stores_the_result_and_runs_twice_safely(fifteen_minutes):
    report = request_paired_report(start=START, end=START + timedelta(hours=1), now=clock.now(),
                                   actor_label="test")
    assert report.status == PairedReport.Status.PENDING
    from billing import tasks

    first = tasks.run_paired_report.apply(args=[report.pk]).get()
    second = tasks.run_paired_report.apply(args=[report.pk]).get()
    assert first == second == {"report": report.pk, "status": "done"}
    stored = PairedReport.objects.get(pk=report.pk)
    assert stored.progress_pct == 100 and stored.result["n_units"] == 2


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
    assert doc["n_units"] == 2 and doc["test_whole_vs_dynamic"]["n"] == 2
    assert run_paired_report(report_id=doc["report"]).status == "done"


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
    assert resp.status_code == 302 and resp["Location"] == f"/reports/{report.pk}/"
    enqueue.assert_called_once_with(report.pk)
    pending = client.get(f"/reports/{report.pk}/").content.decode()
    assert 'data-testid="report-progress"' in pending and 'http-equiv="refresh"' in pending
    run_paired_report(report_id=report.pk)
    done = client.get(f"/reports/{report.pk}/").content.decode()
    assert 'data-testid="report-summary"' in done and "85.00 %" in done
    assert 'data-testid="study-comparison"' in done and "−37 %" in done and "−85.0 %" in done
    pdf = client.get(f"/reports/{report.pk}.pdf")
    assert pdf.status_code == 200 and pdf.content.startswith(b"%PDF")


def test_report_pages_are_for_finance_and_admins_only(client):
    from django.contrib.auth.models import User

    client.force_login(User.objects.create_user(username="tenant-user", password="pw-not-used-123"))
    assert client.get("/reports/").status_code == 403
