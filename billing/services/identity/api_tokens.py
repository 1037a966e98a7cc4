"""API tokens for the read API: issued once in clear, stored as SHA-256, revocable, optionally
expiring, every change audited. A token acts as its user with exactly the user's role
(billing.scope.get_scope), so it never sees more than that person would on the pages.

Node tokens (billing.services.identity.tokens) are the model: same hashing, same once-a-minute record of
use; only the prefix differs (`vgla_`), so the two kinds are never confused."""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.contrib.auth.models import User
from django.db import transaction

from billing.errors import InvalidInput, NotAuthenticated
from billing.models import ApiToken
from billing.services.audit import record_audit_event
from billing.services.identity.auth_throttle import check_not_throttled, note_failure, note_valid_token
from billing.services.identity.tokens import API_TOKEN_PREFIX, note_token_use, token_sha256

__all__ = ["MAX_EXPIRY_DAYS", "MAX_NAME_LENGTH", "IssuedApiToken", "authenticate_api_token", "expiry_after_days",
           "issue_api_token", "revoke_api_token"]

MAX_NAME_LENGTH = 100
# Ten years: longer is "never" in all but name, and a date that far out overflows no one's parser.
MAX_EXPIRY_DAYS = 3650


@dataclass(frozen=True)
class IssuedApiToken:
    token: str
    token_id: int
    prefix: str
    username: str
    name: str
    expires_at: datetime | None


def expiry_after_days(days: int | None, *, now: datetime) -> datetime | None:
    """The expiry `days` whole days from `now` (None: never). 1 to MAX_EXPIRY_DAYS, or a 400."""
    if days is None:
        return None
    if not 1 <= days <= MAX_EXPIRY_DAYS:
        raise InvalidInput(f"expiry must be 1 to {MAX_EXPIRY_DAYS} days, not {days}")
    return now + timedelta(days=days)


def issue_api_token(*, username: str, name: str, expires_at: datetime | None, now: datetime, actor_label: str,
                    actor_id: int | None = None, actor_is_admin: bool = True) -> IssuedApiToken:
    """A new token for `username`. Admins (and `manage.py`, which passes no actor id) issue for
    anyone; anyone else only for themselves. The clear token is returned once, never stored."""
    name = name.strip()
    if len(name) > MAX_NAME_LENGTH:
        raise InvalidInput(f"token name is {len(name)} characters; at most {MAX_NAME_LENGTH}")
    if expires_at is not None and expires_at <= now:
        raise InvalidInput("expiry must be in the future")
    user = User.objects.filter(username=username).first()
    if user is None:
        raise InvalidInput(f"no user named {username!r}")
    if not user.is_active:
        raise InvalidInput(f"user {username!r} is inactive; a token of theirs would be refused")
    if not actor_is_admin and actor_id != user.pk:
        raise InvalidInput("only platform admins issue tokens for other users")
    token = API_TOKEN_PREFIX + secrets.token_urlsafe(32)
    with transaction.atomic():
        row = ApiToken.objects.create(user=user, token_sha256=token_sha256(token), prefix=token[:13], name=name,
                                      created_at=now, created_by_id=actor_id, expires_at=expires_at)
        record_audit_event(
            at=now, actor_id=actor_id, actor_label=actor_label, action="api_token.issued", object_type="api_token",
            object_id=str(row.pk), before=None,
            after={"user": user.username, "prefix": row.prefix, "name": name,
                   "expires_at": expires_at.isoformat() if expires_at else None},
        )
    note_valid_token(token_sha256(token), force=True)  # a block of its address never refuses it
    return IssuedApiToken(token=token, token_id=row.pk, prefix=row.prefix, username=user.username, name=name,
                          expires_at=expires_at)


def revoke_api_token(*, token_id: int, now: datetime, actor_label: str, actor_id: int | None = None,
                     actor_is_admin: bool = True) -> None:
    """Revoke one token (again: nothing happens). Someone other than an admin may revoke only their
    own, and is told of no other token, as if it did not exist."""
    with transaction.atomic():
        row = ApiToken.objects.select_for_update().select_related("user").filter(pk=token_id).first()
        if row is None or (not actor_is_admin and row.user_id != actor_id):
            raise InvalidInput(f"no API token with id {token_id}")
        if row.revoked_at is not None:
            return
        row.revoked_at = now
        row.save(update_fields=["revoked_at"])
        record_audit_event(
            at=now, actor_id=actor_id, actor_label=actor_label, action="api_token.revoked", object_type="api_token",
            object_id=str(row.pk),
            before={"user": row.user.username, "prefix": row.prefix, "revoked_at": None},
            after={"user": row.user.username, "prefix": row.prefix, "revoked_at": now.isoformat()},
        )


def authenticate_api_token(token: str, *, now: datetime, client: str | None = None) -> User:
    """The user whose token this is, or NotAuthenticated saying why (unknown, revoked, expired,
    inactive user): all 401, since presenting another credential is the caller's only remedy.
    With the caller's address `client`, failures are throttled (billing.services.identity.auth_throttle):
    Overloaded (429) once it is over the limit, before any look-up, unless the token is known valid."""
    digest = token_sha256(token)
    check_not_throttled(client=client, token_sha256=digest)
    try:
        user = _authenticate(digest, now=now)
    except NotAuthenticated:
        note_failure(client=client, kind="api")
        raise
    note_valid_token(digest)
    return user


def _authenticate(digest: str, *, now: datetime) -> User:
    # One indexed look-up on the hashed token, joined to its user.
    row = ApiToken.objects.select_related("user").filter(token_sha256=digest).first()
    if row is None:
        raise NotAuthenticated("unknown API token")
    if row.revoked_at is not None:
        raise NotAuthenticated(f"API token {row.prefix}… was revoked")
    if row.expires_at is not None and row.expires_at <= now:
        raise NotAuthenticated(f"API token {row.prefix}… expired")
    if not row.user.is_active:
        raise NotAuthenticated(f"API token {row.prefix}… belongs to an inactive user")
    note_token_use("billing_apitoken", row.pk)
    return row.user
