"""Hostile values at the OpenCost-compatible endpoints (docs/allocation-api.md) over real HTTP: every
duration, step, offset, window and filter is bounded where it is parsed, so each answers 200 or an
OpenCost-shaped 400, never a 5xx (`step=999999w` once overflowed date arithmetic: a 500)."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
import requests

from billing.scope import FINANCE_GROUP
from billing.services.identity.api_tokens import issue_api_token
from tests.conftest import user_in

pytestmark = pytest.mark.django_db(transaction=True)

PATHS = ("/allocation/compute", "/allocation/summary", "/model/allocation", "/allocation/autocomplete", "/assets")
HOSTILE = [
    {"window": "month", "step": "999999w"}, {"window": "month", "step": "9" * 400 + "h"},
    {"window": "999999w"}, {"window": "7d offset 999999w"}, {"window": "7d offset 7d offset 7d"},
    {"window": "1-999999999999"}, {"window": "0001-01-01,9999-12-31"}, {"window": "9999-12-31,9999-12-31"},
    {"window": "7d", "accumulate": "week" * 1000}, {"window": "7d", "filter": "(" * 5000},
    {"window": "7d", "filter": 'pod:"' + "a" * 20000 + '"'}, {"window": "7d", "filter": 'label[' + "x" * 50},
    {"window": "7d", "filter": 'pod:"a\x00"'}, {"window": "7d", "filterLabels": "nocolon"},
    {"window": "7d", "aggregate": "," * 5000}, {"window": "7d", "field": "password"},
    {"window": "7d", "limit": "99999999999999999999"},
]


@pytest.fixture
def token(db) -> str:
    user = user_in(FINANCE_GROUP)
    return issue_api_token(username=user.username, name="hostile", expires_at=None,
                           now=datetime(2026, 1, 1, tzinfo=UTC), actor_label="test").token


@pytest.mark.parametrize("params", HOSTILE)
def test_hostile_parameters_never_5xx(live_server, token: str, params: dict[str, str]) -> None:
    for path in PATHS:
        resp = requests.get(f"{live_server.url}{path}", params=params, timeout=60,
                            headers={"Authorization": f"Bearer {token}"})
        assert resp.status_code in (200, 400), (path, params, resp.status_code, resp.text[:300])
        body = resp.json()
        assert body["code"] == resp.status_code
        if resp.status_code == 400:
            assert body["status"] == "error"
            assert isinstance(body["message"], str)
