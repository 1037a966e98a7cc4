"""Rollups into priced minute and hour ledgers: correctness, idempotency, late data."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest
from django.db.models import Sum

from billing.ledger.models import GpuHour, GpuMinute, UsageBatch, UsageHour, UsageMinute
from billing.ledger.rollup import rebuild_ledger, rollup_usage
from billing.models import RateCard
from tests import clock
from tests.conftest import A100, make_batch

pytestmark = pytest.mark.django_db


@pytest.fixture
def rate_card(db):
    return RateCard.objects.create(
        gpu_model=A100["model"], currency="USD", price_per_gpu_hour=Decimal("3.6"),
        effective_from=datetime(2020, 1, 1, tzinfo=UTC), source_url="https://example.org/price",
    )


def snapshot():
    def rows(model, order):
        return sorted(
            tuple(v for k, v in r.items() if k != "id")
            for r in model.objects.order_by(*order).values()
        )
    return (rows(UsageMinute, ["minute"]), rows(GpuMinute, ["minute"]), rows(UsageHour, ["hour"]),
            rows(GpuHour, ["hour"]))


def test_rollup_prices_a_known_workload_exactly(post_batch, minute_start, rate_card):
    # Half the memory and a quarter of the SMs granted for 10 s at 3.6/GPU-h (p = 0.001/s):
    # share = 0.5·0.5 + 0.5·0.25 = 0.375 card → 10 s × 0.375 × 0.001 = 0.00375.
    workload = {"gpu": 0, "tenant": "acme", "pod": "llm-1", "mem_used": 1000.0, "mem_granted": 40960.0,
                "sm_used": 1.0, "sm_granted": 27.0}
    assert post_batch(make_batch(start=minute_start, workloads=[workload])).status_code == 201
    result = rollup_usage(now=clock.now())
    assert (result.batches, result.gpu_minutes) == (1, 1)
    usage = UsageMinute.objects.get()
    assert usage.charge == Decimal("0.003750000000")
    assert usage.seconds == Decimal(10)
    gpu = GpuMinute.objects.get()
    assert gpu.card_cost == Decimal("0.010000000000")
    assert gpu.idle_cost == Decimal("0.006250000000")
    assert gpu.priced
    assert gpu.currency == "USD"
    assert UsageBatch.objects.get().rolled_up_at is not None


def test_running_the_rollup_twice_changes_nothing(post_batch, minute_start, rate_card):
    for seq in range(1, 4):
        post_batch(make_batch(start=minute_start + timedelta(seconds=10 * (seq - 1)), seq=seq))
    rollup_usage(now=clock.now())
    first = snapshot()
    second_result = rollup_usage(now=clock.now())
    assert second_result.batches == 0
    assert snapshot() == first
    rebuild_ledger(start=minute_start - timedelta(hours=1), end=minute_start + timedelta(hours=1))
    assert snapshot() == first


def test_ledgers_reconcile_every_gpu_window_and_hours_equal_their_minutes(post_batch, minute_start, rate_card):
    workloads = [
        {"gpu": 0, "tenant": "acme", "pod": "bert-1", "mem_used": 400.0, "mem_granted": 600.0, "sm_used": 6.0, "sm_granted": 9.0},
        {"gpu": 0, "tenant": "globex", "pod": "llm-2", "mem_used": 70000.0, "mem_granted": 60000.0, "sm_used": 90.0, "sm_granted": 80.0},
        {"gpu": 1, "tenant": "initech", "pod": "resnet-3", "mem_used": 1180.0, "mem_granted": 1500.0, "sm_used": 20.0, "sm_granted": 25.0},
    ]
    # 150 s across three minutes and two GPUs; the second GPU-0 workload overcommits under `max`.
    for seq in range(15):
        post_batch(make_batch(start=minute_start + timedelta(seconds=10 * seq), seq=seq + 1, gpus=2, workloads=workloads))
    rollup_usage(now=clock.now())
    for gm in GpuMinute.objects.all():
        assert gm.charged + gm.idle_cost == gm.card_cost
        charged = UsageMinute.objects.filter(gpu_uuid=gm.gpu_uuid, minute=gm.minute).aggregate(s=Sum("charge"))["s"]
        assert charged == gm.charged
        assert gm.idle_cost >= 0
    card_total = GpuMinute.objects.aggregate(s=Sum("card_cost"))["s"]
    assert card_total == Decimal("0.001") * 150 * 2  # two GPUs metered for 150 s each
    assert GpuHour.objects.aggregate(s=Sum("card_cost"))["s"] == card_total
    assert UsageHour.objects.aggregate(s=Sum("charge"))["s"] == UsageMinute.objects.aggregate(s=Sum("charge"))["s"]


def test_a_late_batch_lands_in_an_already_rolled_minute(post_batch, minute_start, rate_card):
    post_batch(make_batch(start=minute_start, seq=1))
    rollup_usage(now=clock.now())
    before = GpuMinute.objects.get().metered_seconds
    post_batch(make_batch(start=minute_start + timedelta(seconds=10), seq=2))
    rollup_usage(now=clock.now())
    gm = GpuMinute.objects.get()
    assert (before, gm.metered_seconds) == (Decimal(10), Decimal(20))
    assert UsageMinute.objects.get().seconds == Decimal(20)


def test_usage_without_a_rate_card_is_kept_unpriced_and_priced_after_a_rebuild(post_batch, minute_start):
    post_batch(make_batch(start=minute_start))
    rollup_usage(now=clock.now())
    gm = GpuMinute.objects.get()
    assert not gm.priced
    assert gm.card_cost == 0
    assert UsageMinute.objects.get().mem_used_mb_s == Decimal("3125")
    RateCard.objects.create(gpu_model=A100["model"], currency="USD", price_per_gpu_hour=Decimal("3.6"),
                            effective_from=datetime(2020, 1, 1, tzinfo=UTC), source_url="https://example.org")
    rebuild_ledger(start=minute_start, end=minute_start + timedelta(minutes=1))
    gm = GpuMinute.objects.get()
    assert gm.priced
    assert gm.card_cost == Decimal("0.010000000000")


def test_overlapping_rate_cards_for_one_model_are_refused_by_the_database(rate_card):
    from django.db import IntegrityError, transaction

    with pytest.raises(IntegrityError, match="rate_card_no_overlap"), transaction.atomic():
        RateCard.objects.create(gpu_model=A100["model"], currency="USD", price_per_gpu_hour=Decimal("4"),
                                effective_from=datetime(2025, 1, 1, tzinfo=UTC), source_url="https://example.org")
    # Closing the first card makes room for the next one.
    rate_card.effective_to = datetime(2025, 1, 1, tzinfo=UTC)
    rate_card.save()
    RateCard.objects.create(gpu_model=A100["model"], currency="USD", price_per_gpu_hour=Decimal("4"),
                            effective_from=datetime(2025, 1, 1, tzinfo=UTC), source_url="https://example.org")
    assert RateCard.objects.count() == 2
