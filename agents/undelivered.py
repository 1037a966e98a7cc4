"""Tells the service about batches it refused, so no refused usage goes unseen.

A batch answered 400/409/413/415 is kept in the spool as undelivered (``dead``);
resending the same bytes can never succeed, so only an operator can bring it in
(``vgpu-agent redrive``, docs/agent.md). Until then the money it carries is
visible on the service only if the agent says so: this reporter posts each one —
``batch_seq``, window, sample count, size, status and the service's answer — to
``POST {server}/api/v1/nodes/{node}/undelivered`` and marks it reported once the
service stored it. The service upserts on ``(node, batch_seq)``, so a report sent
twice (a crash before marking) is harmless, and a batch that changed (a re-drive
renumbered it, or it was refused again with another answer) is reported again.
"""

from __future__ import annotations

import json
import logging
import random
import time
from collections.abc import Callable, Sequence
from typing import Any
from urllib.parse import quote

import requests

from agents.batch import format_utc
from agents.credentials import TokenError
from agents.spool import Spool, SpooledBatch
from agents.uploader import RetryPolicy, backoff_delay

__all__ = ["MAX_REPORTS_PER_REQUEST", "UNDELIVERED_PATH", "UndeliveredReporter", "undelivered_payload"]

log = logging.getLogger(__name__)

UNDELIVERED_PATH = "/api/v1/nodes/{node}/undelivered"
MAX_REPORTS_PER_REQUEST = 100  # the service rejects a request with more
MAX_REASON_CHARS = 4096  # the uploader keeps this much of a refusal; the service stores it whole


def undelivered_payload(batches: Sequence[SpooledBatch]) -> bytes:
    """The request body reporting ``batches`` (docs/protocol.md, "Undelivered batches")."""
    return json.dumps({"batches": [_report(b) for b in batches]}, separators=(",", ":")).encode("utf-8")


def _report(batch: SpooledBatch) -> dict[str, Any]:
    document = json.loads(batch.json_bytes())
    items = document.get("windows", document.get("samples"))  # what the batch carries: v2 windows, v1 samples
    return {
        "batch_seq": batch.batch_seq,
        "window": {"start": format_utc(batch.window_start), "end": format_utc(batch.window_end)},
        "samples": len(items) if isinstance(items, list) else 0,
        "size_bytes": len(batch.body),  # as sent (gzipped when the spool compresses)
        "status": batch.last_status,
        "reason": (batch.last_error or "")[:MAX_REASON_CHARS],
        "content_sha256": batch.content_sha256(),
        "superseded_by": batch.superseded_by,
    }


class UndeliveredReporter:
    """``report_if_due`` from the uploader's thread: when idle and after each refusal."""

    def __init__(
        self,
        *,
        spool: Spool,
        server: str,
        node: str,
        token: Callable[[], str],
        session: requests.Session | None = None,
        retry: RetryPolicy | None = None,
        rng: random.Random | None = None,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self._spool = spool
        self._url = server.rstrip("/") + UNDELIVERED_PATH.format(node=quote(node, safe=""))
        self._token = token
        self._session = session if session is not None else requests.Session()
        self._retry = retry if retry is not None else RetryPolicy()
        self._rng = rng if rng is not None else random.Random()  # noqa: S311 - jitter, not cryptography
        self._monotonic = monotonic
        self._failures = 0
        self._next_at = 0.0  # monotonic seconds; a failed report waits out its backoff

    @property
    def url(self) -> str:
        return self._url

    def report_if_due(self) -> int:
        """Report what the service has not acknowledged yet; returns how many it stored now."""
        if self._monotonic() < self._next_at:
            return 0
        stored = 0
        while chunk := self._spool.unreported(limit=MAX_REPORTS_PER_REQUEST):
            if not self._send(chunk):
                break
            self._spool.mark_reported(chunk)
            stored += len(chunk)
        return stored

    def _send(self, chunk: list[SpooledBatch]) -> bool:
        try:
            response = self._session.post(
                self._url,
                data=undelivered_payload(chunk),
                headers={"Authorization": f"Bearer {self._token()}", "Content-Type": "application/json"},
                timeout=self._retry.timeout_s,
            )
        except (TokenError, requests.RequestException) as error:
            return self._failed(chunk, status=None, answer=repr(error))
        if response.status_code == 201:
            self._failures = 0
            self._next_at = 0.0
            log.info("event=undelivered_reported batches=%d", len(chunk))
            return True
        return self._failed(chunk, status=response.status_code, answer=response.text[:200])

    def _failed(self, chunk: list[SpooledBatch], *, status: int | None, answer: str) -> bool:
        # Every failure is retried with backoff: the batches stay in the spool either way, and
        # a service without this endpoint (older) must not stop uploads.
        delay = backoff_delay(attempt=self._failures, base_s=self._retry.base_s, cap_s=self._retry.cap_s, rng=self._rng)
        self._failures += 1
        self._next_at = self._monotonic() + delay
        log.error(
            "event=undelivered_report_failed batches=%d status=%s answer=%r retry_in_s=%.1f",
            len(chunk),
            status,
            answer,
            delay,
        )
        return False
