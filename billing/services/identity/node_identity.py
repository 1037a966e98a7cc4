"""Node identity from the agent's projected ServiceAccount token, the Kubernetes way.

An agent in Kubernetes presents the token the kubelet writes to its projected
``serviceAccountToken`` volume (audience ``VGPU_NODE_TOKEN_AUDIENCE``). The service does not
verify it itself: it asks the API server with a TokenReview (``authentication.k8s.io/v1``) and,
for an authenticated token of an allowed agent ServiceAccount, reads the pod the token is bound
to (``authentication.kubernetes.io/pod-name`` / ``pod-uid``). The node is that pod's
``spec.nodeName``: a token proves "I am the agent pod on node A", so it can speak for A only.

A successful review is cached in this process, keyed by the token's SHA-256 (never the token),
for at most ``VGPU_NODE_TOKENREVIEW_CACHE_S`` and never beyond the token's ``exp``, so ingest
does not make a TokenReview per batch. The price: a token whose pod was deleted keeps working
in this process until its cache entry expires.

When the API server cannot answer, requests fail with ``KubeApiUnavailable`` (503 with
Retry-After, from ``billing.api.errors.OutageMiddleware``), never with 401: the agent keeps its
batches spooled and retries.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import logging
import threading
from collections import OrderedDict
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import transaction
from django.utils.translation import gettext as _

from billing.errors import Forbidden, NotAuthenticated
from billing.models import Node
from billing.services.audit import record_audit_event
from billing.services.identity.kube_api import shared_api_client

__all__ = [
    "POD_NAME_EXTRA",
    "POD_UID_EXTRA",
    "KubeApiUnavailable",
    "PodIdentity",
    "authenticate_service_account_token",
    "clear_review_cache",
    "review_service_account_token",
]

log = logging.getLogger(__name__)

# The user-info extras the API server's ServiceAccount authenticator sets for a pod-bound token.
POD_NAME_EXTRA = "authentication.kubernetes.io/pod-name"
POD_UID_EXTRA = "authentication.kubernetes.io/pod-uid"
_SERVICE_ACCOUNT_PREFIX = "system:serviceaccount:"
_CACHE_MAX_ENTRIES = 10_000  # far above any fleet's agents; bounds memory under a flood of tokens


class KubeApiUnavailable(Exception):
    """The API server did not answer a TokenReview or a pod read (down, timing out, or refusing
    this service's own credentials): the token is neither accepted nor refused."""


@dataclass(frozen=True)
class PodIdentity:
    """Who a reviewed token is: an agent ServiceAccount, in a pod, on a node."""

    username: str  # system:serviceaccount:<namespace>:<name>
    namespace: str
    pod: str
    pod_uid: str
    node: str  # the pod's spec.nodeName


@dataclass(frozen=True)
class _Cached:
    identity: PodIdentity
    until: datetime


class _ReviewCache:
    """Successful reviews by token SHA-256, each until a deadline; oldest dropped when full."""

    def __init__(self, *, max_entries: int) -> None:
        self._entries: OrderedDict[str, _Cached] = OrderedDict()
        self._lock = threading.Lock()
        self._max = max_entries

    def get(self, key: str, *, now: datetime) -> PodIdentity | None:
        with self._lock:
            entry = self._entries.get(key)
            if entry is None:
                return None
            if now >= entry.until:
                del self._entries[key]
                return None
            return entry.identity

    def put(self, key: str, identity: PodIdentity, *, until: datetime) -> None:
        with self._lock:
            self._entries[key] = _Cached(identity, until)
            self._entries.move_to_end(key)
            while len(self._entries) > self._max:
                self._entries.popitem(last=False)

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()


_cache = _ReviewCache(max_entries=_CACHE_MAX_ENTRIES)


def clear_review_cache() -> None:
    """Forget every cached review (tests; an operator revoking in a shell)."""
    _cache.clear()


def authenticate_service_account_token(*, token: str, node_name: str | None, now: datetime) -> Node:
    """The node a projected ServiceAccount token speaks for; `node_name`, when given, must be it.

    401 (NotAuthenticated) for a token the API server does not authenticate, one of another
    audience or ServiceAccount, or one whose pod is gone or was recreated; 403 (Forbidden) for a
    valid token used for another node; KubeApiUnavailable when the API server cannot say.
    """
    identity = review_service_account_token(token=token, now=now)
    if node_name is not None and node_name != identity.node:
        raise Forbidden(
            _("this token belongs to node '%(node)s' (pod %(pod)s), not '%(asked)s'")
            % {"node": identity.node, "pod": f"{identity.namespace}/{identity.pod}", "asked": node_name}
        )
    return _node_row(identity, now=now)


def review_service_account_token(*, token: str, now: datetime) -> PodIdentity:
    """The reviewed identity of `token`, from the cache while fresh, else from the API server."""
    if not settings.VGPU_NODE_TOKENREVIEW:
        raise NotAuthenticated(
            _("this service accepts only node tokens (vgl_…): ServiceAccount tokens need VGPU_NODE_TOKENREVIEW=1")
        )
    claims = _unverified_claims(token)
    key = hashlib.sha256(token.encode()).hexdigest()
    cached = _cache.get(key, now=now)
    if cached is not None:
        return cached
    identity = _review(token)
    until = now + timedelta(seconds=settings.VGPU_NODE_TOKENREVIEW_CACHE_S)
    expires = claims.get("exp")
    if isinstance(expires, int | float):
        # The review vouched for the token's signed claims, so its exp may bound the cache.
        until = min(until, datetime.fromtimestamp(expires, tz=UTC))
    if until > now:
        _cache.put(key, identity, until=until)
    return identity


def _unverified_claims(token: str) -> dict[str, Any]:
    """The JWT payload, read without checking the signature (the TokenReview does that); a token
    that is not a JWT at all is refused here, without troubling the API server."""
    parts = token.split(".")
    try:
        if len(parts) != 3:
            raise ValueError("not three segments")
        claims = json.loads(base64.urlsafe_b64decode(parts[1] + "=" * (-len(parts[1]) % 4)))
        if not isinstance(claims, dict):
            raise ValueError("payload is not an object")
    except (ValueError, binascii.Error):
        raise NotAuthenticated(
            _("bearer token is neither a node token (vgl_…) nor a Kubernetes ServiceAccount token (JWT)")
        ) from None
    return claims


def _review(token: str) -> PodIdentity:
    from kubernetes import client

    audience = settings.VGPU_NODE_TOKEN_AUDIENCE
    body = client.V1TokenReview(
        api_version="authentication.k8s.io/v1",
        kind="TokenReview",
        spec=client.V1TokenReviewSpec(token=token, audiences=[audience]),
    )
    review = _call("TokenReview", lambda api: client.AuthenticationV1Api(api).create_token_review(
        body, _request_timeout=settings.VGPU_KUBE_API_TIMEOUT_S))
    status = review.status
    if status is None or status.authenticated is not True:
        reason = (status.error if status is not None else None) or _("not authenticated")
        raise NotAuthenticated(_("the Kubernetes API server rejected the token: %(reason)s") % {"reason": reason})
    if audience not in (status.audiences or []):
        # An authenticator that ignores audiences would answer for the API server's own audience.
        raise NotAuthenticated(
            _("the token is not for audience '%(audience)s' (the review names %(named)s)")
            % {"audience": audience, "named": ", ".join(status.audiences or []) or "none"}
        )
    user = status.user
    username = (user.username if user is not None else None) or ""
    account = username.removeprefix(_SERVICE_ACCOUNT_PREFIX) if username.startswith(_SERVICE_ACCOUNT_PREFIX) else None
    if account not in settings.VGPU_NODE_SERVICE_ACCOUNTS:
        raise NotAuthenticated(
            _("%(user)s is not an agent ServiceAccount (accepted: %(accepted)s)")
            % {"user": username or _("an anonymous user"), "accepted": ", ".join(settings.VGPU_NODE_SERVICE_ACCOUNTS)}
        )
    extra = (user.extra if user is not None else None) or {}
    pod_name, pod_uid = _single(extra.get(POD_NAME_EXTRA)), _single(extra.get(POD_UID_EXTRA))
    if not pod_name or not pod_uid:
        raise NotAuthenticated(
            _("the token is not bound to a pod: mount a projected serviceAccountToken volume (audience %(audience)s)")
            % {"audience": audience}
        )
    namespace = account.split(":", 1)[0]
    pod = _read_pod(namespace, pod_name)
    where = f"{namespace}/{pod_name}"
    if pod is None:
        raise NotAuthenticated(_("the token's pod %(pod)s no longer exists") % {"pod": where})
    if (pod.get("metadata") or {}).get("uid") != pod_uid:
        raise NotAuthenticated(_("the token's pod %(pod)s was recreated; the token was its predecessor's") % {"pod": where})
    node = (pod.get("spec") or {}).get("nodeName") or ""
    if not node:
        raise NotAuthenticated(_("the token's pod %(pod)s is not scheduled on a node") % {"pod": where})
    return PodIdentity(username=username, namespace=namespace, pod=pod_name, pod_uid=pod_uid, node=node)


def _single(values: object) -> str:
    return values[0] if isinstance(values, list) and len(values) == 1 and isinstance(values[0], str) else ""


def _read_pod(namespace: str, name: str) -> dict[str, Any] | None:
    """The pod as JSON (only metadata.uid and spec.nodeName are read, so no model of the whole
    pod is built); None when it does not exist."""
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    try:
        response = _call("pod read", lambda api: client.CoreV1Api(api).read_namespaced_pod(
            name, namespace, _preload_content=False, _request_timeout=settings.VGPU_KUBE_API_TIMEOUT_S), passing=(404,))
    except ApiException as exc:
        if exc.status == 404:
            return None
        raise
    pod: dict[str, Any] = json.loads(response.data)
    return pod


def _call(what: str, request: Any, *, passing: tuple[int, ...] = ()) -> Any:
    """One request to the API server; anything but an answer (or an error status in `passing`)
    is KubeApiUnavailable. A 401 or 403 here is this service's own credential or RBAC, not the
    agent's, so it must not reach the agent as a 401."""
    from kubernetes.client.exceptions import ApiException

    try:
        return request(shared_api_client())
    except ApiException as exc:
        if exc.status in passing:
            raise
        log.error("event=kube_api_refused call=%r status=%s reason=%r body=%r", what, exc.status, exc.reason,
                  (exc.body or "")[:300])
        raise KubeApiUnavailable(f"{what}: {exc.status} {exc.reason}") from exc
    except Exception as exc:  # urllib3 connection errors and timeouts, in-cluster config missing
        log.error("event=kube_api_unreachable call=%r error=%r", what, exc)
        raise KubeApiUnavailable(f"{what}: {type(exc).__name__}: {exc}") from exc


def _node_row(identity: PodIdentity, *, now: datetime) -> Node:
    """The node's row, created (and audited, by the ServiceAccount) on its first call."""
    node = Node.objects.filter(name=identity.node).only("id", "name").first()
    if node is not None:
        return node
    with transaction.atomic():
        node, created = Node.objects.get_or_create(name=identity.node)
        if created:
            record_audit_event(
                at=now,
                actor_label=identity.username,
                action="node.registered",
                object_type="node",
                object_id=str(node.pk),
                before=None,
                after={"node": node.name, "pod": f"{identity.namespace}/{identity.pod}", "pod_uid": identity.pod_uid,
                       "via": "tokenreview"},
            )
    return node
