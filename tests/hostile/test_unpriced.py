"""Hostile input over live HTTP: a node token reports a GPU model nobody approved. Its batch is
stored (usage is never lost) and the month's close still invoices every other tenant; the unknown
model's usage is reported, not billed, and /healthz shows a count without the name."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest
import requests

from billing.ledger.rollup import rollup_usage
from billing.models import GpuModel, Invoice, RateCard
from billing.services.identity.tokens import issue_node_token
from billing.services.invoicing.close import close_period
from tests import clock
from tests.conftest import A100, SHARED_GPU_WORKLOADS, healthz_as_admin, make_batch

MADE_UP = "Totally Real GPU 3000"


def _post(url: str, token: str, batch: dict) -> requests.Response:
    return requests.post(f"{url}/api/v1/usage/batches", data=json.dumps(batch), timeout=30,
                         headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"})


@pytest.mark.django_db(transaction=True)
def test_a_made_up_gpu_model_never_holds_the_close_of_the_other_tenants(live_server):
    now = clock.now()
    this_month = now.replace(day=1, hour=0, minute=0, second=0, microsecond=0)
    last_month = (this_month - timedelta(days=1)).replace(day=1).date()
    at = this_month - timedelta(hours=2)  # the last day of last month, over whatever today is
    GpuModel.objects.create(name=A100["model"], approved_at=now, approved_by="test")
    RateCard.objects.create(gpu_model=A100["model"], currency="USD", price_per_gpu_hour=Decimal("3600"),
                            effective_from=datetime(2020, 1, 1, tzinfo=UTC), source_url="https://example.org")
    honest = issue_node_token(node_name="gpu-node-1", now=now, actor_label="test")
    hostile = issue_node_token(node_name="gpu-node-666", now=now, actor_label="test")

    assert _post(live_server.url, honest.token, make_batch(start=at, workloads=SHARED_GPU_WORKLOADS)).status_code == 201
    # 20 GPU-seconds of a model no rate card can name, for a tenant of the attacker's choosing.
    attack = make_batch(node="gpu-node-666", start=at, seconds=20, workloads=[
        {"gpu": 0, "tenant": "acme", "pod": "x", "mem_used": 81920.0, "mem_granted": 81920.0, "sm_used": 108.0,
         "sm_granted": 108.0}])
    attack["gpus"][0]["model"] = MADE_UP
    resp = _post(live_server.url, hostile.token, attack)
    assert resp.status_code == 201, resp.text
    rollup_usage(now=clock.now())

    health = requests.get(f"{live_server.url}/healthz", timeout=30)
    # Anonymous: the status alone.
    assert set(health.json()) == {"status"}
    assert MADE_UP not in health.text
    detail = healthz_as_admin()
    assert json.loads(detail.content)["ledger"]["unapproved_gpus"] == 1
    assert MADE_UP not in detail.content.decode()

    result = close_period(month=last_month, now=clock.now())
    assert not result.already_closed
    totals = {i.tenant.slug: i.total_minor for i in Invoice.objects.filter(period__month=last_month)
              .select_related("tenant")}
    assert totals == {"acme": 100, "globex": 200}  # the priced usage, not a cent of the made-up model
    assert [(u.gpu_model, u.gpu_seconds, u.tenants) for u in result.unpriced] == [(MADE_UP, Decimal(20), ("acme",))]
