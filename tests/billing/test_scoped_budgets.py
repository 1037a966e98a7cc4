"""Budgets by namespace and label beside the tenant's own: each counts its part of the tenant's
spend by the same rules (a namespace's parts add up to the tenant's), moves through the same states
audited, reaches agents through the node policy (namespaces only: a label budget only notifies)
and the admission webhook; set by finance and admins from the budgets page, validated."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

import pytest
from django.test import Client
from hypothesis import HealthCheck, given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st

from billing.errors import InvalidInput
from billing.ledger.rollup import rollup_usage
from billing.models import AuditEvent, Budget, BudgetStatus, RateCard, Tenant
from billing.scope import ADMIN_GROUP, FINANCE_GROUP
from billing.services.budgets import review_pod
from billing.services.budgets.spend import (
    BudgetTransition,
    evaluate_budgets,
    get_budget_spends,
    get_month_spend,
    set_budget,
)
from tests import clock
from tests.conftest import A100, make_batch, state_transitions, user_in

pytestmark = pytest.mark.django_db

# 3600 USD per GPU-hour: a workload holding x of the card costs x USD per second.
POD = {"gpu": 0, "tenant": "acme", "mem_used": 8192.0, "mem_granted": 8192.0, "sm_used": 10.8, "sm_granted": 10.8}


@pytest.fixture
def acme(db, mid_month):
    RateCard.objects.create(gpu_model=A100["model"], currency="USD", price_per_gpu_hour=Decimal("3600"),
                            effective_from=datetime(2020, 1, 1, tzinfo=UTC), source_url="https://example.org")
    Tenant.objects.create(slug="globex", name="Globex", namespaces=["globex-prod"])
    return Tenant.objects.create(slug="acme", name="Acme Robotics", namespaces=["acme-prod", "acme-staging"])


def with_labels(batch: dict[str, Any], labels: dict[str, dict[str, str]]) -> dict[str, Any]:
    """The batch with each pod's labels as its agent reports them (the allow-listed ones)."""
    for sample in batch["samples"]:
        if sample["pod"] in labels:
            sample["labels"] = labels[sample["pod"]]
    return batch


def meter(post_batch, start: datetime, workloads: list[dict[str, Any]], *, seq: int, seconds: int = 10,
          labels: dict[str, dict[str, str]] | None = None) -> None:
    batch = with_labels(make_batch(start=start, seq=seq, seconds=seconds, workloads=workloads), labels or {})
    assert post_batch(batch).status_code == 201
    rollup_usage(now=clock.now())


def values(amount: str, action: str = "throttle", **extra: Any) -> dict[str, Any]:
    return {"amount": Decimal(amount), "currency": "USD", "hard_action": action, "owner": "finops@acme.example",
            **extra}


def namespace_budget(namespace: str, amount: str, action: str = "throttle", **extra: Any) -> Budget:
    return set_budget(tenant_slug="acme", scope="namespace", namespace=namespace, values=values(amount, action, **extra),
                      now=clock.now(), actor_label="finance-1")


def label_budget(label: str, amount: str, **extra: Any) -> Budget:
    return set_budget(tenant_slug="acme", scope="label", label=label, values=values(amount, "notify", **extra),
                      now=clock.now(), actor_label="finance-1")


# --- What each scope counts ------------------------------------------------------------------------

def test_each_scope_counts_its_part_of_the_tenants_spend(acme, post_batch, minute_start):
    prod = {**POD, "pod": "bert-1", "namespace": "acme-prod"}  # 0.10 of the card
    staging = {**POD, "pod": "llm-1", "namespace": "acme-staging", "mem_used": 16384.0, "mem_granted": 16384.0,
               "sm_used": 21.6, "sm_granted": 21.6}  # 0.20
    meter(post_batch, minute_start, [prod, staging], seq=1,
          labels={"bert-1": {"team": "ml"}, "llm-1": {"team": "research"}})
    tenant = set_budget(tenant_slug="acme", values=values("100"), now=clock.now(), actor_label="finance-1")
    budgets = [tenant, namespace_budget("acme-prod", "100"), namespace_budget("acme-staging", "100"),
               label_budget("team=ml", "100"), label_budget("team=nobody", "100")]
    spends = get_budget_spends(budgets=budgets, now=clock.now())
    got = [spends[b.pk].month_to_date for b in budgets]
    assert got == [Decimal("3.00"), Decimal("1.00"), Decimal("2.00"), Decimal("1.00"), Decimal(0)]
    # The tenant budget's figure is the portal's month to date, read the same way.
    assert got[0] == get_month_spend(tenant="acme", now=clock.now()).month_to_date


# At most 4 pods of at most 25 % of the GPU each: their grants fit the card, which ingest checks (four of
# up to 30 % could ask 120 % of its memory, and the batch was refused).
@hypothesis_settings(max_examples=15, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(shares=st.lists(st.tuples(st.sampled_from(["acme-prod", "acme-staging"]), st.integers(1, 25)),
                       min_size=1, max_size=4))
def test_a_tenants_namespace_budgets_add_up_to_its_own(acme, post_batch, minute_start, shares):
    """Whatever runs where: the namespaces' spends add up to the tenant's exactly, at ledger precision
    (the examples' usage accumulates in the database; the property holds for all of it)."""
    Budget.objects.all().delete()
    BudgetStatus.objects.all().delete()
    workloads = [{**POD, "pod": f"pod-{i}", "namespace": ns, "mem_used": 81920 * pct / 100,
                  "mem_granted": 81920 * pct / 100, "sm_used": 108 * pct / 100, "sm_granted": 108 * pct / 100}
                 for i, (ns, pct) in enumerate(shares)]
    examples = AuditEvent.objects.filter(action="budget.set").count() // 3  # 3 budgets per example
    # Each example meters a minute of its own: two windows of one GPU may not overlap.
    meter(post_batch, minute_start - timedelta(minutes=1 + examples), workloads, seq=1 + examples)
    budgets = [set_budget(tenant_slug="acme", values=values("100"), now=clock.now(), actor_label="t"),
               namespace_budget("acme-prod", "100"), namespace_budget("acme-staging", "100")]
    spends = get_budget_spends(budgets=budgets, now=clock.now())
    tenant, prod, staging = (spends[b.pk] for b in budgets)
    assert prod.month_to_date + staging.month_to_date == tenant.month_to_date
    assert prod.charge + staging.charge == tenant.charge


def test_a_namespace_budget_moves_through_the_states_audited_and_notified_with_its_scope(acme, post_batch,
                                                                                         minute_start):
    namespace_budget("acme-prod", "2.00")
    meter(post_batch, minute_start, [{**POD, "pod": "bert-1", "namespace": "acme-prod"},
                                     {**POD, "pod": "noise", "namespace": "acme-staging"}], seq=1, seconds=20)
    moves = state_transitions(evaluate_budgets(now=clock.now()))
    assert [(m.before, m.after) for m in moves] == [("ok", "enforced")]  # 2.00 of acme-prod's; staging's not counted
    payload = moves[0].payload()
    assert payload["scope"] == {"kind": "namespace", "namespace": "acme-prod"}
    assert payload["tenant"] == "acme"
    assert evaluate_budgets(now=clock.now()) == []
    audited = AuditEvent.objects.filter(action="budget.state_changed").get()
    assert audited.object_id == "acme/namespace/acme-prod"
    set_event = AuditEvent.objects.get(action="budget.set")
    assert set_event.after is not None
    assert set_event.after["scope"] == {"kind": "namespace", "namespace": "acme-prod"}


def test_a_label_budget_counts_labelled_pods_and_only_notifies(acme, post_batch, minute_start, client, node_token):
    label_budget("team=ml", "0.50")
    meter(post_batch, minute_start, [{**POD, "pod": "bert-1"}, {**POD, "pod": "other"}], seq=1,
          labels={"bert-1": {"team": "ml"}})
    moves = state_transitions(evaluate_budgets(now=clock.now()))
    assert [(m.after, m.action, m.scope) for m in moves] == [("enforced", "notify", {"kind": "label", "label": "team=ml"})]
    policy = client.get("/api/v1/nodes/gpu-node-1/policy", HTTP_AUTHORIZATION=f"Bearer {node_token.token}").json()
    assert policy["tenants"]["acme"]["budget"] == {"state": "ok"}
    assert policy["namespaces"] == {}


# --- Validation -------------------------------------------------------------------------------------

@pytest.mark.parametrize(("kwargs", "message"), [
    ({"scope": "namespace", "namespace": "globex-prod"}, "not one of acme's namespaces"),
    ({"scope": "namespace", "namespace": ""}, "not one of acme's namespaces"),
    ({"scope": "label", "label": "team"}, "name=value"),
    ({"scope": "label", "label": "-bad-=ml"}, "the name must be"),
    ({"scope": "cluster"}, "not one of tenant, namespace, label"),
])
def test_a_scope_that_cannot_be_counted_is_refused_and_nothing_written(acme, kwargs, message):
    with pytest.raises(InvalidInput, match=message):
        set_budget(tenant_slug="acme", values=values("10", "notify"), now=clock.now(), actor_label="t", **kwargs)
    assert not Budget.objects.exists()
    assert not AuditEvent.objects.filter(action="budget.set").exists()


def test_a_label_budget_refuses_an_enforcing_action_and_a_new_budget_an_existing_scope(acme):
    for action in ("throttle", "block", "evict-best-effort"):
        with pytest.raises(InvalidInput, match="a label budget only notifies"):
            set_budget(tenant_slug="acme", scope="label", label="team=ml", values=values("10", action),
                       now=clock.now(), actor_label="t")
    namespace_budget("acme-prod", "10")
    with pytest.raises(InvalidInput, match="already has a budget on namespace acme-prod"):
        set_budget(tenant_slug="acme", scope="namespace", namespace="acme-prod", values=values("20"),
                   now=clock.now(), actor_label="t", must_be_new=True)
    assert Budget.objects.get().amount == Decimal(10)


# --- Enforcement: the node policy and admission -----------------------------------------------------

def test_an_enforced_namespace_budget_reaches_agents_for_that_namespace_only(acme, post_batch, minute_start, client,
                                                                               node_token):
    namespace_budget("acme-prod", "0.50", action="evict-best-effort")
    namespace_budget("acme-staging", "0.50", action="notify")
    meter(post_batch, minute_start, [{**POD, "pod": "bert-1", "namespace": "acme-prod"},
                                     {**POD, "pod": "llm-1", "namespace": "acme-staging"}], seq=1)
    assert {t.after for t in state_transitions(evaluate_budgets(now=clock.now()))} == {"enforced"}
    policy = client.get("/api/v1/nodes/gpu-node-1/policy", HTTP_AUTHORIZATION=f"Bearer {node_token.token}").json()
    assert policy["namespaces"] == {"acme-prod": {"budget": {"state": "enforced", "action": "evict-best-effort",
                                                             "throttle_factor": "0.500"}}}
    assert policy["tenants"]["acme"]["budget"] == {"state": "ok"}


def _pod_review(namespace: str, uid: str) -> dict[str, Any]:
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
            "request": {"uid": uid, "kind": {"kind": "Pod"}, "operation": "CREATE", "namespace": namespace,
                        "object": {"metadata": {"name": "trainer", "uid": f"pod-{uid}"},
                                   "spec": {"containers": [{"resources": {"limits": {"nvidia.com/gpu": "1"}}}]}}}}


def test_a_namespace_budget_that_blocks_refuses_new_gpu_pods_there_and_nowhere_else(acme, post_batch, minute_start):
    namespace_budget("acme-prod", "0.50", action="block", owner="ml-lead@acme.example")
    meter(post_batch, minute_start, [{**POD, "pod": "bert-1", "namespace": "acme-prod"}], seq=1)
    evaluate_budgets(now=clock.now())
    denied = review_pod(_pod_review("acme-prod", "r1"), now=clock.now())
    assert not denied.allowed
    assert denied.message is not None
    assert "namespace acme-prod (tenant acme)" in denied.message
    assert "ml-lead@acme.example" in denied.message
    assert review_pod(_pod_review("acme-staging", "r2"), now=clock.now()).allowed


# --- Pages --------------------------------------------------------------------------------------------

def _client(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def _form(**extra: str) -> dict[str, str]:
    return {"tenant": "acme", "scope": "namespace", "namespace": "acme-prod", "label": "", "amount": "250",
            "currency": "USD", "soft_threshold_pct": "80", "hard_threshold_pct": "100", "hard_action": "throttle",
            "throttle_factor": "0.5", "owner": "finops@acme.example", "notify_emails": "", "webhook_url": "", **extra}


def test_finance_sets_a_namespace_budget_from_the_page_and_the_tenant_sees_it_on_its_portal(acme):
    finance = _client(user_in(FINANCE_GROUP))
    assert finance.get("/budgets/new/?tenant=acme").status_code == 200
    answer = finance.post("/budgets/new/", _form())
    assert answer.status_code == 302, answer.content.decode()[:2000]
    budget = Budget.objects.get(scope="namespace")
    assert (budget.tenant.slug, budget.namespace, budget.amount) == ("acme", "acme-prod", Decimal(250))
    listing = finance.get("/budgets/").content.decode()
    assert 'data-testid="budget-state-acme/namespace/acme-prod"' in listing
    assert finance.post(f"/budgets/{budget.pk}/edit/", _form(amount="300")).status_code == 302
    budget.refresh_from_db()
    assert budget.amount == Decimal(300)
    portal = _client(user_in(tenant="acme")).get("/tenants/acme/").content.decode()
    assert 'data-testid="scoped-budgets"' in portal
    assert "acme-prod" in portal


def test_the_page_refuses_with_a_400_that_says_why_and_tenants_cannot_set_budgets(acme):
    admin = _client(user_in(ADMIN_GROUP))
    answer = admin.post("/budgets/new/", _form(namespace="globex-prod"))
    assert answer.status_code == 400
    assert "not one of acme" in answer.content.decode()
    answer = admin.post("/budgets/new/", _form(scope="label", label="team=ml"))
    assert answer.status_code == 400
    assert "only notifies" in answer.content.decode()
    member = _client(user_in(tenant="acme"))
    assert member.post("/budgets/new/", _form()).status_code == 403
    assert not Budget.objects.exists()


def test_a_transitions_payload_names_a_tenant_budget_as_before():
    transition = BudgetTransition(budget_id=1, tenant="acme", month="2026-11", before="ok", after="warned",
                                  spend=Decimal(1), forecast=Decimal(2), amount=Decimal(3), currency="USD",
                                  action="throttle", owner="o", at=datetime(2026, 11, 5, tzinfo=UTC))
    assert transition.payload()["scope"] == {"kind": "tenant"}
