"""Agents authenticate with their projected ServiceAccount token: the service checks it with a
TokenReview (the real kubernetes client against FakeKubernetes over HTTP) and binds it to the
node of the token's pod. Node tokens (vgl_…) keep working beside it."""

from __future__ import annotations

import hashlib
import json
import socket
from collections.abc import Iterator
from datetime import datetime, timedelta
from typing import Any

import pytest
from django.core.checks import run_checks
from django.test import Client

from agents.fakes.kube import FakeKubernetes
from billing.errors import NotAuthenticated
from billing.ledger.models import UsageBatch
from billing.models import AuditEvent, Node
from billing.services.identity import node_identity
from billing.services.identity.node_identity import review_service_account_token
from billing.services.identity.tokens import issue_node_token
from tests import clock
from tests.conftest import make_batch

AGENT_NS = "vgpu-ledger"
AGENT_SA = "system:serviceaccount:vgpu-ledger:vgpu-agent"


def agent_pod(name: str, node: str, *, namespace: str = AGENT_NS, account: str = "vgpu-agent") -> dict[str, Any]:
    return {
        "metadata": {"name": name, "namespace": namespace, "labels": {"app": "vgpu-agent"}},
        "spec": {"nodeName": node, "serviceAccountName": account,
                 "containers": [{"name": "agent", "image": "vgpu-ledger-agent:latest"}]},
        "status": {"phase": "Running"},
    }


@pytest.fixture
def kube(settings: Any) -> Iterator[FakeKubernetes]:
    """A cluster with two GPU nodes, one agent pod on each; the service reviews tokens there."""
    node_identity.clear_review_cache()
    with FakeKubernetes() as fake:
        for node in ("gpu-a", "gpu-b"):
            fake.add_node({"metadata": {"name": node}})
            fake.add_pod(agent_pod(f"vgpu-agent-{node}", node))
        settings.VGPU_NODE_TOKENREVIEW = True
        settings.VGPU_KUBE_API = fake.url
        yield fake
    node_identity.clear_review_cache()


def token_for(kube: FakeKubernetes, pod: str = "vgpu-agent-gpu-a", *, namespace: str = AGENT_NS,
              audiences: tuple[str, ...] = ("vgpu-ledger",), **kwargs: Any) -> str:
    return kube.issue_service_account_token(namespace=namespace, pod=pod, audiences=list(audiences), **kwargs)


def post_batch(client: Client, token: str, *, node: str = "gpu-a", seq: int = 1) -> Any:
    start = clock.now().replace(microsecond=0) - timedelta(minutes=5) + timedelta(seconds=10 * seq)  # one window each
    body = json.dumps(make_batch(node=node, seq=seq, start=start)).encode()
    return client.generic("POST", "/api/v1/usage/batches", body, content_type="application/json",
                          HTTP_AUTHORIZATION=f"Bearer {token}")


def reviews(kube: FakeKubernetes) -> int:
    return sum(1 for r in kube.requests if r.method == "POST" and r.path.endswith("/tokenreviews"))


def message(response: Any) -> str:
    return str(response.json()["errors"][0]["message"])


def test_an_agent_pods_token_uploads_for_its_node_and_registers_the_node_audited(
    db: None, client: Client, kube: FakeKubernetes
) -> None:
    response = post_batch(client, token_for(kube))

    assert response.status_code == 201, response.content
    assert list(UsageBatch.objects.values_list("node__name", "batch_seq")) == [("gpu-a", 1)]
    event = AuditEvent.objects.get(action="node.registered")
    assert event.actor_label == AGENT_SA
    assert event.after is not None
    assert event.after["node"] == "gpu-a"
    assert event.after["pod"] == "vgpu-ledger/vgpu-agent-gpu-a"
    assert event.after["pod_uid"] == kube.get_pod(AGENT_NS, "vgpu-agent-gpu-a")["metadata"]["uid"]
    # The service read the token's pod to learn its node.
    assert any(r.method == "GET" and r.path == "/api/v1/namespaces/vgpu-ledger/pods/vgpu-agent-gpu-a"
               for r in kube.requests)


def test_a_token_of_the_agent_on_node_a_is_refused_with_403_for_node_b(
    db: None, client: Client, kube: FakeKubernetes
) -> None:
    token = token_for(kube)

    batch = post_batch(client, token, node="gpu-b")
    policy_b = client.get("/api/v1/nodes/gpu-b/policy", HTTP_AUTHORIZATION=f"Bearer {token}")
    events_b = client.generic("POST", "/api/v1/nodes/gpu-b/events", b'{"events": []}',
                              content_type="application/json", HTTP_AUTHORIZATION=f"Bearer {token}")
    policy_a = client.get("/api/v1/nodes/gpu-a/policy", HTTP_AUTHORIZATION=f"Bearer {token}")

    assert batch.status_code == 403
    assert "'gpu-a'" in message(batch)
    assert "gpu-b" in message(batch)
    assert policy_b.status_code == 403
    assert message(policy_b) == "this token belongs to node 'gpu-a' (pod vgpu-ledger/vgpu-agent-gpu-a), not 'gpu-b'"
    assert events_b.status_code == 403
    assert policy_a.status_code == 200
    assert not UsageBatch.objects.exists()
    assert not Node.objects.filter(name="gpu-b").exists()


def _expired(kube: FakeKubernetes) -> str:
    return token_for(kube, issued_at=clock.now() - timedelta(hours=2), expiration_s=3600)


def _pod_deleted(kube: FakeKubernetes) -> str:
    token = token_for(kube)
    kube.delete_pod(AGENT_NS, "vgpu-agent-gpu-a")
    return token


def _pod_recreated(kube: FakeKubernetes) -> str:
    token = token_for(kube)
    kube.delete_pod(AGENT_NS, "vgpu-agent-gpu-a")
    kube.add_pod(agent_pod("vgpu-agent-gpu-a", "gpu-a"))  # same name, new uid
    return token


def _other_account(kube: FakeKubernetes) -> str:
    kube.add_pod(agent_pod("intruder", "gpu-a", namespace="acme-prod", account="default"))
    return token_for(kube, "intruder", namespace="acme-prod")


def _forged(kube: FakeKubernetes) -> str:
    header, payload, signature = token_for(kube).split(".")
    return f"{header}.{payload}.{signature[::-1]}"


@pytest.mark.parametrize(
    ("make_token", "says"),
    [
        (_expired, "service account token has expired"),
        (_pod_deleted, "service account token has been invalidated"),
        (_pod_recreated, "does not match claim"),
        (lambda kube: token_for(kube, audiences=("some-other-service",)), "is invalid for the target audiences"),
        (lambda kube: token_for(kube, audiences=()), "is invalid for the target audiences"),  # the API server's
        (_other_account, "system:serviceaccount:acme-prod:default is not an agent ServiceAccount"),
        (_forged, "the Kubernetes API server rejected the token: not authenticated"),
        (lambda kube: "not-a-jwt-and-not-vgl", "neither a node token (vgl_…) nor a Kubernetes ServiceAccount token"),
    ],
    ids=["expired", "pod-deleted", "pod-recreated", "wrong-audience", "api-server-audience", "not-an-agent",
         "forged", "not-a-jwt"],
)
def test_tokens_that_do_not_prove_an_agent_pod_get_401_and_nothing_is_stored(
    db: None, client: Client, kube: FakeKubernetes, make_token: Any, says: str
) -> None:
    response = post_batch(client, make_token(kube))

    assert response.status_code == 401, response.content
    assert response["WWW-Authenticate"] == 'Bearer realm="vgpu-ledger"'
    assert says in message(response)
    assert not UsageBatch.objects.exists()
    assert not Node.objects.exists()
    assert not AuditEvent.objects.filter(action="node.registered").exists()


def test_a_token_bound_to_no_pod_is_refused_even_for_the_agent_account(
    db: None, client: Client, kube: FakeKubernetes
) -> None:
    """`kubectl create token vgpu-agent` gives a valid token of the agent's account that names no
    pod, so it proves no node: whoever may create tokens must not be able to speak for any node."""
    token = kube.issue_service_account_token(namespace=AGENT_NS, service_account="vgpu-agent",
                                             audiences=["vgpu-ledger"])

    response = post_batch(client, token)

    assert response.status_code == 401
    assert "not bound to a pod" in message(response)
    assert not UsageBatch.objects.exists()


def test_with_tokenreview_off_a_service_account_token_gets_401_naming_the_setting(
    db: None, client: Client, kube: FakeKubernetes, settings: Any
) -> None:
    settings.VGPU_NODE_TOKENREVIEW = False

    response = post_batch(client, token_for(kube))

    assert response.status_code == 401
    assert "VGPU_NODE_TOKENREVIEW=1" in message(response)
    assert reviews(kube) == 0


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_api_server_unreachable_answers_503_with_retry_after_and_stores_nothing(
    db: None, client: Client, kube: FakeKubernetes, settings: Any
) -> None:
    token = token_for(kube)
    settings.VGPU_KUBE_API = f"http://127.0.0.1:{_closed_port()}"

    response = post_batch(client, token)

    assert response.status_code == 503, response.content
    assert response["Retry-After"] == str(settings.VGPU_OUTAGE_RETRY_AFTER_S)
    assert "the Kubernetes API server (TokenReview) is unavailable" in message(response)
    assert not UsageBatch.objects.exists()
    # Once it answers again, the same token and batch go through: nothing was lost.
    settings.VGPU_KUBE_API = kube.url
    assert post_batch(client, token).status_code == 201


def test_a_reviewer_refused_by_rbac_answers_503_not_401(db: None, client: Client, kube: FakeKubernetes) -> None:
    """The service's own missing permission is not the agent's fault: 401 would tell the agent
    its token is bad."""
    kube.forbid_token_reviews = True

    response = post_batch(client, token_for(kube))

    assert response.status_code == 503
    assert "Retry-After" in response


def test_a_reviewed_token_is_reused_without_a_new_review_until_the_cache_ttl(
    db: None, client: Client, kube: FakeKubernetes, settings: Any
) -> None:
    settings.VGPU_NODE_TOKENREVIEW_CACHE_S = 60
    token = token_for(kube)
    # The review happens at some instant between these two, however long the requests take.
    before = clock.now()
    assert post_batch(client, token, seq=1).status_code == 201
    assert post_batch(client, token, seq=2).status_code == 201
    assert client.get("/api/v1/nodes/gpu-a/policy", HTTP_AUTHORIZATION=f"Bearer {token}").status_code == 200
    after = clock.now()
    assert reviews(kube) == 1
    # Keyed by the token's SHA-256: the clear token is not kept.
    assert list(node_identity._cache._entries) == [hashlib.sha256(token.encode()).hexdigest()]

    # The documented price: a deleted pod's token works until its entry expires, then not.
    kube.delete_pod(AGENT_NS, "vgpu-agent-gpu-a")
    assert review_service_account_token(token=token, now=before + timedelta(seconds=59)).node == "gpu-a"
    with pytest.raises(NotAuthenticated, match="has been invalidated"):
        review_service_account_token(token=token, now=after + timedelta(seconds=61))
    assert reviews(kube) == 2


def test_the_cache_never_outlives_the_token(db: None, kube: FakeKubernetes, settings: Any) -> None:
    settings.VGPU_NODE_TOKENREVIEW_CACHE_S = 600
    now = clock.now().replace(microsecond=0)
    # 30 s of validity left: the review may be reused for 30 s, not 600.
    token = token_for(kube, issued_at=now - timedelta(seconds=570), expiration_s=600)
    kube.use_token_clock(lambda: now)
    assert review_service_account_token(token=token, now=now).node == "gpu-a"
    assert review_service_account_token(token=token, now=now + timedelta(seconds=29)).node == "gpu-a"
    assert reviews(kube) == 1

    later = now + timedelta(seconds=31)
    kube.use_token_clock(lambda: later)
    with pytest.raises(NotAuthenticated, match="has expired"):
        review_service_account_token(token=token, now=later)
    assert reviews(kube) == 2


def test_the_review_cache_holds_a_bounded_number_of_tokens() -> None:
    cache = node_identity._ReviewCache(max_entries=2)
    until = datetime.max.replace(tzinfo=clock.now().tzinfo)
    who = node_identity.PodIdentity(username=AGENT_SA, namespace=AGENT_NS, pod="p", pod_uid="u", node="n")
    for key in ("a", "b", "c"):
        cache.put(key, who, until=until)
    now = clock.now()
    assert [cache.get(k, now=now) is not None for k in ("a", "b", "c")] == [False, True, True]


def test_rejected_tokens_are_not_cached(db: None, client: Client, kube: FakeKubernetes) -> None:
    token = token_for(kube, audiences=("some-other-service",))
    assert post_batch(client, token).status_code == 401
    assert post_batch(client, token).status_code == 401
    assert reviews(kube) == 2


def test_node_tokens_still_authenticate_beside_tokenreview(db: None, client: Client, kube: FakeKubernetes) -> None:
    issued = issue_node_token(node_name="bare-metal-1", now=clock.now(), actor_label="test")

    assert post_batch(client, issued.token, node="bare-metal-1").status_code == 201
    assert post_batch(client, issued.token, node="gpu-a", seq=2).status_code == 403
    assert reviews(kube) == 0


def test_misconfigured_node_identity_is_a_system_check_error(settings: Any) -> None:
    settings.VGPU_NODE_TOKENREVIEW = True
    settings.VGPU_NODE_SERVICE_ACCOUNTS = ["vgpu-agent"]  # no namespace
    errors = [m for m in run_checks() if m.id == "billing.E003"]
    assert len(errors) == 1
    assert "namespace:name" in errors[0].msg
    settings.VGPU_NODE_SERVICE_ACCOUNTS = ["vgpu-ledger:vgpu-agent"]
    assert not [m for m in run_checks() if m.id == "billing.E003"]
