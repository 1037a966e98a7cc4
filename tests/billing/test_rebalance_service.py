"""Pool rebalancing in the service: the pool from ledger rows, stored dry-run plans, audited
admin decisions, and execution against a Kubernetes API server over real HTTP."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest
from django.contrib.auth.models import Group, User
from kubernetes import client as kube_client

from agents.testing import FakeKubernetes
from billing.ledger.models import UsageMinute
from billing.models import AuditEvent, Gpu, Node, RateCard, RebalancePlan
from billing.scope import ADMIN_GROUP
from billing.services.rebalance import (
    KubernetesApi,
    approve_plan,
    build_pool,
    confirmation_code,
    execute_plan,
    propose_rebalance,
    reject_plan,
)

pytestmark = pytest.mark.django_db

NOW = datetime(2025, 3, 10, 12, 0, tzinfo=UTC)
A100 = "NVIDIA A100-SXM4-80GB"


def usage(node: Node, gpu: str, minute: datetime, *, pod: str, uid: str, mem_mb: float, sms: float,
          namespace: str = "acme-prod", container: str = "main") -> None:
    zero = Decimal(0)
    UsageMinute.objects.create(
        minute=minute, gpu_uuid=gpu, node=node, tenant="acme", namespace=namespace, pod=pod,
        container=container, pod_uid=uid, sla_tier="standard", seconds=Decimal(60),
        mem_used_mb_s=Decimal(str(mem_mb * 60)), mem_granted_mb_s=zero, mem_billed_mb_s=zero,
        sm_used_s=Decimal(str(sms * 60)), sm_granted_s=zero, sm_billed_s=zero, pcie_mb=zero,
        share_gpu_s=zero, charge=zero, idle_share=zero,
    )


@pytest.fixture
def fleet(db):
    """Two nodes of two A100s; four small pods, one per GPU, seen over the last 30 minutes."""
    RateCard.objects.create(gpu_model=A100, currency="USD", price_per_gpu_hour=Decimal("5.12"),
                            effective_from=NOW - timedelta(days=30), source_url="https://example.com/p4de")
    pods = {}
    for n in ("node-a", "node-b"):
        node = Node.objects.create(name=n)
        for i in range(2):
            uuid = f"GPU-{n}-{i}"
            Gpu.objects.create(uuid=uuid, node=node, model=A100, memory_mb=81920, sm_count=108,
                               first_seen_at=NOW - timedelta(days=1), last_seen_at=NOW)
            pod = f"bert-{n[-1]}{i}"
            uid = f"uid-{pod}"
            pods[pod] = (node, uuid, uid)
            for m in range(30):
                # a peak of 500 MB / 10.8 SMs (100 SM milli) at minute 7, else less
                peak = m == 7
                usage(node, uuid, NOW - timedelta(minutes=30 - m), pod=pod, uid=uid,
                      mem_mb=500 if peak else 400, sms=10.8 if peak else 5.4)
    return pods


def test_build_pool_reads_gpus_placements_and_peak_demand(fleet):
    node_a = Node.objects.get(name="node-a")
    # A second container of bert-a0 on the same GPU adds to the pod's per-minute demand.
    usage(node_a, "GPU-node-a-0", NOW - timedelta(minutes=20), pod="bert-a0", uid="uid-bert-a0",
          mem_mb=100, sms=0, container="sidecar")
    # A two-GPU pod on node-b is placed but pinned; a pod gone for an hour is not placed.
    node_b = Node.objects.get(name="node-b")
    for i in range(2):
        usage(node_b, f"GPU-node-b-{i}", NOW - timedelta(minutes=2), pod="train", uid="uid-train",
              mem_mb=1000, sms=54)
    usage(node_b, "GPU-node-b-0", NOW - timedelta(hours=1), pod="old", uid="uid-old", mem_mb=1, sms=1)

    ledger = build_pool(NOW)
    assert ledger is not None
    pool = ledger.pool
    assert [(n.name, n.gpus, n.gpu_memory_mb, n.model) for n in pool.nodes] == [
        ("node-a", 2, 81920, A100), ("node-b", 2, 81920, A100)]
    by_key = {w.key: w for w in pool.workloads}
    assert set(by_key) == {"acme-prod/bert-a0", "acme-prod/bert-a1", "acme-prod/bert-b0", "acme-prod/bert-b1",
                           "acme-prod/train"}
    assert (by_key["acme-prod/bert-a1"].memory_mb, by_key["acme-prod/bert-a1"].sm_milli) == (500, 100)
    assert by_key["acme-prod/bert-a0"].memory_mb == 500  # 400 + 100 at minute 10 ties the peak
    assert by_key["acme-prod/bert-a0"].node == "node-a" and by_key["acme-prod/bert-a0"].gpus == (0,)
    train = by_key["acme-prod/train"]
    assert train.gpus == (0, 1) and not train.movable and (train.memory_mb, train.sm_milli) == (1000, 500)
    assert ledger.pods["acme-prod/bert-b1"]["pod_uid"] == "uid-bert-b1"


def test_build_pool_peak_sums_containers_in_a_minute(fleet):
    node_a = Node.objects.get(name="node-a")
    usage(node_a, "GPU-node-a-0", NOW - timedelta(minutes=23), pod="bert-a0", uid="uid-bert-a0",
          mem_mb=300, sms=10.8, container="sidecar")  # minute 7: 500 + 300 MB, 100 + 100 SM milli
    ledger = build_pool(NOW)
    assert ledger is not None
    a0 = next(w for w in ledger.pool.workloads if w.key == "acme-prod/bert-a0")
    assert (a0.memory_mb, a0.sm_milli) == (800, 200)


def test_propose_stores_a_dry_run_plan_that_frees_gpus_and_a_node(fleet):
    plan = propose_rebalance(now=NOW, max_moves=10)
    assert plan is not None and plan.status == "proposed"
    assert len(plan.moves) == 3 and plan.gpus_freed == 3 and plan.nodes_freed == 1
    assert plan.projected_savings == Decimal("11212.80")  # 3 × 730 h × 5.12
    assert plan.currency == "USD" and plan.pool_gpus == 4
    assert len(plan.summary["freed_nodes"]) == 1
    moved = [m["workload"] for m in plan.moves]
    assert len(set(moved)) == len(moved)  # never a pod twice
    assert all(m["pod_uid"] == f"uid-{m['pod']}" for m in plan.moves)
    p95 = plan.right_sizing["estimates"][0]
    assert p95["percentile"] == 95 and p95["gpus_needed"] == 1 and p95["current_gpus"] == 4
    assert p95["monthly_cost_difference"] == "11212.80"
    assert plan.log == []  # dry run: nothing executed
    # K caps the moves; proposing the same plan twice stores it once.
    assert propose_rebalance(now=NOW, max_moves=10).pk == plan.pk
    small = propose_rebalance(now=NOW, max_moves=1)
    assert small is not None and len(small.moves) == 1 and small.gpus_freed == 1
    assert RebalancePlan.objects.count() == 2


def test_propose_without_a_fleet_stores_nothing(db):
    assert propose_rebalance(now=NOW, max_moves=10) is None
    assert not RebalancePlan.objects.exists()


def login(client, *, admin: bool) -> User:
    user = User.objects.create_user(username=f"admin{admin}", password="pw-not-used-123")
    if admin:
        user.groups.add(Group.objects.get_or_create(name=ADMIN_GROUP)[0])
    client.force_login(user)
    return user


def test_only_admins_see_and_decide_plans(client, fleet):
    plan = propose_rebalance(now=NOW, max_moves=10)
    assert plan is not None
    login(client, admin=False)
    assert client.get("/rebalance/").status_code == 403
    assert client.post(f"/rebalance/{plan.pk}/approve/").status_code == 403
    plan.refresh_from_db()
    assert plan.status == "proposed" and not AuditEvent.objects.exists()


def test_admin_approves_on_the_page_audited_and_execution_enqueued(client, fleet, monkeypatch,
                                                                   django_capture_on_commit_callbacks):
    from billing import tasks

    plan = propose_rebalance(now=NOW, max_moves=10)
    assert plan is not None
    calls = []
    monkeypatch.setattr(tasks.execute_rebalance, "delay", lambda plan_id: calls.append(plan_id))
    user = login(client, admin=True)
    page = client.get("/rebalance/")
    assert page.status_code == 200 and "11,212.80 USD" in page.content.decode() and b"bert-" in page.content
    assert client.get(f"/rebalance/{plan.pk}/reject/").status_code == 405  # POST only
    with django_capture_on_commit_callbacks(execute=True):
        assert client.post(f"/rebalance/{plan.pk}/approve/",
                           {"confirmation": confirmation_code(plan)}).status_code == 302
    plan.refresh_from_db()
    assert plan.status == "approved" and plan.decided_by == user
    assert calls == [plan.pk]
    event = AuditEvent.objects.get(action="rebalance.approve")
    assert event.actor == user and event.object_id == str(plan.pk)
    # A decided plan cannot be rejected afterwards; the refusal changes nothing.
    client.post(f"/rebalance/{plan.pk}/reject/")
    plan.refresh_from_db()
    assert plan.status == "approved"


def test_reject_is_audited_and_a_rejected_plan_never_executes(fleet):
    plan = propose_rebalance(now=NOW, max_moves=10)
    assert plan is not None
    reject_plan(plan.pk, now=NOW, actor_label="ops")
    assert AuditEvent.objects.filter(action="rebalance.reject", object_id=str(plan.pk)).count() == 1
    with FakeKubernetes() as fake:
        done = execute_plan(plan.pk, kube=_kube(fake), now=NOW)
        assert done.status == "rejected" and fake.requests == []


def _kube(fake: FakeKubernetes) -> KubernetesApi:
    configuration = kube_client.Configuration()
    configuration.host = fake.url
    return KubernetesApi(kube_client.ApiClient(configuration))


def _cluster(fake: FakeKubernetes, fleet) -> None:
    for name in ("node-a", "node-b"):
        fake.add_node({"metadata": {"name": name}, "spec": {}})
    for pod, (node, _gpu, uid) in fleet.items():
        fake.add_pod({"metadata": {"name": pod, "namespace": "acme-prod", "uid": uid},
                      "spec": {"nodeName": node.name}, "status": {"phase": "Running"}})


def test_execution_cordons_freed_nodes_and_evicts_moved_pods_once(fleet):
    plan = propose_rebalance(now=NOW, max_moves=10)
    assert plan is not None
    approve_plan(plan.pk, confirmation=confirmation_code(plan), now=NOW, actor_label="ops")
    freed = plan.summary["freed_nodes"][0]
    with FakeKubernetes() as fake:
        _cluster(fake, fleet)
        kube = _kube(fake)
        done = execute_plan(plan.pk, kube=kube, now=NOW)
        assert done.status == "done", done.error
        assert fake.get_node(freed)["spec"]["unschedulable"] is True
        kept = ({"node-a", "node-b"} - {freed}).pop()
        assert not fake.get_node(kept)["spec"].get("unschedulable")
        evicted = sorted(e["metadata"]["name"] for e in fake.evictions)
        assert evicted == sorted(m["pod"] for m in plan.moves)
        assert all(e["deleteOptions"]["preconditions"]["uid"] == f"uid-{e['metadata']['name']}"
                   for e in fake.evictions)
        assert [e["step"] for e in done.log] == ["start", "cordon", "evict", "evict", "evict", "finish"]
        assert AuditEvent.objects.filter(action__startswith="rebalance.", object_id=str(plan.pk)).count() == 7
        # Run twice: a done plan is a no-op (no request reaches the API server).
        before = len(fake.requests)
        again = execute_plan(plan.pk, kube=kube, now=NOW)
        assert again.status == "done" and len(again.log) == len(done.log) and len(fake.requests) == before


def test_a_pod_disruption_budget_refusal_is_recorded_and_the_rest_continues(fleet):
    plan = propose_rebalance(now=NOW, max_moves=10)
    assert plan is not None
    approve_plan(plan.pk, confirmation=confirmation_code(plan), now=NOW, actor_label="ops")
    with FakeKubernetes() as fake:
        _cluster(fake, fleet)
        fake.refuse_evictions = True
        done = execute_plan(plan.pk, kube=_kube(fake), now=NOW)
    assert done.status == "done"
    blocked = [e for e in done.log if e.get("outcome") == "blocked"]
    assert len(blocked) == 3 and "429" in blocked[0]["detail"]
    assert "PodDisruptionBudget" in done.error and fake.evictions == []
    assert AuditEvent.objects.filter(action="rebalance.evict", object_id=str(plan.pk)).count() == 3


def test_a_stale_plan_is_refused_before_touching_the_cluster(fleet):
    plan = propose_rebalance(now=NOW, max_moves=10)
    assert plan is not None
    approve_plan(plan.pk, confirmation=confirmation_code(plan), now=NOW, actor_label="ops")
    with FakeKubernetes() as fake:
        # An hour later the pods are gone from the ledger: the moves no longer replay.
        done = execute_plan(plan.pk, kube=_kube(fake), now=NOW + timedelta(hours=1))
        assert done.status == "failed" and "no longer fits" in done.error and fake.requests == []


def test_an_unapproved_plan_is_not_executed(fleet):
    plan = propose_rebalance(now=NOW, max_moves=10)
    assert plan is not None
    with FakeKubernetes() as fake:
        assert execute_plan(plan.pk, kube=_kube(fake), now=NOW).status == "proposed"
        assert fake.requests == []


def test_finance_reads_plans_and_savings_but_cannot_decide(client, fleet):
    from billing.scope import FINANCE_GROUP

    plan = propose_rebalance(now=NOW, max_moves=10)
    assert plan is not None
    user = User.objects.create_user(username="fin", password="pw-not-used-123")
    user.groups.add(Group.objects.get_or_create(name=FINANCE_GROUP)[0])
    client.force_login(user)
    html = client.get("/rebalance/").content.decode()
    assert f'data-testid="rebalance-plan-{plan.pk}"' in html and "Approve and execute" not in html
    assert client.post(f"/rebalance/{plan.pk}/approve/").status_code == 403
