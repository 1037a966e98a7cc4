"""Budgets (everyone sees their own; admins set them) and SLA tier weights (admins). Thin:
forms validate, one service call, render. Every change is audited by the service."""

from __future__ import annotations

from decimal import Decimal

from django import forms
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.db import transaction
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.utils import timezone
from django.utils.translation import gettext as _
from django.utils.translation import gettext_lazy

from billing import tasks
from billing.errors import InvalidInput
from billing.models import AuditEvent, BudgetAction, SlaTier, Tenant
from billing.queries.budgets import list_budgets
from billing.queries.scope import get_scope
from billing.services.budgets import set_budget
from billing.services.sla import set_sla_tier_weight


class BudgetForm(forms.Form):
    amount = forms.DecimalField(label=gettext_lazy("Monthly budget"), min_value=Decimal("0.01"), decimal_places=2)
    currency = forms.CharField(label=gettext_lazy("Currency"), max_length=3, initial="USD")
    soft_threshold_pct = forms.DecimalField(label=gettext_lazy("Warn at (%)"), initial=Decimal(80), min_value=1)
    hard_threshold_pct = forms.DecimalField(label=gettext_lazy("Enforce at (%)"), initial=Decimal(100), min_value=1)
    hard_action = forms.ChoiceField(label=gettext_lazy("Action when enforced"), choices=BudgetAction.choices)
    throttle_factor = forms.DecimalField(label=gettext_lazy("Throttle factor"), initial=Decimal("0.5"),
                                         min_value=Decimal("0.001"), max_value=1)
    owner = forms.CharField(label=gettext_lazy("Who can raise it"), max_length=200)
    notify_emails = forms.CharField(label=gettext_lazy("Notify (emails)"), required=False)
    webhook_url = forms.URLField(label=gettext_lazy("Webhook URL"), required=False, assume_scheme="https")


@login_required
def budgets(request: HttpRequest) -> HttpResponse:
    scope = get_scope(request.user)
    views = list_budgets(scope=scope, now=timezone.now())
    without = (
        Tenant.objects.filter(budget__isnull=True).order_by("slug") if scope.is_admin else Tenant.objects.none()
    )
    return render(request, "billing/budgets.html", {"budgets": views, "without_budget": without})


@login_required
def budget_edit(request: HttpRequest, tenant: str) -> HttpResponse:
    """Admins set or change one tenant's budget; the form starts from its current values, and the
    webhook secret is kept unless changed elsewhere."""
    if not get_scope(request.user).is_admin:
        raise PermissionDenied("only admins set budgets")
    row = Tenant.objects.filter(slug=tenant).select_related("budget").first()
    if row is None:
        raise Http404("no such tenant")
    existing = getattr(row, "budget", None)
    initial = {f: getattr(existing, f) for f in BudgetForm.base_fields} if existing else None
    form = BudgetForm(request.POST or None, initial=initial)
    if request.method == "POST" and form.is_valid():
        try:
            set_budget(tenant_slug=tenant, values=dict(form.cleaned_data), now=timezone.now(),
                       actor_label=request.user.get_username(), actor_id=request.user.pk)
        except InvalidInput as exc:
            form.add_error(None, str(exc))
        else:
            # Re-evaluate at once rather than at the next minute's beat.
            transaction.on_commit(tasks.evaluate_budgets.delay)
            messages.success(request, _("Budget of %(tenant)s saved.") % {"tenant": tenant})
            return redirect("budgets")
    return render(request, "billing/budget_edit.html", {"tenant": row, "form": form},
                  status=400 if form.errors else 200)


@login_required
def sla_tiers(request: HttpRequest) -> HttpResponse:
    scope = get_scope(request.user)
    if not scope.is_admin:
        raise PermissionDenied("SLA tiers are for admins")
    error = None
    if request.method == "POST":
        try:
            set_sla_tier_weight(slug=request.POST.get("slug", ""), weight=request.POST.get("weight", ""),
                                now=timezone.now(), actor_label=request.user.get_username(),
                                actor_id=request.user.pk)
        except InvalidInput as exc:
            error = str(exc)
        else:
            messages.success(request, _("Weight saved; agents apply it at their next policy poll."))
            return redirect("sla-tiers")
    return render(request, "billing/sla_tiers.html", {"tiers": SlaTier.objects.order_by("-weight"), "error": error},
                  status=400 if error else 200)


@login_required
def audit_log(request: HttpRequest) -> HttpResponse:
    """The latest audit events, newest first; `?action=budget.` filters by action prefix."""
    if not get_scope(request.user).is_admin:
        raise PermissionDenied("the audit log is for admins")
    action = request.GET.get("action", "").strip()[:100]
    events = AuditEvent.objects.select_related("actor").order_by("-at", "-id")
    if action:
        events = events.filter(action__startswith=action)
    return render(request, "billing/audit_log.html", {"events": events[:200], "action": action})
