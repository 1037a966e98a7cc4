"""The one place where domain errors become HTTP responses."""

from __future__ import annotations

from typing import Any

from rest_framework.response import Response
from rest_framework.views import exception_handler as drf_exception_handler

from billing import errors

__all__ = ["domain_error_response", "exception_handler"]

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
    return drf_exception_handler(exc, context)
