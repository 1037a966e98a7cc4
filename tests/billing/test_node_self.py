"""A node speaks only for itself, at the service's own edge: the namespace → tenant mapping in both
of its modes and how admins set it, pod metadata per node (a pod that moves keeps each node's), and
the undelivered threshold of /healthz."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from billing.errors import InvalidInput
from billing.ledger.models import UsageMinute, WorkloadMeta
from billing.ledger.workloads import workload_meta
from billing.models import AuditEvent, Node, Tenant
from billing.services.identity.tokens import issue_node_token
from billing.services.ingest.rollup import run_rollup
from billing.services.ingest.tenant_mapping import set_tenant_namespaces
from tests import clock
from tests.conftest import healthz_as_admin, make_batch

FORGED = [{"gpu": 0, "tenant": "globex", "namespace": "acme-prod", "pod": "bert-1", "mem_used": 1.0,
           "mem_granted": 1.0, "sm_used": 1.0, "sm_granted": 1.0},
          {"gpu": 0, "tenant": "pentest", "namespace": "lab", "pod": "x-1", "mem_used": 1.0, "mem_granted": 1.0,
           "sm_used": 1.0, "sm_granted": 1.0}]


def billed_tenants() -> dict[str, str]:
    run_rollup(now=clock.now())
    return dict(UsageMinute.objects.values_list("namespace", "tenant").distinct())


@pytest.mark.parametrize(("rule", "lab"), [("claim", "pentest"), ("namespace", "lab")])
def test_a_mapped_namespace_is_its_tenants_whatever_the_claim(post_batch, minute_start, settings, rule, lab):
    settings.VGPU_TENANT_UNMAPPED = rule
    Tenant.objects.create(slug="acme", name="Acme", namespaces=["acme-prod"])
    assert post_batch(make_batch(start=minute_start, workloads=FORGED)).status_code == 201
    assert billed_tenants() == {"acme-prod": "acme", "lab": lab}
    expected = 10 if rule == "claim" else 20  # samples whose claim was overridden
    assert Node.objects.get(name="gpu-node-1").tenant_claim_mismatches == expected


def test_a_retry_is_still_a_duplicate_and_counts_nothing_twice(post_batch, minute_start):
    Tenant.objects.create(slug="acme", name="Acme", namespaces=["acme-prod"])
    batch = make_batch(start=minute_start, workloads=FORGED)
    assert post_batch(batch).status_code == 201
    assert post_batch(batch).json()["status"] == "duplicate"
    assert Node.objects.get(name="gpu-node-1").tenant_claim_mismatches == 10


def test_honest_samples_count_no_mismatch(post_batch, minute_start, settings):
    settings.VGPU_TENANT_UNMAPPED = "namespace"
    Tenant.objects.create(slug="acme", name="Acme", namespaces=["acme-prod"])
    honest = [dict(FORGED[0], tenant="acme"), dict(FORGED[1], tenant="unattributed", namespace="unattributed")]
    assert post_batch(make_batch(start=minute_start, workloads=honest)).status_code == 201
    assert billed_tenants() == {"acme-prod": "acme", "unattributed": "unattributed"}
    assert Node.objects.get(name="gpu-node-1").tenant_claim_mismatches == 0


def test_admins_set_the_mapping_audited_and_a_namespace_has_one_tenant(db):
    Tenant.objects.create(slug="acme", name="Acme")
    Tenant.objects.create(slug="globex", name="Globex", namespaces=["globex-prod"])
    call_command("tenant_namespaces", "acme", "acme-prod", "acme-staging", "--set")
    assert Tenant.objects.get(slug="acme").namespaces == ["acme-prod", "acme-staging"]
    audit = AuditEvent.objects.get(action="tenant.namespaces_changed")
    assert (audit.actor_label, audit.object_id, audit.before, audit.after) == (
        "cli", "acme", {"namespaces": []}, {"namespaces": ["acme-prod", "acme-staging"]})
    with pytest.raises(CommandError, match="globex-prod \\(globex\\)"):
        call_command("tenant_namespaces", "acme", "globex-prod", "--set")
    with pytest.raises(InvalidInput, match="Not_A_Namespace"):
        set_tenant_namespaces(slug="acme", namespaces=["Not_A_Namespace"], now=clock.now(), actor_label="t")
    assert Tenant.objects.get(slug="acme").namespaces == ["acme-prod", "acme-staging"]
    assert AuditEvent.objects.filter(action="tenant.namespaces_changed").count() == 1


def test_a_pod_that_moves_between_nodes_keeps_each_nodes_metadata(post_batch, minute_start):
    other = issue_node_token(node_name="gpu-node-2", now=clock.now(), actor_label="test")
    first = make_batch(start=minute_start)
    for s in first["samples"]:
        s.update(controller_kind="Deployment", controller_name="bert", labels={"app": "nlp"})
    assert post_batch(first).status_code == 201
    moved = make_batch(node="gpu-node-2", start=minute_start + timedelta(minutes=1))
    for s in moved["samples"]:
        s.update(controller_kind="Deployment", controller_name="bert", labels={"app": "nlp", "moved": "yes"})
    assert post_batch(moved, token=other.token).status_code == 201
    rows = {r.node.name: r.labels for r in WorkloadMeta.objects.select_related("node")}
    assert rows == {"gpu-node-1": {"app": "nlp"}, "gpu-node-2": {"app": "nlp", "moved": "yes"}}
    # The pod-keyed read answers with the newest report.
    (meta,) = workload_meta([("acme-prod", "bert-1", "uid-bert-1")]).values()
    assert meta.labels == {"app": "nlp", "moved": "yes"}


def _reports(n: int, start):
    return {"batches": [{"batch_seq": 1000 + i, "window": {"start": (start + timedelta(seconds=10 * i)).isoformat()
                                                                    .replace("+00:00", "Z"),
                                                           "end": (start + timedelta(seconds=10 * i + 10)).isoformat()
                                                                  .replace("+00:00", "Z")},
                         "samples": 1, "size_bytes": 1, "status": 400, "reason": "r", "content_sha256": "0" * 64,
                         "superseded_by": None} for i in range(n)]}


def test_undelivered_reports_degrade_health_only_past_the_threshold(client, node_token, minute_start, settings):
    import json
    settings.VGPU_HEALTH_MAX_UNDELIVERED_BATCHES = 2

    def send(n: int) -> None:
        resp = client.post("/api/v1/nodes/gpu-node-1/undelivered", json.dumps(_reports(n, minute_start)),
                           content_type="application/json", HTTP_AUTHORIZATION=f"Bearer {node_token.token}")
        assert resp.status_code == 201, resp.content

    send(2)
    ledger = healthz_as_admin().json()["ledger"]
    assert ledger["undelivered_batches"] == 2
    assert ledger["max_undelivered_batches"] == 2
    assert "undelivered" not in ledger.get("error", "")
    send(3)
    ledger = healthz_as_admin().json()["ledger"]
    assert ledger["undelivered_batches"] == 3
    assert not ledger["ok"]
    assert "ingest refused" in ledger["error"]


def test_the_demo_maps_every_namespace_its_agents_use(db):
    from agents.backends.sim import demo_scenario
    from billing.services.demo import DEMO_TENANTS, load_demo_data
    from billing.services.ingest.tenant_mapping import namespace_tenants, tenant_for

    load_demo_data(now=clock.now())
    load_demo_data(now=clock.now())  # idempotent: the mapping is set once, audited once per tenant
    mapping = namespace_tenants()
    tenants = [(slug, tier) for slug, _, tier in DEMO_TENANTS]
    for node in ("sim-a100-1", "sim-a100-2", "sim-a100-3"):
        for w in demo_scenario(node, seed=7, tenants=tenants)["workloads"]:
            assert w["namespace"] in mapping
            assert tenant_for(w["namespace"], "x", mapping) == w["tenant"]
    assert AuditEvent.objects.filter(action="tenant.namespaces_changed").count() == len(DEMO_TENANTS)
