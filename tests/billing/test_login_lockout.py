"""Login throttling (django-axes on the real database): after the failure limit even the right
password is refused, with a proper page in the user's language, each lockout is audited once, and
an admin's `axes_reset` or the cool-off unlocks."""

from __future__ import annotations

from datetime import timedelta

import pytest
import time_machine
from django.conf import settings
from django.contrib.auth.models import User
from django.core.management import call_command
from django.test import Client

from billing.models import AuditEvent
from tests import clock

PASSWORD = "the-right-password-42"
LOGIN = "/accounts/login/"


@pytest.fixture
def alice(db):
    return User.objects.create_user(username="alice", password=PASSWORD)


def log_in(client: Client, password: str, username: str = "alice"):
    return client.post(LOGIN, {"username": username, "password": password})


def logged_in(client: Client) -> bool:
    return "_auth_user_id" in client.session


def fail(client: Client, times: int, username: str = "alice") -> None:
    for _ in range(times):
        log_in(client, "wrong-password", username)


@pytest.mark.django_db
def test_after_the_failure_limit_the_right_password_is_refused_with_the_lockout_page(alice, client):
    fail(client, settings.AXES_FAILURE_LIMIT - 1)
    # Below the limit: fine.
    assert log_in(client, PASSWORD).status_code == 302
    assert logged_in(client)
    client.logout()
    fail(client, settings.AXES_FAILURE_LIMIT)
    resp = log_in(client, PASSWORD)
    assert resp.status_code == 429
    assert not logged_in(client)
    page = resp.content.decode()
    assert 'data-testid="login-locked-out"' in page
    assert "Login locked" in page
    assert f"{settings.AXES_FAILURE_LIMIT} failed logins" in page
    assert f"{int(settings.AXES_COOLOFF_TIME.total_seconds() // 60)} minutes" in page


@pytest.mark.django_db
def test_the_lockout_page_speaks_simplified_chinese(alice):
    client = Client(HTTP_ACCEPT_LANGUAGE="zh-hans")
    fail(client, settings.AXES_FAILURE_LIMIT)
    page = log_in(client, PASSWORD).content.decode()
    assert "登录已锁定" in page
    assert 'lang="zh-hans"' in page


@pytest.mark.django_db
def test_a_lockout_is_audited_once_however_many_attempts_follow(alice, client):
    fail(client, settings.AXES_FAILURE_LIMIT + 3)
    log_in(client, PASSWORD)
    (event,) = AuditEvent.objects.filter(action="login.locked_out")
    assert event.object_type == "login"
    assert event.object_id == "alice"
    assert event.after == {"username": "alice", "ip_address": "127.0.0.1", "failure_limit": settings.AXES_FAILURE_LIMIT,
                           "cool_off_minutes": int(settings.AXES_COOLOFF_TIME.total_seconds() // 60)}


@pytest.mark.django_db
def test_the_lock_is_per_username_and_address(alice, client):
    User.objects.create_user(username="bob", password=PASSWORD)
    fail(client, settings.AXES_FAILURE_LIMIT)
    assert log_in(client, PASSWORD, "bob").status_code == 302  # another account from the same address
    elsewhere = Client(REMOTE_ADDR="192.0.2.10")
    # Alice from elsewhere.
    assert log_in(elsewhere, PASSWORD).status_code == 302
    assert logged_in(elsewhere)


@pytest.mark.django_db
def test_an_admin_unlocks_with_axes_reset(alice, client):
    fail(client, settings.AXES_FAILURE_LIMIT)
    assert log_in(client, PASSWORD).status_code == 429
    call_command("axes_reset")
    assert log_in(client, PASSWORD).status_code == 302
    assert logged_in(client)


@pytest.mark.django_db
def test_the_cool_off_unlocks_and_a_new_lockout_is_audited_again(alice, client):
    with time_machine.travel(clock.now(), tick=False) as traveller:
        fail(client, settings.AXES_FAILURE_LIMIT + 1)
        assert log_in(client, PASSWORD).status_code == 429
        traveller.shift(settings.AXES_COOLOFF_TIME + timedelta(seconds=1))
        assert log_in(client, PASSWORD).status_code == 302
        assert logged_in(client)
        client.logout()
        fail(client, settings.AXES_FAILURE_LIMIT)
        assert log_in(client, PASSWORD).status_code == 429
    assert AuditEvent.objects.filter(action="login.locked_out").count() == 2
