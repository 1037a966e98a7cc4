"""The allocation API's "done when", against `make demo` (the suite's shared demo, tests/conftest.py): an
OpenCost-shaped request with a finance API token answers last month's totals equal to its
invoices plus the platform's idle, label and step aggregations work, and a tenant member's token
sees only its tenant. Tokens are issued as an operator does, with manage.py on the demo's database."""

from __future__ import annotations

import subprocess
import sys
from datetime import date
from decimal import Decimal

import psycopg2
import requests

from tests.demo_process import ROOT, Demo

CENT = Decimal("0.01")


def _token(demo: Demo, username: str) -> str:
    done = subprocess.run([sys.executable, "manage.py", "create_api_token", username, "--name", "allocation test"],
                          cwd=ROOT, env=demo.env, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip().splitlines()[-1].strip()


def _allocation(demo: Demo, token: str | None, **params: str) -> requests.Response:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    return requests.get(f"{demo.base}/allocation/compute", params=params, headers=headers, timeout=120)


def _last_month(demo: Demo) -> tuple[date, Decimal, Decimal]:
    """(first day of last month, Σ its invoice lines at ledger precision, the platform's idle),
    read straight from the demo's database: the figures the API must meet."""
    with psycopg2.connect(demo.env["DATABASE_URL"]) as conn, conn.cursor() as cur:
        cur.execute("SELECT date_trunc('month', now() AT TIME ZONE 'UTC')::date - interval '1 month'")
        month = cur.fetchone()[0].date()
        cur.execute("SELECT coalesce(sum(l.amount), 0) FROM billing_invoiceline l JOIN billing_invoice i "
                    "ON i.id = l.invoice_id WHERE l.usage_month = %s AND i.status = 'finalized'", [month])
        invoiced = cur.fetchone()[0]
        cur.execute("SELECT coalesce(sum(idle_cost - idle_allocated), 0) FROM billing_gpuhour "
                    "WHERE hour >= %s AND hour < %s + interval '1 month'", [month, month])
        idle = cur.fetchone()[0]
    return month, Decimal(invoiced), Decimal(idle)


def _total(data_set: dict[str, dict]) -> Decimal:
    return sum((Decimal(repr(a["totalCost"])) for a in data_set.values()), Decimal(0))


def test_lastmonth_by_namespace_with_idle_equals_the_invoices_plus_idle(demo: Demo) -> None:
    token = _token(demo, "finance")
    month, invoiced, idle = _last_month(demo)
    assert invoiced > 0, "the demo closes last month: its invoices must carry usage"
    resp = _allocation(demo, token, window="lastmonth", aggregate="namespace", includeIdle="true", accumulate="true")
    assert resp.status_code == 200, resp.text
    body = resp.json()
    assert body["code"] == 200
    assert body["status"] == "success"
    assert len(body["data"]) == 1
    (allocations,) = body["data"]
    assert "__idle__" in allocations
    assert allocations["__idle__"]["name"] == "__idle__"
    assert all(a["window"]["start"].startswith(f"{month:%Y-%m}-01") for a in allocations.values())
    workloads = {k: v for k, v in allocations.items() if k != "__idle__"}
    assert _total(workloads).quantize(CENT) == invoiced.quantize(CENT)
    assert Decimal(repr(allocations["__idle__"]["totalCost"])).quantize(CENT) == idle.quantize(CENT)
    assert _total(allocations).quantize(CENT) == (invoiced + idle).quantize(CENT)


def test_labels_and_daily_steps_and_a_tenants_token(demo: Demo) -> None:
    finance, member = _token(demo, "finance"), _token(demo, "acme-engineer")
    by_label = _allocation(demo, finance, window="lastmonth", aggregate="label:app", accumulate="true")
    assert by_label.status_code == 200, by_label.text
    names = set(by_label.json()["data"][0])
    assert names - {"__unallocated__"}, f"the demo's pods carry an app label: {names}"

    daily = _allocation(demo, finance, window="7d", aggregate="namespace", step="1d")
    assert daily.status_code == 200, daily.text
    sets = daily.json()["data"]
    assert len(sets) == 7
    starts = [next(iter(s.values()))["window"]["start"] for s in sets if s]
    assert starts == sorted(starts)
    assert len(set(starts)) == len(starts)

    mine = _allocation(demo, member, window="month", aggregate="tenant", accumulate="true")
    assert mine.status_code == 200, mine.text
    assert set(mine.json()["data"][0]) <= {"acme"}
    everyone = _allocation(demo, finance, window="month", aggregate="tenant", accumulate="true")
    assert len(set(everyone.json()["data"][0])) > 1

    assert _allocation(demo, None, window="month").status_code == 401
    bad = _allocation(demo, finance, window="fortnight")
    assert bad.status_code == 400, bad.text
    assert bad.json()["parameter"] == "window", bad.text


# kubectl-cost's requests as its commands build them (`kubectl cost namespace --opencost` and its
# default /model path; `kubectl cost node`'s assets), filterNamespaces sent even when empty.
KUBECTL_COST_ALLOCATION = {"window": "7d", "aggregate": "cluster,namespace", "accumulate": "true",
                           "includeIdle": "true", "idle": "true", "filterNamespaces": ""}
KUBECTL_COST_ASSETS = {"window": "7d", "accumulate": "true", "filterTypes": "Node"}


def test_the_opencost_port_answers_kubectl_costs_requests_with_no_credential(demo: Demo) -> None:
    assert demo.opencost in demo.banner, "the banner says where the OpenCost port is"
    for path, params in (("/model/allocation", KUBECTL_COST_ALLOCATION), ("/allocation/compute", KUBECTL_COST_ALLOCATION),
                         ("/model/assets", KUBECTL_COST_ASSETS)):
        resp = requests.get(f"{demo.opencost}{path}", params=params, timeout=120)
        assert resp.status_code == 200, (path, resp.text)
        body = resp.json()
        assert body["code"] == 200, (path, body)
        assert body["status"] == "success", (path, body)
        assert isinstance(body["data"], list), (path, body)
        assert len(body["data"]) == 1, (path, body)
        assert body["data"][0], (path, body)
    allocations = requests.get(f"{demo.opencost}/allocation/compute", params=KUBECTL_COST_ALLOCATION,
                               timeout=120).json()["data"][0]
    # As finance: the whole fleet, keyed cluster/namespace, with the platform's idle.
    assert "__idle__" in allocations, sorted(allocations)
    assert any(key.startswith("demo/") for key in allocations), sorted(allocations)
    nodes = requests.get(f"{demo.opencost}/model/assets", params=KUBECTL_COST_ASSETS, timeout=120).json()["data"][0]
    assert {asset["type"] for asset in nodes.values()} == {"Node"}, nodes
    # Straight to the web server the same request is still a 401: the port adds the identity.
    assert requests.get(f"{demo.base}/allocation/compute", params=KUBECTL_COST_ALLOCATION, timeout=120).status_code == 401


def test_the_opencost_port_only_reads_opencosts_paths(demo: Demo) -> None:
    assert requests.post(f"{demo.opencost}/allocation/compute", data={"window": "7d"}, timeout=30).status_code == 405
    assert requests.delete(f"{demo.opencost}/assets", timeout=30).status_code == 405
    for path in ("/", "/healthz", "/metrics", "/finance/", "/api/v1/usage/batches", "/admin/", "/allocation/compute/x",
                 "/model/allocation/", "/api/v1/allocation"):
        assert requests.get(f"{demo.opencost}{path}", timeout=30).status_code == 404, path
    # A caller's own credential never replaces the port's: it reads as finance whatever it sends.
    resp = requests.get(f"{demo.opencost}/allocation/compute", params={"window": "7d", "aggregate": "tenant"},
                        headers={"Authorization": "Bearer vgla_not-a-token", "Cookie": "sessionid=x"}, timeout=120)
    assert resp.status_code == 200, resp.text
    assert len(resp.json()["data"][0]) > 1, resp.text
    # The ledger's own 400 reaches the client as it is.
    bad = requests.get(f"{demo.opencost}/allocation/compute", params={"window": "fortnight"}, timeout=120)
    assert bad.status_code == 400, bad.text
    assert bad.json()["parameter"] == "window", bad.text
