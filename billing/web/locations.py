"""Locations and their energy rates (platform admins; docs/billing.md, Energy). A node's location is set
on the Nodes page (billing.web.admin_fleet).

Thin: a form parses the request, one service writes (it validates every rule and audits in the
change's transaction), then render. A rule broken answers 400 with the service's message and
changes nothing."""

from __future__ import annotations

from datetime import date

from django import forms
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.utils import timezone
from django.utils.translation import gettext as _
from django.utils.translation import gettext_lazy
from django.views.decorators.http import require_POST

from billing.errors import InvalidInput
from billing.queries.locations import get_locations_page
from billing.scope import Scope
from billing.services.fleet import add_location, earliest_energy_change, set_location_rate
from billing.web.access import require_admin


class AddLocationForm(forms.Form):
    label = forms.CharField(label=gettext_lazy("Location label"), max_length=63,
                            widget=forms.TextInput(attrs={"size": 20, "placeholder": "eu-west-dc1"}))


class LocationRateForm(forms.Form):
    location = forms.CharField(max_length=63, widget=forms.HiddenInput)
    effective_from = forms.DateField(label=gettext_lazy("From (UTC date)"),
                                     widget=forms.DateInput(attrs={"type": "date"}, format="%Y-%m-%d"))
    # Text, not DecimalField: the service gives the reason a number is refused, in one place.
    price_per_kwh = forms.CharField(label=gettext_lazy("Price per kWh"), max_length=40, required=False,
                                    widget=forms.TextInput(attrs={"size": 10, "inputmode": "decimal"}))
    co2e_kg_per_kwh = forms.CharField(label=gettext_lazy("kg CO2e per kWh"), max_length=40, required=False,
                                      widget=forms.TextInput(attrs={"size": 10, "inputmode": "decimal"}))


def _scope(request: HttpRequest) -> Scope:
    return require_admin(request, "locations and their energy rates are for platform admins")


def _render(request: HttpRequest, scope: Scope, *, add_form: AddLocationForm | None = None,
            rate_error: tuple[str, str] | None = None, status: int = 200) -> HttpResponse:
    now = timezone.now()
    return render(request, "billing/locations.html", {
        "page": get_locations_page(scope=scope, now=now), "add_form": add_form or AddLocationForm(),
        "rate_error": rate_error, "earliest": earliest_energy_change(now).isoformat(),
    }, status=status)


@login_required
def locations(request: HttpRequest) -> HttpResponse:
    """GET: every location with its rates. POST: add a location (audited)."""
    scope = _scope(request)
    if request.method != "POST":
        return _render(request, scope)
    form = AddLocationForm(request.POST)
    if form.is_valid():
        try:
            location = add_location(label=form.cleaned_data["label"], now=timezone.now(),
                                    actor_label=request.user.get_username(), actor_id=request.user.pk)
        except InvalidInput as exc:
            form.add_error("label", str(exc))
        else:
            messages.success(request, _("Location %(label)s added: give it a price per kWh and a CO2e factor.")
                             % {"label": location.label})
            return redirect("locations")
    return _render(request, scope, add_form=form, status=400)


@login_required
@require_POST
def location_rate(request: HttpRequest) -> HttpResponse:
    """A location's price per kWh and CO2e factor from a date (tomorrow at the earliest; audited)."""
    scope = _scope(request)
    form = LocationRateForm(request.POST)
    label = request.POST.get("location", "")[:63]
    if not form.is_valid():
        return _render(request, scope, rate_error=(label, form.errors.as_text()), status=400)
    data = form.cleaned_data
    effective_from: date = data["effective_from"]
    try:
        rate = set_location_rate(label=data["location"], effective_from=effective_from,
                                 price_per_kwh=data["price_per_kwh"], co2e_kg_per_kwh=data["co2e_kg_per_kwh"],
                                 now=timezone.now(), actor_label=request.user.get_username(), actor_id=request.user.pk)
    except InvalidInput as exc:
        return _render(request, scope, rate_error=(label, str(exc)), status=400)
    messages.success(request, _("New energy rate of %(label)s from %(date)s saved.")
                     % {"label": rate.location.label, "date": rate.effective_from.isoformat()})
    return redirect("locations")
