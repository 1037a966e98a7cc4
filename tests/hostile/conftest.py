"""Shared helpers of the hostile-input suite: real HTTP requests to pytest-django's live server
(loopback), as an attacker or a careless client would send them.

Every helper that sends a request fails the test on any 5xx: a hostile input must be refused
(4xx) or handled, never crash the service. Files in this folder use these fixtures or only the
standard ones (live_server, db, transactional_db, client) and tests/conftest.py's helpers."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import requests

from billing.services.identity.tokens import IssuedToken, issue_node_token
from tests import clock
from tests.conftest import user_in

__all__ = ["PASSWORD", "HostileSession", "assert_no_5xx", "bearer", "sign_in"]

# The password tests/conftest.py's user_in gives every user.
PASSWORD = "pw-not-used-123"


def assert_no_5xx(response: requests.Response) -> requests.Response:
    """The response, after failing the test if the server answered 5xx."""
    assert response.status_code < 500, (
        f"{response.request.method} {response.url} answered {response.status_code}: {response.text[:500]}")
    return response


class HostileSession:
    """A requests.Session bound to the live server: relative URLs, a short timeout, every
    answer checked for 5xx, and the CSRF token of the last page kept for form posts."""

    def __init__(self, base_url: str) -> None:
        self.base_url = base_url.rstrip("/")
        self.http = requests.Session()

    def request(self, method: str, path: str, **kwargs: Any) -> requests.Response:
        kwargs.setdefault("timeout", 30)
        kwargs.setdefault("allow_redirects", False)
        return assert_no_5xx(self.http.request(method, self.base_url + path, **kwargs))

    def get(self, path: str, **kwargs: Any) -> requests.Response:
        return self.request("GET", path, **kwargs)

    def post(self, path: str, **kwargs: Any) -> requests.Response:
        return self.request("POST", path, **kwargs)

    @property
    def csrf_token(self) -> str:
        return self.http.cookies.get("csrftoken") or ""

    def post_form(self, path: str, data: dict[str, str] | None = None, **kwargs: Any) -> requests.Response:
        """A form POST as the browser sends it: the CSRF token from the cookie and the page's
        Origin (Django compares it with the host)."""
        if not self.csrf_token:
            self.get("/accounts/login/")  # sets the csrftoken cookie
        headers = {"Origin": self.base_url, "Referer": self.base_url + path, **kwargs.pop("headers", {})}
        return self.post(path, data={"csrfmiddlewaretoken": self.csrf_token, **(data or {})}, headers=headers,
                         **kwargs)


def sign_in(session: HostileSession, username: str, password: str = PASSWORD) -> requests.Response:
    """Sign in through the login form over HTTP, CSRF token included; the answer of the POST
    (302 on success, 200 with the form again on a wrong password, 429 when locked out)."""
    page = session.get("/accounts/login/")
    assert page.status_code == 200
    match = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page.text)
    assert match, "the login form carries a CSRF token"
    return session.post("/accounts/login/", data={"username": username, "password": password,
                                                  "csrfmiddlewaretoken": match.group(1)},
                        headers={"Origin": session.base_url, "Referer": session.base_url + "/accounts/login/"})


@pytest.fixture
def hostile(live_server) -> Iterator[HostileSession]:
    """An anonymous session against the live server."""
    session = HostileSession(live_server.url)
    yield session
    session.http.close()


@pytest.fixture
def new_session(live_server) -> Iterator[Callable[[], HostileSession]]:
    """More sessions (other users, other clients) against the same live server."""
    made: list[HostileSession] = []

    def make() -> HostileSession:
        made.append(HostileSession(live_server.url))
        return made[-1]

    yield make
    for s in made:
        s.http.close()


@pytest.fixture
def signed_in(live_server, new_session) -> Callable[..., HostileSession]:
    """signed_in(group=None, tenant=None): a session signed in as a new user_in(group, tenant)."""

    def make(group: str | None = None, tenant: str | None = None) -> HostileSession:
        user = user_in(group, tenant)
        session = new_session()
        assert sign_in(session, user.username).status_code == 302
        return session

    return make


@pytest.fixture
def node_token_for(transactional_db) -> Callable[[str], IssuedToken]:
    """node_token_for(name): a new node token (node created when missing), as `create_node_token` issues it."""

    def issue(name: str) -> IssuedToken:
        return issue_node_token(node_name=name, now=clock.now(), actor_label="hostile-test")

    return issue


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}
