"""Role checks for pages: one place that turns a user into a Scope or a 403. Which rows a user
may see is still decided in the queries (by the Scope); these only gate whole pages."""

from __future__ import annotations

from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.utils.translation import gettext as _

from billing.scope import Scope, get_scope

__all__ = ["RoleRequired", "issued_token_page", "landing_page", "require_admin", "require_platform"]


class RoleRequired(PermissionDenied):
    """A page for some roles only. `audience` says whom, in the reader's language, for the 403 page;
    the message is the view's own note (English, for logs)."""

    def __init__(self, reason: str, *, audience: str) -> None:
        super().__init__(reason)
        self.audience = audience


def require_admin(request: HttpRequest, reason: str) -> Scope:
    """Platform admins only; `reason` is the exception's message (logs), the page names the audience."""
    scope = get_scope(request.user)
    if not scope.is_admin:
        raise RoleRequired(reason, audience=_("This page is for platform admins."))
    return scope


def require_platform(request: HttpRequest, reason: str) -> Scope:
    """Finance or admins: pages about every tenant at once."""
    scope = get_scope(request.user)
    if not scope.sees_platform:
        raise RoleRequired(reason, audience=_("This page is for finance and platform admins."))
    return scope


def landing_page(scope: Scope) -> str:
    """The URL name a role starts on after login: finance the cost dashboard (also when the user is an
    admin too: invoicing is the job that has a deadline), admins the fleet (nodes, agents, tokens),
    a tenant member their portal; a user with no role yet the dashboard, which shows them nothing."""
    if scope.is_finance:
        return "finance-overview"
    if scope.is_admin:
        return "nodes"
    if scope.tenants:
        return "tenant-list"  # which opens the portal straight away for a member of one tenant
    return "finance-overview"


def issued_token_page(request: HttpRequest, template: str, issued: object) -> HttpResponse:
    """The page that shows a new token once (node or API token): never stored by a browser or a
    proxy, since the token is a secret and the service keeps only its hash."""
    response = render(request, template, {"issued": issued, "server": request.build_absolute_uri("/").rstrip("/")})
    response["Cache-Control"] = "no-store"
    return response
