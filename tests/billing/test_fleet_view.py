"""The fleet view, /fleet/ (docs/billing.md, Fleet view): per node and GPU over a hand-written ledger
(two nodes, two models, cards with charge and idle), exact figures that add up as shown, the total
card cost the finance dashboard's, sorting and its 400s, finance and admins only, the CSV inert and
adding up, the workload links that open Explore, and pages of nodes that keep the whole fleet's
figures and totals (the CSV every GPU)."""

from __future__ import annotations

import csv
import io
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal
from html import unescape
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client
from django.urls import resolve
from hypothesis import HealthCheck, given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st

from billing.ledger.models import GpuDay, GpuHour, UsageDay, UsageHour, WorkloadMeta
from billing.models import Gpu, Node, Tenant
from billing.queries.fleet import get_fleet
from billing.scope import ADMIN_GROUP, FINANCE_GROUP, get_scope
from tests.billing.test_energy_prices import place, rate
from tests.conftest import user_in, with_day
from tests.test_page_sums import Walk, _check_csv, _check_page, _marks

pytestmark = pytest.mark.django_db

D = Decimal
H = datetime(2026, 3, 2, 10, tzinfo=UTC)  # explicit dates: the page takes the period it is given
PERIOD = {"start": "2026-03-02", "end": "2026-03-02"}


def card(node: Node, gpu: str, *, model: str, memory_mb: int, sm_count: int, cost: str, charged: str,
         energy_kwh: str = "0") -> None:
    """One metered hour of a card, in the inventory too (its capacity is the utilisation's denominator)."""
    Gpu.objects.create(uuid=gpu, node=node, model=model, memory_mb=memory_mb, sm_count=sm_count, first_seen_at=H,
                       last_seen_at=H)
    with_day(GpuHour.objects.create(
        gpu_uuid=gpu, node=node, gpu_model=model, hour=H, metered_seconds=D(3600), card_cost=D(cost),
        charged=D(charged), idle_cost=D(cost) - D(charged), idle_allocated=D(0), currency="USD", priced=True,
        energy_j=D(energy_kwh) * 3_600_000))


def usage(node: Node, gpu: str, *, tenant: str, pod: str, charge: str, sm_used_s: str = "0",
          mem_used_mb_s: str = "0") -> None:
    with_day(UsageHour.objects.create(
        gpu_uuid=gpu, node=node, tenant=tenant, namespace=f"{tenant}-prod", pod=pod, container="main",
        pod_uid=f"uid-{pod}", sla_tier="gold", seconds=D(3600), hour=H, mem_used_mb_s=D(mem_used_mb_s),
        mem_granted_mb_s=D(0), mem_billed_mb_s=D(0), sm_used_s=D(sm_used_s), sm_granted_s=D(0), sm_billed_s=D(0),
        pcie_mb=D(0), share_gpu_s=D(charge) * 360, charge=D(charge), idle_share=D(0)))


@pytest.fixture
def ledger(db: Any) -> None:
    """node-a: two A100s (card 10.00 each): A0 charged 3.333333333333 (bert-1 2.00 at a quarter of its
    SMs and half its memory, llm-1 1.333333333333), 1 kWh; A1 idle all hour. node-b: one H100 (card
    20.00) charged 15.00 over four pods (6, 4, 3, 2), 2.5 kWh."""
    Tenant.objects.create(slug="acme", name="Acme Robotics")
    Tenant.objects.create(slug="globex", name="Globex")
    a, b = Node.objects.create(name="node-a"), Node.objects.create(name="node-b")
    card(a, "GPU-A0", model="A100", memory_mb=40960, sm_count=108, cost="10", charged="3.333333333333",
         energy_kwh="1")
    card(a, "GPU-A1", model="A100", memory_mb=40960, sm_count=108, cost="10", charged="0")
    card(b, "GPU-B0", model="H100", memory_mb=81920, sm_count=132, cost="20", charged="15", energy_kwh="2.5")
    usage(a, "GPU-A0", tenant="acme", pod="bert-1", charge="2", sm_used_s=str(108 * 3600 // 4),
          mem_used_mb_s=str(40960 * 3600 // 2))
    usage(a, "GPU-A0", tenant="globex", pod="llm-1", charge="1.333333333333")
    for pod, charge, tenant in (("w-6", "6", "acme"), ("w-4", "4", "globex"), ("w-3", "3", "acme"), ("w-2", "2", "acme")):
        usage(b, "GPU-B0", tenant=tenant, pod=pod, charge=charge)
    WorkloadMeta.objects.create(node=a, namespace="acme-prod", pod="bert-1", pod_uid="uid-bert-1",
                                controller_kind="Deployment", controller_name="bert", labels={}, requests={},
                                first_seen=H, last_seen=H)


def finance(client: Client) -> Client:
    client.force_login(user_in(FINANCE_GROUP))
    return client


def test_each_gpu_shows_its_cost_idle_utilisation_energy_and_workloads(client: Client, ledger: None) -> None:
    resp = finance(client).get("/fleet/", PERIOD)
    assert resp.status_code == 200
    view = resp.context["fleet"]
    # Idle cost first: node-a idles 16.67 (6.67 + 10.00), node-b 5.00; A1 (10.00) before A0 (6.67).
    assert [n.name for n in view.nodes] == ["node-a", "node-b"]
    assert [g.gpu_uuid for g in view.nodes[0].gpus] == ["GPU-A1", "GPU-A0"]
    gpus = {g.gpu_uuid: g for g in view.gpus}
    a0, a1, b0 = gpus["GPU-A0"].figures, gpus["GPU-A1"].figures, gpus["GPU-B0"].figures
    # 40.00 over the cards' parts: A0's 3.333… and 6.666… take 3.33 and 6.67 (the larger remainder).
    assert (a0.card_cost, a0.attributed, a0.idle_cost) == (D("10.00"), D("3.33"), D("6.67"))
    assert (a1.card_cost, a1.attributed, a1.idle_cost) == (D("10.00"), D("0.00"), D("10.00"))
    assert (b0.card_cost, b0.attributed, b0.idle_cost) == (D("20.00"), D("15.00"), D("5.00"))
    assert round(a0.idle_pct, 1) == D("66.7")
    assert a1.idle_pct == 100
    assert b0.idle_pct == 25
    # bert-1 used a quarter of A0's SM·s and half its memory; A1 nothing.
    assert (a0.sm_pct, a0.mem_pct) == (25, 50)
    assert (a1.sm_pct, a1.mem_pct) == (0, 0)
    assert (a0.energy_kwh, b0.energy_kwh) == (D("1.00"), D("2.50"))
    assert [w.pod for w in gpus["GPU-B0"].workloads] == ["w-6", "w-4", "w-3"]
    assert gpus["GPU-B0"].more_workloads == 1
    assert b0.workloads == 4
    node_a = view.nodes[0].figures
    assert (node_a.card_cost, node_a.attributed, node_a.idle_cost, node_a.energy_kwh) == (
        D("20.00"), D("3.33"), D("16.67"), D("1.00"))
    assert round(node_a.sm_pct, 1) == D("12.5")  # a quarter of one card of two
    total = view.total
    assert (total.card_cost, total.attributed, total.idle_cost, total.energy_kwh) == (
        D("40.00"), D("18.33"), D("21.67"), D("3.50"))
    html = resp.content.decode()
    assert "GPU-B0" in html
    assert "and 1 more" in html
    # Every group on the page adds up as shown (tests/test_page_sums.py's checker).
    walk = Walk()
    _check_page("/fleet/", _marks(html), walk)
    assert {"fleet-card", "fleet-attributed", "fleet-idle", "fleet-energy", "row", "total-row"} <= walk.groups_checked


def test_the_total_card_cost_is_the_finance_dashboards_under_one_key(client: Client, ledger: None) -> None:
    finance(client)
    dashboard = client.get("/finance/", PERIOD)
    fleet = client.get("/fleet/", PERIOD)
    assert fleet.context["fleet"].total.card_cost == dashboard.context["shown"].total_gpu_cost == D("40.00")
    key = 'data-figure="card_cost|2026-03-02T00:00:00+00:00|2026-03-03T00:00:00+00:00"'
    assert key in dashboard.content.decode()
    assert key in fleet.content.decode()


# Charges that round unevenly (lines of 0.005 show 0.00, half-even): the dashboard's total is its
# rounded lines plus the rounded idle, not the card cost rounded, and the fleet's total is that figure.
@hypothesis_settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(charges=st.lists(st.decimals(min_value=0, max_value=3, places=3), min_size=1, max_size=4),
       idle=st.decimals(min_value=0, max_value=2, places=3))
def test_the_fleet_adds_up_and_matches_the_dashboard_whatever_the_charges(
        client: Client, db: Any, charges: list[Decimal], idle: Decimal) -> None:
    for model in (GpuDay, UsageDay, GpuHour, UsageHour):
        model.objects.all().delete()
    node = Node.objects.get_or_create(name="node-h")[0]
    for i, charge in enumerate(charges):
        Gpu.objects.get_or_create(uuid=f"GPU-{i}", defaults={"node": node, "model": "A100", "memory_mb": 40960,
                                                            "sm_count": 108, "first_seen_at": H, "last_seen_at": H})
        with_day(GpuHour.objects.create(gpu_uuid=f"GPU-{i}", node=node, gpu_model="A100", hour=H,
                                        metered_seconds=D(3600), card_cost=charge + idle, charged=charge,
                                        idle_cost=idle, idle_allocated=D(0), currency="USD", priced=True))
        usage(node, f"GPU-{i}", tenant=f"t{i}", pod=f"p{i}", charge=str(charge))
    user = User.objects.filter(groups__name=FINANCE_GROUP).first() or user_in(FINANCE_GROUP)
    client.force_login(user)
    view = client.get("/fleet/", PERIOD).context["fleet"]
    dashboard = client.get("/finance/", PERIOD).context["shown"]
    assert view.total.card_cost == dashboard.total_gpu_cost
    assert view.total.card_cost == view.total.attributed + view.total.idle_cost
    assert sum(g.figures.card_cost for g in view.gpus) == view.total.card_cost
    # Each part within a cent of its exact figure scaled to the shown total (billing.money.apportion).
    off = abs(view.total.card_cost - sum(charges) - len(charges) * idle) + D("0.01")
    for g in view.gpus:
        assert g.figures.card_cost == g.figures.attributed + g.figures.idle_cost
        charge = charges[int(g.gpu_uuid.removeprefix("GPU-"))]
        assert abs(g.figures.attributed - charge) <= off
        assert abs(g.figures.idle_cost - idle) <= off


@pytest.mark.parametrize(("sort", "first_node", "first_gpu"), [
    ("card_cost", "node-a", "GPU-A0"),  # 20.00 each, and 10.00 each: ties go by name
    ("attributed", "node-b", "GPU-A0"),
    ("idle_pct", "node-a", "GPU-A1"),
    ("sm_pct", "node-a", "GPU-A0"),
    ("mem_pct", "node-a", "GPU-A0"),
    ("energy_kwh", "node-b", "GPU-A0"),
    ("workloads", "node-b", "GPU-A0"),
    ("name", "node-a", "GPU-A0"),
    ("gpu_model", "node-a", "GPU-A0"),
])
def test_every_column_sorts(client: Client, ledger: None, sort: str, first_node: str, first_gpu: str) -> None:
    resp = finance(client).get("/fleet/", {**PERIOD, "sort": sort})
    assert resp.status_code == 200
    view = resp.context["fleet"]
    assert view.nodes[0].name == first_node
    assert next(g for g in view.gpus if g.node == "node-a").gpu_uuid == first_gpu
    assert f'aria-sort="{"ascending" if sort in ("name", "gpu_model") else "descending"}"' in resp.content.decode()


@pytest.mark.parametrize(("params", "reason"), [
    ({"sort": "price"}, "Unknown sort"),
    ({"sort": "price", "format": "csv"}, "Unknown sort"),
    ({"format": "xml"}, "Unknown format"),
    ({"start": "2026-03-05", "end": "2026-03-01"}, "must not be before"),
])
def test_bad_parameters_answer_400_with_the_reason(client: Client, ledger: None, params: dict[str, str],
                                                  reason: str) -> None:
    resp = finance(client).get("/fleet/", {**PERIOD, **params})
    assert resp.status_code == 400
    assert reason in resp.content.decode()


def test_tenant_members_get_403_and_finance_and_admins_the_page(client: Client, ledger: None) -> None:
    client.force_login(user_in(tenant="acme"))
    assert client.get("/fleet/", PERIOD).status_code == 403
    assert client.get("/fleet/", {**PERIOD, "format": "csv"}).status_code == 403
    assert 'data-testid="nav-fleet"' not in client.get("/finance/", PERIOD).content.decode()
    client.force_login(user_in(ADMIN_GROUP))
    resp = client.get("/fleet/", PERIOD)
    assert resp.status_code == 200
    assert 'data-testid="nav-fleet"' in resp.content.decode()


def test_the_csv_has_the_gpu_rows_adds_up_and_is_inert(client: Client, ledger: None) -> None:
    # A node's agent names its GPU model: text someone else chose, written so no spreadsheet runs it.
    GpuHour.objects.filter(gpu_uuid="GPU-A1").update(gpu_model='=HYPERLINK("http://x")')
    with_day(GpuHour.objects.get(gpu_uuid="GPU-A1"))
    resp = finance(client).get("/fleet/", {**PERIOD, "format": "csv"})
    assert resp.status_code == 200
    assert resp["Content-Type"].startswith("text/csv")
    name = "fleet-gpus-20260302-20260302.csv"
    assert name in resp["Content-Disposition"]
    rows = list(csv.reader(io.StringIO(resp.content.decode("utf-8-sig"))))
    assert _check_csv(name, rows) == "fleet"
    records = [dict(zip(rows[0], r, strict=True)) for r in rows[1:]]
    assert [r["gpu_uuid"] for r in records] == ["GPU-A1", "GPU-A0", "GPU-B0", ""]
    a1 = records[0]
    assert a1["gpu_model"] == "'=HYPERLINK(\"http://x\")"
    assert (a1["card_cost"], a1["attributed"], a1["idle_cost"], a1["idle_share_pct"]) == ("10.00", "0.00", "10.00", "100.0")
    assert records[-1]["card_cost"] == "40.00"
    assert records[2]["top_workloads"] == "acme/acme-prod/w-6; globex/globex-prod/w-4; acme/acme-prod/w-3"


def test_a_workload_links_to_explore_filtered_to_it(client: Client, ledger: None) -> None:
    html = finance(client).get("/fleet/", PERIOD).content.decode()
    link = "/explore/?start=2026-03-02&amp;end=2026-03-02&amp;tenant=acme&amp;namespace=acme-prod&amp;controller=deployment%3Abert&amp;pod=bert-1"
    assert link in html
    resp = client.get(link.replace("&amp;", "&"))
    assert resp.status_code == 200
    # The pod's own level: the GPUs it ran on, with its cost there.
    assert resp.context["explore"].level == "gpu"
    assert "GPU-A0" in resp.content.decode()


def test_an_empty_period_shows_no_card(client: Client, db: Any) -> None:
    resp = finance(client).get("/fleet/", PERIOD)
    assert resp.status_code == 200
    assert resp.context["fleet"].gpu_count == 0
    assert 'data-testid="fleet-empty"' in resp.content.decode()


PREVIOUS = {"start": "2026-03-01", "end": "2026-03-01"}  # a one-day period's previous: the day before


@pytest.fixture
def priced(ledger: None) -> None:
    """node-a in eu (0.20 USD and 0.30 kg CO2e per kWh), node-b in us (0.1333 USD, no CO2e factor)."""
    place("node-a", "eu", date(2026, 1, 1))
    rate("eu", date(2026, 1, 1), "0.20", "0.30")
    place("node-b", "us", date(2026, 1, 1))
    rate("us", date(2026, 1, 1), "0.1333", None)


def test_energy_cost_and_co2e_are_priced_by_location_and_add_up_as_shown(client: Client, priced: None) -> None:
    resp = finance(client).get("/fleet/", PERIOD)
    view = resp.context["fleet"]
    gpus = {g.gpu_uuid: g.figures for g in view.gpus}
    # The card's whole energy: A0 1 kWh × 0.20; A1 drew none (0, not unknown); B0 2.5 kWh × 0.1333 = 0.33325.
    # The known total 0.53325 is rounded once (0.53) and apportioned: 0.20 and 0.33.
    assert (gpus["GPU-A0"].energy_cost, gpus["GPU-A1"].energy_cost, gpus["GPU-B0"].energy_cost) == (
        D("0.20"), D("0.00"), D("0.33"))
    assert (gpus["GPU-A0"].co2e_kg, gpus["GPU-A1"].co2e_kg, gpus["GPU-B0"].co2e_kg) == (D("0.30"), D("0.00"), None)
    node_a, node_b = (n.figures for n in view.nodes)
    assert (node_a.energy_cost, node_a.co2e_kg, node_b.energy_cost, node_b.co2e_kg) == (
        D("0.20"), D("0.30"), D("0.33"), None)
    # No CO2e factor for node-b: the fleet's kg is unknown ("—"), never 0.
    assert (view.total.energy_cost, view.total.co2e_kg) == (D("0.53"), None)
    html = resp.content.decode()
    assert 'data-testid="fleet-total-co2e">—' in html
    walk = Walk()
    _check_page("/fleet/", _marks(html), walk)
    assert {"fleet-energy-cost", "node-energy-cost-node-a", "node-co2e-node-a"} <= walk.groups_checked
    assert "fleet-co2e" not in walk.groups_checked


def test_the_csv_appends_energy_cost_and_co2e(client: Client, priced: None) -> None:
    resp = finance(client).get("/fleet/", {**PERIOD, "format": "csv"})
    rows = list(csv.reader(io.StringIO(resp.content.decode("utf-8-sig"))))
    assert rows[0][-3:] == ["top_workloads", "energy_cost", "co2e_kg"]
    records = {r[1] or "(total)": dict(zip(rows[0], r, strict=True)) for r in rows[1:]}
    assert (records["GPU-A0"]["energy_cost"], records["GPU-A0"]["co2e_kg"]) == ("0.20", "0.3000")
    assert (records["GPU-B0"]["energy_cost"], records["GPU-B0"]["co2e_kg"]) == ("0.33", "")
    assert (records["(total)"]["energy_cost"], records["(total)"]["co2e_kg"]) == ("0.53", "")


@pytest.fixture
def before(ledger: None) -> None:
    """The day before: A0 cost 8.00 (2.00 charged to acme), and node-c's card 4.00, charged nothing."""
    a, c = Node.objects.get(name="node-a"), Node.objects.create(name="node-c")
    hour = H - timedelta(days=1)
    for node, gpu, cost, charged in ((a, "GPU-A0", "8", "2"), (c, "GPU-C0", "4", "0")):
        with_day(GpuHour.objects.create(
            gpu_uuid=gpu, node=node, gpu_model="A100", hour=hour, metered_seconds=D(3600), card_cost=D(cost),
            charged=D(charged), idle_cost=D(cost) - D(charged), idle_allocated=D(0), currency="USD", priced=True))
    with_day(UsageHour.objects.create(
        gpu_uuid="GPU-A0", node=a, tenant="acme", namespace="acme-prod", pod="old-1", container="main",
        pod_uid="uid-old-1", sla_tier="gold", seconds=D(3600), hour=hour, mem_used_mb_s=D(0), mem_granted_mb_s=D(0),
        mem_billed_mb_s=D(0), sm_used_s=D(0), sm_granted_s=D(0), sm_billed_s=D(0), pcie_mb=D(0),
        share_gpu_s=D(720), charge=D(2), idle_share=D(0)))


def test_the_previous_period_is_what_the_fleet_and_the_dashboard_show_for_it(client: Client, before: None) -> None:
    finance(client)
    resp = client.get("/fleet/", PERIOD)
    c = resp.context["fleet"].comparison
    assert (c.previous_first.isoformat(), c.previous_last.isoformat()) == ("2026-03-01", "2026-03-01")
    rows = {r.name: r for r in c.nodes}
    # The page's nodes in its order, then node-c, metered only the day before (compared at 0 now).
    assert [r.name for r in c.nodes] == ["node-a", "node-b", "node-c"]
    a, b, node_c = rows["node-a"], rows["node-b"], rows["node-c"]
    assert (a.card_cost.previous, a.card_cost.delta, a.card_cost.pct) == (D("8.00"), D("12.00"), D(150))
    assert (a.idle_cost.previous, a.idle_cost.delta) == (D("6.00"), D("10.67"))
    assert (b.card_cost.previous, b.card_cost.pct) == (D("0.00"), None)  # nothing before: "—"
    assert (node_c.card_cost.current, node_c.card_cost.previous, node_c.card_cost.pct) == (D(0), D("4.00"), -100)
    assert (c.total.card_cost.previous, c.total.idle_cost.previous) == (D("12.00"), D("10.00"))
    # The previous figures are /fleet/'s and the dashboard's for that period.
    then = client.get("/fleet/", PREVIOUS).context["fleet"]
    assert {n.name: (n.figures.card_cost, n.figures.idle_cost) for n in then.nodes} == {
        r.name: (r.card_cost.previous, r.idle_cost.previous) for r in c.nodes if r.card_cost.previous}
    assert then.total.card_cost == c.total.card_cost.previous == client.get(
        "/finance/", PREVIOUS).context["shown"].total_gpu_cost
    html = resp.content.decode()
    assert 'data-figure="card_cost|2026-03-01T00:00:00+00:00|2026-03-02T00:00:00+00:00"' in html
    assert 'href="?start=2026-03-01&amp;end=2026-03-01&amp;sort=idle_cost"' in html
    assert 'data-testid="node-card-change-pct">—' in html
    walk = Walk()
    _check_page("/fleet/", _marks(html), walk)
    assert {"compared-card", "compared-card-previous", "compared-idle", "compared-idle-previous"} <= walk.groups_checked


@pytest.fixture
def big_fleet(ledger: None) -> None:
    """node-a and node-b, and 28 more nodes of one card each (node-p00 … node-p27, 1.00 to 28.00 of card
    cost, a third of it charged to a pod of acme): 30 nodes, two pages of 25 and more; a day before on
    node-p00 and on node-gone (metered only then), for the comparison."""
    for i in range(28):
        node = Node.objects.create(name=f"node-p{i:02d}")
        cost = D(i + 1)
        card(node, f"GPU-P{i:02d}", model="A100", memory_mb=40960, sm_count=108, cost=str(cost),
             charged=str(cost / 3), energy_kwh="0.5")
        usage(node, f"GPU-P{i:02d}", tenant="acme", pod=f"p-{i}", charge=str(cost / 3))
    gone = Node.objects.create(name="node-gone")
    for node, gpu in ((Node.objects.get(name="node-p00"), "GPU-P00"), (gone, "GPU-GONE")):
        with_day(GpuHour.objects.create(
            gpu_uuid=gpu, node=node, gpu_model="A100", hour=H - timedelta(days=1), metered_seconds=D(3600),
            card_cost=D(3), charged=D(0), idle_cost=D(3), idle_allocated=D(0), currency="USD", priced=True))


def _pages(client: Client, **params: str) -> list[Any]:
    """Every page of the fleet view, from the first, following its own "next" links."""
    query: dict[str, str] = {**PERIOD, **params}
    views = []
    while True:
        resp = client.get("/fleet/", query)
        assert resp.status_code == 200
        views.append(resp)
        if not resp.context["pager"]["next"]:
            return views
        query = dict(part.split("=") for part in resp.context["pager"]["next"].split("&"))


@pytest.mark.parametrize("sort", ["idle_cost", "name", "workloads"])
def test_pages_split_the_sorted_fleet_and_keep_the_whole_fleets_totals(client: Client, big_fleet: None,
                                                                     sort: str) -> None:
    finance(client)
    whole = get_fleet(scope=get_scope(User.objects.get(groups__name=FINANCE_GROUP)),
                      start=H.replace(hour=0), end=H.replace(hour=0) + timedelta(days=1), sort=sort, page=None)
    pages = _pages(client, sort=sort)
    assert len(pages) == 2
    views = [p.context["fleet"] for p in pages]
    # The pages, in order, are the whole fleet's nodes in its order, each card with the same figures.
    assert [n.name for v in views for n in v.nodes] == [n.name for n in whole.nodes]
    assert [g.figures for v in views for g in v.gpus] == [g.figures for g in whole.gpus]
    assert [len(v.nodes) for v in views] == [25, 5]
    for v in views:
        # Every page shows the whole fleet's total, and its nodes plus the others row add up to it.
        assert v.total == whole.total
        assert (v.node_count, v.gpu_count, v.pages) == (30, 31, 2)
        assert v.others is not None
        assert v.others.nodes == 30 - len(v.nodes)
        for figure in ("card_cost", "attributed", "idle_cost", "energy_kwh", "workloads"):
            assert sum((getattr(n.figures, figure) for n in v.nodes), getattr(v.others.figures, figure)) == getattr(
                v.total, figure), figure
    for resp in pages:
        # As displayed: the page's node rows and the others row add up to the totals row (the others
        # row is a part of each fleet-… group), in the table and in the comparison.
        walk = Walk()
        _check_page("/fleet/", _marks(resp.content.decode()), walk)
        assert {"fleet-card", "fleet-attributed", "fleet-idle", "fleet-energy", "row", "compared-card",
                "compared-card-previous", "compared-idle-previous"} <= walk.groups_checked
    # The comparison: the page's nodes, the node metered only before on the last page, the rest summed.
    first, last = (v.comparison for v in views)
    assert [r.name for r in first.nodes] == [n.name for n in views[0].nodes]
    assert [r.name for r in last.nodes] == [*(n.name for n in views[1].nodes), "node-gone"]
    assert first.total == last.total
    assert first.total.card_cost.previous == D("6.00")
    assert first.others is not None
    assert last.others is not None
    assert first.others.card_cost.previous + sum(r.card_cost.previous for r in first.nodes) == D("6.00")


def test_a_page_shows_only_its_cards_workloads_and_the_page_size_is_chosen(client: Client, big_fleet: None) -> None:
    finance(client)
    resp = client.get("/fleet/", {**PERIOD, "sort": "name"})
    html = resp.content.decode()
    assert 'data-testid="fleet-pager"' in html
    assert 'data-testid="fleet-others"' in html
    assert "Nodes 1–25 of 30 (page 1 of 2)" in html
    # node-p23 … node-p27 are on page 2 (by name: node-a, node-b, node-p00 …): not on page 1.
    assert "GPU-P27" not in html
    assert resp.context["pager"]["next"] == "start=2026-03-02&end=2026-03-02&sort=name&page=2"
    # A sort link starts again at the first page; the CSV link has no page: every GPU.
    assert 'href="?start=2026-03-02&amp;end=2026-03-02&amp;sort=card_cost"' in html
    assert "page=" not in resp.context["csv_query"]
    # 50 a page: the whole fleet on one page, no others row, the pager still offers the sizes.
    resp = client.get("/fleet/", {**PERIOD, "sort": "name", "page_size": "50"})
    view = resp.context["fleet"]
    assert (len(view.nodes), view.pages, view.others) == (30, 1, None)
    assert view.comparison.others is None
    html = resp.content.decode()
    assert 'data-testid="fleet-others"' not in html
    assert 'data-testid="page-size-25"' in html
    assert '<input type="hidden" name="page_size" value="50">' in html
    # Each card's workloads are its own, on whichever page it is.
    p27 = next(g for g in view.gpus if g.gpu_uuid == "GPU-P27")
    assert [w.pod for w in p27.workloads] == ["p-27"]
    page2 = client.get("/fleet/", {**PERIOD, "sort": "name", "page": "2"}).context["fleet"]
    assert next(g for g in page2.gpus if g.gpu_uuid == "GPU-P27").workloads == p27.workloads


def test_the_csv_is_every_gpu_of_the_fleet_whatever_the_page(client: Client, big_fleet: None) -> None:
    finance(client)
    for page in ("1", "2"):
        resp = client.get("/fleet/", {**PERIOD, "format": "csv", "page": page})
        assert resp.status_code == 200
        rows = list(csv.reader(io.StringIO(resp.content.decode("utf-8-sig"))))
        _check_csv("fleet-gpus-20260302-20260302.csv", rows)
        assert len(rows) == 1 + 31 + 1  # the header, every GPU, the total
        html_total = client.get("/fleet/", {**PERIOD, "page": page}).context["fleet"].total
        assert rows[-1][rows[0].index("card_cost")] == str(html_total.card_cost)


@pytest.mark.parametrize(("params", "reason"), [
    ({"page": "3"}, "Page 3 is past the last page, 2, of this period's 30 nodes at 25 a page."),
    ({"page": "0"}, "is not a page number"),
    ({"page": "two"}, "is not a page number"),
    ({"page": "-1"}, "is not a page number"),
    ({"page": "99999999999999999999"}, "is not a page number"),
    ({"page_size": "7"}, "Unknown page size"),
    ({"page_size": "all", "format": "csv"}, "Unknown page size"),
])
def test_a_bad_page_answers_400_with_the_reason(client: Client, big_fleet: None, params: dict[str, str],
                                                reason: str) -> None:
    resp = finance(client).get("/fleet/", {**PERIOD, **params})
    assert resp.status_code == 400
    assert reason in unescape(resp.content.decode())


def test_a_page_past_the_last_links_to_the_last(client: Client, big_fleet: None) -> None:
    resp = finance(client).get("/fleet/", {**PERIOD, "page": "9", "page_size": "25"})
    assert resp.status_code == 400
    assert 'href="?start=2026-03-02&amp;end=2026-03-02&amp;sort=idle_cost&amp;page=2"' in resp.content.decode()
    # An empty period still has its first page, and no other.
    assert client.get("/fleet/", {"start": "2026-04-01", "end": "2026-04-01"}).status_code == 200
    assert client.get("/fleet/", {"start": "2026-04-01", "end": "2026-04-01", "page": "2"}).status_code == 400


def test_the_pages_speak_simplified_chinese(client: Client, big_fleet: None) -> None:
    finance(client)
    page = client.get("/fleet/", PERIOD, HTTP_ACCEPT_LANGUAGE="zh-hans").content.decode()
    for text in ("第 1–25 个节点", "共 30 个（第 1 页", "其他页上的 5 个节点（5 块 GPU）", "下一页"):
        assert text in page, text
    bad = client.get("/fleet/", {**PERIOD, "page": "3"}, HTTP_ACCEPT_LANGUAGE="zh-hans").content.decode()
    for text in ("第 3 页超出了最后一页", "此期间共 30 个节点", "每页 25 个"):
        assert text in bad, text


@pytest.mark.parametrize(("page", "pages", "links"), [
    (1, 1, [1]),
    (1, 5, [1, 2, 3, 4, 5]),  # a gap of one page is that page
    (1, 7, [1, 2, 3, None, 7]),
    (10, 40, [1, None, 8, 9, 10, 11, 12, None, 40]),
    (40, 40, [1, None, 38, 39, 40]),
])
def test_the_pager_links_the_first_the_last_and_the_pages_near_the_current(page: int, pages: int,
                                                                            links: list[int | None]) -> None:
    resolve("/fleet/")  # the URLconf imports the web modules in the order their imports need
    from billing.web.fleet import _page_numbers

    assert _page_numbers(page, pages) == links
