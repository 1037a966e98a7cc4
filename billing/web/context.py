"""Template context: the user's scope, so navigation shows only what the user may open."""

from __future__ import annotations

from django.http import HttpRequest
from django.utils.functional import SimpleLazyObject

from billing.scope import get_scope


def scope(request: HttpRequest) -> dict[str, object]:
    return {"scope": SimpleLazyObject(lambda: get_scope(request.user))}
