"""`Authorization: Bearer vgla_…` for the read API (DRF's default authentication, before the
session cookie). The request then runs as the token's user, and its scope is that user's role:
`billing.scope.get_scope(request.user)`, exactly as on the pages.

The agent endpoints and the admission webhook set their own (empty) authentication classes and
check their callers themselves, so this never sees a node token; a bearer token that is not an
API token is left alone here (another class, or the view, may know it)."""

from __future__ import annotations

from django.contrib.auth.models import User
from django.utils import timezone
from rest_framework import exceptions
from rest_framework.authentication import BaseAuthentication
from rest_framework.request import Request

from billing.errors import NotAuthenticated, Overloaded
from billing.services.identity import API_TOKEN_PREFIX, authenticate_api_token, client_address_of

__all__ = ["ApiTokenAuthentication"]

# The WWW-Authenticate challenge of every 401, as the agent endpoints send it (billing.api.errors).
CHALLENGE = 'Bearer realm="vgpu-ledger"'


class ApiTokenAuthentication(BaseAuthentication):  # type: ignore[misc]  # DRF ships no type hints
    def authenticate(self, request: Request) -> tuple[User, None] | None:
        scheme, _, token = request.headers.get("Authorization", "").partition(" ")
        token = token.strip()
        if scheme.lower() != "bearer" or not token.startswith(API_TOKEN_PREFIX):
            return None
        try:
            user = authenticate_api_token(token, now=timezone.now(), client=client_address_of(request.META))
        except Overloaded as exc:
            # Too many failures from this address (billing.services.identity.auth_throttle): DRF's 429, with
            # Retry-After, in the API's error shape like the 401 below.
            raise exceptions.Throttled(wait=exc.retry_after_s, detail=str(exc)) from exc
        except NotAuthenticated as exc:
            # DRF's own exception, so the request is marked unauthenticated and the 401 carries
            # the challenge below (billing.api.errors renders it in the API's error shape).
            raise exceptions.AuthenticationFailed(str(exc)) from exc
        # A bearer token is not sent by browsers on their own, so no CSRF check applies (DRF's
        # SessionAuthentication keeps checking it for cookies). `request.auth` stays None: the clear
        # token goes nowhere a log or a view could copy it from.
        return user, None

    def authenticate_header(self, request: Request) -> str:
        """Makes DRF answer 401 (not 403) to a request with no credential at all."""
        return CHALLENGE
