"""Ships spooled batches to the service, oldest first, exactly once.

Exactly-once rests on two facts: a batch's bytes never change after it is
spooled (retries resend the same bytes), and the service deduplicates on
``(node, batch_seq)`` (200 ``duplicate``). So a batch is marked sent only after
a 200/201, and a crash between send and mark only causes a harmless resend.
"""

from __future__ import annotations

import enum
import logging
import random
import threading
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from email.utils import parsedate_to_datetime

import requests

from agents.clock import utc_now
from agents.credentials import TokenError
from agents.spool import Spool, SpooledBatch

__all__ = [
    "BATCHES_PATH",
    "Outcome",
    "RetryPolicy",
    "SendResult",
    "Uploader",
    "backoff_delay",
    "classify_status",
    "parse_retry_after",
]

log = logging.getLogger(__name__)

BATCHES_PATH = "/api/v1/usage/batches"
_ANSWER_LIMIT = 4096  # characters of a rejecting answer kept in the spool and the log


class Outcome(enum.Enum):
    SENT = "sent"  # 201 stored / 200 duplicate
    DEAD = "dead"  # 400/409/413/415: resending the same bytes can never succeed; kept as undelivered
    AUTH = "auth"  # 401/403: token refused (wrong, revoked, expired, another node's); keep the data, back off
    THROTTLED = "throttled"  # 429/503: honour Retry-After
    RETRY = "retry"  # 5xx, unexpected answers, connection errors: back off


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    base_s: float = 1.0  # first backoff ceiling
    cap_s: float = 60.0  # backoff ceiling never exceeds this
    max_retry_after_s: float = 3600.0  # a server's Retry-After is honoured up to this
    timeout_s: float = 10.0  # connect and read timeout of one request
    idle_poll_s: float = 1.0  # how often an idle uploader looks at the spool

    def __post_init__(self) -> None:
        for name in ("base_s", "cap_s", "max_retry_after_s", "timeout_s", "idle_poll_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)!r}")


@dataclass(frozen=True, slots=True)
class SendResult:
    batch_seq: int
    outcome: Outcome
    status: int | None  # HTTP status; None when no answer came back
    delay_s: float  # how long to wait before the next send (0 after SENT or DEAD)


def classify_status(status: int) -> Outcome:
    if status in (200, 201):
        return Outcome.SENT
    if status in (400, 409, 413, 415):
        return Outcome.DEAD
    if status in (401, 403):
        return Outcome.AUTH
    if status in (429, 503):
        return Outcome.THROTTLED
    return Outcome.RETRY


def backoff_delay(*, attempt: int, base_s: float, cap_s: float, rng: random.Random) -> float:
    """Exponential backoff with full jitter: uniform over [0, min(cap, base x 2**attempt)]."""
    if attempt < 0:
        raise ValueError(f"attempt must be >= 0, got {attempt}")
    ceiling = cap_s if attempt >= 64 else min(cap_s, base_s * 2.0**attempt)
    return rng.uniform(0.0, ceiling)


def parse_retry_after(value: str | None, *, now: datetime) -> float | None:
    """Seconds to wait from a ``Retry-After`` header (delta-seconds or HTTP-date).

    ``None`` when absent or unparseable; a date in the past means 0.
    """
    if value is None:
        return None
    text = value.strip()
    if text.isdigit():
        return float(text)
    try:
        moment = parsedate_to_datetime(text)
    except (TypeError, ValueError):
        return None
    if moment.tzinfo is None:
        return None  # RFC 9110 dates are GMT; a zone-less date is not one
    return max(0.0, (moment - now).total_seconds())


class Uploader:
    """Sends the spool's oldest pending batch; ``run`` loops in a background thread."""

    def __init__(
        self,
        *,
        spool: Spool,
        server: str,
        token: Callable[[], str],
        session: requests.Session | None = None,
        retry: RetryPolicy | None = None,
        rng: random.Random | None = None,
        now: Callable[[], datetime] = utc_now,
        on_result: Callable[[SendResult], None] | None = None,
        report_undelivered: Callable[[], object] | None = None,
    ) -> None:
        self._spool = spool
        # Tells the service about refused batches (``UndeliveredReporter.report_if_due``): called
        # when idle and after each refusal, on this thread, so it never competes with uploads.
        self._report_undelivered = report_undelivered
        self._on_result = on_result  # sees every send's result (the agent's metrics count failures)
        self._url = server.rstrip("/") + BATCHES_PATH
        self._token = token
        self._session = session if session is not None else requests.Session()
        self._retry = retry if retry is not None else RetryPolicy()
        self._rng = rng if rng is not None else random.Random()  # noqa: S311 - jitter, not cryptography
        self._now = now
        self._failures = 0  # consecutive sends that asked for a backoff
        self._wake = threading.Event()
        self._stop = threading.Event()

    @property
    def url(self) -> str:
        return self._url

    def send_next(self) -> SendResult | None:
        """Send the oldest pending batch once; ``None`` when nothing is pending."""
        result = self._send_oldest()
        if result is not None and self._on_result is not None:
            self._on_result(result)
        return result

    def _send_oldest(self) -> SendResult | None:
        batch = self._spool.oldest_pending()
        if batch is None:
            return None
        try:
            response = self._post(batch)
        except TokenError as error:
            self._spool.record_attempt(batch.batch_seq, status=None, error=str(error))
            log.error("event=upload_no_token batch_seq=%d error=%r", batch.batch_seq, str(error))
            return self._backoff(batch, status=None, outcome=Outcome.AUTH)
        except requests.RequestException as error:
            self._spool.record_attempt(batch.batch_seq, status=None, error=repr(error))
            log.warning("event=upload_failed batch_seq=%d url=%s error=%r", batch.batch_seq, self._url, error)
            return self._backoff(batch, status=None)
        return self._settle(batch, response)

    def flush_once(self) -> int:
        """Send pending batches until the spool is empty or a send must wait; returns pending."""
        while (result := self.send_next()) is not None:
            if result.outcome not in (Outcome.SENT, Outcome.DEAD):
                break
        if self._report_undelivered is not None:
            self._report_undelivered()
        return self._spool.count(state="pending")

    def notify(self) -> None:
        """A batch was spooled: an idle uploader sends it now rather than at its next poll."""
        self._wake.set()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()

    def run(self) -> None:
        """Upload until ``stop``; a down server delays uploads, never metering."""
        while not self._stop.is_set():
            result = self.send_next()
            if self._report_undelivered is not None and (result is None or result.outcome is Outcome.DEAD):
                self._report_undelivered()
            if result is None:
                self._wake.wait(self._retry.idle_poll_s)
                self._wake.clear()
            elif result.delay_s > 0:
                self._stop.wait(result.delay_s)

    def _post(self, batch: SpooledBatch) -> requests.Response:
        headers = {
            "Authorization": f"Bearer {self._token()}",
            "Content-Type": "application/json",
        }
        if batch.content_encoding == "gzip":
            headers["Content-Encoding"] = "gzip"
        return self._session.post(self._url, data=batch.body, headers=headers, timeout=self._retry.timeout_s)

    def _settle(self, batch: SpooledBatch, response: requests.Response) -> SendResult:
        status = response.status_code
        outcome = classify_status(status)
        seq = batch.batch_seq
        if outcome is Outcome.SENT:
            self._spool.mark_sent(seq, status=status)
            self._failures = 0
            log.info("event=batch_uploaded batch_seq=%d status=%d", seq, status)
            return SendResult(batch_seq=seq, outcome=outcome, status=status, delay_s=0.0)
        answer = response.text[:_ANSWER_LIMIT]
        if outcome is Outcome.DEAD:
            self._spool.mark_dead(seq, status=status, answer=answer)
            self._failures = 0
            log.error(
                "event=batch_undelivered batch_seq=%d status=%d answer=%r"
                " detail='kept in the spool and reported to the service; see vgpu-agent redrive'",
                seq,
                status,
                answer,
            )
            return SendResult(batch_seq=seq, outcome=outcome, status=status, delay_s=0.0)
        self._spool.record_attempt(seq, status=status, error=answer)
        if outcome is Outcome.AUTH:
            log.error(
                "event=upload_unauthorized batch_seq=%d status=%d url=%s"
                " detail='token refused (wrong, revoked, expired or for another node: the answer says which); batches stay spooled'",
                seq,
                status,
                self._url,
            )
        elif outcome is Outcome.THROTTLED:
            wait = parse_retry_after(response.headers.get("Retry-After"), now=self._now())
            if wait is not None:
                wait = min(wait, self._retry.max_retry_after_s)
                log.warning(
                    "event=upload_throttled batch_seq=%d status=%d retry_after_s=%.1f",
                    seq,
                    status,
                    wait,
                )
                return SendResult(batch_seq=seq, outcome=outcome, status=status, delay_s=wait)
        else:
            log.warning("event=upload_failed batch_seq=%d status=%d answer=%r", seq, status, answer[:200])
        return self._backoff(batch, status=status, outcome=outcome)

    def _backoff(self, batch: SpooledBatch, *, status: int | None, outcome: Outcome = Outcome.RETRY) -> SendResult:
        delay = backoff_delay(attempt=self._failures, base_s=self._retry.base_s, cap_s=self._retry.cap_s, rng=self._rng)
        self._failures += 1
        return SendResult(batch_seq=batch.batch_seq, outcome=outcome, status=status, delay_s=delay)
