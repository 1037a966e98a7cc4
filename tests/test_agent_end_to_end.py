"""End to end: the real agent (sim backend, fake clock) against the real Django server (live
server on the test Postgres) and a Kubernetes API server (``agents.fakes.kube.FakeKubernetes``,
driven by the official client over HTTP).

(a) the watchdog evicts a pod whose use stays above its grant for the grace period, through
    the Eviction API, and the eviction lands in the server's audit log;
(b) budgets: a tenant over its budget with ``throttle`` gets smaller grants from the agent's
    next policy poll on (weight x factor, no burst above its guarantee), and one with
    ``evict-best-effort`` loses its best-effort pods, each eviction audited;
(c) a batch the service refuses (409) stays in the spool, is reported and shown as undelivered,
    and ``vgpu-agent redrive`` delivers it under a fresh number, which resolves the report.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from agents.__main__ import main as agent_main
from agents.backends.sim import demo_scenario
from agents.fakes.kube import FakeKubernetes
from agents.spool import Spool
from billing.ledger.rollup import rollup_usage
from billing.models import AuditEvent, RateCard, SlaTier, Tenant, UndeliveredBatch
from billing.queries.undelivered import count_open_undelivered
from billing.services.budgets.spend import evaluate_budgets, set_budget
from billing.services.demo import A100_80GB_MODEL
from billing.services.identity.api_tokens import issue_api_token
from billing.services.identity.tokens import issue_node_token
from tests import clock
from tests.conftest import iso, make_batch, new_user, state_transitions

NODE = "agent-e2e-node"
GPU = "GPU-7d1f3c2e-0000-4000-8000-00000000e2e0"


def workload(tenant: str, pod: str, tier: str, profile: str = "bert-base", **extra: Any) -> dict[str, Any]:
    return {
        "tenant": tenant,
        "namespace": f"{tenant}-prod",
        "pod": pod,
        "container": "server",
        "pod_uid": str(uuid.uuid5(uuid.NAMESPACE_URL, f"vgpu-ledger:e2e:{tenant}:{pod}")),
        "sla_tier": tier,
        "gpu": GPU,
        "profile": profile,
        **extra,
    }


def scenario(workloads: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "node": NODE,
        "seed": 11,
        "gpus": [{"uuid": GPU, "model": A100_80GB_MODEL, "memory_mb": 81920, "sm_count": 108}],
        "workloads": workloads,
    }


@pytest.fixture
def kube() -> Iterator[FakeKubernetes]:
    with FakeKubernetes() as fake:
        yield fake


@pytest.fixture
def node_files(tmp_path: Path, transactional_db: None) -> dict[str, Path]:
    token = issue_node_token(node_name=NODE, now=clock.now(), actor_label="test").token
    files = {"token": tmp_path / "token", "scenario": tmp_path / "scenario.json", "spool": tmp_path / "spool.sqlite"}
    files["token"].write_text(token + "\n")
    RateCard.objects.create(
        gpu_model=A100_80GB_MODEL,
        currency="USD",
        price_per_gpu_hour=Decimal("3.6"),
        effective_from=datetime(2020, 1, 1, tzinfo=UTC),
        source_url="https://example.org",
    )
    return files


def add_pods(kube: FakeKubernetes, workloads: list[dict[str, Any]]) -> None:
    """The scenario's pods, as the API server lists them for this node."""
    for namespace in sorted({w["namespace"] for w in workloads}):
        kube.add_namespace({"metadata": {"name": namespace, "labels": {"vgpu-ledger.io/tenant": namespace[:-5]}}})
    for w in workloads:
        kube.add_pod(
            {
                "metadata": {"name": w["pod"], "namespace": w["namespace"], "uid": w["pod_uid"],
                             "labels": {"vgpu-ledger.io/sla-tier": w["sla_tier"]}},
                "spec": {"nodeName": NODE, "containers": [{"name": w["container"], "image": "registry.local/app:1"}]},
                "status": {"phase": "Running"},
            }
        )


def run_agent(files: dict[str, Path], server: str, kube: FakeKubernetes, *, seconds: int, start: datetime,
              extra: tuple[str, ...] = ()) -> int:
    return agent_main([
        "run", "--server", server, "--token-file", str(files["token"]), "--backend", "sim",
        "--scenario", str(files["scenario"]), "--spool", str(files["spool"]), "--batch-seconds", "10",
        "--once-seconds", str(seconds), "--start", start.isoformat().replace("+00:00", "Z"),
        "--kube-api", kube.url, *extra,
    ])


def spooled_samples(spool_path: Path) -> list[dict[str, Any]]:
    """The per-second samples the spool keeps beside the batches it sends (their per-minute integrals)."""
    spool = Spool(spool_path, node=NODE, now=clock.now)
    try:
        return list(spool.export_samples(start=datetime(2000, 1, 1, tzinfo=UTC), end=datetime(2100, 1, 1, tzinfo=UTC)))
    finally:
        spool.close()


def test_watchdog_evicts_a_pod_over_its_grant_through_the_eviction_api_and_audits_it(
    node_files: dict[str, Path], kube: FakeKubernetes, live_server: Any
) -> None:
    # bert-base holds 300-500 MiB: the hog's 100 MiB limit is exceeded from its first second.
    hog = workload("globex", "hog-5f7d9-abcde", "silver", limit_mem_mb=100)
    polite = workload("acme", "bert-7f9c4-x2k9p", "gold", limit_mem_mb=1024)
    node_files["scenario"].write_text(json.dumps(scenario([hog, polite])))
    add_pods(kube, [hog, polite])
    start = clock.now().replace(microsecond=0) - timedelta(minutes=3)

    code = run_agent(node_files, live_server.url, kube, seconds=20, start=start,
                     extra=("--enforcer", "watchdog", "--watchdog-grace-s", "3"))

    assert code == 0
    # One eviction, of the hog only, with the UID precondition (a namesake pod is never evicted).
    assert [(e["metadata"]["namespace"], e["metadata"]["name"]) for e in kube.evictions] == [
        ("globex-prod", "hog-5f7d9-abcde")
    ]
    assert kube.evictions[0]["deleteOptions"]["preconditions"]["uid"] == hog["pod_uid"]
    assert "deletionTimestamp" in kube.get_pod("globex-prod", "hog-5f7d9-abcde")["metadata"]
    assert any(e["reason"] == "GpuUseAboveGrant" for e in kube.events)
    # The eviction (and the offence before it) are in the server's audit log, by this node.
    hog_key = "globex-prod/hog-5f7d9-abcde/server"
    audited = list(AuditEvent.objects.filter(object_id=hog_key).order_by("at").values_list("action", "actor_label"))
    assert audited == [("agent.watchdog.over_grant", f"node:{NODE}"), ("agent.watchdog.evicted", f"node:{NODE}")]
    evicted = AuditEvent.objects.get(action="agent.watchdog.evicted")
    assert evicted.after is not None
    assert evicted.after["outcome"] == "evicted"
    assert evicted.after["over_for_s"] >= 3
    assert not AuditEvent.objects.filter(object_id="acme-prod/bert-7f9c4-x2k9p/server").exists()
    # An evicted pod stops: after the grace period (+ a tick) it is metered no more.
    samples = spooled_samples(node_files["spool"])
    hog_seconds = sorted(s["start"] for s in samples if s["pod"] == hog["pod"])
    assert 3 <= len(hog_seconds) <= 5
    assert len([s for s in samples if s["pod"] == polite["pod"]]) == 20


def test_budget_throttle_shrinks_grants_and_evict_best_effort_evicts_from_the_next_policy_poll(
    node_files: dict[str, Path], kube: FakeKubernetes, live_server: Any
) -> None:
    silver = SlaTier.objects.create(slug="silver", name="Silver", weight=Decimal("2.000"))
    SlaTier.objects.create(slug="best-effort", name="Best effort", weight=Decimal("0.500"))
    for slug in ("acme", "initech", "globex"):
        Tenant.objects.create(slug=slug, name=slug.title(), default_sla_tier=silver)
    workloads = [
        workload("acme", "resnet-a1", "silver", profile="resnet50"),
        workload("initech", "bert-i1", "silver"),
        workload("initech", "batch-i2", "best-effort", profile="resnet50"),
        workload("globex", "bert-g1", "silver"),
    ]
    node_files["scenario"].write_text(json.dumps(scenario(workloads)))
    add_pods(kube, workloads)
    # Budgets count this month's spend: the metered minute and a half must lie in this month.
    clock.wait_until_the_month_holds(timedelta(seconds=90))
    start = clock.now().replace(microsecond=0) - timedelta(seconds=90)
    # First run: no budget anywhere; usage reaches the ledger and is priced.
    assert run_agent(node_files, live_server.url, kube, seconds=30, start=start, extra=("--enforcer", "watchdog")) == 0
    before = spooled_samples(node_files["spool"])
    rollup_usage(now=clock.now())
    now = clock.now()
    for slug, action in (("acme", "throttle"), ("initech", "evict-best-effort")):
        set_budget(
            tenant_slug=slug,
            values={"amount": Decimal("0.01"), "currency": "USD", "soft_threshold_pct": Decimal("1"),
                    "hard_threshold_pct": Decimal("1"), "hard_action": action, "throttle_factor": Decimal("0.5"),
                    "owner": "finops@example.org"},
            now=now,
            actor_label="test",
        )
    transitions = {t.tenant: t.after for t in state_transitions(evaluate_budgets(now=now))}
    assert transitions == {"acme": "enforced", "initech": "enforced"}

    # Second run: its policy poll (If-None-Match: the cached ETag) brings both enforcements.
    assert run_agent(node_files, live_server.url, kube, seconds=30, start=start + timedelta(seconds=30),
                     extra=("--enforcer", "watchdog")) == 0
    after = spooled_samples(node_files["spool"])[len(before):]
    cache = json.loads((node_files["spool"].parent / "spool.policy.json").read_text())
    assert cache["policy"]["tenants"]["acme"]["budget"]["action"] == "throttle"

    def granted(samples: list[dict[str, Any]], pod: str) -> tuple[float, float, float]:
        mine = [s for s in samples if s["pod"] == pod]
        assert mine, pod
        return (sum(s["mem_granted_mb_s"] for s in mine), sum(s["mem_used_mb_s"] for s in mine),
                sum(s["sm_granted_s"] for s in mine))

    # throttle: no burst above the guarantee (none here): SMs drop to 0, memory to what it holds.
    mem_before, used_before, sm_before = granted(before, "resnet-a1")
    mem_after, used_after, sm_after = granted(after, "resnet-a1")
    assert sm_before > 0
    assert mem_before > 1.1 * used_before
    assert sm_after == 0
    assert mem_after <= used_after * 1.001
    # An unthrottled tenant keeps its headroom and its SM share.
    g_mem, g_used, g_sm = granted(after, "bert-g1")
    assert g_sm > 0
    assert g_mem > 1.1 * g_used
    # evict-best-effort: initech's best-effort pod is evicted, once; its silver pod stays.
    assert [(e["metadata"]["namespace"], e["metadata"]["name"]) for e in kube.evictions] == [
        ("initech-prod", "batch-i2")
    ]
    assert not [s for s in after if s["pod"] == "batch-i2"][1:]  # stopped within its first tick
    assert len([s for s in after if s["pod"] == "bert-i1"]) == 30
    audit = AuditEvent.objects.get(action="agent.budget.evicted_best_effort")
    assert audit.object_id == "initech-prod/batch-i2"
    assert audit.actor_label == f"node:{NODE}"
    assert audit.after is not None
    assert audit.after["tenant"] == "initech"
    assert audit.after["outcome"] == "evicted"


def test_a_refused_batch_is_kept_reported_and_delivered_by_a_redrive(node_files: dict[str, Path], live_server) -> None:
    import requests

    files, url = node_files, live_server.url
    files["scenario"].write_text(json.dumps(demo_scenario(NODE, seed=1, gpu_count=1, tenants=[("acme", "gold")])))
    t0 = clock.now().replace(second=0, microsecond=0) - timedelta(minutes=10)
    spool = Spool(files["spool"], node=NODE, now=clock.now)
    seq = spool.store_batch(window_start=t0, window_end=t0 + timedelta(seconds=10),
                            render=lambda s: json.dumps(make_batch(node=NODE, seq=s, start=t0)).encode())
    spool.close()
    # Another batch already holds that number (what two spools sharing a sequence space did).
    token = files["token"].read_text().strip()
    taken = requests.post(f"{url}/api/v1/usage/batches", json=make_batch(node=NODE, seq=seq, start=t0 - timedelta(minutes=1)),
                          headers={"Authorization": f"Bearer {token}"}, timeout=10)
    assert taken.status_code == 201
    common = ["--server", url, "--token-file", str(files["token"])]
    assert agent_main(["run", *common, "--backend", "sim", "--scenario", str(files["scenario"]),
                       "--spool", str(files["spool"]), "--batch-seconds", "10", "--once-seconds", "10",
                       "--start", iso(t0 + timedelta(minutes=1))]) == 0
    (report,) = UndeliveredBatch.objects.filter(node__name=NODE)
    assert (report.batch_seq, report.status_code, report.window_start) == (seq, 409, t0)
    assert report.sample_count == 10
    assert report.size_bytes > 0
    assert "different content" in report.reason
    # /healthz shows its figures to an admin only: here through an admin's API token.
    new_user("sre", is_staff=True)
    sre = issue_api_token(username="sre", name="healthz", expires_at=None, now=clock.now(), actor_label="test").token
    health = requests.get(f"{url}/healthz", headers={"Authorization": f"Bearer {sre}"}, timeout=10).json()
    assert health["ledger"]["undelivered_batches"] == 1

    assert agent_main(["redrive", "--spool", str(files["spool"]), *common]) == 0
    assert count_open_undelivered() == 0
    spool = Spool(files["spool"], node=NODE, now=clock.now)
    try:
        kept = {b.batch_seq: b for b in spool.list_batches()}
    finally:
        spool.close()
    # Kept, never deleted.
    assert kept[seq].state == "dead"
    successor = kept[seq].superseded_by
    assert successor is not None
    assert kept[successor].state == "sent"
    assert UndeliveredBatch.objects.get(batch_seq=seq).superseded_by == kept[seq].superseded_by
