"""The requested figures stored in the hour, day and month rows (billing.ledger.requests): the
rollup writes them from the pods' metadata, reads sum them, and whatever order batches, request
changes, rollups and month closes come in, a read gives what a join of every row to the metadata
gives (the figures of the requests stored now), to the last digit."""

from __future__ import annotations

import importlib
import itertools
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

import pytest
from django.db import connection
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from billing.ledger import allocation, requests
from billing.ledger.models import UsageDay, UsageHour, UsageMonth, WorkloadMeta
from billing.ledger.months import close_days
from billing.ledger.rollup import rebuild_days, rollup_usage
from billing.models import Node, RateCard
from tests import clock
from tests.conftest import A100, make_batch

pytestmark = pytest.mark.django_db

PODS = ("bert-1", "llm-2")
_seq = itertools.count(1)
_example = itertools.count(1)


@pytest.fixture
def rate_card(db: Any) -> RateCard:
    return RateCard.objects.create(gpu_model=A100["model"], currency="USD", price_per_gpu_hour=Decimal("3.6"),
                                   effective_from=datetime(2020, 1, 1, tzinfo=UTC), source_url="https://example.org")


def base_hour() -> datetime:
    """An hour two days ago: every batch is in the past, not on midnights (a read of it is of hours)."""
    return clock.now().astimezone(UTC).replace(minute=0, second=0, microsecond=0) - timedelta(days=2, hours=-3)


def month_end() -> datetime:
    """The latest start of a UTC month at least two days ago: late batches on both sides of it are
    within the late-usage horizon, and its days are closed by a month close."""
    now = clock.now().astimezone(UTC) - timedelta(days=2)
    return now.replace(day=1, hour=0, minute=0, second=0, microsecond=0)


def batch(start: datetime, requests: dict[str, tuple[Any, Any] | None], *, suffix: str = "") -> dict[str, Any]:
    """A minute of both pods (their names + `suffix`), each with the request of `requests` (mem MB,
    SMs) on every sample, or none."""
    workloads = [{"gpu": i, "tenant": "acme", "pod": pod + suffix, "mem_used": 300.0, "mem_granted": 500.0,
                  "sm_used": 5.0, "sm_granted": 9.0} for i, pod in enumerate(PODS)]
    body = make_batch(seq=next(_seq), start=start, seconds=60, gpus=2, workloads=workloads)
    for gpu in body["gpus"]:  # the example's own GPUs: a GPU-second is metered once
        gpu["uuid"] += suffix
    for sample in body["samples"]:
        sample["gpu"] += suffix
        asked = requests.get(sample["pod"].removesuffix(suffix))
        if asked is not None:
            sample["mem_requested_mb"], sample["sm_requested"] = asked
    return body


def hourly(start: datetime, end: datetime) -> list[allocation.UsageGroupRow]:
    """Per pod and hour (per pod and day, for whole days): what the allocation API's sets read."""
    step = timedelta(days=1) if start.hour == end.hour == 0 else timedelta(hours=1)
    starts = [start + step * i for i in range(int((end - start) / step))]
    return sorted(allocation.list_usage_groups(start=start, end=end, starts=starts, keys=["pod"], filters={},
                                               tenants=None, by_node=False), key=repr)


def joined(start: datetime, end: datetime) -> list[allocation.UsageGroupRow]:
    """The same read with every pod's requests taken from its metadata: the join of every hour row."""
    with connection.cursor() as cur:
        cur.execute("SAVEPOINT joined")
        WorkloadMeta.objects.update(requests_changed=True)
        rows = hourly(start, end)
        cur.execute("ROLLBACK TO SAVEPOINT joined")
    return rows


def days(start: datetime) -> tuple[datetime, datetime]:
    """The whole UTC days around `start`'s hours: a read of them is of days (and months, once closed)."""
    midnight = start.replace(hour=0)
    return midnight - timedelta(days=1), midnight + timedelta(days=2)


def assert_rows_store_their_requests() -> None:
    """Every hour, day and month row of a pod not flagged stores its request x its seconds, as the
    metadata holds them now (NULL: unknown, where the metadata has no number)."""
    expected = " IS NOT DISTINCT FROM ".join(
        f"({', '.join(f'u.{c}' for c in requests.REQUESTED_COLUMNS.values())})"
        if i == 0 else f"({', '.join(requests.requested_sql(f) for f in requests.REQUESTED_COLUMNS)})" for i in range(2))
    with connection.cursor() as cur:
        for table in ("billing_usagehour", "billing_usageday", "billing_usagemonth"):
            cur.execute(f"SELECT count(*) FROM {table} u LEFT JOIN billing_workloadmeta m ON m.node_id = u.node_id "  # noqa: S608 - fixed names
                        "AND m.namespace = u.namespace AND m.pod = u.pod AND m.pod_uid = u.pod_uid "
                        f"WHERE NOT coalesce(m.requests_changed, false) AND NOT ({expected})")
            assert cur.fetchone()[0] == 0, table


def requested(rows: list[allocation.UsageGroupRow]) -> dict[str, Decimal | None]:
    """Each pod's memory requested over the read's sets: unknown if unknown in any."""
    out: dict[str, Decimal | None] = {}
    for row in rows:
        pod, before = row.keys[0], out.get(row.keys[0], Decimal(0))
        out[pod] = None if before is None or row.mem_requested_mb_s is None else before + row.mem_requested_mb_s
    return out


def test_the_rollup_stores_each_hour_rows_requested_figures(post_batch, rate_card) -> None:
    start = base_hour()
    assert post_batch(batch(start, {"bert-1": (8192, 20), "llm-2": None})).status_code == 201
    rollup_usage(now=clock.now())
    rows = {r.pod: r for r in UsageHour.objects.all()}
    assert rows["bert-1"].mem_requested_mb_s == Decimal(8192 * 60)
    assert rows["bert-1"].sm_requested_s == Decimal(20 * 60)
    assert rows["llm-2"].mem_requested_mb_s is None  # asked for nothing: unknown, not 0
    assert not WorkloadMeta.objects.filter(requests_changed=True).exists()
    read = hourly(start, start + timedelta(hours=1))
    assert requested(read) == {"bert-1": Decimal(8192 * 60), "llm-2": None}
    assert read == joined(start, start + timedelta(hours=1))


def test_a_changed_request_is_read_at_once_and_stored_again_by_the_next_rollup(post_batch, rate_card) -> None:
    start = base_hour()
    end = start + timedelta(hours=3)
    post_batch(batch(start, {"bert-1": (8192, 20), "llm-2": (1000, 5)}))
    post_batch(batch(start + timedelta(hours=1), {"bert-1": (8192, 20), "llm-2": (1000, 5)}))
    rollup_usage(now=clock.now())
    # A later batch says bert-1 asks for twice the memory now (an in-place resize).
    post_batch(batch(start + timedelta(hours=2), {"bert-1": (16384, 20), "llm-2": (1000, 5)}))
    assert list(WorkloadMeta.objects.filter(requests_changed=True).values_list("pod", flat=True)) == ["bert-1"]
    # Before any rollup: the stored figures are the old request's, the read is the new one's.
    assert {r.mem_requested_mb_s for r in UsageHour.objects.filter(pod="bert-1")} == {Decimal(8192 * 60)}
    assert requested(hourly(start, end)) == {"bert-1": Decimal(16384 * 120), "llm-2": Decimal(1000 * 120)}
    assert hourly(start, end) == joined(start, end)
    rollup_usage(now=clock.now())
    assert not WorkloadMeta.objects.filter(requests_changed=True).exists()
    assert {r.mem_requested_mb_s for r in UsageHour.objects.filter(pod="bert-1")} == {Decimal(16384 * 60)}
    assert requested(hourly(start, end)) == {"bert-1": Decimal(16384 * 180), "llm-2": Decimal(1000 * 180)}
    assert hourly(start, end) == joined(start, end)


def test_a_change_reaches_the_days_and_months_its_batch_does_not_touch(post_batch, rate_card) -> None:
    """A pod that ran before a month's end, its days closed into the month rows, then reports another
    request after it: the next rollup stores the new request's figures in the earlier day and month
    rows too, which no batch of that cycle touched."""
    edge = month_end()
    post_batch(batch(edge - timedelta(hours=1), {"bert-1": (8192, 20), "llm-2": (1000, 5)}, suffix="-edge"))
    rollup_usage(now=clock.now())
    close_days(now=clock.now())
    before = UsageMonth.objects.get(pod="bert-1-edge")
    assert before.mem_requested_mb_s == Decimal(8192 * 60)
    post_batch(batch(edge + timedelta(hours=1), {"bert-1": (16384, 20), "llm-2": (1000, 5)}, suffix="-edge"))
    rollup_usage(now=clock.now())
    assert UsageDay.objects.get(pod="bert-1-edge", day=edge - timedelta(days=1)).mem_requested_mb_s == Decimal(16384 * 60)
    assert UsageMonth.objects.get(pk=before.pk).mem_requested_mb_s == Decimal(16384 * 60)
    assert UsageMonth.objects.get(pod="llm-2-edge", month__lt=edge).mem_requested_mb_s == Decimal(1000 * 60)  # unchanged
    assert_rows_store_their_requests()


_REQUEST = st.one_of(st.none(), st.tuples(st.sampled_from([0, 1024, 8192, 40960]), st.sampled_from([5, 20, 54.5])))
_STEP = st.one_of(
    st.tuples(st.just("batch"), st.integers(0, 3), st.fixed_dictionaries(dict.fromkeys(PODS, _REQUEST))),
    st.just(("rollup",)),
    st.just(("close",)),
)


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(steps=st.lists(_STEP, min_size=1, max_size=6))
def test_reads_are_the_join_whatever_the_order(post_batch, rate_card, steps: list[tuple[Any, ...]]) -> None:
    """Batches (some late, into earlier hours) that change requests or stop reporting them, rollups
    and month closes between them, over four hours across a month's end: after every step, the
    hourly and daily reads are the join's, and every row not flagged stores its requests. Each
    example's pods and GPUs are its own."""
    suffix = f"-x{next(_example)}"
    start = month_end() - timedelta(hours=2)
    end = start + timedelta(hours=4)
    for minute, step in enumerate([*steps, ("rollup",)]):
        if step[0] == "batch":
            assert post_batch(batch(start + timedelta(hours=step[1], minutes=minute), step[2], suffix=suffix)).status_code == 201
        elif step[0] == "rollup":
            rollup_usage(now=clock.now())
        else:  # the days before today into the month rows
            close_days(now=clock.now())
        assert hourly(start, end) == joined(start, end)
        assert hourly(*days(start)) == joined(*days(start))
        assert_rows_store_their_requests()
    assert not WorkloadMeta.objects.filter(requests_changed=True).exists()  # the last rollup stored them all


def stored(row: UsageHour) -> tuple[Decimal | None, Decimal | None]:
    """The requested figures an hour row holds now."""
    fresh = UsageHour.objects.get(pk=row.pk)
    return fresh.mem_requested_mb_s, fresh.sm_requested_s


def test_rebuild_days_stores_the_figures_of_hours_written_by_hand(db, rate_card) -> None:
    """An hour row written other than by the rollup (a test's, the benchmark's COPY) has no figures
    until rebuild_days, which stores them from the metadata, as it derives the days."""
    node = Node.objects.create(name="hand-node")
    hour = base_hour()
    row = UsageHour.objects.create(
        hour=hour, gpu_uuid="GPU-hand", node=node, tenant="acme", namespace="ml", pod="bert", container="main",
        pod_uid="uid-bert", sla_tier="gold", seconds=Decimal(3600), mem_used_mb_s=0, mem_granted_mb_s=0,
        mem_billed_mb_s=0, sm_used_s=0, sm_granted_s=0, sm_billed_s=0, pcie_mb=0, share_gpu_s=0, charge=0, idle_share=0)
    WorkloadMeta.objects.create(node=node, namespace="ml", pod="bert", pod_uid="uid-bert", requests={"main": {"mem_mb": 2.5}},
                                first_seen=hour, last_seen=hour + timedelta(hours=1), requests_changed=False)
    assert stored(row) == (None, None)
    rebuild_days(start=hour.replace(hour=0), end=hour.replace(hour=0) + timedelta(days=1))
    assert stored(row) == (Decimal(9000), None)
    day = UsageDay.objects.get()
    assert (day.mem_requested_mb_s, day.sm_requested_s) == (Decimal(9000), None)  # the day's, from its hours
    WorkloadMeta.objects.all().delete()  # no metadata: unknown, as a join gives it
    rebuild_days(start=hour.replace(hour=0), end=hour.replace(hour=0) + timedelta(days=1))
    assert stored(row) == (None, None)


def test_the_migration_backfill_stores_what_the_rollup_stores(post_batch, rate_card) -> None:
    migration = importlib.import_module("billing.migrations.0051_requests_stored")
    start = base_hour()
    post_batch(batch(start, {"bert-1": (8192, 54.5), "llm-2": None}))
    rollup_usage(now=clock.now())
    stored = sorted(UsageHour.objects.values_list("pod", "mem_requested_mb_s", "sm_requested_s"))
    UsageHour.objects.update(mem_requested_mb_s=None, sm_requested_s=None)
    with connection.cursor() as cur:
        cur.execute(migration.backfill("billing_usagehour"))
    assert sorted(UsageHour.objects.values_list("pod", "mem_requested_mb_s", "sm_requested_s")) == stored
    assert stored[0][1:] == (Decimal(8192 * 60), Decimal("54.5") * 60)


def test_the_peak_hours_backfill_stores_what_the_rollup_stores(post_batch, rate_card) -> None:
    """Migration 0053 gives each day row the highest hourly means the rollup's day step derives."""
    migration = importlib.import_module("billing.migrations.0053_day_peak_hour_means")
    start = base_hour()
    for hour in range(3):
        post_batch(batch(start + timedelta(hours=hour), {"bert-1": (8192, 54.5), "llm-2": None}))
    rollup_usage(now=clock.now())
    columns = ("pod", "container", "peak_hour_mean_mb", "peak_hour_mean_sm")
    stored = sorted(UsageDay.objects.values_list(*columns))
    assert stored
    assert all(peak_mb is not None and peak_sm is not None for _p, _c, peak_mb, peak_sm in stored)
    UsageDay.objects.update(peak_hour_mean_mb=None, peak_hour_mean_sm=None)
    with connection.cursor() as cur:
        cur.execute(migration.BACKFILL)
    assert sorted(UsageDay.objects.values_list(*columns)) == stored
