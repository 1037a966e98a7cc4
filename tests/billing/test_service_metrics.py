"""GET /metrics: who may scrape it, and that the ledger's state and the process counters it shows
are the true ones. Under several gunicorn workers: tests/billing/test_service_metrics_gunicorn.py."""

from __future__ import annotations

import json
from datetime import timedelta
from decimal import Decimal

import pytest
from prometheus_client.parser import text_string_to_metric_families

from billing.ledger.models import GpuHour, UsageBatch
from billing.models import BillingPeriod, Budget, BudgetStatus, Node, Tenant
from billing.services.ingest.rollup import quarantine_batch
from tests import clock
from tests.conftest import A100, iso, make_batch, with_day

TOKEN = "scrape-token-for-tests"


@pytest.fixture
def scrape_token(settings):
    settings.VGPU_METRICS_TOKEN = TOKEN
    settings.VGPU_METRICS_TOKEN_FILE = ""


def scrape(client) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """{(sample name, sorted labels): value} of one scrape."""
    resp = client.get("/metrics", HTTP_AUTHORIZATION=f"Bearer {TOKEN}")
    assert resp.status_code == 200, resp.content
    assert resp["Content-Type"].startswith("text/plain; version=0.0.4")
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(resp.content.decode()) for s in family.samples}


def test_without_a_configured_token_nobody_may_scrape(client, db, settings):
    settings.VGPU_METRICS_TOKEN = settings.VGPU_METRICS_TOKEN_FILE = ""
    resp = client.get("/metrics", HTTP_AUTHORIZATION="Bearer anything")
    assert resp.status_code == 403
    assert b"VGPU_METRICS_TOKEN_FILE" in resp.content
    assert b"vgpu_ledger" not in resp.content


def test_a_scrape_needs_the_bearer_token(client, db, scrape_token):
    for headers in ({}, {"HTTP_AUTHORIZATION": "Bearer wrong"}, {"HTTP_AUTHORIZATION": f"Basic {TOKEN}"}):
        resp = client.get("/metrics", **headers)
        assert resp.status_code == 401
        assert b"vgpu_ledger" not in resp.content
        assert resp["WWW-Authenticate"].startswith("Bearer")
    assert client.get("/metrics", HTTP_AUTHORIZATION=f"Bearer {TOKEN}").status_code == 200


def test_the_token_file_is_read_at_every_scrape(client, db, settings, tmp_path):
    token_file = tmp_path / "token"
    token_file.write_text("first\n")
    settings.VGPU_METRICS_TOKEN, settings.VGPU_METRICS_TOKEN_FILE = "", str(token_file)
    assert client.get("/metrics", HTTP_AUTHORIZATION="Bearer first").status_code == 200
    token_file.write_text("rotated\n")
    assert client.get("/metrics", HTTP_AUTHORIZATION="Bearer first").status_code == 401
    assert client.get("/metrics", HTTP_AUTHORIZATION="Bearer rotated").status_code == 200
    token_file.unlink()
    assert client.get("/metrics", HTTP_AUTHORIZATION="Bearer rotated").status_code == 403


def test_backlog_lag_and_quarantine_are_the_ledgers(client, post_batch, minute_start, scrape_token):
    for seq in (1, 2, 3):
        assert post_batch(make_batch(seq=seq, start=minute_start + timedelta(seconds=10 * seq))).status_code == 201
    oldest, newest = UsageBatch.objects.order_by("id").first(), UsageBatch.objects.order_by("id").last()
    assert oldest is not None
    assert newest is not None
    UsageBatch.objects.filter(id=oldest.id).update(received_at=clock.now() - timedelta(minutes=7))
    quarantine_batch(batch_id=newest.id, error="test", now=clock.now())
    metrics = scrape(client)
    assert metrics[("vgpu_ledger_batches_pending", ())] == 2
    assert metrics[("vgpu_ledger_batches_quarantined", ())] == 1
    assert 7 * 60 <= metrics[("vgpu_ledger_rollup_lag_seconds", ())] < 8 * 60


def test_undelivered_batches_are_counted_per_node(client, node_token, minute_start, scrape_token):
    report = {"batch_seq": 5, "window": {"start": iso(minute_start), "end": iso(minute_start + timedelta(seconds=10))},
              "samples": 10, "size_bytes": 100, "status": 409, "reason": "conflict", "content_sha256": "0" * 64,
              "superseded_by": None}
    resp = client.post("/api/v1/nodes/gpu-node-1/undelivered",
                       json.dumps({"batches": [report, {**report, "batch_seq": 6}]}),
                       content_type="application/json", HTTP_AUTHORIZATION=f"Bearer {node_token.token}")
    assert resp.status_code == 201
    metrics = scrape(client)
    assert metrics[("vgpu_ledger_undelivered_batches", (("node", "gpu-node-1"),))] == 2


def test_periods_are_counted_by_state_with_stalled_closes_apart(client, db, settings, scrape_token):
    now = clock.now()
    settings.VGPU_PERIOD_CLOSE_STALE_S = 900
    month = now.date().replace(day=1)
    earlier = [(month - timedelta(days=31 * i)).replace(day=1) for i in (1, 2, 3)]
    BillingPeriod.objects.create(month=month, status="open")
    BillingPeriod.objects.create(month=earlier[0], status="closing", progress_at=now - timedelta(hours=1))
    BillingPeriod.objects.create(month=earlier[1], status="closing", progress_at=now)
    BillingPeriod.objects.create(month=earlier[2], status="closed")
    metrics = scrape(client)
    assert {state: metrics[("vgpu_ledger_billing_periods", (("state", state),))]
            for state in ("open", "closing", "stalled", "closed", "failed")} == {
        "open": 1, "closing": 1, "stalled": 1, "closed": 1, "failed": 0}


def test_budgets_are_counted_by_state_and_action_without_tenant_names(client, db, scrape_token):
    now = clock.now()
    for slug, action, state in (("acme", "block", "enforced"), ("globex", "block", None), ("initech", "throttle", "warned")):
        budget = Budget.objects.create(tenant=Tenant.objects.create(slug=slug, name=slug), amount=Decimal(100),
                                       currency="USD", owner="finance", hard_action=action)
        if state:
            BudgetStatus.objects.create(budget=budget, month=now.date().replace(day=1), state=state,
                                        evaluated_at=now, changed_at=now)
    resp = client.get("/metrics", HTTP_AUTHORIZATION=f"Bearer {TOKEN}")
    assert b"acme" not in resp.content
    assert b"globex" not in resp.content
    metrics = scrape(client)
    budgets = {dict(labels)["state"] + "/" + dict(labels)["action"]: v
               for (name, labels), v in metrics.items() if name == "vgpu_ledger_budgets"}
    # Every state x action, zeros included: 3 states x 4 actions (notify only joined throttle, block
    # and evict-best-effort with budgets by label, which only notify).
    assert len(budgets) == 12
    assert {k: v for k, v in budgets.items() if v} == {"enforced/block": 1, "ok/block": 1, "warned/throttle": 1}


def test_this_months_cost_and_gpu_seconds_come_from_the_day_ledger(client, db, scrape_token):
    node = Node.objects.create(name="gpu-node-1")
    hour = clock.now().replace(minute=0, second=0, microsecond=0)
    common = {"node": node, "gpu_model": A100["model"], "idle_allocated": Decimal(0), "hour": hour}
    with_day(GpuHour.objects.create(gpu_uuid="GPU-a", metered_seconds=Decimal(3600), card_cost=Decimal("2.5"),
                                    charged=Decimal("2"), idle_cost=Decimal("0.5"), currency="USD", priced=True,
                                    **common))
    with_day(GpuHour.objects.create(gpu_uuid="GPU-b", metered_seconds=Decimal(1800), card_cost=Decimal(0),
                                    charged=Decimal(0), idle_cost=Decimal(0), currency="", priced=False, **common))
    # Last month's hours are not this month's cost.
    with_day(GpuHour.objects.create(gpu_uuid="GPU-a", metered_seconds=Decimal(3600), card_cost=Decimal(99),
                                    charged=Decimal(99), idle_cost=Decimal(0), currency="USD", priced=True,
                                    **{**common, "hour": hour.replace(day=1, hour=0) - timedelta(hours=1)}))
    metrics = scrape(client)
    cost = {dict(labels)["part"]: v for (name, labels), v in metrics.items() if name == "vgpu_ledger_month_cost"}
    assert cost == {"card": 2.5, "charged": 2.0, "idle": 0.5}
    assert metrics[("vgpu_ledger_month_gpu_seconds", (("priced", "true"),))] == 3600
    assert metrics[("vgpu_ledger_month_gpu_seconds", (("priced", "false"),))] == 1800


def test_ingest_counts_stored_samples_once_and_every_answer(client, post_batch, minute_start, scrape_token):
    before = scrape(client)
    batch = make_batch(seq=1, start=minute_start, seconds=10)
    assert post_batch(batch).status_code == 201
    assert post_batch(batch).status_code == 200  # a retry: the same samples are not counted again
    assert post_batch(batch, token="vgl_wrong").status_code == 401
    after = scrape(client)

    def grew(name: str, **labels: str) -> float:
        key = (name, tuple(sorted(labels.items())))
        return after[key] - before.get(key, 0.0)

    assert grew("vgpu_ledger_ingest_samples_total") == 10
    assert [grew("vgpu_ledger_ingest_batches_total", code=c) for c in ("201", "200", "401")] == [1, 1, 1]


def test_admission_reviews_are_counted_by_result(client, db, settings, scrape_token):
    settings.VGPU_ADMISSION_TOKEN, settings.VGPU_ADMISSION_TOKEN_FILE = "admission-secret", ""
    before = scrape(client)
    review = {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
              "request": {"uid": "u1", "operation": "CREATE", "namespace": "default",
                          "object": {"metadata": {"name": "p", "namespace": "default"},
                                     "spec": {"containers": [{"name": "c"}]}}}}
    body = json.dumps(review)
    assert client.post("/api/v1/admission/pods", body, content_type="application/json").status_code == 401
    ok = client.post("/api/v1/admission/pods", body, content_type="application/json",
                     HTTP_AUTHORIZATION="Bearer admission-secret")
    assert ok.status_code == 200
    assert ok.json()["response"]["allowed"] is True
    after = scrape(client)

    def grew(result: str) -> float:
        key = ("vgpu_ledger_admission_reviews_total", (("result", result),))
        return after[key] - before[key]

    assert (grew("unauthenticated"), grew("allowed"), grew("denied")) == (1, 1, 0)
