"""The finance dashboard (/finance/): cost over time by tenant and idle, fleet utilisation and idle
memory, top workloads, savings against static and the rebalance recommendation, their CSV
exports, and tenant scope. Ledger rows are written directly with hand-picked figures so every
expected number below is computed by hand."""

from __future__ import annotations

import csv
import io
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal

import pytest

from billing.ledger.models import GpuHour, UsageHour
from billing.models import Gpu, Node, PairedReport, RebalancePlan, Tenant
from billing.queries.dashboard import IDLE_KEY, OTHER_KEY, get_finance_dashboard
from billing.scope import FINANCE_GROUP, Scope, get_scope
from billing.web.charts import Series, nice_ticks, stacked_bar_chart
from tests import clock
from tests.billing.savings_results import report_result
from tests.conftest import user_in, with_day

pytestmark = pytest.mark.django_db

D = Decimal
H1 = datetime(2026, 3, 1, 10, tzinfo=UTC)  # day 1
H2 = datetime(2026, 3, 2, 3, tzinfo=UTC)  # day 2
FINANCE = Scope(tenants=None, is_finance=True, is_admin=False)


def gpu_hour(gpu: Gpu, hour: datetime, *, seconds: str, card: str, idle: str, idle_allocated: str = "0") -> GpuHour:
    return with_day(GpuHour.objects.create(
        gpu_uuid=gpu.uuid, node=gpu.node, gpu_model=gpu.model, hour=hour, metered_seconds=D(seconds),
        card_cost=D(card), charged=D(card) - D(idle), idle_cost=D(idle), idle_allocated=D(idle_allocated),
        currency="USD", priced=True,
    ))


def usage_hour(gpu: Gpu, hour: datetime, *, tenant: str, pod: str, charge: str, idle_share: str = "0",
               sm: str = "0", mem: str = "0", share: str = "0", tier: str = "gold", container: str = "main",
               seconds: str = "3600") -> UsageHour:
    q = {f: D(0) for f in ("mem_granted_mb_s", "mem_billed_mb_s", "sm_granted_s", "sm_billed_s", "pcie_mb")}
    return with_day(UsageHour.objects.create(
        gpu_uuid=gpu.uuid, node=gpu.node, tenant=tenant, namespace=f"{tenant}-ns", pod=pod, container=container,
        pod_uid=f"uid-{pod}", sla_tier=tier, seconds=D(seconds), mem_used_mb_s=D(mem), sm_used_s=D(sm),
        share_gpu_s=D(share), charge=D(charge), idle_share=D(idle_share), hour=hour, **q,
    ))


@pytest.fixture
def fleet(db):
    node = Node.objects.create(name="gpu-node-1")
    at = datetime(2026, 1, 1, tzinfo=UTC)
    g1 = Gpu.objects.create(uuid="GPU-1", node=node, model="A100", memory_mb=80000, sm_count=100,
                            first_seen_at=at, last_seen_at=at)
    g2 = Gpu.objects.create(uuid="GPU-2", node=node, model="A100", memory_mb=40000, sm_count=50,
                            first_seen_at=at, last_seen_at=at)
    Tenant.objects.create(slug="acme", name="Acme Robotics")
    Tenant.objects.create(slug="globex", name="环球科技")
    # H1: GPU-1 metered the whole hour (card 10, idle 4 of which 1 spread onto acme), GPU-2 half of it, all idle.
    gpu_hour(g1, H1, seconds="3600", card="10", idle="4", idle_allocated="1")
    gpu_hour(g2, H1, seconds="1800", card="5", idle="5")
    # acme: 30 % of GPU-1's SMs and 25 % of its memory for the hour; globex: 10 % of SMs, 10 % of memory.
    usage_hour(g1, H1, tenant="acme", pod="bert-1", charge="4", idle_share="1", sm="108000", mem="72000000",
               share="1800")
    usage_hour(g1, H1, tenant="globex", pod="llm-1", charge="2", sm="36000", mem="28800000", share="720",
               tier="silver")
    # H2 (next day): GPU-1 metered, nobody on it.
    gpu_hour(g1, H2, seconds="3600", card="10", idle="10")
    return g1, g2



def csv_rows(resp) -> list[list[str]]:
    assert resp.status_code == 200
    assert resp["Content-Type"] == "text/csv; charset=utf-8"
    assert resp["Content-Disposition"].startswith("attachment;")
    return list(csv.reader(io.StringIO(resp.content.decode("utf-8-sig"))))


TWO_DAYS = {"start": "2026-03-01", "end": "2026-03-02"}
THREE_DAYS = {"start": "2026-03-01", "end": "2026-03-03"}


def test_two_day_period_is_drawn_per_hour_with_tenants_and_platform_idle_stacked(fleet):
    d = get_finance_dashboard(scope=FINANCE, start=datetime(2026, 3, 1, tzinfo=UTC),
                              end=datetime(2026, 3, 3, tzinfo=UTC))
    t = d.timeline
    assert t.granularity == "hour"
    assert len(t.buckets) == 48
    assert t.buckets[0] == datetime(2026, 3, 1, tzinfo=UTC)
    series = {s.key: s for s in t.series}
    assert [s.key for s in t.series] == ["acme", "globex", IDLE_KEY]  # by cost, idle on top; no "other"
    assert series["globex"].name == "环球科技"
    i1, i2 = t.buckets.index(H1), t.buckets.index(H2)
    assert series["acme"].values[i1] == D(5)  # charge 4 + idle share 1
    assert series["globex"].values[i1] == D(2)
    # Platform idle = idle_cost − idle_allocated: (4 − 1) + (5 − 0) at H1, 10 at H2.
    assert series[IDLE_KEY].values[i1] == D(8)
    assert series[IDLE_KEY].values[i2] == D(10)
    assert sum(s.values[i1] for s in t.series) == D(15)  # the bar is the whole fleet's cost for the hour
    assert all(s.values[5] == 0 for s in t.series)


def test_longer_period_is_drawn_per_day(fleet):
    d = get_finance_dashboard(scope=FINANCE, start=datetime(2026, 3, 1, tzinfo=UTC),
                              end=datetime(2026, 3, 4, tzinfo=UTC))
    t = d.timeline
    assert t.granularity == "day"
    assert t.buckets == [datetime(2026, 3, day, tzinfo=UTC) for day in (1, 2, 3)]
    assert {s.key: s.values for s in t.series} == {
        "acme": [D(5), D(0), D(0)], "globex": [D(2), D(0), D(0)], IDLE_KEY: [D(8), D(10), D(0)],
    }


def test_tenants_beyond_the_top_six_are_summed_as_other_tenants(fleet):
    g1, _ = fleet
    hour = H1 + timedelta(hours=1)
    for k in range(1, 9):  # t1 costs 8 … t8 costs 1
        usage_hour(g1, hour, tenant=f"t{k}", pod=f"p{k}", charge=str(9 - k))
    d = get_finance_dashboard(scope=FINANCE, start=datetime(2026, 3, 1, tzinfo=UTC),
                              end=datetime(2026, 3, 2, tzinfo=UTC))
    keys = [s.key for s in d.timeline.series]
    # Period totals: t1 8, t2 7, t3 6, acme 5, t4 5, t5 4 | t6 3, globex 2, t7 2, t8 1.
    assert keys == ["t1", "t2", "t3", "acme", "t4", "t5", OTHER_KEY, IDLE_KEY]
    other = d.timeline.series[6]
    i = d.timeline.buckets.index(hour)
    assert other.name == "Other tenants"
    assert other.values[i] == D(3 + 2 + 1)
    assert other.values[d.timeline.buckets.index(H1)] == D(2)  # globex at H1


def test_utilisation_and_idle_memory_are_fleet_ratios_per_bucket(fleet):
    d = get_finance_dashboard(scope=FINANCE, start=datetime(2026, 3, 1, tzinfo=UTC),
                              end=datetime(2026, 3, 4, tzinfo=UTC))
    assert d.utilisation is not None
    day1, day2 = d.utilisation  # day 3 has no metered GPU: no point at all
    # SM: (108000 + 36000) SM·s ÷ (100 SMs × 3600 s + 50 SMs × 1800 s) = 144000 ÷ 450000 = 32 %.
    assert day1.sm_utilisation_pct == D(32)
    # Memory: 1 − (72e6 + 28.8e6) MB·s ÷ (80000 MB × 3600 s + 40000 MB × 1800 s) = 1 − 100.8 ÷ 360 = 72 %.
    assert day1.idle_memory_pct == D(72)
    assert day1.metered_gpu_s == D(5400)
    assert day2.bucket == datetime(2026, 3, 2, tzinfo=UTC)
    assert (day2.sm_utilisation_pct, day2.idle_memory_pct) == (D(0), D(100))


@pytest.mark.parametrize("days", [3, 2])  # day buckets, hour buckets
def test_the_chart_and_the_use_are_read_together_and_a_gpu_missing_from_the_inventory_is_cost_not_use(fleet, days):
    g1, _g2 = fleet
    # A card the inventory lacks (its capacity unknown): its usage is its tenant's cost, never the fleet's use.
    usage_hour(Gpu(uuid="GPU-GONE", node=g1.node, model="A100"), H1, tenant="globex", pod="old-1", charge="3",
               sm="50000", mem="1000000")
    start = datetime(2026, 3, 1, tzinfo=UTC)
    d = get_finance_dashboard(scope=FINANCE, start=start, end=start + timedelta(days=days))
    assert d.utilisation is not None
    step = timedelta(days=1) if d.timeline.granularity == "day" else timedelta(hours=1)
    point = next(p for p in d.utilisation if p.bucket <= H1 < p.bucket + step)
    assert (point.sm_used_s, point.mem_used_mb_s) == (D(108000 + 36000), D(72000000 + 28800000))
    assert point.sm_utilisation_pct == D(32)
    series = {s.key: s for s in d.timeline.series}
    i = max(i for i, b in enumerate(d.timeline.buckets) if b <= H1)
    assert (series["acme"].values[i], series["globex"].values[i]) == (D(5), D(2 + 3))
    # A tenant's chart counts its own usage only, and it sees no use of the fleet.
    mine = get_finance_dashboard(scope=Scope(tenants=frozenset({"globex"}), is_finance=False, is_admin=False),
                                 start=start, end=start + timedelta(days=days))
    assert mine.utilisation is None
    assert [(s.key, s.values[i]) for s in mine.timeline.series] == [("globex", D(5))]


def test_top_workloads_are_the_ten_costliest_pods_summed_over_containers_gpus_and_hours(fleet):
    _g1, g2 = fleet
    hour = H1 + timedelta(hours=2)
    for k in range(11):  # w0 costs 0.1 … w10 costs 1.1
        usage_hour(g2, hour, tenant="globex", pod=f"w{k}", charge=str(D(k + 1) / 10))
    # bert-1 gains a second container on another GPU an hour later, as another tier: 5 + 1.5 = 6.5.
    usage_hour(g2, hour, tenant="acme", pod="bert-1", charge="1.5", container="sidecar", tier="bronze",
               sm="3600", mem="3686400", share="360")
    d = get_finance_dashboard(scope=FINANCE, start=datetime(2026, 3, 1, tzinfo=UTC),
                              end=datetime(2026, 3, 2, tzinfo=UTC))
    top = d.top_workloads
    assert [w.pod for w in top] == ["bert-1", "llm-1", "w10", "w9", "w8", "w7", "w6", "w5", "w4", "w3"]
    bert = top[0]
    assert (bert.name, bert.namespace, bert.sla_tier, bert.cost) == ("Acme Robotics", "acme-ns", "bronze, gold",
                                                                     D("6.5"))
    assert bert.gpu_hours_equivalent == D("0.6")  # (1800 + 360) GPU-s ÷ 3600
    assert bert.sm_used_h == D(31)  # (108000 + 3600) SM·s ÷ 3600
    # As every page shows it (billing.queries.figures): (72000000 + 3686400) MB·s ÷ 1024 ÷ 3600 = 20.53125.
    assert bert.mem_used_gb_h == D("20.53")


def test_savings_come_from_the_newest_finished_report_of_exactly_the_period(fleet, client):
    """Never another period's report: one that merely overlaps the page's period, or the latest of
    all (a finance reviewer once read "12,076.84 USD saved" from 2026-11-30 … 12-02 on a page for
    another month), is not this period's saving."""
    def report(start: datetime, end: datetime, finished: datetime, mean: float, status: str = "done") -> PairedReport:
        # Dynamic 70.006 on the fleet; whole cards not feasible, request fractions 130.004, fixed
        # profiles 140: the headline is against request fractions.
        return PairedReport.objects.create(
            created_at=finished, finished_at=finished, period_start=start, period_end=end, status=status,
            result=report_result(costs={"whole_card": None, "request_fraction": "130.004", "fixed_profile": "140"},
                                 dynamic="70.006", empty="9.996", mean=mean))

    march = (datetime(2026, 3, 1, tzinfo=UTC), datetime(2026, 3, 2, tzinfo=UTC))
    report(*march, finished=datetime(2026, 3, 5, tzinfo=UTC), mean=3.0)
    newest = report(*march, finished=datetime(2026, 3, 6, tzinfo=UTC), mean=4.5)
    report(datetime(2026, 2, 28, tzinfo=UTC), datetime(2026, 3, 1, 12, tzinfo=UTC),
           finished=datetime(2026, 3, 8, tzinfo=UTC), mean=7.0)  # overlaps, another period
    report(datetime(2026, 3, 1, tzinfo=UTC), datetime(2026, 3, 3, tzinfo=UTC),
           finished=datetime(2026, 3, 8, tzinfo=UTC), mean=8.0)  # same start, another end
    report(datetime(2026, 11, 30, tzinfo=UTC), datetime(2026, 12, 3, tzinfo=UTC),
           finished=datetime(2026, 12, 3, tzinfo=UTC), mean=9.0)  # the latest of all
    report(*march, finished=datetime(2026, 3, 7, tzinfo=UTC), mean=9.5, status="running")  # not finished
    card = get_finance_dashboard(scope=FINANCE, start=march[0], end=march[1]).savings
    assert card is not None
    assert (card.period_start, card.last_day, card.in_flight, card.refusal) == (date(2026, 3, 1), date(2026, 3, 1),
                                                                                 None, "")
    s = card.headline
    assert s is not None
    assert s.report_id == newest.pk
    assert s.paired is not None
    assert (s.paired.key, s.paired.n, s.paired.mean_saving, s.paired.ci95_low, s.paired.ci95_high, s.paired.p_value) == (
        "request_fraction", 12, D("4.50"), D("3.50"), D("5.50"), 0.0004)
    # Each allocation's cost as the report page shows it: rounded once to cents.
    costs = {r.key: r.cost for r in s.tables.alternatives}
    # Dynamic's 70.006 is the busy cards' row of a fleet total of 80.002: that total shows as 80.00
    # (the dashboard's total GPU cost), its rows apportioned from it, so 70.00 + 10.00, not 70.01.
    assert costs == {"dynamic": D("70.00"), "whole_card": None, "request_fraction": D("130.00"),
                     "fixed_profile": D("140.00")}
    assert s.tables.baseline == "request_fraction"
    assert s.figure == "60.00 USD (46.2 %)"
    assert s.last_day == date(2026, 3, 1)
    assert s.currency == "USD"

    client.force_login(user_in(FINANCE_GROUP))
    html = client.get("/finance/", {"start": "2026-03-01", "end": "2026-03-01"}).content.decode()
    block = html.split('data-testid="savings-vs-static"')[1].split("</section>")[0]
    assert "2026-03-01 – 2026-03-01 (UTC, both days included)" in block
    assert "60.00 USD (46.2 %)" in block
    assert "saved against Request fractions (time-slicing, HAMi), the cheapest static alternative" in block
    assert "4.50 USD" in block
    assert "3.50 USD … 5.50 USD" in block
    assert "&lt; 0.001" in block
    assert "130.00 USD" in block
    assert "140.00 USD" in block
    assert "70.00 USD" in block
    assert "Not feasible: it needs 25 NVIDIA A100-SXM4-80GB cards at once" in block
    for other in ("3.00 USD", "7.00 USD", "8.00 USD", "9.00 USD", "9.50 USD"):
        assert other not in block, other
    assert f"From paired report {newest.pk}, computed 2026-03-06 00:00 UTC." in block
    assert f'href="/reports/{newest.pk}/"' in block
    assert f'href="/reports/{newest.pk}/#definitions"' in block
    assert 'data-testid="savings-request"' not in block
    # Periods the reports only overlap, or touch, have none of their own.
    for start, end in (("2026-02-28", "2026-03-01"), ("2026-02-28", "2026-03-02"), ("2026-11-30", "2026-12-01")):
        html = client.get("/finance/", {"start": start, "end": end}).content.decode()
        block = html.split('data-testid="savings-vs-static"')[1].split("</section>")[0]
        assert "No savings report for this period." in block, (start, end)
        assert "USD" not in block, (start, end)
        assert 'data-testid="savings-request"' in block, (start, end)


def test_rebalance_shows_the_newest_proposed_plan_or_no_recommendation(fleet, client):
    client.force_login(user_in(FINANCE_GROUP))
    html = client.get("/finance/", TWO_DAYS).content.decode()
    assert "No recommendation." in html.split('data-testid="rebalance-recommendation"')[1].split("</section>")[0]
    at = datetime(2026, 3, 1, tzinfo=UTC)
    RebalancePlan.objects.create(created_at=at, max_moves=5, moves=[{}], gpus_freed=1, projected_savings=D(10),
                                 currency="USD", summary={"gpus_released": 0})
    plan = RebalancePlan.objects.create(created_at=at + timedelta(hours=1), max_moves=5, moves=[{}, {}, {}],
                                        gpus_freed=2, nodes_freed=1, projected_savings=D("29900.80"), currency="USD",
                                        summary={"gpus_released": 8, "freed_nodes": ["node-c"]})
    RebalancePlan.objects.create(created_at=at + timedelta(hours=2), status="approved", max_moves=5, gpus_freed=7)
    r = get_finance_dashboard(scope=FINANCE, start=at, end=at + timedelta(days=1)).rebalance
    assert r is not None
    assert (r.plan_id, r.nodes_freed, r.gpus_released, r.evictions) == (plan.pk, 1, 8, 3)
    html = client.get("/finance/", TWO_DAYS).content.decode()
    block = html.split('data-testid="rebalance-recommendation"')[1].split("</section>")[0]
    # Whole nodes only: the node, the GPUs it hands back, what that saves and what it evicts.
    assert "29,900.80 USD a month" in block
    assert f"Plan {plan.pk} empties 1 node(s), handing back 8 GPU(s), and evicts 3 pod(s) to do it." in block
    assert 'href="/rebalance/"' in block
    # A plan that can empty no node says so, with what emptying one would take, and claims nothing.
    empty = RebalancePlan.objects.create(created_at=at + timedelta(hours=3), max_moves=10, moves=[],
                                         projected_savings=D(0), currency="USD",
                                         summary={"gpus_released": 0, "freed_nodes": [],
                                                  "smallest_release": {"node": "node-a", "evictions": 24}})
    html = client.get("/finance/", TWO_DAYS).content.decode()
    block = html.split('data-testid="rebalance-recommendation"')[1].split("</section>")[0]
    assert (f"Plan {empty.pk}: no node can be emptied within 10 evictions, so nothing can be handed back; "
            "emptying node-a would take 24.") in block
    assert "USD" not in block


def test_finance_page_shows_every_part_with_its_test_id(fleet, client):
    client.force_login(user_in(FINANCE_GROUP))
    resp = client.get("/finance/", TWO_DAYS)
    assert resp.status_code == 200
    html = resp.content.decode()
    for testid in ("total-gpu-cost", "attributed-cost", "idle-cost", "cost-timeline", "utilisation-trend",
                   "savings-vs-static", "top-workloads", "rebalance-recommendation", "tenant-costs"):
        assert f'data-testid="{testid}"' in html, testid
    assert 'data-testid="total-gpu-cost">25.00 USD<' in html  # 10 + 5 + 10
    assert 'data-testid="idle-cost">18.00 USD<' in html
    timeline = html.split('data-testid="cost-timeline"')[1].split("</figure>")[0]
    assert "<svg" in timeline
    assert "环球科技" in timeline
    assert "Idle (platform)" in timeline
    assert "SM utilisation" in html.split('data-testid="utilisation-trend"')[1].split("</figure>")[0]
    for table, testid in (("timeline", "cost-timeline-csv"), ("utilisation", "utilisation-trend-csv"),
                          ("workloads", "top-workloads-csv")):
        href = f'href="?start=2026-03-01&amp;end=2026-03-02&amp;format=csv&amp;table={table}" data-testid="{testid}"'
        assert href in html, table


def test_quick_links_choose_this_month_last_month_and_last_seven_days(fleet, client):
    client.force_login(user_in(FINANCE_GROUP))
    today = clock.now().date()
    first = today.replace(day=1)
    prev_end = first - timedelta(days=1)
    html = client.get("/finance/").content.decode()
    links = html.split('data-testid="quick-periods"')[1].split("</span>")[0]
    # The default period is this month's.
    assert f'href="?start={first}&amp;end={today}" data-testid="period-this-month" class="active"' in links
    assert f'href="?start={prev_end.replace(day=1)}&amp;end={prev_end}" data-testid="period-last-month">' in links
    assert f'href="?start={today - timedelta(days=6)}&amp;end={today}" data-testid="period-last-7-days"' in links


def test_csv_tables_timeline_utilisation_and_workloads(fleet, client):
    client.force_login(user_in(FINANCE_GROUP))
    rows = csv_rows(client.get("/finance/", {**THREE_DAYS, "format": "csv", "table": "timeline"}))
    assert rows[0] == ["bucket_start", "granularity", "series", "name", "cost", "currency"]
    assert len(rows) == 1 + 3 * 3  # three days × (acme, globex, idle)
    assert rows[1][:3] == ["2026-03-01T00:00:00+00:00", "day", "acme"]
    assert D(rows[1][4]) == 5
    assert rows[3][2:4] == [IDLE_KEY, "Idle (platform)"]
    assert D(rows[3][4]) == 8
    assert rows[3][5] == "USD"

    rows = csv_rows(client.get("/finance/", {**THREE_DAYS, "format": "csv", "table": "utilisation"}))
    assert rows[0][0] == "bucket_start"
    assert len(rows) == 3
    assert D(rows[1][5]) == 32
    assert D(rows[1][8]) == 72
    assert D(rows[2][5]) == 0
    assert D(rows[2][8]) == 100

    rows = csv_rows(client.get("/finance/", {**THREE_DAYS, "format": "csv", "table": "workloads"}))
    assert rows[0][:4] == ["rank", "tenant", "name", "namespace"]
    assert [(r[0], r[4], r[6], D(r[7]), r[8]) for r in rows[1:]] == [
        ("1", "bert-1", "gold", D(5), "USD"), ("2", "llm-1", "silver", D(2), "USD")]

    # No table: the tenants CSV as before.
    rows = csv_rows(client.get("/finance/", {**THREE_DAYS, "format": "csv"}))
    assert [r[0] for r in rows[1:]] == ["acme", "globex", "(idle, platform)", "(total)"]


def test_unknown_csv_table_answers_400_and_names_the_tables(fleet, client):
    client.force_login(user_in(FINANCE_GROUP))
    resp = client.get("/finance/", {**TWO_DAYS, "format": "csv", "table": "salaries"})
    assert resp.status_code == 400
    body = resp.content.decode()
    assert "salaries" in body
    assert "tenants, timeline, utilisation, workloads" in body


def test_tenant_member_sees_only_their_tenant_and_no_platform_figures(fleet, client):
    member = user_in(tenant="globex")
    d = get_finance_dashboard(scope=get_scope(member), start=datetime(2026, 3, 1, tzinfo=UTC),
                              end=datetime(2026, 3, 3, tzinfo=UTC))
    assert [s.key for s in d.timeline.series] == ["globex"]
    assert [w.tenant for w in d.top_workloads] == ["globex"]
    assert d.utilisation is None
    assert d.savings is None
    assert d.rebalance is None

    RebalancePlan.objects.create(created_at=H1, max_moves=5, gpus_freed=2, projected_savings=D(10), currency="USD")
    client.force_login(member)
    resp = client.get("/finance/", TWO_DAYS)
    html = resp.content.decode()
    assert resp.status_code == 200
    assert 'data-testid="cost-timeline"' in html
    assert 'data-testid="top-workloads"' in html
    for hidden in ("Acme", "acme", "bert-1", "Idle (platform)", 'data-testid="utilisation-trend"',
                   'data-testid="savings-vs-static"', 'data-testid="rebalance-recommendation"',
                   'data-testid="idle-cost"', 'data-testid="total-gpu-cost"'):
        assert hidden not in html, hidden

    rows = csv_rows(client.get("/finance/", {**TWO_DAYS, "format": "csv", "table": "timeline"}))
    assert {r[2] for r in rows[1:]} == {"globex"}
    rows = csv_rows(client.get("/finance/", {**TWO_DAYS, "format": "csv", "table": "workloads"}))
    assert [r[4] for r in rows[1:]] == ["llm-1"]
    assert client.get("/finance/", {**TWO_DAYS, "format": "csv", "table": "utilisation"}).status_code == 403


def test_chart_ticks_on_fractional_steps_are_labelled_exactly():
    svg = stacked_bar_chart(["a", "b"], [Series("x", [D(10), D(4)])], label="cost", unit="USD")
    assert nice_ticks(10) == [0, 2.5, 5, 7.5, 10]
    assert ">2.5</text>" in svg
    assert ">7.5</text>" in svg
    assert ">8</text>" not in svg


def test_chart_legend_is_html_text_naming_every_series_in_its_colour():
    """An HTML list after the picture, not text inside the SVG: the page's font size however small
    the picture is scaled (SVG text came out ~5 px at 390 px), and it wraps as text does."""
    names = [f"Tenant number {k} with a long name" for k in range(9)] + ["环球科技"]
    chart = stacked_bar_chart(["a"], [Series(n, [D(1)]) for n in names], label="cost", width=720, height=240)
    svg, legend = chart.split("</svg>", 1)[0], chart.split("</svg>", 1)[1]
    assert 'viewBox="0 0 720 240"' in svg
    assert all(f">{n}</text>" not in svg for n in names)
    assert legend.startswith('<ul class="chart-legend">')
    items = legend.split("<li>")[1:]
    assert [item.split("</svg>")[1].removesuffix("</li>").removesuffix("</li></ul>") for item in items] == names
    assert [item.split('<rect class="')[1].split('"')[0] for item in items] == [f"s{k % 8}" for k in range(10)]


def test_dashboard_query_count_does_not_grow_with_hours_tenants_or_workloads(fleet):
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    def count() -> int:
        with CaptureQueriesContext(connection) as ctx:
            get_finance_dashboard(scope=FINANCE, start=datetime(2026, 3, 1, tzinfo=UTC),
                                  end=datetime(2026, 3, 31, tzinfo=UTC))
        return len(ctx.captured_queries)

    before = count()
    g1, _ = fleet
    for h in range(30):
        hour = datetime(2026, 3, 5, tzinfo=UTC) + timedelta(hours=h)
        gpu_hour(g1, hour, seconds="3600", card="10", idle="1")
        for k in range(10):
            usage_hour(g1, hour, tenant=f"t{k}", pod=f"p{k}-{h}", charge="0.9")
    assert count() == before


def test_charts_over_time_stop_at_now_and_the_timeline_csv_has_no_hours_to_come(fleet, client, time_machine):
    """A period that runs past now (this month, today) draws and writes the buckets begun by now,
    never zeros for hours or days to come. The fleet's last metered hour is H2 (2 March, 03:00)."""
    now = H2 + timedelta(minutes=30)
    hours = get_finance_dashboard(scope=FINANCE, start=datetime(2026, 3, 1, tzinfo=UTC),
                                  end=datetime(2026, 3, 3, tzinfo=UTC), now=now)
    assert hours.timeline.buckets[-1] == H2
    assert len(hours.timeline.buckets) == 24 + 4  # 1 March, then 00:00 … 03:00 on the 2nd
    days = get_finance_dashboard(scope=FINANCE, start=datetime(2026, 3, 1, tzinfo=UTC),
                                 end=datetime(2026, 4, 1, tzinfo=UTC), now=now)
    assert days.timeline.buckets == [datetime(2026, 3, 1, tzinfo=UTC), datetime(2026, 3, 2, tzinfo=UTC)]
    whole = get_finance_dashboard(scope=FINANCE, start=datetime(2026, 3, 1, tzinfo=UTC),
                                  end=datetime(2026, 4, 1, tzinfo=UTC), now=datetime(2026, 4, 2, tzinfo=UTC))
    assert [sum(s.values) for s in days.timeline.series] == [sum(s.values) for s in whole.timeline.series]
    # Usage stamped ahead of this clock is still in a bucket, so the chart adds up to the period.
    early = get_finance_dashboard(scope=FINANCE, start=datetime(2026, 3, 1, tzinfo=UTC),
                                  end=datetime(2026, 3, 3, tzinfo=UTC), now=H2 - timedelta(minutes=1))
    assert early.timeline.buckets[-1] == H2
    client.force_login(user_in(FINANCE_GROUP))
    time_machine.move_to(now, tick=False)
    rows = csv_rows(client.get("/finance/", {**TWO_DAYS, "format": "csv", "table": "timeline"}))
    assert max(datetime.fromisoformat(r[0]) for r in rows[1:]) == H2
