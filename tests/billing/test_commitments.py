"""Commitments (docs/billing.md, Commitments and on-prem cards): reserved rates and on-prem cards
price the cards they cover, the first cards of the model in node order in each minute, whichever
node's batch arrives first; several commitments of one model form one pool at their card-weighted
rate; a rebuild prices exactly what the rollups did; every commitment is validated, audited and
re-prices the ledger; the page shows each beside the market rate with what went unused."""

from __future__ import annotations

import itertools
import json
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal
from typing import Any

import pytest
from django.db.models import Sum
from django.test import Client

from billing.errors import InvalidInput
from billing.ledger.models import GpuDay, GpuHour, GpuMinute, UsageDay, UsageHour, UsageMinute
from billing.ledger.pricing import committed_keys
from billing.ledger.rollup import rebuild_ledger, rollup_usage
from billing.models import AuditEvent, Commitment, CommitmentKind, GpuModel, RateCard
from billing.scope import ADMIN_GROUP, FINANCE_GROUP
from billing.services.identity.tokens import issue_node_token
from billing.services.pricing import (
    OnPremCosts,
    amortised_rate,
    commitment_term,
    create_commitment,
    create_rate_card,
    earliest_hour,
    retire_commitment,
)
from tests import clock
from tests.conftest import A100, make_batch, user_in

pytestmark = pytest.mark.django_db

MODEL = A100["model"]
MARKET = Decimal("3.6")  # 0.001 per GPU-second
NODES = ("gpu-node-1", "gpu-node-2", "gpu-node-3")
LEDGER = (UsageMinute, GpuMinute, UsageHour, GpuHour, UsageDay, GpuDay)
WORKLOAD = {"gpu": 0, "tenant": "acme", "pod": "bert-1", "mem_used": 40960.0, "mem_granted": 40960.0,
            "sm_used": 54.0, "sm_granted": 54.0}


@pytest.fixture
def market(db) -> RateCard:
    GpuModel.objects.create(name=MODEL, approved_at=clock.now(), approved_by="test")
    return RateCard.objects.create(gpu_model=MODEL, currency="USD", price_per_gpu_hour=MARKET,
                                   effective_from=datetime(2020, 1, 1, tzinfo=UTC), source_url="https://example.org")


@pytest.fixture
def fleet(db) -> dict[str, str]:
    return {name: issue_node_token(node_name=name, now=clock.now(), actor_label="test").token for name in NODES}


def committed(*, cards: int, price: str, start: datetime | None = None, kind: str = CommitmentKind.RESERVED) -> Commitment:
    """A commitment in force since `start` (a year back by default), as if recorded then."""
    begin = start or datetime(2020, 1, 1, tzinfo=UTC)
    return Commitment.objects.create(
        gpu_model=MODEL, kind=kind, cards=cards, currency="USD", price_per_gpu_hour=Decimal(price), term_start=begin,
        term_end=begin + timedelta(days=3650), term_years=3, effective_from=begin,
        effective_to=begin + timedelta(days=3650), note="contract 42", created_at=begin, created_by="test")


def post(client: Client, token: str, payload: dict[str, Any]) -> None:
    response = client.generic("POST", "/api/v1/usage/batches", json.dumps(payload).encode(),
                              content_type="application/json", HTTP_AUTHORIZATION=f"Bearer {token}")
    assert response.status_code == 201, response.content


def meter(client: Client, fleet: dict[str, str], node: str, start: datetime, *, seq: int = 1, seconds: int = 60) -> None:
    post(client, fleet[node], make_batch(node=node, seq=seq, start=start, seconds=seconds, workloads=[WORKLOAD]))


def card_costs() -> dict[str, Decimal]:
    return {g.gpu_uuid: g.card_cost for g in GpuMinute.objects.all()}


def ledger_snapshot() -> list[list[tuple[Any, ...]]]:
    return [sorted(tuple(v for k, v in r.items() if k != "id") for r in model.objects.values()) for model in LEDGER]


def test_committed_keys_are_the_first_metered_cards_in_node_then_gpu_order():
    present = {(2, "GPU-a"): Decimal(60), (1, "GPU-z"): Decimal(60), (1, "GPU-b"): Decimal(0), (3, "GPU-c"): Decimal(1)}
    assert committed_keys(present, 2) == {(1, "GPU-z"), (2, "GPU-a")}
    assert committed_keys(present, 9) == {(1, "GPU-z"), (2, "GPU-a"), (3, "GPU-c")}


def test_a_commitment_covers_the_first_cards_whichever_node_arrives_first(client, market, fleet, minute_start):
    committed(cards=1, price="1.8")
    # node-2 first: it is the only card metered in that minute, so the commitment covers it...
    meter(client, fleet, "gpu-node-2", minute_start)
    rollup_usage(now=clock.now())
    assert card_costs() == {"GPU-gpu-node-2-0": Decimal("0.030000000000")}  # 60 s at 1.8/h
    # ...until node-1's card of the same minute arrives: it comes first, and node-2's is re-priced.
    meter(client, fleet, "gpu-node-1", minute_start)
    rollup_usage(now=clock.now())
    assert card_costs() == {"GPU-gpu-node-1-0": Decimal("0.030000000000"), "GPU-gpu-node-2-0": Decimal("0.060000000000")}
    covered = GpuMinute.objects.get(gpu_uuid="GPU-gpu-node-1-0")
    assert (covered.committed_seconds, covered.committed_cost) == (Decimal(60), Decimal("0.030000000000"))
    assert GpuMinute.objects.get(gpu_uuid="GPU-gpu-node-2-0").committed_seconds == 0
    # Each minute still reconciles: Σ workload charges + idle = the card's cost at the rate it was priced at.
    for gpu in GpuMinute.objects.all():
        charged = UsageMinute.objects.filter(gpu_uuid=gpu.gpu_uuid).aggregate(s=Sum("charge"))["s"]
        assert charged + gpu.idle_cost == gpu.card_cost
    hours = GpuHour.objects.aggregate(s=Sum("committed_seconds"), c=Sum("committed_cost"))
    assert (hours["s"], hours["c"]) == (Decimal(60), Decimal("0.030000000000"))
    assert GpuDay.objects.aggregate(c=Sum("committed_cost"))["c"] == Decimal("0.030000000000")


@pytest.mark.parametrize("order", list(itertools.permutations(NODES)))
def test_any_arrival_order_ends_in_the_ledger_a_rebuild_writes(client, market, fleet, minute_start, order):
    committed(cards=2, price="1.8")
    for i, node in enumerate(order):
        meter(client, fleet, node, minute_start - timedelta(seconds=30 * i), seconds=90)
        rollup_usage(now=clock.now())
    rolled = ledger_snapshot()
    covered = set(GpuMinute.objects.filter(committed_seconds__gt=0).values_list("gpu_uuid", "minute"))
    for minute in {m for _, m in covered}:
        # In every minute the first two cards in node order that were metered then are the covered ones.
        metered = sorted(GpuMinute.objects.filter(minute=minute).values_list("node__name", "gpu_uuid"))
        assert {(g, minute) for _, g in metered[:2]} == {c for c in covered if c[1] == minute}
    rebuild_ledger(start=minute_start - timedelta(minutes=5), end=minute_start + timedelta(minutes=5))
    assert ledger_snapshot() == rolled


def test_commitments_of_one_model_pool_at_their_card_weighted_rate(client, market, fleet, minute_start):
    committed(cards=1, price="1.2")
    committed(cards=1, price="2.4")
    for node in NODES:
        meter(client, fleet, node, minute_start)
    rollup_usage(now=clock.now())
    # Two cards at (1.2 + 2.4) / 2 = 1.8 per hour, the third at the market's 3.6.
    assert card_costs() == {"GPU-gpu-node-1-0": Decimal("0.030000000000"), "GPU-gpu-node-2-0": Decimal("0.030000000000"),
                            "GPU-gpu-node-3-0": Decimal("0.060000000000")}


def test_a_commitment_not_yet_in_force_prices_nothing(client, market, fleet, minute_start):
    committed(cards=3, price="1.8", start=earliest_hour(clock.now()) + timedelta(hours=1))
    meter(client, fleet, "gpu-node-1", minute_start)
    rollup_usage(now=clock.now())
    assert card_costs() == {"GPU-gpu-node-1-0": Decimal("0.060000000000")}


# -- the service ------------------------------------------------------------------------------


def reserved(**overrides: Any) -> dict[str, Any]:
    args: dict[str, Any] = {"kind": CommitmentKind.RESERVED, "gpu_model": MODEL, "cards": "8", "currency": "USD",
                            "term_start": clock.now().date() - timedelta(days=40), "term_years": "1",
                            "note": "provider contract C-1", "price_per_gpu_hour": "2.9", "now": clock.now(),
                            "actor_label": "fin"}
    return {**args, **overrides}


def test_a_commitment_prices_from_the_next_whole_hour_and_is_audited(market):
    now = clock.now()
    c = create_commitment(**reserved(now=now))
    assert c.effective_from == earliest_hour(now)
    assert c.effective_from.minute == 0
    assert c.effective_from >= now
    assert c.term_start == datetime.combine(now.date() - timedelta(days=40), datetime.min.time(), UTC)
    assert c.term_end == commitment_term(now.date() - timedelta(days=40), 1)[1] == c.effective_to
    event = AuditEvent.objects.get(action="commitment.created")
    assert event.after is not None
    assert event.after["cards"] == 8
    assert event.after["price_per_gpu_hour"] == "2.900000"
    assert event.actor_label == "fin"


def test_a_term_starting_later_prices_from_its_start(market):
    start = clock.now().date() + timedelta(days=3)
    c = create_commitment(**reserved(term_start=start, term_years="3"))
    assert c.effective_from == datetime.combine(start, datetime.min.time(), UTC)
    assert c.effective_to == commitment_term(start, 3)[1]


@pytest.mark.parametrize(("overrides", "message"), [
    ({"gpu_model": "NVIDIA B200"}, "not approved"),
    ({"cards": "0"}, "between 1 and"),
    ({"cards": "two"}, "not a whole number"),
    ({"term_years": "2"}, "one of 1, 3 years"),
    ({"price_per_gpu_hour": "-1"}, "above 0"),
    ({"price_per_gpu_hour": "1.1234567"}, "at most 6 decimal places"),
    ({"price_per_gpu_hour": "NaN"}, "finite"),
    ({"currency": "EUR"}, "two currencies"),
    ({"currency": "XYZ"}, "XYZ"),
    ({"note": "  "}, "note is required"),
    ({"term_start": date(2001, 1, 1)}, "term ended"),
    ({"kind": "spot"}, "kind must be one of"),
])
def test_bad_input_is_refused_and_nothing_is_written(market, overrides, message):
    with pytest.raises(InvalidInput, match=message):
        create_commitment(**reserved(**overrides))
    assert not Commitment.objects.exists()
    assert not AuditEvent.objects.filter(action__startswith="commitment.").exists()


def test_a_rate_card_in_another_currency_than_a_commitment_is_refused(market):
    create_commitment(**reserved())
    with pytest.raises(InvalidInput, match="two currencies"):
        create_rate_card(gpu_model=MODEL, price_per_gpu_hour="3.0", currency="EUR",
                         effective_from=(clock.now() + timedelta(days=62)).replace(day=1, hour=0, minute=0, second=0,
                                                                                    microsecond=0),
                         source_url="https://example.org/eur", source_note="list", now=clock.now(), actor_label="a")


def test_amortised_rate_is_purchase_facility_and_power_per_hour(market):
    term = commitment_term(date(2025, 1, 1), 5)  # 2025-2029 plus one leap day: 43,824 hours
    rate = amortised_rate(purchase_price=Decimal("21912.00"), life_years=5, term=term, power_watts=500,
                          energy_price_per_kwh=Decimal("0.20"), facility_cost_per_year=Decimal("876.48"))
    assert rate.capital == Decimal("0.5")  # 21,912 / 43,824 h
    assert rate.facility == Decimal("0.1")  # 876.48 × 5 / 43,824 h
    assert rate.power == Decimal("0.1")  # 0.5 kW × 0.20
    assert rate.total == Decimal("0.700000")


def test_on_prem_cards_are_priced_at_their_amortised_rate(market):
    costs = OnPremCosts(purchase_price="15000", power_watts="400", energy_price_per_kwh="0.15",
                        facility_cost_per_year="1200")
    c = create_commitment(**reserved(kind=CommitmentKind.ON_PREM, price_per_gpu_hour=None, on_prem=costs,
                                     term_years="4"))
    term = (c.term_start, c.term_end)
    expected = amortised_rate(purchase_price=Decimal(15000), life_years=4, term=term, power_watts=400,
                              energy_price_per_kwh=Decimal("0.15"), facility_cost_per_year=Decimal(1200)).total
    assert c.price_per_gpu_hour == expected
    assert c.power_watts == 400
    assert c.purchase_price == Decimal("15000.00")


def test_retiring_stops_from_the_next_whole_hour_and_is_audited(market):
    c = create_commitment(**reserved())
    now = clock.now()
    retired = retire_commitment(commitment_id=c.pk, reason="contract cancelled", now=now, actor_label="fin")
    assert retired.effective_to == max(c.effective_from, earliest_hour(now))
    after = AuditEvent.objects.get(action="commitment.retired").after
    assert after is not None
    assert after["retire_reason"] == "contract cancelled"
    with pytest.raises(InvalidInput, match="already retired"):
        retire_commitment(commitment_id=c.pk, reason="again", now=now, actor_label="fin")


def test_a_new_commitment_reprices_minutes_already_rolled_up_from_its_start(client, market, fleet, settings):
    # A batch from a clock ahead of the server's (within the allowed skew) already sits in the next hour.
    settings.VGPU_INGEST_MAX_CLOCK_SKEW = timedelta(hours=2)
    now = clock.now()
    meter(client, fleet, "gpu-node-1", earliest_hour(now) + timedelta(minutes=1), seconds=10)
    rollup_usage(now=now)
    assert card_costs() == {"GPU-gpu-node-1-0": Decimal("0.010000000000")}
    create_commitment(**reserved(now=now, price_per_gpu_hour="1.8"))
    assert card_costs() == {"GPU-gpu-node-1-0": Decimal("0.005000000000")}


# -- the page ---------------------------------------------------------------------------------


def login(client: Client, role: str) -> None:
    group = {"admin": ADMIN_GROUP, "finance": FINANCE_GROUP}.get(role)
    client.force_login(user_in(group, "acme" if role == "tenant" else None))


def form(kind: str = "reserved", **overrides: str) -> dict[str, str]:
    data = {"kind": kind, "gpu_model": MODEL, "cards": "8", "currency": "USD", "note": "contract C-7",
            "term_start": clock.now().date().isoformat(), "term_years": "1" if kind == "reserved" else "5",
            "price_per_gpu_hour": "2.9", "purchase_price": "15000", "power_watts": "400",
            "energy_price_per_kwh": "0.15", "facility_cost_per_year": "1200"}
    return {**data, **overrides}


def test_finance_records_a_commitment_and_sees_it_beside_the_market_rate(client, market):
    login(client, "finance")
    response = client.post("/commitments/", form())
    assert response.status_code == 302, response.content.decode()
    c = Commitment.objects.get()
    page = client.get("/commitments/").content.decode()
    assert f'data-testid="commitment-{c.pk}"' in page
    assert "market 3.600000; 19.4 % below" in page  # (3.6 − 2.9) / 3.6


def test_on_prem_cards_through_the_page(client, market):
    login(client, "admin")
    assert client.post("/commitments/", form("on_prem")).status_code == 302
    c = Commitment.objects.get()
    assert c.kind == CommitmentKind.ON_PREM
    page = client.get("/commitments/").content.decode()
    assert f'data-testid="commitment-amortised-{c.pk}"' in page


@pytest.mark.parametrize("overrides", [{"cards": "-3"}, {"gpu_model": "made up"}, {"term_start": "01/12/2026"},
                                       {"price_per_gpu_hour": "1e9999999"}, {"kind": "spot"}, {"currency": "EUR"}])
def test_bad_forms_answer_400_and_change_nothing(client, market, overrides):
    login(client, "finance")
    response = client.post("/commitments/", form(**overrides))
    assert response.status_code == 400
    assert not Commitment.objects.exists()


def test_tenants_are_refused(client, market):
    login(client, "tenant")
    assert client.get("/commitments/").status_code == 403
    assert client.post("/commitments/", form()).status_code == 403
    assert not Commitment.objects.exists()


def test_a_bad_month_is_a_400(client, market):
    login(client, "finance")
    assert client.get("/commitments/?month=2026-13").status_code == 400


def test_the_page_shows_what_a_commitment_held_used_and_left_unused(client, market, fleet, minute_start):
    start = minute_start.replace(minute=0) - timedelta(hours=2)
    c = committed(cards=2, price="1.8", start=start)
    meter(client, fleet, "gpu-node-1", minute_start)
    rollup_usage(now=clock.now())
    login(client, "finance")
    month = minute_start.strftime("%Y-%m")
    response = client.get(f"/commitments/?month={month}")
    assert response.status_code == 200
    page = response.context["page"]
    use = page.groups[0].commitments[0].month
    assert round(use.used_card_hours * 3600, 10) == 60
    assert use.used_cost == Decimal("0.030000000000")
    held_s = Decimal(2) * Decimal((min(clock.now(), c.effective_to) - max(start, c.effective_from)).total_seconds())
    assert abs(use.card_hours - held_s / 3600) < Decimal("0.01")  # the page read the clock a moment before
    assert use.unused_cost == use.cost - use.used_cost
    retire = client.post(f"/commitments/{c.pk}/retire/", {"reason": "ended early"})
    assert retire.status_code == 400  # no confirmation
    assert Commitment.objects.get().retired_at is None
