"""Contract tests: every response code of wire protocol v1 (docs/protocol.md)."""

from __future__ import annotations

import copy
import json
import math
from datetime import timedelta

import pytest
from django.db import connection
from django.test import override_settings

from billing.api import agent as agent_api
from billing.ledger.models import UsageBatch
from billing.models import AuditEvent, Gpu
from billing.services.identity.tokens import issue_node_token, revoke_node_token
from tests import clock
from tests.conftest import iso, make_batch

pytestmark = pytest.mark.django_db


def raw_rows() -> int:
    with connection.cursor() as cur:
        cur.execute("SELECT count(*) FROM billing_raw_sample")
        return int(cur.fetchone()[0])


def test_valid_batch_is_stored_with_201_and_every_sample_lands_in_raw(post_batch, minute_start):
    resp = post_batch(make_batch(start=minute_start, seconds=10))
    assert resp.status_code == 201, resp.content
    assert resp.json() == {"status": "stored", "accepted": 10}
    assert raw_rows() == 10
    batch = UsageBatch.objects.get()
    assert (batch.batch_seq, batch.sample_count) == (1, 10)
    assert Gpu.objects.get().memory_mb == 81920


def test_gzip_body_is_accepted(post_batch, minute_start):
    resp = post_batch(make_batch(start=minute_start), gzip_body=True)
    assert resp.status_code == 201
    assert raw_rows() == 10


def test_same_batch_again_answers_200_duplicate_and_stores_nothing_more(post_batch, minute_start):
    payload = make_batch(start=minute_start)
    assert post_batch(payload).status_code == 201
    again = post_batch(payload)
    assert again.status_code == 200
    assert again.json() == {"status": "duplicate"}
    assert raw_rows() == 10
    assert UsageBatch.objects.count() == 1


def test_same_key_with_different_content_answers_409_and_keeps_the_first(post_batch, minute_start):
    payload = make_batch(start=minute_start)
    assert post_batch(payload).status_code == 201
    changed = copy.deepcopy(payload)
    changed["samples"][0]["mem_used_mb_s"] = 100.0
    resp = post_batch(changed)
    assert resp.status_code == 409
    assert "different content" in resp.json()["errors"][0]["message"]
    assert raw_rows() == 10


def _mutations(start):
    """(name, mutate(payload), expected error path prefix)."""

    def sample(field, value):
        def mutate(p):
            p["samples"][3][field] = value
        return mutate

    def set_key(path, value):
        def mutate(p):
            target = p
            for key in path[:-1]:
                target = target[key]
            target[path[-1]] = value
        return mutate

    def add_over_grant(p):
        # A second workload on the same GPU-second pushes Σ granted memory above 81920 MB.
        extra = dict(p["samples"][0], pod="big", pod_uid="uid-big", mem_granted_mb_s=81800.0, mem_used_mb_s=10.0)
        p["samples"].append(extra)

    return [
        ("negative quantity", sample("mem_used_mb_s", -1.0), "$.samples[3].mem_used_mb_s"),
        ("nan quantity", sample("sm_used_s", math.nan), "$.samples[3].sm_used_s"),
        ("infinite quantity", sample("pcie_mb", math.inf), "$.samples[3].pcie_mb"),
        ("integer beyond float range", sample("pcie_mb", 10**400), "$.samples[3].pcie_mb"),
        ("boolean quantity", sample("sm_used_s", True), "$.samples[3].sm_used_s"),
        ("used above capacity", sample("mem_used_mb_s", 81921.0), "$.samples[3]"),
        ("granted SM above capacity", sample("sm_granted_s", 108.5), "$.samples[3]"),
        ("sum of grants above capacity", add_over_grant, "$.samples"),
        ("sample outside window", sample("start", iso(start + timedelta(seconds=30))), "$.samples[3]"),
        ("unknown gpu", sample("gpu", "GPU-nope"), "$.samples[3].gpu"),
        ("bad timestamp", sample("start", "yesterday"), "$.samples[3].start"),
        ("zero seconds", sample("seconds", 0), "$.samples[3].seconds"),
        ("bad tenant name", sample("tenant", "acme corp\t"), "$.samples[3].tenant"),
        ("wrong schema", set_key(["schema"], "v0"), "$.schema"),
        ("window end before start", set_key(["window", "end"], iso(start - timedelta(seconds=1))), "$.window"),
        ("window in the future", set_key(["window", "end"], iso(clock.now() + timedelta(hours=1))), "$.window.end"),
        ("batch_seq not an integer", set_key(["batch_seq"], "7"), "$.batch_seq"),
        ("no gpus", set_key(["gpus"], []), "$.gpus"),
        ("gpu without memory", set_key(["gpus", 0, "memory_mb"], 0), "$.gpus[0].memory_mb"),
    ]


@pytest.mark.parametrize("index", range(19))
def test_invalid_batch_answers_400_with_a_path_and_stores_nothing(post_batch, minute_start, index):
    name, mutate, path = _mutations(minute_start)[index]
    payload = make_batch(start=minute_start)
    mutate(payload)
    resp = post_batch(payload)
    assert resp.status_code == 400, (name, resp.content)
    errors = resp.json()["errors"]
    assert any(e["path"].startswith(path) for e in errors), (name, errors)
    assert raw_rows() == 0
    assert UsageBatch.objects.count() == 0
    assert Gpu.objects.count() == 0


def test_overlapping_window_for_the_same_gpu_is_400_so_no_gpu_second_is_metered_twice(post_batch, minute_start):
    assert post_batch(make_batch(start=minute_start, seq=1)).status_code == 201
    resp = post_batch(make_batch(start=minute_start + timedelta(seconds=5), seq=2))
    assert resp.status_code == 400
    assert resp.json()["errors"][0]["path"] == "$.window"
    assert raw_rows() == 10


def test_sample_crossing_a_minute_is_split_pro_rata_and_keeps_its_integrals(post_batch, minute_start):
    start = minute_start + timedelta(seconds=50)
    payload = make_batch(start=start, seconds=20)
    payload["samples"] = [dict(payload["samples"][0], start=iso(start), seconds=20, mem_used_mb_s=2000.0,
                               mem_granted_mb_s=4000.0, sm_used_s=20.0, sm_granted_s=40.0, pcie_mb=10.0)]
    assert post_batch(payload).status_code == 201
    with connection.cursor() as cur:
        cur.execute("SELECT start, seconds, mem_used_mb_s FROM billing_raw_sample ORDER BY start")
        rows = cur.fetchall()
    assert [(r[1], r[2]) for r in rows] == [(10.0, 1000.0), (10.0, 1000.0)]


def test_missing_token_is_401_with_www_authenticate(post_batch, minute_start):
    resp = post_batch(make_batch(start=minute_start), token="")
    assert resp.status_code == 401
    assert resp["WWW-Authenticate"].startswith("Bearer")


def test_unknown_token_is_401(post_batch, minute_start):
    assert post_batch(make_batch(start=minute_start), token="vgl_not-a-token").status_code == 401


def test_revoked_token_is_403_and_the_revocation_is_audited(post_batch, node_token, minute_start):
    revoke_node_token(token_id=node_token.token_id, now=clock.now(), actor_label="test")
    resp = post_batch(make_batch(start=minute_start))
    assert resp.status_code == 403
    assert "revoked" in resp.json()["errors"][0]["message"]
    assert AuditEvent.objects.filter(action="node_token.revoked").count() == 1


def test_token_of_another_node_is_403(post_batch, minute_start):
    other = issue_node_token(node_name="gpu-node-2", now=clock.now(), actor_label="test")
    resp = post_batch(make_batch(start=minute_start, node="gpu-node-1"), token=other.token)
    assert resp.status_code == 403
    assert raw_rows() == 0


@override_settings(VGPU_INGEST_MAX_BODY_BYTES=1000)
def test_body_above_the_limit_is_413(post_batch, minute_start):
    resp = post_batch(make_batch(start=minute_start))
    assert resp.status_code == 413


@override_settings(VGPU_INGEST_MAX_JSON_BYTES=1000)
def test_gzip_bomb_is_413_after_bounded_decompression(post_batch, minute_start):
    resp = post_batch(make_batch(start=minute_start), gzip_body=True)
    assert resp.status_code == 413


def test_non_json_content_type_is_415(post_batch, minute_start):
    resp = post_batch(make_batch(start=minute_start), content_type="text/plain")
    assert resp.status_code == 415


def test_malformed_json_body_is_415(post_batch):
    assert post_batch(None, raw=b"{not json").status_code == 415


def test_ingest_at_capacity_sheds_with_429_and_retry_after(post_batch, minute_start, monkeypatch):
    import threading

    monkeypatch.setattr(agent_api, "_in_flight", threading.BoundedSemaphore(1))
    agent_api._in_flight.acquire()
    try:
        resp = post_batch(make_batch(start=minute_start))
    finally:
        agent_api._in_flight.release()
    assert resp.status_code == 429
    assert int(resp["Retry-After"]) > 0
    assert raw_rows() == 0


def test_create_node_token_prints_only_the_token_and_stores_its_hash(db):
    from io import StringIO

    from django.core.management import call_command

    from billing.models import NodeToken

    out = StringIO()
    call_command("create_node_token", "gpu-node-9", stdout=out)
    token = out.getvalue().strip()
    assert token.startswith("vgl_")
    assert "\n" not in token
    row = NodeToken.objects.get(node__name="gpu-node-9")
    assert token not in json.dumps([row.token_sha256, row.prefix]) or row.prefix == token[:12]
    assert row.token_sha256 != token
    assert len(row.token_sha256) == 64


def test_create_node_token_issues_one_token_a_line_for_several_nodes_or_none(db):
    from io import StringIO

    from django.core.management import CommandError, call_command

    from billing.models import NodeToken
    from billing.services.identity.tokens import token_sha256

    out = StringIO()
    call_command("create_node_token", "gpu-node-9", "gpu-node-10", stdout=out)
    tokens = out.getvalue().split()
    assert len(tokens) == 2
    assert [NodeToken.objects.get(token_sha256=token_sha256(t)).node.name for t in tokens] == ["gpu-node-9", "gpu-node-10"]
    # A refused name issues nothing, not even for the names before it.
    with pytest.raises(CommandError):
        call_command("create_node_token", "gpu-node-11", "Not A Node Name!", stdout=StringIO())
    assert not NodeToken.objects.filter(node__name="gpu-node-11").exists()


def test_policy_endpoint_answers_with_etag_and_304_when_unchanged(client, node_token):
    auth = {"HTTP_AUTHORIZATION": f"Bearer {node_token.token}"}
    first = client.get("/api/v1/nodes/gpu-node-1/policy", **auth)
    assert first.status_code == 200
    assert first.json()["schema"] == "vgpu-ledger/node-policy/v1"
    again = client.get("/api/v1/nodes/gpu-node-1/policy", HTTP_IF_NONE_MATCH=first["ETag"], **auth)
    assert again.status_code == 304
    assert client.get("/api/v1/nodes/other/policy", **auth).status_code == 403


def test_node_events_land_in_the_audit_log_all_or_nothing(client, node_token):
    auth = {"HTTP_AUTHORIZATION": f"Bearer {node_token.token}"}
    ok = {"events": [{"at": iso(clock.now()), "action": "watchdog.evicted", "target": "acme-prod/bert-1",
                      "detail": {"mem_mb": 512}}]}
    resp = client.post("/api/v1/nodes/gpu-node-1/events", json.dumps(ok), content_type="application/json", **auth)
    assert resp.status_code == 201
    bad = {"events": [ok["events"][0], {"at": "never", "action": "x", "target": "y"}]}
    resp = client.post("/api/v1/nodes/gpu-node-1/events", json.dumps(bad), content_type="application/json", **auth)
    assert resp.status_code == 400
    assert AuditEvent.objects.filter(actor_label="node:gpu-node-1").count() == 1


def test_gpu_inventory_and_node_liveness_are_written_at_most_once_a_minute(
    post_batch, minute_start, django_capture_on_commit_callbacks
):
    from billing.models import Node

    with django_capture_on_commit_callbacks(execute=True):
        assert post_batch(make_batch(start=minute_start, seq=1)).status_code == 201
    first = Gpu.objects.get().last_seen_at
    assert Node.objects.get(name="gpu-node-1").last_seen_at == first
    with django_capture_on_commit_callbacks(execute=True):
        assert post_batch(make_batch(start=minute_start + timedelta(seconds=10), seq=2)).status_code == 201
    # Same GPUs within the minute: inventory untouched, yet the batch and its GPU rows are stored.
    assert Gpu.objects.get().last_seen_at == first
    assert UsageBatch.objects.count() == 2
    assert raw_rows() == 20


@override_settings(VGPU_LATE_USAGE_HORIZON=timedelta(days=1))
def test_usage_older_than_the_late_usage_horizon_is_400_and_stores_nothing(post_batch, minute_start):
    old = minute_start - timedelta(days=2)
    resp = post_batch(make_batch(start=old))
    assert resp.status_code == 400
    assert resp.json()["errors"][0]["path"] == "$.window.start"
    assert "horizon" in resp.json()["errors"][0]["message"]
    assert raw_rows() == 0
