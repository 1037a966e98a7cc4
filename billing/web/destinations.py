"""Where the fleet FOCUS dataset is delivered (`/exports/`): S3-compatible destinations with their
delivery history. Finance and admins read it and may ask for a delivery now; admins add, change and
retire destinations. The rules are the service's (billing.services.exports); secrets never come back
to the page, only the last four characters of a key id."""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.utils import timezone
from django.utils.translation import gettext as _
from django.utils.translation import gettext_lazy
from django.views.decorators.http import require_POST

from billing import tasks
from billing.errors import InvalidInput
from billing.queries.destinations import get_destinations_page
from billing.scope import Scope
from billing.services.exports import DestinationInput, retire_destination, save_destination
from billing.web.access import require_admin, require_platform


class DestinationForm(forms.Form):
    """Shapes only: the service checks the endpoint, names and keys."""

    name = forms.CharField(label=gettext_lazy("Name"), max_length=100)
    endpoint_url = forms.CharField(label=gettext_lazy("Endpoint URL"), max_length=500, required=False,
                                   widget=forms.TextInput(attrs={"size": 32, "placeholder": "https://"}),
                                   help_text=gettext_lazy("Empty for Amazon S3; an S3-compatible server's URL "
                                                          "otherwise."))
    region = forms.CharField(label=gettext_lazy("Region"), max_length=32, initial="us-east-1")
    bucket = forms.CharField(label=gettext_lazy("Bucket"), max_length=63)
    key_prefix = forms.CharField(label=gettext_lazy("Prefix"), max_length=400, required=False,
                             help_text=gettext_lazy("Folders inside the bucket, such as finops/gpu."))
    access_key_id = forms.CharField(label=gettext_lazy("Access key id"), max_length=128, required=False,
                                    widget=forms.TextInput(attrs={"autocomplete": "off"}))
    secret_access_key = forms.CharField(
        label=gettext_lazy("Secret access key"), max_length=256, required=False,
        widget=forms.PasswordInput(attrs={"autocomplete": "new-password"}, render_value=False),
        help_text=gettext_lazy("Stored sealed and never shown again. Leave both empty to keep the stored key (or to "
                               "use the worker's own credentials, such as an IAM role)."))
    clear_credentials = forms.BooleanField(label=gettext_lazy("Forget the stored key (use the worker's own "
                                                              "credentials)"), required=False)
    enabled = forms.BooleanField(label=gettext_lazy("Deliver daily"), required=False, initial=True)

    def to_input(self) -> DestinationInput:
        d: dict[str, Any] = self.cleaned_data
        return DestinationInput(name=d["name"], endpoint_url=d["endpoint_url"], region=d["region"], bucket=d["bucket"],
                                prefix=d["key_prefix"], access_key_id=d["access_key_id"],
                                secret_access_key=d["secret_access_key"], enabled=d["enabled"],
                                clear_credentials=d["clear_credentials"])


def _render(request: HttpRequest, scope: Scope, *, form: DestinationForm | None = None, editing: int | None = None,
            status: int = 200) -> HttpResponse:
    page = get_destinations_page(scope=scope, today=timezone.now().date())
    if form is None and scope.is_admin:
        form = DestinationForm()
    return render(request, "billing/destinations.html", {"page": page, "form": form, "editing": editing},
                  status=status)


@login_required
def destinations(request: HttpRequest) -> HttpResponse:
    """GET: the destinations and their deliveries. POST (admins): a new destination."""
    if request.method != "POST":
        return _render(request, require_platform(request, "export destinations are for finance and admins"))
    scope = require_admin(request, "only admins add export destinations")
    return _save(request, scope, destination_id=None)


@login_required
@require_POST
def destination_edit(request: HttpRequest, destination_id: int) -> HttpResponse:
    """Admins change a destination (a blank key keeps the stored one)."""
    scope = require_admin(request, "only admins change export destinations")
    return _save(request, scope, destination_id=destination_id)


def _save(request: HttpRequest, scope: Scope, *, destination_id: int | None) -> HttpResponse:
    form = DestinationForm(request.POST)
    if form.is_valid():
        try:
            saved = save_destination(destination_id=destination_id, data=form.to_input(), now=timezone.now(),
                                     actor_label=request.user.get_username(), actor_id=request.user.pk)
        except InvalidInput as exc:
            form.add_error(None, str(exc))
        else:
            messages.success(request, _("Destination %(name)s saved.") % {"name": saved.name})
            return redirect("export-destinations")
    return _render(request, scope, form=form, editing=destination_id, status=400)


@login_required
@require_POST
def destination_retire(request: HttpRequest, destination_id: int) -> HttpResponse:
    """Admins stop a destination for good (its key is forgotten, its history kept)."""
    scope = require_admin(request, "only admins retire export destinations")
    if request.POST.get("confirm") != "on":
        messages.error(request, _("Tick the confirmation to retire the destination."))
        return _render(request, scope, status=400)
    try:
        retired = retire_destination(destination_id=destination_id, now=timezone.now(),
                                     actor_label=request.user.get_username(), actor_id=request.user.pk)
    except InvalidInput as exc:
        messages.error(request, str(exc))
        return _render(request, scope, status=400)
    messages.success(request, _("Destination %(name)s retired.") % {"name": retired.name})
    return redirect("export-destinations")


@login_required
@require_POST
def destination_deliver(request: HttpRequest, destination_id: int) -> HttpResponse:
    """Finance or admins: deliver to this destination now (the worker runs it; the history shows it)."""
    scope = require_platform(request, "export deliveries are for finance and admins")
    page = get_destinations_page(scope=scope, today=timezone.now().date())
    if not any(d.id == destination_id and d.enabled for d in page.destinations):
        messages.error(request, _("No enabled destination with id %(id)s.") % {"id": destination_id})
        return _render(request, scope, status=400)
    tasks.deliver_focus_dataset.delay(destination_id, request.user.get_username())
    messages.success(request, _("Delivery requested: the history below shows it within a minute."))
    return redirect("export-destinations")
