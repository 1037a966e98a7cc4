"""The Content-Security-Policy header on every answer (pages, API, errors, static files).

The pages load their one script and one stylesheet from /static/ and carry no inline script, no
event-handler attribute, no style= attribute and no javascript: URL (tests/billing/test_csp.py
checks every template), so the policy needs no 'unsafe-inline' for scripts or styles: an
injected <script>, onerror= or style= does nothing even where escaping were ever to fail. Charts
are inline SVG, whose geometry is attributes, not styles. No new dependency: the policy is one
constant, set by this middleware, unless a view set its own."""

from __future__ import annotations

from collections.abc import Callable

from django.conf import settings
from django.http import HttpRequest, HttpResponse

__all__ = ["ContentSecurityPolicyMiddleware"]


class ContentSecurityPolicyMiddleware:
    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response
        self.policy = settings.VGPU_CONTENT_SECURITY_POLICY

    def __call__(self, request: HttpRequest) -> HttpResponse:
        response = self.get_response(request)
        if self.policy and "Content-Security-Policy" not in response.headers:
            response.headers["Content-Security-Policy"] = self.policy
        return response
