"""Throttling of failed bearer-token authentications (node tokens, ServiceAccount tokens, API
tokens, the admission webhook's token), per client address, in Redis (the cache).

Failures are counted per address in a counter that expires after the cool-off. The failure that
reaches VGPU_AUTH_FAILURE_LIMIT blocks the address for VGPU_AUTH_COOLOFF_S: from then on a token
the service has not seen valid is refused with 429 and Retry-After BEFORE any database look-up
or TokenReview, so guessing costs one Redis read per request, and the block is audited once
(one `auth.throttled` row per address and cool-off, however many requests are refused).

A block never refuses a valid token: every token that authenticates (or is issued) is marked
"known valid" in Redis by its SHA-256, and a known-valid token is looked up as usual during a
block. A noisy neighbour behind the same NAT therefore cannot lock out a healthy node or API
client; a token first used during its address's block waits out Retry-After unless it was
issued through the service (issuing marks it). Redis down: the throttle steps aside (fails
open) rather than stop ingest, and authentication runs as it would without it.

Login lockouts are django-axes' (billing.web.lockout); both count against the same client
address (`client_address_of`)."""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Mapping

import redis.exceptions
from django.conf import settings
from django.core.cache import cache
from django.utils import timezone

from billing.errors import Overloaded
from billing.services.audit import record_audit_event

__all__ = ["THROTTLED", "check_not_throttled", "client_address_of", "note_failure", "note_valid_token"]

log = logging.getLogger(__name__)

THROTTLED = "auth.throttled"
# A token stays "known valid" this long after its last success seen by this process (it is
# refreshed at most once a minute per process), so a node that reports daily never becomes a
# stranger; revoking it changes nothing here: a revoked token is still refused by the look-up.
_VALID_TTL_S = 7 * 24 * 3600
_REFRESH_EVERY_S = 60.0
_refreshed: dict[str, float] = {}
# What a Redis outage raises through Django's cache; the throttle steps aside then.
_REDIS_DOWN = (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError)


def client_address_of(meta: Mapping[str, object]) -> str:
    """The address failures are counted against: the header the operator named (one the proxy
    overwrites, VGPU_LOGIN_CLIENT_IP_META), else REMOTE_ADDR; never X-Forwarded-For as sent."""
    key = settings.VGPU_LOGIN_CLIENT_IP_META
    return str((meta.get(key) if key else None) or meta.get("REMOTE_ADDR") or "")


def _count_key(client: str) -> str:
    return f"vgpu:auth-fail:{client}"


def _block_key(client: str) -> str:
    return f"vgpu:auth-block:{client}"


def _valid_key(token_sha256: str) -> str:
    return f"vgpu:auth-valid:{token_sha256}"


def check_not_throttled(*, client: str | None, token_sha256: str) -> None:
    """Before the look-up: Overloaded (429, Retry-After) when `client` is blocked and the token is
    not known valid. One Redis read when the address is not blocked."""
    if not client:
        return
    try:
        blocked_until = cache.get(_block_key(client))
        if blocked_until is None or cache.get(_valid_key(token_sha256)) is not None:
            return
    except _REDIS_DOWN as exc:
        log.warning("event=auth_throttle_unavailable reason=%s", exc)
        return
    retry_after = max(1, math.ceil(float(blocked_until) - time.time()))
    raise Overloaded(f"too many failed authentications from {client}; retry after {retry_after} s",
                     retry_after_s=retry_after)


def note_failure(*, client: str | None, kind: str) -> None:
    """Count one failed authentication of `client`; the one that reaches the limit blocks the
    address and writes the audit row (the block key is added atomically, so exactly once)."""
    if not client:
        return
    cool_off = settings.VGPU_AUTH_COOLOFF_S
    try:
        cache.add(_count_key(client), 0, timeout=cool_off)
        try:
            failures = cache.incr(_count_key(client))
        except ValueError:  # expired between add and incr: this failure starts a new window
            cache.add(_count_key(client), 1, timeout=cool_off)
            failures = 1
        if failures < settings.VGPU_AUTH_FAILURE_LIMIT:
            return
        blocked_now = cache.add(_block_key(client), time.time() + cool_off, timeout=cool_off)
    except _REDIS_DOWN as exc:
        log.warning("event=auth_throttle_unavailable reason=%s", exc)
        return
    if blocked_now:
        log.warning("event=auth_throttled client=%s kind=%s failures=%d", client, kind, failures)
        record_audit_event(at=timezone.now(), actor_label="system", action=THROTTLED, object_type="client",
                           object_id=client[:150], before=None,
                           after={"client": client, "kind": kind, "failure_limit": settings.VGPU_AUTH_FAILURE_LIMIT,
                                  "cool_off_s": cool_off})


def note_valid_token(token_sha256: str, *, force: bool = False) -> None:
    """Mark a token known valid (after a success, at most once a minute per process; `force`
    when it is issued), so a block of its address never refuses it."""
    now = time.monotonic()
    if not force and now - _refreshed.get(token_sha256, -_REFRESH_EVERY_S) < _REFRESH_EVERY_S:
        return
    try:
        cache.set(_valid_key(token_sha256), 1, timeout=_VALID_TTL_S)
    except _REDIS_DOWN as exc:
        log.warning("event=auth_throttle_unavailable reason=%s", exc)
        return
    _refreshed[token_sha256] = now
