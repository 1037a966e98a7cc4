"""Language per user: the choice is stored on the user and wins over the cookie and the
browser's Accept-Language; money and numbers follow the active language's format."""

from __future__ import annotations

from decimal import Decimal

import pytest
from django.contrib.auth.models import User
from django.test import Client
from django.utils import translation

from billing.models import UserPreference
from billing.templatetags.ledger import money, number

pytestmark = pytest.mark.django_db


@pytest.fixture
def user() -> User:
    return User.objects.create_user(username="lin", password="a-long-test-password-1")


def _lang(response) -> str:
    return response.headers["Content-Language"]


def test_choice_is_stored_on_the_user_and_follows_them_to_a_new_browser(user):
    first = Client(HTTP_ACCEPT_LANGUAGE="en")
    first.force_login(user)
    response = first.post("/i18n/setlang/", {"language": "zh-hans", "next": "/finance/"})
    assert response.status_code == 302
    assert response["Location"] == "/finance/"
    assert UserPreference.objects.get(user=user).language == "zh-hans"
    # Another browser: no language cookie, English Accept-Language — the user's choice still wins.
    second = Client(HTTP_ACCEPT_LANGUAGE="en")
    second.force_login(user)
    page = second.get("/finance/")
    assert _lang(page) == "zh-hans"
    assert "发票" in page.content.decode()
    # Even a stale cookie naming English loses to the stored choice.
    second.cookies["django_language"] = "en"
    assert _lang(second.get("/finance/")) == "zh-hans"


def test_switching_back_is_stored_too(user):
    client = Client()
    client.force_login(user)
    client.post("/i18n/setlang/", {"language": "zh-hans", "next": "/finance/"})
    client.post("/i18n/setlang/", {"language": "en", "next": "/finance/"})
    assert UserPreference.objects.get(user=user).language == "en"
    assert _lang(Client(HTTP_ACCEPT_LANGUAGE="zh-hans").get("/accounts/login/")) == "zh-hans"
    fresh = Client(HTTP_ACCEPT_LANGUAGE="zh-hans")
    fresh.force_login(user)
    assert _lang(fresh.get("/finance/")) == "en"


def test_unknown_language_is_refused_and_changes_nothing(user):
    client = Client()
    client.force_login(user)
    client.post("/i18n/setlang/", {"language": "zh-hans", "next": "/finance/"})
    response = client.post("/i18n/setlang/", {"language": "klingon", "next": "/finance/"})
    assert response.status_code == 400
    assert "klingon" in response.content.decode()
    assert UserPreference.objects.get(user=user).language == "zh-hans"


def test_anonymous_visitors_keep_the_cookie_and_store_nothing():
    client = Client()
    response = client.post("/i18n/setlang/", {"language": "zh-hans", "next": "/accounts/login/"})
    assert response.status_code == 302
    assert client.cookies["django_language"].value == "zh-hans"
    assert not UserPreference.objects.exists()
    assert _lang(client.get("/accounts/login/")) == "zh-hans"


def test_setting_the_language_needs_csrf(user):
    client = Client(enforce_csrf_checks=True)
    client.force_login(user)
    assert client.post("/i18n/setlang/", {"language": "zh-hans"}).status_code == 403
    assert not UserPreference.objects.exists()


@pytest.mark.parametrize("language", ["en", "zh-hans"])
def test_money_groups_thousands_rounds_half_even_and_names_the_currency(language):
    with translation.override(language):
        assert money(Decimal("1234567.125"), "USD") == "1,234,567.12 USD"
        assert money(Decimal("0.135"), "CNY") == "0.14 CNY"
        assert money(None, "USD") == ""
        assert number(Decimal("81920.5"), 1) == "81,920.5"
