"""API tokens (docs/api.md): `manage.py create_api_token` and the API tokens page issue a `vgla_…`
token shown once and stored hashed; `Authorization: Bearer` makes a request its user's, with
exactly that user's scope; revoked, expired, unknown tokens and inactive users answer 401 with a
challenge; use is recorded at most once a minute; every change is audited. The read API is not
built here, so the authentication is tested on a test-only view, through the real middleware
(this module is its own URLconf)."""

from __future__ import annotations

import hashlib
import re
from datetime import timedelta
from io import StringIO

import pytest
from django.contrib.auth.models import User
from django.core.management import CommandError, call_command
from django.test import Client
from django.urls import path
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from billing.models import ApiToken, AuditEvent
from billing.scope import ADMIN_GROUP, FINANCE_GROUP, get_scope
from billing.services.identity import tokens
from billing.services.identity.api_tokens import authenticate_api_token, issue_api_token, revoke_api_token
from billing.urls import urlpatterns as app_urls
from tests import clock
from tests.conftest import user_in

pytestmark = pytest.mark.django_db

TOKEN_RE = re.compile(r'data-testid="issued-api-token">(vgla_[A-Za-z0-9_-]+)<')


def issued_token(page: str) -> str:
    """The token that the page shows once, right after it was issued."""
    match = TOKEN_RE.search(page)
    assert match is not None, "the page shows no issued token"
    return match.group(1)


class WhoAmI(APIView):  # type: ignore[misc]  # DRF ships no type hints
    """What a read API view sees of its caller: the user, and the scope the queries get."""

    def get(self, request: Request) -> Response:
        scope = get_scope(request.user)
        return Response({"user": request.user.username,
                         "tenants": None if scope.tenants is None else sorted(scope.tenants)})

    def post(self, request: Request) -> Response:
        return Response({"user": request.user.username}, status=201)


urlpatterns = [path("test/whoami", WhoAmI.as_view()), *app_urls]
as_test_urls = pytest.mark.urls("tests.billing.test_api_tokens")


def issue(user: User, **kwargs) -> str:
    return issue_api_token(username=user.username, name=kwargs.pop("name", "script"),
                           expires_at=kwargs.pop("expires_at", None), now=clock.now(), actor_label="test",
                           **kwargs).token


def call(client: Client, token: str | None, method: str = "get") -> tuple[int, dict, str]:
    headers = {"HTTP_AUTHORIZATION": f"Bearer {token}"} if token is not None else {}
    resp = getattr(client, method)("/test/whoami", **headers)
    return resp.status_code, resp.json(), resp.headers.get("WWW-Authenticate", "")


# --- authentication ----------------------------------------------------------------------------

@as_test_urls
def test_a_token_acts_as_its_user_with_exactly_the_users_scope(client):
    member, finance = user_in(tenant="acme"), user_in(FINANCE_GROUP)
    assert call(client, issue(member)) == (200, {"user": member.username, "tenants": ["acme"]}, "")
    assert call(client, issue(finance)) == (200, {"user": finance.username, "tenants": None}, "")


@as_test_urls
def test_no_token_or_a_bad_one_answers_401_with_a_challenge_in_the_error_shape(client):
    user = user_in(tenant="acme")
    revoked, expiring, inactive = issue(user), issue(user), issue(user_in(tenant="globex"))
    revoke_api_token(token_id=ApiToken.objects.get(prefix=revoked[:13]).pk, now=clock.now(), actor_label="test")
    ApiToken.objects.filter(prefix=expiring[:13]).update(expires_at=clock.now() - timedelta(seconds=1))
    User.objects.filter(username="u-None-globex").update(is_active=False)
    cases = {None: "credentials were not provided", "vgla_not-a-token": "unknown API token",
             revoked: "was revoked", expiring: "expired", inactive: "inactive user"}
    for token, reason in cases.items():
        status, body, challenge = call(client, token)
        assert status == 401, token
        assert challenge == 'Bearer realm="vgpu-ledger"', token
        assert len(body["errors"]) == 1
        assert body["errors"][0]["path"] == "$"
        assert reason in body["errors"][0]["message"], (token, body)


@as_test_urls
def test_a_node_token_is_no_api_token_and_an_api_token_is_no_node_token(client, node_token):
    # A node token is not this class's: the view sees no user, hence 401.
    assert call(client, node_token.token)[0] == 401
    api = issue(user_in(ADMIN_GROUP))
    resp = client.get("/api/v1/nodes/gpu-node-1/policy", HTTP_AUTHORIZATION=f"Bearer {api}")
    assert resp.status_code == 401
    assert "API token" in resp.json()["errors"][0]["message"]
    # ...and the agent endpoints still take their node's token.
    ok = client.get("/api/v1/nodes/gpu-node-1/policy", HTTP_AUTHORIZATION=f"Bearer {node_token.token}")
    assert ok.status_code == 200


@as_test_urls
def test_a_signed_in_browser_still_works_and_keeps_its_csrf_check():
    browser = Client(enforce_csrf_checks=True)
    user = user_in(tenant="acme")
    browser.force_login(user)
    assert call(browser, None) == (200, {"user": user.username, "tenants": ["acme"]}, "")
    # A cookie-authenticated write without the CSRF token is refused; a bearer token needs none.
    status, body, _ = call(browser, None, "post")
    assert status == 403
    assert "CSRF" in body["errors"][0]["message"]
    assert call(Client(enforce_csrf_checks=True), issue(user), "post")[0] == 201


def test_the_class_itself_leaves_other_credentials_alone_and_keeps_the_token_out_of_request_auth():
    from rest_framework.test import APIRequestFactory

    from billing.api.auth import ApiTokenAuthentication

    factory, auth = APIRequestFactory(), ApiTokenAuthentication()
    user = user_in(tenant="acme")
    token = issue(user)

    def authenticate(header: str | None):
        extra = {"HTTP_AUTHORIZATION": header} if header is not None else {}
        return auth.authenticate(Request(factory.get("/", **extra)))

    assert authenticate(f"Bearer {token}") == (user, None)
    assert authenticate(f"bearer   {token} ") == (user, None)  # the scheme is case-insensitive (RFC 7235)
    for other in (None, "", "Bearer", "Bearer vgl_a-node-token", "Basic dXNlcjpwdw==", f"Token {token}"):
        assert authenticate(other) is None, other
    assert auth.authenticate_header(Request(factory.get("/"))) == 'Bearer realm="vgpu-ledger"'


def test_use_is_recorded_at_most_once_a_minute_per_token(django_assert_num_queries):
    user = user_in(tenant="acme")
    token = issue(user)
    with django_assert_num_queries(2):  # the look-up, and the first use's write
        assert authenticate_api_token(token, now=clock.now()) == user
    first = ApiToken.objects.get(prefix=token[:13]).last_used_at
    assert first is not None
    with django_assert_num_queries(1):  # within the minute: the look-up only
        authenticate_api_token(token, now=clock.now())
    tokens._used.clear()  # as if a minute had passed in this process
    authenticate_api_token(token, now=clock.now())
    second = ApiToken.objects.get(prefix=token[:13]).last_used_at
    assert second is not None
    assert second > first


@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
@given(guess=st.text(alphabet="ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_", max_size=60))
def test_only_an_issued_token_authenticates(guess):
    """Whatever follows the prefix, a string that is not an issued token is refused."""
    user = User.objects.get_or_create(username="prop")[0]
    real = issue(user)
    candidate = "vgla_" + guess
    if candidate == real:
        return
    with pytest.raises(Exception, match="unknown API token"):
        authenticate_api_token(candidate, now=clock.now())


# --- the service and the commands --------------------------------------------------------------

def test_the_command_prints_a_token_stored_hashed_and_audited():
    user = user_in(tenant="acme")
    out = StringIO()
    call_command("create_api_token", user.username, "--name", "grafana", "--expires-days", "30", stdout=out)
    token = out.getvalue().strip()
    row = ApiToken.objects.get()
    assert token.startswith("vgla_")
    assert token.startswith(row.prefix)
    assert len(row.prefix) == 13
    assert row.token_sha256 == hashlib.sha256(token.encode()).hexdigest()
    assert token not in (row.prefix, row.name)
    assert row.user == user
    assert row.name == "grafana"
    assert row.created_by is None
    assert row.expires_at is not None
    assert timedelta(days=30) - timedelta(minutes=1) < row.expires_at - clock.now() <= timedelta(days=30)
    event = AuditEvent.objects.get(action="api_token.issued")
    assert event.actor_label == "cli"
    assert event.after is not None
    assert event.after["user"] == user.username
    assert token not in str(event.after)

    call_command("revoke_api_token", row.prefix + "…", stdout=StringIO())
    assert ApiToken.objects.get().revoked_at is not None
    assert AuditEvent.objects.filter(action="api_token.revoked", object_id=str(row.pk)).count() == 1
    call_command("revoke_api_token", str(row.pk), stdout=StringIO())  # again: nothing more happens
    assert AuditEvent.objects.filter(action="api_token.revoked").count() == 1


@pytest.mark.parametrize(("args", "message"), [
    (["nobody"], "no user named 'nobody'"),
    (["inactive"], "inactive"),
    (["inactive", "--expires-days", "0"], "expiry must be 1 to 3650 days"),
    (["inactive", "--name", "x" * 101], "at most 100"),
])
def test_the_command_refuses_with_a_clear_message_and_issues_nothing(args, message):
    User.objects.create_user(username="inactive", is_active=False)
    with pytest.raises(CommandError, match=message):
        call_command("create_api_token", *args, stdout=StringIO())
    assert not ApiToken.objects.exists()
    assert not AuditEvent.objects.exists()


@pytest.mark.parametrize(("given", "message"), [
    ("vgla_nothing", "no active API token matches"), ("999999", "no active API token matches"),
    ("vgl_abcdefgh", "neither a token id nor a prefix"),
])
def test_revoke_command_refuses_what_it_cannot_name(given, message):
    with pytest.raises(CommandError, match=message):
        call_command("revoke_api_token", given, stdout=StringIO())


def test_only_admins_issue_or_revoke_for_someone_else():
    alice, bob = user_in(tenant="acme"), user_in(tenant="globex")
    with pytest.raises(Exception, match="only platform admins"):
        issue(bob, actor_id=alice.pk, actor_is_admin=False)
    bobs = ApiToken.objects.get(prefix=issue(bob)[:13])
    with pytest.raises(Exception, match=f"no API token with id {bobs.pk}"):
        revoke_api_token(token_id=bobs.pk, now=clock.now(), actor_label="alice", actor_id=alice.pk,
                         actor_is_admin=False)
    assert ApiToken.objects.get(pk=bobs.pk).revoked_at is None


# --- the page ----------------------------------------------------------------------------------

def test_a_member_issues_and_revokes_their_own_token_and_sees_no_one_elses(client):
    other = ApiToken.objects.get(prefix=issue(user_in(tenant="globex"), name="theirs")[:13])
    me = user_in(tenant="acme")
    client.force_login(me)
    page = client.get("/api-tokens/").content.decode()
    assert 'data-testid="nav-api-tokens"' in page
    assert "theirs" not in page
    assert other.prefix not in page

    resp = client.post("/api-tokens/", {"username": me.username, "name": "my script", "expires_days": "7"})
    assert resp.status_code == 200
    assert resp["Cache-Control"] == "no-store"
    token = issued_token(resp.content.decode())
    row = ApiToken.objects.get(prefix=token[:13])
    assert row.user == me
    assert row.created_by == me
    assert row.expires_at is not None
    assert AuditEvent.objects.get(action="api_token.issued", object_id=str(row.pk)).actor_id == me.pk

    # For someone else: refused, nothing issued. Another's token: not found.
    assert client.post("/api-tokens/", {"username": "u-None-globex", "name": "x"}).status_code == 400
    assert client.post(f"/api-tokens/{other.pk}/revoke/", {"confirm": other.prefix}).status_code == 404
    assert ApiToken.objects.count() == 2
    assert ApiToken.objects.get(pk=other.pk).revoked_at is None

    # Revoking needs the typed prefix.
    wrong = client.post(f"/api-tokens/{row.pk}/revoke/", {"confirm": "vgla_"})
    assert wrong.status_code == 400
    assert "to confirm" in wrong.content.decode()
    assert ApiToken.objects.get(pk=row.pk).revoked_at is None
    assert client.post(f"/api-tokens/{row.pk}/revoke/", {"confirm": row.prefix}).status_code == 302
    assert ApiToken.objects.get(pk=row.pk).revoked_at is not None
    assert AuditEvent.objects.filter(action="api_token.revoked", actor_id=me.pk).count() == 1


def test_an_admin_sees_every_token_and_issues_for_anyone(client):
    member = user_in(tenant="acme")
    theirs = ApiToken.objects.get(prefix=issue(member, name="member's")[:13])
    admin = user_in(ADMIN_GROUP)
    client.force_login(admin)
    page = client.get("/api-tokens/").content.decode()
    assert theirs.prefix in page
    assert member.username in page
    resp = client.post("/api-tokens/", {"username": member.username, "name": "for them"})
    token = issued_token(resp.content.decode())
    row = ApiToken.objects.get(prefix=token[:13])
    assert row.user == member
    assert row.created_by == admin
    assert row.expires_at is None
    assert client.post(f"/api-tokens/{theirs.pk}/revoke/", {"confirm": theirs.prefix}).status_code == 302
    event = AuditEvent.objects.get(action="api_token.revoked")
    assert event.actor_id == admin.pk
    assert event.before is not None
    assert event.before["user"] == member.username


@pytest.mark.parametrize(("form", "field"), [
    ({"name": "x", "expires_days": "0"}, "expires_days"), ({"name": "x" * 101}, "name"),
    ({"name": "x", "expires_days": "soon"}, "expires_days"),
])
def test_bad_form_input_answers_400_and_issues_nothing(client, form, field):
    me = user_in(tenant="acme")
    client.force_login(me)
    resp = client.post("/api-tokens/", {"username": me.username, **form})
    assert resp.status_code == 400
    assert 'data-testid="issue-api-token-error"' in resp.content.decode()
    assert not ApiToken.objects.exists()


def test_the_page_needs_a_signed_in_user(client):
    assert client.get("/api-tokens/").status_code == 302
    assert client.post("/api-tokens/", {"username": "x"}).status_code == 302
