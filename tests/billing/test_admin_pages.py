"""Budgets and SLA tiers in the web app: admins change them (audited, visible in the node
policy), tenants see only their own budget state, others are refused."""

from __future__ import annotations

from decimal import Decimal

import pytest
from django.contrib.auth.models import Group, User

from allocator.risk import DEFAULT_MISS_TARGET
from billing.models import AuditEvent, Budget, SlaTier, Tenant, TenantMembership
from billing.models.tenancy import miss_target_decimal
from billing.scope import ADMIN_GROUP
from tests import clock
from tests.conftest import new_user

pytestmark = pytest.mark.django_db


def login(client, *, admin: bool = False, tenant: str | None = None) -> User:
    user = new_user(f"u{admin}{tenant}")
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

    from billing.services.budgets.spend import set_budget

    for slug in ("acme", "globex"):
        set_budget(tenant_slug=slug, values={"amount": Decimal(100), "currency": "USD", "owner": "x@example.org"},
                   now=clock.now(), actor_label="test")
    login(client, tenant="acme")
    html = client.get("/budgets/").content.decode()
    assert 'data-testid="budget-state-acme"' in html
    assert "globex" not in html
    assert client.post("/budgets/acme/", budget_form()).status_code == 403
    assert client.get("/budgets/acme/").status_code == 403


def test_admin_changes_an_sla_weight_audited_and_visible_in_the_policy_api(client, tenants, node_token):
    login(client, admin=True)
    assert client.post("/sla-tiers/", {"slug": "gold", "weight": "6"}).status_code == 302
    event = AuditEvent.objects.get(action="sla_tier.weight_changed")
    assert (event.before, event.after) == ({"weight": "4.000"}, {"weight": "6.000"})
    policy = client.get("/api/v1/nodes/gpu-node-1/policy", HTTP_AUTHORIZATION=f"Bearer {node_token.token}")
    assert policy.json()["sla_tiers"]["gold"]["weight"] == "6.000"
    assert client.post("/sla-tiers/", {"slug": "gold", "weight": "-1"}).status_code == 400
    assert SlaTier.objects.get(slug="gold").weight == Decimal(6)


def test_non_admins_cannot_open_sla_tiers(client, tenants):
    login(client, tenant="acme")
    assert client.get("/sla-tiers/").status_code == 403


def test_audit_log_shows_admin_changes_to_admins_only(client, tenants):
    login(client, admin=True)
    client.post("/sla-tiers/", {"slug": "gold", "weight": "5"})
    html = client.get("/audit/", {"action": "sla_tier."}).content.decode()
    assert "sla_tier.weight_changed" in html
    assert "sla_tier:gold" in html
    client.logout()
    login(client, tenant="acme")
    assert client.get("/audit/").status_code == 403


def test_budget_form_starts_from_the_current_values_so_a_change_keeps_the_rest(client, tenants):
    login(client, admin=True)
    client.post("/budgets/acme/", budget_form(webhook_url="https://hooks.example/acme", notify_emails="a@example.org"))
    html = client.get("/budgets/acme/").content.decode()
    assert 'value="https://hooks.example/acme"' in html
    assert 'value="a@example.org"' in html
    assert client.get("/budgets/nope/").status_code == 404


def tier_form(**overrides: str) -> dict[str, str]:
    data = {"slug": "platinum", "name": "Platinum", "weight": "8", "description": "Latency-critical inference"}
    return {**data, **overrides}


def sla_snapshot() -> tuple[list[tuple], int]:
    rows = list(SlaTier.objects.order_by("slug").values_list("slug", "name", "weight", "description",
                                                              "miss_target_memory", "miss_target_sm"))
    return rows, AuditEvent.objects.count()


def test_admin_creates_a_tier_audited_and_agents_receive_it_in_the_policy(client, tenants, node_token):
    admin = login(client, admin=True)
    auth = {"HTTP_AUTHORIZATION": f"Bearer {node_token.token}"}
    etag_before = client.get("/api/v1/nodes/gpu-node-1/policy", **auth)["ETag"]
    resp = client.post("/sla-tiers/new/", tier_form())
    assert resp.status_code == 302, resp.content.decode()
    tier = SlaTier.objects.get(slug="platinum")
    assert (tier.name, tier.weight, tier.description) == ("Platinum", Decimal(8), "Latency-critical inference")
    event = AuditEvent.objects.get(action="sla_tier.created")
    assert (event.actor_id, event.object_type, event.object_id, event.before) == (admin.pk, "sla_tier", "platinum",
                                                                                  None)
    # A tier allocator.risk does not name starts at its default miss targets.
    assert event.after == {"slug": "platinum", "name": "Platinum", "weight": "8.000",
                           "description": "Latency-critical inference",
                           "miss_target_memory": str(miss_target_decimal(DEFAULT_MISS_TARGET.memory)),
                           "miss_target_sm": str(miss_target_decimal(DEFAULT_MISS_TARGET.sm))}
    policy = client.get("/api/v1/nodes/gpu-node-1/policy", **auth)
    assert policy.json()["sla_tiers"]["platinum"] == {
        "weight": "8.000", "miss_targets": {"memory": event.after["miss_target_memory"],
                                            "sm": event.after["miss_target_sm"]}}
    assert policy["ETag"] != etag_before


@pytest.mark.parametrize(("overrides", "message"), [
    ({"slug": "Gold"}, "a DNS label"),
    ({"slug": "-gold"}, "a DNS label"),
    ({"slug": "gold_2"}, "a DNS label"),
    ({"slug": "x" * 64}, "at most 63 characters"),
    ({"slug": "gold"}, "already exists"),
    ({"slug": ""}, "This field is required"),
    ({"name": "   "}, "This field is required"),
    ({"name": "n" * 101}, "at most 100 characters"),
    ({"weight": "0"}, "weight must lie between 0.001 and 1000"),
    ({"weight": "1000.5"}, "weight must lie between 0.001 and 1000"),
    ({"weight": "1e30"}, "weight must lie between 0.001 and 1000"),
    ({"weight": "NaN"}, "weight must lie between 0.001 and 1000"),
    ({"weight": "1.0005"}, "weight may have at most 3 decimal places"),
    ({"weight": "heavy"}, "is not a number"),
    ({"description": "d" * 2001}, "at most 2000 characters"),
])
def test_each_broken_tier_rule_is_a_400_with_its_message_and_creates_nothing(client, tenants, overrides, message):
    login(client, admin=True)
    before = sla_snapshot()
    resp = client.post("/sla-tiers/new/", tier_form(**overrides))
    assert resp.status_code == 400
    html = resp.content.decode()
    assert message in html
    assert 'data-testid="sla-create-form"' in html
    assert sla_snapshot() == before


def test_admin_edits_name_and_description_audited_with_only_the_changed_fields(client, tenants):
    login(client, admin=True)
    form = client.get("/sla-tiers/gold/edit/").content.decode()
    assert 'value="Gold"' in form
    assert 'data-testid="sla-tier-edit-form"' in form
    resp = client.post("/sla-tiers/gold/edit/", {"name": "Gold plus", "description": "Training, guaranteed",
                                                 "weight": "4"})
    assert resp.status_code == 302, resp.content.decode()
    event = AuditEvent.objects.get(action="sla_tier.changed")
    assert event.object_id == "gold"
    assert event.before == {"name": "Gold", "description": ""}
    assert event.after == {"name": "Gold plus", "description": "Training, guaranteed"}

    # Only the weight: the action agents and the audit filter look for.
    client.post("/sla-tiers/gold/edit/", {"name": "Gold plus", "description": "Training, guaranteed", "weight": "5"})
    event = AuditEvent.objects.get(action="sla_tier.weight_changed")
    assert (event.before, event.after) == ({"weight": "4.000"}, {"weight": "5.000"})

    # Saving unchanged values records nothing.
    count = AuditEvent.objects.count()
    resp = client.post("/sla-tiers/gold/edit/", {"name": "Gold plus", "description": "Training, guaranteed",
                                                 "weight": "5.000"})
    assert resp.status_code == 302
    assert AuditEvent.objects.count() == count


def test_a_refused_edit_applies_none_of_its_fields(client, tenants):
    login(client, admin=True)
    before = sla_snapshot()
    resp = client.post("/sla-tiers/gold/edit/", {"name": "Renamed", "description": "new", "weight": "-1"})
    assert resp.status_code == 400
    assert "weight must lie between" in resp.content.decode()
    assert sla_snapshot() == before
    assert client.get("/sla-tiers/nope/edit/").status_code == 404


def test_a_refused_weight_shows_one_error_naming_the_weight_and_keeps_the_typed_value(client, tenants):
    login(client, admin=True)
    resp = client.post("/sla-tiers/", {"slug": "gold", "weight": "-1"})
    assert resp.status_code == 400
    html = resp.content.decode()
    # The browser test expects exactly one `.error` element, containing "weight".
    assert html.count('class="error"') == 1
    error = html.split('class="error"')[1].split("</p>")[0]
    assert "weight must lie between 0.001 and 1000, not -1" in error
    row = html.split('data-testid="sla-tier-gold"')[1].split("</tr>")[0]
    assert 'value="-1"' in row
    assert 'aria-invalid="true"' in row
    assert client.post("/sla-tiers/", {"slug": "nope", "weight": "2"}).status_code == 400


def test_tiers_page_shows_tenants_using_each_tier_by_default_and_who_changed_it_last(client, tenants):
    SlaTier.objects.create(slug="silver", name="Silver", weight=Decimal(2))
    Tenant.objects.filter(slug__in=["acme", "globex"]).update(default_sla_tier=SlaTier.objects.get(slug="gold"))
    admin = login(client, admin=True)
    client.post("/sla-tiers/", {"slug": "gold", "weight": "7"})
    html = client.get("/sla-tiers/").content.decode()
    assert 'data-testid="sla-tiers"' in html
    assert 'data-testid="sla-save-gold"' in html
    assert "2 tenants" in html.split('data-testid="sla-tenants-gold"')[1].split("</td>")[0]
    assert "0 tenants" in html.split('data-testid="sla-tenants-silver"')[1].split("</td>")[0]
    last = html.split('data-testid="sla-last-change-gold"')[1].split("</td>")[0]
    assert admin.get_username() in last
    assert "<time" in last
    assert "no change recorded" in html.split('data-testid="sla-last-change-silver"')[1].split("</td>")[0]
    # Heaviest first.
    assert html.index('data-testid="sla-tier-gold"') < html.index('data-testid="sla-tier-silver"')


def test_tenant_members_may_neither_create_nor_edit_tiers(client, tenants):
    login(client, tenant="acme")
    before = sla_snapshot()
    assert client.post("/sla-tiers/new/", tier_form()).status_code == 403
    assert client.get("/sla-tiers/gold/edit/").status_code == 403
    assert client.post("/sla-tiers/gold/edit/", {"name": "Mine", "description": "", "weight": "900"}).status_code == 403
    assert client.post("/sla-tiers/", {"slug": "gold", "weight": "900"}).status_code == 403
    assert sla_snapshot() == before


def test_sla_service_creates_and_refuses_a_duplicate_slug_without_a_second_audit_row(tenants):

    from billing.errors import InvalidInput
    from billing.services.pricing.sla import change_sla_tier, create_sla_tier

    now = clock.now()
    create_sla_tier(slug="bronze", name="  Bronze   tier ", weight="0.5", now=now, actor_label="cli")
    assert SlaTier.objects.get(slug="bronze").name == "Bronze tier"
    with pytest.raises(InvalidInput, match="already exists"):
        create_sla_tier(slug="bronze", name="Other", weight="1", now=now, actor_label="cli")
    with pytest.raises(InvalidInput, match="no SLA tier 'nope'"):
        change_sla_tier(slug="nope", name="x", now=now, actor_label="cli")
    assert AuditEvent.objects.filter(object_id="bronze").count() == 1


def test_resaving_a_multi_line_description_from_a_browser_records_no_change(client, tenants):
    SlaTier.objects.filter(slug="gold").update(description="Training.\nGuaranteed memory.")
    login(client, admin=True)
    resp = client.post("/sla-tiers/gold/edit/", {"name": "Gold", "weight": "4",
                                                 "description": "Training.\r\nGuaranteed memory.\r\n"})
    assert resp.status_code == 302
    assert not AuditEvent.objects.exists()


def edit_form(**overrides: str) -> dict[str, str]:
    data = {"name": "Gold", "description": "", "weight": "4", "miss_target_memory": "0.000001",
            "miss_target_sm": "0.00004"}
    return {**data, **overrides}


def test_admin_sets_a_tiers_miss_targets_audited_on_their_own_and_sent_to_agents(client, tenants, node_token):
    from agents.allocation import Policy
    from agents.policy_client import parse_policy
    from allocator.risk import MissTarget

    admin = login(client, admin=True)
    auth = {"HTTP_AUTHORIZATION": f"Bearer {node_token.token}"}
    etag_before = client.get("/api/v1/nodes/gpu-node-1/policy", **auth)["ETag"]
    form = client.get("/sla-tiers/gold/edit/").content.decode()
    # The form starts from the tier's targets, written as an admin types them.
    assert f'value="{format(miss_target_decimal(DEFAULT_MISS_TARGET.memory).normalize(), "f")}"' in form
    resp = client.post("/sla-tiers/gold/edit/", edit_form())
    assert resp.status_code == 302, resp.content.decode()
    event = AuditEvent.objects.get(action="sla_tier.miss_targets_changed")
    assert (event.actor_id, event.object_id) == (admin.pk, "gold")
    assert event.before == {"miss_target_memory": str(miss_target_decimal(DEFAULT_MISS_TARGET.memory)),
                            "miss_target_sm": str(miss_target_decimal(DEFAULT_MISS_TARGET.sm))}
    assert event.after == {"miss_target_memory": "0.0000010000", "miss_target_sm": "0.0000400000"}
    policy = client.get("/api/v1/nodes/gpu-node-1/policy", **auth)
    assert policy["ETag"] != etag_before
    assert policy.json()["sla_tiers"]["gold"] == {"weight": "4.000",
                                                  "miss_targets": {"memory": "0.0000010000", "sm": "0.0000400000"}}
    # The agent reads the service's document as it is sent.
    agent_policy = parse_policy(policy.json(), base=Policy()).allocation
    assert agent_policy.miss_target_for("gold") == MissTarget(memory=1e-6, sm=4e-5)
    # The page says what the numbers mean in plain words.
    row = client.get("/sla-tiers/").content.decode().split('data-testid="sla-miss-targets-gold"')[1].split("</td>")[0]
    assert "Memory: 1 in 1,000,000 seconds" in row
    assert "SMs: 1 in 25,000 seconds" in row
    # Blank keeps the targets; the same values again record nothing.
    count = AuditEvent.objects.count()
    assert client.post("/sla-tiers/gold/edit/", edit_form(miss_target_memory="", miss_target_sm=" ")).status_code == 302
    assert client.post("/sla-tiers/gold/edit/", edit_form(miss_target_memory="1e-6")).status_code == 302
    assert AuditEvent.objects.count() == count


@pytest.mark.parametrize(("field", "value", "message"), [
    ("miss_target_memory", "0", "memory miss target must lie between 0 and 1, both excluded"),
    ("miss_target_memory", "1", "memory miss target must lie between 0 and 1, both excluded"),
    ("miss_target_memory", "-0.001", "memory miss target must lie between 0 and 1, both excluded"),
    ("miss_target_sm", "1.5", "SM miss target must lie between 0 and 1, both excluded"),
    ("miss_target_sm", "NaN", "SM miss target must lie between 0 and 1, both excluded"),
    ("miss_target_sm", "-Infinity", "SM miss target must lie between 0 and 1, both excluded"),
    ("miss_target_sm", "1e-11", "SM miss target may have at most 10 decimal places"),
    ("miss_target_memory", "1 in 1000", "memory miss target &#x27;1 in 1000&#x27; is not a number"),
    ("miss_target_memory", "0.001\x00", "Null characters are not allowed"),
    ("miss_target_memory", "9" * 41, "at most 40 characters"),
])
def test_a_broken_miss_target_is_a_400_naming_it_and_changes_nothing(client, tenants, field, value, message):
    login(client, admin=True)
    before = sla_snapshot()
    # A valid name and weight beside it: nothing of the form is applied.
    resp = client.post("/sla-tiers/gold/edit/", edit_form(name="Renamed", weight="9", **{field: value}))
    assert resp.status_code == 400
    assert message in resp.content.decode()
    assert sla_snapshot() == before
    created = client.post("/sla-tiers/new/", {**tier_form(), field: value})
    assert created.status_code == 400
    assert sla_snapshot() == before


def test_a_new_tier_takes_the_miss_targets_given_and_the_seeded_tiers_start_at_allocator_risks(tenants):
    import importlib

    from django.apps import apps

    from allocator.risk import DEFAULT_MISS_TARGETS
    from billing.services.pricing.sla import create_sla_tier

    tier = create_sla_tier(slug="platinum", name="Platinum", weight="8", miss_target_memory="1e-7",
                           miss_target_sm=" 0.000002 ", now=clock.now(), actor_label="cli")
    assert (tier.miss_target_memory, tier.miss_target_sm) == (Decimal("1e-7"), Decimal("0.000002"))
    # The migration that added the targets gives every tier allocator.risk's own for its slug.
    for slug in DEFAULT_MISS_TARGETS:
        SlaTier.objects.get_or_create(slug=slug, defaults={"name": slug, "weight": Decimal(1)})
    migration = importlib.import_module("billing.migrations.0038_sla_tier_miss_targets")
    migration.per_tier_defaults(apps, None)
    for slug, target in DEFAULT_MISS_TARGETS.items():
        stored = SlaTier.objects.get(slug=slug)
        assert (float(stored.miss_target_memory), float(stored.miss_target_sm)) == (target.memory, target.sm)
    assert float(SlaTier.objects.get(slug="platinum").miss_target_memory) == DEFAULT_MISS_TARGET.memory
