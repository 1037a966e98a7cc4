"""Hostile: token guessing is throttled per client address (429 with Retry-After, audited once,
no database look-up once throttled) while valid tokens from the same address keep working;
every page carries the Content-Security-Policy and no template has inline script or style; an
approved rebalance whose execution cannot be queued says so and can be approved again."""

from __future__ import annotations

import re
import secrets
from datetime import UTC, datetime
from pathlib import Path

import kombu.exceptions
import pytest
from django.conf import settings
from django.urls import URLPattern, URLResolver, get_resolver

from billing.models import AuditEvent, RebalancePlan, RebalanceStatus
from billing.scope import ADMIN_GROUP, FINANCE_GROUP
from billing.services.fleet.rebalance import confirmation_code
from billing.services.identity.api_tokens import issue_api_token
from billing.services.identity.auth_throttle import THROTTLED
from tests import clock
from tests.conftest import make_batch, user_in
from tests.hostile.conftest import bearer

LIMIT = 5
TEMPLATES = Path(settings.BASE_DIR) / "templates"


@pytest.fixture
def low_limit(settings):
    settings.VGPU_AUTH_FAILURE_LIMIT = LIMIT
    settings.VGPU_AUTH_COOLOFF_S = 120
    settings.VGPU_ADMISSION_TOKEN = "the-webhook-kubeconfig-token"
    return settings


def _guess(hostile, path: str, prefix: str, n: int) -> list:
    return [hostile.get(path, headers=bearer(prefix + secrets.token_urlsafe(32))) for _ in range(n)]


def test_guessing_tokens_is_throttled_audited_once_and_valid_tokens_keep_working(
        hostile, node_token_for, low_limit, minute_start):
    node = node_token_for("gpu-node-1")
    api = issue_api_token(username=user_in(FINANCE_GROUP).username, name="script", expires_at=None,
                          now=clock.now(), actor_label="test").token
    answers = _guess(hostile, "/api/v1/allocation", "vgla_", LIMIT + 25)
    assert [a.status_code for a in answers[:LIMIT]] == [401] * LIMIT
    assert {a.status_code for a in answers[LIMIT:]} == {429}
    refused = answers[-1]
    assert 1 <= int(refused.headers["Retry-After"]) <= 120
    # In the error shape of that API: OpenCost's for the allocation API (billing/api/allocation.py).
    assert refused.json()["code"] == 429
    assert "too many failed" in refused.json()["message"]
    # The same address guessing node tokens is the same address: refused before any look-up.
    guessed_node = hostile.post("/api/v1/usage/batches", headers=bearer("vgl_" + secrets.token_urlsafe(32)),
                                json=make_batch(start=minute_start))
    assert guessed_node.status_code == 429
    assert guessed_node.headers["Retry-After"]
    assert "too many failed" in guessed_node.json()["errors"][0]["message"]  # the agent API's shape
    assert (hostile.post("/api/v1/admission/pods", headers=bearer("x" * 40), json={}).status_code == 429)
    # One audit row for the whole block, however many requests it refused.
    (event,) = AuditEvent.objects.filter(action=THROTTLED)
    assert event.after is not None
    assert event.after["client"] == "127.0.0.1"
    assert event.after["failure_limit"] == LIMIT
    # The healthy node and the API script behind the same address are never refused.
    stored = hostile.post("/api/v1/usage/batches", headers=bearer(node.token),
                          json=make_batch(start=minute_start))
    assert stored.status_code == 201, stored.text
    assert hostile.get("/api/v1/nodes/gpu-node-1/policy", headers=bearer(node.token)).status_code == 200
    assert hostile.get("/api/v1/allocation", params={"window": "1d"}, headers=bearer(api)).status_code == 200
    assert AuditEvent.objects.filter(action=THROTTLED).count() == 1


def test_a_throttled_guess_costs_no_database_query(db, client, low_limit, django_assert_num_queries):
    for _ in range(LIMIT):
        assert client.get("/api/v1/nodes/n1/policy", HTTP_AUTHORIZATION=f"Bearer vgl_{secrets.token_hex(8)}").status_code == 401
    with django_assert_num_queries(0):
        node = client.get("/api/v1/nodes/n1/policy", HTTP_AUTHORIZATION=f"Bearer vgl_{secrets.token_hex(8)}")
        api = client.get("/api/v1/allocation", HTTP_AUTHORIZATION=f"Bearer vgla_{secrets.token_hex(8)}")
    assert (node.status_code, api.status_code) == (429, 429)
    assert node.headers["Retry-After"]
    assert api.headers["Retry-After"]


def test_a_client_address_under_the_limit_is_not_throttled_and_another_address_never(db, client, low_limit):
    for _ in range(LIMIT - 1):
        assert client.get("/api/v1/allocation", HTTP_AUTHORIZATION="Bearer vgla_nope").status_code == 401
    assert client.get("/api/v1/allocation", HTTP_AUTHORIZATION="Bearer vgla_nope").status_code == 401  # blocks now
    assert client.get("/api/v1/allocation", HTTP_AUTHORIZATION="Bearer vgla_nope").status_code == 429
    other = client.get("/api/v1/allocation", HTTP_AUTHORIZATION="Bearer vgla_nope", REMOTE_ADDR="10.1.2.3")
    assert other.status_code == 401


# --- Content-Security-Policy -------------------------------------------------------------------

def _plain_get_paths(patterns, prefix: str = "") -> list[str]:
    """Every URL of the site that takes no argument (the pages a walk reaches without data)."""
    paths: list[str] = []
    for p in patterns:
        route = str(p.pattern)
        if isinstance(p, URLResolver):
            paths += _plain_get_paths(p.url_patterns, prefix + route)
        elif isinstance(p, URLPattern) and "<" not in route and "(" not in route and "[" not in route:
            paths.append("/" + (prefix + route).lstrip("^").rstrip("$"))
    return sorted(set(paths))


def test_every_page_carries_the_content_security_policy(signed_in, hostile):
    admin = signed_in(ADMIN_GROUP)
    paths = _plain_get_paths(get_resolver().url_patterns)
    assert "/finance/" in paths
    assert "/rebalance/" in paths
    assert len(paths) > 15
    # (Static files: in production whitenoise answers them inside the CSP middleware, which sits
    # before it; the live server's own static handler bypasses the middleware, so not here.)
    for path in [*paths, "/no-such-page/", "/invoices/NOPE/"]:
        # The probes answer 503 while no Celery worker runs (as here): a true answer, not a crash.
        answer = admin.http.get(admin.base_url + path, timeout=30) if path in ("/healthz", "/readyz") else admin.get(path)
        assert answer.headers.get("Content-Security-Policy") == settings.VGPU_CONTENT_SECURITY_POLICY, path
    for path in ("/accounts/login/", "/finance/", "/api/v1/allocation"):
        assert hostile.get(path).headers["Content-Security-Policy"] == settings.VGPU_CONTENT_SECURITY_POLICY
    assert "'unsafe-inline'" not in settings.VGPU_CONTENT_SECURITY_POLICY


_INLINE = [
    (re.compile(r"<script(?![^>]*\bsrc=)[^>]*>", re.I), "inline <script>"),
    (re.compile(r"\son[a-z]+\s*=", re.I), "event-handler attribute"),
    (re.compile(r"\sstyle\s*=", re.I), "style= attribute"),
    (re.compile(r"<style\b", re.I), "<style> block"),
    (re.compile(r"javascript:", re.I), "javascript: URL"),
]


def test_no_template_has_inline_script_or_style():
    """What the policy would block: none of it may be in a template (the pages would break)."""
    found = [f"{path.relative_to(TEMPLATES)}: {what}" for path in TEMPLATES.rglob("*.html")
             for pattern, what in _INLINE if pattern.search(path.read_text())]
    assert found == []


# --- a rebalance execution that cannot be queued ----------------------------------------------

def test_an_execution_that_cannot_be_queued_says_so_and_the_plan_can_be_approved_again(
        signed_in, monkeypatch):
    from billing import tasks

    # A plan with a move to make (a plan with none has nothing to execute and is never approved).
    move = {"step": 1, "workload": "acme-prod/bert", "namespace": "acme-prod", "pod": "bert", "pod_uid": "uid-bert",
            "from_node": "n1", "from_gpu": 0, "to_node": "n2", "to_gpu": 0}
    plan = RebalancePlan.objects.create(created_at=datetime(2026, 11, 2, tzinfo=UTC), max_moves=1, moves=[move],
                                        nodes_freed=1, summary={"freed_nodes": ["n1"], "gpus_released": 8},
                                        status=RebalanceStatus.PROPOSED)
    admin = signed_in(ADMIN_GROUP)
    admin.get(f"/rebalance/{plan.pk}/approve/")  # the confirmation page sets the CSRF cookie

    def broker_down(*args, **kwargs):
        # What kombu raises when the broker refuses the connection.
        raise kombu.exceptions.OperationalError("Error 111 connecting to 127.0.0.1:1. Connection refused.")

    monkeypatch.setattr(tasks.execute_rebalance, "delay", broker_down)
    answer = admin.post_form(f"/rebalance/{plan.pk}/approve/", {"confirmation": confirmation_code(plan)})
    assert answer.status_code == 302
    page = admin.get("/rebalance/").text
    assert "could not be queued for execution" in page
    plan.refresh_from_db()
    assert plan.status == RebalanceStatus.PROPOSED
    assert plan.decided_by is None
    assert AuditEvent.objects.filter(action="rebalance.queue_failed", object_id=str(plan.pk)).count() == 1
    # The queue is back: approving again queues it.
    queued: list[int] = []
    monkeypatch.setattr(tasks.execute_rebalance, "delay", queued.append)
    admin.post_form(f"/rebalance/{plan.pk}/approve/", {"confirmation": confirmation_code(plan)})
    plan.refresh_from_db()
    assert plan.status == RebalanceStatus.APPROVED
    assert queued == [plan.pk]


# --- a database restart ------------------------------------------------------------------------

def test_persistent_connections_are_health_checked_at_the_start_of_each_request():
    """A Postgres restart breaks every persistent connection; with CONN_HEALTH_CHECKS a worker
    notices at the start of its next request and reconnects, instead of answering it 503."""
    assert settings.DATABASES["default"]["CONN_HEALTH_CHECKS"] is True
    max_age = settings.DATABASES["default"]["CONN_MAX_AGE"]
    assert max_age is not None
    assert max_age > 0
