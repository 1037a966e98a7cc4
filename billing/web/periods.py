"""Billing periods page (finance and admins): which months can be closed, close one as a Celery
job, watch its progress (read from the period row, so it survives a reload and works across web
processes), resume a close whose job went quiet (stalled). Thin: parse, one query or one service
call, render."""

from __future__ import annotations

from collections.abc import Callable
from datetime import date

from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import redirect, render
from django.utils import timezone
from django.utils.translation import gettext as _
from django.views.decorators.http import require_GET, require_POST

from billing import tasks
from billing.calendar import parse_month
from billing.errors import InvalidInput
from billing.queries.periods import PeriodState, get_billing_period, list_billing_periods
from billing.queries.snapshot import one_snapshot
from billing.scope import Scope
from billing.services.invoicing import list_unpriced, request_period_close, resume_period_close
from billing.web.access import require_platform
from billing.web.forms import MAX_DATE, MIN_DATE


def _month(text: str) -> date:
    """The month of a URL, bounded as the pages' dates are (billing.web.forms): 9999-12 parses, but
    the month after it, its end, does not exist."""
    month = parse_month(text)
    if not MIN_DATE <= month <= MAX_DATE:
        raise InvalidInput(_("Enter a month from %(min)s to %(max)s.") % {"min": f"{MIN_DATE:%Y-%m}",
                                                                        "max": f"{MAX_DATE:%Y-%m}"})
    return month


def _platform_scope(request: HttpRequest) -> Scope:
    return require_platform(request, "closing a billing period invoices every tenant: finance and admins only")


def _render_list(request: HttpRequest, scope: Scope, *, error: str = "", status: int = 200) -> HttpResponse:
    periods = list_billing_periods(scope=scope, now=timezone.now())
    refresh = any(p.state == PeriodState.CLOSING for p in periods)
    # Each month's unpriced usage, by GPU model with the tenants on it: the item to resolve, which
    # never holds the close (read only for the months that have any).
    rows = [(p, list_unpriced(p.month) if p.unpriced_gpu_hours else []) for p in periods]
    return render(request, "billing/periods.html",
                  {"periods": periods, "rows": rows, "refresh": refresh, "error": error,
                   "split_shown": any(p.split for p in periods)}, status=status)


@login_required
@require_GET
@one_snapshot()
def period_list(request: HttpRequest) -> HttpResponse:
    return _render_list(request, _platform_scope(request))


@login_required
@require_POST
def period_close(request: HttpRequest, month: str) -> HttpResponse:
    return _period_action(request, month, request_period_close)


@login_required
@require_POST
def period_resume(request: HttpRequest, month: str) -> HttpResponse:
    """Enqueue a stalled close again (audited). A close that is moving or done is left alone."""
    return _period_action(request, month, resume_period_close)


def _period_action(request: HttpRequest, month: str, action: Callable[..., object]) -> HttpResponse:
    """Request or resume a close; a refusal re-renders the list with its reason and a 400."""
    scope = _platform_scope(request)
    try:
        action(month=_month(month), now=timezone.now(), actor_label=request.user.get_username(),
               actor_id=request.user.pk, enqueue=tasks.close_period.delay)
    except InvalidInput as exc:
        return _render_list(request, scope, error=str(exc), status=400)
    return redirect("period-list")


@login_required
@require_GET
def period_status(request: HttpRequest, month: str) -> JsonResponse:
    scope = _platform_scope(request)
    try:
        period = get_billing_period(scope=scope, month=_month(month), now=timezone.now())
    except InvalidInput as exc:
        return JsonResponse({"error": str(exc)}, status=400)
    return JsonResponse(period.as_json())
