"""Energy per workload (docs/billing.md, Energy): a batch GPU's optional `energy_j` is checked and
stored; the rollup spreads it over the minutes its window covers and splits each card-minute's energy
by the same shares as its cost, so Σ workload energy + idle energy = the card's energy exactly, priced
or not; the portal, the allocation API and the FOCUS dataset show it beside the money."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest
from django.db.models import Sum
from hypothesis import given
from hypothesis import strategies as st

from billing.calendar import month_of
from billing.ledger.models import BatchGpu, GpuDay, GpuHour, GpuMinute, UsageDay, UsageHour, UsageMinute
from billing.ledger.pricing import GpuWindowUsage, Rate, WorkloadQuantities, price_gpu_window
from billing.ledger.rollup import rebuild_ledger, rollup_usage
from billing.models import RateCard
from billing.scope import FINANCE_GROUP
from billing.services.exports.focus_dataset import build_fleet_focus_rows
from tests import clock
from tests.conftest import SHARED_GPU_WORKLOADS, make_batch, user_in

pytestmark = pytest.mark.django_db


def with_energy(batch: dict, *joules: float) -> dict:
    for gpu, energy in zip(batch["gpus"], joules, strict=False):
        gpu["energy_j"] = energy
    return batch


def test_energy_is_stored_per_batch_gpu_and_optional(post_batch, minute_start):
    assert post_batch(with_energy(make_batch(start=minute_start, seconds=10, gpus=2), 2500.5)).status_code == 201
    stored = dict(BatchGpu.objects.values_list("card__gpu_uuid", "energy_j"))
    assert stored == {"GPU-gpu-node-1-0": Decimal("2500.5000000000"), "GPU-gpu-node-1-1": None}


@pytest.mark.parametrize("energy", [-1, 50_001, 10**400, True, "300", float("inf")])
def test_energy_outside_what_a_gpu_can_draw_is_a_400_naming_it(post_batch, minute_start, energy):
    batch = make_batch(start=minute_start, seconds=10)
    batch["gpus"][0]["energy_j"] = energy
    response = post_batch(batch) if energy != float("inf") else post_batch(None, raw=make_raw(batch))
    assert response.status_code == 400
    assert "$.gpus[0].energy_j" in response.content.decode() or "Infinity" in response.content.decode()
    assert not BatchGpu.objects.exists()


def make_raw(batch: dict) -> bytes:
    import json

    return json.dumps(batch, allow_nan=True).encode()


def test_a_card_minutes_energy_is_split_as_its_cost(post_batch, minute_start, one_usd_per_gpu_second):
    # 10 % and 20 % of the card for 60 s, 24,000 J (400 W): 2,400 J and 4,800 J, the rest idle.
    batch = with_energy(make_batch(start=minute_start, seconds=60, workloads=SHARED_GPU_WORKLOADS), 24000)
    assert post_batch(batch).status_code == 201
    rollup_usage(now=clock.now())
    energy = dict(UsageMinute.objects.values_list("pod", "energy_j"))
    assert energy == {"bert-1": Decimal("2400.000000000000"), "llm-1": Decimal("4800.000000000000")}
    gpu = GpuMinute.objects.get()
    assert (gpu.energy_j, gpu.idle_energy_j, gpu.energy_seconds) == (Decimal(24000), Decimal(16800), Decimal(60))
    charges = dict(UsageMinute.objects.values_list("pod", "charge"))
    assert charges["llm-1"] / charges["bert-1"] == energy["llm-1"] / energy["bert-1"]  # the same split
    assert UsageHour.objects.aggregate(e=Sum("energy_j"))["e"] == Decimal(7200)
    assert UsageDay.objects.aggregate(e=Sum("energy_j"))["e"] == Decimal(7200)
    assert GpuHour.objects.aggregate(e=Sum("energy_j"))["e"] == Decimal(24000)
    assert GpuDay.objects.aggregate(e=Sum("energy_j"))["e"] == Decimal(24000)


def test_a_window_across_minutes_spreads_its_energy_by_seconds(post_batch, minute_start, one_usd_per_gpu_second):
    start = minute_start + timedelta(seconds=45)  # 15 s in one minute, 15 s in the next
    assert post_batch(with_energy(make_batch(start=start, seconds=30), 9000)).status_code == 201
    rollup_usage(now=clock.now())
    assert sorted(GpuMinute.objects.values_list("energy_j", "energy_seconds")) == [
        (Decimal(4500), Decimal(15)), (Decimal(4500), Decimal(15))]


def test_under_the_proportional_policy_the_idle_energy_is_spread_like_idle_cost(post_batch, minute_start):
    RateCard.objects.create(gpu_model="NVIDIA A100-SXM4-80GB", currency="USD", price_per_gpu_hour=Decimal(36),
                            effective_from=datetime(2020, 1, 1, tzinfo=UTC), source_url="https://example.org",
                            idle_policy="proportional")
    batch = with_energy(make_batch(start=minute_start, seconds=60, workloads=SHARED_GPU_WORKLOADS), 24000)
    assert post_batch(batch).status_code == 201
    rollup_usage(now=clock.now())
    energy = dict(UsageMinute.objects.values_list("pod", "energy_j"))
    assert energy == {"bert-1": Decimal(8000), "llm-1": Decimal(16000)}
    assert GpuMinute.objects.get().idle_energy_j == 0


def test_unpriced_usage_still_gets_its_energy_and_a_rebuild_writes_the_same(post_batch, minute_start):
    batch = with_energy(make_batch(start=minute_start, seconds=60, workloads=SHARED_GPU_WORKLOADS), 24000)
    assert post_batch(batch).status_code == 201
    rollup_usage(now=clock.now())
    rolled = sorted(UsageMinute.objects.values_list("pod", "energy_j"))
    assert rolled == [("bert-1", Decimal(2400)), ("llm-1", Decimal(4800))]
    rebuild_ledger(start=minute_start - timedelta(minutes=1), end=minute_start + timedelta(minutes=2))
    assert sorted(UsageMinute.objects.values_list("pod", "energy_j")) == rolled


def test_a_batch_without_energy_leaves_it_zero_and_unmetered(post_batch, minute_start, one_usd_per_gpu_second):
    assert post_batch(make_batch(start=minute_start, seconds=10)).status_code == 201
    rollup_usage(now=clock.now())
    gpu = GpuMinute.objects.get()
    assert (gpu.energy_j, gpu.energy_seconds, gpu.metered_seconds) == (Decimal(0), Decimal(0), Decimal(10))


quantities = st.decimals(min_value=0, max_value=81920 * 60, places=3, allow_nan=False, allow_infinity=False)


@given(workloads=st.lists(st.tuples(quantities, st.decimals(min_value=0, max_value=108 * 60, places=3)),
                          max_size=6),
       energy=st.decimals(min_value=0, max_value=300_000, places=6), policy=st.sampled_from(["platform", "proportional"]),
       seconds=st.integers(min_value=1, max_value=60))
def test_workload_energy_and_idle_energy_add_up_to_the_cards_exactly(workloads, energy, policy, seconds):
    window = GpuWindowUsage(memory_mb=81920, sm_count=108, metered_seconds=Decimal(seconds), energy_j=energy,
                            workloads=[WorkloadQuantities(mem_used_mb_s=m, mem_granted_mb_s=m, mem_max_mb_s=m, sm_used_s=s,
                                                          sm_granted_s=s, sm_max_s=s) for m, s in workloads])
    priced = price_gpu_window(window=window, rate=Rate(price_per_gpu_hour=Decimal(0), idle_policy=policy))
    assert sum(priced.energies, Decimal(0)) + priced.idle_energy_j == energy
    assert all(e >= 0 for e in priced.energies)
    assert priced.idle_energy_j >= 0


def test_the_portal_the_allocation_api_and_focus_show_the_energy(client, post_batch, minute_start,
                                                                  one_usd_per_gpu_second):
    batch = with_energy(make_batch(start=minute_start, seconds=60, workloads=SHARED_GPU_WORKLOADS), 216000)
    assert post_batch(batch).status_code == 201
    rollup_usage(now=clock.now())
    client.force_login(user_in(FINANCE_GROUP, "acme"))  # the tenant's page exists once the tenant does
    day = minute_start.date().isoformat()
    page = client.get(f"/tenants/acme/?start={day}&end={day}").content.decode()
    # 21,600 J of the card's 216,000 (0.06 kWh): 0.006 kWh, shown as every quantity is, to 2 places.
    assert re.search(r'data-testid="workload-kwh"[^>]*>0\.01<', page), page
    csv = client.get(f"/tenants/acme/?start={day}&end={day}&format=csv").content.decode()
    assert "energy_kwh" in csv.splitlines()[0]
    hour = minute_start.replace(minute=0, second=0, microsecond=0)
    window = f"{hour:%Y-%m-%dT%H:%M:%SZ},{hour + timedelta(hours=1):%Y-%m-%dT%H:%M:%SZ}"
    api = client.get(f"/allocation/compute?window={window}&aggregate=pod&accumulate=true&includeIdle=true").json()
    energy = {name: a["gpuEnergyKWh"] for name, a in api["data"][0].items()}
    assert energy["bert-1"] == pytest.approx(0.006)
    assert energy["llm-1"] == pytest.approx(0.012)
    assert energy["__idle__"] == pytest.approx(0.042)
    rows = build_fleet_focus_rows(month_of(minute_start))
    assert sum(r["x_EnergyKWh"] or 0 for r in rows) == Decimal("0.06")
