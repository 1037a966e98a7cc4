"""Hostile credentials at the paths OpenCost's clients use (docs/allocation-api.md, "Connecting
kubectl-cost and the OpenCost UI"), on a live server with ServiceAccount tokens accepted: every one
is a 401 in OpenCost's error shape, never a 5xx, and none reaches the Kubernetes API server."""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from typing import Any

import pytest
import requests

from agents.fakes.kube import FakeKubernetes
from billing.api import kube_auth


def _jwt(claims: object) -> str:
    body = base64.urlsafe_b64encode(json.dumps(claims).encode()).decode().rstrip("=")
    return f"eyJhbGciOiJSUzI1NiJ9.{body}.c2ln"


HOSTILE = [
    "Bearer ..",
    "Bearer a.b.c",
    "Bearer " + "A" * 20000 + ".B.C",
    "Bearer " + _jwt([1, 2]),
    "Bearer " + _jwt({"aud": {"x": 1}}),
    "Bearer " + _jwt({"aud": "vgpu-ledger-opencost", "exp": 10**30}),
    "Bearer " + _jwt({"aud": ["vgpu-ledger-opencost"], "exp": 1}),
    "Bearer " + _jwt({"aud": ["vgpu-ledger-opencost"], "exp": True}),
    "Bearer " + _jwt({"aud": ["vgpu-ledger"]}),
    "Bearer \u00e9.\u00e9.\u00e9",
    "bearer vgla_not-a-token",
    "Basic dXNlcjpwYXNz",
]


@pytest.fixture
def kube(settings: Any) -> Iterator[FakeKubernetes]:
    kube_auth.clear_client_review_cache()
    with FakeKubernetes() as fake:
        settings.VGPU_KUBE_API = fake.url
        settings.VGPU_KUBE_CLIENTS = "opencost:opencost-gateway=opencost-reader"
        yield fake
    kube_auth.clear_client_review_cache()


@pytest.mark.parametrize("path", ["/allocation/compute", "/api/v1/allocation"])
def test_hostile_bearer_tokens_are_401s_in_opencosts_shape(live_server: Any, kube: FakeKubernetes,
                                                           transactional_db: None, path: str) -> None:
    for header in HOSTILE:
        answer = requests.get(f"{live_server.url}{path}", params={"window": "1d"},
                              headers={"Authorization": header.encode("utf-8")}, timeout=30)
        assert answer.status_code == 401, (header[:60], answer.status_code, answer.text[:300])
        assert answer.json()["code"] == 401
    # Each is refused on its own claims: not one costs a TokenReview.
    assert sum(r.path.endswith("/tokenreviews") for r in kube.requests) == 0
