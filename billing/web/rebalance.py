"""Pool rebalance plans (finance reads, admins decide): the latest plans with their moves, savings and right-sizing;
approve / reject by POST. Thin: one service call per action; approval enqueues execution."""

from __future__ import annotations

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.db import transaction
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.utils import timezone
from django.utils.translation import gettext as _
from django.views.decorators.http import require_POST

from billing import tasks
from billing.errors import InvalidInput
from billing.models import RebalancePlan
from billing.services.rebalance import approve_plan, reject_plan
from billing.web.access import require_admin, require_platform


def _require_admin(request: HttpRequest) -> None:
    require_admin(request, "rebalance plans are for admins")


@login_required
def rebalance_list(request: HttpRequest) -> HttpResponse:
    # Finance reads plans and their savings; only admins decide.
    require_platform(request, "rebalance plans are for finance and admins")
    plans = RebalancePlan.objects.select_related("decided_by").order_by("-created_at", "-id")[:10]
    return render(request, "billing/rebalance.html", {"plans": plans})


@login_required
@require_POST
def rebalance_decide(request: HttpRequest, plan_id: int, decision: str) -> HttpResponse:
    _require_admin(request)
    decide = approve_plan if decision == "approve" else reject_plan
    try:
        with transaction.atomic():
            plan = decide(plan_id, now=timezone.now(), actor_label=request.user.get_username(),
                          actor_id=request.user.pk)
            if decision == "approve":
                transaction.on_commit(lambda: tasks.execute_rebalance.delay(plan.pk))
    except InvalidInput as exc:
        messages.error(request, str(exc))
    else:
        if decision == "approve":
            messages.success(request, _("Plan %(id)s approved; it is being executed.") % {"id": plan_id})
        else:
            messages.success(request, _("Plan %(id)s rejected.") % {"id": plan_id})
    return redirect("rebalance")
