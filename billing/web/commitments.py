"""The commitments page (`/commitments/`, finance and admins): reserved rates and on-prem cards
beside the market rate, a month's use of each, and the forms that record or retire one. The rules
are the service's (billing.services.pricing); the forms only shape the input."""

from __future__ import annotations

from typing import Any, cast

from django import forms
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.utils import timezone
from django.utils.formats import date_format
from django.utils.translation import gettext as _
from django.utils.translation import gettext_lazy, ngettext
from django.views.decorators.http import require_POST

from billing.calendar import month_of, parse_month
from billing.currencies import CURRENCY_CHOICES
from billing.errors import InvalidInput
from billing.models import CommitmentKind
from billing.queries.commitments import get_commitments_page
from billing.scope import Scope
from billing.services.pricing import (
    LIFE_YEARS,
    RESERVED_TERMS_YEARS,
    OnPremCosts,
    create_commitment,
    earliest_hour,
    known_gpu_models,
    retire_commitment,
)
from billing.web.access import require_platform
from billing.web.forms import LanguageDateField, RetireForm

_DECIMAL = {"inputmode": "decimal", "size": 12}


class _CommitmentForm(forms.Form):
    """What both kinds share. Shapes only: the service checks numbers, dates and currencies."""

    gpu_model = forms.ChoiceField(label=gettext_lazy("GPU model"))
    cards = forms.CharField(label=gettext_lazy("Cards"), max_length=12,
                            widget=forms.TextInput(attrs={"inputmode": "numeric", "size": 6}))
    currency = forms.ChoiceField(label=gettext_lazy("Currency"), choices=[("", "—"), *CURRENCY_CHOICES], initial="USD")
    note = forms.CharField(label=gettext_lazy("Contract or asset record"), max_length=2000,
                           widget=forms.Textarea(attrs={"rows": 2, "cols": 36}))

    years_offered: tuple[int, ...] = ()

    def __init__(self, *args: Any, known_models: list[str], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        cast(forms.ChoiceField, self.fields["gpu_model"]).choices = [("", "—"), *((m, m) for m in known_models)]
        if "term_years" in self.fields:  # in the reader's language, so built per request
            cast(forms.ChoiceField, self.fields["term_years"]).choices = [
                (y, ngettext("%(n)s year", "%(n)s years", y) % {"n": y}) for y in self.years_offered]


class ReservedForm(_CommitmentForm):
    kind = CommitmentKind.RESERVED
    price_per_gpu_hour = forms.CharField(label=gettext_lazy("Committed price per GPU-hour"), max_length=40,
                                         widget=forms.TextInput(attrs=_DECIMAL))
    term_start = LanguageDateField(label=gettext_lazy("Term starts (UTC)"))
    term_years = forms.TypedChoiceField(label=gettext_lazy("Term"), coerce=int, initial=1)
    years_offered = RESERVED_TERMS_YEARS
    field_order = ["gpu_model", "cards", "price_per_gpu_hour", "currency", "term_start", "term_years", "note"]


class OnPremForm(_CommitmentForm):
    kind = CommitmentKind.ON_PREM
    purchase_price = forms.CharField(label=gettext_lazy("Purchase price per card"), max_length=40,
                                     widget=forms.TextInput(attrs=_DECIMAL))
    term_years = forms.TypedChoiceField(label=gettext_lazy("Life"), coerce=int, initial=5)
    years_offered = tuple(LIFE_YEARS)
    term_start = LanguageDateField(label=gettext_lazy("In service from (UTC)"))
    power_watts = forms.CharField(label=gettext_lazy("Average power per card (W)"), max_length=12,
                                  widget=forms.TextInput(attrs={"inputmode": "numeric", "size": 6}),
                                  help_text=gettext_lazy("The card's average draw with its share of the server."))
    energy_price_per_kwh = forms.CharField(label=gettext_lazy("Energy price per kWh"), max_length=40,
                                           widget=forms.TextInput(attrs=_DECIMAL))
    facility_cost_per_year = forms.CharField(label=gettext_lazy("Facility cost per card-year"), max_length=40,
                                             widget=forms.TextInput(attrs=_DECIMAL),
                                             help_text=gettext_lazy("Space, cooling and support for one card."))
    field_order = ["gpu_model", "cards", "purchase_price", "term_years", "term_start", "power_watts",
                   "energy_price_per_kwh", "facility_cost_per_year", "currency", "note"]


_FORMS: dict[str, type[ReservedForm] | type[OnPremForm]] = {
    CommitmentKind.RESERVED: ReservedForm, CommitmentKind.ON_PREM: OnPremForm}


def _render(request: HttpRequest, scope: Scope, *, forms_in: dict[str, _CommitmentForm] | None = None,
            retire_error: tuple[int, str] | None = None, status: int = 200) -> HttpResponse:
    now = timezone.now()
    text = request.GET.get("month", "")
    try:
        month = parse_month(text) if text else month_of(now)
    except InvalidInput:
        month, status = month_of(now), 400
        messages.error(request, _("Month %(month)r must look like YYYY-MM.") % {"month": text[:20]})
    page = get_commitments_page(scope=scope, now=now, month=month)
    models = page.known_models
    today = now.date()
    shown = {kind: (forms_in or {}).get(kind) or form(known_models=models, initial={"term_start": today})
             for kind, form in _FORMS.items()}
    return render(request, "billing/commitments.html", {
        "page": page, "reserved_form": shown[CommitmentKind.RESERVED], "on_prem_form": shown[CommitmentKind.ON_PREM],
        "earliest": earliest_hour(now), "retire_error": retire_error,
        "month_input": f"{month:%Y-%m}",  # the input's machine value, in every language
    }, status=status)


@login_required
def commitments(request: HttpRequest) -> HttpResponse:
    """GET: every commitment beside its market rate, with a month's use. POST: record one."""
    scope = require_platform(request, "commitments are for finance and platform admins")
    if request.method != "POST":
        return _render(request, scope)
    kind = request.POST.get("kind", "")
    form_class = _FORMS.get(kind)
    if form_class is None:
        messages.error(request, _("Choose a reserved commitment or on-prem cards."))
        return _render(request, scope, status=400)
    form = form_class(request.POST, known_models=known_gpu_models())
    if form.is_valid():
        data = form.cleaned_data
        on_prem = None if kind == CommitmentKind.RESERVED else OnPremCosts(
            purchase_price=data["purchase_price"], power_watts=data["power_watts"],
            energy_price_per_kwh=data["energy_price_per_kwh"], facility_cost_per_year=data["facility_cost_per_year"])
        try:
            created = create_commitment(
                kind=kind, gpu_model=data["gpu_model"], cards=data["cards"], currency=data["currency"],
                term_start=data["term_start"], term_years=data["term_years"], note=data["note"],
                price_per_gpu_hour=data.get("price_per_gpu_hour"), on_prem=on_prem, now=timezone.now(),
                actor_label=request.user.get_username(), actor_id=request.user.pk)
        except InvalidInput as exc:
            form.add_error(None, str(exc))
        else:
            messages.success(request, _("Commitment #%(id)s for %(cards)s × %(model)s saved: it prices from %(at)s (UTC).")
                             % {"id": created.pk, "cards": created.cards, "model": created.gpu_model,
                                "at": date_format(created.effective_from, "DATETIME_FORMAT")})
            return redirect("commitments")
    return _render(request, scope, forms_in={kind: form}, status=400)


@login_required
@require_POST
def commitment_retire(request: HttpRequest, commitment_id: int) -> HttpResponse:
    """Stop a commitment from the next whole hour, with a reason and a confirmation."""
    scope = require_platform(request, "commitments are for finance and platform admins")
    form = RetireForm(request.POST)
    if not form.is_valid():
        return _render(request, scope, retire_error=(commitment_id, form.error_text()), status=400)
    try:
        retire_commitment(commitment_id=commitment_id, reason=form.cleaned_data["reason"], now=timezone.now(),
                          actor_label=request.user.get_username(), actor_id=request.user.pk)
    except InvalidInput as exc:
        return _render(request, scope, retire_error=(commitment_id, str(exc)), status=400)
    messages.success(request, _("Commitment #%(id)s retired.") % {"id": commitment_id})
    return redirect("commitments")
