"""The one place where domain errors, and outages of what the service depends on, become HTTP
responses."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import kombu.exceptions
import redis.exceptions
from django.conf import settings
from django.db import InterfaceError, OperationalError
from django.http import HttpRequest, HttpResponse, JsonResponse
from rest_framework.exceptions import APIException
from rest_framework.response import Response
from rest_framework.views import exception_handler as drf_exception_handler

from billing import errors
from billing.services.identity import KubeApiUnavailable

__all__ = ["QUEUE_DOWN", "OutageMiddleware", "domain_error_response", "exception_handler"]

log = logging.getLogger(__name__)

_STATUS = {
    errors.InvalidBatch: 400,
    errors.InvalidInput: 400,
    errors.NotAuthenticated: 401,
    errors.Forbidden: 403,
    errors.BatchConflict: 409,
    errors.PayloadTooLarge: 413,
    errors.UnsupportedMediaType: 415,
    errors.Overloaded: 429,
}


def domain_error_response(exc: errors.DomainError) -> Response:
    status = next((code for cls, code in _STATUS.items() if isinstance(exc, cls)), 400)
    headers: dict[str, str] = {}
    if isinstance(exc, errors.InvalidBatch):
        body: dict[str, Any] = {"errors": [e.as_dict() for e in exc.errors]}
    else:
        body = {"errors": [{"path": "$", "message": str(exc)}]}
    if isinstance(exc, errors.NotAuthenticated):
        headers["WWW-Authenticate"] = 'Bearer realm="vgpu-ledger"'
    if isinstance(exc, errors.Overloaded):
        headers["Retry-After"] = str(exc.retry_after_s)
    return Response(body, status=status, headers=headers)


def exception_handler(exc: Exception, context: dict[str, Any]) -> Response | None:
    if isinstance(exc, errors.DomainError):
        return domain_error_response(exc)
    response = drf_exception_handler(exc, context)
    if response is not None and isinstance(exc, APIException):
        # DRF's own refusals (401 from ApiTokenAuthentication, 403, 404, 405, 406, 415) in the one
        # error shape every API answer has; DRF has already set WWW-Authenticate, Allow, Retry-After.
        response.data = {"errors": _drf_errors(exc.detail, "$")}
    return response


def _drf_errors(detail: Any, path: str) -> list[dict[str, str]]:
    """DRF's detail (a message, a list of them, or messages by field) as {"path", "message"}s."""
    if isinstance(detail, dict):
        return [e for key, value in detail.items()
                for e in _drf_errors(value, path if key == "non_field_errors" else f"{path}.{key}")]
    if isinstance(detail, list):
        return [e for item in detail for e in _drf_errors(item, path)]
    return [{"path": path, "message": str(detail)}]


# What a request may meet when a service it depends on is down, and the name the caller is told.
QUEUE_DOWN = (kombu.exceptions.OperationalError, redis.exceptions.ConnectionError, redis.exceptions.TimeoutError)
_OUTAGES: tuple[tuple[tuple[type[BaseException], ...], str], ...] = (
    ((OperationalError, InterfaceError), "the database"),
    (QUEUE_DOWN, "the task queue (Redis)"),
    ((KubeApiUnavailable,), "the Kubernetes API server (TokenReview)"),
)


class OutageMiddleware:
    """A request that meets a database or Redis outage answers 503 with Retry-After, as JSON (the
    agent API's error shape) or as a short page: never an HTML 500. Agents keep their batch in
    the spool and retry after the given seconds; nothing was half-written, since each write is one
    transaction that the outage rolled back."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        return self.get_response(request)

    def process_exception(self, request: HttpRequest, exception: Exception) -> HttpResponse | None:
        down = next((name for kinds, name in _OUTAGES if isinstance(exception, kinds)), None)
        if down is None:
            return None
        log.error("event=dependency_down dependency=%r path=%s error=%s", down, request.path, exception)
        retry = str(settings.VGPU_OUTAGE_RETRY_AFTER_S)
        message = f"{down} is unavailable; nothing was stored, retry in {retry} s"
        if request.path.startswith("/api/"):
            response: HttpResponse = JsonResponse({"errors": [{"path": "$", "message": message}]}, status=503)
        else:
            response = HttpResponse(message, status=503, content_type="text/plain; charset=utf-8")
        response["Retry-After"] = retry
        return response
