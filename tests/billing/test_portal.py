"""The tenant portal: a member's spend, budget, workloads and invoices; other tenants stay invisible
(404, decided in the query); finance sees every tenant; the root URL lands each role on its page."""

from __future__ import annotations

import csv
import io
import re
import threading
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal
from html.parser import HTMLParser
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
import time_machine
from django.db import connection, connections
from django.test import Client
from django.test.utils import CaptureQueriesContext

from billing.calendar import month_bounds
from billing.ledger.models import GpuHour, UsageHour, WorkloadMeta
from billing.ledger.spend import list_month_to_date_spends
from billing.models import BillingPeriod, BudgetStatus, Gpu, Invoice, Node, RateCard, Tenant
from billing.queries.budgets import BudgetView
from billing.queries.portal import TenantNotFound, get_tenant_portal
from billing.queries.snapshot import one_snapshot
from billing.scope import ADMIN_GROUP, FINANCE_GROUP, get_scope
from billing.services.budgets.spend import evaluate_budgets, get_month_spend, set_budget
from billing.services.invoicing import preview_invoice
from billing.web import portal as portal_views
from tests import clock
from tests.conftest import A100, user_in, with_day

pytestmark = pytest.mark.django_db

MB_S_PER_GB_H = 1024 * 3600


def usage(hour: datetime, *, tenant: str = "acme", namespace: str = "acme-prod", pod: str = "bert-1",
          pod_uid: str = "uid-bert-1", container: str = "server", gpu: str = "GPU-0", sla_tier: str = "gold",
          charge: str = "0", idle: str = "0", share_gpu_s: str = "0", mem_used_gb_h: str = "0",
          mem_granted_gb_h: str = "0", sm_used_h: str = "0", sm_granted_h: str = "0") -> UsageHour:
    """One hour-ledger row; quantities given in the units the page shows."""
    return with_day(UsageHour.objects.create(
        hour=hour, gpu_uuid=gpu, node=Node.objects.get_or_create(name="gpu-node-1")[0], tenant=tenant,
        namespace=namespace, pod=pod, container=container, pod_uid=pod_uid, sla_tier=sla_tier, seconds=3600,
        mem_used_mb_s=Decimal(mem_used_gb_h) * MB_S_PER_GB_H, mem_granted_mb_s=Decimal(mem_granted_gb_h) * MB_S_PER_GB_H,
        mem_billed_mb_s=Decimal(mem_granted_gb_h) * MB_S_PER_GB_H, sm_used_s=Decimal(sm_used_h) * 3600,
        sm_granted_s=Decimal(sm_granted_h) * 3600, sm_billed_s=Decimal(sm_granted_h) * 3600, pcie_mb=0,
        share_gpu_s=Decimal(share_gpu_s), charge=Decimal(charge), idle_share=Decimal(idle),
    ))


@pytest.fixture
def ledger(db) -> datetime:
    """acme: bert-1 (two containers on two GPUs) 2.25 and train-7 3.00 this hour, 100 last month;
    globex: 9.00 this hour. Returns this hour."""
    RateCard.objects.create(gpu_model=A100["model"], currency="USD", price_per_gpu_hour=Decimal("3.6"),
                            effective_from=datetime(2020, 1, 1, tzinfo=UTC), source_url="https://example.org")
    Tenant.objects.create(slug="acme", name="Acme Robotics")
    Tenant.objects.create(slug="globex", name="Globex Corp")
    hour = clock.now().replace(minute=0, second=0, microsecond=0)
    month_start, _ = month_bounds(hour.date().replace(day=1))
    usage(hour, charge="1.50", idle="0.25", share_gpu_s="1800", mem_used_gb_h="2", mem_granted_gb_h="4",
          sm_used_h="10.8", sm_granted_h="21.6")
    usage(hour, gpu="GPU-1", container="sidecar", charge="0.50", share_gpu_s="600", mem_used_gb_h="0.5",
          mem_granted_gb_h="1", sm_used_h="1.2", sm_granted_h="2.4")
    usage(hour, namespace="acme-dev", pod="train-7", pod_uid="uid-train-7", sla_tier="bronze", charge="3.00",
          share_gpu_s="3000", mem_used_gb_h="8", mem_granted_gb_h="8", sm_used_h="50", sm_granted_h="54")
    usage(month_start - timedelta(hours=1), charge="100")  # last month: not month to date
    usage(hour, tenant="globex", namespace="globex-prod", pod="llm-1", pod_uid="uid-llm-1", charge="9.00")
    return hour



class _Element(HTMLParser):
    """Collects the text of the first element carrying data-testid=name, nested elements included."""

    def __init__(self, name: str) -> None:
        super().__init__()
        self.name, self.depth, self.found = name, 0, False
        self.text: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag in _VOID:
            return
        if self.depth:
            self.depth += 1
        elif not self.found and ("data-testid", self.name) in attrs:
            self.depth, self.found = 1, True

    def handle_endtag(self, tag: str) -> None:
        if self.depth and tag not in _VOID:
            self.depth -= 1

    def handle_data(self, data: str) -> None:
        if self.depth:
            self.text.append(data)


_VOID = {"input", "br", "img", "meta", "link", "hr", "wbr", "source"}  # HTML elements without an end tag


def text_of(html: str, name: str, *, after: str = "") -> str:
    """The text inside the first element with data-testid=name (the first after `after`, if given),
    whitespace collapsed."""
    parser = _Element(name)
    assert after in html, f"no {after!r}"
    parser.feed(html[html.index(after) + len(after):] if after else html)
    assert parser.found, f"no data-testid={name}"
    return " ".join("".join(parser.text).split())


def test_member_sees_month_to_date_forecast_and_workloads_of_their_tenant(client, ledger):
    client.force_login(user_in(tenants=("acme",)))
    resp = client.get("/tenants/acme/")
    assert resp.status_code == 200
    portal = resp.context["portal"]
    # 1.50 + 0.25 idle + 0.50 + 3.00; last month's 100 and globex's 9 are not acme's month to date.
    assert portal.month_to_date == Decimal("5.25")
    assert portal.currency == "USD"
    # Only the hour in progress has usage: no complete hour to take a rate from, nothing extrapolated
    # (tests/billing/test_forecast.py has the forecast itself).
    assert portal.forecast == portal.month_to_date
    assert portal.forecast_rate_hours == 0
    html = resp.content.decode()
    assert "5.25 USD" in text_of(html, "mtd-cost")
    assert "5.25 USD" in text_of(html, "forecast")
    assert "No complete hour of usage yet" in text_of(html, "forecast-definition")

    train, bert = portal.workloads  # most expensive first
    assert (train.label, train.cost, train.sla_tiers) == ("acme-dev/train-7", Decimal("3.00"), ("bronze",))
    assert bert.label == "acme-prod/bert-1"
    assert bert.containers == ("server", "sidecar")
    assert bert.cost == Decimal("2.25")
    assert bert.gpu_hours_equivalent == Decimal("0.67")  # 2400 s, as the page shows it (2 places)
    assert (bert.mem_used_gb_h, bert.mem_granted_gb_h) == (Decimal("2.5"), Decimal("5"))
    assert (bert.sm_used_h, bert.sm_granted_h) == (Decimal("12"), Decimal("24"))
    assert bert.first_hour == bert.last_hour == ledger
    table = text_of(html, "workload-table")
    assert "acme-prod/bert-1" in table
    assert "server, sidecar" in table
    assert "2.25 USD" in table
    assert "globex" not in html
    assert "llm-1" not in html
    assert 'data-testid="workload-cost-chart"' in html
    assert 'data-testid="workload-memory-chart"' in html


def test_another_tenants_portal_is_404_like_a_tenant_that_does_not_exist(client, ledger):
    member = user_in(tenants=("acme",))
    client.force_login(member)
    assert client.get("/tenants/globex/").status_code == 404
    assert client.get("/tenants/globex/", {"format": "csv"}).status_code == 404
    # A bad period does not turn the 404 into a 400 that would reveal the tenant exists.
    assert client.get("/tenants/globex/", {"start": "2026-05-02", "end": "2026-05-01"}).status_code == 404
    assert client.get("/tenants/no-such-tenant/").status_code == 404
    # Decided in the query, not the template.
    now = clock.now()
    with pytest.raises(TenantNotFound):
        get_tenant_portal(scope=get_scope(member), slug="globex", start=now - timedelta(days=1), end=now, now=now,
                          places=2)


def test_user_without_membership_sees_no_portal(client, ledger):
    client.force_login(user_in())
    assert client.get("/tenants/acme/").status_code == 404
    resp = client.get("/tenants/")
    assert resp.status_code == 200
    assert resp.context["tenants"] == []


def test_the_portal_of_the_month_to_date_takes_it_from_its_workloads_figures_and_reads_it_once(ledger):
    """Showing the month to date, the portal's workloads are read from the ledger's month to date: its
    month to date is their invoice lines' sums, the same as the budgets' read, which it does not
    repeat; any other period reads the month to date on its own."""
    now = clock.now()
    scope = get_scope(user_in(FINANCE_GROUP))
    start, end = month_bounds(now.date().replace(day=1))
    read = get_month_spend(tenant="acme", now=now)
    with mock.patch("billing.services.budgets.spend.list_month_to_date_spends",
                    wraps=list_month_to_date_spends) as month_to_date:
        portal = get_tenant_portal(scope=scope, slug="acme", start=start, end=end, now=now, workload_limit=100)
        assert not [c for c in month_to_date.call_args_list if "acme" in c.kwargs["tenants"]]
        other = get_tenant_portal(scope=scope, slug="acme", start=start - timedelta(days=3), end=end, now=now)
        assert [c for c in month_to_date.call_args_list if "acme" in c.kwargs["tenants"]]
    assert portal.month_to_date == other.month_to_date == read.month_to_date == Decimal("5.25")
    assert portal.month_to_date_shown == read.month_to_date_shown("USD") == portal.period_cost
    assert portal.forecast == read.forecast


def test_finance_lists_every_tenant_with_month_to_date_and_opens_any_portal(client, ledger):
    set_budget(tenant_slug="acme", now=clock.now(), actor_label="test",
               values={"amount": Decimal("10"), "currency": "USD", "owner": "finops@acme.example"})
    evaluate_budgets(now=clock.now())
    client.force_login(user_in(group=FINANCE_GROUP))
    resp = client.get("/tenants/")
    rows = {r.slug: r for r in resp.context["tenants"]}
    assert {s: r.month_to_date for s, r in rows.items()} == {"acme": Decimal("5.25"), "globex": Decimal("9.00")}
    assert rows["acme"].budget.state == "ok"
    assert rows["globex"].budget is None
    html = text_of(resp.content.decode(), "tenant-list")
    assert "Acme Robotics" in html
    assert "Globex Corp" in html
    assert "No budget set" in html
    assert 'href="/tenants/globex/"' in resp.content.decode()
    globex = client.get("/tenants/globex/")
    assert globex.status_code == 200
    assert globex.context["portal"].month_to_date == Decimal("9.00")
    assert [w.label for w in globex.context["portal"].workloads] == ["globex-prod/llm-1"]


def test_member_of_one_tenant_is_sent_to_it_and_of_two_sees_only_those(client, ledger):
    Tenant.objects.create(slug="initech", name="Initech")
    client.force_login(user_in(tenants=("acme",)))
    resp = client.get("/tenants/")
    assert resp.status_code == 302
    assert resp["Location"] == "/tenants/acme/"
    client.force_login(user_in(tenants=("acme", "globex")))
    assert sorted(r.slug for r in client.get("/tenants/").context["tenants"]) == ["acme", "globex"]


@pytest.mark.parametrize(("group", "tenants", "landing"), [
    (None, ("acme",), "/tenants/acme/"),
    (FINANCE_GROUP, (), "/finance/"),
    (ADMIN_GROUP, ("acme",), "/nodes/"),  # an admin starts on the fleet (billing.web.access.landing_page)
])
def test_root_lands_each_role_on_its_page(client, ledger, group, tenants, landing):
    client.force_login(user_in(group=group, tenants=tenants))
    resp = client.get("/", follow=True)
    assert resp.redirect_chain[-1][0] == landing
    assert resp.status_code == 200


def test_root_sends_anonymous_users_to_login(client):
    resp = client.get("/")
    assert resp.status_code == 302
    assert resp["Location"].startswith("/accounts/login/")
    assert client.get("/tenants/").status_code == 302


def test_budget_status_shows_state_bar_action_and_owner(client, ledger):
    set_budget(tenant_slug="acme", now=clock.now(), actor_label="test",
               values={"amount": Decimal("5"), "currency": "USD", "hard_action": "block",
                       "owner": "finops@acme.example"})
    evaluate_budgets(now=clock.now())
    client.force_login(user_in(tenants=("acme",)))
    resp = client.get("/tenants/acme/")
    html = resp.content.decode()
    assert re.search(r'class="budget-bar state-enforced" data-testid="budget-bar" data-state="enforced"', html)
    assert 'aria-valuenow="100"' in html  # 105 % used, the bar is capped at full
    status = text_of(html, "budget-status")
    assert "105 % used (5.25 USD)" in status
    assert "enforced" in status
    assert "block new GPU pods" in html
    assert "finops@acme.example" in html


@pytest.mark.parametrize(("language", "label", "sentence"), [
    ("en", "forecast over budget", "Forecast to month end 5.25 USD, above the budget of 5.00 USD"),
    ("zh-hans", "预测超出预算", "月末预测 5.25 USD\uff0c高于 5.00 USD 的预算"),
])
def test_forecast_over_budget_is_the_state_shown_on_the_portal_the_tenant_list_and_the_budgets_page(
        ledger, language, label, sentence):
    """acme's forecast is its month to date (no complete hour yet): 5.25 USD above a budget of 5.00,
    while thresholds of 999 % keep the state ok. Each page shows "forecast over budget" as the state,
    in the reader's language and orange, never "ok" beside it; enforcement still reads ok."""
    set_budget(tenant_slug="acme", now=clock.now(), actor_label="test",
               values={"amount": Decimal("5"), "currency": "USD", "owner": "finops@acme.example",
                       "soft_threshold_pct": Decimal("999"), "hard_threshold_pct": Decimal("999")})
    evaluate_budgets(now=clock.now())
    assert BudgetStatus.objects.get(budget__tenant__slug="acme").state == "ok"
    member = Client(HTTP_ACCEPT_LANGUAGE=language)
    member.force_login(user_in(tenants=("acme",)))
    html = member.get("/tenants/acme/").content.decode()
    assert re.search(r'class="budget-bar state-ok forecast-over" data-testid="budget-bar" data-state="ok"', html)
    assert re.search(r'<strong class="state-forecast-over" data-testid="budget-state" '
                     r'data-shown-state="forecast-over">', html)
    assert text_of(html, "budget-state") == label
    assert 'data-testid="budget-forecast-over"' not in html  # no badge repeating the state
    assert text_of(html, "budget-forecast-vs-amount") == sentence
    finance = Client(HTTP_ACCEPT_LANGUAGE=language)
    finance.force_login(user_in(group=FINANCE_GROUP))
    tenants = finance.get("/tenants/").content.decode()
    assert re.search(r'<td class="state-forecast-over" data-testid="tenant-budget-state-acme"', tenants)
    assert text_of(tenants, "tenant-budget-state-acme") == label
    budgets = finance.get("/budgets/").content.decode()
    assert text_of(budgets, "budget-state-acme") == label
    assert re.search(r'data-testid="budget-state-acme" data-state="ok" data-shown-state="forecast-over">'
                     r'<strong class="state-forecast-over">', budgets)
    assert re.search(r'<td class="num forecast-over" data-testid="budget-forecast-acme">5.25 USD</td>'
                     r'<td class="num">5.00 USD</td>', budgets)
    assert "forecast-over-definition" in budgets


def test_a_warned_budget_keeps_its_state_with_the_forecast_beside_it(client, ledger):
    """Warned is already a warning: it stays the state shown, the forecast a badge beside it."""
    set_budget(tenant_slug="acme", now=clock.now(), actor_label="test",
               values={"amount": Decimal("5"), "currency": "USD", "owner": "finops@acme.example",
                       "soft_threshold_pct": Decimal("50"), "hard_threshold_pct": Decimal("999")})
    evaluate_budgets(now=clock.now())
    client.force_login(user_in(tenants=("acme",)))
    html = client.get("/tenants/acme/").content.decode()
    assert text_of(html, "budget-state") == "warned"
    assert text_of(html, "budget-forecast-over") == "forecast over budget"


def test_the_state_shown_is_decided_in_one_place():
    def view(state: str, flag: bool) -> BudgetView:
        return BudgetView(id=1, tenant="acme", tenant_name="Acme", scope="tenant", namespace="", label="",
                          amount=Decimal(5), currency="USD", hard_action="block", owner="", state=state,
                          spend=Decimal(1), spend_shown=Decimal(1), forecast=Decimal(9), rate_hours=1,
                          used_pct=Decimal(20), forecast_over_budget=flag)
    assert (view("ok", True).shown_state, view("ok", True).forecast_over_badge) == ("forecast-over", False)
    assert (view("ok", False).shown_state, view("ok", False).forecast_over_badge) == ("ok", False)
    assert (view("warned", True).shown_state, view("warned", True).forecast_over_badge) == ("warned", True)
    assert view("enforced", False).shown_state == "enforced"
    assert view("ok", True).state == "ok"  # what enforcement reads is untouched


def test_a_budget_whose_forecast_is_within_it_shows_no_forecast_warning(client, ledger):
    set_budget(tenant_slug="acme", now=clock.now(), actor_label="test",
               values={"amount": Decimal("5.25"), "currency": "USD", "owner": "finops@acme.example",
                       "soft_threshold_pct": Decimal("999"), "hard_threshold_pct": Decimal("999")})
    evaluate_budgets(now=clock.now())  # a forecast of 5.25 at a budget of 5.25 is not over it
    client.force_login(user_in(tenants=("acme",)))
    html = client.get("/tenants/acme/").content.decode()
    assert re.search(r'class="budget-bar state-ok" data-testid="budget-bar" data-state="ok"', html)
    assert "forecast-over" not in html
    client.force_login(user_in(group=FINANCE_GROUP))
    assert 'data-testid="forecast-over-acme"' not in client.get("/budgets/").content.decode()


def test_the_forecast_over_bar_is_not_the_green_of_ok():
    css = (Path(__file__).resolve().parents[2] / "templates" / "static" / "css" / "app.css").read_text()
    fills = dict(re.findall(r"\.budget-bar(\.[\w.-]+)? rect \{ fill:([^;]+);", css))
    assert fills[".forecast-over"] not in (fills[""], fills[".state-warned"])


def test_tenant_without_budget_says_so(client, ledger):
    client.force_login(user_in(tenants=("acme",)))
    html = client.get("/tenants/acme/").content.decode()
    assert "No budget set" in html
    assert 'data-testid="budget-bar"' not in html


def test_workload_csv_has_every_workload_rounded_as_stated_and_a_total_row(client, ledger):
    client.force_login(user_in(tenants=("acme",)))
    resp = client.get("/tenants/acme/", {"format": "csv"})
    assert resp.status_code == 200
    assert resp["Content-Type"] == "text/csv; charset=utf-8"
    assert resp["Content-Disposition"].startswith('attachment; filename="acme-workloads-')
    header, *rows, total = list(csv.reader(io.StringIO(resp.content.decode("utf-8-sig"))))
    assert header[:7] == ["namespace", "pod", "pod_uid", "containers", "sla_tiers", "cost", "currency"]
    by_pod = {r[1]: dict(zip(header, r, strict=True)) for r in rows}
    assert set(by_pod) == {"train-7", "bert-1"}
    bert = by_pod["bert-1"]
    # The currency's minor unit.
    assert bert["cost"] == "2.25"
    assert bert["currency"] == "USD"
    assert bert["containers"] == "server sidecar"
    assert bert["gpu_hours_equivalent"] == "0.6667"  # 2400 s: 4 places, as docs/exports.md states
    assert bert["mem_used_gb_h"] == "2.5000"
    assert bert["sm_granted_h"] == "24.0000"
    assert datetime.fromisoformat(bert["first_hour"]) == ledger
    # The total row is the sum of the rows as written, column by column.
    total_row = dict(zip(header, total, strict=True))
    assert total_row["namespace"] == "(total)"
    assert total_row["currency"] == "USD"
    for column in ("cost", "gpu_hours_equivalent", "mem_used_gb_h", "sm_used_h", "sm_granted_h"):
        assert Decimal(total_row[column]) == sum(Decimal(r[column]) for r in by_pod.values()), column


def test_chosen_period_charts_daily_cost_of_the_top_seven_and_the_rest_as_an_eighth(client, ledger):
    day1 = datetime(2026, 1, 5, 10, tzinfo=UTC)
    for i in range(10):  # pod-0 costs least … pod-9 most; pod-0, pod-1 and pod-2 fall into "other"
        usage(day1, pod=f"pod-{i}", pod_uid=f"uid-{i}", charge=str(i + 1), mem_used_gb_h="1")
    usage(day1 + timedelta(days=2), pod="pod-9", pod_uid="uid-9", charge="5", mem_used_gb_h="3")
    client.force_login(user_in(tenants=("acme",)))
    resp = client.get("/tenants/acme/", {"start": "2026-01-05", "end": "2026-01-07"})
    assert resp.status_code == 200
    daily = resp.context["portal"].daily
    assert daily.days == (date(2026, 1, 5), date(2026, 1, 6), date(2026, 1, 7))
    assert daily.names[0] == "acme-prod/pod-9"
    assert len(daily.names) == 7
    assert daily.has_other
    assert daily.cost[0] == (Decimal(10), Decimal(0), Decimal(5))
    assert daily.cost[-1] == (Decimal(6), Decimal(0), Decimal(0))  # other: pod-0 (1) + pod-1 (2) + pod-2 (3)
    assert daily.mem_used_gb_h[0] == (Decimal(1), Decimal(0), Decimal(3))
    assert len(resp.context["portal"].workloads) == 10
    # The chart stops at today: a period running past now draws no days to come.
    with time_machine.travel(datetime(2026, 1, 6, 12, tzinfo=UTC), tick=False):
        running = client.get("/tenants/acme/", {"start": "2026-01-05", "end": "2026-01-31"}).context["portal"].daily
    assert running.days == (date(2026, 1, 5), date(2026, 1, 6))
    assert running.cost[0] == (Decimal(10), Decimal(0))
    html = resp.content.decode()
    assert "Other workloads" in text_of(html, "workload-cost-chart")
    assert "acme-prod/pod-9" in text_of(html, "workload-memory-chart")
    # This month's usage is outside the period; month to date is unchanged by the period.
    assert "bert-1" not in text_of(html, "workload-table")
    assert resp.context["portal"].month_to_date == Decimal("5.25")


def test_a_workloads_chart_days_add_up_to_its_figure_in_the_table(client, ledger):
    # Three one-day workloads of 1.005 each: alone each rounds to 1.00, but the tenant's figure is
    # 3.02 (its invoice line's rule: the sum rounded once), which opens into 1.01 + 1.01 + 1.00.
    day = datetime(2026, 1, 5, 10, tzinfo=UTC)
    for i in range(3):
        usage(day, pod=f"pod-{i}", pod_uid=f"uid-{i}", charge="1.005")
    client.force_login(user_in(tenants=("acme",)))
    portal = client.get("/tenants/acme/", {"start": "2026-01-05", "end": "2026-01-05"}).context["portal"]
    figures = {w.label: w.cost for w in portal.workloads}
    charted = {name: sum(days, Decimal(0)) for name, days in zip(portal.daily.names, portal.daily.cost, strict=True)}
    assert charted == figures
    # Rounding the day on its own would not do: 1.005 shows 1.00 where the table shows 1.01.
    assert sorted(figures.values()) == [Decimal("1.00"), Decimal("1.01"), Decimal("1.01")]
    # Each cell is written to the cent, as the tooltip shows it.
    assert all(v == v.quantize(Decimal("0.01")) for days in portal.daily.cost for v in days)


def test_eight_workloads_are_all_charted_without_an_other_series(client, ledger):
    for i in range(6):  # with bert-1 and train-7: eight workloads this month
        usage(ledger, pod=f"pod-{i}", pod_uid=f"uid-{i}", charge="1")
    client.force_login(user_in(tenants=("acme",)))
    daily = client.get("/tenants/acme/").context["portal"].daily
    assert len(daily.names) == 8
    assert not daily.has_other
    assert len(daily.cost) == 8


def test_bad_period_answers_400_with_the_reason(client, ledger):
    client.force_login(user_in(tenants=("acme",)))
    resp = client.get("/tenants/acme/", {"start": "2026-05-02", "end": "2026-05-01"})
    assert resp.status_code == 400
    html = resp.content.decode()
    assert "must not be before" in html
    assert 'data-testid="workload-table"' not in html
    assert client.get("/tenants/acme/", {"start": "2026-05-02", "end": "2026-05-01", "format": "csv"}).status_code == 400


def _invoice(slug: str, month: date) -> Invoice:
    period = BillingPeriod.objects.get_or_create(month=month)[0]
    return Invoice.objects.create(tenant=Tenant.objects.get(slug=slug), period=period, currency="USD",
                                  number=f"VGL-{month:%Y%m}-{slug}", total_minor=12345, created_at=clock.now())


@pytest.mark.parametrize("viewer", [{"tenants": ("acme",)}, {"group": FINANCE_GROUP}])
def test_invoice_links_point_at_this_tenants_invoices_only(client, ledger, viewer: dict[str, Any]):
    own = _invoice("acme", date(2026, 1, 1))
    other = _invoice("globex", date(2026, 1, 1))
    client.force_login(user_in(**viewer))
    resp = client.get("/tenants/acme/")
    assert [i.number for i in resp.context["portal"].invoices] == [own.number]
    html = resp.content.decode()
    links = set(re.findall(r'href="(/invoices/[^"]+)"', html))
    assert links == {f"/invoices/{own.number}.pdf", f"/invoices/{own.number}.csv", f"/invoices/{own.number}.focus"}
    assert other.number not in html
    assert client.get(f"/invoices/{own.number}.csv").status_code == 200


def test_the_workload_table_shows_the_costliest_and_says_the_csv_has_them_all(
        client: Client, ledger: datetime, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(portal_views, "WORKLOAD_TABLE_ROWS", 1)
    client.force_login(user_in(tenants=("acme",)))
    html = client.get("/tenants/acme/").content.decode()
    assert html.count('data-testid="workload-row"') == 1
    assert "train-7" in text_of(html, "workload-table")
    assert "bert-1" not in text_of(html, "workload-table")
    assert text_of(html, "workload-table-cut") == "The 1 costliest of 2 workloads are shown; the CSV lists them all."
    rows = list(csv.reader(io.StringIO(client.get("/tenants/acme/", {"format": "csv"}).content.decode("utf-8-sig"))))
    assert sorted(r[1] for r in rows[1:-1]) == ["bert-1", "train-7"]
    assert rows[-1][0] == "(total)"
    # The cut table's footer is still the cost of every workload, as the CSV's total row.
    assert text_of(html, "workload-total") == f"{rows[-1][5]} USD"


def test_a_table_of_every_workload_says_nothing_about_a_cut(client: Client, ledger: datetime) -> None:
    client.force_login(user_in(tenants=("acme",)))
    html = client.get("/tenants/acme/").content.decode()
    assert html.count('data-testid="workload-row"') == 2
    assert 'data-testid="workload-table-cut"' not in html


def test_a_portal_of_the_costliest_workloads_keeps_the_count_cost_and_chart_of_all(ledger: datetime) -> None:
    start, end = month_bounds(ledger.date().replace(day=1))
    scope = get_scope(user_in(group=FINANCE_GROUP))
    full = get_tenant_portal(scope=scope, slug="acme", start=start, end=end, now=clock.now(), places=2)
    top = get_tenant_portal(scope=scope, slug="acme", start=start, end=end, now=clock.now(), places=2,
                            workload_limit=1)
    assert [w.pod for w in full.workloads] == ["train-7", "bert-1"]
    assert top.workloads == full.workloads[:1]
    assert (top.workload_count, top.period_cost) == (full.workload_count, full.period_cost) == (2, Decimal("5.25"))
    assert top.daily == full.daily


H100 = "NVIDIA H100 80GB HBM3"


def _gpu(node: Node, uuid: str, model: str, hour: datetime, *, priced: bool = True) -> None:
    """A card of 81,920 MB and 108 SMs, metered the whole hour."""
    Gpu.objects.create(uuid=uuid, node=node, model=model, memory_mb=81920, sm_count=108, first_seen_at=hour,
                       last_seen_at=hour)
    with_day(GpuHour.objects.create(gpu_uuid=uuid, node=node, gpu_model=model, hour=hour, metered_seconds=3600,
                                    card_cost=Decimal("3.6"), charged=0, idle_cost=0, idle_allocated=0,
                                    currency="USD", priced=priced))


def _hour_row(node: Node, hour: datetime, *, pod: str, gpu: str, charge: str, idle: str = "0",
              mem_used_mb: int, mem_granted_mb: int, sm_used: int, sm_granted: int) -> None:
    """One hour of a pod at a steady use and grant, billed on max(used, granted)."""
    with_day(UsageHour.objects.create(
        hour=hour, gpu_uuid=gpu, node=node, tenant="acme", namespace="ml", pod=pod, container="main",
        pod_uid=f"uid-{pod}", sla_tier="gold", seconds=3600, mem_used_mb_s=mem_used_mb * 3600,
        mem_granted_mb_s=mem_granted_mb * 3600, mem_billed_mb_s=max(mem_used_mb, mem_granted_mb) * 3600,
        sm_used_s=sm_used * 3600, sm_granted_s=sm_granted * 3600, sm_billed_s=max(sm_used, sm_granted) * 3600,
        pcie_mb=0, share_gpu_s=0, charge=Decimal(charge), idle_share=Decimal(idle)))


@pytest.fixture
def overgranted(db) -> datetime:
    """acme/ml in the hour before this one, all on cards of 81,920 MB and 108 SMs at 3.60 USD an hour:
    - hog: half the memory granted and a quarter used, all 108 SMs granted and 12 used (11 %),
      charged 2.70 (its billed 2700 card-seconds) + 0.30 idle; it asked for 40 GiB and 108 SMs;
    - lean (an H100 card billing on `used`): charged 1.00; its pod reported no request;
    - stray: on a card no rate card prices (billed at 0)."""
    RateCard.objects.create(gpu_model=A100["model"], currency="USD", price_per_gpu_hour=Decimal("3.6"),
                            effective_from=datetime(2020, 1, 1, tzinfo=UTC), source_url="https://example.org")
    RateCard.objects.create(gpu_model=H100, currency="USD", price_per_gpu_hour=Decimal("3.6"), billed_basis="used",
                            alpha=Decimal("0.25"), effective_from=datetime(2020, 1, 1, tzinfo=UTC),
                            source_url="https://example.org")
    Tenant.objects.create(slug="acme", name="Acme Robotics")
    hour = clock.now().replace(minute=0, second=0, microsecond=0) - timedelta(hours=1)
    node = Node.objects.create(name="gpu-node-1")
    _gpu(node, "GPU-A", A100["model"], hour)
    _gpu(node, "GPU-H", H100, hour)
    _gpu(node, "GPU-X", "NVIDIA T4", hour, priced=False)
    _hour_row(node, hour, pod="hog", gpu="GPU-A", charge="2.70", idle="0.30", mem_used_mb=20480,
              mem_granted_mb=40960, sm_used=12, sm_granted=108)
    _hour_row(node, hour, pod="lean", gpu="GPU-H", charge="1.00", mem_used_mb=10240, mem_granted_mb=40960,
              sm_used=10, sm_granted=54)
    _hour_row(node, hour, pod="stray", gpu="GPU-X", charge="0", mem_used_mb=1024, mem_granted_mb=2048, sm_used=1,
              sm_granted=2)
    WorkloadMeta.objects.create(node=node, namespace="ml", pod="hog", pod_uid="uid-hog",
                                requests={"main": {"mem_mb": 40960, "sm": 108}}, first_seen=hour, last_seen=hour)
    return hour


def test_the_panel_says_what_a_workload_was_billed_on_and_what_over_granting_cost(client, overgranted):
    client.force_login(user_in(tenants=("acme",)))
    resp = client.get("/tenants/acme/")
    assert resp.status_code == 200
    hog, lean, stray = resp.context["portal"].workloads
    assert (hog.pod, lean.pod, stray.pod) == ("hog", "lean", "stray")
    # Billed 0.5 × 1800 + 0.5 × 3600 = 2700 card-seconds, used 0.5 × 900 + 0.5 × 400 = 650: billing on
    # use would have charged 0.65 of the 2.70, so 2.05 is due to over-granting, of a cost of 3.00.
    assert hog.reasons is not None
    assert (hog.reasons.bases, hog.reasons.alphas, hog.reasons.unpriced) == (("max",), (Decimal("0.5"),), False)
    assert hog.reasons.overgranted == Decimal("2.05")
    assert hog.cost == Decimal("3.00")
    assert hog.overgranted_pct is not None
    assert round(hog.overgranted_pct, 1) == Decimal("68.3")
    assert (hog.mem_requested_gb_h, hog.sm_requested_h) == (Decimal(40), Decimal(108))
    # A card billing on use has no over-granting; a pod with no request reported has none shown.
    assert lean.reasons is not None
    assert (lean.reasons.bases, lean.reasons.overgranted) == (("used",), 0)
    assert (lean.mem_requested_gb_h, lean.sm_requested_h) == (None, None)
    assert stray.reasons is not None
    assert (stray.reasons.bases, stray.reasons.unpriced) == ((), True)

    html = resp.content.decode()
    panel = text_of(html, "cost-reasons")
    assert "ml/hog · 3.00 USD · 68.3 % due to over-granting" in panel
    assert "20.00 GB·h used of 40.00 GB·h granted (50.0 %); 40.00 GB·h requested" in panel
    assert "12.00 SM·h used of 108.00 SM·h granted (11.1 %); 108.00 SM·h requested" in panel
    assert "max(used, granted): the larger of the two, each second · α = 0.50" in panel
    assert "2.05 USD of 3.00 USD (68.3 %): what billing on use alone would not have charged" in panel
    assert "used: what was used only · α = 0.25" in panel
    assert "0.00 USD of 1.00 USD (0.0 %)" in panel
    assert panel.count("request not reported by the node agent") == 4  # lean's and stray's, memory and SMs
    assert "no rate card priced it: billed at 0" in panel
    assert "GPU-hours (equivalent)</strong>: what a workload was billed for, in hours of a whole GPU" in html

    # Right-sizing beside it, memory and SMs by one rule: 20 GiB × 1.3 → 26 GiB of the 40 asked for,
    # 14 of 40 GB·h given back; 12 SMs × 1.3 = 15.6 → 16 of 108 SMs, 92 of 108 SM·h given back.
    (main,) = hog.reasons.sizing
    assert (main.container, main.suggestion.verdict, main.suggestion.suggested, main.freed_gb_h) == (
        "main", "lower", Decimal(26 * 1024), Decimal(14))
    assert (main.sm.request_sm, main.sm.peak_hour_mean_sm) == (Decimal(108), Decimal(12))
    assert (main.sm_suggestion.verdict, main.sm_suggestion.suggested, main.freed_sm_h) == (
        "lower", Decimal(16), Decimal(92))
    assert "→ request 26 GiB, freeing 14.00 GB·h." in panel
    assert "→ request 16 SMs, freeing 92.00 SM·h." in panel
    # lean reported no request: the same rule against the grant it was billed on, saying so. 40 GiB
    # granted, 10 at the peak hour → 13 GiB, 27 of 40 GB·h; 54 SMs granted, 10 at the peak → 13.
    (lean_main,) = lean.reasons.sizing
    assert (lean_main.suggestion.verdict, lean_main.suggestion.basis, lean_main.suggestion.suggested,
            lean_main.freed_gb_h) == ("lower", "grant", Decimal(13 * 1024), Decimal(27))
    assert (lean_main.sm_suggestion.verdict, lean_main.sm_suggestion.basis, lean_main.sm_suggestion.suggested,
            lean_main.freed_sm_h) == ("lower", "grant", Decimal(13), Decimal(41))
    lean_panel = text_of(html, "reason-rightsizing", after='data-workload="ml/lean/uid-lean"')
    assert lean_panel.count("Request not reported by the node agent; sized against the grant billed on:") == 2
    assert ("Granted 40.00 GiB, used on average 10.00 GiB (peak hour 10.00 GiB) → ask for 13 GiB, "
            "freeing 27.00 GB·h.") in lean_panel
    assert "Granted 54.00 SMs, used on average 10.00 SMs (peak hour 10.00 SMs) → ask for 13 SMs, freeing 41.00 SM·h." in lean_panel
    # stray: 2 GiB and 2 SMs granted, half used: the grant fits.
    (stray_main,) = stray.reasons.sizing
    assert (stray_main.suggestion.verdict, stray_main.sm_suggestion.verdict) == ("fits", "fits")
    assert "Request unknown: no suggestion." not in panel
    assert "plus 30 % headroom" in panel


def test_a_raise_reads_as_a_raise_with_quantities_that_show_why(client, overgranted):
    """400 MB requested, the peak hour at 430 MB: at one decimal both read 0.4 GiB, a contradiction."""
    node = Node.objects.get(name="gpu-node-1")
    _gpu(node, "GPU-B", A100["model"], overgranted)
    _hour_row(node, overgranted, pod="tiny", gpu="GPU-B", charge="0.10", mem_used_mb=430, mem_granted_mb=400,
              sm_used=1, sm_granted=2)
    WorkloadMeta.objects.create(node=node, namespace="ml", pod="tiny", pod_uid="uid-tiny",
                                requests={"main": {"mem_mb": 400, "sm": 2}}, first_seen=overgranted,
                                last_seen=overgranted)
    client.force_login(user_in(tenants=("acme",)))
    html = client.get("/tenants/acme/").content.decode()
    tiny = text_of(html, "reason-rightsizing", after='data-workload="ml/tiny/uid-tiny"')
    assert ("The peak hour used 0.42 GiB, more than the 0.39 GiB requested → raise the request to 1 GiB."
            in tiny)


def test_the_panel_shows_each_workloads_cost_as_the_table_does_to_the_cent(client, ledger):
    """The figure both show is the table's own value, not a second computation."""
    client.force_login(user_in(tenants=("acme",)))
    html = client.get("/tenants/acme/").content.decode()
    table_costs = re.findall(r'<strong data-sum="workloads"[^>]*>([^<]+)</strong>', html)
    panel_costs = re.findall(r'<strong data-testid="reason-cost"[^>]*>([^<]+)</strong>', html)
    assert table_costs == panel_costs == ["3.00 USD", "2.25 USD"]


def test_the_portal_explains_throttle_where_a_budget_throttles(client, ledger):
    set_budget(tenant_slug="acme", now=clock.now(), actor_label="test",
               values={"amount": Decimal("500"), "currency": "USD", "hard_action": "throttle",
                       "throttle_factor": Decimal("0.25"), "owner": "finops@acme.example"})
    client.force_login(user_in(tenants=("acme",)))
    html = client.get("/tenants/acme/").content.decode()
    text = text_of(html, "throttle-definition")
    assert "Throttle: while the budget is enforced, GPU workloads keep running" in text
    assert "multiplied by 0.25" in text


def test_a_budget_that_does_not_throttle_has_no_throttle_note(client, ledger):
    set_budget(tenant_slug="acme", now=clock.now(), actor_label="test",
               values={"amount": Decimal("500"), "currency": "USD", "hard_action": "block",
                       "owner": "finops@acme.example"})
    Tenant.objects.filter(slug="acme").update(namespaces=["acme-prod"])
    set_budget(tenant_slug="acme", scope="namespace", namespace="acme-prod", now=clock.now(), actor_label="test",
               values={"amount": Decimal("50"), "currency": "USD", "hard_action": "block", "owner": "x@acme.example"})
    client.force_login(user_in(tenants=("acme",)))
    html = client.get("/tenants/acme/").content.decode()
    assert 'data-testid="throttle-definition"' not in html
    assert 'data-testid="scoped-throttle-definition"' not in html


def test_a_throttling_namespace_budget_after_another_gets_the_note_under_its_table(client, ledger):
    Tenant.objects.filter(slug="acme").update(namespaces=["acme-dev", "acme-prod"])
    for namespace, action in (("acme-dev", "block"), ("acme-prod", "throttle")):
        set_budget(tenant_slug="acme", scope="namespace", namespace=namespace, now=clock.now(), actor_label="test",
                   values={"amount": Decimal("50"), "currency": "USD", "hard_action": action,
                           "owner": "x@acme.example"})
    client.force_login(user_in(tenants=("acme",)))
    html = client.get("/tenants/acme/").content.decode()
    note = text_of(html, "scoped-throttle-definition")
    assert "Throttle: while the budget is enforced" in note
    assert "multiplied by the budget's throttle factor" in note


def _commit_late_usage(hour: datetime) -> None:
    """A row committed on a connection of its own (this thread's), as the rollup's worker commits."""
    usage(hour, pod="late-1", pod_uid="uid-late-1", charge="7.00")
    connections.close_all()


@pytest.mark.django_db(transaction=True)
def test_a_rollup_committing_while_the_portal_is_built_moves_none_of_its_month_to_date_figures(client, ledger):
    """The portal shows the month to date in several places (the card, the workloads' total, the
    upcoming invoice). The rollup commits every few seconds; one that lands between two of the page's
    queries must not make them disagree: the page reads one snapshot (billing.queries.snapshot)."""
    client.force_login(user_in(tenants=("acme",)))
    committed: list[bool] = []

    def rollup_lands_after_the_first_ledger_read(execute, sql, params, many, context):
        result = execute(sql, params, many, context)
        if not committed and UsageHour._meta.db_table in sql:
            # Another connection, as the rollup's worker would be: its commit is visible at once to
            # any statement that takes a fresh snapshot.
            worker = threading.Thread(target=_commit_late_usage, args=(ledger,))
            worker.start()
            worker.join()
            committed.append(True)
        return result

    with connection.execute_wrapper(rollup_lands_after_the_first_ledger_read):
        html = client.get("/tenants/acme/").content.decode()
    assert committed
    shown = {text_of(html, name) for name in ("mtd-cost", "workload-total")}
    assert shown == {"5.25 USD"}, shown  # the snapshot of the first read: the late row is not in it
    # The next page load sees it, everywhere at once.
    html = client.get("/tenants/acme/").content.decode()
    assert {text_of(html, name) for name in ("mtd-cost", "workload-total")} == {"12.25 USD"}


@pytest.mark.django_db(transaction=True)
def test_the_portal_read_beside_itself_is_the_portal_read_in_turn(ledger: datetime, settings: Any) -> None:
    """Committed rows: the page reads its upcoming invoice, its listed workloads' reasons and its
    chart's days on side connections in its snapshot (billing.queries.snapshot), and shows the same."""
    now = clock.now()
    start, end = month_bounds(now.date().replace(day=1))
    scope = get_scope(user_in(FINANCE_GROUP))
    portals = []
    for threads in (2, 0):
        settings.VGPU_PAGE_READ_THREADS = threads
        with one_snapshot():
            portals.append(get_tenant_portal(scope=scope, slug="acme", start=start, end=end, now=now,
                                             workload_limit=1))
        if threads:
            assert any(t.name.startswith("page-read") for t in threading.enumerate())
    beside, in_turn = portals
    assert beside == in_turn
    assert beside.upcoming is not None
    assert beside.workloads[0].reasons is not None
    assert beside.daily.days


# Statements of the portal of the month to date on the `ledger` fixture, the page's own (session,
# scope) included: the figure tree, the forecast's hours, budgets, the cost panel's two reads, the
# months' lines, the upcoming invoice, the daily chart, invoices, and the planner settings around the
# period reads. At 1,000 GPUs every one of them is a read of the ledger or beside one; a count that
# grows is a read added or repeated (docs/benchmarks.md, "The tenant portal at 1,000 GPUs").
# 60 and 66 before: the months' energy checks were a statement each, the planner settings two per
# period read, and the page read the user's scope twice. The page's 55th: the figure read's energy
# rate ranges, read before it so that its statement may run on parallel workers (billing.ledger.energy).
PORTAL_STATEMENTS = 51
PORTAL_PAGE_STATEMENTS = 55


def test_the_portal_reads_the_ledger_in_a_bounded_number_of_statements(client: Client, ledger: datetime) -> None:
    now = clock.now()
    start, end = month_bounds(now.date().replace(day=1))
    scope = get_scope(user_in(FINANCE_GROUP))
    with CaptureQueriesContext(connection) as portal:
        get_tenant_portal(scope=scope, slug="acme", start=start, end=end, now=now, workload_limit=100)
    client.force_login(user_in(tenants=("acme",)))
    with CaptureQueriesContext(connection) as page:
        assert client.get("/tenants/acme/").status_code == 200
    assert len(portal.captured_queries) <= PORTAL_STATEMENTS
    assert len(page.captured_queries) <= PORTAL_PAGE_STATEMENTS


def test_the_upcoming_invoice_of_the_month_to_date_is_the_one_read_on_its_own(ledger: datetime) -> None:
    """This ledger's usage rows have no GPU rows (the figures count them under no GPU model, the
    invoice not at all): the portal's upcoming invoice is still exactly the preview's."""
    now = clock.now()
    start, end = month_bounds(now.date().replace(day=1))
    scope = get_scope(user_in(FINANCE_GROUP))
    portal = get_tenant_portal(scope=scope, slug="acme", start=start, end=end, now=now, workload_limit=100)
    assert portal.upcoming == preview_invoice(tenant="acme", month=start.date(), now=now)
