"""Role checks for pages: one place that turns a user into a Scope or a 403. Which rows a user
may see is still decided in the queries (by the Scope); these only gate whole pages."""

from __future__ import annotations

from django.core.exceptions import PermissionDenied
from django.http import HttpRequest

from billing.scope import Scope, get_scope

__all__ = ["require_admin", "require_platform"]


def require_admin(request: HttpRequest, reason: str) -> Scope:
    """Platform admins only; `reason` is the 403's message."""
    scope = get_scope(request.user)
    if not scope.is_admin:
        raise PermissionDenied(reason)
    return scope


def require_platform(request: HttpRequest, reason: str) -> Scope:
    """Finance or admins: pages about every tenant at once."""
    scope = get_scope(request.user)
    if not scope.sees_platform:
        raise PermissionDenied(reason)
    return scope
