"""Partition DDL and the lock order: ingest and the rollup wait for the partition lock before
their writing transaction holds any table lock (billing.ledger.partitions). Inside it, the wait
deadlocked with a concurrent day's CREATE TABLE, which needs the locks they held: on backfilled
history, where every batch brings a new day, uploads failed with 503s."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import psycopg2
import pytest
from django.conf import settings
from django.db import connection, connections, transaction
from django.test import Client

from billing.ledger import partitions
from billing.ledger.models import UsageBatch
from billing.ledger.rollup import rollup_usage
from tests import clock
from tests.conftest import make_batch


def _other_connection() -> Any:
    db = settings.DATABASES["default"]
    conn = psycopg2.connect(dbname=db["NAME"], user=db["USER"], password=db["PASSWORD"], host=db["HOST"],
                            port=db["PORT"])
    conn.autocommit = False
    return conn


def _waiting_for_the_partition_lock(watcher: Any, timeout_s: float = 60) -> int:
    """The backend that waits for the partition lock (the holder is another connection)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with watcher.cursor() as cur:
            cur.execute("SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND NOT granted AND classid = %s",
                        [partitions._PARTITION_LOCK_KEY])
            row = cur.fetchone()
        if row:
            return int(row[0])
        time.sleep(0.05)
    raise AssertionError("nothing waited for the partition lock")


def _table_locks(watcher: Any, pid: int) -> list[str]:
    with watcher.cursor() as cur:
        cur.execute("SELECT relation::regclass::text || ' ' || mode FROM pg_locks WHERE pid = %s "
                    "AND locktype = 'relation' AND granted AND relation::regclass::text LIKE 'billing%%' ORDER BY 1",
                    [pid])
        return [r[0] for r in cur.fetchall()]


def _held_while(work: Callable[[], object]) -> list[str]:
    """Run `work` in a thread of its own while another connection holds the partition lock; the
    billing tables the thread's backend holds locks on when it waits for that lock."""
    partitions._known.clear()  # each day is looked up, so the lock is asked for
    holder, watcher = _other_connection(), _other_connection()
    watcher.autocommit = True
    failures: list[BaseException] = []

    def run() -> None:
        try:
            work()
        except BaseException as exc:  # noqa: BLE001 - handed to the test's thread below
            failures.append(exc)
        finally:
            connections.close_all()

    thread = threading.Thread(target=run)
    try:
        with holder.cursor() as cur:
            for table in (partitions.RAW_TABLE, *partitions.MINUTE_TABLES):
                cur.execute("SELECT pg_advisory_xact_lock(%s, hashtext(%s))", [partitions._PARTITION_LOCK_KEY, table])
        thread.start()
        held = _table_locks(watcher, _waiting_for_the_partition_lock(watcher))
    finally:
        holder.rollback()  # the lock goes: the work goes on
        thread.join(timeout=120)
        holder.close()
        watcher.close()
    assert not failures, failures
    return held


@pytest.mark.django_db(transaction=True)
def test_ingest_and_rollup_wait_for_the_partition_lock_holding_no_table_lock(node_token, minute_start):
    body = json.dumps(make_batch(start=minute_start, seconds=30)).encode()

    def upload() -> None:
        resp = Client().generic("POST", "/api/v1/usage/batches", body, content_type="application/json",
                                HTTP_AUTHORIZATION=f"Bearer {node_token.token}")
        assert resp.status_code == 201, resp.content

    assert _held_while(upload) == []
    assert UsageBatch.objects.count() == 1

    assert _held_while(lambda: rollup_usage(now=clock.now())) == []
    assert UsageBatch.objects.filter(rolled_up_at__isnull=False).count() == 1
    with connection.cursor() as cur:
        cur.execute("SELECT count(*) FROM billing_usageminute WHERE node_id = %s",
                    [UsageBatch.objects.get().node_id])
        assert cur.fetchone()[0] >= 1


@pytest.mark.django_db(transaction=True)
def test_a_minute_day_is_created_while_raw_ddl_waits_for_a_reader_of_raw_samples():
    """The cycle one lock for every table allowed: a transaction that has read raw samples (as the
    rollup's recompute does) creates a minute day, while ingest, holding the partition lock, waits for
    that reader to let go of the raw default partition to create its raw day. With a lock per table
    the minute day does not wait for the raw DDL: both finish, no deadlock."""
    # (Under one lock for every table this test deadlocks: Postgres breaks it with an error in one of the two.)
    day = clock.now().date() + timedelta(days=400)  # days nothing else creates
    partitions._known.clear()
    watcher = _other_connection()
    watcher.autocommit = True
    failures: list[BaseException] = []

    def create_raw_day() -> None:
        try:
            partitions.ensure_raw_partitions([day])
        except BaseException as exc:  # noqa: BLE001 - handed to the test's thread below
            failures.append(exc)
        finally:
            connections.close_all()

    ingest = threading.Thread(target=create_raw_day)
    try:
        with transaction.atomic(), connection.cursor() as cur:
            # A read of raw samples: CREATE TABLE ... PARTITION OF waits for it (an exclusive lock on the parent).
            cur.execute(f"SELECT count(*) FROM {partitions.RAW_TABLE}")  # noqa: S608 - fixed name
            ingest.start()
            _waiting_for_a_table_lock(watcher)  # the raw day's CREATE TABLE waits for this reader
            # This reader now creates a minute day, as the rollup's recompute may: it must not wait
            # for the partition lock ingest holds.
            partitions.ensure_minute_partitions([day])
    finally:
        if ingest.is_alive() or failures:
            ingest.join(timeout=60)
        watcher.close()
    assert not failures, failures
    names = {p.day for t in (partitions.RAW_TABLE, *partitions.MINUTE_TABLES) for p in partitions.list_day_partitions(t)}
    assert day in names
    with connection.cursor() as cur:
        for table in (partitions.RAW_TABLE, *partitions.MINUTE_TABLES):
            cur.execute(f'DROP TABLE "{partitions.partition_name(day, table)}"')
    partitions._known.clear()


def _waiting_for_a_table_lock(watcher: Any, timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with watcher.cursor() as cur:
            cur.execute("SELECT 1 FROM pg_locks WHERE locktype = 'relation' AND NOT granted")
            if cur.fetchone():
                return
        time.sleep(0.05)
    raise AssertionError("the raw day's CREATE TABLE never waited")
