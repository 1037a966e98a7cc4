"""The ledger's data lifecycle on real Postgres: raw and minute day partitions dropped exactly when
their retention ends (whatever the date), never while a batch in them is pending or quarantined,
never by DELETE; minutes written into days whose partition did not exist; recomputes and reports
over dropped ranges refused with the earliest instant they may use; stale partitions analysed."""

from __future__ import annotations

import importlib
import logging
import os
import re
import subprocess
import sys
import time
from collections.abc import Callable
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from django.core.management import call_command
from django.db import connection
from django.db.migrations.executor import MigrationExecutor
from django.test.utils import CaptureQueriesContext, override_settings
from hypothesis import given
from hypothesis import strategies as st

from billing import tasks
from billing.checks import check_retention
from billing.ledger.models import BatchGpu as Gpu
from billing.ledger.models import GpuMinute, UsageBatch, UsageDay, UsageMinute, Workload
from billing.ledger.partitions import (
    MINUTE_TABLES,
    RAW_TABLE,
    day_bounds,
    ensure_minute_partitions,
    ensure_raw_partitions,
    list_day_partitions,
    partition_name,
)
from billing.ledger.retention import (
    BatchesPruned,
    MinutesPruned,
    RetentionPolicy,
    apply_retention,
    get_retention_state,
    is_past_retention,
)
from billing.ledger.rollup import rebuild_ledger, rollup_usage
from billing.ledger.statistics import analyze_stale_partitions
from billing.metrics import render_metrics
from billing.models import GpuModel, Node
from billing.services.ingest.rollup import quarantine_batch
from billing.services.pricing.rate_cards import create_rate_card, earliest_change
from billing.services.savings.paired_report import LOOKBACK, compute_paired_report
from billing.services.savings.reports import request_paired_report
from tests import clock
from tests.conftest import A100, healthz_as_admin, make_batch

ROOT = Path(__file__).resolve().parents[2]
LEDGER_TABLES = (RAW_TABLE, *MINUTE_TABLES)
PostBatch = Callable[..., Any]  # tests/conftest.py's post_batch fixture


def policy() -> RetentionPolicy:
    return RetentionPolicy.from_settings()


def names(table: str) -> set[str]:
    return {p.name for p in list_day_partitions(table)}


def where_rows_are(table: str) -> dict[str, int]:
    with connection.cursor() as cur:
        cur.execute(f"SELECT tableoid::regclass::text, count(*) FROM {table} GROUP BY 1")  # noqa: S608 - test
        return dict(cur.fetchall())


def ledger_deletes(queries: list[dict[str, str]]) -> list[str]:
    """Statements that DELETE from a ledger table (retention's own hold rows are bookkeeping)."""
    target = re.compile(r"^\s*DELETE\s+FROM\s+\"?(" + "|".join(LEDGER_TABLES) + ")", re.IGNORECASE)
    return [q["sql"] for q in queries if target.match(q["sql"])]


def batch_row(node: Node, seq: int, start: datetime, **fields: object) -> UsageBatch:
    return UsageBatch.objects.create(node=node, batch_seq=seq, content_sha256="0" * 64, window_start=start,
                                     window_end=start + timedelta(seconds=10), sample_count=1, received_at=start,
                                     **fields)


# --- when a day goes --------------------------------------------------------------------------


@given(day=st.dates(min_value=date(2000, 1, 2), max_value=date(2100, 1, 1)),
       offset_s=st.integers(min_value=-3 * 86400, max_value=3 * 86400))
def test_a_day_is_past_retention_exactly_when_its_last_instant_is_older_than_the_keep_from_instant(day: date, offset_s: int) -> None:
    _, hi = day_bounds(day)
    keep_from = hi + timedelta(seconds=offset_s)
    past = is_past_retention(day, keep_from=keep_from)
    # Every instant at or after keep_from is in a kept day; a day is dropped only when all of it is older.
    assert past == (hi <= keep_from)
    if past:
        assert is_past_retention(day - timedelta(days=1), keep_from=keep_from)  # older days go first
    else:
        assert not is_past_retention(day + timedelta(days=1), keep_from=keep_from)


@pytest.mark.django_db
@pytest.mark.parametrize("day", [date(2028, 2, 28), date(2028, 2, 29), date(2028, 3, 1), date(2027, 2, 28),
                                 date(2026, 11, 30), date(2026, 12, 31), date(2027, 1, 1), date(2027, 1, 31)])
def test_raw_then_minute_days_are_dropped_at_the_exact_instant_their_retention_ends_and_never_by_delete(day: date) -> None:
    ensure_raw_partitions([day, day + timedelta(days=1)])
    ensure_minute_partitions([day, day + timedelta(days=1)])
    _, end = day_bounds(day)
    raw_due, minute_due = end + policy().raw_retention, end + policy().minute_retention
    assert minute_due >= raw_due
    with CaptureQueriesContext(connection) as queries:
        assert apply_retention(now=raw_due - timedelta(microseconds=1)).dropped == ()
        assert partition_name(day) in names(RAW_TABLE)

        assert get_retention_state(now=raw_due).held_partitions == {"raw": 0, "minute": 0}  # due, not held
        dropped = apply_retention(now=raw_due).dropped
        assert dropped == (partition_name(day),)  # the next day is not due yet; the minutes neither
        assert partition_name(day + timedelta(days=1)) in names(RAW_TABLE)

        # By then the next raw day has gone too, but no minute day yet.
        assert apply_retention(now=minute_due - timedelta(microseconds=1)).dropped == (
            partition_name(day + timedelta(days=1)),)
        dropped = apply_retention(now=minute_due).dropped
        assert set(dropped) == {partition_name(day, t) for t in MINUTE_TABLES}
    assert ledger_deletes(queries.captured_queries) == []
    state = get_retention_state(now=minute_due)
    assert state.raw_retained_from == end + timedelta(days=1)
    assert state.minutes_retained_from == end


@pytest.mark.django_db
def test_running_retention_twice_drops_nothing_the_second_time() -> None:
    day = clock.now().date() - policy().minute_retention - timedelta(days=3)
    ensure_raw_partitions([day])
    ensure_minute_partitions([day])
    first = tasks.apply_retention.apply().get()
    second = tasks.apply_retention.apply().get()
    dropped = first["dropped"]
    assert isinstance(dropped, list)
    assert partition_name(day) in dropped
    assert second == {"dropped": [], "held": [], "lock_busy": [], "batches_pruned": 0, "workloads_pruned": 0,
                      "hour_days_pruned": [], "hour_rows_pruned": 0, "hour_day_held": None, "hour_days_kept": []}


# --- what is never dropped --------------------------------------------------------------------


@pytest.mark.django_db
def test_a_day_with_a_pending_batch_is_kept_logged_once_counted_and_dropped_once_rolled_up(
        post_batch: PostBatch, time_machine: Any, caplog: pytest.LogCaptureFixture) -> None:
    day = clock.now().date() - timedelta(days=120)
    at = datetime(day.year, day.month, day.day, 12, tzinfo=UTC)
    time_machine.move_to(at + timedelta(minutes=5), tick=False)
    assert post_batch(make_batch(start=at)).status_code == 201
    later = day_bounds(day)[1] + policy().raw_retention + timedelta(days=1)
    raw = partition_name(day)

    with caplog.at_level(logging.WARNING, logger="billing.ledger.retention"):
        first = apply_retention(now=later)
        second = apply_retention(now=later)
    assert raw in {h.name for h in first.held}
    assert raw not in first.dropped + second.dropped
    assert [h.batch_ids for h in first.held if h.name == raw] == [(UsageBatch.objects.get().pk,)]
    held_logs = [r for r in caplog.records if "retention_partition_held" in r.getMessage()]
    assert len(held_logs) == 1
    assert raw in held_logs[0].getMessage()
    state = get_retention_state(now=later)
    assert state.held_partitions["raw"] == 1
    assert state.held_bytes["raw"] > 0
    time_machine.move_to(later, tick=False)  # a scrape reads the clock
    assert 'vgpu_ledger_retention_held_partitions{ledger="raw"} 1.0' in render_metrics().decode()
    # The SRE's first look: /healthz fails for the pending batch and shows the partition it holds.
    ledger = healthz_as_admin().json()["ledger"]
    assert ledger["ok"] is False
    assert ledger["retention_held_partitions"] == 1

    rollup_usage(now=later)
    assert raw in apply_retention(now=later).dropped
    assert get_retention_state(now=later).held_partitions["raw"] == 0
    assert GpuMinute.objects.count() == 1  # its minutes stay for the minute retention


@pytest.mark.django_db
def test_a_day_with_a_quarantined_batch_is_kept_even_after_the_rollup_moves_on(post_batch: PostBatch, time_machine: Any) -> None:
    day = clock.now().date() - timedelta(days=120)
    at = datetime(day.year, day.month, day.day, 23, 59, 55, tzinfo=UTC)  # its window crosses midnight
    time_machine.move_to(at + timedelta(minutes=5), tick=False)
    assert post_batch(make_batch(start=at, seconds=10)).status_code == 201
    quarantine_batch(batch_id=UsageBatch.objects.get().pk, error="test: poisoned", now=at)
    later = day_bounds(day)[1] + policy().minute_retention + timedelta(days=2)
    rollup_usage(now=later)  # leaves the quarantined batch out
    result = apply_retention(now=later)
    kept = {partition_name(day), partition_name(day + timedelta(days=1))}
    assert kept <= {h.name for h in result.held}
    assert kept <= names(RAW_TABLE)
    assert not kept & set(result.dropped)


@pytest.mark.django_db
def test_batches_go_with_their_raw_day_once_rolled_up_and_a_retry_of_one_is_refused_not_billed_again(
        post_batch: PostBatch, time_machine: Any) -> None:
    held_day = clock.now().date() - timedelta(days=120)
    noon = datetime(held_day.year, held_day.month, held_day.day, 12, tzinfo=UTC)
    time_machine.move_to(noon + timedelta(days=1, minutes=5), tick=False)
    poisoned, billed = make_batch(start=noon, seq=1), make_batch(start=noon + timedelta(days=1), seq=2)
    assert post_batch(poisoned).status_code == 201
    assert post_batch(billed).status_code == 201
    quarantine_batch(batch_id=UsageBatch.objects.get(batch_seq=1).pk, error="test: poisoned", now=noon)
    rollup_usage(now=clock.now())
    later = day_bounds(held_day + timedelta(days=1))[1] + policy().raw_retention + timedelta(days=1)
    result = apply_retention(now=later)
    # The quarantined batch's day is held; the next day goes, and its rolled-up batch with it.
    assert partition_name(held_day + timedelta(days=1)) in result.dropped
    assert result.batches_pruned == 1
    assert list(UsageBatch.objects.values_list("batch_seq", flat=True)) == [1]
    assert not Gpu.objects.filter(batch__batch_seq=2).exists()
    minutes = UsageMinute.objects.count()
    assert minutes == 1  # what it billed stays: minutes for their retention, hours and days for good
    assert apply_retention(now=later).batches_pruned == 0
    time_machine.move_to(later, tick=False)
    answer = post_batch(billed)  # the agent retries it: far past the late-usage horizon
    assert answer.status_code == 400, answer.content
    assert UsageBatch.objects.count() == 1
    assert UsageMinute.objects.count() == minutes


def test_a_workload_goes_once_the_minute_days_up_to_its_last_one_are_dropped_and_not_before(
        post_batch: PostBatch, time_machine: Any) -> None:
    first = clock.now().date() - timedelta(days=150)
    noon = datetime(first.year, first.month, first.day, 12, tzinfo=UTC)
    stays = [{"gpu": 0, "tenant": "acme", "pod": "stays", "mem_used": 1.0, "mem_granted": 2.0, "sm_used": 1.0,
              "sm_granted": 2.0}]
    time_machine.move_to(noon + timedelta(minutes=5), tick=False)
    assert post_batch(make_batch(start=noon, seq=1, workloads=[*stays, {**stays[0], "pod": "leaves"}])).status_code == 201
    rollup_usage(now=clock.now())
    assert dict(Workload.objects.values_list("pod", "last_day")) == {"stays": first, "leaves": first}
    second = first + timedelta(days=2)  # the same pod again two days later: its last day moves on
    time_machine.move_to(noon + timedelta(days=2, minutes=5), tick=False)
    assert post_batch(make_batch(start=noon + timedelta(days=2), seq=2, workloads=stays)).status_code == 201
    rollup_usage(now=clock.now())
    assert dict(Workload.objects.values_list("pod", "last_day")) == {"stays": second, "leaves": first}

    first_gone = day_bounds(first)[1] + policy().minute_retention
    assert apply_retention(now=first_gone - timedelta(microseconds=1)).workloads_pruned == 0
    result = apply_retention(now=first_gone)
    assert partition_name(first, MINUTE_TABLES[0]) in result.dropped
    assert result.workloads_pruned == 1
    assert list(Workload.objects.values_list("pod", flat=True)) == ["stays"]  # its minutes of the later day are kept
    assert UsageMinute.objects.filter(pod="stays").count() == 1
    result = apply_retention(now=day_bounds(second)[1] + policy().minute_retention)
    assert (result.workloads_pruned, Workload.objects.count(), UsageMinute.objects.count()) == (1, 0, 0)
    # What they billed stays, names and all, in the hours and days.
    assert set(UsageDay.objects.values_list("pod", flat=True)) == {"stays", "leaves"}


@pytest.mark.django_db
def test_minutes_of_a_day_whose_raw_day_is_still_held_are_not_dropped() -> None:
    node = Node.objects.create(name="node-held")
    day = clock.now().date() - policy().minute_retention - timedelta(days=5)
    ensure_raw_partitions([day])
    ensure_minute_partitions([day])
    batch_row(node, 1, datetime(day.year, day.month, day.day, 6, tzinfo=UTC))  # pending
    result = apply_retention(now=clock.now())
    assert partition_name(day) in {h.name for h in result.held}
    for table in LEDGER_TABLES:
        assert partition_name(day, table) in names(table)
    assert not result.dropped


# --- writes into days that had no partition ---------------------------------------------------


@pytest.mark.django_db
def test_the_rollup_writes_minutes_across_a_month_end_into_partitions_it_creates(post_batch: PostBatch, time_machine: Any) -> None:
    month_start = clock.month_start(clock.now())
    time_machine.move_to(month_start + timedelta(minutes=5), tick=False)
    before, after = (month_start - timedelta(days=1)).date(), month_start.date()
    for table in MINUTE_TABLES:
        assert not {partition_name(before, table), partition_name(after, table)} & names(table)
    assert post_batch(make_batch(start=month_start - timedelta(seconds=30), seconds=60)).status_code == 201
    assert rollup_usage(now=clock.now()).gpu_minutes == 2
    for table in MINUTE_TABLES:
        assert where_rows_are(table) == {partition_name(before, table): 1, partition_name(after, table): 1}


@pytest.mark.django_db
def test_a_minute_written_through_the_orm_before_its_day_exists_moves_into_the_day_when_it_is_made() -> None:
    node = Node.objects.create(name="node-orm")
    minute = datetime(2030, 6, 30, 23, 59, tzinfo=UTC)
    zero = Decimal(0)
    row = UsageMinute.objects.create(
        minute=minute, gpu_uuid="GPU-x", node=node, tenant="acme", namespace="acme-prod", pod="p", container="c",
        pod_uid="u", sla_tier="gold", seconds=Decimal(60), mem_used_mb_s=zero, mem_granted_mb_s=zero,
        mem_billed_mb_s=zero, sm_used_s=zero, sm_granted_s=zero, sm_billed_s=zero, pcie_mb=zero, share_gpu_s=zero,
        charge=Decimal("0.5"), idle_share=zero)
    store = MINUTE_TABLES[0]  # the usage minutes' store, under the view the model reads
    assert where_rows_are(store) == {f"{store}_default": 1}
    assert ensure_minute_partitions([minute.date()]) == [minute.date()]
    assert where_rows_are(store) == {partition_name(minute.date(), store): 1}
    assert UsageMinute.objects.get().pk == row.pk
    assert UsageMinute.objects.get().charge == Decimal("0.5")


# --- refusing to compute from what retention dropped ------------------------------------------


@pytest.mark.django_db
def test_a_rebuild_over_dropped_raw_samples_is_refused_naming_the_earliest_repriceable_instant(
        post_batch: PostBatch, time_machine: Any) -> None:
    day = clock.now().date() - timedelta(days=120)
    at = datetime(day.year, day.month, day.day, 12, tzinfo=UTC)
    time_machine.move_to(at + timedelta(minutes=5), tick=False)
    assert post_batch(make_batch(start=at)).status_code == 201
    later = day_bounds(day)[1] + policy().raw_retention
    rollup_usage(now=later)
    minutes = list(GpuMinute.objects.values_list("minute", "card_cost"))
    assert partition_name(day) in apply_retention(now=later).dropped

    with pytest.raises(BatchesPruned) as refused:
        rebuild_ledger(start=at, end=at + timedelta(hours=1))
    earliest = day_bounds(day)[1]
    assert refused.value.retained_from == earliest
    assert f"the earliest instant that can be re-priced is {earliest.isoformat()}" in str(refused.value)
    assert list(GpuMinute.objects.values_list("minute", "card_cost")) == minutes  # nothing was zeroed
    rebuild_ledger(start=earliest, end=earliest + timedelta(hours=1))  # from there on it may


@pytest.mark.django_db
def test_a_rate_card_change_after_retention_reprices_from_its_start_which_always_has_raw_samples(
        post_batch: PostBatch, minute_start: datetime, one_usd_per_gpu_second: Any) -> None:
    """A price changes from the next whole minute on (billing.services.pricing.rate_cards), and raw samples
    are kept for at least the late-usage horizon plus a day, so re-pricing is never refused."""
    # One instant for the whole test: the change's earliest start is the next whole minute after it,
    # and a second reading of the clock could fall in the next minute and refuse that start.
    now = clock.now()
    old_day = now.date() - policy().raw_retention - timedelta(days=2)
    ensure_raw_partitions([old_day])
    assert partition_name(old_day) in apply_retention(now=now).dropped
    # A batch skewed into the future (allowed clock skew) is already rolled up and must be re-priced.
    skewed = earliest_change(now)
    assert post_batch(make_batch(start=skewed, seconds=10)).status_code == 201
    rollup_usage(now=now)
    GpuModel.objects.create(name=str(A100["model"]), approved_at=now, approved_by="test")
    change = create_rate_card(gpu_model=str(A100["model"]), price_per_gpu_hour="7200", currency="USD",
                              effective_from=skewed, source_url="https://example.org/new", source_note="list price, test",
                              now=now, actor_label="test")
    assert change.reprice_minutes == 1
    assert GpuMinute.objects.get(minute=skewed).card_cost == Decimal(20)


@pytest.mark.django_db
def test_a_paired_report_over_pruned_minutes_is_refused_naming_the_earliest_start() -> None:
    day = clock.now().date() - policy().minute_retention - timedelta(days=3)
    ensure_minute_partitions([day])
    apply_retention(now=clock.now())
    retained = day_bounds(day)[1]
    with pytest.raises(MinutesPruned) as refused:
        compute_paired_report(start=retained + timedelta(days=2), end=retained + timedelta(days=3), now=clock.now())
    assert refused.value.retained_from == retained
    assert f"the earliest start it may have is {(retained + LOOKBACK).isoformat()}" in str(refused.value)
    report = compute_paired_report(start=retained + LOOKBACK, end=retained + LOOKBACK + timedelta(days=1),
                                   now=clock.now())
    assert report["n_units"] == 0
    with pytest.raises(MinutesPruned):  # the request is refused at once, before a job is queued
        request_paired_report(start=retained, end=retained + timedelta(days=1), now=clock.now(), actor_label="t")


# --- settings ---------------------------------------------------------------------------------


@pytest.mark.django_db
@override_settings(VGPU_RAW_RETENTION_MARGIN=timedelta(0), VGPU_MINUTE_RETENTION=timedelta(days=10))
def test_unsound_retention_settings_fail_the_system_check_and_the_task_drops_nothing() -> None:
    [error] = check_retention()
    assert error.id == "billing.E004"
    assert "VGPU_RAW_RETENTION_MARGIN_DAYS must be at least 1" in error.msg
    assert "VGPU_MINUTE_RETENTION_DAYS (10) must be at least the raw retention" in error.msg
    day = clock.now().date() - timedelta(days=400)
    ensure_raw_partitions([day])
    with pytest.raises(ValueError, match="nothing dropped"):
        apply_retention(now=clock.now())
    assert partition_name(day) in names(RAW_TABLE)


def test_a_retention_setting_that_is_not_a_whole_number_of_days_stops_startup() -> None:
    env = {**os.environ, "VGPU_MINUTE_RETENTION_DAYS": "90d"}
    result = subprocess.run([sys.executable, "-c", "import django; django.setup()"], env=env, cwd=ROOT,
                            capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode != 0
    assert "VGPU_MINUTE_RETENTION_DAYS must be a whole number of days (0 or more), got '90d'" in result.stderr


# --- statistics -------------------------------------------------------------------------------


def _stats(name: str) -> tuple[float, object]:
    with connection.cursor() as cur:
        cur.execute("SELECT pg_stat_clear_snapshot()")
        cur.execute("SELECT c.reltuples, s.last_analyze FROM pg_class c JOIN pg_stat_user_tables s ON s.relid = c.oid "
                    "WHERE c.relname = %s", [name])
        reltuples, last_analyze = cur.fetchone()
    return float(reltuples), last_analyze


def _planned_rows(day: date) -> int:
    lo, hi = day_bounds(day)
    with connection.cursor() as cur:
        cur.execute("EXPLAIN (FORMAT JSON) SELECT * FROM billing_raw_sample WHERE start >= %s AND start < %s", [lo, hi])
        return int(cur.fetchone()[0][0]["Plan"]["Plan Rows"])


def _flush_stats() -> None:
    """This backend's pending table counters reach pg_stat at its next idle moment (Postgres 15)."""
    with connection.cursor() as cur:
        cur.execute("SELECT pg_stat_force_next_flush()")
    with connection.cursor() as cur:
        cur.execute("SELECT 1")


@pytest.mark.django_db(transaction=True)
def test_partitions_with_rows_and_no_or_stale_statistics_are_analysed_and_no_others(
        mid_month: datetime, post_batch: PostBatch, minute_start: datetime) -> None:
    # mid_month first: minute_start is then noon on the 15th, far from a day's edge.
    assert post_batch(make_batch(start=minute_start, seconds=30)).status_code == 201
    day = minute_start.date()
    raw = partition_name(day)
    minutes = {partition_name(day, t) for t in MINUTE_TABLES}

    def no_autovacuum(names: set[str]) -> None:  # so autovacuum cannot analyse them first
        with connection.cursor() as cur:
            for name in names:
                cur.execute(f'ALTER TABLE "{name}" SET (autovacuum_enabled = false)')

    no_autovacuum({raw})
    assert _stats(raw) == (-1.0, None)
    assert _planned_rows(day) != 30  # without statistics the planner guesses from the table's pages
    # The rollup analyses the stale raw partitions it is about to read, before it plans on them.
    rollup_usage(now=clock.now())
    assert _stats(raw)[0] == 30
    assert _stats(raw)[1] is not None
    no_autovacuum(minutes)
    ensure_raw_partitions([day + timedelta(days=3)])  # empty, made ahead
    assert all(_stats(name) == (-1.0, None) for name in minutes)

    analysed = set(tasks.analyze_ledger_partitions.apply().get())
    # The raw partition's statistics are fresh.
    assert minutes <= analysed
    assert raw not in analysed
    assert partition_name(day + timedelta(days=3)) not in analysed
    raw_rows, raw_analysed = _stats(partition_name(day))
    assert raw_rows == 30
    assert raw_analysed is not None
    assert _stats(partition_name(day, MINUTE_TABLES[1]))[0] >= 1
    assert _planned_rows(day) == 30  # what the rollup's scan of the day is planned on
    assert tasks.analyze_ledger_partitions.apply().get() == []  # fresh statistics: nothing to do

    # 1,200 more samples: well past a tenth of the partition's rows and the 1,000-row floor.
    workloads = [{"gpu": 0, "tenant": "acme", "pod": f"p{i}", "mem_used": 1.0, "mem_granted": 1.0, "sm_used": 0.1,
                  "sm_granted": 0.1} for i in range(4)]
    assert post_batch(make_batch(start=minute_start + timedelta(seconds=30), seconds=300, seq=2,
                                 workloads=workloads)).status_code == 201
    _flush_stats()
    time.sleep(0.1)
    assert partition_name(day) in tasks.analyze_ledger_partitions.apply().get()
    # The first batch's 30 rows left the inbox when it was rolled up (they are in the minute store).
    assert _stats(partition_name(day))[0] == 1200


def _other_connection() -> Any:
    """A second session, as an ingest worker would hold one."""
    import psycopg2

    db = connection.settings_dict
    return psycopg2.connect(dbname=db["NAME"], user=db["USER"], password=db["PASSWORD"], host=db["HOST"],
                            port=db["PORT"])


_RAW_ROW = ("INSERT INTO billing_raw_sample (batch_id, node_id, gpu_uuid, start, seconds, tenant, namespace, pod, "
            "container, pod_uid, sla_tier, mem_used_mb_s, mem_granted_mb_s, sm_used_s, sm_granted_s, pcie_mb) "
            "VALUES (0, 0, 'GPU-x', %s, 1, 't', 'n', 'p', 'c', 'u', 'gold', 0, 0, 0, 0, 0)")


@pytest.mark.django_db(transaction=True)
def test_a_drop_gives_way_to_ingest_in_flight_and_analysing_does_not_wait_for_it() -> None:
    old = clock.now().date() - policy().minute_retention - timedelta(days=3)
    today = clock.now().date()
    ensure_raw_partitions([old, today])
    with connection.cursor() as cur:
        cur.execute(_RAW_ROW, [clock.now()])
    ingest = _other_connection()
    try:
        with ingest.cursor() as cur:  # an ingest transaction still open on the raw table
            cur.execute(_RAW_ROW, [clock.now()])
        began = time.monotonic()
        result = apply_retention(now=clock.now())
        assert result.lock_busy == (partition_name(old),)
        assert result.dropped == ()
        assert time.monotonic() - began < 10  # it waited its 2 s lock timeout, not for the ingest
        began = time.monotonic()
        assert partition_name(today) in {a.name for a in analyze_stale_partitions()}
        assert time.monotonic() - began < 2  # ANALYZE's lock does not conflict with the ingest's
        ingest.commit()
        assert apply_retention(now=clock.now()).dropped == (partition_name(old),)
    finally:
        ingest.close()
        with connection.cursor() as cur:  # retention's bookkeeping is not a model: no flush empties it
            cur.execute("DELETE FROM billing_ledger_retention")
            cur.execute("DELETE FROM billing_ledger_retention_hold")


# --- the schema change ------------------------------------------------------------------------

_MIGRATION = importlib.import_module("billing.migrations.0018_minute_partitions")


# The columns 0018 knows: the model has more since (energy), so rows at that schema are written in SQL.
_USAGE_MINUTE_AT_0018 = (
    "INSERT INTO billing_usageminute (gpu_uuid, tenant, namespace, pod, container, pod_uid, sla_tier, "
    "seconds, mem_used_mb_s, mem_granted_mb_s, mem_billed_mb_s, sm_used_s, sm_granted_s, sm_billed_s, "
    "pcie_mb, share_gpu_s, charge, idle_share, minute, node_id) VALUES ('GPU-m', 'acme', 'ns', 'p', 'c', "
    "'u', 'gold', 60, 1, 1, 1, 1, 1, 1, 0, 0.5, 1.25, 0, %s, %s) RETURNING id")


def _insert_plain_minutes(node_id: int) -> list[tuple[int, datetime]]:
    minutes = [datetime(2028, 2, 29, 23, 59, tzinfo=UTC), datetime(2028, 3, 1, 0, 0, tzinfo=UTC)]
    with connection.cursor() as cur:
        for m in minutes:
            cur.execute(_USAGE_MINUTE_AT_0018, [m, node_id])
            cur.execute(
                "INSERT INTO billing_gpuminute (gpu_uuid, gpu_model, metered_seconds, card_cost, charged, idle_cost, "
                "idle_allocated, currency, priced, minute, node_id) VALUES ('GPU-m', 'A100', 60, 2.5, 1.25, 1.25, 0, "
                "'USD', true, %s, %s)", [m, node_id])
        cur.execute("SELECT id, minute FROM billing_usageminute ORDER BY id")
        return [(int(i), m) for i, m in cur.fetchall()]


def _keys(table: str) -> dict[str, str]:
    with connection.cursor() as cur:
        cur.execute("SELECT conname, pg_get_constraintdef(oid) FROM pg_constraint WHERE conrelid = %s::regclass "
                    "AND contype IN ('p', 'u')", [table])
        return dict(cur.fetchall())


@pytest.mark.django_db(transaction=True)
def test_the_migration_partitions_existing_minute_rows_by_day_and_keeps_every_row() -> None:
    previous = _MIGRATION.Migration.dependencies  # 0017_distribution_key once the lead switches it
    latest = [("billing", "0018_minute_partitions")]
    node = Node.objects.create(name="node-migrated")
    MigrationExecutor(connection).migrate(previous)
    try:
        rows = _insert_plain_minutes(node.pk)
        MigrationExecutor(connection).migrate(latest)
        with connection.cursor() as cur:
            cur.execute("SELECT id, minute FROM billing_usageminute ORDER BY id")
            assert cur.fetchall() == rows
            cur.execute("SELECT sum(card_cost), count(*) FROM billing_gpuminute")
            assert cur.fetchone() == (Decimal("5.000000000000"), 2)
        for table in _MIGRATION.TABLES:  # the minute tables as 0018 knew them
            assert where_rows_are(table) == {f"{table}_p20280229": 1, f"{table}_p20280301": 1}
        assert _keys("billing_usageminute") == {"billing_usageminute_pkey": "PRIMARY KEY (id, minute)"}
        assert _keys("billing_gpuminute") == {"billing_gpuminute_pkey": "PRIMARY KEY (id, minute)",
                                              "gpu_minute_unique": "UNIQUE (node_id, gpu_uuid, minute)"}
        # New rows continue the ids; the ledger functions still read every row.
        with connection.cursor() as cur:
            cur.execute(_USAGE_MINUTE_AT_0018, [datetime(2028, 3, 1, 0, 1, tzinfo=UTC), node.pk])
            (newer_id,) = cur.fetchone()
        assert newer_id > max(r[0] for r in rows)
        # And back: plain tables with the old keys, rows intact.
        MigrationExecutor(connection).migrate(previous)
        assert _keys("billing_gpuminute")["gpu_minute_unique"] == "UNIQUE (gpu_uuid, minute)"
        assert UsageMinute.objects.count() == 3
    finally:
        # Back to every app's newest migration, not to 0018: later migrations were unapplied with it.
        executor = MigrationExecutor(connection)
        executor.migrate(executor.loader.graph.leaf_nodes())
    # Database-only: Django's model state is what it was, so there is nothing for it to migrate.
    call_command("makemigrations", "billing", "--check", "--dry-run", verbosity=0)


# --- on the beat schedule, as the demo runs it ------------------------------------------------


def test_the_demo_beat_schedules_retention_and_analysis(tmp_path: Path) -> None:
    """Starts beat exactly as config/demo.py does (`celery -A config beat --schedule FILE`, the
    default persistent scheduler fed by CELERY_BEAT_SCHEDULE) and reads the schedule it loaded."""
    demo = (ROOT / "config" / "demo.py").read_text()
    assert '"beat": [str(bindir / "celery"), "-A", "config", "beat"' in demo
    assert "--scheduler" not in demo
    assert '"-S"' not in demo
    celery = Path(sys.executable).parent / "celery"
    proc = subprocess.Popen([str(celery), "-A", "config", "beat", "--loglevel", "DEBUG", "--schedule",
                             str(tmp_path / "celerybeat-schedule")], cwd=ROOT, env=dict(os.environ),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines: list[str] = []
    try:
        assert proc.stdout is not None
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line:
                break
            lines.append(line)
            if "beat: Ticking with max interval" in line:
                break
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    loaded = "".join(lines)
    assert "<ScheduleEntry: apply-retention billing.tasks.apply_retention() <freq: 1.00 hour>" in loaded, loaded
    assert ("<ScheduleEntry: analyze-ledger-partitions billing.tasks.analyze_ledger_partitions() "
            "<freq: 5.00 minutes>") in loaded
    assert "<ScheduleEntry: ensure-raw-partitions billing.tasks.ensure_raw_partitions() <freq: 1.00 hour>" in loaded
    # The names it sends are tasks the worker has.
    from config.celery import app

    assert {"billing.tasks.apply_retention", "billing.tasks.analyze_ledger_partitions"} <= set(app.tasks)
