"""Budgets (everyone sees their own; finance and admins set them, on a tenant, a namespace or a label) and SLA tiers (admins create them and change
their name, description and weight). Thin: forms validate, one service call, render. Every change
is audited by the service."""

from __future__ import annotations

from decimal import Decimal
from typing import Any, cast

from django import forms
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.db import transaction
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.utils import timezone
from django.utils.translation import gettext as _
from django.utils.translation import gettext_lazy
from django.views.decorators.http import require_POST

from billing import tasks
from billing.currencies import CURRENCY_CHOICES
from billing.errors import InvalidInput
from billing.models import Budget, BudgetAction, BudgetScope, Tenant
from billing.models.tenancy import default_miss_targets
from billing.queries.audit import list_audit_events
from billing.queries.budgets import list_budgets
from billing.queries.sla_tiers import get_sla_tier, list_sla_tiers
from billing.scope import Scope, get_scope
from billing.seeded import seeded_text
from billing.services.budgets import set_budget
from billing.services.pricing import (
    MAX_DESCRIPTION_LENGTH,
    MAX_NAME_LENGTH,
    MAX_WEIGHT,
    MIN_WEIGHT,
    change_sla_tier,
    create_sla_tier,
    retire_sla_tier,
    set_sla_tier_weight,
)
from billing.web.access import require_admin, require_platform
from billing.web.forms import RetireForm


class BudgetForm(forms.Form):
    # Bounded as the columns are (max_digits): an amount too long for the column is the form's
    # message, not a database error.
    amount = forms.DecimalField(label=gettext_lazy("Monthly budget"), min_value=Decimal("0.01"), decimal_places=2,
                                max_digits=14)
    # A blank first option: a budget saved with a code not on the list is never silently changed to the first code.
    currency = forms.ChoiceField(label=gettext_lazy("Currency"), choices=[("", "—"), *CURRENCY_CHOICES], initial="USD")
    soft_threshold_pct = forms.DecimalField(label=gettext_lazy("Warn at (%)"), initial=Decimal(80), min_value=1,
                                            max_value=1000, max_digits=5, decimal_places=2)
    hard_threshold_pct = forms.DecimalField(label=gettext_lazy("Enforce at (%)"), initial=Decimal(100), min_value=1,
                                            max_value=1000, max_digits=5, decimal_places=2)
    hard_action = forms.ChoiceField(label=gettext_lazy("Action when enforced"), choices=BudgetAction.choices)
    throttle_factor = forms.DecimalField(label=gettext_lazy("Throttle factor"), initial=Decimal("0.5"),
                                         min_value=Decimal("0.001"), max_value=1, max_digits=4, decimal_places=3)
    owner = forms.CharField(label=gettext_lazy("Who can raise it"), max_length=200)
    notify_emails = forms.CharField(label=gettext_lazy("Notify (emails)"), required=False,
                                    help_text=gettext_lazy("Addresses separated by commas."))
    webhook_url = forms.URLField(label=gettext_lazy("Webhook URL"), required=False, assume_scheme="https",
                                 help_text=gettext_lazy("https only; the payload is signed with the budget's secret."))


class BudgetScopeForm(forms.Form):
    """Which budget a new one is: shapes only; whether the namespace is the tenant's and the label
    well formed is the service's to say."""

    tenant = forms.ChoiceField(label=gettext_lazy("Tenant"))
    scope = forms.ChoiceField(label=gettext_lazy("Applies to"), choices=BudgetScope.choices,
                              initial=BudgetScope.NAMESPACE)
    namespace = forms.CharField(label=gettext_lazy("Namespace"), required=False, max_length=63,
                                widget=forms.TextInput(attrs={"list": "tenant-namespaces", "size": 24}),
                                help_text=gettext_lazy("For a namespace budget: one of the tenant's namespaces."))
    label = forms.CharField(label=gettext_lazy("Label (name=value)"), required=False, max_length=400,
                            widget=forms.TextInput(attrs={"size": 24}),
                            help_text=gettext_lazy("For a label budget, which only notifies: team=ml."))

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        tenants = Tenant.objects.order_by("slug").values_list("slug", "name")
        field = cast(forms.ChoiceField, self.fields["tenant"])
        field.choices = [("", "—"), *((slug, f"{seeded_text(name)} ({slug})") for slug, name in tenants)]


@login_required
def budgets(request: HttpRequest) -> HttpResponse:
    scope = get_scope(request.user)
    views = list_budgets(scope=scope, now=timezone.now())
    without = (Tenant.objects.exclude(budgets__scope=BudgetScope.TENANT).order_by("slug") if scope.sees_platform
               else Tenant.objects.none())
    return render(request, "billing/budgets.html", {"budgets": views, "without_budget": without})


def _save_budget(request: HttpRequest, form: BudgetForm, **which: Any) -> bool:
    """One service call; its refusal becomes the form's error. True when saved."""
    try:
        set_budget(values=dict(form.cleaned_data), now=timezone.now(), actor_label=request.user.get_username(),
                   actor_id=request.user.pk, **which)
    except InvalidInput as exc:
        form.add_error(None, str(exc))
        return False
    # Re-evaluate at once rather than at the next minute's beat.
    transaction.on_commit(tasks.evaluate_budgets.delay)
    return True


@login_required
def budget_edit(request: HttpRequest, tenant: str) -> HttpResponse:
    """Finance and admins set or change one tenant's own budget; the form starts from its current
    values, and the webhook secret is kept unless changed elsewhere."""
    require_platform(request, "only finance and admins set budgets")
    row = Tenant.objects.filter(slug=tenant).first()
    if row is None:
        raise Http404("no such tenant")
    existing = row.budgets.filter(scope=BudgetScope.TENANT).first()
    initial = {f: getattr(existing, f) for f in BudgetForm.base_fields} if existing else None
    form = BudgetForm(request.POST or None, initial=initial)
    if request.method == "POST" and form.is_valid() and _save_budget(request, form, tenant_slug=tenant):
        messages.success(request, _("Budget of %(tenant)s saved.") % {"tenant": tenant})
        return redirect("budgets")
    return render(request, "billing/budget_edit.html", {"tenant": row, "form": form},
                  status=400 if form.errors else 200)


@login_required
def budget_change(request: HttpRequest, budget_id: int) -> HttpResponse:
    """Finance and admins change a budget of any scope; what it applies to stays as it is."""
    scope = require_platform(request, "only finance and admins set budgets")
    view = next((b for b in list_budgets(scope=scope, now=timezone.now()) if b.id == budget_id), None)
    budget = Budget.objects.filter(pk=budget_id).first()
    if view is None or budget is None:
        raise Http404("no such budget")
    form = BudgetForm(request.POST or None, initial={f: getattr(budget, f) for f in BudgetForm.base_fields})
    which = {"tenant_slug": view.tenant, "scope": view.scope, "namespace": view.namespace, "label": view.label}
    if request.method == "POST" and form.is_valid() and _save_budget(request, form, **which):
        messages.success(request, _("Budget of %(tenant)s, %(applies_to)s, saved.")
                         % {"tenant": view.tenant, "applies_to": view.applies_to})
        return redirect("budgets")
    return render(request, "billing/budget_edit.html", {"tenant": budget.tenant, "form": form, "budget": view},
                  status=400 if form.errors else 200)


@login_required
def budget_new(request: HttpRequest) -> HttpResponse:
    """Finance and admins create a budget on a tenant, one of its namespaces, or its pods with a label."""
    require_platform(request, "only finance and admins set budgets")
    which_form = BudgetScopeForm(request.POST or None, initial={k: request.GET[k] for k in ("tenant", "scope")
                                                                if k in request.GET})
    form = BudgetForm(request.POST or None)
    if request.method == "POST" and which_form.is_valid() and form.is_valid():
        which = which_form.cleaned_data
        if _save_budget(request, form, tenant_slug=which["tenant"], scope=which["scope"], namespace=which["namespace"],
                        label=which["label"], must_be_new=True):
            messages.success(request, _("Budget of %(tenant)s saved.") % {"tenant": which["tenant"]})
            return redirect("budgets")
    namespaces = sorted({n for ns in Tenant.objects.values_list("namespaces", flat=True) for n in ns})
    return render(request, "billing/budget_new.html", {"which_form": which_form, "form": form,
                                                       "namespaces": namespaces},
                  status=400 if form.errors or which_form.errors else 200)


def _share_text(share: Decimal) -> str:
    """A miss target as an admin types it: fixed-point, no trailing zeros (0.000001, not 1E-6)."""
    return format(share.normalize(), "f")


class SlaTierForm(forms.Form):
    """Shapes only; the rules (weight range and decimals, blank names, miss targets in (0, 1)) are
    the service's."""

    name = forms.CharField(label=gettext_lazy("Name"), max_length=MAX_NAME_LENGTH,
                           widget=forms.TextInput(attrs={"size": 24}))
    weight = forms.CharField(label=gettext_lazy("Weight"), max_length=40,
                             widget=forms.TextInput(attrs={"inputmode": "decimal", "size": 8}))
    description = forms.CharField(label=gettext_lazy("Description"), max_length=MAX_DESCRIPTION_LENGTH,
                                  required=False, widget=forms.Textarea(attrs={"rows": 2, "cols": 40}))
    miss_target_memory = forms.CharField(
        label=gettext_lazy("Memory miss target"), max_length=40, required=False,
        help_text=gettext_lazy("The share of this tier's workload-seconds whose memory use may exceed the grant: "
                               "an out-of-memory failure. 0.000001 is 1 in 1,000,000 seconds. Between 0 and 1, "
                               "both excluded."),
        widget=forms.TextInput(attrs={"inputmode": "decimal", "size": 14}))
    miss_target_sm = forms.CharField(
        label=gettext_lazy("SM miss target"), max_length=40, required=False,
        help_text=gettext_lazy("The share of this tier's workload-seconds whose SM use may exceed the grant: "
                               "a slowdown. 0.00001 is 1 in 100,000 seconds. Between 0 and 1, both excluded."),
        widget=forms.TextInput(attrs={"inputmode": "decimal", "size": 14}))

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.fields["weight"].help_text = _(
            "A tier's share of a contended GPU relative to the other tiers, from %(min)s to %(max)s."
        ) % {"min": MIN_WEIGHT, "max": MAX_WEIGHT}

    def miss_target(self, name: str) -> str | None:
        """A cleaned miss target; blank is None: the tier keeps its target (a new tier: the default)."""
        return str(self.cleaned_data[name]).strip() or None


class NewSlaTierForm(SlaTierForm):
    slug = forms.CharField(label=gettext_lazy("Slug"), max_length=63,
                           help_text=gettext_lazy("Pods choose this tier with the label vgpu-ledger.io/sla-tier; "
                                                  "the slug cannot change later."),
                           widget=forms.TextInput(attrs={"size": 16, "pattern": "[a-z0-9]([-a-z0-9]*[a-z0-9])?"}))
    field_order = ["slug", "name", "weight", "description", "miss_target_memory", "miss_target_sm"]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        # A new tier's targets start at the default for a tier the agents do not name.
        kwargs.setdefault("initial", {field: _share_text(value) for field, value in default_miss_targets("").items()})
        super().__init__(*args, **kwargs)


def _admin_only(request: HttpRequest) -> Scope:
    return require_admin(request, "SLA tiers are for admins")


def _render_sla_tiers(request: HttpRequest, scope: Scope, *, create_form: NewSlaTierForm | None = None,
                      rejected: tuple[str, str, str] | None = None, retire_error: tuple[str, str] | None = None,
                      status: int = 200) -> HttpResponse:
    """`rejected`: (slug, weight typed, why) of a refused weight change, shown in that tier's row;
    `retire_error`: (slug, why) of a refused retirement."""
    return render(request, "billing/sla_tiers.html", {
        "tiers": list_sla_tiers(scope=scope), "create_form": create_form or NewSlaTierForm(),
        "rejected": rejected, "retire_error": retire_error,
    }, status=status)


@login_required
def sla_tiers(request: HttpRequest) -> HttpResponse:
    """GET: every tier. POST (slug, weight): change one tier's weight."""
    scope = _admin_only(request)
    if request.method != "POST":
        return _render_sla_tiers(request, scope)
    slug, weight = request.POST.get("slug", ""), request.POST.get("weight", "")
    try:
        set_sla_tier_weight(slug=slug, weight=weight, now=timezone.now(), actor_label=request.user.get_username(),
                            actor_id=request.user.pk)
    except InvalidInput as exc:
        return _render_sla_tiers(request, scope, rejected=(slug, weight, str(exc)), status=400)
    messages.success(request, _("Weight saved; agents apply it at their next policy poll."))
    return redirect("sla-tiers")


@login_required
@require_POST
def sla_tier_create(request: HttpRequest) -> HttpResponse:
    scope = _admin_only(request)
    form = NewSlaTierForm(request.POST)
    if form.is_valid():
        data = form.cleaned_data
        try:
            tier = create_sla_tier(slug=data["slug"], name=data["name"], weight=data["weight"],
                                   description=data["description"], miss_target_memory=form.miss_target("miss_target_memory"),
                                   miss_target_sm=form.miss_target("miss_target_sm"), now=timezone.now(),
                                   actor_label=request.user.get_username(), actor_id=request.user.pk)
        except InvalidInput as exc:
            form.add_error(None, str(exc))
        else:
            messages.success(request, _("SLA tier %(slug)s created; agents receive it at their next policy poll.")
                             % {"slug": tier.slug})
            return redirect("sla-tiers")
    return _render_sla_tiers(request, scope, create_form=form, status=400)


@login_required
@require_POST
def sla_tier_retire(request: HttpRequest, slug: str) -> HttpResponse:
    """Admins retire a tier, confirming it and saying why (audited)."""
    scope = _admin_only(request)
    form = RetireForm(request.POST)
    if not form.is_valid():
        return _render_sla_tiers(request, scope, retire_error=(slug, form.error_text()), status=400)
    try:
        retire_sla_tier(slug=slug, reason=form.cleaned_data["reason"], now=timezone.now(),
                        actor_label=request.user.get_username(), actor_id=request.user.pk)
    except InvalidInput as exc:
        return _render_sla_tiers(request, scope, retire_error=(slug, str(exc)), status=400)
    messages.success(request, _("SLA tier %(slug)s retired; pods that still carry its label keep its weight.")
                     % {"slug": slug})
    return redirect("sla-tiers")


@login_required
def sla_tier_edit(request: HttpRequest, slug: str) -> HttpResponse:
    """Change a tier's name, description and weight (its slug is fixed)."""
    scope = _admin_only(request)
    tier = get_sla_tier(scope=scope, slug=slug)
    if tier is None:
        raise Http404("no such SLA tier")
    form = SlaTierForm(request.POST or None,
                       initial={"name": tier.name, "weight": tier.weight, "description": tier.description,
                                "miss_target_memory": _share_text(tier.miss_target_memory),
                                "miss_target_sm": _share_text(tier.miss_target_sm)})
    if request.method == "POST" and form.is_valid():
        data = form.cleaned_data
        try:
            change_sla_tier(slug=slug, name=data["name"], description=data["description"], weight=data["weight"],
                            miss_target_memory=form.miss_target("miss_target_memory"),
                            miss_target_sm=form.miss_target("miss_target_sm"),
                            now=timezone.now(), actor_label=request.user.get_username(), actor_id=request.user.pk)
        except InvalidInput as exc:
            form.add_error(None, str(exc))
        else:
            messages.success(request, _("SLA tier %(slug)s saved; agents apply a new weight and miss targets at "
                                        "their next policy poll.") % {"slug": slug})
            return redirect("sla-tiers")
    return render(request, "billing/sla_tier_edit.html", {"tier": tier, "form": form},
                  status=400 if form.errors else 200)


@login_required
def audit_log(request: HttpRequest) -> HttpResponse:
    """The latest audit events, newest first; `?action=budget.` filters by action prefix."""
    require_admin(request, "the audit log is for admins")
    action = request.GET.get("action", "").strip()[:100]
    return render(request, "billing/audit_log.html",
                  {"events": list_audit_events(action_prefix=action), "action": action})
