"""Rate cards in the web app: admins set a new price from a date (the open card is superseded in
the same transaction, both audited), every broken rule is a 400 that changes nothing, finance
reads only, everyone else is refused; a change re-prices minutes already in the ledger."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest
from django.contrib.auth.models import User

from billing.errors import InvalidInput
from billing.ledger.models import GpuMinute
from billing.ledger.rollup import rollup_usage
from billing.models import AuditEvent, BillingPeriod, GpuModel, RateCard
from billing.scope import ADMIN_GROUP, FINANCE_GROUP
from billing.services.pricing.rate_cards import create_rate_card, earliest_change
from tests import clock
from tests.conftest import A100, make_batch, user_in

pytestmark = pytest.mark.django_db

MODEL = A100["model"]
H100 = "NVIDIA H100 80GB HBM3"


def login(client, role: str) -> User:
    """role: admin, finance or tenant (a member of acme)."""
    group = {"admin": ADMIN_GROUP, "finance": FINANCE_GROUP}.get(role)
    user = user_in(group, "acme" if role == "tenant" else None)
    client.force_login(user)
    return user


@pytest.fixture(autouse=True)
def _approved_models(db) -> None:
    """Only approved models may be priced (billing.services.pricing.gpu_models): the A100 and the H100 are."""
    for name in (MODEL, H100):
        GpuModel.objects.create(name=name, approved_at=clock.now(), approved_by="test")


@pytest.fixture
def open_card(db) -> RateCard:
    return RateCard.objects.create(
        gpu_model=MODEL, currency="USD", price_per_gpu_hour=Decimal("2.500000"),
        effective_from=datetime(2020, 1, 1, tzinfo=UTC), alpha=Decimal("0.300"), billed_basis="granted",
        idle_policy="proportional", source_url="https://example.org/list-2020", source_note="list price 2020",
    )


def future_minute(hours: int = 1) -> datetime:
    """A whole minute well ahead of now and never the first instant of a month (minute 7)."""
    return (clock.now() + timedelta(hours=hours)).replace(minute=7, second=0, microsecond=0)


def local(t: datetime) -> str:
    return t.astimezone(UTC).strftime("%Y-%m-%dT%H:%M")


def new_price(**overrides: str) -> dict[str, str]:
    """The form's fields; `gpu_model` is chosen from the approved models."""
    data = {"gpu_model": overrides.pop("gpu_model", MODEL), "price_per_gpu_hour": "3.125", "currency": "USD",
            "effective_from": local(future_minute()), "alpha": "", "billed_basis": "", "idle_policy": "",
            "source_url": "https://cloud.example/pricing/a100", "source_note": "on-demand list price, us-east"}
    return {**data, **overrides}


def snapshot() -> tuple[list[tuple], int]:
    cards = list(RateCard.objects.order_by("id").values_list(
        "id", "gpu_model", "currency", "price_per_gpu_hour", "effective_from", "effective_to"))
    return cards, AuditEvent.objects.count()


def test_new_price_supersedes_the_open_card_writing_both_rows_and_two_audit_events(client, open_card):
    admin = login(client, "admin")
    start = future_minute()
    resp = client.post("/rate-cards/", new_price(effective_from=local(start)))
    assert resp.status_code == 302, resp.content.decode()

    open_card.refresh_from_db()
    assert open_card.effective_to == start
    new = RateCard.objects.get(effective_from=start)
    assert (new.price_per_gpu_hour, new.currency, new.effective_to) == (Decimal("3.125"), "USD", None)
    # Left blank: taken from the card it supersedes.
    assert (new.alpha, new.billed_basis, new.idle_policy) == (Decimal("0.300"), "granted", "proportional")

    created = AuditEvent.objects.get(action="rate_card.created")
    assert created.actor_id == admin.pk
    assert created.object_id == str(new.pk)
    assert created.before is None
    assert created.after is not None
    assert created.after["price_per_gpu_hour"] == "3.125000"
    assert created.after["source_url"] == "https://cloud.example/pricing/a100"
    superseded = AuditEvent.objects.get(action="rate_card.superseded")
    assert superseded.object_id == str(open_card.pk)
    assert superseded.before is not None
    assert superseded.after is not None
    assert superseded.before["effective_to"] is None
    assert superseded.after["effective_to"] == start.isoformat()
    assert superseded.after["superseded_by"] == new.pk
    assert AuditEvent.objects.count() == 2


@pytest.mark.parametrize(("overrides", "message"), [
    ({"price_per_gpu_hour": "-1"}, "must not be negative"),
    ({"price_per_gpu_hour": "1.1234567"}, "at most 6 decimal places"),
    ({"price_per_gpu_hour": "two"}, "is not a number"),
    ({"price_per_gpu_hour": "NaN"}, "finite number"),
    ({"price_per_gpu_hour": "123456789"}, "must be below"),
    ({"currency": "US"}, "Select a valid choice"),
    ({"currency": "ZZZ"}, "Select a valid choice"),
    ({"currency": "EUR"}, "invoices are single-currency"),
    ({"alpha": "1.5"}, "between 0 and 1"),
    ({"billed_basis": "most"}, "Select a valid choice"),
    ({"source_url": ""}, "This field is required"),
    ({"source_url": "not a url"}, "is not an http(s) URL"),
    ({"source_url": "ftp://example.org/p"}, "is not an http(s) URL"),
    ({"source_note": "   "}, "This field is required"),
    ({"gpu_model": ""}, "This field is required"),
    # Only approved names reach the form: any other, well-formed or not, is not a choice.
    ({"gpu_model": "NVIDIA\tH100"}, "Select a valid choice"),
    ({"gpu_model": "nvidia a100-sxm4-80gb"}, "Select a valid choice"),
    ({"gpu_model": "NVIDIA Made-Up 9000"}, "Select a valid choice"),
    ({"price_per_gpu_hour": "0"}, "I confirm this GPU model is free"),
    ({"effective_from": "yesterday"}, "Enter a valid date/time"),
    # Instants are read when the test runs (a callable), never while collecting.
    ({"effective_from": lambda: local(clock.now() - timedelta(hours=1))}, "is in the past"),
    ({"effective_from": lambda: local(future_minute()) + ":30"}, "must be a whole minute"),
])
def test_each_broken_rule_is_a_400_with_its_message_and_changes_nothing(client, open_card, overrides, message):
    login(client, "admin")
    before = snapshot()
    overrides = {key: value() if callable(value) else value for key, value in overrides.items()}
    resp = client.post("/rate-cards/", new_price(**overrides))
    assert resp.status_code == 400
    assert message in resp.content.decode()
    assert 'data-testid="rate-card-form"' in resp.content.decode()
    assert snapshot() == before


@pytest.mark.parametrize("status", [BillingPeriod.Status.CLOSED, BillingPeriod.Status.CLOSING])
def test_a_start_inside_a_closed_or_closing_period_is_refused(client, open_card, status):
    login(client, "admin")
    start = future_minute()
    BillingPeriod.objects.create(month=start.date().replace(day=1), status=status)
    before = snapshot()
    resp = client.post("/rate-cards/", new_price(effective_from=local(start)))
    assert resp.status_code == 400
    assert f"which is {status}" in resp.content.decode()
    assert snapshot() == before


def test_a_new_card_that_would_overlap_a_later_card_is_refused(client, open_card):
    login(client, "admin")
    later = future_minute(hours=48)
    assert client.post("/rate-cards/", new_price(gpu_model=H100, effective_from=local(later))).status_code == 302
    before = snapshot()
    # No H100 card now, one from `later`: an open-ended card from earlier would run into it.
    resp = client.post("/rate-cards/", new_price(gpu_model=H100, effective_from=local(future_minute())))
    assert resp.status_code == 400
    assert "would overlap it" in resp.content.decode()
    # The same start as an existing card is an overlap too.
    resp = client.post("/rate-cards/", new_price(gpu_model=H100, effective_from=local(later)))
    assert resp.status_code == 400
    assert snapshot() == before


def test_a_new_card_inside_a_card_with_a_set_end_is_refused(client, open_card):
    login(client, "admin")
    assert client.post("/rate-cards/", new_price(effective_from=local(future_minute(hours=48)))).status_code == 302
    before = snapshot()
    # The 2020 card now ends in 48 h; a new open card from 1 h would overlap the card after it.
    resp = client.post("/rate-cards/", new_price(effective_from=local(future_minute())))
    assert resp.status_code == 400
    assert "already runs until" in resp.content.decode()
    assert snapshot() == before


def test_a_currency_change_is_allowed_at_the_start_of_a_month(client, open_card):
    login(client, "admin")
    now = clock.now()
    next_month = datetime(now.year + (now.month == 12), now.month % 12 + 1, 1, tzinfo=UTC)
    resp = client.post("/rate-cards/", new_price(currency="EUR", effective_from=local(next_month)))
    assert resp.status_code == 302, resp.content.decode()
    assert RateCard.objects.get(effective_from=next_month).currency == "EUR"


def test_admin_ends_a_card_audited_and_the_same_rules_apply(client, open_card):
    login(client, "admin")
    end = future_minute()
    before = snapshot()
    resp = client.post(f"/rate-cards/{open_card.pk}/end/", {"effective_to": local(clock.now() - timedelta(days=1))})
    assert resp.status_code == 400
    assert "is in the past" in resp.content.decode()
    BillingPeriod.objects.create(month=end.date().replace(day=1), status=BillingPeriod.Status.CLOSED)
    resp = client.post(f"/rate-cards/{open_card.pk}/end/", {"effective_to": local(end)})
    assert resp.status_code == 400
    assert "which is closed" in resp.content.decode()
    assert snapshot() == before
    BillingPeriod.objects.all().delete()

    assert client.post(f"/rate-cards/{open_card.pk}/end/", {"effective_to": local(end)}).status_code == 302
    open_card.refresh_from_db()
    assert open_card.effective_to == end
    event = AuditEvent.objects.get(action="rate_card.ended")
    assert event.before is not None
    assert event.after is not None
    assert (event.before["effective_to"], event.after["effective_to"]) == (None, end.isoformat())


def test_a_card_may_not_be_extended_into_the_next_card(client, open_card):
    login(client, "admin")
    nxt = future_minute(hours=2)
    assert client.post("/rate-cards/", new_price(effective_from=local(nxt))).status_code == 302
    before = snapshot()
    resp = client.post(f"/rate-cards/{open_card.pk}/end/", {"effective_to": local(nxt + timedelta(hours=1))})
    assert resp.status_code == 400
    assert "at the latest" in resp.content.decode()
    assert snapshot() == before
    assert client.post("/rate-cards/999999/end/", {"effective_to": local(nxt)}).status_code == 400


def test_page_groups_cards_by_model_marks_the_current_one_and_finance_reads_without_forms(client, open_card):
    login(client, "admin")
    client.post("/rate-cards/", new_price(effective_from=local(future_minute())))
    client.post("/rate-cards/", new_price(gpu_model=H100, price_per_gpu_hour="4.5"))
    client.logout()

    login(client, "finance")
    resp = client.get("/rate-cards/")
    html = resp.content.decode()
    assert resp.status_code == 200
    assert 'data-testid="rate-card-table"' in html
    assert MODEL in html
    assert H100 in html
    current_row = html.split(f'data-testid="rate-card-{open_card.pk}"')[1].split("</tr>")[0]
    assert 'data-testid="rate-card-current"' in current_row
    assert "2.50 USD" in current_row
    assert "https://example.org/list-2020" in current_row
    assert 'data-testid="rate-card-form"' not in html
    assert "end-rate-card-" not in html


def test_finance_may_not_write_and_others_may_not_read(client, open_card):
    login(client, "finance")
    before = snapshot()
    assert client.post("/rate-cards/", new_price()).status_code == 403
    assert client.post(f"/rate-cards/{open_card.pk}/end/", {"effective_to": local(future_minute())}).status_code == 403
    client.logout()
    login(client, "tenant")
    assert client.get("/rate-cards/").status_code == 403
    assert client.post("/rate-cards/", new_price()).status_code == 403
    assert client.post(f"/rate-cards/{open_card.pk}/end/", {"effective_to": local(future_minute())}).status_code == 403
    html = client.get("/finance/").content.decode()
    assert 'data-testid="nav-rate-cards"' not in html
    client.logout()
    assert client.get("/rate-cards/").status_code == 302  # to the login page
    assert snapshot() == before


def test_a_price_change_re_prices_minutes_already_rolled_up_from_skewed_batches(post_batch, open_card):
    """Ingest accepts batches a little ahead of the server clock: a minute at the change may already
    be in the ledger, priced by the old card. The change re-rolls it in the same transaction."""
    now = clock.now()
    start = earliest_change(now)
    assert post_batch(make_batch(start=start, seconds=10)).status_code == 201
    rollup_usage(now=now)
    minute = GpuMinute.objects.get(minute=start)
    assert minute.rate_card_id == open_card.pk
    assert Decimal(0) < minute.card_cost < Decimal("0.01")  # 10 s at 2.5 USD/h

    change = create_rate_card(gpu_model=MODEL, price_per_gpu_hour="36", currency="USD", effective_from=start,
                              source_url="https://example.org/p", source_note="test", now=now, actor_label="test")
    assert change.reprice_minutes == 1
    minute = GpuMinute.objects.get(minute=start)
    assert minute.rate_card_id == change.card_id
    assert minute.card_cost == Decimal("0.1")


def test_new_price_form_offers_only_approved_models_and_prefills_the_earliest_allowed_start(client, open_card):
    from billing.models import Gpu, Node

    now = clock.now()
    # A node reports a model no admin approved: it is never offered, and a card for it is refused.
    Gpu.objects.create(uuid="GPU-l4", node=Node.objects.create(name="gpu-node-5"), model="NVIDIA L4",
                       memory_mb=23034, sm_count=58, first_seen_at=now, last_seen_at=now)
    login(client, "admin")
    before = earliest_change(clock.now())
    html = client.get("/rate-cards/").content.decode()
    after = earliest_change(clock.now())
    form = html.split('data-testid="rate-card-form"')[1].split("</form>")[0]
    select = form.split('<select name="gpu_model"')[1].split("</select>")[0]
    assert f'<option value="{MODEL}">' in select
    assert f'<option value="{H100}">' in select
    assert "NVIDIA L4" not in select
    assert 'name="new_gpu_model"' not in form
    start_input = form.split('name="effective_from"')[1].split(">")[0]
    assert any(f'value="{local(t)}"' in start_input and f'data-earliest="{local(t)}"' in start_input
               for t in (before, after))
    earliest = form.split('data-testid="rate-card-earliest">')[1].split("</span>")[0]
    assert any(local(t).replace("T", " ") + " UTC" in earliest for t in (before, after))
    assert "Leave blank to keep the current card&#x27;s alpha." in form
    resp = client.post("/rate-cards/", new_price(gpu_model="NVIDIA L4"))
    assert resp.status_code == 400
    assert "Select a valid choice" in resp.content.decode()
    with pytest.raises(InvalidInput, match="not approved"):
        create_rate_card(gpu_model="NVIDIA L4", price_per_gpu_hour="1", currency="USD",
                         effective_from=future_minute(), source_url="https://example.org/l4", source_note="list",
                         now=clock.now(), actor_label="test")
    assert not RateCard.objects.filter(gpu_model="NVIDIA L4").exists()
    # An approved model is accepted.
    resp = client.post("/rate-cards/", new_price(gpu_model=H100))
    assert resp.status_code == 302, resp.content.decode()


def test_end_control_says_the_card_stops_pricing_then_and_shows_a_set_end(client, open_card):
    login(client, "admin")
    end = future_minute(hours=3)
    html = client.get("/rate-cards/").content.decode()
    control = html.split(f'data-testid="end-rate-card-{open_card.pk}"')[1].split("</form>")[0]
    assert "Stop pricing at (UTC)" in control
    assert "End the card at this time" in control
    assert 'name="effective_to"' in control
    assert "min=" in control
    assert client.post(f"/rate-cards/{open_card.pk}/end/", {"effective_to": local(end)}).status_code == 302
    control = client.get("/rate-cards/").content.decode().split(
        f'data-testid="end-rate-card-{open_card.pk}"')[1].split("</form>")[0]
    assert f'value="{local(end)}"' in control
    assert "Move the end to this time" in control
