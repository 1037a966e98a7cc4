"""A node speaks only for itself: attacks a node's token could make, replayed over HTTP against a
live server with real node tokens. Node B cannot change node A's pod metadata; a tenant claim is
billed by the service's namespace mapping and counted; the audit log takes only agent actions; a
forged undelivered report neither counts against another node nor takes /healthz down; anonymous
/healthz names no host."""

from __future__ import annotations

import hashlib
import json
from datetime import timedelta
from typing import Any

import pytest
import requests
from django.test import Client

from billing.ledger.models import UsageMinute, WorkloadMeta
from billing.models import AuditEvent, Node, Tenant, UndeliveredBatch
from billing.services.identity.api_tokens import issue_api_token
from billing.services.identity.tokens import issue_node_token
from billing.services.ingest.rollup import run_rollup
from tests import clock
from tests.conftest import iso, make_batch, new_user

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def nodes(live_server: Any) -> dict[str, str]:
    """Two real nodes, each with its own token: (node name → clear token)."""
    return {name: issue_node_token(node_name=name, now=clock.now(), actor_label="test").token
            for name in ("node-a", "node-b")}


@pytest.fixture
def start() -> Any:
    return clock.now().replace(second=0, microsecond=0) - timedelta(minutes=10)


def post(live_server: Any, token: str, path: str, body: Any) -> requests.Response:
    return requests.post(f"{live_server.url}{path}", data=json.dumps(body).encode(), timeout=30,
                         headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"})


def with_meta(batch: dict[str, Any], **fields: Any) -> dict[str, Any]:
    for sample in batch["samples"]:
        sample.update(fields)
    return batch


def test_node_b_cannot_change_node_a_pod_metadata(live_server, nodes, start):
    a = with_meta(make_batch(node="node-a", start=start), controller_kind="Deployment", controller_name="bert",
                  labels={"app": "nlp"}, mem_requested_mb=512, sm_requested=13.5)
    assert post(live_server, nodes["node-a"], "/api/v1/usage/batches", a).status_code == 201
    # Node B names A's pod (same namespace, pod and UID), later, with other metadata.
    b = with_meta(make_batch(node="node-b", start=start + timedelta(seconds=30)), controller_kind="Job",
                  controller_name="pentest", labels={"app": "pwned"}, mem_requested_mb=1, sm_requested=0.5)
    assert post(live_server, nodes["node-b"], "/api/v1/usage/batches", b).status_code == 201
    a_row = WorkloadMeta.objects.get(node__name="node-a", pod="bert-1")
    assert (a_row.controller_kind, a_row.controller_name, a_row.labels) == ("Deployment", "bert", {"app": "nlp"})
    assert a_row.requests == {"server": {"mem_mb": 512, "sm": 13.5}}
    # B's claim is B's own row, joined only by B's own usage.
    assert WorkloadMeta.objects.get(node__name="node-b", pod="bert-1").controller_name == "pentest"


def test_a_tenant_claim_is_billed_by_the_namespace_mapping_and_counted(live_server, nodes, start, settings):
    settings.VGPU_TENANT_UNMAPPED = "namespace"
    Tenant.objects.create(slug="acme", name="Acme", namespaces=["acme-prod"])
    forged = make_batch(node="node-b", start=start, workloads=[
        {"gpu": 0, "tenant": "pentest", "namespace": "acme-prod", "pod": "bert-1", "mem_used": 1.0,
         "mem_granted": 1.0, "sm_used": 1.0, "sm_granted": 1.0},
        {"gpu": 0, "tenant": "acme", "namespace": "globex-prod", "pod": "llm-1", "mem_used": 1.0,
         "mem_granted": 1.0, "sm_used": 1.0, "sm_granted": 1.0},
    ])
    assert post(live_server, nodes["node-b"], "/api/v1/usage/batches", forged).status_code == 201
    run_rollup(now=clock.now())
    billed = dict(UsageMinute.objects.values_list("namespace", "tenant").distinct())
    # The mapped namespace is acme's whatever was claimed; an unmapped one is its own name's, never
    # the tenant the node named for it.
    assert billed == {"acme-prod": "acme", "globex-prod": "globex-prod"}
    assert not UsageMinute.objects.filter(tenant="pentest").exists()
    node = Node.objects.get(name="node-b")
    assert node.tenant_claim_mismatches == 20
    assert node.last_tenant_claim_mismatch_at is not None
    # Counted where an admin looks: the nodes page and /metrics.
    admin = Client()
    admin.force_login(new_user("root", is_superuser=True))
    page = admin.get("/nodes/").content.decode()
    assert 'data-testid="node-tenant-mismatches-node-b" data-count="20"' in page
    assert 'data-testid="node-tenant-mismatches-node-a" data-count="0"' in page
    settings.VGPU_METRICS_TOKEN = "metrics-token-for-this-test"
    metrics = requests.get(f"{live_server.url}/metrics", timeout=30,
                           headers={"Authorization": "Bearer metrics-token-for-this-test"}).text
    assert 'vgpu_ledger_tenant_claim_mismatches_total{node="node-b"} 20.0' in metrics


def test_an_audit_action_no_agent_takes_is_refused(live_server, nodes):
    events = {"events": [{"at": iso(clock.now()), "action": "tenant.deleted", "target": "acme",
                          "detail": {"by": "admin"}}]}
    resp = post(live_server, nodes["node-a"], "/api/v1/nodes/node-a/events", events)
    assert resp.status_code == 400
    assert resp.json()["errors"][0]["path"] == "$.events[0].action"
    assert "not an action an agent takes" in resp.json()["errors"][0]["message"]
    assert not AuditEvent.objects.filter(actor_label="node:node-a").exists()
    events["events"][0]["action"] = "watchdog.evicted"
    assert post(live_server, nodes["node-a"], "/api/v1/nodes/node-a/events", events).status_code == 201
    assert AuditEvent.objects.get(actor_label="node:node-a").action == "agent.watchdog.evicted"


def report(seq: int, start: Any, *, sha: str = "0" * 64, seconds: int = 10) -> dict[str, Any]:
    return {"batch_seq": seq, "window": {"start": iso(start), "end": iso(start + timedelta(seconds=seconds))},
            "samples": 10, "size_bytes": 100, "status": 400, "reason": "forged", "content_sha256": sha,
            "superseded_by": None}


def test_one_forged_undelivered_report_does_not_take_healthz_down(live_server, nodes, start):
    before = requests.get(f"{live_server.url}/healthz", timeout=30).status_code
    assert post(live_server, nodes["node-b"], "/api/v1/nodes/node-b/undelivered",
                {"batches": [report(99, start)]}).status_code == 201
    assert requests.get(f"{live_server.url}/healthz", timeout=30).status_code == before
    # A node reports only for itself: node-b's token on node-a's path is refused.
    assert post(live_server, nodes["node-b"], "/api/v1/nodes/node-a/undelivered",
                {"batches": [report(98, start)]}).status_code == 403
    assert not UndeliveredBatch.objects.filter(node__name="node-a").exists()


def test_an_undelivered_report_is_checked_against_the_stored_batches(live_server, nodes, start):
    batch = make_batch(node="node-a", seq=5, start=start)
    body = json.dumps(batch).encode()
    assert requests.post(f"{live_server.url}/api/v1/usage/batches", data=body, timeout=30,
                         headers={"Authorization": f"Bearer {nodes['node-a']}",
                                  "Content-Type": "application/json"}).status_code == 201
    # The batch the service stored, reported as undelivered: not undelivered, nothing recorded.
    resp = post(live_server, nodes["node-a"], "/api/v1/nodes/node-a/undelivered",
                {"batches": [report(5, start, sha=hashlib.sha256(body).hexdigest())]})
    assert (resp.status_code, resp.json()["accepted"]) == (201, 0)
    assert not UndeliveredBatch.objects.exists()
    # Windows no batch of this node can have: longer than a batch spans, or in the future.
    for bad in (report(6, start, seconds=7200), report(7, clock.now() + timedelta(hours=2))):
        resp = post(live_server, nodes["node-a"], "/api/v1/nodes/node-a/undelivered", {"batches": [bad]})
        assert resp.status_code == 400, resp.text
    assert not UndeliveredBatch.objects.exists()


def test_anonymous_healthz_says_the_status_and_nothing_else(live_server, nodes):
    anonymous = requests.get(f"{live_server.url}/healthz", timeout=30)
    assert set(anonymous.json()) == {"status"}
    assert "worker" not in anonymous.text
    assert "backlog" not in anonymous.text
    new_user("sre", is_staff=True)
    api = issue_api_token(username="sre", name="t", expires_at=None, now=clock.now(), actor_label="test").token
    detailed = requests.get(f"{live_server.url}/healthz", headers={"Authorization": f"Bearer {api}"}, timeout=30)
    assert detailed.status_code == anonymous.status_code
    assert {"database", "broker", "worker", "ledger"} <= set(detailed.json())
    assert "undelivered_batches" in detailed.json()["ledger"]
    # A node's token is no admin credential.
    as_node = requests.get(f"{live_server.url}/healthz", headers={"Authorization": f"Bearer {nodes['node-a']}"},
                           timeout=30)
    assert set(as_node.json()) == {"status"}
    assert requests.get(f"{live_server.url}/readyz", timeout=30).status_code == 200
