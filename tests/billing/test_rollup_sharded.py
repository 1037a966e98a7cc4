"""The rollup sharded by node (docs/scaling.md): real worker processes in parallel write exactly the ledger
one worker writes, each batch once; a worker SIGKILLed mid-rollup leaves nothing half-applied and a
rerun completes it; rebuild_ledger runs safely among shard rollups; a GPU moved between nodes of
different shards gets one row per node; any partition of the work into shards, in any order, gives
the one-worker ledger (hypothesis); and the locks and settings say what they guard."""

from __future__ import annotations

import itertools
import json
import os
import signal
import subprocess
import sys
import time
import urllib.parse
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

import psycopg2
import pytest
from django.db import connection, transaction
from django.test import Client
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from billing.ledger import rollup as ledger_rollup
from billing.ledger.locks import LEDGER_LOCK_KEY
from billing.ledger.models import GpuDay, GpuHour, GpuMinute, UsageBatch, UsageDay, UsageHour, UsageMinute
from billing.ledger.rollup import rebuild_ledger, rollup_usage
from billing.models import Node, RateCard
from billing.services.fleet.gpu_ownership import reassign_gpu
from billing.services.identity.tokens import issue_node_token
from tests import clock
from tests.conftest import A100, make_batch

ROOT = Path(__file__).resolve().parents[2]
LEDGER = (UsageMinute, GpuMinute, UsageHour, GpuHour, UsageDay, GpuDay)
NODES = tuple(f"gpu-node-{i}" for i in range(1, 6))
WORKLOADS = [
    {"gpu": 0, "tenant": "acme", "pod": "bert-1", "mem_used": 8192.0, "mem_granted": 8192.0,
     "sm_used": 10.8, "sm_granted": 10.8, "pcie": 3.1},
    # Overcommits GPU 0 under `max` (used above granted): shares are scaled down pro rata.
    {"gpu": 0, "tenant": "globex", "pod": "llm-2", "sla_tier": "silver", "mem_used": 70000.0,
     "mem_granted": 60000.0, "sm_used": 90.0, "sm_granted": 80.0},
    {"gpu": 1, "tenant": "initech", "pod": "resnet-3", "mem_used": 1180.25, "mem_granted": 1500.0,
     "sm_used": 20.0, "sm_granted": 25.0, "pcie": 0.5},
]


@pytest.fixture
def rate_card(db) -> RateCard:
    return RateCard.objects.create(gpu_model=A100["model"], currency="USD", price_per_gpu_hour=Decimal("4.1"),
                                   effective_from=datetime(2020, 1, 1, tzinfo=UTC), source_url="https://example.org")


@pytest.fixture
def fleet(db) -> dict[str, str]:
    """Node name -> bearer token for every node of NODES."""
    return {name: issue_node_token(node_name=name, now=clock.now(), actor_label="test").token for name in NODES}


def post(client: Client, token: str, payload: dict[str, Any]) -> None:
    response = client.generic("POST", "/api/v1/usage/batches", json.dumps(payload).encode(),
                              content_type="application/json", HTTP_AUTHORIZATION=f"Bearer {token}")
    assert response.status_code == 201, response.content


def ingest_fleet(client: Client, fleet: dict[str, str], start: datetime) -> int:
    """Per node, 20-second batches over three minutes (two batches share each minute) on two GPUs,
    then a late batch for an earlier minute. Returns the number of batches."""
    count = 0
    for node, token in fleet.items():
        for seq in range(9):
            post(client, token, make_batch(node=node, seq=seq + 2, start=start + timedelta(seconds=20 * seq),
                                           seconds=20, gpus=2, workloads=WORKLOADS))
            count += 1
        post(client, token, make_batch(node=node, seq=100, start=start - timedelta(minutes=5), seconds=30, gpus=2,
                                       workloads=WORKLOADS))
        count += 1
    return count


def snapshot() -> dict[str, list[tuple[str, ...]]]:
    """Every row of the minute, hour and day ledgers (ids left out), sorted."""
    return {model.__name__: sorted(tuple(str(v) for k, v in sorted(row.items()) if k != "id")
                                   for row in model.objects.values()) for model in LEDGER}


Inbox = tuple[list[str], list[tuple[Any, ...]]]  # the raw table's columns and rows


def keep_inbox(batch_ids: list[int] | None = None) -> Inbox:
    """The integral rows of the batches (all when None): the rollup deletes them once it has added them
    into the minute store, so a test that rolls the same batches up again must give them back."""
    with connection.cursor() as cur:
        cur.execute("SELECT * FROM billing_raw_sample WHERE %(ids)s::bigint[] IS NULL OR batch_id = ANY(%(ids)s)",
                    {"ids": batch_ids})
        return [c.name for c in cur.description], cur.fetchall()


def reset_ledger(inbox: Inbox, batch_ids: list[int] | None = None, gpu_prefix: str = "") -> None:
    """Ledger rows removed, the batches' integral rows back in the inbox and the batches pending again,
    as before any rollup."""
    for model in LEDGER:
        model.objects.filter(gpu_uuid__startswith=gpu_prefix).delete()
    batches = UsageBatch.objects.all() if batch_ids is None else UsageBatch.objects.filter(pk__in=batch_ids)
    batches.update(rolled_up_at=None)
    columns, rows = inbox
    with connection.cursor() as cur:
        cur.execute("DELETE FROM billing_raw_sample WHERE batch_id = ANY(%s)", [list(batches.values_list("pk", flat=True))])
        cur.executemany(f"INSERT INTO billing_raw_sample ({', '.join(columns)}) "  # noqa: S608 - the table's own column names
                        f"VALUES ({', '.join(['%s'] * len(columns))})", rows)


def database_url() -> str:
    url = urllib.parse.urlsplit(os.environ["DATABASE_URL"])
    return urllib.parse.urlunsplit(url._replace(path=f"/{connection.settings_dict['NAME']}"))


def start_worker(shard: int, shards: int, *, app: str = "rollup-worker", **settings: str) -> subprocess.Popen[str]:
    env = dict(os.environ, DATABASE_URL=database_url(), DJANGO_SETTINGS_MODULE="config.settings",
               PGAPPNAME=app, PYTHONPATH=str(ROOT), **settings)
    return subprocess.Popen([sys.executable, "-m", "tests.billing.rollup_worker", str(shard), str(shards)],
                            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def finish(proc: subprocess.Popen[str]) -> dict[str, Any]:
    out, err = proc.communicate(timeout=180)
    assert proc.returncode == 0, err
    return dict(json.loads(out.strip().splitlines()[-1]))


def wait_for(condition: Callable[[], bool], what: str, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting until {what}"
        time.sleep(0.05)


def backends(app: str, *, waiting: bool = False) -> int:
    """Connections of `app` (PGAPPNAME), those waiting for a lock only if `waiting`."""
    with connection.cursor() as cur:
        cur.execute("SELECT pg_stat_clear_snapshot()")  # a transaction otherwise reads one cached snapshot
        cur.execute("SELECT count(*) FROM pg_stat_activity WHERE application_name = %s "
                    "AND (NOT %s OR wait_event_type = 'Lock')", [app, waiting])
        return int(cur.fetchone()[0])


# --------------------------------------------------------------------------------------------
# Real worker processes


@pytest.mark.django_db(transaction=True)
def test_parallel_worker_processes_write_exactly_the_ledger_of_one_worker_each_batch_once(client, fleet, rate_card):
    batches = ingest_fleet(client, fleet, clock.now().replace(second=0, microsecond=0) - timedelta(minutes=10))
    inbox = keep_inbox()
    one = finish(start_worker(0, 1))
    assert one["batches"] == batches
    expected = snapshot()
    assert len(expected["GpuMinute"]) == len(NODES) * 2 * 4  # 5 nodes x 2 GPUs x (3 minutes + the late one)
    reset_ledger(inbox)
    # Two shards of 2 and, as if N changed between the beat and the workers, shard 1 of 3 at once.
    workers = [start_worker(0, 2), start_worker(1, 2), start_worker(1, 3)]
    totals = [finish(w) for w in workers]
    assert sum(t["batches"] for t in totals) == batches  # every batch rolled up once, by one worker
    assert not UsageBatch.objects.filter(rolled_up_at__isnull=True).exists()
    assert snapshot() == expected


@pytest.mark.django_db(transaction=True)
def test_a_worker_killed_mid_rollup_leaves_nothing_half_applied_and_a_rerun_completes_the_ledger(
        client, fleet, rate_card):
    ingest_fleet(client, fleet, clock.now().replace(second=0, microsecond=0) - timedelta(minutes=10))
    inbox = keep_inbox()
    finish(start_worker(0, 1))
    expected = snapshot()
    reset_ledger(inbox)
    first, second = sorted(Node.objects.filter(name__in=NODES).values_list("pk", flat=True))[:2]
    with transaction.atomic(), connection.cursor() as cur:
        # The second node's batches are row-locked: its rollup blocks on marking them rolled up,
        # after writing its minutes, hours and days; the first node, in a transaction of its own
        # (one node per transaction here), has committed by then.
        cur.execute("SELECT id FROM billing_usagebatch WHERE node_id = %s FOR UPDATE", [second])
        worker = start_worker(0, 1, app="rollup-killed", VGPU_ROLLUP_NODES_PER_TRANSACTION="1")
        wait_for(lambda: backends("rollup-killed", waiting=True) == 1, "the worker waits inside its transaction")
        os.kill(worker.pid, signal.SIGKILL)
        worker.wait(timeout=30)
    # Its backend notices the lost client once the lock is free, and rolls the transaction back.
    wait_for(lambda: backends("rollup-killed") == 0, "the killed worker's backend is gone")
    assert not UsageBatch.objects.filter(node_id=first, rolled_up_at__isnull=True).exists()
    assert not UsageBatch.objects.filter(node_id=second, rolled_up_at__isnull=False).exists()
    for model in LEDGER:
        assert model.objects.filter(node_id=first).exists()
        assert not model.objects.filter(node_id=second).exists()
    finish(start_worker(0, 1))
    assert snapshot() == expected


@pytest.mark.django_db(transaction=True)
def test_rebuild_ledger_among_running_shard_workers_ends_with_the_one_worker_ledger(client, fleet, rate_card):
    start = clock.now().replace(second=0, microsecond=0) - timedelta(minutes=10)
    batches = ingest_fleet(client, fleet, start)
    inbox = keep_inbox()
    workers = [start_worker(0, 2), start_worker(1, 2)]
    rebuilds = 0
    while any(w.poll() is None for w in workers) or rebuilds < 3:
        rebuild_ledger(start=start - timedelta(hours=1), end=start + timedelta(hours=1))
        rebuilds += 1
    assert sum(finish(w)["batches"] for w in workers) == batches
    during = snapshot()
    reset_ledger(inbox)
    assert rollup_usage(now=clock.now()).batches == batches
    assert snapshot() == during


# --------------------------------------------------------------------------------------------
# Locks


@pytest.fixture
def other_connection(transactional_db) -> Iterator[Any]:
    conn = psycopg2.connect(database_url())
    try:
        yield conn
    finally:
        conn.close()


@pytest.mark.django_db(transaction=True)
def test_a_node_another_worker_holds_is_skipped_and_the_others_are_rolled(client, fleet, rate_card, other_connection):
    ingest_fleet(client, fleet, clock.now().replace(second=0, microsecond=0) - timedelta(minutes=10))
    held = Node.objects.get(name=NODES[0]).pk
    with other_connection.cursor() as cur:
        cur.execute("BEGIN; SELECT pg_advisory_xact_lock(%s, %s)", [ledger_rollup._NODE_LOCK_CLASS, held])
    result = rollup_usage(now=clock.now())
    assert result.skipped
    assert result.nodes == len(NODES) - 1
    assert set(UsageBatch.objects.filter(rolled_up_at__isnull=True).values_list("node_id", flat=True)) == {held}
    other_connection.rollback()
    again = rollup_usage(now=clock.now())
    assert (again.skipped, again.nodes, again.batches) == (False, 1, 10)


@pytest.mark.django_db(transaction=True)
def test_no_rollup_runs_while_the_ledger_is_locked_for_re_pricing(client, fleet, rate_card, other_connection):
    ingest_fleet(client, fleet, clock.now().replace(second=0, microsecond=0) - timedelta(minutes=10))
    with other_connection.cursor() as cur:
        cur.execute("BEGIN; SELECT pg_advisory_xact_lock(%s)", [LEDGER_LOCK_KEY])  # lock_ledger()
    result = rollup_usage(now=clock.now())
    assert result.skipped
    assert result.batches == 0
    assert not GpuMinute.objects.exists()
    other_connection.rollback()
    assert rollup_usage(now=clock.now()).batches == 10 * len(NODES)


# --------------------------------------------------------------------------------------------
# The node is in the key


def moved_gpu_batches(client: Client, fleet: dict[str, str], *, at: datetime, handover: timedelta) -> tuple[int, int]:
    """GPU-moving metered by node 1 for `handover`, reassigned, then by node 2 up to the next whole
    minute. Returns the two node ids, which lie in different shards of 2."""
    first, second = Node.objects.get(name=NODES[0]).pk, Node.objects.get(name=NODES[1]).pk
    assert first % 2 != second % 2
    workload = [{"gpu": 0, "tenant": "acme", "pod": "bert-1", "mem_used": 40960.0, "mem_granted": 40960.0,
                 "sm_used": 54.0, "sm_granted": 54.0}]
    for node, start, seconds in ((NODES[0], at, handover.seconds), (NODES[1], at + handover, 60 - handover.seconds)):
        payload = make_batch(node=node, seq=1, start=start, seconds=seconds, workloads=workload)
        payload["gpus"][0]["uuid"] = "GPU-moving"
        for s in payload["samples"]:
            s["gpu"] = "GPU-moving"
        if node == NODES[1]:
            reassign_gpu(uuid="GPU-moving", to_node=node, reason="moved racks", now=clock.now(), actor_label="test")
        post(client, fleet[node], payload)
    return first, second


@pytest.fixture
def handed_over_in_one_hour(client, fleet, rate_card) -> tuple[int, int, datetime]:
    at = clock.now().replace(minute=0, second=0, microsecond=0) - timedelta(hours=2)
    first, second = Node.objects.get(name=NODES[0]).pk, Node.objects.get(name=NODES[1]).pk
    workload = [{"gpu": 0, "tenant": "acme", "pod": "bert-1", "mem_used": 40960.0, "mem_granted": 40960.0,
                 "sm_used": 54.0, "sm_granted": 54.0}]
    # Node 1 meters minutes 10 and 11 (second half), node 2 minute 11 (first half) to minute 13.
    spans = ((NODES[0], at + timedelta(minutes=10), 60), (NODES[0], at + timedelta(minutes=11, seconds=30), 30),
             (NODES[1], at + timedelta(minutes=12), 90))
    for seq, (node, start, seconds) in enumerate(spans, start=1):
        payload = make_batch(node=node, seq=seq, start=start, seconds=seconds, workloads=workload)
        payload["gpus"][0]["uuid"] = "GPU-moving"
        for s in payload["samples"]:
            s["gpu"] = "GPU-moving"
        if node == NODES[1]:
            reassign_gpu(uuid="GPU-moving", to_node=node, reason="moved racks", now=clock.now(), actor_label="test")
        post(client, fleet[node], payload)
    return first, second, at


@pytest.mark.django_db
def test_a_gpu_moved_inside_an_hour_between_shards_is_billed_per_node_on_its_own_seconds(handed_over_in_one_hour):
    first, second, hour = handed_over_in_one_hour
    assert first % 2 != second % 2  # node ids 1 and 2 of a fresh sequence: different shards of 2
    for shard in (second % 2, first % 2):  # the new owner's shard rolls first
        assert rollup_usage(now=clock.now(), shard=shard, shards=2).nodes == 1
    hours = {h.node_id: h for h in GpuHour.objects.filter(gpu_uuid="GPU-moving")}
    assert {n: h.metered_seconds for n, h in hours.items()} == {first: 90, second: 90}
    assert {n: h.card_cost for n, h in hours.items()} == {first: Decimal("4.1") * 90 / 3600,
                                                          second: Decimal("4.1") * 90 / 3600}
    assert all(h.hour == hour for h in hours.values())
    usage = {u.node_id: u.seconds for u in UsageHour.objects.filter(gpu_uuid="GPU-moving")}
    assert usage == {first: 90, second: 90}
    days = {d.node_id: d.metered_seconds for d in GpuDay.objects.filter(gpu_uuid="GPU-moving")}
    assert days == {first: 90, second: 90}
    assert {(m.node_id, m.minute - hour) for m in GpuMinute.objects.filter(gpu_uuid="GPU-moving")} == {
        (first, timedelta(minutes=10)), (first, timedelta(minutes=11)), (second, timedelta(minutes=12)),
        (second, timedelta(minutes=13))}


@pytest.mark.django_db
def test_a_gpu_moved_inside_a_minute_has_a_minute_row_per_node(client, fleet, rate_card):
    at = clock.now().replace(minute=0, second=0, microsecond=0) - timedelta(hours=2)
    first, second = moved_gpu_batches(client, fleet, at=at, handover=timedelta(seconds=20))
    for shard in (0, 1):
        rollup_usage(now=clock.now(), shard=shard, shards=2)
    minutes = {m.node_id: m.metered_seconds for m in GpuMinute.objects.filter(gpu_uuid="GPU-moving")}
    assert minutes == {first: 20, second: 40}


# --------------------------------------------------------------------------------------------
# Any partition of the work into shards, in any order


_seq = itertools.count(1000)
_example = itertools.count()
# A batch: node (0-3), minute slot (0-4), 10-second block (0-5), 1-10 s, workloads on 2 GPUs.
_workload = st.fixed_dictionaries({
    "gpu": st.integers(0, 1), "pod": st.sampled_from(("bert-1", "llm-2", "resnet-3")),
    "mem_used": st.integers(0, 27000).map(float), "mem_granted": st.integers(0, 27000).map(lambda v: v + 0.25),
    "sm_used": st.integers(0, 36).map(float), "sm_granted": st.integers(0, 36).map(float),
})
_batch = st.tuples(st.integers(0, 3), st.integers(0, 4), st.integers(0, 5), st.integers(1, 10),
                   st.lists(_workload, max_size=3, unique_by=lambda w: w["pod"]))
# After how many stored batches a rollup runs, and which shards of how many it runs.
_step = st.tuples(st.integers(0, 12), st.integers(1, 4), st.lists(st.integers(0, 3), min_size=1, max_size=4))


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                 HealthCheck.too_slow])
@given(batches=st.lists(_batch, min_size=1, max_size=12, unique_by=lambda b: b[:3]),
       steps=st.lists(_step, max_size=6), final_shards=st.integers(1, 4))
@pytest.mark.django_db
def test_any_partition_and_order_of_shards_gives_the_one_worker_ledger(client, fleet, rate_card, batches, steps,
                                                                       final_shards):
    # Examples share the database: each meters GPUs of its own and compares only their rows.
    prefix = f"GPU-s{next(_example)}-"
    base = clock.now().replace(second=0, microsecond=0) - timedelta(hours=1)
    ids, rolled, rows = [], 0, []
    for i, (node, minute, block, seconds, workloads) in enumerate(batches):
        name = NODES[node]
        payload = make_batch(node=name, seq=next(_seq), start=base + timedelta(minutes=minute, seconds=10 * block),
                             seconds=seconds, gpus=2, workloads=[{**w, "tenant": "acme"} for w in workloads])
        for g in payload["gpus"]:
            g["uuid"] = g["uuid"].replace(f"GPU-{name}-", prefix + f"{node}-")
        for s in payload["samples"]:
            s["gpu"] = s["gpu"].replace(f"GPU-{name}-", prefix + f"{node}-")
        post(client, fleet[name], payload)
        ids.append(UsageBatch.objects.latest("pk").pk)
        columns, kept = keep_inbox(ids[-1:])
        rows.extend(kept)
        for after, shards, chosen in steps:
            if after == i:
                for shard in chosen:
                    rolled += rollup_usage(now=clock.now(), shard=shard % shards, shards=shards).batches
    rolled += sum(rollup_usage(now=clock.now(), shard=k, shards=final_shards).batches for k in range(final_shards))
    assert rolled == len(ids)  # each batch once
    assert not UsageBatch.objects.filter(pk__in=ids, rolled_up_at__isnull=True).exists()
    sharded = snapshot_of(prefix)
    reset_ledger((columns, rows), ids, gpu_prefix=prefix)
    assert rollup_usage(now=clock.now()).batches == len(ids)
    assert snapshot_of(prefix) == sharded


def snapshot_of(prefix: str) -> dict[str, list[tuple[str, ...]]]:
    return {model.__name__: sorted(tuple(str(v) for k, v in sorted(row.items()) if k != "id")
                                   for row in model.objects.filter(gpu_uuid__startswith=prefix).values())
            for model in LEDGER}


# --------------------------------------------------------------------------------------------
# Settings and arguments


@pytest.mark.parametrize("value", ["0", "-1", "two", "1025"])
def test_a_bad_shard_count_stops_the_service_at_startup_with_a_clear_error(value):
    env = dict(os.environ, VGPU_ROLLUP_SHARDS=value, DJANGO_SETTINGS_MODULE="config.settings", PYTHONPATH=str(ROOT))
    done = subprocess.run([sys.executable, "-c", "import django; django.setup()"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode != 0
    assert f"VGPU_ROLLUP_SHARDS must be a whole number from 1 to 1024, got {value!r}" in done.stderr


@pytest.mark.parametrize(("shard", "shards"), [(2, 2), (-1, 2), (0, 0)])
def test_a_shard_outside_its_count_is_refused(db, shard, shards):
    with pytest.raises(ValueError, match="shard must lie in"):
        rollup_usage(now=clock.now(), shard=shard, shards=shards)


# --------------------------------------------------------------------------------------------
# Exact sums


@pytest.mark.django_db
def test_minute_sums_equal_the_exact_numeric_sums_of_the_raw_samples_whatever_the_values(
        post_batch, minute_start, rate_card):
    # Quantized agent values (multiples of 2^-10), values no agent sends (0.1, 1/3) and 60-second
    # samples whose integrals pass 10^5: the rollup's float fast path must not change any sum, and
    # keeps digits past numeric's 15-digit cast of a float (4,000,000.0009765625 stays whole).
    workloads = [
        {"gpu": 0, "tenant": "acme", "pod": "bert-1", "mem_used": 312.5, "mem_granted": 512.0009765625,
         "sm_used": 7.8, "sm_granted": 13.5, "pcie": 0.1},
        {"gpu": 0, "tenant": "globex", "pod": "llm-2", "mem_used": 1 / 3, "mem_granted": 1000.0,
         "sm_used": 1.0009765625, "sm_granted": 2.0, "pcie": 3.0},
    ]
    assert post_batch(make_batch(start=minute_start, seconds=30, workloads=workloads)).status_code == 201
    long = make_batch(seq=2, start=minute_start + timedelta(minutes=1), seconds=1, workloads=workloads[:1])
    long["window"]["end"] = (minute_start + timedelta(minutes=2)).isoformat().replace("+00:00", "Z")
    long["samples"][0].update(seconds=60, mem_used_mb_s=4_000_000.0009765625, mem_granted_mb_s=4_915_200.0,
                              sm_used_s=6000.5, sm_granted_s=6480.0, pcie_mb=123_456.75)
    assert post_batch(long).status_code == 201, post_batch(long).content
    with connection.cursor() as cur:
        # A multiple of 2^-10 exactly (x * 1024 is a whole number the cast keeps), any other value as
        # numeric's cast has it: the float path is exact where the cast's 15 digits are not.
        def exact(x: str) -> str:
            return f"sum(CASE WHEN {x} * 1024 = trunc({x} * 1024) THEN ({x} * 1024)::numeric / 1024 ELSE {x}::numeric END)"
        cur.execute(
            f"SELECT date_trunc('minute', start), pod, {exact('seconds')}, {exact('mem_used_mb_s')}, "  # noqa: S608 - built from constant column names
            f"{exact('mem_granted_mb_s')}, {exact('coalesce(mem_billed_mb_s, greatest(mem_used_mb_s, mem_granted_mb_s))')}, "
            f"{exact('sm_used_s')}, {exact('sm_granted_s')}, {exact('pcie_mb')} "
            "FROM billing_raw_sample GROUP BY 1, 2")
        # Stored at the ledger's 10 places, as the rollup always stored them.
        expected = {(r[0], r[1]): tuple(v.quantize(Decimal("1e-10")) for v in r[2:]) for r in cur.fetchall()}
    rollup_usage(now=clock.now())
    rows = {(u.minute, u.pod): (u.seconds, u.mem_used_mb_s, u.mem_granted_mb_s, u.mem_max_mb_s, u.sm_used_s,
                                u.sm_granted_s, u.pcie_mb) for u in UsageMinute.objects.all()}
    assert len(rows) == 3
    assert rows == expected
