"""The demo's OpenCost port (config/demo_opencost.py) in front of the real ledger on a loopback
live server: it adds the identity OpenCost's clients cannot send, reads only, and serves only the
gateway's paths. The same port inside `make demo` is tested in tests/test_allocation_demo.py."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import requests

from billing.scope import FINANCE_GROUP
from billing.services.identity.api_tokens import issue_api_token
from config.demo_opencost import DEFAULT_PORT, OpenCostPort, port_from_env
from tests import clock
from tests.conftest import user_in

KUBECTL_COST = {"window": "7d", "aggregate": "cluster,namespace", "accumulate": "true", "includeIdle": "true",
                "idle": "true", "filterNamespaces": ""}


@pytest.fixture
def opencost_port(live_server) -> Iterator[OpenCostPort]:
    token = issue_api_token(username=user_in(FINANCE_GROUP).username, name="demo OpenCost port", expires_at=None,
                            now=clock.now(), actor_label="test").token
    port = OpenCostPort(upstream=live_server.url, token=token, port=0)
    yield port
    port.close()


@pytest.mark.django_db(transaction=True)
def test_it_reads_as_finance_where_the_ledger_alone_says_401(opencost_port: OpenCostPort, live_server) -> None:
    assert requests.get(f"{live_server.url}/allocation/compute", params=KUBECTL_COST, timeout=30).status_code == 401
    for path in ("/allocation", "/allocation/compute", "/model/allocation", "/allocation/summary",
                 "/model/allocation/compute/summary", "/allocation/autocomplete", "/assets", "/model/assets"):
        params = {**KUBECTL_COST, "field": "namespace"} if path.endswith("autocomplete") else KUBECTL_COST
        # The caller's own credential and cookies never reach the ledger: the port's token replaces them.
        resp = requests.get(f"{opencost_port.url}{path}", params=params, timeout=30,
                            headers={"Authorization": "Bearer vgla_not-a-token", "Cookie": "sessionid=forged"})
        assert resp.status_code == 200, (path, resp.text)
        assert resp.json()["code"] == 200, (path, resp.text)
        assert resp.json()["status"] == "success", (path, resp.text)
        assert resp.headers["Content-Type"].startswith("application/json")
    assert requests.head(f"{opencost_port.url}/assets", params={"window": "1d"}, timeout=30).status_code == 200


@pytest.mark.django_db(transaction=True)
def test_it_refuses_writes_other_paths_and_passes_the_ledgers_own_400(opencost_port: OpenCostPort) -> None:
    for method in ("POST", "PUT", "PATCH", "DELETE", "OPTIONS"):
        resp = requests.request(method, f"{opencost_port.url}/allocation/compute", data=b"{}", timeout=30)
        assert resp.status_code == 405, method
        assert resp.headers["Allow"] == "GET, HEAD", method
    for path in ("/", "/healthz", "/metrics", "/finance/", "/admin/", "/api/v1/allocation", "/api/v1/usage/batches",
                 "/allocation/", "/allocation/compute/x", "/model/", "/model/model/assets", "/assets/../finance/"):
        assert requests.get(f"{opencost_port.url}{path}", timeout=30).status_code == 404, path
    bad = requests.get(f"{opencost_port.url}/allocation/compute", params={"window": "fortnight"}, timeout=30)
    assert bad.status_code == 400, bad.text
    assert bad.json()["parameter"] == "window", bad.text


def test_the_port_setting() -> None:
    assert port_from_env(None) == port_from_env("") == DEFAULT_PORT == 9003
    assert port_from_env("0") == 0
    assert port_from_env(" 9100 ") == 9100
    for wrong in ("-1", "65536", "nine"):
        with pytest.raises(ValueError, match=r"."):
            port_from_env(wrong)


def test_it_listens_on_loopback_only(db) -> None:
    port = OpenCostPort(upstream="http://127.0.0.1:9", token="unused", port=0)
    try:
        assert port.server.server_address[0] == "127.0.0.1"
        # No web server behind it: a 502 that says so, never a hang or a traceback.
        resp = requests.get(f"{port.url}/allocation?window=1d", timeout=30)
        assert resp.status_code == 502
        assert "unreachable" in resp.text
    finally:
        port.close()
