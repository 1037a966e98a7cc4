"""The drill-down, /explore/ (docs/drilldown.md): each level over a hand-written ledger, walked by its own
links from the tenants down to a pod's GPUs; filters narrow; a tenant member never sees another
tenant, however the query string is crafted; every CSV has the page's numbers; the right-sizing
suggestion on a workload; every table adds up (tests/test_page_sums.py's checker)."""

from __future__ import annotations

import csv
import io
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from html.parser import HTMLParser
from typing import Any
from urllib.parse import parse_qs

import pytest
from django.db import transaction
from django.test import Client
from hypothesis import HealthCheck, given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st

from billing.ledger.models import GpuHour, UsageHour, WorkloadMeta
from billing.models import Node, Tenant
from billing.scope import FINANCE_GROUP
from tests.conftest import user_in, with_day
from tests.test_page_sums import Walk, _check_csv, _check_page, _marks

pytestmark = pytest.mark.django_db

D = Decimal
H = datetime(2026, 3, 2, 10, tzinfo=UTC)  # explicit dates: the page takes the period it is given
PERIOD = {"start": "2026-03-02", "end": "2026-03-02"}
GIB_H = 1024 * 3600  # MB·s in a GB·h


def gpu_hour(node: Node, gpu: str, hour: datetime, *, model: str = "A100", card: str = "10") -> None:
    with_day(GpuHour.objects.create(gpu_uuid=gpu, node=node, gpu_model=model, hour=hour, metered_seconds=D(3600),
                                    card_cost=D(card), charged=D(0), idle_cost=D(card), idle_allocated=D(0),
                                    currency="USD", priced=True))


def usage(node: Node, gpu: str, hour: datetime, *, tenant: str, namespace: str, pod: str, container: str, charge: str,
          tier: str = "gold", mem_used_gb: str = "0", mem_granted_gb: str = "0", sm_used: str = "0",
          sm_granted: str = "0") -> None:
    """One hour on one GPU: memory as mean GiB over the hour, SMs as mean SMs."""
    with_day(UsageHour.objects.create(
        gpu_uuid=gpu, node=node, tenant=tenant, namespace=namespace, pod=pod, container=container,
        pod_uid=f"uid-{pod}", sla_tier=tier, seconds=D(3600), hour=hour,
        mem_used_mb_s=D(mem_used_gb) * GIB_H, mem_granted_mb_s=D(mem_granted_gb) * GIB_H,
        mem_billed_mb_s=D(mem_granted_gb) * GIB_H, sm_used_s=D(sm_used) * 3600, sm_granted_s=D(sm_granted) * 3600,
        sm_billed_s=D(sm_granted) * 3600, pcie_mb=D(0), share_gpu_s=D(charge) * 360, charge=D(charge),
        idle_share=D(0)))


@pytest.fixture
def fleet(db: Any) -> None:
    """acme/acme-prod: bert-1 (deployment bert, app=bert) — container server on GPU-0, 8 then 12 GiB
    used of 40 requested and granted, 1.00 + 2.00; container sidecar on GPU-1 (no request known),
    0.50; train-7 (no metadata, bronze) on GPU-0, 0.25. globex/globex-prod: llm-1 (statefulset llm,
    app=llm, silver) on node-2's H100 GPU-2, 4.00."""
    Tenant.objects.create(slug="acme", name="Acme Robotics")
    n1 = Node.objects.create(name="node-1", cluster="east")
    n2 = Node.objects.create(name="node-2", cluster="west")
    for hour in (H, H + timedelta(hours=1)):
        gpu_hour(n1, "GPU-0", hour)
        gpu_hour(n1, "GPU-1", hour)
        gpu_hour(n2, "GPU-2", hour, model="H100")
    bert = {"tenant": "acme", "namespace": "acme-prod", "pod": "bert-1"}
    usage(n1, "GPU-0", H, **bert, container="server", charge="1.00", mem_used_gb="8", mem_granted_gb="40",
          sm_used="10", sm_granted="50")
    usage(n1, "GPU-0", H + timedelta(hours=1), **bert, container="server", charge="2.00", mem_used_gb="12",
          mem_granted_gb="40", sm_used="20", sm_granted="50")
    usage(n1, "GPU-1", H, **bert, container="sidecar", charge="0.50", mem_used_gb="1", mem_granted_gb="2")
    usage(n1, "GPU-0", H, tenant="acme", namespace="acme-prod", pod="train-7", container="main", charge="0.25",
          tier="bronze", mem_used_gb="1", mem_granted_gb="1")
    usage(n2, "GPU-2", H, tenant="globex", namespace="globex-prod", pod="llm-1", container="main", charge="4.00",
          tier="silver", mem_used_gb="30", mem_granted_gb="40")
    for node, namespace, pod, kind, name, labels, requests in (  # each pod described by the node it runs on
        (n1, "acme-prod", "bert-1", "deployment", "bert", {"app": "bert"}, {"server": {"mem_mb": 40960, "sm": 50}}),
        (n2, "globex-prod", "llm-1", "statefulset", "llm", {"app": "llm"}, {"main": {"mem_mb": 40960, "sm": 108}}),
    ):
        WorkloadMeta.objects.create(node=node, namespace=namespace, pod=pod, pod_uid=f"uid-{pod}", controller_kind=kind,
                                    controller_name=name, labels=labels, requests=requests, first_seen=H,
                                    last_seen=H)


class _Links(HTMLParser):
    """Hrefs of the rows' links down, and each row's name and shown cost."""

    def __init__(self) -> None:
        super().__init__()
        self.down: list[str] = []
        self.rows: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        if tag == "a" and a.get("data-testid") == "explore-down":
            self.down.append(a["href"] or "")
        if tag == "tr" and a.get("data-testid") == "explore-row":
            self.rows.append(a["data-name"] or "")


def page(client: Client, **params: str) -> tuple[Any, str, _Links]:
    resp = client.get("/explore/", {**PERIOD, **params})
    html = resp.content.decode()
    links = _Links()
    links.feed(html)
    return resp, html, links


def costs(resp: Any) -> dict[str, Decimal]:
    return {r.name: r.cost for r in resp.context["explore"].rows}


def csv_records(client: Client, **params: str) -> tuple[str, list[dict[str, str]]]:
    resp = client.get("/explore/", {**PERIOD, **params, "format": "csv"})
    assert resp.status_code == 200
    assert resp["Content-Type"].startswith("text/csv")
    header, *rows = list(csv.reader(io.StringIO(resp.content.decode("utf-8-sig"))))
    return resp["Content-Disposition"], [dict(zip(header, r, strict=True)) for r in rows]


def test_finance_walks_its_links_from_the_tenants_down_to_a_pods_gpus(client: Client, fleet: None) -> None:
    client.force_login(user_in(FINANCE_GROUP))
    walk = Walk()
    resp, html, links = page(client)
    assert resp.status_code == 200
    assert resp.context["level"] == "tenant"
    assert costs(resp) == {"globex": D("4.00"), "acme": D("3.75")}
    assert links.rows == ["globex", "acme"]  # costliest first
    assert 'data-testid="nav-explore"' in html
    assert '<span title="acme">Acme Robotics</span>' in html
    assert '<span title="globex">globex</span>' in html
    _check_page("/explore/", _marks(html), walk)
    expected = [
        ("namespace", {"acme-prod": D("3.75")}),
        ("controller", {"deployment:bert": D("3.50"), "__unallocated__": D("0.25")}),
        ("pod", {"bert-1/server": D("3.00"), "bert-1/sidecar": D("0.50")}),
        ("gpu", {"server/node-1/GPU-0": D("3.00")}),  # the server container's GPUs
    ]
    href = links.down[1]  # acme
    parent = D("3.75")
    for level, want in expected:
        query = {k: v[0] for k, v in parse_qs(href.lstrip("?")).items()}
        assert query["start"] == PERIOD["start"]  # the period travels with every link
        resp, html, links = page(client, **query)
        assert resp.status_code == 200, (level, href)
        assert resp.context["level"] == level, (level, href)
        assert costs(resp) == want
        assert resp.context["cost_total"] == parent  # a level adds up to the row it opened
        parent = next(iter(want.values()))
        _check_page(href, _marks(html), walk)
        assert 'data-testid="explore-crumbs"' in html
        if links.down:
            href = links.down[0]
    # The GPU level: the pod's GPUs, no link further down, the crumbs back up to every level.
    assert links.down == []
    crumbs = resp.context["crumbs"]
    assert [level for _label, _q, level in crumbs] == ["", "tenant", "namespace", "controller", "pod", "container"]
    # Without a container, the pod's GPUs of every container.
    resp, _html, _links = page(client, tenant="acme", namespace="acme-prod", controller="deployment:bert", pod="bert-1")
    assert costs(resp) == {"server/node-1/GPU-0": D("3.00"), "sidecar/node-1/GPU-1": D("0.50")}
    assert {"explore-cost", "explore-gpu-hours", "explore-mem-used", "explore-sm-granted"} <= walk.groups_checked


def test_a_workload_gets_its_efficiency_and_right_sizing(client: Client, fleet: None) -> None:
    client.force_login(user_in(FINANCE_GROUP))
    resp, html, _links = page(client, tenant="acme", namespace="acme-prod", controller="deployment:bert")
    server, sidecar = resp.context["explore"].rows
    # 20 of 80 GiB·h used, granted and requested alike: 25 %.
    assert (server.mem_used_gb_h, server.mem_granted_gb_h, server.mem_requested_gb_h) == (D(20), D(80), D(80))
    assert server.mem_used_of_granted_pct == server.mem_used_of_requested_pct == D(25)
    assert server.sm_used_of_requested_pct == D(30)  # 30 of 100 SM·h
    # Requested 40 GiB per GPU, on average 10 used, 12 at the peak hour: 12 × 1.3 → 16 GiB, 48 of 80
    # GiB·h given back.
    assert server.memory.request_mb == 40960
    assert server.memory.mean_used_mb == 10240
    assert server.memory.peak_hour_mean_mb == 12288
    assert (server.suggestion.verdict, server.suggestion.suggested, server.freed_gb_h) == ("lower", 16384, 48)
    assert "→ request <strong>16 GiB</strong>" in html
    assert "48.00 GB·h" in html
    # SMs beside memory, by the same rule over the same hours: 50 SMs requested per GPU, 15 used on
    # average, 20 in the peak hour: 20 × 1.3 → 26 SMs, 48 of 100 SM·h given back.
    assert (server.sm.request_sm, server.sm.mean_used_sm, server.sm.peak_hour_mean_sm) == (50, 15, 20)
    assert (server.sm_suggestion.verdict, server.sm_suggestion.suggested, server.freed_sm_h) == ("lower", 26, 48)
    assert "→ request <strong>26 SMs</strong>, freeing 48.00 SM·h." in html
    assert (server.suggestion.basis, server.sm_suggestion.basis) == ("request", "request")
    # The sidecar reported no request: no ratio against it, and its memory is sized against the 2 GiB
    # it was granted and billed on (a peak hour of 1 GiB × 1.3 → 2 GiB: it fits), saying so.
    assert sidecar.mem_requested_gb_h is None
    assert sidecar.mem_used_of_requested_pct is None
    assert (sidecar.suggestion.verdict, sidecar.suggestion.basis, sidecar.suggestion.request) == ("fits", "grant", 2048)
    assert "Request not reported by the node agent; sized against the grant billed on:" in html
    assert "Granted 2.00 GiB fits: used on average 1.00 GiB, peak hour 1.00 GiB." in html
    # Nor any SMs granted: nothing to hold the rule against, no suggestion.
    assert sidecar.sm_suggestion.verdict == "unknown"
    assert "Request unknown: no suggestion." in html
    # Not every row's request is known: the requested column has no total, and no sum marks.
    assert resp.context["columns"]["mem_requested_gb_h"].total is None
    assert 'data-sum="explore-mem-requested"' not in html
    assert "peak hour's mean memory per GPU" in html  # the rule is stated on the page


@pytest.mark.parametrize(("params", "want"), [
    ({"label": "app=bert"}, {"acme": D("3.50")}),
    ({"label": "app=bert, app=bert"}, {"acme": D("3.50")}),
    ({"node": "node-2"}, {"globex": D("4.00")}),
    ({"node": "node-1,node-2"}, {"globex": D("4.00"), "acme": D("3.75")}),
    ({"gpu_model": "H100"}, {"globex": D("4.00")}),
    ({"sla_tier": "bronze"}, {"acme": D("0.25")}),
    ({"sla_tier": "gold", "label": "app=llm"}, {}),
])
def test_filters_narrow_every_level(client: Client, fleet: None, params: dict[str, str],
                                    want: dict[str, Decimal]) -> None:
    client.force_login(user_in(FINANCE_GROUP))
    resp, html, links = page(client, **params)
    assert resp.status_code == 200
    assert costs(resp) == want
    for href in links.down:  # the filters travel down too
        assert all(k in parse_qs(href.lstrip("?")) for k in params)
    if not want:
        assert 'data-testid="explore-empty"' in html


def test_filters_apply_below_the_tenant_too(client: Client, fleet: None) -> None:
    client.force_login(user_in(FINANCE_GROUP))
    resp, _html, _links = page(client, tenant="acme", namespace="acme-prod", sla_tier="bronze")
    assert costs(resp) == {"__unallocated__": D("0.25")}


def test_a_member_sees_only_its_tenant_however_the_query_is_crafted(client: Client, fleet: None) -> None:
    client.force_login(user_in(tenant="acme"))
    resp, html, _links = page(client)
    assert costs(resp) == {"acme": D("3.75")}
    assert "globex" not in html
    assert page(client, tenant="globex")[0].status_code == 404
    assert client.get("/explore/", {**PERIOD, "tenant": "globex", "format": "csv"}).status_code == 404
    # Scope before any other error: a bad period does not reveal whether the tenant exists.
    assert client.get("/explore/", {"tenant": "globex", "start": "nope"}).status_code == 404
    # acme's path with globex's names: the query is scoped, so nothing.
    for params in ({"tenant": "acme", "namespace": "globex-prod"},
                   {"tenant": "acme", "namespace": "globex-prod", "controller": "statefulset:llm", "pod": "llm-1"},
                   {"tenant": "acme", "label": "app=llm"}, {"tenant": "acme", "node": "node-2"}):
        resp, html, _links = page(client, **params)
        # (The crumbs echo the names the reader typed; no row shows any usage of them.)
        assert resp.status_code == 200
        assert costs(resp) == {}
        assert 'data-testid="explore-row"' not in html
        assert csv_records(client, **params)[1][-1]["cost"] == "0.00"
    # Finance may look at any tenant, which shows that globex has usage.
    client.force_login(user_in(FINANCE_GROUP))
    assert costs(page(client, tenant="globex")[0]) == {"globex-prod": D("4.00")}


@pytest.mark.parametrize(("params", "parameter"), [
    ({"label": "app"}, "label"),
    ({"label": "app=bert=x"}, "label"),
    ({"label": "app=a,app=b"}, "label"),
    ({"namespace": "acme-prod"}, "namespace"),
    ({"tenant": "acme", "pod": "bert-1"}, "pod"),
    ({"tenant": "acme", "namespace": "acme-prod", "controller": "deployment:bert", "container": "server"},
     "container"),
    ({"start": "2026-03-05", "end": "2026-03-01"}, ""),
    ({"end": "03/01/2026"}, "end"),
    ({"node": ",".join(f"n{i}" for i in range(21))}, "node"),
])
def test_bad_parameters_answer_400_naming_them(client: Client, fleet: None, params: dict[str, str],
                                               parameter: str) -> None:
    client.force_login(user_in(FINANCE_GROUP))
    resp = client.get("/explore/", {**PERIOD, **params})
    assert resp.status_code == 400
    assert "explore" not in resp.context
    text = client.get("/explore/", {**PERIOD, **params, "format": "csv"})
    assert text.status_code == 400
    assert text["Content-Type"].startswith("text/plain")
    if parameter:
        assert f"{parameter}:" in text.content.decode()


def test_every_csv_has_the_pages_numbers_and_adds_up(client: Client, fleet: None) -> None:
    client.force_login(user_in(FINANCE_GROUP))
    levels = [{}, {"tenant": "acme"}, {"tenant": "acme", "namespace": "acme-prod"},
              {"tenant": "acme", "namespace": "acme-prod", "controller": "deployment:bert"},
              {"tenant": "acme", "namespace": "acme-prod", "controller": "deployment:bert", "pod": "bert-1"}]
    for params in levels:
        resp, _html, _links = page(client, **params)
        level = resp.context["level"]
        disposition, records = csv_records(client, **params)
        filename = f"explore-{level}-20260302-20260302.csv"  # its first and last day
        assert f'filename="{filename}"' in disposition
        assert _check_csv(filename, [list(records[0]), *(list(r.values()) for r in records)]) == "explore"
        *rows, total = records
        assert total["name"] == "(total)"
        assert {r["name"]: D(r["cost"]) for r in rows} == costs(resp)
        assert D(total["cost"]) == resp.context["cost_total"] == sum(costs(resp).values())
        for column in ("cost", "gpu_hours", "mem_used_gb_h", "mem_granted_gb_h", "sm_used_h", "sm_granted_h"):
            assert sum(D(r[column]) for r in rows) == D(total[column]), (level, column)
        shown = resp.context["rows"]
        for s, r in zip(shown, rows, strict=True):  # the page's 2 places are the CSV's 4, rounded
            assert s.quantities["mem_used_gb_h"] == D(r["mem_used_gb_h"]).quantize(D("0.01"))
    _disposition, records = csv_records(client, tenant="acme", namespace="acme-prod", controller="deployment:bert")
    server = records[0]
    assert (server["mem_request_gb"], server["mem_peak_hour_gb"], server["suggestion"],
            server["suggested_mem_request_gb"], server["mem_freed_gb_h"]) == ("40.0000", "12.0000", "lower",
                                                                             "16.0000", "48.0000")
    assert (server["mem_used_of_granted_pct"], server["sm_used_of_requested_pct"]) == ("25.0", "30.0")
    assert (records[1]["suggestion"], records[1]["suggestion_basis"]) == ("fits", "grant")
    assert (records[1]["suggested_mem_request_gb"], records[1]["mem_freed_gb_h"]) == ("2.0000", "0.0000")
    assert server["suggestion_basis"] == server["sm_suggestion_basis"] == "request"
    assert records[1]["mem_requested_gb_h"] == ""
    assert records[-1]["mem_requested_gb_h"] == ""
    assert records[-1]["mem_freed_gb_h"] == "48.0000"
    assert (server["sm_request"], server["sm_mean_used"], server["sm_peak_hour"], server["sm_suggestion"],
            server["suggested_sm_request"], server["sm_freed_h"]) == ("50.0000", "15.0000", "20.0000", "lower",
                                                                     "26.0000", "48.0000")
    assert (records[1]["sm_suggestion"], records[1]["sm_suggestion_basis"]) == ("unknown", "")
    assert records[-1]["sm_freed_h"] == "48.0000"


def test_a_member_of_no_tenant_sees_no_link_and_nothing(client: Client, fleet: None) -> None:
    client.force_login(user_in())
    resp, html, _links = page(client)
    assert resp.status_code == 200
    assert costs(resp) == {}
    assert 'data-testid="nav-explore"' not in html


def test_workloads_without_metadata_are_followed_like_any_controller(client: Client, fleet: None) -> None:
    client.force_login(user_in(FINANCE_GROUP))
    resp, _html, links = page(client, tenant="acme", namespace="acme-prod", controller="__unallocated__")
    assert costs(resp) == {"train-7/main": D("0.25")}
    (train,) = resp.context["explore"].rows
    # No metadata, no request: sized against its grant (1 GiB, all of it used at the peak hour).
    assert train.suggestion is not None
    assert (train.suggestion.verdict, train.suggestion.basis) == ("fits", "grant")
    query = {k: v[0] for k, v in parse_qs(links.down[0].lstrip("?")).items()}
    resp, _html, _links = page(client, **query)
    assert costs(resp) == {"main/node-1/GPU-0": D("0.25")}


def test_the_peak_hour_is_found_over_more_hours_than_one_read_takes(client: Client, fleet: None) -> None:
    """60 days are 1,440 hourly sets, more than the allocation query's MAX_SETS per read."""
    client.force_login(user_in(FINANCE_GROUP))
    resp, _html, _links = page(client, start="2026-01-02", end="2026-03-02", tenant="acme", namespace="acme-prod",
                               controller="deployment:bert")
    server = resp.context["explore"].rows[0]
    assert server.memory is not None
    assert server.memory.peak_hour_mean_mb == 12288


def test_the_page_right_sizes_its_costliest_rows_only_and_the_csv_every_row(fleet: None) -> None:
    from billing.queries.explore import ExploreFilters, ExplorePath, get_explore
    from billing.scope import Scope

    everyone = Scope(tenants=None, is_finance=True, is_admin=False)
    path = ExplorePath(tenant="acme", namespace="acme-prod", controller="deployment:bert")
    start, end = datetime(2026, 3, 2, tzinfo=UTC), datetime(2026, 3, 3, tzinfo=UTC)
    first, second = get_explore(scope=everyone, path=path, filters=ExploreFilters(), start=start, end=end,
                                places=2, rightsizing_limit=1).rows
    assert first.suggestion is not None
    assert second.suggestion is None
    assert second.memory is None
    assert all(r.suggestion for r in get_explore(scope=everyone, path=path, filters=ExploreFilters(), start=start,
                                                  end=end, places=4).rows)


def test_quick_periods_keep_the_path_and_the_filters(client: Client, fleet: None) -> None:
    client.force_login(user_in(FINANCE_GROUP))
    resp, html, _links = page(client, tenant="acme", label="app=bert")
    last_month = next(q for q in resp.context["quick_periods"] if q["key"] == "last-month")
    query = parse_qs(str(last_month["query"]))
    assert query["tenant"] == ["acme"]
    assert query["label"] == ["app=bert"]
    assert len(query["start"]) == 1
    assert 'data-testid="period-last-month"' in html


_NAMES = st.sampled_from(["a", "b"])
_USAGE = st.fixed_dictionaries({
    "tenant": _NAMES, "namespace": _NAMES, "pod": st.sampled_from(["p1", "p2", "p3"]), "container": _NAMES,
    "gpu": st.sampled_from(["GPU-0", "GPU-1", "GPU-2"]), "hour": st.integers(0, 2),
    "charge": st.decimals(min_value=0, max_value=100, places=6),
    "controller": st.sampled_from(["", "deployment:x", "job:y"]),
})


@hypothesis_settings(max_examples=15, deadline=None,
                     suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(rows=st.lists(_USAGE, min_size=1, max_size=8))
def test_every_level_adds_up_to_the_row_that_opened_it(db: Any, rows: list[dict[str, Any]]) -> None:
    """Whatever the ledger: the rows a row opens add up to it exactly, down to the GPUs, both at
    ledger precision and as shown (every amount and quantity to its last place: the parent's shown
    figure apportioned by the largest remainder, billing.queries.figures), and the tenants add up to
    the ledger's charge."""
    from billing.queries.explore import ExploreFilters, ExplorePath, get_explore
    from billing.scope import Scope

    everyone = Scope(tenants=None, is_finance=True, is_admin=False)
    start, end = datetime(2026, 3, 2, tzinfo=UTC), datetime(2026, 3, 3, tzinfo=UTC)
    with transaction.atomic():
        node = Node.objects.create(name="node-h")
        seen: set[tuple[str, ...]] = set()
        for r in rows:
            namespace, pod = f"{r['tenant']}-{r['namespace']}", f"{r['tenant']}-{r['pod']}"
            key = (r["gpu"], namespace, pod, r["container"], str(r["hour"]))
            if key in seen:
                continue  # one ledger row per workload, GPU and hour
            seen.add(key)
            usage(node, r["gpu"], H + timedelta(hours=r["hour"]), tenant=r["tenant"], namespace=namespace, pod=pod,
                  container=r["container"], charge=str(r["charge"]), mem_used_gb="1", mem_granted_gb="2")
            if r["controller"] and not WorkloadMeta.objects.filter(namespace=namespace, pod=pod).exists():
                kind, name = r["controller"].split(":")
                WorkloadMeta.objects.create(node=node, namespace=namespace, pod=pod, pod_uid=f"uid-{pod}",
                                            controller_kind=kind, controller_name=name, first_seen=H, last_seen=H)
        ledger_total = sum((D(str(r.charge)) for r in UsageHour.objects.all()), D(0))

        def level(path: ExplorePath) -> list[Any]:
            return get_explore(scope=everyone, path=path, filters=ExploreFilters(), start=start, end=end,
                               places=2).rows

        def check(path: ExplorePath, depth: int) -> None:
            for row in level(path):
                if row.down is None:
                    continue
                below = level(row.down)
                assert sum((b.cost for b in below), D(0)) == row.cost, (row.name, row.down)
                for name in ("cost", "gpu_hours", "mem_used_gb_h", "mem_granted_gb_h", "sm_used_h", "sm_granted_h"):
                    shown = [getattr(b.shown, name) for b in below]
                    assert sum(shown, D(0)) == getattr(row.shown, name), (name, row.name, row.down, shown)
                if depth < 4:
                    check(row.down, depth + 1)

        tenants = level(ExplorePath())
        assert sum((t.cost for t in tenants), D(0)) == ledger_total
        check(ExplorePath(), 1)
        transaction.set_rollback(True)
