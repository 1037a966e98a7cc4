"""Pool rebalancing in the service: the pool from ledger rows, stored dry-run plans, audited
admin decisions, and execution against a Kubernetes API server over real HTTP."""

from __future__ import annotations

import re
import socket
import subprocess
from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest
import time_machine
from django.contrib.auth.models import Group, User
from kubernetes import client as kube_client

from agents.fakes.kube import FakeKubernetes
from billing.errors import InvalidInput
from billing.ledger.models import UsageMinute
from billing.models import AuditEvent, Gpu, Node, RateCard, RebalancePlan
from billing.scope import ADMIN_GROUP
from billing.services.fleet.rebalance import (
    KubernetesApi,
    approve_plan,
    build_pool,
    capacity_lines,
    confirmation_code,
    execute_plan,
    kube_from_settings,
    plan_steps,
    propose_rebalance,
    reject_plan,
    run_execution,
)
from billing.services.identity.kube_api import new_api_client
from tests.conftest import new_user

pytestmark = pytest.mark.django_db

NOW = datetime(2025, 3, 10, 12, 0, tzinfo=UTC)
A100 = "NVIDIA A100-SXM4-80GB"


def usage(node: Node, gpu: str, minute: datetime, *, pod: str, uid: str, mem_mb: float, sms: float,
          namespace: str = "acme-prod", container: str = "main", granted_mb: float = 0,
          granted_sms: float = 0) -> None:
    """A minute of steady use under a steady grant (the agent's reservation): billed is max(used,
    granted) every second, as the agent sums it."""
    zero = Decimal(0)
    UsageMinute.objects.create(
        minute=minute, gpu_uuid=gpu, node=node, tenant="acme", namespace=namespace, pod=pod,
        container=container, pod_uid=uid, sla_tier="standard", seconds=Decimal(60),
        mem_used_mb_s=Decimal(str(mem_mb * 60)), mem_granted_mb_s=Decimal(str(granted_mb * 60)),
        mem_billed_mb_s=Decimal(str(max(mem_mb, granted_mb) * 60)), sm_used_s=Decimal(str(sms * 60)),
        sm_granted_s=Decimal(str(granted_sms * 60)), sm_billed_s=Decimal(str(max(sms, granted_sms) * 60)),
        pcie_mb=zero, share_gpu_s=zero, charge=zero, idle_share=zero,
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
    assert by_key["acme-prod/bert-a0"].node == "node-a"
    assert by_key["acme-prod/bert-a0"].gpus == (0,)
    train = by_key["acme-prod/train"]
    assert train.gpus == (0, 1)
    assert not train.movable
    assert (train.memory_mb, train.sm_milli) == (1000, 500)
    assert ledger.pods["acme-prod/bert-b1"]["pod_uid"] == "uid-bert-b1"


def test_build_pool_peak_sums_containers_in_a_minute(fleet):
    node_a = Node.objects.get(name="node-a")
    usage(node_a, "GPU-node-a-0", NOW - timedelta(minutes=23), pod="bert-a0", uid="uid-bert-a0",
          mem_mb=300, sms=10.8, container="sidecar")  # minute 7: 500 + 300 MB, 100 + 100 SM milli
    ledger = build_pool(NOW)
    assert ledger is not None
    a0 = next(w for w in ledger.pool.workloads if w.key == "acme-prod/bert-a0")
    assert (a0.memory_mb, a0.sm_milli) == (800, 200)


def test_build_pool_demand_is_the_reservation_not_the_mean_use(fleet):
    # bert-a1 used 400-500 MB and 5.4-10.8 SMs, but the agent reserved 60000 MB and 54 SMs for it
    # (its bursts' peak x its margin) in the last minute: it is planned at its reservation.
    node_a = Node.objects.get(name="node-a")
    UsageMinute.objects.filter(pod="bert-a1", minute=NOW - timedelta(minutes=1)).delete()
    usage(node_a, "GPU-node-a-1", NOW - timedelta(minutes=1), pod="bert-a1", uid="uid-bert-a1", mem_mb=400, sms=5.4,
          granted_mb=60000, granted_sms=54)
    # bert-a0's use rose above its grant for half a minute: 1000 MB for 30 s under a 500 MB grant,
    # then 0: mean use 500, mean grant 500, billed max(used, granted) = 750 MB on average.
    UsageMinute.objects.filter(pod="bert-a0", minute=NOW - timedelta(minutes=2)).update(
        mem_used_mb_s=Decimal(30000), mem_granted_mb_s=Decimal(30000), mem_billed_mb_s=Decimal(45000))
    ledger = build_pool(NOW)
    assert ledger is not None
    by_key = {w.key: w for w in ledger.pool.workloads}
    assert (by_key["acme-prod/bert-a1"].memory_mb, by_key["acme-prod/bert-a1"].sm_milli) == (60000, 500)
    assert by_key["acme-prod/bert-a0"].memory_mb == 750
    a1 = next(s for s in ledger.series if s.key == "acme-prod/bert-a1#GPU-node-a-1")
    assert (a1.memory_mb[-1], a1.sm_milli[-1]) == (60000, 500)  # right-sizing reads the same demand


def test_pods_whose_reservations_do_not_fit_together_are_not_packed_by_their_mean_use(fleet):
    # Every pod reserved 60000 MB in its last minute: two of them on one 81920 MB card would be cut
    # by fair share, so no node can be emptied, though their mean use (400 MB) would fit all four on one.
    for pod, (node, uuid, uid) in fleet.items():
        UsageMinute.objects.filter(pod=pod, minute=NOW - timedelta(minutes=1)).delete()
        usage(node, uuid, NOW - timedelta(minutes=1), pod=pod, uid=uid, mem_mb=400, sms=5.4, granted_mb=60000)
    plan = propose_rebalance(now=NOW, max_moves=10)
    assert plan is not None
    assert (plan.moves, plan.nodes_freed, plan.projected_savings) == ([], 0, Decimal(0))
    assert plan.summary["smallest_release"] is None  # no node's pods fit on the others
    assert plan.right_sizing["estimates"][1]["gpus_needed"] == 4  # P99: each pod's reservation on its own card


def test_propose_stores_a_dry_run_plan_that_empties_a_node_with_the_fewest_evictions(fleet):
    plan = propose_rebalance(now=NOW, max_moves=10)
    assert plan is not None
    assert plan.status == "proposed"
    # One node's two pods move onto the other node's GPUs: the node, both its GPUs, is handed back.
    # (Moving a third pod would free one more GPU, on a node that stays: not handed back, not done.)
    assert len(plan.moves) == 2
    assert plan.nodes_freed == 1
    assert plan.summary["gpus_released"] == 2
    assert plan.gpus_freed == 2
    assert plan.projected_savings == Decimal("7475.20")  # 2 × 730 h × 5.12
    assert plan.currency == "USD"
    assert plan.pool_gpus == 4
    assert plan.summary["freed_nodes"] == ["node-a"]  # equal nodes: by name
    assert {m["from_node"] for m in plan.moves} == {"node-a"}
    moved = [m["workload"] for m in plan.moves]
    assert len(set(moved)) == len(moved)  # never a pod twice
    assert all(m["pod_uid"] == f"uid-{m['pod']}" for m in plan.moves)
    p95 = plan.right_sizing["estimates"][0]
    assert p95["percentile"] == 95
    assert p95["gpus_needed"] == 1
    assert p95["current_gpus"] == 4
    # One GPU is needed, but only whole nodes go: one node of two GPUs is kept, one handed back.
    assert (p95["whole_node_gpus"], p95["gpus_released"], p95["monthly_difference"]) == (2, 2, "7475.20")
    assert plan.log == []  # dry run: nothing executed
    # K caps the moves; proposing the same plan twice stores it once.
    again = propose_rebalance(now=NOW, max_moves=10)
    assert again is not None
    assert again.pk == plan.pk
    # Under K = 1 no node can be emptied: the plan moves nothing, claims nothing, and says what
    # emptying one would take.
    small = propose_rebalance(now=NOW, max_moves=1)
    assert small is not None
    assert (small.moves, small.nodes_freed, small.projected_savings) == ([], 0, Decimal(0))
    assert small.summary["smallest_release"] == {"node": "node-a", "evictions": 2}
    assert RebalancePlan.objects.count() == 2
    with pytest.raises(InvalidInput, match="frees no node"):
        approve_plan(small.pk, confirmation=confirmation_code(small), now=NOW, actor_label="ops")


def test_propose_without_a_fleet_stores_nothing(db):
    assert propose_rebalance(now=NOW, max_moves=10) is None
    assert not RebalancePlan.objects.exists()


def login(client, *, admin: bool) -> User:
    user = new_user(f"admin{admin}")
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
    assert plan.status == "proposed"
    assert not AuditEvent.objects.exists()


def test_admin_approves_on_the_page_audited_and_execution_enqueued(client, fleet, monkeypatch,
                                                                   django_capture_on_commit_callbacks):
    from billing import tasks

    plan = propose_rebalance(now=NOW, max_moves=10)
    assert plan is not None
    calls: list[int] = []
    monkeypatch.setattr(tasks.execute_rebalance, "delay", calls.append)
    user = login(client, admin=True)
    page = client.get("/rebalance/")
    assert page.status_code == 200
    assert "7,475.20 USD" in page.content.decode()
    assert "Empties 1 node(s), handing back 2 GPU(s), with 2 eviction(s)" in page.content.decode()
    assert b"bert-" in page.content
    assert client.get(f"/rebalance/{plan.pk}/reject/").status_code == 405  # POST only
    with django_capture_on_commit_callbacks(execute=True):
        assert client.post(f"/rebalance/{plan.pk}/approve/",
                           {"confirmation": confirmation_code(plan)}).status_code == 302
    plan.refresh_from_db()
    assert plan.status == "approved"
    assert plan.decided_by == user
    assert calls == [plan.pk]
    event = AuditEvent.objects.get(action="rebalance.approve")
    assert event.actor == user
    assert event.object_id == str(plan.pk)
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
        assert done.status == "rejected"
        assert fake.requests == []


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
        assert [e["step"] for e in done.log] == ["start", "cordon", "evict", "evict", "finish"]
        assert AuditEvent.objects.filter(action__startswith="rebalance.", object_id=str(plan.pk)).count() == 6
        # Run twice: a done plan is a no-op (no request reaches the API server).
        before = len(fake.requests)
        again = execute_plan(plan.pk, kube=kube, now=NOW)
        assert again.status == "done"
        assert len(again.log) == len(done.log)
        assert len(fake.requests) == before


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
    assert len(blocked) == 2
    assert "429" in blocked[0]["detail"]
    assert "PodDisruptionBudget" in done.error
    assert fake.evictions == []
    assert AuditEvent.objects.filter(action="rebalance.evict", object_id=str(plan.pk)).count() == 2


def test_a_stale_plan_is_refused_before_touching_the_cluster(fleet):
    plan = propose_rebalance(now=NOW, max_moves=10)
    assert plan is not None
    approve_plan(plan.pk, confirmation=confirmation_code(plan), now=NOW, actor_label="ops")
    with FakeKubernetes() as fake:
        # An hour later the pods are gone from the ledger: the moves no longer replay.
        done = execute_plan(plan.pk, kube=_kube(fake), now=NOW + timedelta(hours=1))
        assert done.status == "failed"
        assert "no longer fits" in done.error
        assert fake.requests == []


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
    user = new_user("fin")
    user.groups.add(Group.objects.get_or_create(name=FINANCE_GROUP)[0])
    client.force_login(user)
    html = client.get("/rebalance/").content.decode()
    assert f'data-testid="rebalance-plan-{plan.pk}"' in html
    assert "Approve and execute" not in html
    assert client.post(f"/rebalance/{plan.pk}/approve/").status_code == 403


# -- the confirmation step ------------------------------------------------------------------


def test_approving_goes_through_a_confirmation_page_that_names_every_cordon_and_eviction(
        client, fleet, monkeypatch, django_capture_on_commit_callbacks):
    from billing import tasks

    plan = propose_rebalance(now=NOW, max_moves=10)
    assert plan is not None
    calls: list[int] = []
    monkeypatch.setattr(tasks.execute_rebalance, "delay", calls.append)
    login(client, admin=True)
    listing = client.get("/rebalance/").content.decode()
    assert f'href="/rebalance/{plan.pk}/approve/"' in listing  # a link to the confirmation, not a POST

    page = client.get(f"/rebalance/{plan.pk}/approve/")
    html = page.content.decode()
    assert page.status_code == 200
    assert html.count('data-testid="confirm-cordon"') == 1
    assert plan.summary["freed_nodes"][0] in html
    assert html.count('data-testid="confirm-eviction"') == 2
    assert "handing back their 2 GPU(s) saves 7,475.20 USD a month" in html
    for move in plan.moves:
        assert f"acme-prod/{move['pod']}" in html
    assert 'name="csrfmiddlewaretoken"' in html
    assert confirmation_code(plan) in html
    assert 'data-testid="rebalance-cancel" ' in html or 'data-testid="rebalance-cancel"' in html

    # A POST without the page's code, or with another plan's list, approves nothing.
    with django_capture_on_commit_callbacks(execute=True):
        refused = client.post(f"/rebalance/{plan.pk}/approve/")
        assert refused.status_code == 302
        assert refused["Location"] == f"/rebalance/{plan.pk}/approve/"
        client.post(f"/rebalance/{plan.pk}/approve/", {"confirmation": "0" * 20})
    plan.refresh_from_db()
    assert plan.status == "proposed"
    assert calls == []
    assert not AuditEvent.objects.exists()

    with django_capture_on_commit_callbacks(execute=True):
        client.post(f"/rebalance/{plan.pk}/approve/", {"confirmation": confirmation_code(plan)})
    plan.refresh_from_db()
    assert plan.status == "approved"
    assert calls == [plan.pk]
    # The confirmation page of a decided plan sends the admin back to the list.
    assert client.get(f"/rebalance/{plan.pk}/approve/")["Location"] == "/rebalance/"


def test_the_confirmation_code_changes_with_what_would_be_evicted(fleet):
    plan = propose_rebalance(now=NOW, max_moves=10)
    # A third pod on node-a: node-b becomes the node with the fewest evictions.
    usage(Node.objects.get(name="node-a"), "GPU-node-a-0", NOW - timedelta(minutes=2), pod="extra", uid="uid-extra",
          mem_mb=100, sms=1)
    other = propose_rebalance(now=NOW, max_moves=10)
    assert plan is not None
    assert other is not None
    assert other.summary["freed_nodes"] == ["node-b"]
    assert confirmation_code(plan) != confirmation_code(other)
    with pytest.raises(InvalidInput, match="confirmation page"):
        approve_plan(other.pk, confirmation=confirmation_code(plan), now=NOW, actor_label="ops")


def test_finance_gets_no_confirmation_page(client, fleet):
    from billing.scope import FINANCE_GROUP

    plan = propose_rebalance(now=NOW, max_moves=10)
    assert plan is not None
    user = new_user("fin")
    user.groups.add(Group.objects.get_or_create(name=FINANCE_GROUP)[0])
    client.force_login(user)
    assert client.get(f"/rebalance/{plan.pk}/approve/").status_code == 403


# -- execution outcomes ---------------------------------------------------------------------


def _approved(fleet) -> RebalancePlan:
    plan = propose_rebalance(now=NOW, max_moves=10)
    assert plan is not None
    return approve_plan(plan.pk, confirmation=confirmation_code(plan), now=NOW, actor_label="ops")


def _metric(client, settings, outcome: str) -> float:
    from prometheus_client.parser import text_string_to_metric_families

    settings.VGPU_METRICS_TOKEN, settings.VGPU_METRICS_TOKEN_FILE = "scrape-token-for-tests", ""
    resp = client.get("/metrics", HTTP_AUTHORIZATION="Bearer scrape-token-for-tests")
    assert resp.status_code == 200
    for family in text_string_to_metric_families(resp.content.decode()):
        for sample in family.samples:
            if sample.name == "vgpu_rebalance_executions_total" and sample.labels == {"outcome": outcome}:
                return float(sample.value)
    raise AssertionError(f"no vgpu_rebalance_executions_total{{outcome={outcome!r}}} in the exposition")


def test_a_failed_execution_shows_as_failed_on_the_page_in_the_audit_log_and_in_metrics(client, fleet, settings):
    plan = _approved(fleet)
    assert _metric(client, settings, "failed") == 0
    freed = plan.summary["freed_nodes"][0]
    with FakeKubernetes() as fake:
        # The node to cordon is not in the cluster: the API server answers 404.
        fake.add_node({"metadata": {"name": ({"node-a", "node-b"} - {freed}).pop()}, "spec": {}})
        done = execute_plan(plan.pk, kube=_kube(fake), now=NOW)
        assert fake.evictions == []
    assert done.status == "failed"
    assert done.error.startswith(f"cordon {freed}:")
    assert "404" in done.error

    event = AuditEvent.objects.get(action="rebalance.failed", object_id=str(plan.pk))
    assert event.after is not None
    assert event.after["status"] == "failed"
    assert event.after["error"] == done.error
    assert event.after["carried_out"] == []
    assert len(event.after["not_carried_out"]) == 3  # one cordon, two evictions
    assert not AuditEvent.objects.filter(action="rebalance.succeeded").exists()

    login(client, admin=True)
    html = client.get("/rebalance/").content.decode()
    assert f'data-testid="rebalance-failure-{plan.pk}"' in html
    assert "Execution failed" in html
    assert done.error.split(":")[0] in html
    assert "0 of 3 steps carried out" in html
    audit = client.get("/audit/").content.decode()
    assert "rebalance.failed" in audit
    assert _metric(client, settings, "failed") == 1
    assert _metric(client, settings, "succeeded") == 0


class _ApiGoesAway:
    """The real client against the fake API server for `calls` requests, then against a port
    where nothing listens (connection refused), as when the API server goes away mid-plan."""

    def __init__(self, fake: FakeKubernetes, calls: int) -> None:
        self.kube, self.calls = _kube(fake), calls

    def _count(self) -> None:
        self.calls -= 1
        if self.calls < 0:
            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                closed = s.getsockname()[1]
            self.kube = KubernetesApi(new_api_client(f"http://127.0.0.1:{closed}", retries=0))

    def cordon_node(self, name: str) -> None:
        self._count()
        self.kube.cordon_node(name)

    def evict_pod(self, *, namespace: str, name: str, uid: str) -> None:
        self._count()
        self.kube.evict_pod(namespace=namespace, name=name, uid=uid)


def test_a_partly_executed_plan_says_what_was_done_and_what_not(client, fleet):
    plan = _approved(fleet)
    with FakeKubernetes() as fake:
        _cluster(fake, fleet)
        done = execute_plan(plan.pk, kube=_ApiGoesAway(fake, calls=1), now=NOW)  # the cordon only
        assert fake.evictions == []
    assert done.status == "failed"
    assert done.error.startswith("evict acme-prod/")
    outcomes = [s.outcome for s in plan_steps(done)]
    assert outcomes == ["ok", "error", "pending"]
    event = AuditEvent.objects.get(action="rebalance.failed", object_id=str(plan.pk))
    assert event.after is not None
    assert len(event.after["carried_out"]) == 1
    assert event.after["not_carried_out"][-1].endswith(": pending")

    login(client, admin=True)
    html = client.get("/rebalance/").content.decode()
    assert "1 of 3 steps carried out" in html
    assert html.count('data-outcome="ok"') == 1
    assert html.count('data-outcome="pending"') == 1
    assert 'data-outcome="error"' in html
    assert "not done" in html


def test_no_kubernetes_api_fails_the_plan_instead_of_leaving_it_approved(fleet, settings):
    from billing import tasks

    plan = _approved(fleet)
    settings.VGPU_KUBE_API = ""  # and this is no pod in a cluster: the client cannot be built
    with time_machine.travel(NOW, tick=False):
        result = tasks.execute_rebalance(plan.pk)
    plan.refresh_from_db()
    assert result == {"plan": plan.pk, "status": "failed"}
    assert plan.error.startswith("no Kubernetes API client: ConfigException")
    assert [e["step"] for e in plan.log] == ["abort"]
    assert AuditEvent.objects.filter(action="rebalance.failed", object_id=str(plan.pk)).count() == 1
    # Failed is final: running the task again changes nothing.
    with time_machine.travel(NOW, tick=False):
        assert tasks.execute_rebalance(plan.pk)["status"] == "failed"
    plan.refresh_from_db()
    assert len(plan.log) == 1


def test_an_unexpected_error_mid_execution_fails_the_plan_with_the_reason(fleet):
    plan = _approved(fleet)

    class Broken:
        def cordon_node(self, name: str) -> None:
            raise RuntimeError("a bug, not an API answer")

        def evict_pod(self, *, namespace: str, name: str, uid: str) -> None:
            raise AssertionError("never reached")

    done = run_execution(plan.pk, connect=Broken, now=NOW)
    assert done.status == "failed"
    assert done.error == "execution stopped: RuntimeError: a bug, not an API answer"
    assert [e["step"] for e in done.log] == ["start", "abort"]
    assert [s.outcome for s in plan_steps(done)] == ["pending"] * 3


def test_outcomes_succeeded_and_partial_are_audited_and_counted(client, fleet, settings):
    plan = _approved(fleet)
    with FakeKubernetes() as fake:
        _cluster(fake, fleet)
        assert execute_plan(plan.pk, kube=_kube(fake), now=NOW).status == "done"
    event = AuditEvent.objects.get(action="rebalance.succeeded", object_id=str(plan.pk))
    assert event.after is not None
    assert len(event.after["carried_out"]) == 3
    assert event.after["not_carried_out"] == []
    assert _metric(client, settings, "succeeded") == 1

    second = _approved(fleet)  # the same moves again (the ledger has not changed)
    with FakeKubernetes() as fake:
        _cluster(fake, fleet)
        fake.delete_pod("acme-prod", second.moves[0]["pod"])  # gone: 404, skipped
        done = execute_plan(second.pk, kube=_kube(fake), now=NOW)
    assert done.status == "done"
    assert done.error == "1 pod(s) gone before their eviction"
    assert AuditEvent.objects.filter(action="rebalance.partial", object_id=str(second.pk)).count() == 1
    assert (_metric(client, settings, "succeeded"), _metric(client, settings, "partial"),
            _metric(client, settings, "failed")) == (1, 1, 0)
    login(client, admin=True)
    assert "not every eviction was carried out" in client.get("/rebalance/").content.decode()


# -- the plan's savings and right-sizing, one rule ------------------------------------------


def test_savings_and_right_sizing_are_one_rule_on_one_pool_in_whole_nodes_and_explained(client, fleet):
    plan = propose_rebalance(now=NOW, max_moves=10)
    assert plan is not None
    lines = {line.key: line for line in capacity_lines(plan)}
    assert list(lines) == ["pool", "busy", "after_plan", "p95", "p99"]
    month = Decimal(730) * Decimal("5.12")
    assert (lines["pool"].nodes, lines["pool"].gpus, lines["pool"].amount) == (2, 4, 4 * month)
    assert (lines["busy"].nodes, lines["busy"].gpus, lines["busy"].released_gpus, lines["busy"].amount) == (
        2, 4, 0, Decimal(0))
    after = lines["after_plan"]
    assert (after.nodes, after.gpus, after.released_nodes, after.released_gpus) == (1, 2, 1, 2)
    assert after.amount == plan.projected_savings == 2 * month
    p95 = plan.right_sizing["estimates"][0]
    # One GPU needed at P95; the fewest whole nodes holding it: one node, two GPUs.
    assert (lines["p95"].gpus, lines["p95"].whole_node_gpus, lines["p95"].released_gpus) == (1, 2, 2)
    assert lines["p95"].amount == Decimal(p95["monthly_difference"]) == 2 * month
    assert plan.right_sizing["hours_per_month"] == plan.summary["hours"] == "730"
    assert Decimal(plan.right_sizing["price_per_gpu_hour"]) == plan.price_per_gpu_hour

    login(client, admin=True)
    html = client.get("/rebalance/").content.decode()
    assert f'data-testid="rebalance-capacity-{plan.pk}"' in html
    assert "What these numbers mean" in html
    assert "the pool is short by that many, in nodes like its own" in html
    assert "a GPU freed on a node that stays busy saves nothing" in html
    assert 'data-testid="rebalance-why-' not in html  # nothing over capacity: nothing to reconcile


def test_a_short_pool_is_explained_where_right_sizing_needs_more_than_the_plan_keeps(client, fleet):
    # Two more pods on node-a/0, each near a whole GPU of SM at its own peak, at different minutes:
    # the GPU is over capacity at the pods' peaks, and right-sizing packs each at its P95.
    node_a = Node.objects.get(name="node-a")
    for k, pod in enumerate(("big-1", "big-2")):
        for m in range(30):
            usage(node_a, "GPU-node-a-0", NOW - timedelta(minutes=30 - m), pod=pod, uid=f"uid-{pod}",
                  mem_mb=1000, sms=100 if m % 2 == k else 10)
    plan = propose_rebalance(now=NOW, max_moves=10)
    assert plan is not None
    assert plan.summary["overcommitted_at_start"] == ["node-a/0 sm"]
    p95 = plan.right_sizing["estimates"][0]
    assert p95["gpus_needed"] > plan.summary["gpus_busy_after"]
    login(client, admin=True)
    html = client.get("/rebalance/").content.decode()
    assert f'data-testid="rebalance-why-{plan.pk}-p95"' in html
    assert "1 GPU is already over capacity at its workloads' peaks" in html


def test_the_service_exposition_with_rebalance_executions_passes_promtool(client, fleet, settings):
    from tests.promtool import promtool

    plan = _approved(fleet)
    settings.VGPU_KUBE_API = ""
    run_execution(plan.pk, connect=kube_from_settings, now=NOW)  # outside a cluster: failed
    settings.VGPU_METRICS_TOKEN, settings.VGPU_METRICS_TOKEN_FILE = "scrape-token-for-tests", ""
    text = client.get("/metrics", HTTP_AUTHORIZATION="Bearer scrape-token-for-tests").content.decode()
    assert re.search(r"^# TYPE vgpu_rebalance_executions(_total)? counter$", text, re.M)
    assert 'vgpu_rebalance_executions_total{outcome="failed"} 1.0' in text
    result = subprocess.run([promtool(), "check", "metrics"], input=text, capture_output=True, text=True,
                            check=False, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    assert not (result.stdout + result.stderr).strip(), result.stdout + result.stderr


def _ran(node: Node, gpu: str, minutes: range, *, pod: str, mem_mb: int, sms: float) -> None:
    zero = Decimal(0)
    UsageMinute.objects.bulk_create(UsageMinute(
        minute=NOW - timedelta(minutes=m), gpu_uuid=gpu, node=node, tenant="acme", namespace="acme-batch",
        pod=pod, container="main", pod_uid=f"uid-{pod}", sla_tier="standard", seconds=Decimal(60),
        mem_used_mb_s=Decimal(mem_mb * 60), mem_granted_mb_s=zero, mem_billed_mb_s=Decimal(mem_mb * 60),
        sm_used_s=Decimal(str(sms * 60)), sm_granted_s=zero, sm_billed_s=Decimal(str(sms * 60)), pcie_mb=zero,
        share_gpu_s=zero,
        charge=zero, idle_share=zero) for m in minutes)


def test_right_sizing_reads_the_fleets_demand_over_its_metered_minutes_not_zeros_before_a_pod_started(
        client, fleet):
    # A third node of two idle A100s: a pool of 6. Four batch pods used 70000 MB each from 20 h
    # to 31 min ago, then ended; the four small pods now running started 30 min ago. Counting the
    # small pods' minutes before they started as no demand (and the ended pods as none), P95 read
    # one GPU; the fleet's demand at its P95 minute is 4 × 70000 MB: 4 cards.
    node_c = Node.objects.create(name="node-c")
    for i in range(2):
        Gpu.objects.create(uuid=f"GPU-node-c-{i}", node=node_c, model=A100, memory_mb=81920, sm_count=108,
                           first_seen_at=NOW - timedelta(days=1), last_seen_at=NOW)
    for pod, (node, uuid, _uid) in sorted(fleet.items()):
        _ran(node, uuid, range(31, 20 * 60 + 1), pod=f"batch-{pod}", mem_mb=70000, sms=20)
    plan = propose_rebalance(now=NOW, max_moves=10)
    assert plan is not None
    sizing = plan.right_sizing
    p95, p99 = sizing["estimates"]
    assert (p95["gpus_needed"], p99["gpus_needed"]) == (4, 4)
    assert p95["lower_bound_gpus"] == 4  # ceil(280000 / 81920)
    # The saving follows from the need: 6 GPUs − the 4 of two whole nodes, 730 h at 5.12.
    assert (p95["whole_node_gpus"], p95["gpus_released"]) == (4, 2)
    assert p95["monthly_difference"] == "7475.20"
    assert sizing["steps"] == 20 * 60  # every metered minute of the window, no more
    assert sizing["first_minute"] == (NOW - timedelta(minutes=20 * 60)).isoformat()
    assert sizing["last_minute"] == (NOW - timedelta(minutes=1)).isoformat()
    login(client, admin=True)
    page = client.get("/rebalance/").content.decode()
    assert f'data-testid="rebalance-sizing-window-{plan.pk}"' in page
    assert "1200 metered minutes" in page
