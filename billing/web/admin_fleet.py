"""Rate cards (finance reads, admins change prices), approved GPU models and nodes with their
tokens (admins).

Thin: a form parses the request, one query reads or one service writes (the services
validate every rule and audit in the change's transaction), then render. A rule broken
answers 400 with the service's message and changes nothing."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any, cast

from django import forms
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.utils import timezone
from django.utils.formats import date_format
from django.utils.translation import gettext as _
from django.utils.translation import gettext_lazy
from django.views.decorators.http import require_POST

from billing.currencies import CURRENCY_CHOICES
from billing.errors import InvalidInput
from billing.models import BilledBasis, IdlePolicy
from billing.queries.admin_fleet import (
    NODE_STALE_AFTER,
    get_gpu_models_page,
    get_node_token,
    get_rate_cards_page,
    list_nodes,
)
from billing.queries.locations import location_labels
from billing.scope import Scope, get_scope
from billing.services.fleet import set_node_location
from billing.services.identity import issue_node_token, revoke_node_token
from billing.services.pricing import (
    MODEL_NAME_MAX_LEN,
    approve_gpu_model,
    create_rate_card,
    earliest_change,
    end_rate_card,
    known_gpu_models,
    retire_gpu_model,
    retire_rate_card,
)
from billing.web.access import issued_token_page, require_admin
from billing.web.forms import RetireForm

_DATETIME_LOCAL = "%Y-%m-%dT%H:%M"
# Agents call in every few seconds to a minute; a token used this recently is shown as "in use".
TOKEN_IN_USE_WITHIN = NODE_STALE_AFTER


def _as_local_input(at: datetime) -> str:
    """`at` as a datetime-local input's value, in UTC."""
    return at.astimezone(UTC).strftime(_DATETIME_LOCAL)


class UtcDateTimeField(forms.DateTimeField):
    """A date and time read as UTC whatever the active time zone (prices change on UTC minutes)."""

    widget = forms.DateTimeInput(attrs={"type": "datetime-local"}, format=_DATETIME_LOCAL)

    def to_python(self, value: Any) -> datetime | None:
        with timezone.override(UTC):
            return super().to_python(value)

    def prepare_value(self, value: Any) -> Any:
        if isinstance(value, datetime) and timezone.is_aware(value):
            return _as_local_input(value)
        return value


class RateCardForm(forms.Form):
    """Only shapes here; the rules (decimals, currency, a free price, dates, overlaps) are the
    service's. The GPU model is chosen from the approved models only (the choice field refuses any
    other name, and so does the service): a name a node reports reaches this form only once an
    admin approves it on the GPU models page."""

    gpu_model = forms.ChoiceField(label=gettext_lazy("GPU model"),
                                  help_text=gettext_lazy("Approved models only; approve a new one on the GPU "
                                                         "models page."))
    price_per_gpu_hour = forms.CharField(label=gettext_lazy("Price per GPU-hour"), max_length=40,
                                         widget=forms.TextInput(attrs={"inputmode": "decimal", "size": 12}))
    confirm_free = forms.BooleanField(label=gettext_lazy("I confirm this GPU model is free"), required=False,
                                      help_text=gettext_lazy("Needed for a price of 0 only."))
    currency = forms.ChoiceField(label=gettext_lazy("Currency"), choices=[("", "—"), *CURRENCY_CHOICES], initial="USD")
    effective_from = UtcDateTimeField(label=gettext_lazy("Effective from (UTC)"))
    alpha = forms.CharField(label=gettext_lazy("Alpha (memory weight)"), max_length=10, required=False,
                            widget=forms.TextInput(attrs={"size": 6}),
                            help_text=gettext_lazy("Leave blank to keep the current card's alpha."))
    billed_basis = forms.ChoiceField(label=gettext_lazy("Billed basis"), required=False,
                                     choices=[("", gettext_lazy("as the current card")), *BilledBasis.choices])
    idle_policy = forms.ChoiceField(label=gettext_lazy("Idle policy"), required=False,
                                    choices=[("", gettext_lazy("as the current card")), *IdlePolicy.choices])
    source_url = forms.CharField(label=gettext_lazy("Source URL"), max_length=500,
                                 widget=forms.URLInput(attrs={"size": 40}))
    source_note = forms.CharField(label=gettext_lazy("Source note"), max_length=2000,
                                  widget=forms.Textarea(attrs={"rows": 2, "cols": 40}))

    def __init__(self, *args: Any, earliest: datetime, known_models: list[str], **kwargs: Any) -> None:
        """`earliest`: the first instant a price may change at (`rate_cards.earliest_change`); the
        start is prefilled with it and the browser refuses anything earlier. `known_models`: the
        GPU models to choose from (`rate_cards.known_gpu_models`: the approved ones)."""
        super().__init__(*args, **kwargs)
        model = cast(forms.ChoiceField, self.fields["gpu_model"])
        model.choices = [("", "—"), *((m, m) for m in known_models)]
        field = self.fields["effective_from"]
        # No `min`: a model whose usage no card priced may start earlier (the service says how far).
        field.widget.attrs["data-earliest"] = _as_local_input(earliest)
        field.help_text = _("Earliest allowed: %(at)s UTC, the next whole minute; minutes already metered keep "
                             "their price. Only a model whose usage no card priced yet may start earlier, to bill "
                             "that usage (as a late-usage adjustment once its month is closed).") % {
            "at": date_format(earliest.astimezone(UTC), "DATETIME_FORMAT")}
        if not self.is_bound and "effective_from" not in self.initial:
            self.initial = {**self.initial, "effective_from": earliest}



class ApproveGpuModelForm(forms.Form):
    """Only shapes; the service checks the name is in NVML's shape and not a twin of an approved one."""

    name = forms.CharField(label=gettext_lazy("GPU model"), max_length=MODEL_NAME_MAX_LEN,
                           widget=forms.TextInput(attrs={"size": 32}),
                           help_text=gettext_lazy("Exactly as NVML names it, such as NVIDIA H100 80GB HBM3."))
    note = forms.CharField(label=gettext_lazy("Note"), max_length=500, required=False,
                           widget=forms.TextInput(attrs={"size": 32}))


class EndRateCardForm(forms.Form):
    effective_to = UtcDateTimeField(label=gettext_lazy("Stop pricing at (UTC)"))


class NodeLocationForm(forms.Form):
    location = forms.CharField(label=gettext_lazy("Location"), max_length=63)


class IssueTokenForm(forms.Form):
    node = forms.CharField(label=gettext_lazy("Node name"), max_length=253,
                           widget=forms.TextInput(attrs={"list": "known-nodes", "size": 28}))


def _rate_cards_scope(request: HttpRequest, *, write: bool) -> Scope:
    scope = get_scope(request.user)
    if not (scope.is_admin or (scope.is_finance and not write)):
        raise PermissionDenied(_("Rate cards are for finance (to read) and platform admins (to change)."))
    return scope


def _render_rate_cards(request: HttpRequest, scope: Scope, *, form: RateCardForm | None = None,
                       end_error: tuple[int, str] | None = None, status: int = 200) -> HttpResponse:
    now = timezone.now()
    page = get_rate_cards_page(scope=scope, now=now, gpu_model=request.GET.get("gpu_model", "")[:128])
    earliest = earliest_change(now)
    if form is None and scope.is_admin:
        form = RateCardForm(initial=page.form_defaults, earliest=earliest, known_models=page.known_models)
    return render(request, "billing/rate_cards.html", {
        "page": page, "form": form, "end_error": end_error,
        "earliest_input": _as_local_input(earliest),
    }, status=status)


@login_required
def rate_cards(request: HttpRequest) -> HttpResponse:
    """GET: every card by GPU model. POST (admins): a new price from a date, superseding the open card."""
    scope = _rate_cards_scope(request, write=request.method == "POST")
    if request.method != "POST":
        return _render_rate_cards(request, scope)
    form = RateCardForm(request.POST, earliest=earliest_change(timezone.now()), known_models=known_gpu_models())
    if form.is_valid():
        data = form.cleaned_data
        try:
            change = create_rate_card(
                gpu_model=data["gpu_model"], price_per_gpu_hour=data["price_per_gpu_hour"],
                currency=data["currency"], effective_from=data["effective_from"], alpha=data["alpha"],
                billed_basis=data["billed_basis"], idle_policy=data["idle_policy"], source_url=data["source_url"],
                source_note=data["source_note"], confirm_free=data["confirm_free"], now=timezone.now(),
                actor_label=request.user.get_username(), actor_id=request.user.pk,
            )
        except InvalidInput as exc:
            form.add_error(None, str(exc))
        else:
            messages.success(request, _("New price for %(model)s saved (card #%(id)s).")
                             % {"model": data["gpu_model"].strip(), "id": change.card_id})
            return redirect("rate-cards")
    return _render_rate_cards(request, scope, form=form, status=400)


@login_required
@require_POST
def rate_card_end(request: HttpRequest, card_id: int) -> HttpResponse:
    """Admins end a card at a date (same rules as a new price)."""
    scope = _rate_cards_scope(request, write=True)
    form = EndRateCardForm(request.POST)
    if not form.is_valid():
        return _render_rate_cards(request, scope, end_error=(card_id, form.errors.as_text()), status=400)
    try:
        end_rate_card(card_id=card_id, effective_to=form.cleaned_data["effective_to"], now=timezone.now(),
                      actor_label=request.user.get_username(), actor_id=request.user.pk)
    except InvalidInput as exc:
        return _render_rate_cards(request, scope, end_error=(card_id, str(exc)), status=400)
    messages.success(request, _("Card #%(id)s ends at the chosen time.") % {"id": card_id})
    return redirect("rate-cards")


@login_required
@require_POST
def rate_card_retire(request: HttpRequest, card_id: int) -> HttpResponse:
    """Admins retire a mistaken card, confirming it and saying why (audited)."""
    scope = _rate_cards_scope(request, write=True)
    form = RetireForm(request.POST)
    if not form.is_valid():
        return _render_rate_cards(request, scope, end_error=(card_id, form.error_text()), status=400)
    try:
        retire_rate_card(card_id=card_id, reason=form.cleaned_data["reason"], now=timezone.now(),
                         actor_label=request.user.get_username(), actor_id=request.user.pk)
    except InvalidInput as exc:
        return _render_rate_cards(request, scope, end_error=(card_id, str(exc)), status=400)
    messages.success(request, _("Card #%(id)s retired: it prices nothing from the next whole minute on.")
                     % {"id": card_id})
    return redirect("rate-cards")


def _admin_scope(request: HttpRequest) -> Scope:
    return require_admin(request, "nodes and their tokens are for admins")


def _render_nodes(request: HttpRequest, scope: Scope, *, form: IssueTokenForm | None = None,
                  error: str | None = None, status: int = 200) -> HttpResponse:
    now = timezone.now()
    return render(request, "billing/nodes.html", {
        "nodes": list_nodes(scope=scope, now=now), "form": form or IssueTokenForm(), "error": error,
        "location_labels": location_labels(scope=scope),
        # A token used since then is shown as "in use" (the same window as a node's liveness).
        "in_use_since": now - TOKEN_IN_USE_WITHIN,
    }, status=status)


@login_required
def nodes(request: HttpRequest) -> HttpResponse:
    return _render_nodes(request, _admin_scope(request))


@login_required
@require_POST
def node_token_issue(request: HttpRequest) -> HttpResponse:
    """Issue a token and show it in this response only: it is never stored in clear, put in a URL
    or in the session, and the page is not cached. Reloading would issue another token."""
    scope = _admin_scope(request)
    form = IssueTokenForm(request.POST)
    if not form.is_valid():
        return _render_nodes(request, scope, form=form, status=400)
    try:
        issued = issue_node_token(node_name=form.cleaned_data["node"].strip(), now=timezone.now(),
                                  actor_label=request.user.get_username(), actor_id=request.user.pk)
    except InvalidInput as exc:
        form.add_error("node", str(exc))
        return _render_nodes(request, scope, form=form, status=400)
    return issued_token_page(request, "billing/node_token_issued.html", issued)


@login_required
@require_POST
def node_token_revoke(request: HttpRequest, token_id: int) -> HttpResponse:
    """Revoke one token; the admin confirms by typing the token's prefix."""
    scope = _admin_scope(request)
    found = get_node_token(scope=scope, token_id=token_id)
    if found is None:
        raise Http404("no such node token")
    node, token = found
    if request.POST.get("confirm", "").strip() != token.prefix:
        error = _("To revoke token %(prefix)s… of %(node)s, type its prefix %(prefix)s to confirm.") % {
            "prefix": token.prefix, "node": node}
        return _render_nodes(request, scope, error=error, status=400)
    try:
        revoke_node_token(token_id=token_id, now=timezone.now(), actor_label=request.user.get_username(),
                          actor_id=request.user.pk)
    except InvalidInput as exc:
        return _render_nodes(request, scope, error=str(exc), status=400)
    messages.success(request, _("Token %(prefix)s… of %(node)s revoked; the agent using it is refused from now on.")
                     % {"prefix": token.prefix, "node": node})
    return redirect("nodes")


@login_required
@require_POST
def node_location(request: HttpRequest, node: str) -> HttpResponse:
    """A node's location: from tomorrow (UTC), or its whole past when it had none (audited)."""
    scope = _admin_scope(request)
    form = NodeLocationForm(request.POST)
    if not form.is_valid():
        return _render_nodes(request, scope, error=form.errors.as_text(), status=400)
    try:
        row = set_node_location(node_name=node, label=form.cleaned_data["location"], now=timezone.now(),
                                actor_label=request.user.get_username(), actor_id=request.user.pk)
    except InvalidInput as exc:
        return _render_nodes(request, scope, error=str(exc), status=400)
    messages.success(request, _("%(node)s is at %(label)s from %(date)s.")
                     % {"node": node, "label": form.cleaned_data["location"].strip(),
                        "date": row.effective_from.isoformat()})
    return redirect("nodes")


def _render_gpu_models(request: HttpRequest, scope: Scope, *, form: ApproveGpuModelForm | None = None,
                       error: str | None = None, status: int = 200) -> HttpResponse:
    return render(request, "billing/gpu_models.html", {
        "page": get_gpu_models_page(scope=scope), "form": form or ApproveGpuModelForm(), "error": error,
    }, status=status)


@login_required
def gpu_models(request: HttpRequest) -> HttpResponse:
    """GET: approved models and the unapproved names nodes report. POST: approve a name (audited)."""
    scope = require_admin(request, "approving GPU models is for platform admins")
    if request.method != "POST":
        return _render_gpu_models(request, scope)
    form = ApproveGpuModelForm(request.POST)
    if not form.is_valid():
        return _render_gpu_models(request, scope, form=form, status=400)
    try:
        row = approve_gpu_model(name=form.cleaned_data["name"], note=form.cleaned_data["note"], now=timezone.now(),
                                actor_label=request.user.get_username(), actor_id=request.user.pk)
    except InvalidInput as exc:
        form.add_error("name", str(exc))
        return _render_gpu_models(request, scope, form=form, status=400)
    messages.success(request, _("%(model)s approved: a rate card may now price it.") % {"model": row.name})
    return redirect("gpu-models")


@login_required
@require_POST
def gpu_model_retire(request: HttpRequest) -> HttpResponse:
    """Retire an approved name, confirming it and saying why (audited)."""
    scope = require_admin(request, "retiring GPU models is for platform admins")
    form = RetireForm(request.POST)
    name = request.POST.get("name", "")[:MODEL_NAME_MAX_LEN + 1]
    if not form.is_valid():
        return _render_gpu_models(request, scope, error=form.error_text(), status=400)
    try:
        retire_gpu_model(name=name, reason=form.cleaned_data["reason"], now=timezone.now(),
                         actor_label=request.user.get_username(), actor_id=request.user.pk)
    except InvalidInput as exc:
        return _render_gpu_models(request, scope, error=str(exc), status=400)
    messages.success(request, _("%(model)s retired: no new rate card may price it.") % {"model": name})
    return redirect("gpu-models")
