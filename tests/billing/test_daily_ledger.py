"""The day ledger (UsageDay, GpuDay): derived from the hour ledger by the rollup in the same
transaction, exactly (Σ days = Σ hours per day and workload identity / per GPU and day), after late
batches, after rebuild_ledger, by the migration's backfill SQL; and the pages' readers give the same
figures from days as from hours for whole-day periods."""

from __future__ import annotations

import importlib
import itertools
from collections import defaultdict
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

import pytest
from django.db import connection
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from billing.ledger import reads as ledger_reads
from billing.ledger import spend
from billing.ledger.models import GpuDay, GpuHour, UsageDay, UsageHour
from billing.ledger.reads import DAYS, HOURS, ledger_for
from billing.ledger.rollup import rebuild_days, rebuild_ledger, rollup_usage
from billing.models import RateCard, Tenant
from billing.queries import dashboard, finance, portal
from billing.scope import Scope
from tests import clock
from tests.conftest import A100, make_batch

pytestmark = pytest.mark.django_db

FINANCE = Scope(tenants=None, is_finance=True, is_admin=False)
ACME = Scope(tenants=frozenset({"acme"}), is_finance=False, is_admin=False)
WORKLOAD_KEY = ("gpu_uuid", "tenant", "namespace", "pod", "container", "pod_uid", "sla_tier")
USAGE_SUMS = ("seconds", "mem_used_mb_s", "mem_granted_mb_s", "mem_billed_mb_s", "sm_used_s", "sm_granted_s",
              "sm_billed_s", "pcie_mb", "share_gpu_s", "charge", "idle_share")
GPU_SUMS = ("metered_seconds", "card_cost", "charged", "idle_cost", "idle_allocated", "share_gpu_s")
POD = {  # pod -> tenant, tier
    "bert-1": ("acme", "gold"), "llm-2": ("globex", "silver"), "resnet-3": ("acme", "bronze"),
    "sdxl-4": ("initech", "gold"),
}


def base_day() -> datetime:
    """Midnight UTC three days ago: three whole days of batches, all in the past."""
    return clock.now().astimezone(UTC).replace(hour=0, minute=0, second=0, microsecond=0) - timedelta(days=3)


def day_of(at: datetime) -> datetime:
    return at.astimezone(UTC).replace(hour=0, minute=0, second=0, microsecond=0)


def assert_days_equal_hours() -> None:
    """Every UsageDay row is the exact sum of its day's UsageHour rows (same GPU and workload
    identity), with the first/last hour; every GpuDay row the sum of its GpuHour rows; none missing."""
    usage: dict[tuple, dict[str, Any]] = defaultdict(lambda: defaultdict(Decimal))
    # Rows as plain mappings: the columns are read by name from the lists above.
    usage_hours: list[Mapping[str, Any]] = list(UsageHour.objects.values())
    for h in usage_hours:
        row = usage[(day_of(h["hour"]), *(h[k] for k in WORKLOAD_KEY))]
        for c in USAGE_SUMS:
            row[c] += h[c]
        row["first_hour"] = min(row.get("first_hour") or h["hour"], h["hour"])
        row["last_hour"] = max(row.get("last_hour") or h["hour"], h["hour"])
    usage_days: list[Mapping[str, Any]] = list(UsageDay.objects.values())
    days = {(d["day"], *(d[k] for k in WORKLOAD_KEY)): {c: d[c] for c in (*USAGE_SUMS, "first_hour", "last_hour")}
            for d in usage_days}
    assert UsageDay.objects.count() == len(days)  # one row per day and workload identity
    assert days == {k: dict(v) for k, v in usage.items()}
    gpus: dict[tuple, dict[str, Any]] = defaultdict(lambda: defaultdict(Decimal))
    gpu_hours: list[Mapping[str, Any]] = list(GpuHour.objects.values())
    for gh in gpu_hours:
        row = gpus[(day_of(gh["hour"]), gh["gpu_uuid"])]
        for c in GPU_SUMS:
            row[c] += gh[c]
        row["unpriced_seconds"] += 0 if gh["priced"] else gh["metered_seconds"]
        row["priced"] = row.get("priced", True) and gh["priced"]
        row["currency"] = max(row.get("currency", ""), gh["currency"])
    gpu_day_rows: list[Mapping[str, Any]] = list(GpuDay.objects.values())
    gpu_days = {(d["day"], d["gpu_uuid"]): {c: d[c] for c in (*GPU_SUMS, "unpriced_seconds", "priced", "currency")}
                for d in gpu_day_rows}
    assert gpu_days == {k: dict(v) for k, v in gpus.items()}
    for g in GpuDay.objects.all():  # the hour ledger's invariant holds per day as well
        assert g.charged + g.idle_cost == g.card_cost
    # Each GPU-hour carries its usage rows' Σ share and Σ charge (what idle reads in their place).
    on_card: dict[tuple, list[Decimal]] = defaultdict(lambda: [Decimal(0), Decimal(0)])
    for h in usage_hours:
        sums = on_card[(h["node_id"], h["gpu_uuid"], h["hour"])]
        sums[0] += h["share_gpu_s"]
        sums[1] += h["charge"]
    for gh in gpu_hours:
        assert [gh["share_gpu_s"], gh["charged"]] == on_card.get((gh["node_id"], gh["gpu_uuid"], gh["hour"]),
                                                                 [Decimal(0), Decimal(0)]), gh


def day_snapshot() -> tuple[list[tuple], list[tuple]]:
    def rows(model: Any) -> list[tuple]:
        return sorted(tuple(v for k, v in r.items() if k != "id") for r in model.objects.values())
    return rows(UsageDay), rows(GpuDay)


def forced_hours(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make every reader use the hour ledger, whatever the period."""
    # The ledger's reads all pick their table through billing.ledger.reads; spend reads closed
    # days only where billing.ledger.spend.closed_days says so.
    monkeypatch.setattr(ledger_reads, "ledger_for", lambda start, end: HOURS)
    monkeypatch.setattr(spend, "closed_days", lambda start, end, now: None)


@pytest.fixture
def rate_card(db):
    return RateCard.objects.create(gpu_model=A100["model"], currency="USD", price_per_gpu_hour=Decimal("3.6"),
                                   effective_from=datetime(2020, 1, 1, tzinfo=UTC), source_url="https://example.org")


_seq = itertools.count(1)
_example = itertools.count(1)

workload_st = st.fixed_dictionaries({
    "gpu": st.integers(0, 1), "pod": st.sampled_from(sorted(POD)),
    # At most three workloads per GPU: a third of an A100's memory and SMs each keeps Σ granted valid.
    "mem_used": st.integers(0, 27000).map(float), "mem_granted": st.integers(0, 27000).map(float),
    "sm_used": st.integers(0, 36).map(float), "sm_granted": st.integers(0, 36).map(float),
})
# A batch: its slot (day 0-2, hour, minute, 10-second block) and 1-10 s of 1-second samples.
batch_st = st.tuples(st.integers(0, 2), st.sampled_from((0, 1, 13, 23)), st.integers(0, 59), st.integers(0, 5),
                     st.integers(1, 10), st.lists(workload_st, min_size=0, max_size=3, unique_by=lambda w: w["pod"]))


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                 HealthCheck.too_slow])
@given(batches=st.lists(batch_st, min_size=1, max_size=7, unique_by=lambda b: b[:4]), split=st.integers(0, 7))
def test_days_are_the_exact_sums_of_hours_after_rollups_of_random_batches(post_batch, rate_card, monkeypatch,
                                                                          batches, split):
    # Examples share the test's database: each one meters its own GPUs (no overlap with earlier
    # examples) and the invariants are checked over the whole ledger.
    gpu_prefix = f"GPU-h{next(_example)}-"
    base = base_day()
    Tenant.objects.get_or_create(slug="acme", defaults={"name": "Acme"})
    for i, (day, hour, minute, block, seconds, workloads) in enumerate(batches):
        start = base + timedelta(days=day, hours=hour, minutes=minute, seconds=10 * block)
        payload = make_batch(seq=next(_seq), start=start, seconds=seconds, gpus=2, workloads=[
            {**w, "tenant": POD[w["pod"]][0], "sla_tier": POD[w["pod"]][1]} for w in workloads])
        for g in payload["gpus"]:
            g["uuid"] = g["uuid"].replace("GPU-gpu-node-1-", gpu_prefix)
        for s in payload["samples"]:
            s["gpu"] = s["gpu"].replace("GPU-gpu-node-1-", gpu_prefix)
        response = post_batch(payload)
        assert response.status_code == 201, response.content
        if i + 1 == split:  # part of the batches land after days were already rolled up
            rollup_usage(now=clock.now())
            assert_days_equal_hours()
    rollup_usage(now=clock.now())
    assert_days_equal_hours()

    # The readers give the same figures from days as from hours for a whole-day period.
    start, end = base, base + timedelta(days=3)
    assert ledger_for(start, end) is DAYS
    now = clock.now()
    from_days = (dashboard.get_finance_dashboard(scope=FINANCE, start=start, end=end),
                 dashboard.get_finance_dashboard(scope=ACME, start=start, end=end),
                 portal.get_tenant_portal(scope=FINANCE, slug="acme", start=start, end=end, now=now))
    with monkeypatch.context() as m:
        forced_hours(m)
        from_hours = (dashboard.get_finance_dashboard(scope=FINANCE, start=start, end=end),
                      dashboard.get_finance_dashboard(scope=ACME, start=start, end=end),
                      portal.get_tenant_portal(scope=FINANCE, slug="acme", start=start, end=end, now=now))
    assert from_days == from_hours


def test_a_late_batch_for_an_earlier_day_updates_that_day_only(post_batch, rate_card):
    day1 = base_day() + timedelta(hours=5)
    day2 = day1 + timedelta(days=1)
    post_batch(make_batch(seq=1, start=day1))
    post_batch(make_batch(seq=2, start=day2))
    rollup_usage(now=clock.now())
    before = {d.day: (d.seconds, d.charge) for d in UsageDay.objects.all()}
    assert before[day_of(day1)] == before[day_of(day2)]
    assert before[day_of(day1)][0] == Decimal(10)
    post_batch(make_batch(seq=3, start=day1 + timedelta(hours=3, minutes=7), seconds=20))  # late, day 1
    result = rollup_usage(now=clock.now())
    assert result.batches == 1
    after = {d.day: (d.seconds, d.charge, d.first_hour, d.last_hour) for d in UsageDay.objects.all()}
    assert after[day_of(day1)][0] == Decimal(30)
    assert after[day_of(day1)][1] > before[day_of(day1)][1]
    assert after[day_of(day1)][2:] == (day1.replace(minute=0), day1.replace(minute=0) + timedelta(hours=3))
    assert after[day_of(day2)][:2] == before[day_of(day2)]
    assert GpuDay.objects.get(day=day_of(day1)).metered_seconds == Decimal(30)
    assert_days_equal_hours()


def _day_row_versions() -> dict[str, tuple[str, str]]:
    """Each usage-day row's (ctid, xmin) by its pod: a row rewritten gets a new one."""
    with connection.cursor() as cur:
        cur.execute("SELECT pod, ctid::text, xmin::text FROM billing_usageday")
        return {pod: (ctid, xmin) for pod, ctid, xmin in cur.fetchall()}


def test_a_cycle_rewrites_the_day_rows_of_its_own_workloads_only(post_batch, rate_card):
    """Pod a ran at 05:00, pod b at 08:00 on the same GPU and day: rolling b's batch up rewrites b's
    day row and the GPU-day, and leaves a's day row as it was (where pods churn, a GPU-day holds many
    pods that are long gone)."""
    at = base_day() + timedelta(hours=5)
    post_batch(make_batch(seq=1, start=at, workloads=[{"gpu": 0, "tenant": "acme", "pod": "a", "mem_used": 100.0,
                                                       "mem_granted": 200.0, "sm_used": 5.0, "sm_granted": 9.0}]))
    rollup_usage(now=clock.now())
    before = _day_row_versions()
    post_batch(make_batch(seq=2, start=at + timedelta(hours=3), seconds=20,
                          workloads=[{"gpu": 0, "tenant": "acme", "pod": "b", "mem_used": 300.0, "mem_granted": 400.0,
                                      "sm_used": 7.0, "sm_granted": 8.0}]))
    assert rollup_usage(now=clock.now()).batches == 1
    after = _day_row_versions()
    assert after["a"] == before["a"]
    assert set(after) == {"a", "b"}
    assert {d.pod: d.seconds for d in UsageDay.objects.all()} == {"a": Decimal(10), "b": Decimal(20)}
    assert GpuDay.objects.get().metered_seconds == Decimal(30)
    assert_days_equal_hours()


def test_rebuild_ledger_reprices_the_days_too(post_batch):
    at = base_day() + timedelta(hours=9)
    post_batch(make_batch(seq=1, start=at))
    post_batch(make_batch(seq=2, start=at + timedelta(hours=1)))
    rollup_usage(now=clock.now())
    unpriced = GpuDay.objects.get()
    assert (unpriced.priced, unpriced.card_cost, unpriced.currency, unpriced.unpriced_seconds) == (
        False, Decimal(0), "", Decimal(20))
    summary = finance.get_cost_summary(scope=FINANCE, start=day_of(at), end=day_of(at) + timedelta(days=1))
    assert (summary.unpriced_gpu_hours, summary.currency) == (Decimal(20) / 3600, "")
    RateCard.objects.create(gpu_model=A100["model"], currency="USD", price_per_gpu_hour=Decimal("3.6"),
                            effective_from=at + timedelta(hours=1), source_url="https://example.org")
    rebuild_ledger(start=at, end=at + timedelta(hours=2))
    # The second hour is priced now, the first is not: the day is partly priced.
    day = GpuDay.objects.get()
    assert (day.priced, day.card_cost, day.currency, day.unpriced_seconds) == (
        False, Decimal("0.01"), "USD", Decimal(10))
    summary = finance.get_cost_summary(scope=FINANCE, start=day_of(at), end=day_of(at) + timedelta(days=1))
    assert (summary.unpriced_gpu_hours, summary.currency, summary.total_gpu_cost) == (
        Decimal(10) / 3600, "USD", Decimal("0.01"))
    assert_days_equal_hours()


def test_the_migration_backfill_and_rebuild_days_give_what_the_rollup_wrote(post_batch, rate_card):
    migration = importlib.import_module("billing.migrations.0013_daily_ledger")
    shares = importlib.import_module("billing.migrations.0049_card_share")  # the GPU-days' Σ share, since
    peaks = importlib.import_module("billing.migrations.0053_day_peak_hour_means")  # the days' peak hours, since
    base = base_day()
    workloads = [{"gpu": 0, "tenant": "acme", "pod": "bert-1", "mem_used": 400.0, "mem_granted": 600.0,
                  "sm_used": 6.0, "sm_granted": 9.0},
                 {"gpu": 1, "tenant": "globex", "pod": "llm-2", "sla_tier": "silver", "mem_used": 7000.0,
                  "mem_granted": 6000.0, "sm_used": 40.0, "sm_granted": 30.0}]
    for seq, offset in enumerate((timedelta(hours=1), timedelta(hours=23, minutes=59, seconds=50),
                                  timedelta(days=1), timedelta(days=2, hours=12)), start=1):
        post_batch(make_batch(seq=seq, start=base + offset, gpus=2, workloads=workloads))
    rollup_usage(now=clock.now())
    rolled = day_snapshot()
    assert len(rolled[1]) == 6  # 2 GPUs x 3 days
    UsageDay.objects.all().delete()
    GpuDay.objects.all().delete()
    with connection.cursor() as cur:
        cur.execute(migration.BACKFILL_USAGE_DAYS)
        cur.execute(migration.BACKFILL_GPU_DAYS)
        cur.execute(shares.BACKFILL_GPU_DAYS)
        cur.execute(peaks.BACKFILL)
    assert day_snapshot() == rolled
    rebuild_days(start=base + timedelta(hours=5), end=base + timedelta(days=2, hours=1))  # whole days it meets
    assert day_snapshot() == rolled
    UsageDay.objects.all().delete()
    GpuDay.objects.all().delete()
    assert rebuild_days(start=base, end=base + timedelta(days=3)) == 6
    assert day_snapshot() == rolled


def test_whole_days_read_the_day_ledger_and_anything_else_the_hours():
    midnight = datetime(2026, 3, 1, tzinfo=UTC)
    assert ledger_for(midnight, midnight + timedelta(days=1)) is DAYS
    assert ledger_for(midnight, midnight + timedelta(days=1, hours=1)) is HOURS
    assert ledger_for(midnight + timedelta(microseconds=1), midnight + timedelta(days=1)) is HOURS
    # Day buckets of a non-midnight period and hour buckets read hours.
    assert ledger_reads.bucketed_ledger(midnight, midnight + timedelta(days=2), "hour") is HOURS
    assert ledger_reads.bucketed_ledger(midnight, midnight + timedelta(days=3), "day") is DAYS
