"""Wire protocol v2 (integrals per workload-minute) prices exactly as v1's per-second samples do.

The property: for any per-second series our agent can meter, the ledger's quantities and every
priced amount (Decimal, at every rounding point of `price_gpu_window`) are the same whether the
node sends the samples (v1, summed per minute at ingest) or their integrals (v2), and both equal
the exact Decimal sums of the per-second samples, which is what the rollup priced before the
service stored integrals. The database test checks the same through ingest and the rollup.
"""

from __future__ import annotations

import json
from collections import defaultdict
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agents.batch import Sample, render_batch
from agents.interfaces import GpuInfo, Workload
from billing.ledger.models import GpuDay, GpuHour, GpuMinute, UsageDay, UsageHour, UsageMinute
from billing.ledger.pricing import GpuWindowUsage, Rate, WorkloadQuantities, price_gpu_window
from billing.ledger.rollup import rebuild_ledger, rollup_usage
from billing.models import RateCard
from billing.services.ingest.batch_validation import summed_per_minute, validate_batch
from tests import clock
from tests.conftest import A100

GPU = GpuInfo(uuid="GPU-prop-0", model=A100["model"], memory_mb=A100["memory_mb"], sm_count=A100["sm_count"])
START = datetime(2026, 11, 30, 3, 0, 40, tzinfo=UTC)  # mid-minute: a batch of 40 s spans two minutes
NOW = datetime(2026, 11, 30, 4, tzinfo=UTC)
Q = 1024  # quanta per unit: the meter reports multiples of 2^-10


def _workload(i: int) -> Workload:
    return Workload(tenant="acme", namespace="acme-prod", pod=f"pod-{i}", container="main", pod_uid=f"uid-{i}",
                    sla_tier="gold")


@st.composite
def series(draw: st.DrawFn) -> list[Sample]:
    """Per-second samples of 1-3 workloads on one card over 1-90 s, as the meter emits them:
    integrals in quanta, each within the card, Σ granted within the card at every second."""
    workloads = draw(st.integers(1, 3))
    seconds = draw(st.integers(1, 90))
    mem_cap, sm_cap = GPU.memory_mb * Q, GPU.sm_count * Q
    samples = []
    for s in range(seconds):
        mem_left, sm_left = mem_cap, sm_cap
        for w in range(workloads):
            if not draw(st.booleans()) and w:  # a workload may be absent for a second
                continue
            mem_granted = draw(st.integers(0, mem_left))
            sm_granted = draw(st.integers(0, sm_left))
            mem_left, sm_left = mem_left - mem_granted, sm_left - sm_granted
            samples.append(Sample(
                start=START + timedelta(seconds=s), seconds=1, gpu=GPU.uuid, workload=_workload(w),
                mem_used_mb_s=draw(st.integers(0, mem_cap)) / Q, mem_granted_mb_s=mem_granted / Q,
                sm_used_s=draw(st.integers(0, sm_cap)) / Q, sm_granted_s=sm_granted / Q,
                pcie_mb=draw(st.integers(0, 10**9)) / Q))
    return samples


rates = st.builds(Rate, price_per_gpu_hour=st.decimals(0, 100, places=4),
                  alpha=st.decimals(0, 1, places=3), billed_basis=st.sampled_from(["max", "granted", "used"]),
                  idle_policy=st.sampled_from(["platform", "proportional"]))


def _document(samples: list[Sample], wire: str, *, seq: int = 1, gpu: GpuInfo = GPU,
              start: datetime = START) -> dict[str, Any]:
    end = max(s.start for s in samples) + timedelta(seconds=1)
    moved = [Sample(start=s.start, seconds=s.seconds, gpu=gpu.uuid, workload=s.workload,
                    mem_used_mb_s=s.mem_used_mb_s, mem_granted_mb_s=s.mem_granted_mb_s, sm_used_s=s.sm_used_s,
                    sm_granted_s=s.sm_granted_s, pcie_mb=s.pcie_mb) for s in samples]
    body = render_batch(node="gpu-node-1", batch_seq=seq, window_start=start, window_end=end, gpus=[gpu], samples=moved,
                        wire=wire)
    return dict(json.loads(body))


Quantities = dict[datetime, dict[str, tuple[Decimal, ...]]]


def _stored(samples: list[Sample], wire: str) -> Quantities:
    """What ingest stores for the batch, summed per workload-minute as the rollup sums it (exactly)."""
    batch = summed_per_minute(validate_batch(_document(samples, wire), now=NOW, max_skew=timedelta(minutes=2),
                                             max_samples=200_000))
    sums: Quantities = defaultdict(dict)
    for row in batch.rows:
        minute, pod = row[1].replace(second=0), row[5]
        values = (row[2], *row[9:])
        held = sums[minute].get(pod, (Decimal(0),) * len(values))
        sums[minute][pod] = tuple(h + Decimal(v) for h, v in zip(held, values, strict=True))
    return sums


def _per_second(samples: list[Sample]) -> Quantities:
    """The exact Decimal sums of the per-second samples: what v1's per-second rows priced to."""
    sums: Quantities = defaultdict(dict)
    for s in samples:
        minute = s.start.replace(second=0)
        values = (s.seconds, s.mem_used_mb_s, s.mem_granted_mb_s, max(s.mem_used_mb_s, s.mem_granted_mb_s),
                  s.sm_used_s, s.sm_granted_s, max(s.sm_used_s, s.sm_granted_s), s.pcie_mb)
        held = sums[minute].get(s.workload.pod, (Decimal(0),) * len(values))
        sums[minute][s.workload.pod] = tuple(h + Decimal(v) for h, v in zip(held, values, strict=True))
    return sums


def _priced(sums: Quantities, rate: Rate) -> list[Any]:
    priced = []
    for minute in sorted(sums):
        pods = sorted(sums[minute])
        window = GpuWindowUsage(memory_mb=GPU.memory_mb, sm_count=GPU.sm_count,
                                metered_seconds=Decimal(60 - START.second if minute == START.replace(second=0) else 60),
                                workloads=[WorkloadQuantities(*(sums[minute][p][i] for i in range(1, 7))) for p in pods])
        priced.append((minute, pods, price_gpu_window(window=window, rate=rate)))
    return priced


@settings(max_examples=60)
@given(samples=series(), rate=rates)
def test_v2_integrals_price_exactly_as_the_per_second_samples(samples: list[Sample], rate: Rate) -> None:
    exact = _per_second(samples)
    assert _stored(samples, "v2") == exact
    assert _stored(samples, "v1") == exact
    assert _priced(_stored(samples, "v2"), rate) == _priced(exact, rate)


@pytest.mark.django_db
def test_a_v1_and_a_v2_batch_of_the_same_seconds_write_the_same_minutes(post_batch, one_usd_per_gpu_second):
    """Through ingest and the rollup: the same per-second series on two cards, one sent as v1 and one
    as v2, gives minute rows equal in every quantity and amount."""
    start = clock.now().replace(second=40, microsecond=0) - timedelta(minutes=10)
    samples = [Sample(start=start + timedelta(seconds=s), seconds=1, gpu=GPU.uuid, workload=_workload(w),
                      mem_used_mb_s=(1000 + 37 * s + w) / Q * 100, mem_granted_mb_s=20480.0 * (w + 1),
                      sm_used_s=(s % 7) * 3.25, sm_granted_s=13.5 * (w + 1), pcie_mb=0.0009765625 * s)
               for s in range(45) for w in range(2)]
    cards = {"v1": GPU, "v2": GpuInfo(uuid="GPU-prop-1", model=GPU.model, memory_mb=GPU.memory_mb,
                                      sm_count=GPU.sm_count)}
    for seq, (wire, card) in enumerate(cards.items(), start=1):
        assert post_batch(_document(samples, wire, seq=seq, gpu=card, start=start)).status_code == 201
    rollup_usage(now=clock.now())
    minutes = defaultdict(list)
    for row in UsageMinute.objects.order_by("minute", "pod").values():
        minutes[row["gpu_uuid"]].append({k: v for k, v in row.items() if k not in {*IDS, "gpu_uuid", "node_id"}})
    assert len(minutes["GPU-prop-0"]) == 4  # two workloads in each of two minutes
    assert minutes["GPU-prop-0"] == minutes["GPU-prop-1"]


# A row's ids: the hours' and days' own, and the card and workload ids of the minute store's key.
IDS = ("id", "card_id", "workload_id")


def _ledger_of(card: GpuInfo) -> dict[str, list[dict[str, Any]]]:
    """Every ledger row of one card, minutes to days, without its ids or the card's uuid."""
    tables: dict[str, tuple[Any, str]] = {
        "usage minutes": (UsageMinute, "minute"), "gpu minutes": (GpuMinute, "minute"),
        "usage hours": (UsageHour, "hour"), "gpu hours": (GpuHour, "hour"),
        "usage days": (UsageDay, "day"), "gpu days": (GpuDay, "day")}
    ledger = {}
    for name, (model, time) in tables.items():
        rows = [{k: v for k, v in row.items() if k not in {*IDS, "gpu_uuid"}}
                for row in model.objects.filter(gpu_uuid=card.uuid).values()]
        ledger[name] = _in_order(rows, time)
    return ledger


def _in_order(rows: list[dict[str, Any]], time: str) -> list[dict[str, Any]]:
    return sorted(rows, key=lambda row: (row[time], row.get("pod", "")))


@pytest.mark.django_db
def test_a_rebuild_after_a_rate_card_change_equals_a_fresh_ingest_under_the_new_card(
        post_batch, one_usd_per_gpu_second):
    """The stored integrals are all a re-pricing needs: card 0's minutes, metered under the old card
    (a v2 batch, then a late v1 batch into the same minutes) and rebuilt after the card changed,
    equal card 1's, sent the same batches after the change, in every quantity and amount."""
    # Two minutes inside one hour and one UTC day, whatever the time the test runs.
    start = clock.now().replace(minute=20, second=0, microsecond=0) - timedelta(hours=1)
    samples = [Sample(start=start + timedelta(seconds=s), seconds=1, gpu=GPU.uuid, workload=_workload(w),
                      mem_used_mb_s=(1000 + 37 * s + w) / Q * 100, mem_granted_mb_s=20480.0 * (w + 1),
                      sm_used_s=(s % 7) * 3.25 + 30 * w, sm_granted_s=13.5 * (w + 1), pcie_mb=0.0009765625 * s)
               for s in range(90) for w in range(2)]
    early = [s for s in samples if s.start < start + timedelta(seconds=40)]
    late = [s for s in samples if s.start >= start + timedelta(seconds=40)]
    cards = [GPU, GpuInfo(uuid="GPU-prop-1", model=GPU.model, memory_mb=GPU.memory_mb, sm_count=GPU.sm_count)]

    def meter(card: GpuInfo, seq: int) -> None:
        for wire, part, at in (("v2", early, start), ("v1", late, start + timedelta(seconds=40))):
            assert post_batch(_document(part, wire, seq=seq, gpu=card, start=at)).status_code == 201
            rollup_usage(now=clock.now())  # the late batch lands in minutes already rolled up
            seq += 1

    meter(cards[0], seq=1)
    RateCard.objects.filter(pk=one_usd_per_gpu_second.pk).update(
        price_per_gpu_hour=Decimal("2.7183"), alpha=Decimal("0.35"), billed_basis="max", idle_policy="proportional")
    rebuild_ledger(start=start, end=start + timedelta(minutes=2))
    meter(cards[1], seq=3)
    rebuilt, fresh = _ledger_of(cards[0]), _ledger_of(cards[1])
    assert [len(rows) for rows in rebuilt.values()] == [4, 2, 2, 1, 2, 1]
    assert rebuilt == fresh
    assert rebuilt["gpu minutes"][0]["card_cost"] == Decimal("2.7183") / 60  # the new price, to the last digit
