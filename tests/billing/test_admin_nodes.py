"""Nodes and their tokens in the web app (admins only): a token is shown once and stored only
hashed, revoking needs the typed prefix and locks the agent out of ingest, all audited."""

from __future__ import annotations

import hashlib
import re
from datetime import timedelta

import pytest
from django.contrib.auth.models import User

from billing.models import AuditEvent, Gpu, Node, NodeToken
from billing.scope import ADMIN_GROUP, FINANCE_GROUP
from tests import clock
from tests.conftest import make_batch, user_in

pytestmark = pytest.mark.django_db

TOKEN_RE = re.compile(r'data-testid="issued-token">(vgl_[A-Za-z0-9_-]+)<')


def login(client, role: str) -> User:
    """role: admin, finance or tenant (a member of acme)."""
    group = {"admin": ADMIN_GROUP, "finance": FINANCE_GROUP}.get(role)
    user = user_in(group, "acme" if role == "tenant" else None)
    client.force_login(user)
    return user


@pytest.mark.parametrize("role", ["finance", "tenant"])
def test_only_admins_may_open_or_change_nodes(client, node_token, role):
    login(client, role)
    assert client.get("/nodes/").status_code == 403
    assert client.post("/nodes/tokens/", {"node": "gpu-node-9"}).status_code == 403
    resp = client.post(f"/nodes/tokens/{node_token.token_id}/revoke/", {"confirm": node_token.prefix})
    assert resp.status_code == 403
    assert not Node.objects.filter(name="gpu-node-9").exists()
    assert NodeToken.objects.get(pk=node_token.token_id).revoked_at is None
    assert 'data-testid="nav-nodes"' not in client.get("/finance/").content.decode()


def test_token_is_shown_once_stored_hashed_and_audited(client):
    admin = login(client, "admin")
    resp = client.post("/nodes/tokens/", {"node": "gpu-node-7"})
    html = resp.content.decode()
    assert resp.status_code == 200
    assert resp["Cache-Control"] == "no-store"
    match = TOKEN_RE.search(html)
    assert match, html
    token = match.group(1)
    # The hint to hand it to the agent, and the warning.
    assert "python -m agents run" in html
    assert "--token-file" in html
    assert "--node gpu-node-7" in html
    assert "cannot be shown again" in html
    # In Kubernetes the DaemonSet authenticates with its ServiceAccount token, not a shared Secret.
    assert "ServiceAccount token" in html
    assert "vgpu-agent-token" not in html

    row = NodeToken.objects.get(node__name="gpu-node-7")
    assert row.token_sha256 == hashlib.sha256(token.encode()).hexdigest()
    assert token not in (row.token_sha256, row.prefix)
    assert token.startswith(row.prefix)
    event = AuditEvent.objects.get(action="node_token.issued")
    assert event.actor_id == admin.pk
    assert token not in str(event.after)

    # Never again: not on the nodes page, not in the session, not in a redirect URL.
    again = client.get("/nodes/").content.decode()
    assert token not in again
    assert f"{row.prefix}…" in again
    assert all(token not in str(v) for v in client.session.values())


def test_an_existing_node_gets_a_second_token_and_both_are_listed(client, node_token):
    login(client, "admin")
    assert client.post("/nodes/tokens/", {"node": "gpu-node-1"}).status_code == 200
    assert Node.objects.count() == 1
    assert NodeToken.objects.filter(node__name="gpu-node-1", revoked_at__isnull=True).count() == 2


@pytest.mark.parametrize("name", ["Bad Name!", "-leading-dash", "", "trailing.", "a..b", "UPPER.example", "x" * 64])
def test_an_invalid_node_name_is_a_400_and_creates_nothing(client, name):
    login(client, "admin")
    resp = client.post("/nodes/tokens/", {"node": name})
    assert resp.status_code == 400
    assert 'data-testid="issue-token-error"' in resp.content.decode()
    assert not Node.objects.exists()
    assert not NodeToken.objects.exists()
    assert not AuditEvent.objects.exists()


def test_a_dotted_kubernetes_node_name_gets_a_token(client):
    # The name EKS gives a node; the same node an agent's ServiceAccount token can speak for.
    login(client, "admin")
    assert client.post("/nodes/tokens/", {"node": "ip-10-0-1-5.ec2.internal"}).status_code == 200
    assert NodeToken.objects.filter(node__name="ip-10-0-1-5.ec2.internal").count() == 1


def test_revoke_needs_the_typed_prefix_then_the_agent_is_refused_at_ingest(client, post_batch, node_token,
                                                                         minute_start):
    assert post_batch(make_batch(start=minute_start, seq=1)).status_code == 201
    admin = login(client, "admin")
    url = f"/nodes/tokens/{node_token.token_id}/revoke/"
    assert client.get(url).status_code == 405
    resp = client.post(url, {"confirm": "yes"})
    assert resp.status_code == 400
    assert "to confirm" in resp.content.decode()
    assert NodeToken.objects.get(pk=node_token.token_id).revoked_at is None

    assert client.post(url, {"confirm": node_token.prefix}).status_code == 302
    assert NodeToken.objects.get(pk=node_token.token_id).revoked_at is not None
    event = AuditEvent.objects.get(action="node_token.revoked")
    assert event.actor_id == admin.pk
    assert event.before is not None
    assert event.after is not None
    assert (event.before["revoked_at"], event.after["revoked_at"] is not None) == (None, True)
    html = client.get("/nodes/").content.decode()
    assert f'data-testid="revoke-token-{node_token.token_id}"' not in html

    # The service answers a revoked token with 403 (an unknown token would be 401).
    resp = post_batch(make_batch(start=minute_start + timedelta(seconds=10), seq=2))
    assert resp.status_code == 403
    assert "revoked" in resp.content.decode()
    assert client.post("/nodes/tokens/999999/revoke/", {"confirm": "x"}).status_code == 404


def test_nodes_page_lists_gpus_liveness_and_tokens(client, node_token):
    now = clock.now()
    node = Node.objects.get(name="gpu-node-1")
    Node.objects.filter(pk=node.pk).update(last_seen_at=now - timedelta(minutes=10))
    fresh = Node.objects.create(name="gpu-node-2", last_seen_at=now)
    Node.objects.create(name="gpu-node-3")  # never heard from: "never", not stale
    for i, model in enumerate(["NVIDIA A100-SXM4-80GB", "NVIDIA A100-SXM4-80GB", "NVIDIA H100 80GB HBM3"]):
        Gpu.objects.create(uuid=f"GPU-{i}", node=node, model=model, memory_mb=81920, sm_count=108,
                           first_seen_at=now, last_seen_at=now)
    login(client, "admin")
    html = client.get("/nodes/").content.decode()
    assert 'data-testid="node-table"' in html
    assert 'data-testid="issue-token-form"' in html
    row = html.split('data-testid="node-gpu-node-1"')[1].split("</tr>")[0]
    assert "2 × NVIDIA A100-SXM4-80GB" in row
    assert "1 × NVIDIA H100 80GB HBM3" in row
    assert 'data-testid="node-stale-gpu-node-1"' in row
    assert f'data-testid="revoke-token-{node_token.token_id}"' in row
    assert f"{node_token.prefix}…" in row
    assert f'data-testid="node-stale-{fresh.name}"' not in html
    assert 'data-testid="node-stale-gpu-node-3"' not in html


def test_a_token_records_when_its_node_last_called_in(client, post_batch, node_token, minute_start):
    assert NodeToken.objects.get(pk=node_token.token_id).last_used_at is None
    assert post_batch(make_batch(start=minute_start)).status_code == 201
    used = NodeToken.objects.get(pk=node_token.token_id).last_used_at
    assert used is not None
    assert abs(used - clock.now()) < timedelta(minutes=1)
    login(client, "admin")
    assert "no use recorded" not in client.get("/nodes/").content.decode()


def test_nodes_page_shows_when_a_node_was_added_and_its_gpus_on_one_line(client, node_token):
    now = clock.now()
    node = Node.objects.get(name="gpu-node-1")
    single = Node.objects.create(name="gpu-node-2")
    Node.objects.create(name="gpu-node-3")
    for i, (owner, model) in enumerate([(node, "NVIDIA A100-SXM4-80GB"), (node, "NVIDIA A100-SXM4-80GB"),
                                        (node, "NVIDIA H100 80GB HBM3"), (single, "NVIDIA L4")]):
        Gpu.objects.create(uuid=f"GPU-{i}", node=owner, model=model, memory_mb=81920, sm_count=108,
                           first_seen_at=now, last_seen_at=now)
    login(client, "admin")
    html = client.get("/nodes/").content.decode()
    row = html.split('data-testid="node-gpu-node-1"')[1].split("</tr>")[0]
    assert "added " in row
    assert "since " not in row
    gpus = html.split('data-testid="node-gpus-gpu-node-1"')[1].split("</td>")[0]
    assert "3 GPUs:" in gpus
    assert "<br>" not in gpus
    assert gpus.index("2 × NVIDIA A100-SXM4-80GB") < gpus.index("1 × NVIDIA H100 80GB HBM3")
    # One model: the count says it all, no total.
    gpus = html.split('data-testid="node-gpus-gpu-node-2"')[1].split("</td>")[0]
    assert "1 × NVIDIA L4" in gpus
    assert "GPU:" not in gpus
    assert "none reported" in html.split('data-testid="node-gpus-gpu-node-3"')[1].split("</td>")[0]


@pytest.mark.parametrize(("used_ago", "in_use"), [(timedelta(minutes=1), True), (timedelta(minutes=6), False),
                                                  (None, False)])
def test_a_token_used_in_the_last_five_minutes_is_shown_in_use(client, node_token, used_ago, in_use):
    used = clock.now() - used_ago if used_ago is not None else None
    NodeToken.objects.filter(pk=node_token.token_id).update(last_used_at=used)
    login(client, "admin")
    html = client.get("/nodes/").content.decode()
    assert (f'data-testid="token-in-use-{node_token.token_id}"' in html) is in_use
    assert f'data-testid="revoke-token-{node_token.token_id}"' in html
