"""Budgets and SLA tiers in the web app: admins change them (audited, visible in the node
policy), tenants see only their own budget state, others are refused."""

from __future__ import annotations

from decimal import Decimal

import pytest
from django.contrib.auth.models import Group, User

from billing.models import AuditEvent, Budget, SlaTier, Tenant, TenantMembership
from billing.queries.scope import ADMIN_GROUP

pytestmark = pytest.mark.django_db


def login(client, *, admin: bool = False, tenant: str | None = None) -> User:
    user = User.objects.create_user(username=f"u{admin}{tenant}", password="pw-not-used-123")
    if admin:
        user.groups.add(Group.objects.get_or_create(name=ADMIN_GROUP)[0])
    if tenant:
        TenantMembership.objects.create(user=user, tenant=Tenant.objects.get(slug=tenant))
    client.force_login(user)
    return user


@pytest.fixture
def tenants(db):
    Tenant.objects.create(slug="acme", name="Acme Robotics")
    Tenant.objects.create(slug="globex", name="Globex Research")
    SlaTier.objects.create(slug="gold", name="Gold", weight=Decimal(4))


def budget_form(**overrides):
    data = {"amount": "250.00", "currency": "USD", "soft_threshold_pct": "80",
            "hard_threshold_pct": "100", "hard_action": "throttle", "throttle_factor": "0.5",
            "owner": "finops@acme.example", "notify_emails": "", "webhook_url": ""}
    return {**data, **overrides}


def test_admin_sets_a_budget_which_is_audited_and_re_evaluated(client, tenants, monkeypatch, django_capture_on_commit_callbacks):
    from billing import tasks

    calls = []
    monkeypatch.setattr(tasks.evaluate_budgets, "delay", lambda: calls.append(1))
    login(client, admin=True)
    with django_capture_on_commit_callbacks(execute=True):
        resp = client.post("/budgets/acme/", budget_form())
    assert resp.status_code == 302
    assert Budget.objects.get(tenant__slug="acme").amount == Decimal("250.00")
    assert AuditEvent.objects.filter(action="budget.set", object_id="acme").count() == 1
    assert calls == [1]


def test_invalid_budget_form_is_refused_with_the_field_and_nothing_saved(client, tenants):
    login(client, admin=True)
    resp = client.post("/budgets/acme/", budget_form(soft_threshold_pct="120", hard_threshold_pct="100"))
    assert resp.status_code == 400
    assert not Budget.objects.exists()


def test_tenant_member_sees_only_their_budget_and_cannot_set_one(client, tenants):
    from django.utils import timezone

    from billing.services.budgets import set_budget

    for slug in ("acme", "globex"):
        set_budget(tenant_slug=slug, values={"amount": Decimal(100), "currency": "USD", "owner": "x@example.org"},
                   now=timezone.now(), actor_label="test")
    login(client, tenant="acme")
    html = client.get("/budgets/").content.decode()
    assert 'data-testid="budget-state-acme"' in html and "globex" not in html
    assert client.post("/budgets/acme/", budget_form()).status_code == 403
    assert client.get("/budgets/acme/").status_code == 403


def test_admin_changes_an_sla_weight_audited_and_visible_in_the_policy_api(client, tenants, node_token):
    login(client, admin=True)
    assert client.post("/sla-tiers/", {"slug": "gold", "weight": "6"}).status_code == 302
    event = AuditEvent.objects.get(action="sla_tier.weight_changed")
    assert (event.before, event.after) == ({"weight": "4.000"}, {"weight": "6.000"})
    policy = client.get("/api/v1/nodes/gpu-node-1/policy", HTTP_AUTHORIZATION=f"Bearer {node_token.token}")
    assert policy.json()["sla_tiers"]["gold"] == {"weight": "6.000"}
    assert client.post("/sla-tiers/", {"slug": "gold", "weight": "-1"}).status_code == 400
    assert SlaTier.objects.get(slug="gold").weight == Decimal(6)


def test_non_admins_cannot_open_sla_tiers(client, tenants):
    login(client, tenant="acme")
    assert client.get("/sla-tiers/").status_code == 403


def test_audit_log_shows_admin_changes_to_admins_only(client, tenants):
    login(client, admin=True)
    client.post("/sla-tiers/", {"slug": "gold", "weight": "5"})
    html = client.get("/audit/", {"action": "sla_tier."}).content.decode()
    assert "sla_tier.weight_changed" in html and "sla_tier:gold" in html
    client.logout()
    login(client, tenant="acme")
    assert client.get("/audit/").status_code == 403


def test_budget_form_starts_from_the_current_values_so_a_change_keeps_the_rest(client, tenants):
    login(client, admin=True)
    client.post("/budgets/acme/", budget_form(webhook_url="https://hooks.example/acme", notify_emails="a@example.org"))
    html = client.get("/budgets/acme/").content.decode()
    assert 'value="https://hooks.example/acme"' in html and 'value="a@example.org"' in html
    assert client.get("/budgets/nope/").status_code == 404
