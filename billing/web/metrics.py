"""GET /metrics: Prometheus text for the scraper that presents the bearer token.

Prometheus has no session, so the endpoint takes `Authorization: Bearer <VGPU_METRICS_TOKEN>`
(Prometheus: `authorization.credentials_file`). The figures name nodes and the fleet's cost; with
no token configured nobody may read them, and the answer says what to set."""

from __future__ import annotations

from collections.abc import Callable

from django.http import HttpRequest, HttpResponse
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET

from billing.metrics import render_metrics, render_opencost_metrics, scrape_token
from billing.services.identity import presents_bearer

# The classic text format, which every Prometheus 2.x parses; render_metrics writes it (our names
# need none of the 1.0.0 format's escaping).
_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


@never_cache
@require_GET
def metrics(request: HttpRequest) -> HttpResponse:
    return _scrape(request, render_metrics)


@never_cache
@require_GET
def opencost_metrics(request: HttpRequest) -> HttpResponse:
    """OpenCost's GPU families (billing.metrics.OpenCostCollector), behind the same scrape token."""
    return _scrape(request, render_opencost_metrics)


def _scrape(request: HttpRequest, render: Callable[[], bytes]) -> HttpResponse:
    token, problem = scrape_token()
    if problem:
        return HttpResponse(f"/metrics is off: {problem} (docs/operations.md, Metrics)\n", status=403,
                            content_type="text/plain; charset=utf-8")
    if not presents_bearer(request.headers.get("Authorization", ""), token):
        response = HttpResponse("/metrics needs the scrape bearer token\n", status=401,
                                content_type="text/plain; charset=utf-8")
        response["WWW-Authenticate"] = 'Bearer realm="vgpu-ledger-metrics"'
        return response
    return HttpResponse(render(), content_type=_CONTENT_TYPE)
