"""Exactly-once ingest under concurrent uploads (real Postgres, real threads)."""

from __future__ import annotations

import json
import threading
from datetime import timedelta

import pytest
from django.db import connection, connections
from django.test import Client

from billing.models import UsageBatch
from tests.conftest import make_batch


def upload_concurrently(bodies: list[bytes], token: str) -> list[int]:
    """POST every body at the same instant, each from its own thread and connection."""
    barrier = threading.Barrier(len(bodies))
    codes: list[int] = []
    lock = threading.Lock()

    def upload(body: bytes) -> None:
        try:
            barrier.wait()
            resp = Client().generic("POST", "/api/v1/usage/batches", body, content_type="application/json",
                                    HTTP_AUTHORIZATION=f"Bearer {token}")
            with lock:
                codes.append(resp.status_code)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=upload, args=(b,)) for b in bodies]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return sorted(codes)


@pytest.mark.django_db(transaction=True)
def test_four_concurrent_uploads_of_one_batch_store_it_once(node_token, minute_start):
    body = json.dumps(make_batch(start=minute_start, seconds=30)).encode()
    assert upload_concurrently([body] * 4, node_token.token) == [200, 200, 200, 201]
    batch = UsageBatch.objects.get()
    with connection.cursor() as cur:
        # Raw samples are not a Django model, so transactional tests' flushes leave other
        # tests' rows behind: count this batch's rows.
        cur.execute("SELECT count(*) FROM billing_raw_sample WHERE batch_id = %s", [batch.pk])
        assert cur.fetchone()[0] == 30


@pytest.mark.django_db(transaction=True)
def test_two_concurrent_batches_covering_the_same_gpu_seconds_store_only_one(node_token, minute_start):
    bodies = [
        json.dumps(make_batch(start=minute_start, seq=1, seconds=20)).encode(),
        json.dumps(make_batch(start=minute_start + timedelta(seconds=10), seq=2, seconds=20)).encode(),
    ]
    assert upload_concurrently(bodies, node_token.token) == [201, 400]
    assert UsageBatch.objects.count() == 1
