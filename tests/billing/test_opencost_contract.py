"""OpenCost's allocation contract from its clients' side (docs/allocation-api.md): the requests
OpenCost's own clients send, over real HTTP to a live server with an API token, each answered 200
with OpenCost's envelope and an Allocation whose every field has the JSON type OpenCost's
AllocationJSON (core/pkg/opencost/allocation_json.go) gives it; totals reconcile with the ledger.

No OpenCost API client is published on PyPI (`pip index versions opencost` finds none), so the
clients' requests are written out here, each naming the client that sends it."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

import pytest
import requests
from django.db.models import Sum

from billing.ledger.models import GpuHour, UsageHour
from billing.models import Node
from billing.scope import FINANCE_GROUP
from billing.services.identity.api_tokens import issue_api_token
from tests.billing.test_allocation import gpu_hour, meta, usage_hour
from tests.conftest import user_in

pytestmark = pytest.mark.django_db(transaction=True)

D = Decimal
# A fixed day; the clock is moved three days on, so `7d` and `5d` windows hold it.
DAY0 = datetime(2026, 3, 2, tzinfo=UTC)
NOW = DAY0 + timedelta(days=3, hours=12)
H = DAY0 + timedelta(hours=10)
WINDOW = f"{DAY0:%Y-%m-%dT%H:%M:%SZ},{DAY0 + timedelta(days=1):%Y-%m-%dT%H:%M:%SZ}"

# OpenCost's AllocationJSON, field -> JSON type (Python's decoding of it). `float` fields are
# *float64 (a number, or null for NaN); OpenCost's clients add them up, so they must be numbers.
NUMBER = (int, float)
ALLOCATION_SCHEMA: dict[str, tuple[type, ...]] = {
    "name": (str,), "properties": (dict,), "window": (dict,), "start": (str,), "end": (str,),
    **dict.fromkeys((
        "minutes", "cpuCores", "cpuCoreRequestAverage", "cpuCoreLimitAverage", "cpuCoreUsageAverage", "cpuCoreHours",
        "cpuCost", "cpuCostAdjustment", "cpuCostIdle", "cpuEfficiency", "gpuCount", "gpuHours", "gpuCost",
        "gpuCostAdjustment", "gpuCostIdle", "gpuEfficiency", "networkTransferBytes", "networkReceiveBytes",
        "networkCost", "networkCrossZoneCost", "networkCrossRegionCost", "networkInternetCost",
        "networkCostAdjustment", "loadBalancerCost", "loadBalancerCostAdjustment", "pvBytes", "pvByteHours", "pvCost",
        "pvCostAdjustment", "ramBytes", "ramByteRequestAverage", "ramByteLimitAverage", "ramByteUsageAverage",
        "ramByteHours", "ramCost", "ramCostAdjustment", "ramCostIdle", "ramEfficiency", "externalCost", "sharedCost",
        "totalCost", "totalEfficiency"), NUMBER),
    "pvs": (dict, type(None)), "lbAllocations": (dict, type(None)),
    "proportionalAssetResourceCosts": (dict, type(None)), "sharedCostBreakdown": (dict, type(None)),
    "gpuAllocation": (dict, type(None)),
    # OpenCost writes these inside gpuAllocation only; clients look for them at the top as well.
    "gpuRequestAverage": NUMBER, "gpuUsageAverage": NUMBER,
}
GPU_ALLOCATION_SCHEMA: dict[str, tuple[type, ...]] = {
    "gpuDevice": (str,), "gpuModel": (str,), "gpuUUID": (str,), "isGPUShared": (bool, type(None)),
    "gpuUsageAverage": NUMBER, "gpuRequestAverage": NUMBER,
}
SUMMARY_SCHEMA: dict[str, tuple[type, ...]] = {
    "name": (str,), "properties": (dict,), "window": (dict,), "start": (str,), "end": (str,),
    **dict.fromkeys(("cpuCoreRequestAverage", "cpuCoreUsageAverage", "cpuCost", "cpuCostIdle",
                     "gpuRequestAverage", "gpuUsageAverage", "gpuCost", "gpuCostIdle", "networkCost",
                     "loadBalancerCost", "pvCost", "ramBytesRequestAverage", "ramBytesUsageAverage",
                     "ramCost", "ramCostIdle", "sharedCost", "externalCost", "totalEfficiency", "totalCost"), NUMBER),
}


def conforms(value: dict[str, Any], schema: dict[str, tuple[type, ...]]) -> list[str]:
    """The schema's fields `value` lacks or has with another JSON type (bool is not a number)."""
    return [f for f, types in schema.items()
            if f not in value or not isinstance(value[f], types) or (isinstance(value[f], bool) and bool not in types)]


@pytest.fixture
def server(live_server, time_machine):
    """The hand-written fleet of tests/billing/test_allocation.py, three days ago, and a finance token."""
    time_machine.move_to(NOW, tick=False)
    n1 = Node.objects.create(name="node-1", cluster="east")
    n2 = Node.objects.create(name="node-2", cluster="")
    gpu_hour(n1, "GPU-a", H, card="10", idle="4", idle_allocated="1")
    usage_hour(n1, "GPU-a", H, tenant="acme", pod="bert", charge="4", idle_share="1", share="1440", mem="100", sm="10")
    usage_hour(n1, "GPU-a", H, tenant="globex", pod="llm", charge="2", share="720", tier="silver", mem="50", sm="5")
    gpu_hour(n2, "GPU-b", H, card="6", idle="3", model="H100")
    usage_hour(n2, "GPU-b", H, tenant="acme", pod="vit", charge="3", share="1800", container="train", mem="10", sm="4")
    meta(n1, "acme-ns", "bert", kind="Deployment", controller="bert", labels={"app": "nlp", "team": "a"},
         requests={"main": {"mem_mb": 2, "sm": 0.5}})
    meta(n1, "globex-ns", "llm", kind="StatefulSet", controller="llm", labels={"app": "nlp"})
    username = user_in(FINANCE_GROUP).username
    token = issue_api_token(username=username, name="opencost contract", expires_at=None,
                            now=NOW, actor_label="test").token
    return live_server.url, token


def call(server: tuple[str, str], path: str, **params: str) -> tuple[int, Any]:
    base, token = server
    resp = requests.get(f"{base}{path}", params=params, headers={"Authorization": f"Bearer {token}"}, timeout=60)
    assert resp.headers["Content-Type"].startswith("application/json"), (path, resp.status_code, resp.text[:200])
    return resp.status_code, resp.json()


def ledger_total() -> Decimal:
    """Σ usage charge + idle share of the day (what every allocation's totalCost adds up to)."""
    rows = UsageHour.objects.filter(hour__gte=DAY0, hour__lt=DAY0 + timedelta(days=1))
    sums = rows.aggregate(c=Sum("charge"), i=Sum("idle_share"))
    return D(sums["c"]) + D(sums["i"])


def card_total() -> Decimal:
    return D(GpuHour.objects.filter(hour__gte=DAY0, hour__lt=DAY0 + timedelta(days=1))
             .aggregate(c=Sum("card_cost"))["c"])


# (who sends it, path, parameters). Read from each client's request builder.
CLIENT_REQUESTS: list[tuple[str, str, dict[str, str]]] = [
    # OpenCost UI, AllocationService.fetchAllocation: window, aggregate, includeIdle, step=1d, accumulate bool.
    ("opencost-ui fetchAllocation", "/allocation/compute",
     {"window": "7d", "aggregate": "namespace", "includeIdle": "true", "step": "1d", "accumulate": "true"}),
    ("opencost-ui fetchAllocation (Kubecost base /model)", "/model/allocation/compute",
     {"window": "7d", "aggregate": "cluster", "includeIdle": "true", "step": "1d", "accumulate": "false"}),
    # OpenCost UI, newer: accumulate by calendar unit (OpenCost's AccumulateOption words).
    ("opencost-ui fetchAllocation, accumulate by day", "/allocation/compute",
     {"window": "7d", "aggregate": "namespace", "includeIdle": "true", "accumulate": "day"}),
    # OpenCost UI, current (app/services/allocation.ts _doFetch, app/types/report.ts): a report's
    # accumulate option, the cost fields it charts as `metrics`, and its rules joined by
    # app/lib/legacy-util.ts parseFilters (`prop:"value"` joined by `+`).
    *[("opencost-ui report, accumulate " + option, "/allocation/compute",
       {"window": "7d", "aggregate": "namespace", "includeIdle": "true", "accumulate": option,
        "metrics": "totalCost,gpuCost", "filter": 'cluster:"east"+namespace:"acme-ns"'})
      for option in ("day", "hour", "week", "weeknow", "month", "quarter", "all")],
    # OpenCost UI drill-down from a controller to its pods: the filter of the row clicked.
    ("opencost-ui drill-down to pods", "/allocation/compute",
     {"window": "7d", "aggregate": "pod", "accumulate": "true",
      "filter": 'namespace:"acme-ns"+controllerKind:"deployment"+controllerName:"bert"'}),
    # kubectl-cost, exactly as its commands build them (pkg/cmd/aggregatedcommandbuilder.go
    # runAggregatedAllocationCommand, pkg/cmd/cost.go, pkg/cmd/label.go): the aggregation always
    # starts with cluster, accumulate=true, includeIdle and idle both from --include-idle, and
    # filterNamespaces from --namespace, sent even when empty; the path is /allocation/compute
    # with --opencost, else /model/allocation (pkg/query/options.go).
    *[(f"kubectl-cost {command}{' --include-idle' if idle == 'true' else ''}{' -n acme-ns' if ns else ''}", path,
       {"window": window, "aggregate": aggregate, "accumulate": "true", "includeIdle": idle, "idle": idle,
        "filterNamespaces": ns})
      for command, aggregate in (("namespace", "cluster,namespace"), ("deployment", "cluster,namespace,deployment"),
                                 ("controller", "cluster,namespace,controller"), ("pod", "cluster,namespace,pod"))
      for path, window, idle, ns in (("/allocation/compute", "7d", "false", ""), ("/model/allocation", "5d", "true", ""),
                                     ("/allocation/compute", "7d", "false", "acme-ns"))],
    ("kubectl-cost label -l app", "/allocation/compute",
     {"window": "7d", "aggregate": "cluster,label:app", "accumulate": "true", "includeIdle": "false", "idle": "false"}),
    # OpenCost docs/swagger.json examples of /allocation/compute.
    ("swagger: idle per node, split", "/allocation/compute",
     {"window": "7d", "aggregate": "namespace", "includeIdle": "true", "idleByNode": "true", "splitIdle": "true",
      "accumulate": "true"}),
    ("swagger: aggregate all", "/allocation", {"window": "7d", "aggregate": "all", "accumulate": "true", "idle": "true"}),
    ("swagger: a Unix pair with a dash and an offset", "/allocation/compute",
     {"window": f"{int(DAY0.timestamp())}-{int((DAY0 + timedelta(days=1)).timestamp())}", "aggregate": "namespace"}),
    ("swagger: step 30m", "/allocation/compute", {"window": WINDOW, "aggregate": "namespace", "step": "30m"}),
    ("swagger: v2 filter", "/allocation/compute",
     {"window": "7d", "aggregate": "namespace", "accumulate": "true",
      "filter": '(namespace!:"kube-system" | cluster<~:"ea") + node~>:"-1","-2"'}),
    ("swagger: unknown aggregate key dropped", "/allocation/compute",
     {"window": "7d", "aggregate": "namespace,nonsense", "accumulate": "true"}),
]


@pytest.mark.parametrize(("client", "path", "params"), CLIENT_REQUESTS, ids=[c for c, _, _ in CLIENT_REQUESTS])
def test_each_client_request_decodes_into_opencost_allocations(server, client: str, path: str,
                                                               params: dict[str, str]) -> None:
    code, body = call(server, path, **params)
    assert code == 200, (client, body)
    assert set(body) == {"code", "status", "data"}
    assert body["code"] == 200
    assert body["status"] == "success"
    assert isinstance(body["data"], list)
    assert body["data"]
    seen = 0
    for one in body["data"]:
        assert isinstance(one, dict)
        for name, allocation in one.items():
            seen += 1
            assert allocation["name"] == name
            assert conforms(allocation, ALLOCATION_SCHEMA) == [], (client, name)
            if allocation["gpuAllocation"] is not None:
                assert conforms(allocation["gpuAllocation"], GPU_ALLOCATION_SCHEMA) == []
            for field in ("cpuCost", "ramCost", "pvCost", "networkCost", "loadBalancerCost", "sharedCost"):
                assert allocation[field] == 0
    assert seen, client


def test_totals_reconcile_with_the_ledger(server) -> None:
    code, body = call(server, "/allocation/compute", window=WINDOW, aggregate="namespace", accumulate="true")
    assert code == 200
    assert D(str(sum(a["totalCost"] for a in body["data"][0].values()))).quantize(D("1e-9")) == ledger_total()
    # With idle: Σ = the cards' cost, whether idle is one __idle__ or split per node.
    for extra in ({}, {"idleByNode": "true", "splitIdle": "true"}):
        code, body = call(server, "/allocation/compute", window=WINDOW, aggregate="namespace", accumulate="true",
                          includeIdle="true", **extra)
        assert D(str(sum(a["totalCost"] for a in body["data"][0].values()))).quantize(D("1e-9")) == card_total()
    # By day across the week: the same sum.
    code, body = call(server, "/allocation/compute", window="7d", aggregate="namespace", accumulate="day")
    assert len(body["data"]) == 7
    total = sum(a["totalCost"] for one in body["data"] for a in one.values())
    assert D(str(total)).quantize(D("1e-9")) == ledger_total()


def test_gpu_only_allocations_report_gpu_efficiency_not_waste(server) -> None:
    """An OpenCost-style efficiency client reads totalEfficiency (or cpu and ram): here GPUs are
    the only resource, so totalEfficiency is the GPU's, and > 0 for a workload that used its SMs."""
    _code, body = call(server, "/allocation/compute", window=WINDOW, aggregate="pod", accumulate="true")
    bert = body["data"][0]["bert"]
    assert bert["totalEfficiency"] == bert["gpuEfficiency"] > 0
    assert bert["gpuEfficiency"] == pytest.approx(0.5)  # 10 SM·s used of 20 granted
    # 1440 GPU-seconds of share over its one hour: 0.4 GPUs on average, 0.2 of them kept busy.
    assert bert["gpuCount"] == pytest.approx(0.4)
    assert bert["gpuRequestAverage"] == pytest.approx(0.4)
    assert bert["gpuUsageAverage"] == pytest.approx(0.2)
    assert bert["gpuAllocation"]["gpuUsageAverage"] == pytest.approx(0.2)
    assert bert["cpuEfficiency"] == 0
    assert bert["ramEfficiency"] == 0


def test_names_and_kinds_as_opencost_writes_them(server) -> None:
    _code, body = call(server, "/allocation/compute", window=WINDOW, aggregate="controller", accumulate="true")
    bert = body["data"][0]["deployment:bert"]
    assert bert["properties"] == {"controller": "bert", "controllerKind": "deployment"}
    _code, body = call(server, "/allocation/compute", window=WINDOW, aggregate="controllerKind", accumulate="true")
    assert set(body["data"][0]) == {"deployment", "statefulset", "__unallocated__"}
    _code, body = call(server, "/allocation/compute", window=WINDOW, aggregate="deployment", accumulate="true")
    assert set(body["data"][0]) == {"bert", "__unallocated__"}
    _code, body = call(server, "/allocation/compute", window=WINDOW, aggregate="namespace", accumulate="true",
                      includeIdle="true", idleByNode="true")
    assert "__idle__" in body["data"][0]
    assert not any("/__idle__" in n for n in body["data"][0])


def test_filter_language(server) -> None:
    def pods(filter_text: str) -> set[str]:
        code, body = call(server, "/allocation/compute", window=WINDOW, aggregate="pod", accumulate="true",
                          filter=filter_text)
        assert code == 200, body
        return set(body["data"][0])

    assert pods('namespace:"acme-ns"') == {"bert", "vit"}
    assert pods('namespace!:"acme-ns"') == {"llm"}
    assert pods('pod~:"er"') == {"bert"}
    assert pods('pod<~:"v"') == {"vit"}
    assert pods('pod~>:"lm"') == {"llm"}
    assert pods('pod!~>:"lm"') == {"bert", "vit"}
    assert pods('namespace:"globex-ns" | label[team]:"a"') == {"llm", "bert"}
    assert pods('(namespace:"globex-ns" or pod:"vit") and node:"node-2"') == {"vit"}
    assert pods('controllerName:"bert",  "llm"') == {"bert", "llm"}
    assert pods('cluster:"east"+container:"main"') == {"bert", "llm"}
    assert pods('services~:"web"') == set()


def test_summary_autocomplete_and_assets(server) -> None:
    for path in ("/allocation/summary", "/allocation/compute/summary", "/model/allocation/summary"):
        code, body = call(server, path, window=WINDOW, aggregate="namespace", accumulate="true", includeIdle="true")
        assert code == 200
        assert body["status"] == "success"
        data = body["data"]
        assert set(data) == {"step", "sets", "window"}
        assert isinstance(data["step"], int)
        [one] = data["sets"]
        assert set(one) == {"allocations", "window"}
        for allocation in one["allocations"].values():
            assert conforms(allocation, SUMMARY_SCHEMA) == []
        assert D(str(sum(a["totalCost"] for a in one["allocations"].values()))).quantize(D("1e-9")) == card_total()
    code, body = call(server, "/allocation/autocomplete", window="7d", field="namespace", search="acme")
    assert code == 200
    assert body["data"] == ["acme-ns"]
    # The OpenCost UI's report filter (app/services/report-filter-autocomplete.ts): window, field,
    # limit=25, search, and the other rules as a filter; each field it may send, answered with a
    # list of strings (its parseSuggestionList keeps only strings).
    for field in ("cluster", "namespace", "node", "controllerKind", "controllerName", "pod", "container", "label:app"):
        code, body = call(server, "/allocation/autocomplete", window="7d", field=field, limit="25",
                          filter='cluster:"east"')
        assert code == 200, (field, body)
        assert isinstance(body["data"], list), (field, body)
        assert all(isinstance(value, str) for value in body["data"]), field
    for path in ("/assets", "/model/assets"):
        code, body = call(server, path, window=WINDOW)
        assert code == 200
        assert body["status"] == "success"
        [assets] = body["data"]
        assert set(assets) == {"east/node-1", "__unallocated__/node-2"}
        node = assets["east/node-1"]
        assert node["type"] == "Node"
        assert node["gpuCount"] == 1.0
        assert node["gpuCost"] == 10.0
        assert sum(a["totalCost"] for a in assets.values()) == float(card_total())


BAD: list[dict[str, str]] = [
    {"window": "month", "step": "999999w"},  # once an OverflowError: a 500
    {"window": "999999w"}, {"window": "7d offset 999999w"}, {"window": "1-999999999999"},
    {"window": "7d", "accumulate": "fortnight"}, {"window": "7d", "filter": "namespace:"},
    {"window": "7d", "filter": "(" * 100 + 'pod:"a"' + ")" * 100}, {"window": "7d", "filter": 'bogus:"a"'},
]


@pytest.mark.parametrize("params", BAD)
@pytest.mark.parametrize("path", ["/allocation/compute", "/allocation/summary", "/assets"])
def test_bad_parameters_are_opencost_400s_never_5xx(server, path: str, params: dict[str, str]) -> None:
    if path == "/assets" and "filter" in params:
        pytest.skip("/assets takes no filter")
    code, body = call(server, path, **params)
    assert code == 400, (path, params, body)
    assert body["code"] == 400
    assert body["status"] == "error"
    assert isinstance(body["message"], str)

