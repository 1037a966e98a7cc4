"""Real Celery worker on the real Redis broker: health reports it, tasks run twice safely."""

from __future__ import annotations

import pytest
from celery.contrib.testing.worker import start_worker

from billing import tasks
from billing.ledger.models import GpuMinute, UsageBatch
from config.celery import app as celery_app
from tests.conftest import healthz_as_admin, make_batch


@pytest.fixture
def celery_worker(transactional_db):
    # A real worker thread consuming from the real broker (REDIS_URL); results through Redis.
    with start_worker(celery_app, pool="solo", concurrency=1, perform_ping_check=False, shutdown_timeout=30) as worker:
        yield worker


def test_healthz_is_503_without_a_worker_and_names_what_is_down(client, db):
    resp = healthz_as_admin()
    body = resp.json()
    assert body["database"]["ok"]
    assert body["broker"]["ok"]
    assert resp.status_code == 503
    assert body["status"] == "degraded"
    assert "no Celery worker" in body["worker"]["error"]


def test_healthz_is_200_with_database_broker_and_worker_up(client, celery_worker):
    resp = healthz_as_admin()
    assert resp.status_code == 200, resp.json()
    body = resp.json()
    assert body["status"] == "ok"
    assert body["worker"]["workers"]


def rollup_cycle() -> list[dict]:
    """The beat's task through the worker: it fans out one task per shard; their results."""
    shard_ids = tasks.rollup_usage.delay().get(timeout=60)
    return [celery_app.AsyncResult(i).get(timeout=60) for i in shard_ids]


def test_rollup_task_through_a_real_worker_is_idempotent(post_batch, minute_start, celery_worker, settings):
    settings.VGPU_ROLLUP_SHARDS = 3
    assert post_batch(make_batch(start=minute_start)).status_code == 201
    first, second = rollup_cycle(), rollup_cycle()
    assert [r["shard"] for r in first] == [0, 1, 2]
    assert {r["shards"] for r in first} == {3}
    assert sum(r["batches"] for r in first) == 1
    assert sum(r["batches"] for r in second) == 0
    assert GpuMinute.objects.count() == 1
    assert UsageBatch.objects.filter(rolled_up_at__isnull=True).count() == 0


def test_partition_task_creates_days_ahead_and_is_idempotent(celery_worker):
    tasks.ensure_raw_partitions.delay().get(timeout=60)
    again = tasks.ensure_raw_partitions.delay().get(timeout=60)
    assert again == []
    from django.db import connection

    with connection.cursor() as cur:
        cur.execute("SELECT count(*) FROM pg_inherits i JOIN pg_class p ON p.oid = i.inhparent "
                    "WHERE p.relname = 'billing_raw_sample'")
        assert cur.fetchone()[0] >= 8
