"""API tokens for the read API: every signed-in user lists, issues and revokes their own; platform
admins see and manage everyone's (as `manage.py create_api_token` does). A token acts with its
user's role, so issuing one for yourself grants nothing you do not already see.

Thin, as the node tokens page (billing/web/admin_fleet.py): a form parses, one service writes
(and audits), a rule broken answers 400 with the service's message and changes nothing."""

from __future__ import annotations

from typing import Any, cast

from django import forms
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.utils import timezone
from django.utils.translation import gettext as _
from django.utils.translation import gettext_lazy
from django.views.decorators.http import require_POST

from billing.errors import InvalidInput
from billing.queries.api_tokens import get_api_token, issuable_usernames, list_api_tokens
from billing.scope import Scope, get_scope
from billing.services.identity import (
    MAX_EXPIRY_DAYS,
    MAX_NAME_LENGTH,
    expiry_after_days,
    issue_api_token,
    revoke_api_token,
)
from billing.web.access import issued_token_page


class IssueApiTokenForm(forms.Form):
    username = forms.ChoiceField(label=gettext_lazy("For user"))
    name = forms.CharField(label=gettext_lazy("What it is for"), max_length=MAX_NAME_LENGTH, required=False,
                           widget=forms.TextInput(attrs={"size": 28}))
    expires_days = forms.IntegerField(label=gettext_lazy("Expires after (days)"), required=False, min_value=1,
                                      max_value=MAX_EXPIRY_DAYS, widget=forms.NumberInput(attrs={"size": 6}),
                                      help_text=gettext_lazy("Leave blank for a token that does not expire."))

    def __init__(self, *args: Any, usernames: list[str], me: str, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        field = cast(forms.ChoiceField, self.fields["username"])
        field.choices = [(u, u) for u in usernames]
        if not self.is_bound:
            self.initial = {**self.initial, "username": me}


def _form(request: HttpRequest, scope: Scope, data: Any = None) -> IssueApiTokenForm:
    return IssueApiTokenForm(data, usernames=issuable_usernames(scope=scope, user_id=request.user.pk),
                             me=request.user.get_username())


def _render(request: HttpRequest, scope: Scope, *, form: IssueApiTokenForm | None = None, error: str | None = None,
            status: int = 200) -> HttpResponse:
    return render(request, "billing/api_tokens.html", {
        "tokens": list_api_tokens(scope=scope, user_id=request.user.pk, now=timezone.now()),
        "form": form or _form(request, scope), "error": error, "all_users": scope.is_admin,
    }, status=status)


@login_required
def api_tokens(request: HttpRequest) -> HttpResponse:
    """GET: the tokens this user may see. POST: issue one, shown in this response only (never
    stored in clear, put in a URL or the session; not cached). Reloading would issue another."""
    scope = get_scope(request.user)
    if request.method != "POST":
        return _render(request, scope)
    form = _form(request, scope, request.POST)
    if not form.is_valid():
        return _render(request, scope, form=form, status=400)
    now = timezone.now()
    try:
        issued = issue_api_token(
            username=form.cleaned_data["username"], name=form.cleaned_data["name"],
            expires_at=expiry_after_days(form.cleaned_data["expires_days"], now=now), now=now,
            actor_label=request.user.get_username(), actor_id=request.user.pk, actor_is_admin=scope.is_admin)
    except InvalidInput as exc:
        form.add_error(None, str(exc))
        return _render(request, scope, form=form, status=400)
    return issued_token_page(request, "billing/api_token_issued.html", issued)


@login_required
@require_POST
def api_token_revoke(request: HttpRequest, token_id: int) -> HttpResponse:
    """Revoke one token; the user confirms by typing its prefix."""
    scope = get_scope(request.user)
    token = get_api_token(scope=scope, user_id=request.user.pk, token_id=token_id, now=timezone.now())
    if token is None:
        raise Http404("no such API token")
    if request.POST.get("confirm", "").strip() != token.prefix:
        error = _("To revoke token %(prefix)s… of %(user)s, type its prefix %(prefix)s to confirm.") % {
            "prefix": token.prefix, "user": token.username}
        return _render(request, scope, error=error, status=400)
    try:
        revoke_api_token(token_id=token_id, now=timezone.now(), actor_label=request.user.get_username(),
                         actor_id=request.user.pk, actor_is_admin=scope.is_admin)
    except InvalidInput as exc:
        return _render(request, scope, error=str(exc), status=400)
    messages.success(request, _("Token %(prefix)s… of %(user)s revoked; the API refuses it from now on.")
                     % {"prefix": token.prefix, "user": token.username})
    return redirect("api-tokens")
