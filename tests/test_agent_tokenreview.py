"""End to end, node identity the Kubernetes way: the real agent process (``python -m agents run
--backend sim``) holds only its pod's projected ServiceAccount token and uploads to the real
Django server (live server on the test Postgres), which checks the token with a TokenReview
against a Kubernetes API server (``agents.fakes.kube.FakeKubernetes``, through the official client).

While the API server is unreachable the service answers 503 and the agent keeps every batch
spooled; once it is back, the same agent delivers them all. A second agent that claims another
node with that token is refused (403) and nothing of it is stored.
"""

from __future__ import annotations

import gzip
import json
import socket
import subprocess
import sys
import uuid
from collections.abc import Iterator
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from agents.fakes.kube import FakeKubernetes
from agents.spool import Spool
from billing.ledger.models import UsageBatch
from billing.models import AuditEvent, Node
from billing.services.demo import A100_80GB_MODEL
from billing.services.identity import node_identity
from tests import clock

REPO = Path(__file__).resolve().parents[1]
NODE_A, NODE_B = "tr-node-a", "tr-node-b"
AGENT_POD = "vgpu-agent-7xk2p"


def scenario(node: str) -> dict[str, Any]:
    gpu = f"GPU-{uuid.uuid5(uuid.NAMESPACE_URL, f'vgpu-ledger:tokenreview:{node}')}"
    return {
        "node": node,
        "seed": 5,
        "gpus": [{"uuid": gpu, "model": A100_80GB_MODEL, "memory_mb": 81920, "sm_count": 108}],
        "workloads": [{
            "tenant": "acme", "namespace": "acme-prod", "pod": "bert-7f9c4-x2k9p", "container": "server",
            "pod_uid": str(uuid.uuid5(uuid.NAMESPACE_URL, f"vgpu-ledger:tokenreview:{node}:bert")),
            "sla_tier": "gold", "gpu": gpu, "profile": "bert-base",
        }],
    }


@pytest.fixture
def kube(settings: Any) -> Iterator[FakeKubernetes]:
    node_identity.clear_review_cache()
    with FakeKubernetes() as fake:
        fake.add_node({"metadata": {"name": NODE_A}})
        fake.add_pod({
            "metadata": {"name": AGENT_POD, "namespace": "vgpu-ledger", "labels": {"app": "vgpu-agent"}},
            "spec": {"nodeName": NODE_A, "serviceAccountName": "vgpu-agent",
                     "containers": [{"name": "agent", "image": "vgpu-ledger-agent:latest"}]},
            "status": {"phase": "Running"},
        })
        settings.VGPU_NODE_TOKENREVIEW = True
        settings.VGPU_KUBE_API = fake.url
        yield fake
    node_identity.clear_review_cache()


def run_agent(tmp_path: Path, server: str, *, node: str, seconds: int, start: datetime) -> subprocess.CompletedProcess[str]:
    scenario_file = tmp_path / f"{node}.json"
    scenario_file.write_text(json.dumps(scenario(node)))
    return subprocess.run(
        [sys.executable, "-m", "agents", "run", "--backend", "sim", "--scenario", str(scenario_file),
         "--server", server, "--token-file", str(tmp_path / "token"), "--spool", str(tmp_path / f"{node}.sqlite"),
         "--batch-seconds", "10", "--once-seconds", str(seconds), "--start", start.isoformat().replace("+00:00", "Z")],
        cwd=REPO, capture_output=True, text=True, timeout=120, check=False,
    )


def spooled(tmp_path: Path, node: str) -> list[dict[str, Any]]:
    spool = Spool(tmp_path / f"{node}.sqlite", node=node, now=clock.now)
    try:
        rows = []
        for batch in spool.list_batches():
            body = batch.json_bytes()
            document = json.loads(gzip.decompress(body) if body[:2] == b"\x1f\x8b" else body)
            rows.append({"seq": batch.batch_seq, "state": batch.state, "status": batch.last_status,
                         "error": batch.last_error, "windows": len(document["windows"])})
        return rows
    finally:
        spool.close()


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_the_agent_uploads_with_its_service_account_token_through_tokenreview_and_loses_nothing_in_an_outage(
    tmp_path: Path, kube: FakeKubernetes, live_server: Any, transactional_db: None, settings: Any
) -> None:
    (tmp_path / "token").write_text(
        kube.issue_service_account_token(namespace="vgpu-ledger", pod=AGENT_POD, audiences=["vgpu-ledger"]) + "\n"
    )
    start = clock.now().replace(second=0, microsecond=0) - timedelta(minutes=3)  # whole batches: they close on whole 10 s

    # The API server is unreachable: 503 with Retry-After, every batch stays in the spool.
    settings.VGPU_KUBE_API = f"http://127.0.0.1:{_closed_port()}"
    down = run_agent(tmp_path, live_server.url, node=NODE_A, seconds=20, start=start)
    assert down.returncode == 75, down.stderr[-3000:]
    held = spooled(tmp_path, NODE_A)
    assert held
    assert all(b["state"] == "pending" for b in held)
    assert held[0]["status"] == 503
    assert "Kubernetes API server" in held[0]["error"]
    assert not UsageBatch.objects.exists()

    # Back: the same agent delivers the held batches and the new ones, all of them.
    settings.VGPU_KUBE_API = kube.url
    up = run_agent(tmp_path, live_server.url, node=NODE_A, seconds=10, start=start)
    assert up.returncode == 0, up.stderr[-3000:]
    delivered = spooled(tmp_path, NODE_A)
    assert len(delivered) > len(held)
    assert all(b["state"] == "sent" for b in delivered)
    stored = dict(UsageBatch.objects.filter(node__name=NODE_A).values_list("batch_seq", "sample_count"))
    assert stored == {b["seq"]: b["windows"] for b in delivered}  # a v2 batch counts its windows
    assert AuditEvent.objects.get(action="node.registered").actor_label == (
        "system:serviceaccount:vgpu-ledger:vgpu-agent"
    )

    # A second agent claiming node B with node A's token: refused, nothing of it stored.
    other = run_agent(tmp_path, live_server.url, node=NODE_B, seconds=10, start=start)
    assert other.returncode == 75, other.stderr[-3000:]
    refused = spooled(tmp_path, NODE_B)
    assert refused
    assert {b["status"] for b in refused} == {403}
    assert f"this token belongs to node '{NODE_A}'" in refused[0]["error"]
    assert not Node.objects.filter(name=NODE_B).exists()
    assert not UsageBatch.objects.filter(node__name=NODE_B).exists()
