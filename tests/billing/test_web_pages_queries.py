"""The reads behind the web pages at fleet scale (bench/web_pages.py): the refactors that made them
fast keep every figure. Month-to-date spend of many tenants in one query equals the per-tenant
definition of billing.services.budgets.spend; the tenant list asks the ledger once, whatever the
number of tenants, and still shows only the caller's tenants."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from billing.ledger.models import UsageHour
from billing.ledger.reads import period_read_cursor
from billing.models import Node, Tenant
from billing.queries.portal import list_tenant_portals
from billing.scope import Scope
from billing.services.budgets.spend import get_month_spend, get_month_to_date_spend, get_month_to_date_spends
from tests.conftest import with_day

pytestmark = pytest.mark.django_db

D = Decimal
NOW = datetime(2026, 3, 15, 10, tzinfo=UTC)  # on the hour: the row of this hour counts (hour <= now)
MONTH_START = datetime(2026, 3, 1, tzinfo=UTC)
FINANCE = Scope(tenants=None, is_finance=True, is_admin=False)


def usage(hour: datetime, tenant: str, charge: str, idle: str = "0", pod: str = "p") -> UsageHour:
    q = {f: D(0) for f in ("seconds", "mem_used_mb_s", "mem_granted_mb_s", "mem_billed_mb_s", "sm_used_s",
                           "sm_granted_s", "sm_billed_s", "pcie_mb", "share_gpu_s")}
    return with_day(UsageHour.objects.create(
        gpu_uuid="GPU-1", node=Node.objects.get_or_create(name="gpu-node-1")[0], tenant=tenant,
        namespace=f"{tenant}-ns", pod=pod, container="main", pod_uid=f"uid-{pod}", sla_tier="gold",
        charge=D(charge), idle_share=D(idle), hour=hour, **q,
    ))


@pytest.fixture
def ledger(db) -> None:
    Tenant.objects.create(slug="acme", name="Acme Robotics")
    Tenant.objects.create(slug="globex", name="Globex")
    Tenant.objects.create(slug="huaxia", name="华夏智算")  # no usage at all
    usage(MONTH_START, "acme", "1.000000000001", idle="0.25")  # first hour of the month: counts
    usage(NOW, "acme", "2", idle="0.5", pod="q")  # the hour of `now`: counts
    usage(NOW + timedelta(hours=1), "acme", "100")  # after now: not yet
    usage(MONTH_START - timedelta(hours=1), "acme", "1000")  # last month
    usage(NOW - timedelta(hours=3), "globex", "7.5")
    usage(NOW - timedelta(hours=3), "ledger-only", "9")  # no Tenant row: not on the list


def test_grouped_month_to_date_spend_is_the_per_tenant_spend_of_each_tenant(ledger):
    tenants = ["acme", "globex", "huaxia", "nobody"]
    spends = get_month_to_date_spends(tenants=tenants, now=NOW)
    assert spends == {t: get_month_to_date_spend(tenant=t, now=NOW) for t in tenants}
    assert spends == {"acme": D("3.750000000001"), "globex": D("7.5"), "huaxia": D(0), "nobody": D(0)}
    assert get_month_to_date_spends(tenants=[], now=NOW) == {}


def test_grouped_spend_agrees_on_a_now_between_hours_and_on_the_first_hour_of_a_month(ledger):
    for now in (NOW - timedelta(minutes=1), NOW + timedelta(minutes=59), MONTH_START, MONTH_START - timedelta(hours=1)):
        spends = get_month_to_date_spends(tenants=["acme", "globex"], now=now)
        assert spends == {t: get_month_to_date_spend(tenant=t, now=now) for t in ("acme", "globex")}, now
    assert get_month_to_date_spends(tenants=["acme"], now=NOW - timedelta(minutes=1))["acme"] == D("1.250000000001")
    assert get_month_to_date_spends(tenants=["acme"], now=MONTH_START - timedelta(hours=1))["acme"] == D(1000)


def test_tenant_list_shows_the_budget_definition_of_month_to_date_spend(ledger):
    rows = list_tenant_portals(scope=FINANCE, now=NOW)
    assert [(r.slug, r.name) for r in rows] == [("acme", "Acme Robotics"), ("globex", "Globex"),
                                                ("huaxia", "华夏智算")]
    # As every page shows it: charge and idle share each to the cent, then added.
    assert {r.slug: r.month_to_date for r in rows} == {
        r.slug: get_month_spend(tenant=r.slug, now=NOW).month_to_date_shown("USD") for r in rows
    }
    assert rows[0].month_to_date == D("3.75")


def test_tenant_list_reads_the_ledger_once_whatever_the_number_of_tenants(ledger):
    def count() -> int:
        with CaptureQueriesContext(connection) as ctx:
            list_tenant_portals(scope=FINANCE, now=NOW)
        return sum("billing_usagehour" in q["sql"] for q in ctx.captured_queries)

    assert count() == 1
    for k in range(10):
        Tenant.objects.create(slug=f"t{k}", name=f"T{k}")
        usage(NOW, f"t{k}", "1")
    assert count() == 1


def test_tenant_list_of_a_member_holds_only_their_tenant_and_its_spend(ledger):
    member = Scope(tenants=frozenset({"globex"}), is_finance=False, is_admin=False)
    rows = list_tenant_portals(scope=member, now=NOW)
    assert [(r.slug, r.month_to_date) for r in rows] == [("globex", D("7.5"))]


def test_top_workloads_of_a_member_hold_only_their_tenants_pods_with_every_tier(ledger):
    from billing.queries.dashboard import get_finance_dashboard

    usage(NOW - timedelta(hours=2), "globex", "0.5", pod="g2")
    row = usage(NOW - timedelta(hours=1), "globex", "0.25", pod="g2")
    UsageHour.objects.filter(pk=row.pk).update(sla_tier="bronze")
    member = Scope(tenants=frozenset({"globex"}), is_finance=False, is_admin=False)
    top = get_finance_dashboard(scope=member, start=MONTH_START, end=NOW + timedelta(hours=2)).top_workloads
    assert [(w.tenant, w.pod, w.sla_tier, w.cost) for w in top] == [
        ("globex", "p", "gold", D("7.5")), ("globex", "g2", "bronze, gold", D("0.75")),
    ]
    everyone = get_finance_dashboard(scope=FINANCE, start=MONTH_START, end=NOW + timedelta(hours=2)).top_workloads
    # As every page shows them (billing.queries.figures): 101.250000000001 to the cent.
    assert [(w.tenant, w.pod, w.cost) for w in everyone][:2] == [("acme", "p", D("101.25")), ("ledger-only", "p", D(9))]


def test_a_period_read_sets_its_planner_settings_for_its_own_statements_and_puts_them_back(db) -> None:
    """The settings as they were are read by the statement that sets the read's own, then put back:
    inside, the period-read settings (and a statement's extra ones); after, what was there before
    (here a transaction's own work_mem), around a savepoint."""
    names = ("enable_nestloop", "jit", "work_mem", "enable_sort")

    def current() -> tuple[str, ...]:
        with connection.cursor() as cur:
            cur.execute("SELECT " + ", ".join(f"current_setting('{n}')" for n in names))
            return tuple(cur.fetchone())

    with connection.cursor() as cur:
        cur.execute("SELECT set_config('work_mem', '5MB', true)")
    before = current()
    with CaptureQueriesContext(connection) as around, period_read_cursor({"enable_sort": "off"}):
        inside = current()
    assert inside == ("off", "off", "32MB", "off")
    assert current() == before
    assert before[2] == "5MB"
    assert len(around.captured_queries) == 1 + 4  # the read of `inside`; savepoint, settings, back, release
