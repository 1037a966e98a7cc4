"""A user's own preferences (the interface language). Not audited: a user's own display setting
changes nothing anyone else sees or is billed."""

from __future__ import annotations

from django.conf import settings
from django.contrib.auth.models import User

from billing.errors import InvalidInput
from billing.models import UserPreference

__all__ = ["set_user_language", "user_language"]


def _supported() -> set[str]:
    return {code for code, _name in settings.LANGUAGES}


def set_user_language(*, user: User, language: str) -> UserPreference:
    if language not in _supported():
        raise InvalidInput(f"language {language!r} is not one of {sorted(_supported())}")
    pref, _created = UserPreference.objects.update_or_create(user=user, defaults={"language": language})
    return pref


def user_language(user: User) -> str | None:
    """The stored language, or None when the user never chose one (or it is no longer offered)."""
    language = UserPreference.objects.filter(user=user).values_list("language", flat=True).first()
    return language if language in _supported() else None
