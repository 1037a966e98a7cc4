"""Server-rendered pages. Thin: parse the request, call one query, render."""

from __future__ import annotations

import csv

from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.utils import timezone
from django.utils.translation import gettext as _

from billing.queries.finance import get_cost_summary
from billing.queries.scope import get_scope
from billing.web.forms import PeriodForm


@login_required
def finance_overview(request: HttpRequest) -> HttpResponse:
    today = timezone.now().date()
    form = PeriodForm(request.GET or None, initial=PeriodForm.default_initial(today))
    if not request.GET:
        form = PeriodForm(PeriodForm.default_initial(today))
    summary = None
    if form.is_valid():
        start, end = form.bounds()
        summary = get_cost_summary(scope=get_scope(request.user), start=start, end=end)
        if request.GET.get("format") == "csv":
            return _summary_csv(summary)
    status = 200 if form.is_valid() else 400
    live = summary is not None and summary.end > timezone.now()
    max_total = max((t.total for t in summary.tenants), default=0) if summary else 0
    return render(
        request,
        "billing/finance_overview.html",
        {"form": form, "summary": summary, "live": live, "max_total": max_total},
        status=status,
    )


def _summary_csv(summary) -> HttpResponse:
    response = HttpResponse(content_type="text/csv; charset=utf-8")
    name = f"gpu-cost-{summary.start:%Y%m%d}-{summary.end:%Y%m%d}.csv"
    response["Content-Disposition"] = f'attachment; filename="{name}"'
    writer = csv.writer(response)
    writer.writerow(["tenant", "name", "charge", "idle_share", "total", "currency", "gpu_hours_equivalent",
                     "mem_used_gb_h", "sm_used_h", "workloads"])
    for t in summary.tenants:
        writer.writerow([t.tenant, t.name, t.charge, t.idle_share, t.total, summary.currency,
                         t.gpu_hours_equivalent, t.mem_used_gb_h, t.sm_used_h, t.workloads])
    if summary.total_gpu_cost is not None:
        writer.writerow(["(idle, platform)", _("Idle (platform)"), summary.idle_platform, "", summary.idle_platform,
                         summary.currency, "", "", "", ""])
        writer.writerow(["(total)", _("Total GPU cost"), "", "", summary.total_gpu_cost, summary.currency,
                         summary.metered_gpu_hours, "", "", ""])
    return response
