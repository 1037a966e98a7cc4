"""The Content-Security-Policy header on every answer (pages, API, errors, static files).

The pages load their one script and one stylesheet from /static/ and carry no inline script, no
event-handler attribute, no style= attribute and no javascript: URL (tests/billing/test_csp.py
checks every template), so the policy needs no 'unsafe-inline' for scripts or styles: an
injected <script>, onerror= or style= does nothing even where escaping were ever to fail. Charts
are inline SVG, whose geometry is attributes, not styles. No new dependency: the policy is one
constant, set by this middleware, unless a view set its own.

One exception: DRF's browsable API (what a browser gets from the read API, e.g. /allocation)
is DRF's own template, which carries style= attributes. It gets the same policy with
'unsafe-inline' for styles alone (never scripts): a style cannot run code, and rewriting a
third-party template would be a fork to maintain. The browser walk found it."""

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
            renderer = getattr(response, "accepted_renderer", None)
            browsable = getattr(renderer, "format", None) == "api"
            response.headers["Content-Security-Policy"] = (
                self.policy.replace("style-src 'self'", "style-src 'self' 'unsafe-inline'") if browsable
                else self.policy)
        return response
