"""Enforcement events: what the agent did on the node, posted to the service's audit log.

``POST {server}/api/v1/nodes/{node}/events`` with the node token, body
``{"events": [{"at", "action", "target", "detail"}, ...]}`` (1 to 1000 events;
``docs/protocol.md``). The service validates the whole request first and stores
nothing if any event is invalid, so every event is validated here, when it is
made, by the same rules: one bad event can never poison a batch.

Events are kept in memory (bounded, oldest dropped first) until the service
acknowledges them. They are an audit trail of actions, not billing data: on a
long outage the oldest are dropped and counted (``dropped``), never the meter.
"""

from __future__ import annotations

import json
import logging
import math
import random
import threading
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any
from urllib.parse import quote

import requests

from agents.clock import utc_now
from agents.credentials import TokenError
from agents.uploader import Outcome, RetryPolicy, backoff_delay, classify_status, parse_retry_after

__all__ = [
    "EVENTS_PATH",
    "MAX_ACTION_CHARS",
    "MAX_EVENTS_PER_REQUEST",
    "MAX_TARGET_CHARS",
    "EmitEvent",
    "Event",
    "EventSink",
    "FlushResult",
    "events_payload",
]

log = logging.getLogger(__name__)

EVENTS_PATH = "/api/v1/nodes/{node}/events"
MAX_EVENTS_PER_REQUEST = 1000  # the service rejects a request with more
MAX_ACTION_CHARS = 90  # stored as ``agent.<action>`` in a 100-character column
MAX_TARGET_CHARS = 200
_ANSWER_LIMIT = 2048  # characters of a rejecting answer kept in the log

EmitEvent = Callable[["Event"], None]
"""Where enforcers send their events: ``EventSink.emit`` in the agent, ``list.append`` in tests."""


@dataclass(frozen=True, slots=True)
class Event:
    """One enforcement action, validated by the service's rules at construction."""

    at: datetime  # aware; when the action was taken
    action: str  # e.g. ``mps.set_active_thread_percentage``; stored as ``agent.<action>``
    target: str  # what was acted on: a workload key, ``gpu/<uuid>``, ``mps-server/<pid>``
    detail: Mapping[str, Any]  # a JSON object

    def __post_init__(self) -> None:
        if self.at.tzinfo is None:
            raise ValueError(f"event {self.action!r}: naive timestamp {self.at.isoformat()} (aware UTC required)")
        if not isinstance(self.action, str) or not 1 <= len(self.action) <= MAX_ACTION_CHARS:
            raise ValueError(f"event action must be 1 to {MAX_ACTION_CHARS} characters, got {self.action!r}")
        if not isinstance(self.target, str) or not 1 <= len(self.target) <= MAX_TARGET_CHARS:
            raise ValueError(f"event target must be 1 to {MAX_TARGET_CHARS} characters, got {self.target!r}")
        if not isinstance(self.detail, Mapping):
            raise ValueError(f"event {self.action!r}: detail must be a mapping, got {type(self.detail).__name__}")
        try:
            # allow_nan=False: the service's JSON parser rejects NaN and Infinity.
            json.dumps(dict(self.detail), allow_nan=False)
        except (TypeError, ValueError) as error:
            raise ValueError(f"event {self.action!r}: detail is not plain JSON ({error})") from None

    def to_json(self) -> dict[str, Any]:
        return {
            "at": self.at.astimezone(UTC).isoformat().replace("+00:00", "Z"),
            "action": self.action,
            "target": self.target,
            "detail": dict(self.detail),
        }


def events_payload(events: Sequence[Event]) -> bytes:
    """The request body for 1 to ``MAX_EVENTS_PER_REQUEST`` events."""
    if not 1 <= len(events) <= MAX_EVENTS_PER_REQUEST:
        raise ValueError(f"a request carries 1 to {MAX_EVENTS_PER_REQUEST} events, got {len(events)}")
    return json.dumps({"events": [e.to_json() for e in events]}, allow_nan=False, separators=(",", ":")).encode()


@dataclass(frozen=True, slots=True)
class FlushResult:
    sent: int  # events the service stored by this call
    pending: int  # events still held
    outcome: Outcome | None  # of the last request; None when nothing was pending
    delay_s: float  # how long to wait before the next attempt (0 when nothing waits)


class EventSink:
    """Holds events in memory and posts them to the service in order; thread-safe.

    ``emit`` never blocks on the network: the loop calls it, a background thread
    (``run``) or the caller (``flush``) sends. Answers are handled like usage
    batches (``agents.uploader``): 201 drops the sent events; 400/409/413/415
    drops them with an error log (they were validated here, so this is a bug,
    and resending identical bytes can never succeed); 401/403, 429/503, 5xx and
    connection errors keep them and back off (429/503 honour ``Retry-After``).
    """

    def __init__(
        self,
        *,
        server: str,
        node: str,
        token: Callable[[], str],
        session: requests.Session | None = None,
        retry: RetryPolicy | None = None,
        max_pending: int = 10_000,
        max_per_request: int = MAX_EVENTS_PER_REQUEST,
        rng: random.Random | None = None,
        now: Callable[[], datetime] = utc_now,
    ) -> None:
        if not node:
            raise ValueError("node must not be empty")
        if max_pending < 1:
            raise ValueError(f"max_pending must be >= 1, got {max_pending}")
        if not 1 <= max_per_request <= MAX_EVENTS_PER_REQUEST:
            raise ValueError(f"max_per_request must be in [1, {MAX_EVENTS_PER_REQUEST}], got {max_per_request}")
        self._url = server.rstrip("/") + EVENTS_PATH.format(node=quote(node, safe=""))
        self._token = token
        self._session = session if session is not None else requests.Session()
        self._retry = retry if retry is not None else RetryPolicy()
        self._max_per_request = max_per_request
        self._rng = rng if rng is not None else random.Random()  # noqa: S311 - jitter, not cryptography
        self._now = now
        self._pending: deque[Event] = deque(maxlen=max_pending)
        self._lock = threading.Lock()  # guards _pending and dropped
        self._send_lock = threading.Lock()  # one request at a time keeps events in order
        self._failures = 0
        self._wake = threading.Event()
        self._stop = threading.Event()
        self.dropped = 0  # events discarded because the buffer was full or the service rejected them

    @property
    def url(self) -> str:
        return self._url

    @property
    def pending(self) -> int:
        with self._lock:
            return len(self._pending)

    def emit(self, event: Event) -> None:
        with self._lock:
            if len(self._pending) == self._pending.maxlen:
                self.dropped += 1
                log.warning(
                    "event=enforcement_event_dropped action=%s reason=buffer_full max_pending=%d",
                    self._pending[0].action,
                    self._pending.maxlen,
                )
            self._pending.append(event)
        self._wake.set()

    def flush(self) -> FlushResult:
        """Send held events, oldest first, until none are left or a request must wait."""
        sent = 0
        with self._send_lock:
            while True:
                with self._lock:
                    chunk = [self._pending[i] for i in range(min(len(self._pending), self._max_per_request))]
                if not chunk:
                    return FlushResult(sent=sent, pending=0, outcome=None if sent == 0 else Outcome.SENT, delay_s=0.0)
                outcome, delay = self._send(chunk)
                if outcome in (Outcome.SENT, Outcome.DEAD):
                    self._forget(chunk, rejected=outcome is Outcome.DEAD)
                    sent += len(chunk) if outcome is Outcome.SENT else 0
                    continue
                return FlushResult(sent=sent, pending=self.pending, outcome=outcome, delay_s=delay)

    def run(self) -> None:
        """Send events until ``stop``; waits for ``emit`` or backs off between failures."""
        while not self._stop.is_set():
            result = self.flush()
            if result.delay_s > 0:
                self._stop.wait(result.delay_s)
            else:
                self._wake.wait(self._retry.idle_poll_s)
                self._wake.clear()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()

    def _forget(self, chunk: list[Event], *, rejected: bool) -> None:
        with self._lock:
            removed = 0
            for event in chunk:
                # A full buffer may have dropped some of the chunk's events while it was in
                # flight; only those still at the front are the ones just answered.
                if self._pending and self._pending[0] is event:
                    self._pending.popleft()
                    removed += 1
            if rejected:
                self.dropped += removed

    def _send(self, chunk: list[Event]) -> tuple[Outcome, float]:
        body = events_payload(chunk)
        try:
            headers = {"Authorization": f"Bearer {self._token()}", "Content-Type": "application/json"}
            response = self._session.post(self._url, data=body, headers=headers, timeout=self._retry.timeout_s)
        except TokenError as error:
            log.error("event=events_no_token error=%r", str(error))
            return Outcome.AUTH, self._backoff()
        except requests.RequestException as error:
            log.warning("event=events_upload_failed url=%s events=%d error=%r", self._url, len(chunk), error)
            return Outcome.RETRY, self._backoff()
        status = response.status_code
        outcome = classify_status(status)
        if outcome is Outcome.SENT:
            self._failures = 0
            log.info("event=events_uploaded events=%d status=%d", len(chunk), status)
            return outcome, 0.0
        answer = response.text[:_ANSWER_LIMIT]
        if outcome is Outcome.DEAD:
            self._failures = 0
            log.error("event=events_rejected events=%d status=%d answer=%r", len(chunk), status, answer)
            return outcome, 0.0
        if outcome is Outcome.THROTTLED:
            wait = parse_retry_after(response.headers.get("Retry-After"), now=self._now())
            if wait is not None and math.isfinite(wait):
                return outcome, min(wait, self._retry.max_retry_after_s)
        log.warning("event=events_upload_failed url=%s status=%d answer=%r", self._url, status, answer[:200])
        return outcome, self._backoff()

    def _backoff(self) -> float:
        delay = backoff_delay(attempt=self._failures, base_s=self._retry.base_s, cap_s=self._retry.cap_s, rng=self._rng)
        self._failures += 1
        return delay
