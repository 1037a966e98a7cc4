"""Node tokens: issued once in clear, stored as SHA-256, revocable, every change audited."""

from __future__ import annotations

import hashlib
import secrets
import time
from dataclasses import dataclass
from datetime import datetime
from typing import Literal

from django.core.exceptions import ValidationError
from django.db import connection, transaction
from django.utils import timezone

from billing.errors import Forbidden, InvalidInput, NotAuthenticated
from billing.models import Node, NodeToken
from billing.models.fleet import node_name_validator
from billing.services.audit import record_audit_event
from billing.services.identity.auth_throttle import check_not_throttled, note_failure, note_valid_token
from billing.services.identity.node_identity import authenticate_service_account_token

__all__ = ["IssuedToken", "authenticate_node", "issue_node_token", "note_token_use", "revoke_node_token",
           "token_sha256"]

# (table, token id) -> monotonic time of this process's last `last_used_at` write: once a minute
# per process is enough for "when was this token last used", and keeps the hot path read-only.
_used: dict[tuple[str, int], float] = {}
_USE_WRITE_EVERY_S = 60.0

TOKEN_PREFIX = "vgl_"  # noqa: S105 - a public marker that makes leaked tokens greppable, not a secret
# The read API's tokens (billing.services.identity.api_tokens) start "vgla_": told apart from a node's by
# the prefix alone, so neither kind is ever looked up, or sent to a TokenReview, as the other.
API_TOKEN_PREFIX = "vgla_"  # noqa: S105 - as above

TokenTable = Literal["billing_nodetoken", "billing_apitoken"]


def token_sha256(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


@dataclass(frozen=True)
class IssuedToken:
    token: str
    token_id: int
    prefix: str
    node: str


def issue_node_token(*, node_name: str, now: datetime, actor_label: str, actor_id: int | None = None) -> IssuedToken:
    """Create the node if needed and a new token for it. The clear token is returned once, never stored."""
    try:
        node_name_validator(node_name)
    except ValidationError as exc:
        raise InvalidInput(f"node name {node_name!r}: {exc.messages[0]}") from exc
    token = TOKEN_PREFIX + secrets.token_urlsafe(32)
    with transaction.atomic():
        node, _ = Node.objects.get_or_create(name=node_name)
        row = NodeToken.objects.create(
            node=node, token_sha256=token_sha256(token), prefix=token[:12], created_at=now
        )
        record_audit_event(
            at=now,
            actor_id=actor_id,
            actor_label=actor_label,
            action="node_token.issued",
            object_type="node_token",
            object_id=str(row.pk),
            before=None,
            after={"node": node.name, "prefix": row.prefix},
        )
    note_valid_token(token_sha256(token), force=True)  # a block of its address never refuses it
    return IssuedToken(token=token, token_id=row.pk, prefix=row.prefix, node=node.name)


def revoke_node_token(*, token_id: int, now: datetime, actor_label: str, actor_id: int | None = None) -> None:
    with transaction.atomic():
        row = NodeToken.objects.select_for_update().select_related("node").filter(pk=token_id).first()
        if row is None:
            raise InvalidInput(f"no node token with id {token_id}")
        if row.revoked_at is not None:
            return
        row.revoked_at = now
        row.save(update_fields=["revoked_at"])
        record_audit_event(
            at=now,
            actor_id=actor_id,
            actor_label=actor_label,
            action="node_token.revoked",
            object_type="node_token",
            object_id=str(row.pk),
            before={"node": row.node.name, "prefix": row.prefix, "revoked_at": None},
            after={"node": row.node.name, "prefix": row.prefix, "revoked_at": now.isoformat()},
        )


def note_token_use(table: TokenTable, token_id: int) -> None:
    """Record that a token was used, at most once a minute per process and token (node tokens and
    API tokens alike)."""
    now = time.monotonic()
    if now - _used.get((table, token_id), -_USE_WRITE_EVERY_S) < _USE_WRITE_EVERY_S:
        return
    with connection.cursor() as cur:
        # The service's clock, not the database's: every instant the service compares is on one clock.
        # `table` is one of two literals (TokenTable), never input.
        cur.execute(f"UPDATE {table} SET last_used_at = %s WHERE id = %s",  # noqa: S608 - the table is one of two literals (see above)
                    [timezone.now(), token_id])
    _used[(table, token_id)] = now


def authenticate_node(*, authorization: str | None, node_name: str | None, client: str | None = None) -> Node:
    """Resolve `Authorization: Bearer <token>` to its node.

    A node token (`vgl_…`) is looked up here; any other bearer token is taken for the agent's
    Kubernetes ServiceAccount token and checked with a TokenReview (billing.services.identity.node_identity).
    401 for a missing or unknown token; 403 for a revoked token or one of another node. With the
    caller's address `client`, failures are throttled (billing.services.identity.auth_throttle): 429 once
    it is over the limit, before any look-up, unless the token is known valid.
    """
    if not authorization:
        raise NotAuthenticated("missing Authorization header (expected 'Bearer <node token>')")
    scheme, _, token = authorization.partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not token:
        raise NotAuthenticated("Authorization must be 'Bearer <node token>'")
    digest = token_sha256(token)
    check_not_throttled(client=client, token_sha256=digest)
    try:
        node = _authenticate_bearer(token, digest, node_name)
    except NotAuthenticated:
        note_failure(client=client, kind="node")
        raise
    note_valid_token(digest)
    return node


def _authenticate_bearer(token: str, digest: str, node_name: str | None) -> Node:
    if token.startswith(API_TOKEN_PREFIX):
        raise NotAuthenticated("this is an API token (vgla_…), for the read API; agents use a node token (vgl_…)")
    if not token.startswith(TOKEN_PREFIX):
        return authenticate_service_account_token(token=token, node_name=node_name, now=timezone.now())
    # One indexed look-up on the hashed token (hot path of every agent request).
    with connection.cursor() as cur:
        cur.execute(
            "SELECT t.id, t.prefix, t.revoked_at, n.id, n.name FROM billing_nodetoken t "
            "JOIN billing_node n ON n.id = t.node_id WHERE t.token_sha256 = %s",
            [digest],
        )
        row = cur.fetchone()
    if row is None:
        raise NotAuthenticated("unknown node token")
    token_id, prefix, revoked_at, node_id, name = row
    if revoked_at is not None:
        raise Forbidden(f"node token {prefix}… was revoked; issue a new one with create_node_token")
    if node_name is not None and node_name != name:
        raise Forbidden(f"this token belongs to node {name!r}, not {node_name!r}")
    note_token_use("billing_nodetoken", token_id)
    return Node.from_db("default", ["id", "name"], [node_id, name])
