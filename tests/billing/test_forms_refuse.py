"""Forms that refuse what they cannot keep: ISO date inputs in every language, budgets
(currency, emails, webhook, thresholds), free prices, GPU models, retiring rate cards and SLA tiers.
Every refusal is a human message (translated) and changes nothing; the service refuses the same
input for every caller, not only the form."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

import pytest
from django.test import Client, override_settings
from django.utils import translation

from billing.errors import InvalidInput
from billing.ledger.models import GpuMinute
from billing.ledger.rollup import rollup_usage
from billing.models import AuditEvent, Budget, Gpu, GpuModel, Node, RateCard, SlaTier, Tenant
from billing.scope import ADMIN_GROUP, FINANCE_GROUP
from billing.services.budgets.spend import set_budget
from billing.services.ingest.policy import get_node_policy
from billing.services.pricing.rate_cards import create_rate_card, earliest_change, end_rate_card, retire_rate_card
from billing.services.pricing.sla import change_sla_tier, retire_sla_tier
from tests import clock
from tests.conftest import A100, make_batch, user_in

pytestmark = pytest.mark.django_db

MODEL = A100["model"]
DATE_VALUE = re.compile(r'<input type="text" name="(start|end)" value="([^"]*)"')


@pytest.fixture(autouse=True)
def _english_unless_asked() -> None:
    # A request in Chinese leaves the thread's language active; service calls here read English.
    translation.activate("en")


def logged_in(group: str, *, language: str = "en", tenant: str | None = None) -> Client:
    client = Client(HTTP_ACCEPT_LANGUAGE=language)
    client.force_login(user_in(group, tenant))
    return client


# --- Item 4: date inputs are written in the reader's language, and read in either ----------------
# Changed on purpose: they were <input type="date">, which the browser draws in its own locale
# (12/01/2026 in a US-English browser) whatever language the user chose.

WRITTEN = {"en": lambda d: d.isoformat(), "zh-hans": lambda d: f"{d.year}年{d.month}月{d.day}日"}


@pytest.mark.parametrize("language", ["en", "zh-hans"])
def test_every_date_input_is_written_in_the_readers_language_and_reads_either_language(language):
    Tenant.objects.create(slug="acme", name="Acme")
    finance = logged_in(FINANCE_GROUP, language=language)
    today = clock.now().date()
    written = WRITTEN[language]
    pages = {"/finance/": finance.get("/finance/"), "/tenants/acme/": finance.get("/tenants/acme/"),
             "/explore/": finance.get("/explore/")}
    for url, page in pages.items():
        assert page.headers["Content-Language"] == language, url
        values = dict(DATE_VALUE.findall(page.content.decode()))
        assert values == {"start": written(today.replace(day=1)), "end": written(today)}, url
    # ISO (links, scripts) and either language's way are read, and shown back in the reader's.
    last_week = today - timedelta(days=6)
    for start in (last_week.isoformat(), WRITTEN["zh-hans"](last_week), f"{last_week:%Y/%m/%d}"):
        page = finance.get("/finance/", {"start": start, "end": today.isoformat()})
        assert page.status_code == 200, start
        assert dict(DATE_VALUE.findall(page.content.decode())) == {"start": written(last_week), "end": written(today)}


@pytest.mark.parametrize(("language", "example"), [("en", "2026-01-31"), ("zh-hans", "2026年1月31日")])
def test_a_date_written_no_known_way_is_refused_with_an_example_in_the_readers_format(language, example):
    finance = logged_in(FINANCE_GROUP, language=language)
    page = finance.get("/finance/", {"start": "31/12/2026", "end": "2026-11-30"})
    assert page.status_code == 400
    assert example in page.content.decode()


# --- Item 5: budgets -------------------------------------------------------------------------------

@pytest.fixture
def acme(db) -> Tenant:
    return Tenant.objects.create(slug="acme", name="Acme Robotics")


def budget_form(**overrides: str) -> dict[str, str]:
    data = {"amount": "250.00", "currency": "USD", "soft_threshold_pct": "80", "hard_threshold_pct": "100",
            "hard_action": "throttle", "throttle_factor": "0.5", "owner": "finops@acme.example",
            "notify_emails": "", "webhook_url": ""}
    return {**data, **overrides}


def test_the_budget_form_offers_currencies_from_the_iso_list(acme):
    html = logged_in(ADMIN_GROUP).get("/budgets/acme/").content.decode()
    select = html.split('<select name="currency"')[1].split("</select>")[0]
    assert '<option value="USD" selected>' in select
    assert '<option value="JPY">' in select
    assert '<option value="KWD">' in select
    assert "XAU" not in select


@pytest.mark.parametrize(("overrides", "message"), [
    ({"currency": "zz"}, "Select a valid choice"),
    ({"currency": "123"}, "Select a valid choice"),
    ({"notify_emails": "finops@acme.example, not-an-email"}, "&#x27;not-an-email&#x27; is not an email address"),
    ({"webhook_url": "ftp://hooks.example/budget"}, "must use https"),
    ({"webhook_url": "http://hooks.example/budget"}, "must use https"),
    ({"soft_threshold_pct": "120", "hard_threshold_pct": "100"}, "must not be above enforce at"),
])
def test_a_budget_form_that_breaks_a_rule_is_refused_with_a_message_and_saves_nothing(acme, overrides, message):
    resp = logged_in(ADMIN_GROUP).post("/budgets/acme/", budget_form(**overrides))
    html = resp.content.decode()
    assert resp.status_code == 400
    assert message in html
    assert "budget_soft_not_above_hard" not in html
    assert "Constraint" not in html
    assert not Budget.objects.exists()
    assert not AuditEvent.objects.exists()


def test_the_threshold_message_is_translated(acme):
    resp = logged_in(ADMIN_GROUP, language="zh-hans").post(
        "/budgets/acme/", budget_form(soft_threshold_pct="120", hard_threshold_pct="100"))
    assert resp.status_code == 400
    assert "预警阈值（120 %）不得高于强制阈值（100 %）" in resp.content.decode()


@pytest.mark.parametrize(("values", "message"), [
    ({"currency": "zz"}, "ISO 4217"),
    ({"currency": "XAU"}, "ISO 4217"),
    ({"notify_emails": "a@example.org; b@"}, "'b@' is not an email address"),
    ({"webhook_url": "ftp://hooks.example/budget"}, "must use https"),
    ({"webhook_url": "https:///budget"}, "is not a URL with a host"),
    ({"webhook_url": "https://[::1/budget"}, "is not a URL with a host"),
    ({"webhook_url": "http://hooks.example/budget"}, "must use https"),
    ({"soft_threshold_pct": Decimal(90), "hard_threshold_pct": Decimal(80)}, "must not be above enforce at"),
])
def test_the_service_refuses_the_same_for_every_caller(acme, values, message):
    base = {"amount": Decimal(10), "currency": "USD", "owner": "finops@acme.example"}
    with pytest.raises(InvalidInput, match=re.escape(message)):
        set_budget(tenant_slug="acme", values={**base, **values}, now=clock.now(), actor_label="command")
    assert not Budget.objects.exists()
    assert not AuditEvent.objects.exists()


def test_the_service_normalises_what_it_keeps(acme):
    budget = set_budget(tenant_slug="acme", now=clock.now(), actor_label="test", values={
        "amount": Decimal(10), "currency": " eur ", "owner": "finops@acme.example",
        "notify_emails": " a@example.org;b@example.org ,, ", "webhook_url": " https://hooks.example/b "})
    budget.refresh_from_db()
    assert (budget.currency, budget.notify_emails, budget.webhook_url) == (
        "EUR", "a@example.org, b@example.org", "https://hooks.example/b")
    # Plain http only to a host the operator allow-listed (a receiver inside the cluster).
    with override_settings(VGPU_WEBHOOK_ALLOWED_HOSTS=["hooks.internal", "10.0.0.0/8"]):
        for url in ("http://hooks.internal/b", "http://10.1.2.3:8080/b"):
            assert set_budget(tenant_slug="acme", values={"webhook_url": url}, now=clock.now(),
                              actor_label="test").webhook_url == url


# --- Item 5: rate cards ----------------------------------------------------------------------------

@pytest.fixture
def open_card(db) -> RateCard:
    GpuModel.objects.create(name=MODEL, approved_at=clock.now(), approved_by="test")  # only approved models are priced
    return RateCard.objects.create(
        gpu_model=MODEL, currency="USD", price_per_gpu_hour=Decimal("2.500000"),
        effective_from=datetime(2020, 1, 1, tzinfo=UTC), source_url="https://example.org/list-2020",
        source_note="list price 2020")


@pytest.fixture
def fleet_a100(db) -> Gpu:
    now = clock.now()
    return Gpu.objects.create(uuid="GPU-a100-0", node=Node.objects.create(name="gpu-node-1"), model=MODEL,
                              memory_mb=A100["memory_mb"], sm_count=A100["sm_count"], first_seen_at=now,
                              last_seen_at=now)


def later(hours: int) -> datetime:
    return (clock.now() + timedelta(hours=hours)).replace(minute=7, second=0, microsecond=0)


def card(model: str = MODEL, *, price: str = "3", start: datetime | None = None, **extra: Any) -> int:
    return create_rate_card(gpu_model=model, price_per_gpu_hour=price, currency="USD",
                            effective_from=start or later(1), source_url="https://example.org/p",
                            source_note="test", now=clock.now(), actor_label="test", **extra).card_id


def local(t: datetime) -> str:
    return t.astimezone(UTC).strftime("%Y-%m-%dT%H:%M")


def test_price_zero_needs_the_explicit_confirmation_which_is_audited(client, open_card):
    admin = logged_in(ADMIN_GROUP)
    form = {"gpu_model": MODEL, "price_per_gpu_hour": "0", "currency": "USD",
            "effective_from": local(later(2)), "alpha": "", "billed_basis": "", "idle_policy": "",
            "source_url": "https://example.org/free", "source_note": "internal test cards are free"}
    resp = admin.post("/rate-cards/", form)
    assert resp.status_code == 400
    assert "I confirm this GPU model is free" in resp.content.decode()
    assert RateCard.objects.count() == 1
    assert admin.post("/rate-cards/", {**form, "confirm_free": "on"}).status_code == 302
    free = RateCard.objects.get(price_per_gpu_hour=0)
    event = AuditEvent.objects.get(action="rate_card.created", object_id=str(free.pk))
    assert event.after is not None
    assert event.after["confirmed_free"] is True
    assert event.after["price_per_gpu_hour"] == "0.000000"


def test_the_service_refuses_price_zero_without_the_confirmation(open_card):
    with pytest.raises(InvalidInput, match="free"):
        card(price="0")
    assert RateCard.objects.count() == 1


def test_a_gpu_model_is_chosen_from_the_approved_models_only(open_card, fleet_a100):
    admin = logged_in(ADMIN_GROUP)
    base = {"price_per_gpu_hour": "3", "currency": "USD", "effective_from": local(later(2)), "alpha": "",
            "billed_basis": "", "idle_policy": "", "source_url": "https://example.org/p", "source_note": "n"}
    resp = admin.post("/rate-cards/", {**base, "gpu_model": "NVIDIA Made-Up"})
    assert resp.status_code == 400
    assert "Select a valid choice" in resp.content.decode()
    assert RateCard.objects.count() == 1
    with pytest.raises(InvalidInput, match="not approved"):
        card("NVIDIA  A100-sxm4-80GB")


def test_retiring_an_upcoming_card_gives_its_time_back_to_the_card_before(open_card, fleet_a100):
    start = later(24)
    mistaken = card(price="30", start=start)
    assert RateCard.objects.get(pk=open_card.pk).effective_to == start
    retire_rate_card(card_id=mistaken, reason="typo: 30 instead of 3", now=clock.now(), actor_label="admin")
    retired, before = RateCard.objects.get(pk=mistaken), RateCard.objects.get(pk=open_card.pk)
    assert retired.retired_at is not None
    assert retired.effective_to == retired.effective_from == start
    assert before.effective_to is None  # prices again, open-ended as before the mistake
    actions = list(AuditEvent.objects.filter(action__startswith="rate_card.r").values_list("action", "object_id"))
    assert sorted(actions) == [("rate_card.resumed", str(open_card.pk)), ("rate_card.retired", str(mistaken))]
    # A retired card is done: no second retirement, no end, and a new price may start where it did.
    with pytest.raises(InvalidInput, match="already retired"):
        retire_rate_card(card_id=mistaken, reason="again", now=clock.now(), actor_label="admin")
    with pytest.raises(InvalidInput, match="is retired"):
        end_rate_card(card_id=mistaken, effective_to=later(30), now=clock.now(), actor_label="admin")
    assert card(price="3.5", start=start)


def test_retiring_the_card_in_effect_is_refused_while_the_fleet_has_its_gpus(open_card, fleet_a100):
    with pytest.raises(InvalidInput, match="would leave them without a price"):
        retire_rate_card(card_id=open_card.pk, reason="wrong", now=clock.now(), actor_label="admin")
    assert RateCard.objects.get(pk=open_card.pk).retired_at is None
    assert not AuditEvent.objects.exists()
    # The way out the message names: the correct price first (it supersedes the card), then retire.
    start = earliest_change(clock.now())
    card(price="2.75", start=start)
    retire_rate_card(card_id=open_card.pk, reason="superseded list price", now=clock.now(), actor_label="admin")
    kept = RateCard.objects.get(pk=open_card.pk)
    # Its past stays priced by it.
    assert kept.retired_at is not None
    assert kept.effective_to == start


def test_a_retired_card_stops_pricing_from_the_next_minute_and_keeps_the_minutes_it_priced(post_batch, open_card):
    """No GPU of the model in the fleet's registry at retirement: retiring leaves nothing unpriced
    that has a price. Minutes before the retirement keep the card; minutes after have none."""
    now = clock.now()
    start = now.replace(second=0, microsecond=0) - timedelta(minutes=2)
    assert post_batch(make_batch(start=start, seconds=60)).status_code == 201
    rollup_usage(now=now)
    assert GpuMinute.objects.get(minute=start).rate_card_id == open_card.pk
    Gpu.objects.all().delete()  # the node is gone from the fleet
    retire_rate_card(card_id=open_card.pk, reason="model left the fleet", now=now, actor_label="admin")
    assert GpuMinute.objects.get(minute=start).rate_card_id == open_card.pk
    assert RateCard.objects.get(pk=open_card.pk).effective_to == earliest_change(now)


def test_the_rate_card_page_retires_with_a_confirmation_and_shows_retired_cards(open_card):
    admin = logged_in(ADMIN_GROUP)
    GpuModel.objects.create(name="NVIDIA L4", approved_at=clock.now(), approved_by="test")
    mistaken = card("NVIDIA L4", price="9", start=later(48))
    html = admin.get("/rate-cards/").content.decode()
    control = html.split(f'data-testid="retire-rate-card-{mistaken}"')[1].split("</form>")[0]
    assert 'name="reason" required' in control
    assert 'type="checkbox" name="confirm" required' in control
    resp = admin.post(f"/rate-cards/{mistaken}/retire/", {"reason": "wrong model"})
    assert resp.status_code == 400
    assert "Tick the confirmation to retire." in resp.content.decode()
    assert RateCard.objects.get(pk=mistaken).retired_at is None
    assert admin.post(f"/rate-cards/{mistaken}/retire/", {"reason": "wrong model", "confirm": "on"}).status_code == 302
    row = admin.get("/rate-cards/").content.decode().split(f'data-testid="rate-card-{mistaken}"')[1].split("</tr>")[0]
    assert f'data-testid="rate-card-retired-{mistaken}"' in row
    assert "wrong model" in row
    assert f"retire-rate-card-{mistaken}" not in row
    assert f"end-rate-card-{mistaken}" not in row
    assert logged_in(FINANCE_GROUP).post(f"/rate-cards/{open_card.pk}/retire/",
                                         {"reason": "x", "confirm": "on"}).status_code == 403


# --- Item 5: SLA tiers -----------------------------------------------------------------------------

@pytest.fixture
def tiers(db) -> None:
    gold = SlaTier.objects.create(slug="gold", name="Gold", weight=Decimal(4))
    SlaTier.objects.create(slug="silver", name="Silver", weight=Decimal(2))
    SlaTier.objects.create(slug="best-effort", name="Best effort", weight=Decimal(1))
    Tenant.objects.create(slug="acme", name="Acme", default_sla_tier=gold)


@pytest.mark.parametrize(("slug", "message"), [
    ("gold", "is the default tier of acme"),
    ("best-effort", "cannot be retired"),
    ("platinum", "no SLA tier"),
])
def test_retiring_a_tier_in_use_or_the_fallback_tier_is_refused(tiers, slug, message):
    with pytest.raises(InvalidInput, match=message):
        retire_sla_tier(slug=slug, reason="r", now=clock.now(), actor_label="admin")
    assert not SlaTier.objects.exclude(retired_at=None).exists()
    assert not AuditEvent.objects.exists()


def test_a_retired_tier_is_audited_shown_frozen_and_stays_in_the_node_policy(tiers):
    admin = logged_in(ADMIN_GROUP)
    resp = admin.post("/sla-tiers/silver/retire/", {"reason": "merged into gold"})
    assert resp.status_code == 400
    assert "Tick the confirmation to retire." in resp.content.decode()
    assert admin.post("/sla-tiers/silver/retire/", {"reason": "merged into gold", "confirm": "on"}).status_code == 302
    event = AuditEvent.objects.get(action="sla_tier.retired")
    assert event.object_id == "silver"
    assert event.after is not None
    assert event.after["retire_reason"] == "merged into gold"
    row = admin.get("/sla-tiers/").content.decode().split('data-testid="sla-tier-silver"')[1].split("</tr>")[0]
    assert 'data-testid="sla-retired-silver"' in row
    assert "sla-edit-silver" not in row
    assert "sla-save-silver" not in row
    with pytest.raises(InvalidInput, match="is retired"):
        change_sla_tier(slug="silver", weight="3", now=clock.now(), actor_label="admin")
    # Pods still labelled silver keep its weight: agents refuse a pod whose tier they do not know.
    assert get_node_policy(node_name="gpu-node-1", now=clock.now()).body["sla_tiers"]["silver"]["weight"] == "2.000"
    resp = admin.post("/sla-tiers/gold/retire/", {"reason": "r", "confirm": "on"})
    assert resp.status_code == 400
    assert "is the default tier of acme" in resp.content.decode()


def test_retirement_messages_are_translated(tiers):
    with translation.override("zh-hans"), pytest.raises(InvalidInput) as caught:
        retire_sla_tier(slug="gold", reason="r", now=clock.now(), actor_label="admin")
    assert "默认" in str(caught.value)


def test_a_budget_with_a_code_off_the_list_is_not_silently_changed_to_another(acme):
    Budget.objects.create(tenant=acme, amount=Decimal(10), currency="zz", owner="finops@acme.example")
    admin = logged_in(ADMIN_GROUP)
    select = admin.get("/budgets/acme/").content.decode().split('<select name="currency"')[1].split("</select>")[0]
    assert " selected" not in select
    assert '<option value="">' in select
    resp = admin.post("/budgets/acme/", budget_form(currency=""))
    assert resp.status_code == 400
    assert Budget.objects.get(tenant=acme).currency == "zz"
