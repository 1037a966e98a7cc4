"""Unknown GPU models never block money (docs/billing.md, Approved GPU models and Unpriced usage).

A hand-built month: one node reports a GPU model no admin approved. The close invoices every tenant
for its priced usage and lists the unpriced usage (model, GPU-hours, tenants); approving the model
and pricing it from the month's start then bills that usage as a late-usage adjustment on the next
invoice, to the cent. The nodes page and /healthz flag the GPU meanwhile."""

from __future__ import annotations

import json
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal

import pytest
from django.contrib.auth.models import User

from billing.errors import InvalidInput
from billing.ledger.rollup import rollup_usage
from billing.models import AuditEvent, GpuModel, Invoice, RateCard
from billing.scope import ADMIN_GROUP, FINANCE_GROUP
from billing.services.identity.tokens import issue_node_token
from billing.services.invoicing.close import close_period, list_unpriced
from billing.services.pricing.gpu_models import approve_gpu_model, check_nvml_name, retire_gpu_model
from billing.services.pricing.rate_cards import create_rate_card
from tests import clock
from tests.conftest import A100, SHARED_GPU_WORKLOADS, make_batch, user_in

pytestmark = pytest.mark.django_db

FAKE = "NVIDIA Fake-GPU 9000"
FEB, MAR = date(2027, 2, 1), date(2027, 3, 1)
MID_MARCH = datetime(2027, 3, 15, 12, tzinfo=UTC)


@pytest.fixture(autouse=True)
def _mid_march(time_machine):
    time_machine.move_to(MID_MARCH, tick=True)


@pytest.fixture
def a100_priced(one_usd_per_gpu_second):
    """The A100 approved and priced at 1 USD per GPU-second (3600 per GPU-hour)."""
    GpuModel.objects.create(name=A100["model"], approved_at=clock.now(), approved_by="test")
    return one_usd_per_gpu_second


def login(client, group: str) -> User:
    user = user_in(group)
    client.force_login(user)
    return user


def _unknown_model_batch(*, seq: int, start: datetime) -> dict:
    """gpu-node-2's GPU claims a model no admin approved: acme holds a quarter of it, initech half,
    for 20 s (memory and SMs alike), so 5 and 10 GPU-seconds."""
    batch = make_batch(node="gpu-node-2", seq=seq, start=start, seconds=20, workloads=[
        {"gpu": 0, "tenant": "acme", "pod": "fake-1", "sla_tier": "gold", "mem_used": 20480.0,
         "mem_granted": 20480.0, "sm_used": 27.0, "sm_granted": 27.0},
        {"gpu": 0, "tenant": "initech", "pod": "fake-2", "sla_tier": "silver", "mem_used": 40960.0,
         "mem_granted": 40960.0, "sm_used": 54.0, "sm_granted": 54.0},
    ])
    batch["gpus"][0]["model"] = FAKE
    return batch


@pytest.fixture
def february(post_batch, a100_priced):
    """acme 1.00 and globex 2.00 USD of A100 usage on gpu-node-1; the unknown model on gpu-node-2."""
    feb15 = datetime(2027, 2, 15, 12, tzinfo=UTC)
    assert post_batch(make_batch(start=feb15, seq=1, workloads=SHARED_GPU_WORKLOADS)).status_code == 201
    other = issue_node_token(node_name="gpu-node-2", now=clock.now(), actor_label="test")
    resp = post_batch(_unknown_model_batch(seq=1, start=feb15), token=other.token)
    assert resp.status_code == 201, resp.content  # stored: usage is never lost
    rollup_usage(now=clock.now())
    return other


def test_the_close_invoices_the_priced_usage_and_the_unknown_model_later_becomes_an_exact_adjustment(
        post_batch, february):
    result = close_period(month=FEB, now=MID_MARCH)
    # Every tenant's invoice for what is priced; initech has nothing priced, so no invoice yet.
    totals = {i.tenant.slug: i.total_minor for i in Invoice.objects.select_related("tenant")}
    assert totals == {"acme": 100, "globex": 200}
    assert all(line.gpu_model == A100["model"] for line in Invoice.objects.get(tenant__slug="acme").lines.all())
    # The unpriced remainder is its own item: model, GPU-seconds, tenants affected.
    assert [(u.gpu_model, u.gpu_seconds, u.tenants) for u in result.unpriced] == [
        (FAKE, Decimal(20), ("acme", "initech"))]
    assert result.unpriced[0].gpu_hours == Decimal(20) / 3600

    # The admin approves the model and prices it from February's start: 7200 USD per GPU-hour.
    approve_gpu_model(name=FAKE, now=MID_MARCH, actor_label="admin")
    change = create_rate_card(gpu_model=FAKE, price_per_gpu_hour="7200", currency="USD",
                              effective_from=datetime(2027, 2, 1, tzinfo=UTC), source_url="https://example.org/fake",
                              source_note="list price", now=MID_MARCH, actor_label="admin")
    assert change.reprice_minutes > 0
    assert list_unpriced(FEB) == []
    # March: acme uses the A100 again; the March close carries February's late usage.
    assert post_batch(make_batch(start=datetime(2027, 3, 10, 12, tzinfo=UTC), seq=2,
                                 workloads=SHARED_GPU_WORKLOADS)).status_code == 201
    rollup_usage(now=clock.now())
    close_period(month=MAR, now=datetime(2027, 4, 2, tzinfo=UTC))

    feb_invoices = {i.tenant.slug: i.total_minor for i in Invoice.objects.filter(period__month=FEB)
                    .select_related("tenant")}
    assert feb_invoices == {"acme": 100, "globex": 200}  # untouched
    adjustments = {(line.invoice.tenant.slug, line.gpu_model, line.usage_month): (line.amount, line.amount_minor)
                   for line in Invoice.objects.filter(period__month=MAR).get(tenant__slug="acme").lines
                   .filter(kind="adjustment").select_related("invoice__tenant")}
    # 5 GPU-seconds at 2 USD per GPU-second: exactly 10; nothing for the A100, which did not change.
    assert adjustments == {("acme", FAKE, FEB): (Decimal("10"), 1000)}
    initech = Invoice.objects.get(period__month=MAR, tenant__slug="initech")
    assert [(line.kind, line.gpu_model, line.usage_month, line.amount, line.amount_minor)
            for line in initech.lines.all()] == [("adjustment", FAKE, FEB, Decimal("20"), 2000)]
    assert initech.total_minor == 2000
    acme_march = Invoice.objects.get(period__month=MAR, tenant__slug="acme")
    assert acme_march.total_minor == 100 + 1000


def test_a_card_for_unpriced_usage_may_start_in_the_past_but_never_re_prices_what_was_billed(february):
    approve_gpu_model(name=FAKE, now=MID_MARCH, actor_label="admin")
    # The A100 was priced in February: its past is billed and stays so.
    with pytest.raises(InvalidInput, match="in the past"):
        create_rate_card(gpu_model=A100["model"], price_per_gpu_hour="1", currency="USD",
                         effective_from=datetime(2027, 2, 1, tzinfo=UTC), source_url="https://example.org/a",
                         source_note="n", now=MID_MARCH, actor_label="admin")
    # A month beyond the late-usage horizon: no invoice could carry the adjustment.
    with pytest.raises(InvalidInput, match="beyond the late-usage horizon"):
        create_rate_card(gpu_model=FAKE, price_per_gpu_hour="1", currency="USD",
                         effective_from=datetime(2026, 12, 1, tzinfo=UTC), source_url="https://example.org/a",
                         source_note="n", now=MID_MARCH, actor_label="admin")
    # The A100 invoices February in USD: a card in EUR would put two currencies on one invoice.
    with pytest.raises(InvalidInput, match="two currencies"):
        create_rate_card(gpu_model=FAKE, price_per_gpu_hour="1", currency="EUR",
                         effective_from=datetime(2027, 2, 1, tzinfo=UTC), source_url="https://example.org/a",
                         source_note="n", now=MID_MARCH, actor_label="admin")
    assert not RateCard.objects.filter(gpu_model=FAKE).exists()


def test_the_rate_card_form_refuses_an_unapproved_model_and_offers_it_once_approved(client, february):
    login(client, ADMIN_GROUP)
    form = {"gpu_model": FAKE, "price_per_gpu_hour": "1", "currency": "USD", "effective_from": "2027-03-20T00:00",
            "alpha": "", "billed_basis": "", "idle_policy": "", "source_url": "https://example.org/p",
            "source_note": "n"}
    page = client.get("/rate-cards/").content.decode()
    assert FAKE not in page.split('data-testid="rate-card-form"')[1]  # reported by a node, not offered
    resp = client.post("/rate-cards/", form)
    assert resp.status_code == 400
    assert "Select a valid choice" in resp.content.decode()
    assert not RateCard.objects.filter(gpu_model=FAKE).exists()
    assert client.post("/gpu-models/", {"name": FAKE, "note": "new card type"}).status_code == 302
    assert AuditEvent.objects.filter(action="gpu_model.approved", object_id=FAKE).exists()
    assert f'<option value="{FAKE}">' in client.get("/rate-cards/").content.decode()
    assert client.post("/rate-cards/", form).status_code == 302
    # Retiring from the page needs the confirmation and a reason, and is refused while a card prices it.
    resp = client.post("/gpu-models/retire/", {"name": FAKE, "reason": "mistake"})
    assert resp.status_code == 400
    assert "Tick the confirmation to retire." in resp.content.decode()
    resp = client.post("/gpu-models/retire/", {"name": FAKE, "reason": "mistake", "confirm": "on"})
    assert resp.status_code == 400
    assert "still prices" in resp.content.decode()
    assert client.post("/gpu-models/", {"name": "NVIDIA <b>"}).status_code == 400
    client.force_login(user_in(FINANCE_GROUP, tenant="acme"))
    assert client.get("/gpu-models/").status_code == 403


def test_the_nodes_page_healthz_and_metrics_flag_gpus_of_an_unapproved_model(client, settings, february):
    login(client, ADMIN_GROUP)
    page = client.get("/nodes/").content.decode()
    assert 'data-testid="gpu-unapproved-gpu-node-2"' in page
    assert 'data-testid="gpu-unapproved-gpu-node-1"' not in page
    health = json.loads(client.get("/healthz").content)
    assert health["ledger"]["unapproved_gpus"] == 1
    assert FAKE not in json.dumps(health)  # a count, no names
    settings.VGPU_METRICS_TOKEN, settings.VGPU_METRICS_TOKEN_FILE = "scrape-token-for-tests", ""
    metrics = client.get("/metrics", HTTP_AUTHORIZATION="Bearer scrape-token-for-tests").content.decode()
    assert "\nvgpu_ledger_unapproved_gpus 1.0\n" in metrics
    assert FAKE not in metrics
    gpu_models = client.get("/gpu-models/").content.decode()
    assert 'data-testid="unapproved-model"' in gpu_models
    assert FAKE in gpu_models
    approve_gpu_model(name=FAKE, now=clock.now(), actor_label="admin")
    assert 'data-testid="gpu-unapproved-gpu-node-2"' not in client.get("/nodes/").content.decode()
    assert json.loads(client.get("/healthz").content)["ledger"]["unapproved_gpus"] == 0


def test_the_periods_page_lists_the_unpriced_item_after_the_close(client, february):
    close_period(month=FEB, now=MID_MARCH)
    login(client, FINANCE_GROUP)
    page = client.get("/periods/").content.decode()
    item = page.split('data-testid="unpriced-item"')[1].split("</li>")[0]
    assert f'data-model="{FAKE}"' in item
    assert "0.01 GPU-hours" in item
    assert "acme, initech" in item


def test_gpu_model_names_are_validated_as_nvml_reports_them_and_retiring_is_audited(a100_priced):
    assert check_nvml_name("  NVIDIA H100 80GB HBM3 ") == "NVIDIA H100 80GB HBM3"
    for bad in ("", "x" * 96, "NVIDIA\tH100", "NVIDIA  H100", "-NVIDIA", "NVIDIA H100\u200b", "NVIDIA <script>",
                "NVIDIA A100\nSXM4"):
        with pytest.raises(InvalidInput):
            check_nvml_name(bad)
    with pytest.raises(InvalidInput, match="only in case or spacing"):
        approve_gpu_model(name="nvidia a100-sxm4-80gb", now=clock.now(), actor_label="admin")
    # A priced model cannot be retired while its card prices it: that would take a price away.
    with pytest.raises(InvalidInput, match="still prices"):
        retire_gpu_model(name=A100["model"], reason="wrong", now=clock.now(), actor_label="admin")
    approve_gpu_model(name="NVIDIA L4", now=clock.now(), actor_label="admin")
    retire_gpu_model(name="NVIDIA L4", reason="not in our fleet", now=clock.now(), actor_label="admin")
    assert AuditEvent.objects.filter(action="gpu_model.retired", object_id="NVIDIA L4").exists()
    with pytest.raises(InvalidInput, match="not approved"):
        create_rate_card(gpu_model="NVIDIA L4", price_per_gpu_hour="1", currency="USD",
                         effective_from=clock.now().replace(second=0, microsecond=0) + timedelta(hours=1),
                         source_url="https://example.org/l4", source_note="n", now=clock.now(), actor_label="admin")


@pytest.mark.django_db(transaction=True)
def test_the_migration_approves_every_model_a_rate_card_names() -> None:
    from django.db import connection
    from django.db.migrations.executor import MigrationExecutor

    MigrationExecutor(connection).migrate([("billing", "0022_api_tokens")])
    try:
        # Two cards of the A100 (one ended, one open) and one of the H100.
        for model, start, end in ((A100["model"], 2020, 2021), (A100["model"], 2021, None),
                                  ("NVIDIA H100 80GB HBM3", 2020, None)):
            RateCard.objects.create(gpu_model=model, currency="USD", price_per_gpu_hour=Decimal("1"),
                                    effective_from=datetime(start, 1, 1, tzinfo=UTC),
                                    effective_to=datetime(end, 1, 1, tzinfo=UTC) if end else None,
                                    source_url="https://example.org")
    finally:
        # Forward through 0023 to every app's newest migration: going back to 0022 unapplied the
        # later ones too, and the tests after this one need the whole schema.
        executor = MigrationExecutor(connection)
        executor.migrate(executor.loader.graph.leaf_nodes())
    assert sorted(GpuModel.objects.values_list("name", "retired_at")) == [
        (A100["model"], None), ("NVIDIA H100 80GB HBM3", None)]


def test_the_close_command_reports_the_unpriced_item_and_has_no_allow_unpriced_option(february):
    from io import StringIO

    from django.core.management import call_command

    out = StringIO()
    call_command("close_period", "--month", "2027-02", stdout=out)
    assert "2 invoice(s) finalized" in out.getvalue()
    assert f"unpriced: {FAKE}: 0.01 GPU-hours, tenants acme, initech" in out.getvalue()
    with pytest.raises(Exception, match="unrecognized arguments"):
        call_command("close_period", "--month", "2027-02", "--allow-unpriced")
