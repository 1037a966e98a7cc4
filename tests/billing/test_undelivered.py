"""POST /api/v1/nodes/{node}/undelivered: refused batches an agent keeps are recorded, shown per
node to admins and counted in /healthz, until a re-drive delivers them."""

from __future__ import annotations

import hashlib
import json
from datetime import timedelta
from typing import Any

import pytest

from billing.models import UndeliveredBatch
from billing.services.identity.tokens import issue_node_token
from tests import clock
from tests.conftest import healthz_as_admin, iso, make_batch, user_in


def _report(seq: int, *, start, sha: str = "0" * 64, status: int = 409, **extra: Any) -> dict[str, Any]:
    return {"batch_seq": seq, "window": {"start": iso(start), "end": iso(start + timedelta(seconds=10))},
            "samples": 10, "size_bytes": 2345, "status": status,
            "reason": '{"errors":[{"path":"$","message":"batch already stored with different content"}]}',
            "content_sha256": sha, "superseded_by": None, **extra}


def _post(client, token: str, payload: Any, node: str = "gpu-node-1"):
    return client.post(f"/api/v1/nodes/{node}/undelivered", json.dumps(payload), content_type="application/json",
                       HTTP_AUTHORIZATION=f"Bearer {token}")


def test_a_report_is_stored_and_sending_it_again_changes_nothing(client, node_token, minute_start):
    payload = {"batches": [_report(7, start=minute_start), _report(9, start=minute_start, status=400)]}
    first = _post(client, node_token.token, payload)
    assert (first.status_code, first.json()) == (201, {"status": "stored", "accepted": 2})
    assert _post(client, node_token.token, payload).status_code == 201
    rows = list(UndeliveredBatch.objects.order_by("batch_seq").values_list("batch_seq", "status_code", "size_bytes"))
    assert rows == [(7, 409, 2345), (9, 400, 2345)]


def test_a_later_report_of_the_same_batch_replaces_the_earlier_one(client, node_token, minute_start):
    _post(client, node_token.token, {"batches": [_report(7, start=minute_start)]})
    _post(client, node_token.token, {"batches": [_report(7, start=minute_start, superseded_by=8)]})
    (row,) = UndeliveredBatch.objects.all()
    assert row.superseded_by == 8
    assert row.first_reported_at <= row.last_reported_at


@pytest.mark.parametrize(
    ("change", "path"),
    [
        ({"batch_seq": -1}, "$.batches[1].batch_seq"),
        ({"batch_seq": 2**63}, "$.batches[1].batch_seq"),
        ({"batch_seq": True}, "$.batches[1].batch_seq"),
        ({"window": {"start": "2026-11-30T03:00:10Z", "end": "2026-11-30T03:00:00Z"}}, "$.batches[1].window"),
        ({"window": {"start": "yesterday", "end": "2026-11-30T03:00:00Z"}}, "$.batches[1].window.start"),
        ({"samples": -3}, "$.batches[1].samples"),
        ({"size_bytes": "big"}, "$.batches[1].size_bytes"),
        ({"status": 201}, "$.batches[1].status"),
        ({"reason": "x" * 4097}, "$.batches[1].reason"),
        ({"content_sha256": "ABC"}, "$.batches[1].content_sha256"),
        ({"superseded_by": 3}, "$.batches[1].superseded_by"),
        ({"batch_seq": 1}, "$.batches[1].batch_seq"),  # reported twice in one request
    ],
)
def test_one_invalid_report_is_a_precise_400_and_stores_nothing(client, node_token, minute_start, change, path):
    payload = {"batches": [_report(1, start=minute_start), {**_report(3, start=minute_start), **change}]}
    resp = _post(client, node_token.token, payload)
    assert resp.status_code == 400
    assert path in [e["path"] for e in resp.json()["errors"]], resp.json()
    assert not UndeliveredBatch.objects.exists()


@pytest.mark.parametrize("body", [{}, {"batches": []}, {"batches": [{}] * 101}, [1]])
def test_a_body_without_1_to_100_reports_is_a_400(client, node_token, body):
    resp = _post(client, node_token.token, body)
    assert resp.status_code == 400
    assert resp.json()["errors"][0]["path"] == "$.batches"


def test_only_the_nodes_own_token_may_report(client, node_token, minute_start, db):
    payload = {"batches": [_report(1, start=minute_start)]}
    other = issue_node_token(node_name="gpu-node-2", now=clock.now(), actor_label="test")
    assert _post(client, other.token, payload).status_code == 403
    assert _post(client, "nope", payload).status_code == 401
    resp = client.post("/api/v1/nodes/gpu-node-1/undelivered", "not json", content_type="text/plain",
                       HTTP_AUTHORIZATION=f"Bearer {node_token.token}")
    assert resp.status_code == 415
    assert not UndeliveredBatch.objects.exists()


def test_a_report_is_open_until_a_redrive_delivers_it_and_healthz_counts_it(client, node_token, post_batch,
                                                                             minute_start):
    """Same bytes under the same batch_seq resolve it; so does a delivered batch it was renumbered to."""
    resent = make_batch(seq=11, start=minute_start)
    body = json.dumps(resent).encode()
    payload = {"batches": [
        _report(11, start=minute_start, sha=hashlib.sha256(body).hexdigest(), status=400),
        _report(12, start=minute_start + timedelta(seconds=10), superseded_by=13),
    ]}
    assert _post(client, node_token.token, payload).status_code == 201
    assert healthz_as_admin().json()["ledger"]["undelivered_batches"] == 2
    assert post_batch(None, raw=body).status_code == 201  # the re-drive of 11, byte for byte
    assert healthz_as_admin().json()["ledger"]["undelivered_batches"] == 1
    assert post_batch(make_batch(seq=13, start=minute_start + timedelta(seconds=10))).status_code == 201
    assert healthz_as_admin().json()["ledger"]["undelivered_batches"] == 0


def test_a_409_report_is_not_resolved_by_the_other_batch_holding_its_number(client, node_token, post_batch,
                                                                            minute_start):
    assert post_batch(make_batch(seq=21, start=minute_start)).status_code == 201
    _post(client, node_token.token, {"batches": [_report(21, start=minute_start + timedelta(seconds=10))]})
    assert healthz_as_admin().json()["ledger"]["undelivered_batches"] == 1


def test_admins_see_each_nodes_undelivered_batches_with_reason_and_size(client, node_token, minute_start):
    _post(client, node_token.token, {"batches": [_report(31, start=minute_start)]})
    client.force_login(user_in("platform-admin"))
    html = client.get("/nodes/").content.decode()
    assert 'data-testid="node-undelivered-gpu-node-1" data-count="1"' in html
    assert 'data-testid="undelivered-gpu-node-1-31"' in html
    assert "2.3\xa0KB" in html
    assert "409" in html
    assert "already stored with different content" in html
    assert "vgpu-agent redrive" in html
