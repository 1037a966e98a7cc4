"""Enforcement events: validated by the service's rules, posted in order, kept until acknowledged."""

from __future__ import annotations

import json
import random
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import requests

from agents.credentials import TokenError
from agents.events import MAX_EVENTS_PER_REQUEST, Event, EventSink, events_payload
from agents.fakes.service import ScriptedSession
from agents.uploader import Outcome, RetryPolicy

T0 = datetime(2026, 11, 30, 3, 0, 0, tzinfo=UTC)
STORED = (201, {"Content-Type": "application/json"}, b'{"status":"stored","accepted":1}')


def event(i: int = 0, **overrides: Any) -> Event:
    fields: dict[str, Any] = {
        "at": T0 + timedelta(seconds=i),
        "action": "watchdog.evicted",
        "target": "acme-prod/bert-1/server",
        "detail": {"n": i, "pod": "acme-prod/bert-1"},
    }
    fields.update(overrides)
    return Event(**fields)


def sink(session: ScriptedSession, **kwargs: Any) -> EventSink:
    return EventSink(
        server="http://ledger.test/",
        node="gpu-node-17",
        token=lambda: "node-token",
        session=session,
        retry=RetryPolicy(base_s=1.0, cap_s=60.0, timeout_s=5.0),
        rng=random.Random(7),
        now=lambda: T0,
        **kwargs,
    )


def test_payload_has_the_protocol_shape() -> None:
    body = json.loads(events_payload([event(0), event(1, at=datetime(2026, 11, 30, 4, 0, tzinfo=UTC))]))
    assert body == {
        "events": [
            {
                "at": "2026-11-30T03:00:00Z",
                "action": "watchdog.evicted",
                "target": "acme-prod/bert-1/server",
                "detail": {"n": 0, "pod": "acme-prod/bert-1"},
            },
            {
                "at": "2026-11-30T04:00:00Z",
                "action": "watchdog.evicted",
                "target": "acme-prod/bert-1/server",
                "detail": {"n": 1, "pod": "acme-prod/bert-1"},
            },
        ]
    }
    assert datetime.fromisoformat(body["events"][0]["at"]) == T0  # what the service parses


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"action": ""}, "event action must be 1 to"),
        ({"action": "x" * 91}, "event action must be 1 to"),
        ({"target": ""}, "event target must be 1 to"),
        ({"target": "t" * 201}, "event target must be 1 to"),
        ({"at": datetime(2026, 11, 30, 3, 0)}, "naive timestamp"),  # noqa: DTZ001 - the naive timestamp under test
        ({"detail": ["not", "an", "object"]}, "detail must be a mapping"),
        ({"detail": {"ratio": float("nan")}}, "detail is not plain JSON"),
        ({"detail": {"pids": {1, 2}}}, "detail is not plain JSON"),
    ],
)
def test_event_the_service_would_reject_is_refused_when_made(overrides: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        event(**overrides)


def test_limits_are_the_services_limits() -> None:
    event(action="a" * 90, target="t" * 200)
    with pytest.raises(ValueError, match="a request carries 1 to"):
        events_payload([])
    with pytest.raises(ValueError, match="a request carries 1 to"):
        events_payload([event()] * (MAX_EVENTS_PER_REQUEST + 1))


def test_flush_posts_to_the_nodes_events_endpoint_with_the_token_in_chunks() -> None:
    session = ScriptedSession([STORED, STORED])
    events = sink(session, max_per_request=2)
    for i in range(3):
        events.emit(event(i))

    result = events.flush()

    assert (result.sent, result.pending, result.outcome) == (3, 0, Outcome.SENT)
    assert [r.url for r in session.sent] == ["http://ledger.test/api/v1/nodes/gpu-node-17/events"] * 2
    assert session.sent[0].headers == {"Authorization": "Bearer node-token", "Content-Type": "application/json"}
    assert session.sent[0].timeout == 5.0
    sent = [e["detail"]["n"] for r in session.sent for e in json.loads(r.body)["events"]]
    assert sent == [0, 1, 2]  # oldest first


def test_node_name_is_escaped_in_the_path() -> None:
    events = EventSink(server="http://ledger.test", node="gpu/node 1", token=lambda: "t", session=ScriptedSession([]))
    assert events.url == "http://ledger.test/api/v1/nodes/gpu%2Fnode%201/events"


def test_throttled_and_failed_sends_keep_the_events_and_back_off() -> None:
    session = ScriptedSession(
        [
            (503, {"Retry-After": "7"}, b"busy"),
            requests.ConnectionError("refused"),
            (500, {}, b"oops"),
            STORED,
        ]
    )
    events = sink(session)
    events.emit(event(0))

    throttled = events.flush()
    assert (throttled.outcome, throttled.pending, throttled.delay_s) == (Outcome.THROTTLED, 1, 7.0)
    down = events.flush()
    assert down.outcome is Outcome.RETRY
    assert down.pending == 1
    assert 0 <= down.delay_s <= 1.0
    failed = events.flush()
    assert failed.outcome is Outcome.RETRY
    assert failed.pending == 1
    assert 0 <= failed.delay_s <= 2.0
    done = events.flush()
    assert (done.sent, done.pending) == (1, 0)
    assert len({r.body for r in session.sent}) == 1  # the same event every time


def test_unauthorized_keeps_the_events() -> None:
    events = sink(ScriptedSession([(401, {}, b"bad token")]))
    events.emit(event(0))
    result = events.flush()
    assert (result.outcome, result.pending) == (Outcome.AUTH, 1)


def test_missing_token_file_keeps_the_events() -> None:
    def no_token() -> str:
        raise TokenError("token file /var/run/token does not exist")

    session = ScriptedSession([])
    events = EventSink(server="http://ledger.test", node="n1", token=no_token, session=session)
    events.emit(event(0))
    result = events.flush()
    assert (result.outcome, result.pending) == (Outcome.AUTH, 1)
    assert session.sent == []


def test_rejected_request_is_dropped_and_counted_so_it_cannot_block_the_rest() -> None:
    session = ScriptedSession(
        [(400, {}, b'{"errors":[{"path":"$.events[0].at","message":"is in the future"}]}'), STORED]
    )
    events = sink(session, max_per_request=1)
    events.emit(event(0))
    events.emit(event(1))

    result = events.flush()

    assert (result.sent, result.pending, events.dropped) == (1, 0, 1)
    assert json.loads(session.sent[1].body)["events"][0]["detail"]["n"] == 1


def test_full_buffer_drops_the_oldest_events_and_counts_them() -> None:
    session = ScriptedSession([STORED])
    events = sink(session, max_pending=2)
    for i in range(3):
        events.emit(event(i))

    assert (events.pending, events.dropped) == (2, 1)
    events.flush()
    assert [e["detail"]["n"] for e in json.loads(session.sent[0].body)["events"]] == [1, 2]


def test_nothing_pending_sends_nothing() -> None:
    session = ScriptedSession([])
    result = sink(session).flush()
    assert (result.sent, result.pending, result.outcome, result.delay_s) == (0, 0, None, 0.0)
    assert session.sent == []
