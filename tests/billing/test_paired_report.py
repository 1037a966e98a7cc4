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
from billing.ledger.partitions import MINUTE_TABLES, partition_name
from billing.ledger.rollup import rollup_usage
from billing.models import AuditEvent, PairedReport, Tenant
from billing.services.savings import headline_text, savings_tables
from billing.services.savings.paired_report import compute_paired_report
from billing.services.savings.report_pdf import render_paired_report_pdf
from billing.services.savings.reports import request_paired_report, run_paired_report
from tests import clock
from tests.conftest import SHARED_GPU_WORKLOADS, make_batch, new_user

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


def _costs(report: dict) -> dict[str, Decimal | None]:
    """Each allocation's cost on the fleet (None: not feasible)."""
    fleet = report["fleet"]
    return {"dynamic": Decimal(fleet["dynamic"]["cost"]),
            **{k: None if v["cost"] is None else Decimal(v["cost"]) for k, v in fleet["alternatives"].items()}}


def test_report_figures_on_a_hand_computable_fleet_with_cold_start_excluded(fifteen_minutes):
    """One card, two workloads on it for 15 minutes at 1 USD per GPU-second: bert uses 8 GB and
    10 % of the SMs, llm 16 GB and 20 %."""
    report = compute_paired_report(start=START, end=START + timedelta(hours=1), now=clock.now())
    # Each workload ran 15 minutes; its first 5 are cold start: 600 s count.
    assert report["n_units"] == 2
    summary = report["summary"]
    static = {k: Decimal(v) for k, v in summary["static_cost"].items()}
    assert static["whole_card"] == Decimal(1200)  # 2 × 600 s × 1 USD
    # Request fractions: ½ × memory share + ½ × SM share of each need: 0.1 and 0.2 of the card.
    assert static["request_fraction"] == Decimal(180)
    # Fixed profiles: bert in 1g.10gb (1 of 8 memory, 1 of 7 compute slices), llm in 2g.20gb (2 and 2).
    assert static["fixed_profile"].quantize(Decimal("0.01")) == Decimal("241.07")  # 600 × (1/16 + 1/14 + 2/16 + 2/14)
    assert Decimal(summary["dynamic_cost"]) == Decimal(180)  # 600 × (0.1 + 0.2)
    assert summary["chargeback_reduction_pct"]["whole_card"] == pytest.approx(85.0)
    assert summary["chargeback_reduction_pct"]["request_fraction"] == pytest.approx(0.0)
    assert report["profiles"] == {"NVIDIA A100-SXM4-80GB": {"1g.10gb": 1, "2g.20gb": 1}}
    assert summary["containers_per_card"] == pytest.approx(2.0)
    assert summary["sm_utilisation_dynamic_pct"] == pytest.approx(30.0)
    assert summary["sm_utilisation_static_pct"] == pytest.approx(15.0)
    assert summary["idle_memory_share_dynamic_pct"] == pytest.approx(70.0)
    assert summary["resource_optimisation_efficiency"] == pytest.approx(1200 / 180)
    test = report["tests"]["whole_card"]
    assert test["n"] == 2
    assert test["mean_saving"] == pytest.approx((540 + 480) / 2)
    low, high = test["ci95"]
    assert low < test["mean_saving"] < high
    assert 0 <= test["p_value"] <= 1
    # On the fleet (cold start included: 900 s): the fleet has one card; whole cards need two.
    fleet = report["fleet"]
    whole = fleet["alternatives"]["whole_card"]
    assert whole["feasible"] is False
    assert whole["cost"] is None
    assert (whole["shortfall"]["needed"], whole["shortfall"]["had"]) == (2, 1)
    assert whole["shortfall"]["at"] == START.isoformat()
    assert _costs(report) == {"dynamic": 900, "whole_card": None, "request_fraction": 900, "fixed_profile": 900}
    # Equal costs: the first in the order whole cards, request fractions, fixed profiles.
    assert fleet["baseline"] == "request_fraction"
    assert Decimal(fleet["saving"]) == 0


def test_the_report_reads_minutes_planned_on_their_statistics(fifteen_minutes):
    """A day just metered has no statistics until ANALYZE; the report analyses the minute days it
    reads first (on three fresh demo days its main read took 115 s unplanned, 4 s analysed)."""
    from django.db import connection

    partitions = [partition_name(START.date(), table) for table in MINUTE_TABLES]

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
    assert doc["tests"]["whole_card"]["n"] == 2
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
    # The fleet held both cards 900 s each (cold start included: the organisation pays for it);
    # GPU 1 had no workload.
    assert {k: Decimal(v) for k, v in fleet["held"].items() if k != "peak_cards"} == {
        "busy_cards": Decimal(900), "empty_cards": Decimal(900), "total": Decimal(1800)}
    assert fleet["held"]["peak_cards"] == 2
    assert fleet["dynamic"]["peak_cards"] == 1
    # Whole cards fit now (two workloads, two cards) and keep both busy; the fractions and the
    # profiles share GPU 0 as dynamic allocation did.
    assert _costs(report) == {"dynamic": 900, "whole_card": 1800, "request_fraction": 900, "fixed_profile": 900}
    assert Decimal(fleet["alternatives"]["whole_card"]["card_hours"]) == Decimal("0.5")
    assert fleet["baseline"] == "request_fraction"
    assert Decimal(fleet["saving"]) == 0
    # Chargeback: acme holds 10 % and globex 20 % of GPU 0 either way; the platform keeps the rest of
    # each allocation's cost.
    tenants = {t["tenant"]: {k: Decimal(v) for k, v in t.items() if k != "tenant"}
               for t in report["chargeback"]["tenants"]}
    cents = {t: {k: v.quantize(Decimal("0.01")) for k, v in amounts.items()} for t, amounts in tenants.items()}
    assert cents == {  # profiles: 900 × (1/16 + 1/14) and 900 × (2/16 + 2/14)
        "acme": {"dynamic": 90, "whole_card": 900, "request_fraction": 90, "fixed_profile": Decimal("120.54")},
        "globex": {"dynamic": 180, "whole_card": 900, "request_fraction": 180, "fixed_profile": Decimal("241.07")}}
    platform = {k: Decimal(v) for k, v in report["chargeback"]["platform"].items()}
    # The rows add up to each allocation's cost on the fleet, exactly.
    for allocation, cost in _costs(report).items():
        assert sum(t[allocation] for t in tenants.values()) + platform[allocation] == cost, allocation


def _spread_and_packed(post_batch, *, gpus: int, placement: list[tuple[int, str, float, float]],
                       busiest: dict[str, int] | None = None) -> None:
    """15 minutes of workloads (GPU, pod, memory MB, SMs used = granted) on a node of `gpus` cards; a
    pod in `busiest` uses its SMs in that minute only, and 10 % of them in the others."""
    for i in range(15):
        workloads = [{"gpu": gpu, "tenant": "acme", "pod": pod, "mem_used": mem, "mem_granted": mem,
                      "sm_used": sm if (busiest or {}).get(pod, i) == i else 10.8,
                      "sm_granted": sm if (busiest or {}).get(pod, i) == i else 10.8}
                     for gpu, pod, mem, sm in placement]
        batch = make_batch(start=START + timedelta(minutes=i), seq=i + 1, seconds=60, gpus=gpus, workloads=workloads)
        assert post_batch(batch).status_code == 201
    rollup_usage(now=clock.now())


def test_a_workload_holds_a_static_slice_only_in_the_minutes_it_ran(post_batch, one_usd_per_gpu_second):
    """Pod "a" ran on the node's one card in minutes 0-4 and 10-14, pod "b" in minutes 5-9 (the
    ledger has no minute of "a" between): one card holds each alternative at every minute, so
    whole cards are feasible and cost the card's 15 minutes, not a second card for the stretch
    "a" was away."""
    for i in range(15):
        pod = "b" if 5 <= i < 10 else "a"
        workloads = [{"gpu": 0, "tenant": "acme", "pod": pod, "mem_used": 20000.0, "mem_granted": 20000.0,
                      "sm_used": 27.0, "sm_granted": 27.0}]
        batch = make_batch(start=START + timedelta(minutes=i), seq=i + 1, seconds=60, gpus=1, workloads=workloads)
        assert post_batch(batch).status_code == 201
    rollup_usage(now=clock.now())
    report = compute_paired_report(start=START, end=START + timedelta(hours=1), now=clock.now())
    alternatives = report["fleet"]["alternatives"]
    assert {name: alt["shortfall"] for name, alt in alternatives.items()} == dict.fromkeys(alternatives)
    assert _costs(report) == {"dynamic": 900, "whole_card": 900, "request_fraction": 900, "fixed_profile": 900}
    assert alternatives["whole_card"]["peak_cards"] == 1


def test_dynamic_dearer_than_the_cheapest_feasible_alternative_says_so(post_batch, one_usd_per_gpu_second):
    """Dynamic allocation left two small workloads on two cards; request fractions and fixed profiles
    put them on one: dynamic cost twice as much, and the headline says so with a negative saving."""
    _spread_and_packed(post_batch, gpus=2, placement=[(0, "bert-1", 4096.0, 10.8), (1, "bert-2", 4096.0, 10.8)])
    report = compute_paired_report(start=START, end=START + timedelta(hours=1), now=clock.now())
    assert _costs(report) == {"dynamic": 1800, "whole_card": 1800, "request_fraction": 900, "fixed_profile": 900}
    fleet = report["fleet"]
    assert fleet["baseline"] == "request_fraction"
    assert Decimal(fleet["saving"]) == -900
    assert fleet["reduction_pct"] == pytest.approx(-100.0)
    tables = savings_tables(report, {})
    assert tables is not None
    assert headline_text(tables) == ("900.00 USD (100.0 %)", "more than Request fractions (time-slicing, HAMi), the "
                                     "cheapest static alternative that fits on this fleet: dynamic allocation cost more.")


def test_a_fleet_too_small_for_a_static_alternative_is_not_priced(post_batch, one_usd_per_gpu_second):
    """Three workloads share GPU 0 of a two-card node, each busiest in another minute (SMs 50 %,
    40 % and 30 %, else 10 %): dynamic allocation ran them on one card; whole cards need three
    cards and are not feasible; fractions and profiles, sized to the busiest minutes, need two."""
    _spread_and_packed(post_batch, gpus=2, placement=[(0, "a", 1000.0, 54.0), (0, "b", 1000.0, 43.2),
                                                      (0, "c", 1000.0, 32.4)], busiest={"a": 7, "b": 8, "c": 9})
    report = compute_paired_report(start=START, end=START + timedelta(hours=1), now=clock.now())
    # Fractions: 50 % + 40 % on one card, 30 % on the other. Profiles: 4g.40gb + 3g.40gb on one
    # card (7 compute slices), a 3g.40gb on the other.
    assert _costs(report) == {"dynamic": 900, "whole_card": None, "request_fraction": 1800, "fixed_profile": 1800}
    assert report["profiles"] == {"NVIDIA A100-SXM4-80GB": {"3g.40gb": 2, "4g.40gb": 1}}
    whole = report["fleet"]["alternatives"]["whole_card"]
    assert whole["shortfall"] | {"at": None} == {"at": None, "model": "NVIDIA A100-SXM4-80GB", "needed": 3, "had": 2}
    assert report["chargeback"]["platform"]["whole_card"] is None
    assert all(t["whole_card"] is None for t in report["chargeback"]["tenants"])
    fleet = report["fleet"]
    assert fleet["baseline"] == "request_fraction"
    assert Decimal(fleet["saving"]) == 900
    assert fleet["reduction_pct"] == pytest.approx(50.0)


def test_a_request_above_use_sizes_the_static_slice(post_batch, one_usd_per_gpu_second):
    """A workload that asked for 60 GB and used 1 GB holds 60 GB under a static alternative."""
    workloads = [{"gpu": 0, "tenant": "acme", "pod": p, "mem_used": 1000.0, "mem_granted": 1000.0, "sm_used": 10.8,
                  "sm_granted": 10.8} for p in ("asks-a-lot", "asks-a-lot-too")]
    for i in range(15):
        batch = make_batch(start=START + timedelta(minutes=i), seq=i + 1, seconds=60, gpus=2, workloads=workloads)
        for sample in batch["samples"]:
            sample["mem_requested_mb"] = 61440
        assert post_batch(batch).status_code == 201
    rollup_usage(now=clock.now())
    report = compute_paired_report(start=START, end=START + timedelta(hours=1), now=clock.now())
    # 60 GB each: two cards under fractions; 7g.80gb under profiles (more than 4 memory slices).
    assert _costs(report) == {"dynamic": 900, "whole_card": 1800, "request_fraction": 1800, "fixed_profile": 1800}
    assert report["profiles"] == {"NVIDIA A100-SXM4-80GB": {"7g.80gb": 2}}


def test_per_workload_day_figures_count_complete_days_only(fifteen_minutes):
    same_day = START + timedelta(hours=2)  # 2026-11-20 is not over yet
    report = compute_paired_report(start=START.replace(hour=0), end=START.replace(hour=0) + timedelta(days=1),
                                   now=same_day)
    assert report["n_units"] == 2
    assert report["tests"]["whole_card"]["n"] == 0
    assert report["per_workload_day"] == {"complete_until": START.replace(hour=0).isoformat(),
                                          "partial_units_excluded": 2, "partial_days_excluded": ["2026-11-20"]}
    # The totals still cover the period as it stood.
    assert Decimal(report["summary"]["static_cost"]["whole_card"]) == Decimal(1200)
    next_day = compute_paired_report(start=START.replace(hour=0), end=START.replace(hour=0) + timedelta(days=1),
                                     now=START + timedelta(days=1))
    assert next_day["tests"]["whole_card"]["n"] == 2
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
    # The headline: against request fractions, the cheapest alternative that fits (fixed profiles
    # cost as much; whole cards keep both cards busy).
    assert "0.00 USD (0.0 %)" in html.split('data-testid="savings-headline-figure"')[1].split("</div>")[0]
    assert "Request fractions" in html.split('data-testid="savings-headline-sentence"')[1].split("</p>")[0]
    alternatives = html.split('data-testid="alternatives"')[1].split("</table>")[0]
    rows = dict(re.findall(r'data-testid="alternative-([a-z_]+)"(.*?)</tr>', alternatives, re.S))
    assert "900.00 USD" in rows["dynamic"]
    assert "1 of 2 cards" in rows["dynamic"]
    assert "1,800.00 USD" in rows["whole_card"]
    assert "<td class=\"num\">900.00 USD</td><td class=\"num\">50.0 %</td>" in rows["whole_card"]  # dynamic saves
    assert "headline" in rows["request_fraction"]
    fleet = html.split('data-testid="fleet-cost"')[1].split("</table>")[0]
    assert "1,800.00 USD" in fleet
    assert fleet.count("900.00 USD") == 2
    chargeback = html.split('data-testid="chargeback"')[1].split("</table>")[0]
    assert "Acme Robotics" in chargeback
    assert "globex" in chargeback
    assert chargeback.count("630.00 USD") == 2  # the platform, under request fractions and dynamic
    paired = html.split('data-testid="paired-tests"')[1].split("</table>")[0]
    cells = {key: re.findall(r'<td class="num"[^>]*>(.*?)</td>', row, re.S)
             for key, row in re.findall(r'data-testid="paired-([a-z_]+)"(.*?)</tr>', paired, re.S)}
    assert cells["whole_card"][:2] == ["1,200.00 USD", "180.00 USD"]
    assert cells["request_fraction"][:2] == ["180.00 USD", "180.00 USD"]
    assert cells["fixed_profile"][0] == "241.07 USD"
    # Computed on 2026-11-20 itself: no complete workload-day yet, so no mean saving.
    assert cells["whole_card"][-1] == "0"
    assert cells["whole_card"][3] == "—"
    assert "2026-11-20 are left out of the per-workload-day figures" in html
    # Nothing a web user cannot open; the study by its name.
    assert 'id="definitions"' in html
    for term in ("Whole cards", "Request fractions (time-slicing, HAMi)", "Fixed profiles (MIG)", "Fleet cost",
                 "Chargeback", "Placed on the actual fleet", "Headline saving"):
        assert f"<dt>{term}</dt>" in html, term
    assert "Cost management of container services by dynamic allocation of NVIDIA vGPUs through DRA" in html
    assert "docs/" not in html
    assert ".md" not in html

    records = list(csv.DictReader(io.StringIO(client.get(f"/reports/{report.pk}.csv").content.decode("utf-8-sig"))))
    assert list(records[0]) == ["section", "row", "allocation", "feasible", "static", "dynamic", "saving",
                             "reduction_pct", "cards_needed", "cards_in_fleet", "currency"]
    whole = next(r for r in records if r["section"] == "alternatives" and r["allocation"] == "whole_card")
    assert (whole["static"], whole["dynamic"], whole["saving"], whole["reduction_pct"]) == (
        "1800.00", "900.00", "900.00", "50.00")
    fleet_total = next(r for r in records if r["section"] == "fleet" and r["row"] == "Fleet cost")
    assert fleet_total["dynamic"] == "1800.00"
    for row in records:
        for column in ("static", "dynamic") if row["section"] != "paired_test" else ("saving",):
            assert row[column] == "" or re.fullmatch(r"-?\d+(\.\d{2})?", row[column]), row
    pdf = client.get(f"/reports/{report.pk}.pdf")
    assert pdf.status_code == 200
    assert pdf.content.startswith(b"%PDF")
    with translation.override("zh-hans"):  # and a tenant name that is not markup
        stored = PairedReport.objects.get(pk=report.pk)
        assert render_paired_report_pdf(stored, tenant_names={"acme": "R&D <lab>"}).startswith(b"%PDF")


def test_report_pages_request_show_progress_then_results_and_a_pdf(fifteen_minutes, client, django_capture_on_commit_callbacks):
    from django.contrib.auth.models import Group

    from billing.scope import FINANCE_GROUP

    user = new_user("fin")
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
    assert 'data-testid="paired-tests"' in done
    # Two workloads shared one card: whole cards need two at once, the fleet metered one. They are
    # priced nowhere: not in the paired test, not beside the study, not in the CSV.
    whole = done.split('data-testid="paired-whole_card"')[1].split("</tr>")[0]
    assert 'data-testid="paired-infeasible-whole_card"' in whole
    assert "Not feasible: it needs 2" in whole
    assert "the fleet metered 1 in that minute" in whole
    assert "USD" not in whole
    assert "85.0 %" not in whole
    assert 'data-testid="study-comparison"' in done
    study = done.split('data-testid="study-comparison"')[1].split("</table>")[0]
    assert "−37 %" in study
    assert "85.0 %" not in study
    assert "Not feasible: it needs 2" in study
    summary = done.split('data-testid="report-summary"')[1].split("</table>")[0]
    assert "whole cards" not in summary
    assert "Resource optimisation efficiency" not in summary
    records = list(csv.reader(io.StringIO(client.get(f"/reports/{report.pk}.csv").content.decode("utf-8-sig"))))
    whole_rows = [r for r in records if r[0] == "paired_test" and r[2] == "whole_card"]
    assert whole_rows == [["paired_test", "not_feasible", "whole_card", "no", "", "", "", "", "", "", ""]]
    pdf = client.get(f"/reports/{report.pk}.pdf")
    assert pdf.status_code == 200
    assert pdf.content.startswith(b"%PDF")


def test_a_period_already_being_computed_is_joined_not_computed_twice(fifteen_minutes, client, time_machine,
                                                                      django_capture_on_commit_callbacks):
    from unittest import mock

    from django.contrib.auth.models import Group

    from billing.scope import FINANCE_GROUP
    from billing.services.savings.reports import IN_FLIGHT_REUSE

    user = new_user("fin")
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
    client.force_login(new_user("tenant-user"))
    assert client.get("/reports/").status_code == 403


def test_a_figure_shown_in_two_tables_is_the_same_to_the_cent():
    """Dynamic's cost 10.005 USD shows as 10.00 (half-even); its chargeback rows of 3.335 each would
    show 3.34 three times, 10.02. Apportioned from the figure shown, they add up to 10.00, the cost
    on the alternatives table and the fleet's busy cards; the baseline's column likewise."""
    from tests.billing.savings_results import report_result

    result = report_result(costs={"whole_card": None, "request_fraction": "20.015", "fixed_profile": None},
                           dynamic="10.005", tenants={"a": {"dynamic": "3.335", "request_fraction": "6.675"},
                                                      "b": {"dynamic": "3.335", "request_fraction": "6.665"}})
    tables = savings_tables(result, {})
    assert tables is not None
    dynamic = {r.key: r for r in tables.alternatives}["dynamic"].cost
    baseline = tables.baseline_row
    assert baseline is not None
    assert dynamic == tables.held[0].dynamic == tables.chargeback[-1].dynamic == Decimal("10.00")
    assert sum(r.dynamic for r in tables.chargeback[:-1]) == Decimal("10.00")
    assert baseline.cost == tables.chargeback[-1].static == Decimal("20.02")
    assert sum(r.static or 0 for r in tables.chargeback[:-1]) == Decimal("20.02")


def test_a_card_is_the_fleets_only_in_the_minutes_it_metered(post_batch, one_usd_per_gpu_second):
    """GPU 1 (a burst card) metered minutes 0-4 and 10-14, not 5-9. Whole cards need both cards
    for the two workloads at every minute: at 10:05 the fleet metered one, so whole cards do not
    fit, though GPU 1's first and last minutes bracket the whole period."""
    for i in range(15):
        gpus = 1 if 5 <= i < 10 else 2
        batch = make_batch(start=START + timedelta(minutes=i), seq=i + 1, seconds=60, gpus=gpus,
                           workloads=SHARED_GPU_WORKLOADS)
        assert post_batch(batch).status_code == 201
    rollup_usage(now=clock.now())
    from billing.ledger.minutes import list_card_spans

    spans = [(s.gpu_uuid, s.first_minute, s.last_minute) for s in
             list_card_spans(start=START, end=START + timedelta(hours=1))]
    assert len(spans) == 3  # GPU 0 once, GPU 1 twice
    report = compute_paired_report(start=START, end=START + timedelta(hours=1), now=clock.now())
    whole = report["fleet"]["alternatives"]["whole_card"]
    assert not whole["feasible"]
    assert whole["cost"] is None
    assert whole["shortfall"]["at"] == (START + timedelta(minutes=5)).isoformat()
    assert (whole["shortfall"]["needed"], whole["shortfall"]["had"]) == (2, 1)
    # Dynamic's busiest minute (the first with one busy card) and the cards metered in it.
    dynamic = report["fleet"]["dynamic"]
    assert (dynamic["peak_cards"], dynamic["fleet_cards_at_peak"]) == (1, 2)
    assert dynamic["peak_at"] == START.isoformat()
