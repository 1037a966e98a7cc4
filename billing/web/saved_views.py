"""Saved views (`/views/`, docs/saved-views.md): a user saves the finance dashboard, Explore or a
tenant's portal with its query string under a name, opens, renames and deletes it, and schedules it
as an e-mailed report. A view's query is checked by the page's own form (PeriodForm, ExploreForm)
when saved and again, with the owner's scope, when a report is sent; the report is the page's own
CSV download, rendered as the owner."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from datetime import date
from urllib.parse import urlencode

from django import forms
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.contrib.auth.models import User
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpRequest, HttpResponse, QueryDict
from django.shortcuts import redirect, render
from django.urls import Resolver404, resolve, reverse
from django.utils import timezone
from django.utils.translation import gettext as _
from django.utils.translation import gettext_lazy
from django.views.decorators.http import require_POST

from billing.errors import InvalidInput
from billing.models import SavedView
from billing.queries.saved_views import ViewNotFound, get_saved_view, list_saved_views, tenant_visible
from billing.scope import Scope, get_scope
from billing.services.saved_views import (
    MAX_RECIPIENTS,
    Report,
    ScheduleInput,
    create_view,
    delete_schedule,
    delete_view,
    rename_view,
    report_period,
    saved_dates,
    send_now,
    set_schedule,
)
from billing.web import explore, portal, views
from billing.web.forms import ExploreForm, PeriodForm

# The pages a view may be of: URL name -> the form that checks its query string. Only what the
# form reads may be saved (`format` and `table` are downloads, not views).
_PAGES: dict[str, type[PeriodForm]] = {"finance-overview": PeriodForm, "explore": ExploreForm,
                                       "tenant-portal": PeriodForm}


@dataclass(frozen=True)
class CheckedView:
    url_name: str
    slug: str  # the portal's tenant
    query: dict[str, str]  # the page's parameters, dates in ISO
    start: date
    end: date


def _page_label(url_name: str) -> str:
    return {"finance-overview": _("the finance dashboard"), "explore": _("Explore"),
            "tenant-portal": _("a tenant's portal")}[url_name]


def check_view(scope: Scope, path: str, query: str, *, today: date) -> CheckedView:
    """The page and query string as its page reads them, or InvalidInput saying why not: another
    page, a parameter the page does not take, a period or filter its form refuses, a tenant out of
    `scope`. No period: the page's default, the month to date."""
    try:
        match = resolve(path)
    except Resolver404:
        match = None
    if match is None or match.url_name not in _PAGES:
        raise InvalidInput(_("path: only the finance dashboard (/finance/), Explore (/explore/) and a tenant's portal "
                             "(/tenants/<tenant>/) can be saved, not “%(path)s”.") % {"path": path[:200]})
    url_name, slug = match.url_name, str(match.kwargs.get("slug", ""))
    form_class = _PAGES[url_name]
    data = QueryDict(query)
    unknown = sorted(set(data) - set(form_class.base_fields))
    if unknown:
        raise InvalidInput(_("query: %(page)s does not take %(names)s.")
                           % {"page": _page_label(url_name), "names": ", ".join(unknown)})
    repeated = sorted(k for k in data if len(data.getlist(k)) > 1)
    if repeated:
        raise InvalidInput(_("query: %(names)s given more than once.") % {"names": ", ".join(repeated)})
    given = {k: str(v) for k, v in data.items() if v}
    if not {"start", "end"} & set(given):
        given.update({k: v.isoformat() for k, v in PeriodForm.default_initial(today).items()})
    form = form_class(given)
    if not form.is_valid():
        errors = " ".join(str(e) for errs in form.errors.values() for e in errs)
        raise InvalidInput(_("query: %(errors)s") % {"errors": errors})
    tenant = slug or str(form.cleaned_data.get("tenant", "")).strip()
    if tenant and not tenant_visible(scope, tenant):
        raise InvalidInput(_("tenant: you may not see a tenant called “%(tenant)s”.") % {"tenant": tenant[:100]})
    start, end = form.cleaned_data["start"], form.cleaned_data["end"]
    given.update({"start": start.isoformat(), "end": end.isoformat()})
    return CheckedView(url_name=url_name, slug=slug, query=given, start=start, end=end)


def relative_period(start: date, end: date, today: date) -> str:
    """The quick period (billing.web.views.quick_periods) the dates are today, or "fixed"."""
    for link in views.quick_periods(today, PeriodForm()):
        if link["query"] == urlencode({"start": start.isoformat(), "end": end.isoformat()}):
            return str(link["key"])
    return "fixed"


def view_query(view: SavedView, today: date) -> str:
    """The view's query string with its period as of `today` (a quick period moves with the calendar)."""
    start, end = report_period(view.period, on=today, saved=saved_dates(view))
    data = dict(QueryDict(view.query).items())
    data.update({"start": start.isoformat(), "end": end.isoformat()})
    return urlencode(data)


# --- the report: the page's own CSV, as the owner ---------------------------------------------

_FILENAME = re.compile(r'filename="([^"]+)"')


def _page_view(url_name: str) -> Callable[..., HttpResponse]:
    """The page's own view (wrapped by login_required and one_snapshot, as a request meets it)."""
    found: Callable[..., HttpResponse] = getattr(
        {"finance-overview": views, "explore": explore, "tenant-portal": portal}[url_name],
        {"finance-overview": "finance_overview", "explore": "explore", "tenant-portal": "tenant_portal"}[url_name])
    return found


def render_report(view: SavedView, start: date, end: date) -> Report:
    """The CSV download of the view's page for [start, end], built by the page itself for the owner
    (their scope, checked again now). InvalidInput when the owner may no longer see it."""
    owner = User.objects.get(pk=view.owner_id)
    checked = check_view(get_scope(owner), view.path, view.query, today=start)
    query = {**checked.query, "start": start.isoformat(), "end": end.isoformat()}
    request = HttpRequest()
    request.method = "GET"
    request.path = request.path_info = view.path
    request.GET = QueryDict(urlencode({**query, "format": "csv"}))
    request.user = owner
    page = _page_view(checked.url_name)
    try:
        response = page(request, checked.slug) if checked.slug else page(request)
    except Http404 as exc:
        raise InvalidInput(_("The owner may no longer see this page.")) from exc
    if response.status_code != 200:
        raise InvalidInput(response.content.decode(errors="replace")[:500] or str(response.status_code))
    found = _FILENAME.search(response.get("Content-Disposition", ""))
    return Report(filename=found.group(1) if found else "report.csv", content=response.content,
                  mimetype="text/csv", link=f"{view.path}?{urlencode(query)}")


# --- pages --------------------------------------------------------------------------------------

class SaveViewForm(forms.Form):
    name = forms.CharField(label=gettext_lazy("Name"), max_length=100)
    path = forms.CharField(max_length=300, widget=forms.HiddenInput)
    query = forms.CharField(max_length=4000, required=False, widget=forms.HiddenInput)


_WEEKDAYS = [(0, gettext_lazy("Monday")), (1, gettext_lazy("Tuesday")), (2, gettext_lazy("Wednesday")),
             (3, gettext_lazy("Thursday")), (4, gettext_lazy("Friday")), (5, gettext_lazy("Saturday")),
             (6, gettext_lazy("Sunday"))]


class ScheduleForm(forms.Form):
    """Shapes only: the service checks the combination and the addresses."""

    frequency = forms.ChoiceField(label=gettext_lazy("Send"), choices=[
        ("daily", gettext_lazy("Daily")), ("weekly", gettext_lazy("Weekly")), ("monthly", gettext_lazy("Monthly"))])
    weekday = forms.TypedChoiceField(label=gettext_lazy("on (weekly)"), choices=_WEEKDAYS, coerce=int, required=False,
                                     empty_value=None)
    day_of_month = forms.IntegerField(label=gettext_lazy("on day (monthly)"), min_value=1, max_value=31,
                                      required=False)
    hour = forms.IntegerField(label=gettext_lazy("at hour (UTC)"), min_value=0, max_value=23, initial=8)
    format = forms.ChoiceField(label=gettext_lazy("Format"), choices=[("csv", gettext_lazy("CSV"))])
    recipients = forms.CharField(label=gettext_lazy("To"), max_length=5000,
                                 help_text=gettext_lazy("E-mail addresses, separated by commas (at most 20)."),
                                 widget=forms.TextInput(attrs={"size": 40}))

    def to_input(self) -> ScheduleInput:
        d = self.cleaned_data
        return ScheduleInput(frequency=d["frequency"], hour=d["hour"], weekday=d["weekday"],
                             day_of_month=d["day_of_month"], format=d["format"],
                             recipients=tuple(re.split(r"[,;\s]+", d["recipients"])))


def _owner(request: HttpRequest) -> int:
    """The signed-in user's id (every page here is login_required): whose views these are."""
    user = request.user
    if not isinstance(user, User):
        raise PermissionDenied("saved views are a signed-in user's own")
    return user.pk


def _list(request: HttpRequest, *, error: str = "", status: int = 200) -> HttpResponse:
    rows = list_saved_views(owner_id=_owner(request), now=timezone.now())
    return render(request, "billing/saved_views.html", {"views": rows, "error": error}, status=status)


@login_required
def saved_views(request: HttpRequest) -> HttpResponse:
    """GET: the user's own views. POST: save the view a page's "Save this view" form names."""
    if request.method != "POST":
        return _list(request)
    form = SaveViewForm(request.POST)
    if not form.is_valid():
        return _list(request, error=" ".join(str(e) for errs in form.errors.values() for e in errs), status=400)
    now = timezone.now()
    try:
        checked = check_view(get_scope(request.user), form.cleaned_data["path"], form.cleaned_data["query"],
                             today=now.date())
        view = create_view(owner_id=_owner(request), name=form.cleaned_data["name"], path=form.cleaned_data["path"],
                           query=urlencode(checked.query),
                           period=relative_period(checked.start, checked.end, now.date()), now=now,
                           actor_label=request.user.get_username())
    except InvalidInput as exc:
        return _list(request, error=str(exc), status=400)
    messages.success(request, _("View “%(name)s” saved.") % {"name": view.name})
    return redirect("saved-view", view_id=view.pk)


def _detail(request: HttpRequest, view_id: int, *, form: ScheduleForm | None = None, error: str = "",
            status: int = 200) -> HttpResponse:
    try:
        page = get_saved_view(owner_id=_owner(request), view_id=view_id, now=timezone.now())
    except ViewNotFound as exc:
        raise Http404("no such view") from exc
    schedule = page.view.schedule
    if form is None:
        initial = ({"frequency": schedule.frequency, "weekday": schedule.weekday, "day_of_month": schedule.day_of_month,
                    "hour": schedule.hour, "format": schedule.format, "recipients": ", ".join(schedule.recipients)}
                   if schedule else {"recipients": getattr(request.user, "email", "")})
        form = ScheduleForm(initial=initial)
    context = {"page": page, "form": form, "error": error, "max_recipients": MAX_RECIPIENTS,
               "open_url": reverse("saved-view-open", args=[view_id])}
    return render(request, "billing/saved_view.html", context, status=status)


@login_required
def saved_view(request: HttpRequest, view_id: int) -> HttpResponse:
    return _detail(request, view_id)


@login_required
def saved_view_open(request: HttpRequest, view_id: int) -> HttpResponse:
    """The page, with the view's period as of today."""
    view = SavedView.objects.filter(pk=view_id, owner_id=_owner(request)).first()
    if view is None:
        raise Http404("no such view")
    return redirect(f"{view.path}?{view_query(view, timezone.now().date())}")


def _act(request: HttpRequest, view_id: int, action: str) -> HttpResponse:
    """One change to the user's own view; InvalidInput is the page again with the reason, a 400."""
    now, actor = timezone.now(), request.user.get_username()
    try:
        if action == "rename":
            rename_view(view_id=view_id, owner_id=_owner(request), name=request.POST.get("name", ""), now=now,
                        actor_label=actor)
            messages.success(request, _("View renamed."))
        elif action == "delete":
            delete_view(view_id=view_id, owner_id=_owner(request), now=now, actor_label=actor)
            messages.success(request, _("View deleted."))
            return redirect("saved-views")
        elif action == "unschedule":
            delete_schedule(view_id=view_id, owner_id=_owner(request), now=now, actor_label=actor)
            messages.success(request, _("Schedule removed: no more reports are sent."))
        elif action == "send":
            send = send_now(view_id=view_id, owner_id=_owner(request), now=now, actor_label=actor,
                            render=render_report)
            (messages.success if send.status == "sent" else messages.error)(
                request, _("Report %(status)s.") % {"status": send.get_status_display()})
    except InvalidInput as exc:
        return _detail(request, view_id, error=str(exc), status=400)
    return redirect("saved-view", view_id=view_id)


@login_required
@require_POST
def saved_view_schedule(request: HttpRequest, view_id: int) -> HttpResponse:
    form = ScheduleForm(request.POST)
    if not form.is_valid():
        return _detail(request, view_id, form=form, status=400)
    try:
        set_schedule(view_id=view_id, owner_id=_owner(request), values=form.to_input(), now=timezone.now(),
                     actor_label=request.user.get_username())
    except InvalidInput as exc:
        return _detail(request, view_id, form=form, error=str(exc), status=400)
    messages.success(request, _("Schedule saved."))
    return redirect("saved-view", view_id=view_id)


@login_required
@require_POST
def saved_view_action(request: HttpRequest, view_id: int, action: str) -> HttpResponse:
    return _act(request, view_id, action)


__all__ = ["CheckedView", "check_view", "relative_period", "render_report", "saved_view",
           "saved_view_action", "saved_view_open", "saved_view_schedule", "saved_views", "view_query"]
