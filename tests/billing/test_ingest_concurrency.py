"""Exactly-once ingest under concurrent uploads (real Postgres, real threads)."""

from __future__ import annotations

import json
import threading
from datetime import timedelta

import pytest
from django.db import connection, connections
from django.test import Client

from billing.ledger.models import UsageBatch
from tests.conftest import make_batch


def upload_concurrently(bodies: list[bytes], token: str | list[str]) -> list[int]:
    """POST every body at the same instant, each from its own thread and connection (with one
    token for all, or one each)."""
    tokens = token if isinstance(token, list) else [token] * len(bodies)
    barrier = threading.Barrier(len(bodies))
    codes: list[int] = []
    lock = threading.Lock()

    def upload(body: bytes, bearer: str) -> None:
        try:
            barrier.wait()
            resp = Client().generic("POST", "/api/v1/usage/batches", body, content_type="application/json",
                                    HTTP_AUTHORIZATION=f"Bearer {bearer}")
            with lock:
                codes.append(resp.status_code)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=upload, args=(b, t)) for b, t in zip(bodies, tokens, strict=True)]
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


@pytest.mark.django_db(transaction=True)
def test_two_nodes_claiming_one_new_gpu_at_once_leave_it_to_exactly_one(node_token, minute_start):
    from billing.models import Gpu
    from billing.services.identity.tokens import issue_node_token
    from tests import clock

    other = issue_node_token(node_name="gpu-node-2", now=clock.now(), actor_label="test")
    mine = make_batch(start=minute_start, seq=1)
    theirs = dict(make_batch(start=minute_start + timedelta(seconds=10), seq=1), node="gpu-node-2")
    theirs["gpus"] = mine["gpus"]  # the same new GPU, declared by both nodes at the same instant
    theirs["samples"] = [dict(s, gpu=mine["gpus"][0]["uuid"]) for s in theirs["samples"]]
    codes = upload_concurrently([json.dumps(mine).encode(), json.dumps(theirs).encode()],
                                [node_token.token, other.token])
    assert codes == [201, 403]
    owner = Gpu.objects.select_related("node").get().node.name
    assert [b.node.name for b in UsageBatch.objects.select_related("node")] == [owner]
