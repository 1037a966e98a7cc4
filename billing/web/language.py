"""Language per user: the choice is stored on the user (so it follows them to any browser) and
activated on every request after authentication; anonymous visitors keep Django's cookie."""

from __future__ import annotations

from collections.abc import Callable

from django.contrib.auth.models import User
from django.http import HttpRequest, HttpResponse, HttpResponseBadRequest
from django.utils import translation
from django.views.decorators.http import require_POST
from django.views.i18n import set_language as django_set_language

from billing.errors import InvalidInput
from billing.services.identity import set_user_language, user_language


class UserLanguageMiddleware:
    """Runs after AuthenticationMiddleware: a signed-in user's stored language wins over the
    cookie and the browser's Accept-Language."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        user = getattr(request, "user", None)
        if isinstance(user, User) and user.is_authenticated:
            language = user_language(user)
            if language:
                translation.activate(language)
                request.LANGUAGE_CODE = translation.get_language()
        return self.get_response(request)


@require_POST
def set_language(request: HttpRequest) -> HttpResponse:
    language = request.POST.get("language", "")
    if isinstance(request.user, User) and request.user.is_authenticated:
        try:
            set_user_language(user=request.user, language=language)
        except InvalidInput as exc:
            return HttpResponseBadRequest(str(exc))
        # The stored preference must not be undone by a stale cookie in this response.
        translation.activate(language)
    return django_set_language(request)
