"""The allocation API over HTTP (docs/allocation-api.md): OpenCost's response shape, 400s naming the parameter, 401,
tenant scope; totals reconciled with a real close of a hand-written month (and its late usage); and
a hypothesis property: Σ over any aggregation and any step = Σ ungrouped = the ledger's total."""

from __future__ import annotations

import gc
import json
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.db import transaction
from django.db.models import Sum
from django.test import Client
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from billing.ledger.models import GpuHour, UsageHour, WorkloadMeta
from billing.ledger.rollup import rebuild_days
from billing.models import InvoiceLine, Node, RateCard, Tenant
from billing.money import to_minor_units
from billing.queries.allocation import IDLE, UNALLOCATED, ParameterError, Window, accumulated, allocation_sets
from billing.scope import FINANCE_GROUP, Scope
from billing.services.invoicing.close import close_period
from tests.conftest import user_in

pytestmark = pytest.mark.django_db

D = Decimal
FINANCE = Scope(tenants=None, is_finance=True, is_admin=False)
FEB = date(2028, 2, 1)  # 29 days
FEB_START, MAR_START = datetime(2028, 2, 1, tzinfo=UTC), datetime(2028, 3, 1, tzinfo=UTC)
_ZEROS = {f: D(0) for f in ("mem_billed_mb_s", "sm_billed_s", "pcie_mb", "mem_granted_mb_s", "sm_granted_s",
                            "mem_used_mb_s", "sm_used_s")}


@pytest.fixture(autouse=True)
def _fixed_dates_stay_billable(settings):
    settings.VGPU_LATE_USAGE_HORIZON = timedelta(days=36500)


def card(node: Node, gpu: str, hour: datetime, *, charged: str, idle: str, idle_allocated: str = "0") -> None:
    GpuHour.objects.create(gpu_uuid=gpu, node=node, gpu_model="A100", hour=hour, metered_seconds=D(3600),
                           card_cost=D(charged) + D(idle), charged=D(charged), idle_cost=D(idle),
                           idle_allocated=D(idle_allocated), currency="USD", priced=True)


def use(node: Node, gpu: str, hour: datetime, *, tenant: str, pod: str, charge: str, idle_share: str = "0",
        tier: str = "gold", share: str = "1800") -> None:
    UsageHour.objects.create(gpu_uuid=gpu, node=node, tenant=tenant, namespace=f"{tenant}-ns", pod=pod,
                             container="main", pod_uid=f"uid-{pod}", sla_tier=tier, seconds=D(3600),
                             share_gpu_s=D(share), charge=D(charge), idle_share=D(idle_share), hour=hour, **_ZEROS)


def days(start: datetime, end: datetime) -> None:
    rebuild_days(start=start, end=end)


@pytest.fixture
def february(db):
    """Amounts with sub-cent parts, so rounding per line shows. 28 Feb and 29 Feb, two tenants."""
    RateCard.objects.create(gpu_model="A100", currency="USD", price_per_gpu_hour=D("3"),
                            effective_from=datetime(2020, 1, 1, tzinfo=UTC), source_url="https://example.org")
    for slug in ("acme", "globex"):
        Tenant.objects.create(slug=slug, name=slug)
    n1 = Node.objects.create(name="node-1", cluster="east")
    h1, h2 = datetime(2028, 2, 28, 23, tzinfo=UTC), datetime(2028, 2, 29, 23, tzinfo=UTC)
    card(n1, "GPU-a", h1, charged="1.004", idle="1.996", idle_allocated="0.333333333333")
    use(n1, "GPU-a", h1, tenant="acme", pod="bert", charge="0.669", idle_share="0.333333333333")
    use(n1, "GPU-a", h1, tenant="globex", pod="llm", charge="0.335", tier="silver")
    card(n1, "GPU-a", h2, charged="2.115", idle="0.885")
    use(n1, "GPU-a", h2, tenant="acme", pod="bert", charge="2.115", share="3000")
    # The first hour of March is not February's.
    card(n1, "GPU-a", MAR_START, charged="3", idle="0")
    use(n1, "GPU-a", MAR_START, tenant="acme", pod="bert", charge="3", share="3600")
    WorkloadMeta.objects.create(node=n1, namespace="acme-ns", pod="bert", pod_uid="uid-bert", labels={"app": "nlp"},
                                first_seen=h1, last_seen=h2)
    days(FEB_START, MAR_START + timedelta(days=1))
    return n1


def get(client: Client, path: str = "/allocation/compute", **params: str) -> tuple[int, Any]:
    resp = client.get(path, params)
    assert resp["Content-Type"].startswith("application/json")
    return resp.status_code, json.loads(resp.content)


def finance_client() -> Client:
    client = Client()
    client.force_login(User.objects.filter(username=f"u-{FINANCE_GROUP}-").first() or user_in(FINANCE_GROUP))
    return client


def test_last_month_by_namespace_reconciles_with_its_invoices_and_idle(february, time_machine) -> None:
    time_machine.move_to(datetime(2028, 3, 10, 9, 30, tzinfo=UTC), tick=False)
    close_period(month=FEB, now=datetime(2028, 3, 1, 1, tzinfo=UTC))
    code, body = get(finance_client(), window="lastmonth", aggregate="namespace", includeIdle="true",
                     accumulate="true")
    # OpenCost's envelope: code, status, data; no top-level window (each allocation states its set's).
    assert code == 200
    assert body["code"] == 200
    assert body["status"] == "success"
    assert len(body["data"]) == 1
    assert set(body) == {"code", "status", "data"}
    [allocations] = body["data"]
    assert set(allocations) == {"acme-ns", "globex-ns", IDLE}
    acme = allocations["acme-ns"]
    assert acme["name"] == "acme-ns"
    assert acme["properties"] == {"namespace": "acme-ns"}
    assert acme["window"] == {"start": "2028-02-01T00:00:00Z", "end": "2028-03-01T00:00:00Z"}
    assert acme["currency"] == "USD"
    assert (acme["start"], acme["end"], acme["minutes"]) == ("2028-02-28T23:00:00Z", "2028-03-01T00:00:00Z", 1500.0)
    assert acme["gpuHours"] == pytest.approx((1800 + 3000) / 3600)
    assert acme["totalCost"] == pytest.approx(0.669 + 0.333333333333 + 2.115)
    assert acme["gpuUsageCost"] == pytest.approx(0.669 + 2.115)
    # The exact figures: per tenant, Σ allocation = Σ of the month's invoice lines, unrounded.
    [exact] = allocation_sets(FINANCE, window=Window(FEB_START, MAR_START), aggregate=["tenant"], include_idle=True)
    for slug in ("acme", "globex"):
        lines = InvoiceLine.objects.filter(invoice__tenant__slug=slug, usage_month=FEB)
        assert exact[slug].total_cost == lines.aggregate(s=Sum("amount"))["s"]
    # acme's lines (usage 2.784, idle 0.333333333333) round to 2.78 + 0.33: 3.11, and Σ rounded to 3.12 —
    # the invoice rounds each line once; the allocation API rounds nothing.
    acme_lines = InvoiceLine.objects.filter(invoice__tenant__slug="acme", usage_month=FEB)
    assert sum(line.amount_minor for line in acme_lines) == 311
    assert to_minor_units(exact["acme"].total_cost, "USD") == 312
    # Σ every allocation + __idle__ = Σ card cost of February; and = Σ invoice lines + platform idle.
    cards = GpuHour.objects.filter(hour__gte=FEB_START, hour__lt=MAR_START).aggregate(s=Sum("card_cost"))["s"]
    invoiced = InvoiceLine.objects.filter(usage_month=FEB).aggregate(s=Sum("amount"))["s"]
    assert sum(a.total_cost for a in exact.values()) == cards == invoiced + exact[IDLE].total_cost
    assert exact[IDLE].total_cost == D("1.996") - D("0.333333333333") + D("0.885")
    assert sum(a["totalCost"] for a in allocations.values()) == pytest.approx(float(cards), abs=0.005)


def test_late_usage_reconciles_through_the_next_months_adjustment(february) -> None:
    close_period(month=FEB, now=datetime(2028, 3, 1, 1, tzinfo=UTC))
    late = datetime(2028, 2, 29, 22, tzinfo=UTC)
    card(february, "GPU-a", late, charged="0.5", idle="2.5")
    use(february, "GPU-a", late, tenant="globex", pod="llm", charge="0.5")
    days(late, MAR_START)
    close_period(month=date(2028, 3, 1), now=datetime(2028, 4, 1, 1, tzinfo=UTC))
    [exact] = allocation_sets(FINANCE, window=Window(FEB_START, MAR_START), aggregate=["tenant"])
    # February's allocation is the ledger now: February's lines plus March's adjustment for February.
    globex = InvoiceLine.objects.filter(invoice__tenant__slug="globex", usage_month=FEB)
    assert {line.kind for line in globex} == {"usage", "adjustment"}
    assert exact["globex"].total_cost == globex.aggregate(s=Sum("amount"))["s"] == D("0.835")


def test_label_aggregation_and_daily_steps(february, time_machine) -> None:
    time_machine.move_to(datetime(2028, 3, 1, 0, 30, tzinfo=UTC), tick=False)
    code, body = get(finance_client(), "/allocation", window="2028-02-28T00:00:00Z,2028-03-02T00:00:00Z",
                     aggregate="label:app,tenant", step="1d")
    assert code == 200
    assert len(body["data"]) == 3
    feb28, feb29, mar1 = body["data"]
    assert set(feb28) == {"nlp/acme", f"{UNALLOCATED}/globex"}
    assert set(feb29) == {"nlp/acme"}
    assert feb28["nlp/acme"]["properties"] == {"labels": {"app": "nlp"}, "tenant": "acme"}
    assert feb28["nlp/acme"]["window"] == {"start": "2028-02-28T00:00:00Z", "end": "2028-02-29T00:00:00Z"}
    assert mar1["nlp/acme"]["totalCost"] == 3.0
    # The same under /api/v1, and for 7d (today and the 6 days before: 24 Feb .. 1 Mar).
    code, body = get(finance_client(), "/api/v1/allocation", window="7d", aggregate="namespace")
    assert code == 200
    assert body["data"][0]["acme-ns"]["window"] == {"start": "2028-02-24T00:00:00Z", "end": "2028-03-02T00:00:00Z"}
    assert body["data"][0]["acme-ns"]["totalCost"] == pytest.approx(0.669 + 0.333333333333 + 2.115 + 3)


def test_an_answer_over_the_allocation_limit_is_a_400_that_says_how_to_ask(february, time_machine, monkeypatch) -> None:
    """february's pod-hours by pod and hour are 3 allocations (bert twice, llm once): a limit of 2
    refuses them, a limit of 3 answers; the cluster by day (2) fits under 2."""
    time_machine.move_to(datetime(2028, 3, 1, 0, 30, tzinfo=UTC), tick=False)
    params = {"window": "2028-02-28T00:00:00Z,2028-03-01T00:00:00Z", "aggregate": "pod", "step": "1h"}
    monkeypatch.setattr("billing.api.allocation.MAX_ALLOCATIONS", 2)
    code, body = get(finance_client(), **params)
    assert code == 400
    assert body["parameter"] == "aggregate"
    assert "more than 2 allocations" in body["message"]
    code, body = get(finance_client(), "/allocation/summary", **params)
    assert code == 400
    code, body = get(finance_client(), **{**params, "step": "1d", "aggregate": "cluster"})
    assert code == 200
    monkeypatch.setattr("billing.api.allocation.MAX_ALLOCATIONS", 3)
    code, body = get(finance_client(), **params)
    assert code == 200
    assert sum(len(one) for one in body["data"]) == 3


@pytest.mark.parametrize("extra", [{}, {"includeIdle": "true", "shareIdle": "true", "idleByNode": "true"},
                                   {"includeIdle": "true", "splitIdle": "true", "step": "1d"}])
def test_a_summary_allocation_is_the_allocations_own_fields(february, time_machine, extra: dict[str, str]) -> None:
    """/allocation/summary builds its fields alone (not by trimming each whole allocation): each is the
    value /allocation writes for the same allocation, idle ones included, and the summary's RAM
    averages are OpenCost's zeros."""
    time_machine.move_to(datetime(2028, 3, 1, 0, 30, tzinfo=UTC), tick=False)
    params = {"window": "2028-02-01T00:00:00Z,2028-03-01T00:00:00Z", "aggregate": "pod", **extra}
    code, full = get(finance_client(), **params)
    assert code == 200
    code, summary = get(finance_client(), "/allocation/summary", **params)
    assert code == 200
    sets = [one["allocations"] for one in summary["data"]["sets"]]
    assert [set(one) for one in sets] == [set(one) for one in full["data"]]
    # The split idle case holds idle allocations; with shareIdle the platform's idle is on the workloads.
    assert any(name.endswith("__idle__") for one in sets for name in one) == ("splitIdle" in extra)
    for one, whole in zip(sets, full["data"], strict=True):
        for name, allocation in one.items():
            shared = [key for key in allocation if key in whole[name]]
            assert {key: allocation[key] for key in shared} == {key: whole[name][key] for key in shared}
            assert set(allocation) - set(shared) == {"ramBytesRequestAverage", "ramBytesUsageAverage"}
            assert allocation["ramBytesRequestAverage"] == allocation["ramBytesUsageAverage"] == 0.0


@pytest.mark.parametrize(("path", "params", "status"), [
    ("/allocation", {"window": "2028-02-01T00:00:00Z,2028-03-01T00:00:00Z", "aggregate": "pod"}, 200),
    ("/allocation/summary", {"window": "2028-02-01T00:00:00Z,2028-03-01T00:00:00Z", "aggregate": "pod"}, 200),
    ("/allocation", {"window": "fortnight"}, 400),
    ("/allocation/summary", {"window": "7d", "step": "0m"}, 400),
])
def test_the_cycle_collector_is_back_on_after_an_answer(february, time_machine, path: str, params: dict[str, str],
                                                        status: int) -> None:
    """The views pause the collector while they build and render an answer (billing.api.allocation):
    after one, whether it answered or refused, the collector runs again, and the answer is whole JSON."""
    time_machine.move_to(datetime(2028, 3, 1, 0, 30, tzinfo=UTC), tick=False)
    assert gc.isenabled()
    code, body = get(finance_client(), path, **params)
    assert code == status
    assert gc.isenabled()
    assert body["code"] == status


def test_a_tenant_token_sees_only_its_tenant(february, time_machine) -> None:
    time_machine.move_to(datetime(2028, 3, 10, tzinfo=UTC), tick=False)
    client = Client()
    client.force_login(user_in(tenant="globex"))
    code, body = get(client, window="lastmonth", aggregate="namespace", includeIdle="true", accumulate="true",
                     shareIdle="true")
    assert code == 200
    assert set(body["data"][0]) == {"globex-ns"}
    assert body["data"][0]["globex-ns"]["totalCost"] == pytest.approx(0.335)
    code, body = get(client, window="lastmonth", aggregate="pod", filter='namespace:"acme-ns"')
    assert code == 200
    assert body["data"] == [{}]


@pytest.mark.parametrize(("params", "parameter"), [
    ({"window": "fortnight"}, "window"),
    ({}, "window"),
    ({"window": "2028-03-02T00:00:00Z,2028-03-01T00:00:00Z"}, "window"),
    ({"window": "7d", "step": "999999w"}, "step"),  # once an OverflowError (500)
    ({"window": "month", "step": "0m"}, "step"),
    ({"window": "7d offset 999999w"}, "window"),
    ({"window": "999999w"}, "window"),
    ({"window": "7d", "accumulate": "fortnight"}, "accumulate"),
    ({"window": "7d", "filter": 'namespace:"a"+('}, "filter"),
    ({"window": "7d", "filter": 'namespace~"a"'}, "filter"),
    ({"window": "7d", "filter": "(" * 40 + 'pod:"a"' + ")" * 40}, "filter"),
    ({"window": "lastmonth", "step": "1h"}, "step"),  # 696 sets is fine...
    ({"window": "2026-01-01T00:00:00Z,2028-01-01T00:00:00Z", "step": "1h"}, "step"),  # ...17,520 is not
    ({"window": "7d", "accumulate": "yes"}, "accumulate"),
    ({"window": "7d", "splitIdle": "yes"}, "splitIdle"),
    ({"window": "7d", "includeIdle": "2"}, "includeIdle"),
    ({"window": "7d", "shareIdle": "maybe"}, "shareIdle"),
    ({"window": "7d", "idleByNode": "on"}, "idleByNode"),
    ({"window": "7d", "filter": "namespace=acme"}, "filter"),
    ({"window": "7d", "filter": "namespaces:\"a\""}, "filter"),
    ({"window": "7d", "filter": "namespace:acme"}, "filter"),
    ({"window": "2026-01-01T00:00:00Z,9999-12-31T23:30:00Z"}, "window"),
    ({"window": "1,999999999999"}, "window"),
    ({"window": "0001-01-01T00:00:00+14:00,2026-01-01T00:00:00Z"}, "window"),
    ({"window": "2026-01-01T00:00:00Z,9999-12-31T23:59:59-14:00"}, "window"),
])
def test_bad_parameters_answer_400_naming_the_parameter(db, params: dict[str, str], parameter: str) -> None:
    code, body = get(finance_client(), **params)
    if params.get("step") == "1h" and params["window"] == "lastmonth":
        assert code == 200
        return
    assert code == 400
    assert body["code"] == 400
    assert body["parameter"] == parameter
    assert body["status"] == "error"
    assert body["message"].startswith(f"{parameter}: ")


def test_unauthenticated_is_401_json(db) -> None:
    code, body = get(Client(), window="7d")
    assert code == 401
    assert body["code"] == 401
    assert body["message"]


def test_filters_in_opencost_syntax(february, time_machine) -> None:
    time_machine.move_to(datetime(2028, 3, 10, tzinfo=UTC), tick=False)
    code, body = get(finance_client(), window="lastmonth", aggregate="pod",
                     filter='label[app]:"nlp","web"+tenant:"acme"')
    assert code == 200
    assert set(body["data"][0]) == {"bert"}
    code, body = get(finance_client(), window="lastmonth", aggregate="pod", filter='pod:"llm" + pod:"bert","llm"')
    assert set(body["data"][0]) == {"llm"}


def test_the_openapi_schema_documents_the_allocation_api(db) -> None:
    resp = Client().get("/api/v1/schema", HTTP_ACCEPT="application/vnd.oai.openapi+json")
    paths = json.loads(resp.content)["paths"]
    operation = paths["/allocation/compute"]["get"]
    assert {"200", "400", "401"} <= set(operation["responses"])
    assert {p["name"] for p in operation["parameters"]} >= {"window", "aggregate", "step", "accumulate",
                                                             "includeIdle", "shareIdle", "idleByNode", "filter"}
    assert "/allocation" in paths
    assert "/api/v1/allocation" in paths


# --- Σ over any aggregation and step = the ledger's total -------------------------------------------

_KEYS = ["cluster", "node", "namespace", "controllerKind", "controller", "pod", "container", "tenant", "gpu_model",
         "sla_tier", "gpu", "label:app"]
_START = datetime(2026, 3, 1, tzinfo=UTC)
_amount = st.decimals(min_value=0, max_value=100, places=6, allow_nan=False, allow_infinity=False)
_usage = st.tuples(st.integers(0, 2), st.integers(0, 47), st.sampled_from(["acme", "globex"]),
                   st.sampled_from(["p1", "p2", "p3"]), st.sampled_from(["gold", "silver"]), _amount, _amount)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(usages=st.lists(_usage, max_size=12), idles=st.lists(_amount, min_size=3, max_size=3),
       keys=st.lists(st.sampled_from(_KEYS), min_size=1, max_size=3, unique=True),
       step_h=st.sampled_from([None, 1, 5, 24, 48]), share=st.booleans(), by_node=st.booleans(),
       offset_h=st.integers(0, 3))
def test_sums_do_not_depend_on_aggregation_or_step(db, usages, idles, keys, step_h, share, by_node, offset_h) -> None:
    with transaction.atomic():
        nodes = [Node.objects.create(name="n-east", cluster="east"), Node.objects.create(name="n-none")]
        gpus = [(nodes[0], "GPU-0"), (nodes[0], "GPU-1"), (nodes[1], "GPU-2")]
        for node in nodes:  # p1 may run on either node: each describes its own
            WorkloadMeta.objects.create(node=node, namespace="acme-ns", pod="p1", pod_uid="uid-p1", controller_kind="job",
                                        controller_name="j", labels={"app": "a"}, first_seen=_START, last_seen=_START)
        # A card's charged part is its workloads' charge; its idle what nobody used, part of it (their idle
        # share) invoiced to them.
        per_card: dict[tuple[int, int], tuple[Decimal, Decimal]] = {}
        for gpu, hour, tenant, pod, tier, charge, idle_share in usages:
            node, uuid = gpus[gpu]
            use(node, uuid, _START + timedelta(hours=hour), tenant=tenant, pod=pod, tier=tier, charge=str(charge),
                idle_share=str(idle_share))
            charged, shared = per_card.get((gpu, hour), (D(0), D(0)))
            per_card[(gpu, hour)] = (charged + charge, shared + idle_share)
        for (gpu, hour), (charged, shared) in per_card.items():
            node, uuid = gpus[gpu]
            card(node, uuid, _START + timedelta(hours=hour), charged=str(charged), idle=str(idles[gpu] + shared),
                 idle_allocated=str(shared))
        days(_START, _START + timedelta(days=2))

        window = Window(_START + timedelta(hours=offset_h), _START + timedelta(hours=48))
        step = None if step_h is None else timedelta(hours=step_h)
        common = {"window": window, "include_idle": True, "share_idle": share, "idle_by_node": by_node}
        grouped = allocation_sets(FINANCE, aggregate=keys, step=step, **common)
        ungrouped = allocation_sets(FINANCE, aggregate=[], step=step, **common)
        [whole] = allocation_sets(FINANCE, aggregate=keys, accumulate=True, **common)

        def total(sets: list[dict]) -> Decimal:
            return sum((a.total_cost for s in sets for a in s.values()), D(0))

        in_window = {"hour__gte": window.start, "hour__lt": window.end}
        ledger = GpuHour.objects.filter(**in_window).aggregate(s=Sum("card_cost"))["s"] or D(0)
        assert total(grouped) == total(ungrouped) == total([whole]) == ledger
        usage = UsageHour.objects.filter(**in_window).aggregate(c=Sum("charge"), i=Sum("idle_share"))
        tenants = sum((a.total_cost for s in grouped for a in s.values() if not a.is_idle), D(0))
        if not share:
            assert tenants == (usage["c"] or 0) + (usage["i"] or 0)
        else:
            assert tenants <= ledger
        if share:
            # Idle is shared within each set (OpenCost): the total is the same, its spread differs by step.
            transaction.set_rollback(True)
            return
        # The steps summed are the one accumulated set, figure by figure.
        summed = accumulated(grouped)
        assert set(summed) == set(whole)
        for name, a in whole.items():
            b = summed[name]
            assert (a.total_cost, a.gpu_cost, a.shared_idle_cost, a.gpu_hours, a.seconds, a.mem_requested_mb_s) == \
                (b.total_cost, b.gpu_cost, b.shared_idle_cost, b.gpu_hours, b.seconds, b.mem_requested_mb_s)
        transaction.set_rollback(True)


_text = st.text(alphabet=st.characters(codec="utf-8", exclude_categories=["Cs"]), max_size=40)
_part = st.one_of(_text, st.sampled_from(["7d", "30m", "lastmonth", "week", "1d", "0h", "99999w", "namespace",
                                         "label:app", 'pod:"a"+label[x]:"b"', 'pod:"a\x00"', "label:a\x00", "true", "1772323200,1", "a,b",
                                         "2026-03-01T00:00:00Z,2026-03-02T00:00:00+14:00"]),
                  # RFC 3339 pairs anywhere in datetime's range, with any offset.
                  st.tuples(st.datetimes(timezones=st.timezones()), st.datetimes(timezones=st.timezones())).map(
                      lambda pair: f"{pair[0].isoformat()},{pair[1].isoformat()}"))


# Generation's speed is not what this asserts: the first draw builds the UTF-8 alphabet and reads every
# time zone, and on a loaded machine (a worker of the suite, niced) hypothesis once gave up after 34 s.
@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(params=st.dictionaries(st.sampled_from(["window", "aggregate", "step", "accumulate", "includeIdle",
                                               "shareIdle", "idleByNode", "filter"]), _part))
def test_any_parameters_answer_200_or_a_400_naming_one(db, params: dict[str, str]) -> None:
    params.setdefault("window", "2026-03-01T00:00:00Z,2026-03-02T00:00:00Z")
    code, body = get(finance_client(), **params)
    assert code in (200, 400), body
    if code == 400:
        assert body["parameter"] in params or body["parameter"] == "window"


@pytest.mark.parametrize(("params", "parameter"), [
    ({"window": "7d", "filter": 'pod:"a\x00"'}, "filter"), ({"window": "7d", "aggregate": "label:a\x00"}, "aggregate"),
    ({"window": "7d", "filter": 'label[a\x00]:"b"'}, "filter"),
])
def test_nul_characters_are_a_400(db, params: dict[str, str], parameter: str) -> None:
    code, body = get(finance_client(), **params)
    assert code == 400
    assert body["parameter"] == parameter
    with pytest.raises(ParameterError):
        allocation_sets(FINANCE, window=Window(FEB_START, MAR_START), aggregate=["pod"], filters={"pod": ["a\x00"]})
