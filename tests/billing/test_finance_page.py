"""The finance page: behind login, numbers from the ledger, tenant scope enforced in queries."""

from __future__ import annotations

import csv
import io
from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest

from billing.ledger.rollup import rollup_usage
from billing.models import RateCard, Tenant
from billing.queries.figures import get_figure_tree
from billing.queries.finance import get_cost_summary
from billing.scope import FINANCE_GROUP, get_scope
from tests import clock
from tests.conftest import A100, make_batch, new_user, user_in

pytestmark = pytest.mark.django_db


@pytest.fixture
def ledger(post_batch, minute_start):
    RateCard.objects.create(gpu_model=A100["model"], currency="USD", price_per_gpu_hour=Decimal("3.6"),
                            effective_from=datetime(2020, 1, 1, tzinfo=UTC), source_url="https://example.org")
    Tenant.objects.create(slug="acme", name="Acme Robotics")
    workloads = [
        {"gpu": 0, "tenant": "acme", "pod": "bert-1", "mem_used": 8192.0, "mem_granted": 8192.0, "sm_used": 10.8, "sm_granted": 10.8},
        {"gpu": 0, "tenant": "globex", "pod": "llm-1", "mem_used": 16384.0, "mem_granted": 16384.0, "sm_used": 21.6, "sm_granted": 21.6},
    ]
    assert post_batch(make_batch(start=minute_start, seconds=10, workloads=workloads)).status_code == 201
    rollup_usage(now=clock.now())
    return minute_start



def period(start):
    return {"start": start.date().isoformat(), "end": start.date().isoformat()}


def test_finance_page_requires_login(client):
    resp = client.get("/finance/")
    assert resp.status_code == 302
    assert "/accounts/login/" in resp["Location"]


def test_finance_sees_cost_by_tenant_idle_and_total_that_reconcile(client, ledger):
    finance = user_in(FINANCE_GROUP)
    client.force_login(finance)
    resp = client.get("/finance/", period(ledger))
    assert resp.status_code == 200
    summary = resp.context["summary"]
    # 10 s at p = 0.001/s: acme holds 10 % of the card, globex 20 %; the ledger keeps them exactly,
    # and the rows show them as their invoices would: each line rounded once to the cent.
    hour = ledger.replace(minute=0, second=0)
    tree = get_figure_tree(scope=get_scope(finance), start=hour, end=hour + timedelta(hours=1), places=2)
    assert {t: root.exact.cost for t, root in tree.roots.items()} == {"acme": Decimal("0.001"), "globex": Decimal("0.002")}
    assert [(t.tenant, t.total) for t in summary.tenants] == [("globex", Decimal("0.00")), ("acme", Decimal("0.00"))]
    assert summary.total_gpu_cost == Decimal("0.01")
    assert summary.idle_platform == Decimal("0.007")
    shown = resp.context["shown"]
    assert (shown.attributed, shown.idle_platform, shown.total_gpu_cost) == (Decimal("0.00"), Decimal("0.01"),
                                                                             Decimal("0.01"))
    html = resp.content.decode()
    assert "Acme Robotics" in html
    assert "globex" in html


def test_tenant_member_sees_only_their_tenant_and_no_platform_totals(client, ledger):
    member = user_in(tenant="acme")
    hour = ledger.replace(minute=0)
    summary = get_cost_summary(scope=get_scope(member), start=hour, end=hour + timedelta(hours=1))
    assert [t.tenant for t in summary.tenants] == ["acme"]
    assert summary.total_gpu_cost is None
    assert summary.idle_platform is None
    client.force_login(member)
    html = client.get("/finance/", period(ledger)).content.decode()
    assert "globex" not in html
    assert "Idle (platform)" not in html


def test_user_with_no_role_sees_nothing(client, ledger):
    client.force_login(new_user("nobody"))
    summary = client.get("/finance/", period(ledger)).context["summary"]
    assert summary.tenants == []
    assert summary.total_gpu_cost is None


def test_csv_export_has_one_row_per_tenant_plus_idle_and_total(client, ledger):
    client.force_login(user_in(FINANCE_GROUP))
    resp = client.get("/finance/", {**period(ledger), "format": "csv"})
    assert resp["Content-Type"].startswith("text/csv")
    rows = list(csv.reader(io.StringIO(resp.content.decode("utf-8-sig"))))
    assert rows[0][:3] == ["tenant", "name", "charge"]
    assert [r[0] for r in rows[1:]] == ["globex", "acme", "(idle, platform)", "(total)"]


def test_bad_period_answers_400_with_a_message(client, ledger):
    client.force_login(user_in(FINANCE_GROUP))
    resp = client.get("/finance/", {"start": "2026-05-02", "end": "2026-05-01"})
    assert resp.status_code == 400
    assert "must not be before" in resp.content.decode()


def test_finance_page_speaks_simplified_chinese_when_asked(client, ledger):
    client.force_login(user_in(FINANCE_GROUP))
    resp = client.get("/finance/", period(ledger), HTTP_ACCEPT_LANGUAGE="zh-hans")
    html = resp.content.decode()
    assert "GPU 总成本" in html
    assert "按租户的成本" in html


@pytest.mark.django_db(transaction=True)
def test_the_dashboard_read_beside_itself_is_the_dashboard_read_in_turn(ledger, settings):
    """Committed rows: the page reads its chart's buckets on a side connection in its snapshot
    (billing.queries.snapshot), and shows the same."""
    import threading

    from billing.queries.dashboard import get_finance_dashboard
    from billing.queries.snapshot import one_snapshot

    start = ledger.replace(hour=0, minute=0)
    scope = get_scope(user_in(FINANCE_GROUP))
    boards = []
    for threads in (2, 0):
        settings.VGPU_PAGE_READ_THREADS = threads
        with one_snapshot():
            boards.append(get_finance_dashboard(scope=scope, start=start, end=start + timedelta(days=1), now=clock.now()))
        if threads:
            assert any(t.name.startswith("page-read") for t in threading.enumerate())
    beside, in_turn = boards
    assert beside == in_turn
    assert beside.timeline.series
