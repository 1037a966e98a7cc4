"""The page a locked-out login gets, and the hook that audits each lockout (django-axes).

Both are edges: axes decides who is locked out; billing.services.identity.logins records it."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.utils import timezone

from billing.services.identity import client_address_of, record_login_lockout

__all__ = ["audit_lockout", "client_address", "locked_out_response"]


def client_address(request: HttpRequest) -> str | None:
    """AXES_CLIENT_IP_CALLABLE: the address failures are counted against, the same one the token
    throttle counts (billing.services.identity.auth_throttle.client_address_of)."""
    return client_address_of(request.META) or None


def attempted_username(request: HttpRequest, credentials: dict[str, Any] | None = None) -> str:
    """The username a failed login is counted under, cut to the attempts table's 255 characters
    and without NUL: a longer one was a database error (a 500) on the login page. No real
    username is that long (Django's are at most 150), so no two users' lockouts merge."""
    name = (credentials or {}).get("username") or request.POST.get("username", "")
    return str(name).replace("\x00", "")[:255]


def locked_out_response(request: HttpRequest, original_response: HttpResponse | None = None,
                        credentials: dict[str, Any] | None = None) -> HttpResponse:
    """AXES_LOCKOUT_CALLABLE: a page in the site's style, in the user's language, 429 like axes'
    own answer. It names no account state beyond what the login form already revealed."""
    minutes = int(settings.AXES_COOLOFF_TIME.total_seconds() // 60)
    return render(request, "registration/locked_out.html",
                  {"cool_off_minutes": minutes, "failure_limit": settings.AXES_FAILURE_LIMIT}, status=429)


def audit_lockout(sender: object, request: HttpRequest, username: str | None, ip_address: str | None,
                  **kwargs: Any) -> None:
    """Receiver of axes.signals.user_locked_out."""
    record_login_lockout(username=username or "", ip_address=ip_address or "", failure_limit=settings.AXES_FAILURE_LIMIT,
                         cool_off=settings.AXES_COOLOFF_TIME, now=timezone.now())
