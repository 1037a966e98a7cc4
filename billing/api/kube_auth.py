"""`Authorization: Bearer <Kubernetes ServiceAccount token>` for OpenCost's clients (kubectl-cost,
the OpenCost UI), which cannot hold one of our API tokens
(docs/allocation-api.md, "Connecting kubectl-cost and the OpenCost UI").

Neither client sends a credential of its own: kubectl-cost reaches its service through a
port-forward or the API server's service proxy (which authenticates the caller but forwards no
identity to the service), and the UI's nginx proxies the browser's calls bare. So they reach the
service through the OpenCost gateway (deploy/k8s/opencost-clients.yaml), an nginx beside the UI
that adds its pod's projected ServiceAccount token to each call. Here the token is checked with a
TokenReview (audience VGPU_KUBE_CLIENT_AUDIENCE) and its ServiceAccount is mapped, by the admin's
VGPU_KUBE_CLIENTS, to a user of ours; the request runs as that user, so its scope is that user's
role, exactly as with an API token (a tenant member's ServiceAccount sees its tenants only).

Read-only: a ServiceAccount identity authenticates GET, HEAD and OPTIONS only.

A successful review is cached in this process by the token's SHA-256 (never the token) for at most
VGPU_KUBE_CLIENT_CACHE_S and never beyond the token's `exp`; an API server that cannot answer
makes the request a 503 (KubeApiUnavailable, billing.api.errors.OutageMiddleware), not a 401."""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import logging
import threading
from collections import OrderedDict
from datetime import UTC, datetime, timedelta
from typing import Any

from django.conf import settings
from django.contrib.auth.models import User
from django.utils import timezone
from django.utils.translation import gettext as _
from rest_framework import exceptions
from rest_framework.authentication import BaseAuthentication
from rest_framework.request import Request

from billing.services.identity import API_TOKEN_PREFIX, TOKEN_PREFIX, KubeApiUnavailable, create_token_review

__all__ = ["KubeServiceAccountAuthentication", "clear_client_review_cache", "parse_client_map"]

log = logging.getLogger(__name__)

_SERVICE_ACCOUNT_PREFIX = "system:serviceaccount:"
_SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
_CACHE_MAX_ENTRIES = 1_000  # a handful of gateways; bounds memory under a flood of tokens

_cache: OrderedDict[str, tuple[str, datetime]] = OrderedDict()  # token SHA-256 -> (ServiceAccount, until)
_cache_lock = threading.Lock()


def clear_client_review_cache() -> None:
    """Forget every cached review (tests; an operator revoking in a shell)."""
    with _cache_lock:
        _cache.clear()


def parse_client_map(value: str) -> dict[str, str]:
    """VGPU_KUBE_CLIENTS, "namespace:serviceaccount=username,...", as {"namespace:serviceaccount":
    username}. An entry not of that form is left out and logged: it maps nobody, so the client it
    meant is refused (401), never let in as someone else."""
    mapping: dict[str, str] = {}
    for entry in (e.strip() for e in value.split(",")):
        if not entry:
            continue
        account, sep, username = (part.strip() for part in entry.partition("="))
        namespace, colon, name = account.partition(":")
        if not sep or not colon or not namespace or not name or ":" in name or not username:
            log.error("event=kube_clients_entry_ignored entry=%r expected='namespace:serviceaccount=username'", entry)
            continue
        mapping[account] = username
    return mapping


class KubeServiceAccountAuthentication(BaseAuthentication):  # type: ignore[misc]  # DRF ships no type hints
    def authenticate(self, request: Request) -> tuple[User, None] | None:
        scheme, _sep, token = request.headers.get("Authorization", "").partition(" ")
        token = token.strip()
        if scheme.lower() != "bearer" or token.startswith((API_TOKEN_PREFIX, TOKEN_PREFIX)):
            return None
        if not settings.VGPU_KUBE_CLIENTS or token.count(".") != 2:
            return None  # not a JWT, or the feature is off: some other class, or a plain 401
        if request.method not in _SAFE_METHODS:
            raise exceptions.AuthenticationFailed(
                _("a Kubernetes ServiceAccount token may only read (GET); use an API token to change anything"))
        account = _reviewed_account(token, now=timezone.now())
        username = parse_client_map(settings.VGPU_KUBE_CLIENTS).get(account)
        if username is None:
            raise exceptions.AuthenticationFailed(
                _("ServiceAccount %(account)s is not mapped to a user (VGPU_KUBE_CLIENTS)") % {"account": account})
        user = User.objects.filter(username=username, is_active=True).first()
        if user is None:
            raise exceptions.AuthenticationFailed(
                _("ServiceAccount %(account)s is mapped to '%(user)s', which is not an active user")
                % {"account": account, "user": username})
        return user, None

    def authenticate_header(self, request: Request) -> str:
        return 'Bearer realm="vgpu-ledger"'


def _reviewed_account(token: str, *, now: datetime) -> str:
    """"namespace:serviceaccount" of a token the API server authenticates for our audience."""
    key = hashlib.sha256(token.encode()).hexdigest()
    with _cache_lock:
        cached = _cache.get(key)
        if cached is not None and now < cached[1]:
            return cached[0]
        _cache.pop(key, None)
    expires = _precheck(_unverified_claims(token), now=now)
    account = _review(token)
    # The review vouched for the token's signed claims, so its exp may bound the cache.
    until = min(now + timedelta(seconds=settings.VGPU_KUBE_CLIENT_CACHE_S), expires)
    if until > now:
        with _cache_lock:
            _cache[key] = (account, until)
            while len(_cache) > _CACHE_MAX_ENTRIES:
                _cache.popitem(last=False)
    return account


def _review(token: str) -> str:
    from kubernetes.client.exceptions import ApiException

    audience = settings.VGPU_KUBE_CLIENT_AUDIENCE
    try:
        review = create_token_review(token, audiences=[audience])
    except ApiException as exc:
        # A 401 or 403 here is this service's own credential or RBAC, not the client's.
        log.error("event=kube_api_refused call='TokenReview' status=%s reason=%r", exc.status, exc.reason)
        raise KubeApiUnavailable(f"TokenReview: {exc.status} {exc.reason}") from exc
    except Exception as exc:  # urllib3 connection errors and timeouts, in-cluster config missing
        log.error("event=kube_api_unreachable call='TokenReview' error=%r", exc)
        raise KubeApiUnavailable(f"TokenReview: {type(exc).__name__}: {exc}") from exc
    status = review.status
    if status is None or status.authenticated is not True:
        reason = (status.error if status is not None else None) or _("not authenticated")
        raise exceptions.AuthenticationFailed(
            _("the Kubernetes API server rejected the token: %(reason)s") % {"reason": reason})
    if audience not in (status.audiences or []):
        # An authenticator that ignores audiences would answer for the API server's own audience.
        raise exceptions.AuthenticationFailed(
            _("the token is not for audience '%(audience)s'") % {"audience": audience})
    username = (status.user.username if status.user is not None else None) or ""
    if not username.startswith(_SERVICE_ACCOUNT_PREFIX):
        raise exceptions.AuthenticationFailed(
            _("%(user)s is not a ServiceAccount") % {"user": username or _("an anonymous user")})
    return username.removeprefix(_SERVICE_ACCOUNT_PREFIX)


def _unverified_claims(token: str) -> dict[str, Any]:
    """The JWT's payload, read without checking the signature (the TokenReview does that); {} when
    it is not a JSON object."""
    payload = token.split(".")[1]
    try:
        claims: Any = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
    except (ValueError, binascii.Error):
        return {}
    return claims if isinstance(claims, dict) else {}


def _precheck(claims: dict[str, Any], *, now: datetime) -> datetime:
    """The token's expiry, after refusing here, without troubling the API server, a token that is
    not a JWT for our audience, has no expiry or has expired by its own claims (a projected or
    TokenRequest token always has `aud` and `exp`; the review would refuse the rest too, and this
    keeps garbage from costing a TokenReview each)."""
    audiences = claims.get("aud")
    audiences = [audiences] if isinstance(audiences, str) else audiences
    audience = settings.VGPU_KUBE_CLIENT_AUDIENCE
    if not isinstance(audiences, list) or audience not in audiences:
        raise exceptions.AuthenticationFailed(
            _("the token is not for audience '%(audience)s'") % {"audience": audience})
    expires = claims.get("exp")
    try:
        if not isinstance(expires, int | float) or isinstance(expires, bool):
            raise ValueError("no numeric exp")
        until = datetime.fromtimestamp(expires, tz=UTC)
    except (OverflowError, OSError, ValueError):
        raise exceptions.AuthenticationFailed(_("the token has no valid expiry (exp)")) from None
    if until <= now:
        raise exceptions.AuthenticationFailed(_("the token has expired"))
    return until
