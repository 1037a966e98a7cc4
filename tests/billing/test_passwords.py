"""People's passwords: stored with Argon2id at the parameters billing/services/identity/passwords.py
argues for; a password stored with PBKDF2 before still logs in and is rewritten as Argon2id then;
a wrong password is refused as before."""

from __future__ import annotations

import pytest
from django.contrib.auth.hashers import check_password, identify_hasher, make_password
from django.contrib.auth.models import User
from django.test import Client

from billing.services.identity.passwords import Argon2idHasher
from tests.conftest import USER_PASSWORD as PASSWORD
from tests.conftest import user_in

pytestmark = pytest.mark.django_db


def test_a_new_password_is_stored_with_argon2id_at_32_mib_and_2_passes():
    # create_user's own hashing (user_in stores one hash made once for every user it creates).
    user = User.objects.create_user(username="new-user", password=PASSWORD)
    assert user.password.startswith("argon2$argon2id$v=19$m=32768,t=2,p=1$")
    assert isinstance(identify_hasher(user.password), Argon2idHasher)
    assert check_password(PASSWORD, user.password)
    assert not check_password(PASSWORD + "x", user.password)


def test_a_password_stored_with_pbkdf2_logs_in_and_is_rewritten_as_argon2id():
    user = user_in(tenant="acme")
    User.objects.filter(pk=user.pk).update(password=make_password(PASSWORD, hasher="pbkdf2_sha256"))
    assert User.objects.get(pk=user.pk).password.startswith("pbkdf2_sha256$1000000$")
    client = Client()
    refused = client.post("/accounts/login/", {"username": user.username, "password": "wrong-" + PASSWORD})
    assert refused.status_code == 200  # the form again, with its error
    assert User.objects.get(pk=user.pk).password.startswith("pbkdf2_sha256$")  # a failure rewrites nothing
    answer = client.post("/accounts/login/", {"username": user.username, "password": PASSWORD})
    assert answer.status_code == 302
    stored = User.objects.get(pk=user.pk).password
    assert stored.startswith("argon2$argon2id$v=19$m=32768,t=2,p=1$")
    assert check_password(PASSWORD, stored)
