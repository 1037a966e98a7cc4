"""Alerts (docs/alerts.md): the alerts raised, newest first, each with its Explore link, and the
rules that raise them, which finance and admins create and change. Thin: forms shape the input, one
service call (validated and audited there), render."""

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

from billing import tasks
from billing.currencies import CURRENCY_CHOICES
from billing.errors import InvalidInput
from billing.models import AlertGranularity, AlertGrouping, AlertKind, AlertResource, Tenant
from billing.queries.alerts import get_alert_rule, list_alert_rules, list_alerts
from billing.seeded import seeded_text
from billing.services.alerts import save_alert_rule
from billing.web.access import require_platform

_ROLE = "alerts are for finance and admins"


class AlertRuleForm(forms.Form):
    """Shapes only: what each kind accepts (grouping, threshold range, floor) is the service's."""

    name = forms.CharField(label=gettext_lazy("Name"), max_length=100)
    kind = forms.ChoiceField(label=gettext_lazy("Kind"), choices=AlertKind.choices)
    tenant = forms.ChoiceField(label=gettext_lazy("Tenant"), required=False,
                               help_text=gettext_lazy("Empty: every tenant. Idle share is the fleet's: leave it empty."))
    group_by = forms.ChoiceField(label=gettext_lazy("Group by"), choices=AlertGrouping.choices, help_text=gettext_lazy(
        "Spend anomaly: per tenant or namespace; idle share: the whole fleet or per node; over-granting: per "
        "workload (controller)."))
    granularity = forms.ChoiceField(label=gettext_lazy("Period (spend anomaly)"), choices=AlertGranularity.choices)
    baseline_weeks = forms.IntegerField(label=gettext_lazy("Weeks of baseline (spend anomaly)"), min_value=3,
                                        max_value=12, initial=4)
    threshold = forms.DecimalField(label=gettext_lazy("Threshold"), max_digits=8, decimal_places=3, help_text=gettext_lazy(
        "Spend anomaly: the robust z-score (3.5 is usual); idle share: percent; over-granting: granted ÷ used."))
    min_amount = forms.DecimalField(label=gettext_lazy("Minimum amount"), max_digits=14, decimal_places=2, min_value=0,
                                    initial=Decimal(10), help_text=gettext_lazy(
        "Nothing smaller alerts: a spike's spend above the median, the idle cost, or the workload's cost."))
    currency = forms.ChoiceField(label=gettext_lazy("Currency"), choices=CURRENCY_CHOICES, initial="USD")
    window_hours = forms.IntegerField(label=gettext_lazy("Window in hours (idle share, over-granting)"), min_value=1,
                                      max_value=24 * 31, initial=24)
    resource = forms.ChoiceField(label=gettext_lazy("Resource (over-granting)"), choices=AlertResource.choices)
    notify_emails = forms.CharField(label=gettext_lazy("Notify (emails)"), required=False,
                                    help_text=gettext_lazy("Addresses separated by commas."))
    webhook_url = forms.URLField(label=gettext_lazy("Webhook URL"), required=False, assume_scheme="https",
                                 help_text=gettext_lazy("https only; signed with the secret below."))
    webhook_secret = forms.CharField(label=gettext_lazy("Webhook secret"), required=False, max_length=200,
                                     widget=forms.PasswordInput, help_text=gettext_lazy("Empty: unchanged."))
    slack_webhook_url = forms.URLField(label=gettext_lazy("Slack incoming webhook URL"), required=False,
                                       assume_scheme="https", widget=forms.PasswordInput, help_text=gettext_lazy(
        "Slack or a Slack-compatible chat; the URL is its credential, never shown again. Empty: unchanged."))
    remove_slack = forms.BooleanField(label=gettext_lazy("Remove the Slack webhook"), required=False)
    enabled = forms.BooleanField(label=gettext_lazy("Enabled"), required=False, initial=True)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        field = cast(forms.ChoiceField, self.fields["tenant"])
        tenants = Tenant.objects.order_by("slug").values_list("slug", "name")
        field.choices = [("", _("every tenant")), *((slug, seeded_text(name)) for slug, name in tenants)]

    def values(self) -> dict[str, Any]:
        values = {k: v for k, v in self.cleaned_data.items() if k != "remove_slack"}
        if self.cleaned_data["remove_slack"]:
            values["slack_webhook_url"] = None  # save_alert_rule: None clears, "" keeps
        return values


@login_required
def alert_list(request: HttpRequest) -> HttpResponse:
    require_platform(request, _ROLE)
    return render(request, "billing/alerts.html", {"alerts": list_alerts(limit=100), "rules": list_alert_rules()})


def _save(request: HttpRequest, form: AlertRuleForm, rule_id: int | None) -> bool:
    try:
        save_alert_rule(values=form.values(), now=timezone.now(), actor_label=request.user.get_username(),
                        actor_id=request.user.pk, rule_id=rule_id)
    except InvalidInput as exc:
        form.add_error(None, str(exc))
        return False
    transaction.on_commit(tasks.evaluate_alerts.delay)  # at once, rather than at the next beat
    return True


@login_required
def alert_rule_new(request: HttpRequest) -> HttpResponse:
    require_platform(request, _ROLE)
    initial = {"kind": request.GET.get("kind", AlertKind.SPEND_ANOMALY), "threshold": Decimal("3.5"),
               "group_by": AlertGrouping.NAMESPACE}
    form = AlertRuleForm(request.POST or None, initial=initial)
    if request.method == "POST" and form.is_valid() and _save(request, form, None):
        messages.success(request, _("Alert rule %(name)s saved.") % {"name": form.cleaned_data["name"]})
        return redirect("alerts")
    return render(request, "billing/alert_rule_edit.html", {"form": form, "rule": None},
                  status=400 if form.errors else 200)


@login_required
def alert_rule_edit(request: HttpRequest, rule_id: int) -> HttpResponse:
    require_platform(request, _ROLE)
    rule = get_alert_rule(rule_id)
    if rule is None:
        raise Http404("no such alert rule")
    form = AlertRuleForm(request.POST or None, initial=rule.initial)
    if request.method == "POST" and form.is_valid() and _save(request, form, rule_id):
        messages.success(request, _("Alert rule %(name)s saved.") % {"name": form.cleaned_data["name"]})
        return redirect("alerts")
    return render(request, "billing/alert_rule_edit.html", {"form": form, "rule": rule},
                  status=400 if form.errors else 200)
