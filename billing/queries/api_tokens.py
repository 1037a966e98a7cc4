"""Reads for the API tokens page: platform admins see every user's tokens, anyone else their own.

The rule is here, in the query, not in the template: a user id outside the scope gets nothing."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from django.contrib.auth.models import User
from django.db.models import QuerySet

from billing.models import ApiToken
from billing.scope import Scope

__all__ = ["ApiTokenView", "get_api_token", "issuable_usernames", "list_api_tokens"]


@dataclass(frozen=True)
class ApiTokenView:
    id: int
    prefix: str
    name: str
    username: str
    created_at: datetime
    created_by: str
    expires_at: datetime | None
    revoked_at: datetime | None
    last_used_at: datetime | None
    # Neither revoked nor expired: the API accepts it.
    active: bool


def _visible(scope: Scope, user_id: int | None) -> QuerySet[ApiToken]:
    rows = ApiToken.objects.select_related("user", "created_by")
    if scope.is_admin:
        return rows
    return rows.filter(user_id=user_id) if user_id is not None else rows.none()


def _view(t: ApiToken, now: datetime) -> ApiTokenView:
    return ApiTokenView(
        id=t.pk, prefix=t.prefix, name=t.name, username=t.user.username, created_at=t.created_at,
        # Issued with `manage.py create_api_token` when no one is named (the audit log says "cli").
        created_by=t.created_by.username if t.created_by else "cli", expires_at=t.expires_at,
        revoked_at=t.revoked_at, last_used_at=t.last_used_at,
        active=t.revoked_at is None and (t.expires_at is None or t.expires_at > now),
    )


def list_api_tokens(*, scope: Scope, user_id: int | None, now: datetime) -> list[ApiTokenView]:
    """Active tokens first, newest first within each."""
    views = [_view(t, now) for t in _visible(scope, user_id)]
    return sorted(views, key=lambda v: not v.active)  # stable: keeps the newest-first order


def get_api_token(*, scope: Scope, user_id: int | None, token_id: int, now: datetime) -> ApiTokenView | None:
    t = _visible(scope, user_id).filter(pk=token_id).first()
    return None if t is None else _view(t, now)


def issuable_usernames(*, scope: Scope, user_id: int | None) -> list[str]:
    """Whom this user may issue a token for: admins any active user, anyone else themselves."""
    users = User.objects.filter(is_active=True)
    if not scope.is_admin:
        users = users.filter(pk=user_id) if user_id is not None else users.none()
    return list(users.order_by("username").values_list("username", flat=True))
