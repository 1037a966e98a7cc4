"""Role checks for pages: one place that turns a user into a Scope or a 403. Which rows a user
may see is still decided in the queries (by the Scope); these only gate whole pages."""

from __future__ import annotations

from django.contrib.auth import views as auth_views
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.urls import reverse
from django.utils.translation import gettext as _

from billing.scope import Scope, get_scope

__all__ = ["LoginView", "RoleRequired", "issued_token_page", "landing_page", "landing_url", "require_admin",
           "require_platform"]


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


def landing_url(scope: Scope) -> str:
    """Where `landing_page` leads, in one step: a member of one tenant straight to its portal."""
    if scope.tenants is not None and len(scope.tenants) == 1:
        return reverse("tenant-portal", args=[next(iter(scope.tenants))])
    return reverse(landing_page(scope))


class LoginView(auth_views.LoginView):
    """Django's login, answering with the role's own page rather than "/" (which redirects there):
    one round trip fewer after the password check. An explicit `?next=` on this site still wins."""

    def get_default_redirect_url(self) -> str:
        return landing_url(get_scope(self.request.user))


def issued_token_page(request: HttpRequest, template: str, issued: object) -> HttpResponse:
    """The page that shows a new token once (node or API token): never stored by a browser or a
    proxy, since the token is a secret and the service keeps only its hash."""
    response = render(request, template, {"issued": issued, "server": request.build_absolute_uri("/").rstrip("/")})
    response["Cache-Control"] = "no-store"
    return response
