"""Budget webhooks reach only public addresses unless an admin allow-lists the place: checked at
send time, sent to exactly the checked address (no rebinding), no redirect followed, and every
refusal audited with its reason. Deliveries go to a real HTTP server on 127.0.0.1."""

from __future__ import annotations

import ipaddress
import socket
import threading
from decimal import Decimal
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, ClassVar

import pytest
from django.test import override_settings

from billing import tasks
from billing.models import AuditEvent, Tenant
from billing.services.budgets.spend import set_budget
from billing.services.budgets.webhooks import (
    DestinationRefused,
    forbidden_reason,
    parse_allow_list,
    post_to_destination,
    resolve_destination,
)
from tests import clock

NOBODY = parse_allow_list([])
PAYLOAD = {"event": "budget.state_changed", "tenant": "acme", "to": "enforced"}


@pytest.mark.parametrize(("address", "reason"), [
    ("127.0.0.1", "a loopback address"),
    ("10.1.2.3", "a private address"),
    ("172.16.0.1", "a private address"),
    ("192.168.1.1", "a private address"),
    ("169.254.169.254", "a link-local address"),
    ("224.0.0.1", "a multicast address"),
    ("0.0.0.0", "an unspecified address"),  # noqa: S104 - an address under test, nothing binds it
    ("240.0.0.1", "a reserved address"),
    ("100.64.0.1", "not a globally routable address"),
    ("::1", "a loopback address"),
    ("fd12:3456::1", "a private address"),
    ("fe80::1", "a link-local address"),
    ("ff02::1", "a multicast address"),
    ("::", "an unspecified address"),
    ("::ffff:127.0.0.1", "the IPv4-mapped form of a loopback address"),
    ("::ffff:10.0.0.1", "the IPv4-mapped form of a private address"),
    ("2002:a9fe:a9fe::1", "a 6to4 address embedding a link-local address"),
    ("93.184.215.14", None),
    ("2606:4700:4700::1111", None),
    ("::ffff:93.184.215.14", None),
])
def test_forbidden_reason_covers_every_kind_of_internal_address(address, reason):
    assert forbidden_reason(ipaddress.ip_address(address)) == reason


def resolver(*answers: str):
    """A DNS stand-in (getaddrinfo's shape) answering the given addresses for any name."""
    def resolve(host, port, **kwargs):
        return [(socket.AF_INET6 if ":" in a else socket.AF_INET, socket.SOCK_STREAM, 6, "", (a, port))
                for a in answers]
    return resolve


@pytest.mark.parametrize(("url", "answers", "allowed", "refusal"), [
    ("ftp://hooks.example/x", ["93.184.215.14"], [], "scheme 'ftp'"),
    ("http:///x", ["93.184.215.14"], [], "no host"),
    ("https://hooks.example/x", ["10.0.0.7"], [], "resolves to 10.0.0.7, a private address"),
    # One internal answer among public ones is enough to refuse: the connection could take it.
    ("https://hooks.example/x", ["93.184.215.14", "169.254.169.254"], [], "169.254.169.254, a link-local"),
    ("https://hooks.example/x", ["10.0.0.7"], ["10.1.0.0/16"], "10.0.0.7"),
    ("https://hooks.example/x", ["10.0.0.7"], ["other.example"], "10.0.0.7"),
    ("http://[::ffff:127.0.0.1]:8080/x", ["::ffff:127.0.0.1"], [], "IPv4-mapped form of a loopback"),
])
def test_destinations_are_refused_with_a_precise_reason(url, answers, allowed, refusal):
    with pytest.raises(DestinationRefused, match=refusal.replace(".", r"\.").replace("[", r"\[")):
        resolve_destination(url, allow_list=parse_allow_list(allowed), resolve=resolver(*answers))


@pytest.mark.parametrize(("allowed", "answers"), [
    ([], ["93.184.215.14"]),
    (["hooks.internal"], ["10.0.0.7"]),
    (["HOOKS.internal."], ["10.0.0.7"]),
    (["10.0.0.0/8"], ["10.0.0.7"]),
    (["10.0.0.7"], ["10.0.0.7"]),
])
def test_public_or_allow_listed_destinations_are_pinned_to_the_checked_address(allowed, answers):
    d = resolve_destination("https://hooks.internal:8443/budget?v=1", allow_list=parse_allow_list(allowed),
                            resolve=resolver(*answers))
    assert (d.scheme, d.host, d.port, d.address, d.target) == ("https", "hooks.internal", 8443, answers[0],
                                                               "/budget?v=1")


class _Receiver(BaseHTTPRequestHandler):
    answers: ClassVar[list[tuple[int, dict[str, str]]]] = []
    received: ClassVar[list[tuple[str, dict[str, str], bytes]]] = []

    def do_POST(self):
        body = self.rfile.read(int(self.headers["Content-Length"]))
        type(self).received.append((self.path, dict(self.headers), body))
        status, headers = type(self).answers.pop(0) if type(self).answers else (204, {})
        self.send_response(status)
        for key, value in headers.items():
            self.send_header(key, value)
        self.end_headers()

    def log_message(self, *args):
        pass


@pytest.fixture
def receiver():
    _Receiver.answers, _Receiver.received = [], []
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Receiver)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server.server_port, _Receiver
    server.shutdown()
    server.server_close()


def test_the_post_goes_to_the_checked_address_with_the_urls_host_whatever_dns_says_later(receiver):
    port, got = receiver
    # hooks.example resolves (here) to loopback, which the allow-list names; the connection uses that
    # answer and never asks DNS again, so a rebinding answer has nothing to act on.
    d = resolve_destination(f"http://hooks.example:{port}/budget", allow_list=parse_allow_list(["hooks.example"]),
                            resolve=resolver("127.0.0.1"))
    answer = post_to_destination(d, body=b"{}", headers={"Content-Type": "application/json"}, timeout_s=5)
    assert answer.status == 204
    ((path, headers, body),) = got.received
    assert path == "/budget"
    assert headers["Host"] == f"hooks.example:{port}"
    assert body == b"{}"


@pytest.fixture
def acme_budget(db):
    def configure(url: str):
        tenant = Tenant.objects.get_or_create(slug="acme", defaults={"name": "Acme"})[0]
        # Saved while loopback is allow-listed (budgets take plain http only to such a host); the
        # tests then check the send-time refusal against the allow-list as it is at sending.
        with override_settings(VGPU_WEBHOOK_ALLOWED_HOSTS=["127.0.0.1"]):
            set_budget(tenant_slug=tenant.slug, now=clock.now(), actor_label="test",
                       values={"amount": Decimal("10"), "currency": "USD", "owner": "finops@acme.example",
                               "webhook_url": url, "webhook_secret": "s3cret"})
        return tenant.budgets.get().pk
    return configure


def refusals() -> list[Any]:
    """What each refusal's audit event recorded (its JSON `after`)."""
    return list(AuditEvent.objects.filter(action="budget.webhook_refused").values_list("after", flat=True))


@pytest.mark.django_db
def test_a_loopback_webhook_is_refused_and_audited_unless_allow_listed(acme_budget, receiver):
    port, got = receiver
    url = f"http://127.0.0.1:{port}/budget"
    budget_id = acme_budget(url)
    assert tasks.deliver_budget_webhook.apply(args=(budget_id, PAYLOAD)).get() is None
    assert got.received == []
    (refusal,) = refusals()
    assert refusal["url"] == url
    assert refusal["event"] == "budget.state_changed"
    assert "127.0.0.1, a loopback address" in refusal["reason"]
    assert "VGPU_WEBHOOK_ALLOWED_HOSTS" in refusal["reason"]
    with override_settings(VGPU_WEBHOOK_ALLOWED_HOSTS=["127.0.0.0/8"]):
        assert tasks.deliver_budget_webhook.apply(args=(budget_id, PAYLOAD)).get() == 204
    assert len(got.received) == 1
    assert len(refusals()) == 1


@pytest.mark.django_db
def test_a_redirect_is_not_followed_and_is_audited(acme_budget, receiver):
    port, got = receiver
    got.answers = [(302, {"Location": "http://169.254.169.254/latest/meta-data/"})]
    budget_id = acme_budget(f"http://127.0.0.1:{port}/budget")
    with override_settings(VGPU_WEBHOOK_ALLOWED_HOSTS=["127.0.0.1"]):
        assert tasks.deliver_budget_webhook.apply(args=(budget_id, PAYLOAD)).get() == 302
    assert len(got.received) == 1
    (refusal,) = refusals()
    assert "redirecting to http://169.254.169.254/latest/meta-data/" in refusal["reason"]
    assert "not followed" in refusal["reason"]


@pytest.mark.parametrize(("entries", "ids"), [
    (["hooks.internal", "10.20.0.0/16", "fd00::/8", "127.0.0.1"], []),
    (["http://hooks.internal", "hooks.internal:8080", "10.0.0.0/33"], ["billing.E002"]),
])
def test_system_check_refuses_allow_list_entries_that_would_allow_nothing(settings, entries, ids):
    from billing.checks import check_webhook_allow_list

    settings.VGPU_WEBHOOK_ALLOWED_HOSTS = entries
    assert [m.id for m in check_webhook_allow_list()] == ids
