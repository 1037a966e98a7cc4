"""Pool rebalance plans (finance reads, admins decide): the latest plans with their moves, savings,
right-sizing and what an execution did; approve through a confirmation page, reject by POST.

Approving is Django's confirm-then-act pattern on one URL: GET shows the confirmation page, which
names every node to cordon and pod to evict; its Confirm button POSTs the plan's confirmation code
back, and only a POST carrying it approves (and enqueues the execution). Thin: one service call
per action."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse, HttpResponseNotAllowed
from django.shortcuts import get_object_or_404, redirect, render
from django.utils import timezone
from django.utils.translation import gettext as _
from django.views.decorators.http import require_http_methods

from billing import tasks
from billing.api.errors import QUEUE_DOWN
from billing.errors import InvalidInput
from billing.models import RebalancePlan, RebalanceStatus
from billing.services.fleet import (
    CapacityLine,
    ExecutionStep,
    approve_plan,
    capacity_lines,
    confirmation_code,
    counts_whole_nodes,
    execution_outcome,
    plan_steps,
    reject_plan,
    unapprove_unqueued_plan,
)
from billing.web.access import require_admin, require_platform


@dataclass(frozen=True)
class PlanPage:
    """One plan as the page shows it: the stored plan and what is derived from it."""

    plan: RebalancePlan
    steps: list[ExecutionStep]
    outcome: str | None
    capacity: list[CapacityLine]

    @property
    def carried_out(self) -> int:
        return sum(s.carried_out for s in self.steps)

    @property
    def executed(self) -> bool:
        return bool(self.plan.log)

    @property
    def whole_nodes(self) -> bool:
        return counts_whole_nodes(self.plan)

    @property
    def sizing_window(self) -> tuple[datetime, datetime, int] | None:
        """The first and last metered minute right-sizing read, and how many it read (None for a
        plan proposed before plans stored them)."""
        sizing = self.plan.right_sizing
        first, last = sizing.get("first_minute"), sizing.get("last_minute")
        if not first or not last:
            return None
        return datetime.fromisoformat(first), datetime.fromisoformat(last), int(sizing.get("steps", 0))


def _require_admin(request: HttpRequest) -> None:
    require_admin(request, "rebalance plans are for admins")


@login_required
def rebalance_list(request: HttpRequest) -> HttpResponse:
    # Finance reads plans and their savings; only admins decide.
    require_platform(request, "rebalance plans are for finance and admins")
    plans = RebalancePlan.objects.select_related("decided_by").order_by("-created_at", "-id")[:10]
    pages = [PlanPage(plan=p, steps=plan_steps(p), outcome=execution_outcome(p), capacity=capacity_lines(p))
             for p in plans]
    return render(request, "billing/rebalance.html", {"plans": pages})


@login_required
@require_http_methods(["GET", "POST"])
def rebalance_decide(request: HttpRequest, plan_id: int, decision: str) -> HttpResponse:
    _require_admin(request)
    if decision == "approve" and request.method == "GET":
        return _confirmation_page(request, plan_id)
    if request.method != "POST":
        return HttpResponseNotAllowed(["POST"])
    if decision == "approve":
        return _approve(request, plan_id)
    try:
        reject_plan(plan_id, now=timezone.now(), actor_label=request.user.get_username(), actor_id=request.user.pk)
    except InvalidInput as exc:
        messages.error(request, str(exc))
    else:
        messages.success(request, _("Plan %(id)s rejected.") % {"id": plan_id})
    return redirect("rebalance")


def _confirmation_page(request: HttpRequest, plan_id: int) -> HttpResponse:
    plan = get_object_or_404(RebalancePlan, pk=plan_id)
    if plan.status != RebalanceStatus.PROPOSED:
        messages.error(request, _("Plan %(id)s is %(status)s: only a proposed plan can be approved.")
                       % {"id": plan_id, "status": plan.get_status_display()})
        return redirect("rebalance")
    if not plan.moves:
        messages.error(request, _("Plan %(id)s frees no node: there is nothing to approve.") % {"id": plan_id})
        return redirect("rebalance")
    steps = plan_steps(plan)
    return render(request, "billing/rebalance_confirm.html", {
        "plan": plan, "confirmation": confirmation_code(plan), "whole_nodes": counts_whole_nodes(plan),
        "cordons": [s for s in steps if s.kind == "cordon"], "evictions": [s for s in steps if s.kind == "evict"],
    })


def _approve(request: HttpRequest, plan_id: int) -> HttpResponse:
    confirmation = request.POST.get("confirmation", "")
    if not confirmation:
        # Nothing executes without the confirmation page: send the admin there.
        messages.error(request, _("Review the nodes to cordon and the pods to evict, then confirm."))
        return redirect("rebalance-decide", plan_id=plan_id, decision="approve")
    try:
        # Committed before the message is queued, so the worker never reads it still proposed.
        plan = approve_plan(plan_id, confirmation=confirmation, now=timezone.now(),
                            actor_label=request.user.get_username(), actor_id=request.user.pk)
    except InvalidInput as exc:
        messages.error(request, str(exc))
        return redirect("rebalance")
    try:
        tasks.execute_rebalance.delay(plan.pk)
    except QUEUE_DOWN as exc:
        # Nothing was queued: an "approved" plan would wait for ever. It goes back to proposed
        # (audited) and the page says so; approving again once the queue is back queues it.
        unapprove_unqueued_plan(plan.pk, now=timezone.now(), reason=f"task queue unreachable: {exc}",
                                actor_label=request.user.get_username(), actor_id=request.user.pk)
        messages.error(request, _("Plan %(id)s could not be queued for execution: the task queue is unreachable. "
                                  "Nothing was executed and the plan is proposed again: approve it once the "
                                  "queue is back.") % {"id": plan_id})
        return redirect("rebalance")
    messages.success(request, _("Plan %(id)s approved; it is being executed: its outcome shows below once "
                                "the execution ends (reload the page).") % {"id": plan_id})
    return redirect("rebalance")
