"""The 403 page's handler (config/urls.py `handler403`): Django's own passes only the exception's
text, which for the role checks is the view's English note; this one says whom the page is for in
the reader's language (billing.web.access.RoleRequired). 404 and 500 use Django's handlers with
templates/404.html and templates/500.html."""

from __future__ import annotations

from django.http import HttpRequest, HttpResponse, HttpResponseForbidden
from django.template import loader

from billing.web.access import RoleRequired

__all__ = ["permission_denied"]


def permission_denied(request: HttpRequest, exception: Exception) -> HttpResponse:
    # Otherwise a view's own message, written for people (translated where it is raised).
    context = {"audience": exception.audience} if isinstance(exception, RoleRequired) else {"reason": str(exception)}
    return HttpResponseForbidden(loader.render_to_string("403.html", context, request))
