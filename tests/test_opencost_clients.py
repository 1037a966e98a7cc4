"""OpenCost's clients reach the allocation API through the OpenCost gateway
(docs/allocation-api.md, "Connecting kubectl-cost and the OpenCost UI").

The gateway is the real nginx (with its njs module) running the configuration shipped in
deploy/k8s/opencost-clients.yaml, only its addresses replaced (listen port, the ledger's address, the
token's path); the ledger is the live Django server on the test Postgres; the Kubernetes API server
that issues the gateway pod's projected token and reviews it is agents.fakes.kube.FakeKubernetes.
The requests are the ones kubectl-cost sends (pkg/query/allocation.go, aggregatedcommandbuilder.go:
GET <path>?window=..&aggregate=..&accumulate=true&includeIdle=..&idle=.., no credential) on both of its
paths, and the one the OpenCost UI's nginx forwards (its /model prefix stripped).
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from datetime import timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
import requests
import yaml

from agents.fakes.kube import FakeKubernetes
from billing.api import kube_auth
from billing.ledger.models import GpuHour, UsageHour
from billing.models import Node
from tests import clock
from tests.conftest import user_in, with_day

REPO = Path(__file__).resolve().parents[1]
MANIFEST = REPO / "deploy" / "k8s" / "opencost-clients.yaml"
GATEWAY_POD = "opencost-5d8f7c9b4-q2w7x"
AUDIENCE = "vgpu-ledger-opencost"
D = Decimal
_ZEROS = {f: D(0) for f in ("mem_billed_mb_s", "sm_billed_s", "pcie_mb", "mem_granted_mb_s", "sm_granted_s",
                            "mem_used_mb_s", "sm_used_s")}
# kubectl-cost's query for `kubectl cost namespace --opencost` (its defaults: window 1d, idle on).
KUBECTL_COST_PARAMS = {"window": "1d", "aggregate": "namespace", "accumulate": "true",
                       "includeIdle": "true", "idle": "true"}


def reader(group: str | None = None, tenant: str | None = None) -> Any:
    """The user VGPU_KUBE_CLIENTS maps the gateway's ServiceAccount to, in `group` or `tenant`."""
    user = user_in(group, tenant)
    user.username = "opencost-reader"
    user.save(update_fields=["username"])
    return user


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def kube(settings: Any) -> Iterator[FakeKubernetes]:
    kube_auth.clear_client_review_cache()
    with FakeKubernetes() as fake:
        fake.add_pod({
            "metadata": {"name": GATEWAY_POD, "namespace": "opencost", "labels": {"app": "opencost"}},
            "spec": {"nodeName": "cpu-node-1", "serviceAccountName": "opencost-gateway",
                     "containers": [{"name": "gateway", "image": "nginx:1.27"}]},
            "status": {"phase": "Running"},
        })
        settings.VGPU_KUBE_API = fake.url
        settings.VGPU_KUBE_CLIENTS = "opencost:opencost-gateway=opencost-reader"
        yield fake
    kube_auth.clear_client_review_cache()


@pytest.fixture
def fleet(transactional_db: None) -> None:
    """This hour (so kubectl-cost's default window, today, holds it whatever the date): two tenants on
    one card, and the card's idle."""
    node = Node.objects.create(name="gpu-node-1", cluster="east")
    hour = clock.now().replace(minute=0, second=0, microsecond=0)
    GpuHour.objects.create(gpu_uuid="GPU-1", node=node, gpu_model="A100", hour=hour, metered_seconds=D(3600),
                           card_cost=D(3), charged=D("2.25"), idle_cost=D("0.75"), idle_allocated=D(0),
                           currency="USD", priced=True)
    for tenant, charge in (("acme", "1.5"), ("globex", "0.75")):
        with_day(UsageHour.objects.create(
            gpu_uuid="GPU-1", node=node, tenant=tenant, namespace=f"{tenant}-prod", pod=f"{tenant}-pod",
            container="main", pod_uid=f"uid-{tenant}", sla_tier="gold", seconds=D(3600), share_gpu_s=D(1800),
            charge=D(charge), idle_share=D(0), hour=hour, **_ZEROS))


def _gateway_config(*, port: int, upstream: str, token_file: Path) -> dict[str, str]:
    [config] = [d for d in yaml.safe_load_all(MANIFEST.read_text())
                if d and d["kind"] == "ConfigMap" and d["metadata"]["name"] == "opencost-gateway"]
    nginx_conf: str = config["data"]["nginx.conf"]
    for shipped, here in (("listen 9003;", f"listen 127.0.0.1:{port};"),
                          ("server vgpu-ledger-web.vgpu-ledger.svc.cluster.local:8000;", f"server {upstream};"),
                          ("/var/run/secrets/vgpu-ledger-opencost/token", str(token_file)),
                          ("pid /tmp/nginx.pid;", "pid nginx.pid;"),
                          ("_temp_path /tmp/", "_temp_path tmp/")):
        assert shipped in nginx_conf, shipped
        nginx_conf = nginx_conf.replace(shipped, here)
    return {"nginx.conf": nginx_conf, "gateway.js": config["data"]["gateway.js"]}


@pytest.fixture
def gateway(tmp_path: Path, live_server: Any, kube: FakeKubernetes, settings: Any) -> Iterator[str]:
    """The shipped gateway in front of the live server, holding the gateway pod's projected token."""
    nginx = shutil.which("nginx") or shutil.which("nginx", path="/usr/sbin")
    modules = Path("/usr/lib/nginx/modules/ngx_http_js_module.so")
    if nginx is None or not modules.exists():
        pytest.fail("nginx with its njs module is not installed: `make monitoring-deps` installs Debian's "
                    "nginx-light and libnginx-mod-http-js")
    # The gateway names the ledger by its Service name; the live server must accept it as the pod does.
    settings.ALLOWED_HOSTS = [*settings.ALLOWED_HOSTS, "vgpu-ledger-web.vgpu-ledger.svc.cluster.local"]
    token = tmp_path / "token"
    token.write_text(kube.issue_service_account_token(namespace="opencost", pod=GATEWAY_POD, audiences=[AUDIENCE]))
    port = _free_port()
    (tmp_path / "gateway").mkdir()
    (tmp_path / "tmp").mkdir()
    (tmp_path / "modules").symlink_to(modules.parent)
    for name, text in _gateway_config(port=port, upstream=live_server.url.removeprefix("http://"),
                                      token_file=token).items():
        (tmp_path / "gateway" / name).write_text(text)
    # nginx started by root hands its workers to `nobody`, who cannot read pytest's private tmp_path;
    # in the pod it runs as its own non-root user and switches nothing.
    log = tmp_path / "nginx.log"  # a file, not a pipe nobody drains
    directives = "daemon off;" + (" user root;" if os.geteuid() == 0 else "")
    process = subprocess.Popen([nginx, "-p", f"{tmp_path}/", "-c", str(tmp_path / "gateway" / "nginx.conf"),
                                "-g", directives], stdout=log.open("wb"), stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(100):
            try:
                if requests.get(f"{url}/healthz", timeout=1).status_code == 200:
                    break
            except requests.ConnectionError:
                time.sleep(0.05)
        else:
            process.kill()
            process.wait(timeout=10)
            raise AssertionError(f"the gateway did not start: {log.read_text()[-2000:]}")
        yield url
    finally:
        process.terminate()
        process.wait(timeout=10)


def test_kubectl_cost_and_the_ui_read_the_allocation_api_through_the_gateway_as_the_mapped_tenant_user(
    gateway: str, fleet: None
) -> None:
    reader(tenant="acme")
    # kubectl-cost --opencost (port-forward or --use-proxy both end at this port), its default path,
    # and the UI's nginx (which strips /model from the browser's /model/allocation/compute).
    for path in ("/allocation/compute", "/model/allocation", "/allocation"):
        answer = requests.get(f"{gateway}{path}", params=KUBECTL_COST_PARAMS, timeout=30)
        assert answer.status_code == 200, (path, answer.text)
        assert answer.headers["Content-Type"].startswith("application/json")
        body = answer.json()
        assert isinstance(body["data"], list)
        assert len(body["data"]) == 1
        # The ServiceAccount reads as a member of acme: acme's namespace only, no platform idle.
        assert set(body["data"][0]) == {"acme-prod"}, body["data"]
        assert body["data"][0]["acme-prod"]["totalCost"] == pytest.approx(1.5)


def test_kubectl_cost_node_and_the_summary_paths_pass_the_gateway(gateway: str, fleet: None) -> None:
    reader("finance")
    # `kubectl cost node` (pkg/query/assetsapi.go): /model/assets with these three parameters,
    # decoded as a list of maps of Node assets.
    assets = requests.get(f"{gateway}/model/assets", timeout=30,
                          params={"window": "1d", "accumulate": "true", "filterTypes": "Node"})
    assert assets.status_code == 200, assets.text
    [nodes] = assets.json()["data"]
    assert nodes, nodes
    assert all(node["type"] == "Node" for node in nodes.values()), nodes
    for path in ("/allocation/summary", "/model/allocation/compute/summary"):
        answer = requests.get(f"{gateway}{path}", params={"window": "1d", "aggregate": "namespace"}, timeout=30)
        assert answer.status_code == 200, (path, answer.text)
        assert answer.json()["status"] == "success"


def test_the_gateway_replaces_a_callers_credential_reads_only_and_forwards_nothing_else(
    gateway: str, fleet: None
) -> None:
    reader("finance")
    # A caller's own Authorization is dropped: only the pod's identity reaches the ledger.
    forged = requests.get(f"{gateway}/allocation/compute", params=KUBECTL_COST_PARAMS, timeout=30,
                          headers={"Authorization": "Bearer vgla_forged"})
    assert forged.status_code == 200
    assert set(forged.json()["data"][0]) == {"acme-prod", "globex-prod", "__idle__"}
    assert requests.post(f"{gateway}/allocation/compute", timeout=10).status_code == 403
    for other in ("/metrics", "/api/v1/usage/batches", "/finance/", "/allocation/compute/../../metrics"):
        assert requests.get(f"{gateway}{other}", timeout=10).status_code == 404, other


def _direct(live_server: Any, token: str, method: str = "GET") -> requests.Response:
    return requests.request(method, f"{live_server.url}/allocation/compute", params=KUBECTL_COST_PARAMS,
                            headers={"Authorization": f"Bearer {token}"}, timeout=30)


def test_a_service_account_token_is_refused_unless_reviewed_for_the_audience_mapped_active_and_reading(
    live_server: Any, kube: FakeKubernetes, fleet: None, settings: Any
) -> None:
    mapped = reader(tenant="acme")
    settings.VGPU_KUBE_CLIENTS = "opencost:opencost-gateway=opencost-reader, not-an-entry"
    good = kube.issue_service_account_token(namespace="opencost", pod=GATEWAY_POD, audiences=[AUDIENCE])
    assert _direct(live_server, good).status_code == 200

    wrong_audience = kube.issue_service_account_token(namespace="opencost", pod=GATEWAY_POD,
                                                      audiences=["vgpu-ledger"])
    refused = _direct(live_server, wrong_audience)
    assert refused.status_code == 401
    assert f"not for audience '{AUDIENCE}'" in refused.json()["message"]

    other_account = kube.issue_service_account_token(namespace="opencost", service_account="default",
                                                     audiences=[AUDIENCE])
    refused = _direct(live_server, other_account)
    assert refused.status_code == 401
    assert "opencost:default is not mapped" in refused.json()["message"]

    assert _direct(live_server, good, "POST").status_code == 401

    mapped.is_active = False
    mapped.save()
    refused = _direct(live_server, good)
    assert refused.status_code == 401
    assert "not an active user" in refused.json()["message"]


def test_an_api_server_that_cannot_answer_is_a_503_not_a_401(
    live_server: Any, kube: FakeKubernetes, fleet: None, settings: Any
) -> None:
    reader(tenant="acme")
    token = kube.issue_service_account_token(namespace="opencost", pod=GATEWAY_POD, audiences=[AUDIENCE])
    settings.VGPU_KUBE_API = f"http://127.0.0.1:{_free_port()}"
    down = _direct(live_server, token)
    assert down.status_code == 503
    assert down.headers.get("Retry-After")
    # Back: the same token is accepted; its ServiceAccount deleted, the next review refuses it once
    # the cache (VGPU_KUBE_CLIENT_CACHE_S) has let it go.
    settings.VGPU_KUBE_API = kube.url
    assert _direct(live_server, token).status_code == 200
    kube.delete_service_account("opencost", "opencost-gateway")
    assert _direct(live_server, token).status_code == 200  # cached
    kube_auth.clear_client_review_cache()
    assert _direct(live_server, token).status_code == 401


def _reviews(kube: FakeKubernetes) -> int:
    return sum(r.path.endswith("/tokenreviews") for r in kube.requests)


def test_garbage_and_expired_tokens_are_refused_without_a_token_review_and_a_review_is_cached(
    live_server: Any, kube: FakeKubernetes, fleet: None
) -> None:
    reader(tenant="acme")
    expired = kube.issue_service_account_token(namespace="opencost", pod=GATEWAY_POD, audiences=[AUDIENCE],
                                               issued_at=clock.now() - timedelta(hours=2))
    for token in ("a.b.c", "x" * 20 + "." + "y" * 5000 + ".z", "e30.e30.sig", expired):
        refused = _direct(live_server, token)
        assert refused.status_code == 401, (token[:40], refused.text)
        assert refused.json()["code"] == 401
    assert _reviews(kube) == 0
    good = kube.issue_service_account_token(namespace="opencost", pod=GATEWAY_POD, audiences=[AUDIENCE])
    for _ in range(3):
        assert _direct(live_server, good).status_code == 200
    assert _reviews(kube) == 1
