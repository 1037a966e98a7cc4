"""Where a budget webhook may go, and sending it to exactly the address that was checked.

An admin types the webhook URL, and the Celery worker sends it from inside the cluster, so an
unchecked URL reaches what only the cluster can reach: the cloud metadata service
(169.254.169.254), the database, the API server. The destination is therefore resolved at send
time and refused when any of its addresses is loopback, private (RFC 1918, ULA), link-local,
multicast, unspecified, reserved or otherwise not globally routable — IPv4, IPv6 and IPv4
embedded in IPv6 alike — unless VGPU_WEBHOOK_ALLOWED_HOSTS names the host or a network holding
the address. The POST then connects to the address that passed, with the URL's host in the Host
header and in TLS (SNI and certificate check), so a DNS answer that changes between the check and
the connection (rebinding) changes nothing; redirects are never followed.
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Any
from urllib.parse import unquote, urlsplit

import certifi
import urllib3
from django.conf import settings

from billing.services.audit import record_audit_event

__all__ = [
    "Destination",
    "DestinationRefused",
    "WebhookAnswer",
    "WebhookRefused",
    "WebhookRetry",
    "forbidden_reason",
    "parse_allow_list",
    "post_to_destination",
    "record_webhook_refusal",
    "resolve_destination",
    "send_webhook",
]

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network
Resolver = Callable[..., list[tuple[Any, ...]]]
_DEFAULT_PORTS = {"http": 80, "https": 443}


class DestinationRefused(Exception):
    """The webhook URL may not be sent to; the message says why and how to allow it."""


@dataclass(frozen=True)
class AllowList:
    hosts: frozenset[str]
    networks: tuple[IPNetwork, ...]

    def allows_address(self, address: IPAddress) -> bool:
        return any(address in net for net in self.networks)


@dataclass(frozen=True)
class Destination:
    scheme: str
    host: str  # as in the URL, lowercased; goes in Host and SNI
    port: int
    address: str  # the checked address the connection goes to
    target: str  # path and query
    basic_auth: str | None  # "user:password" from the URL, if any


@dataclass(frozen=True)
class WebhookAnswer:
    status: int
    location: str  # the Location header of a redirect, "" otherwise


def parse_allow_list(entries: Iterable[str]) -> AllowList:
    """Entries are host names, addresses or networks ("hooks.internal", "127.0.0.1", "10.20.0.0/16")."""
    hosts, networks = set(), []
    for entry in (e.strip().lower() for e in entries):
        if not entry:
            continue
        try:
            networks.append(ipaddress.ip_network(entry, strict=False))
        except ValueError:
            hosts.add(entry.rstrip("."))
    return AllowList(hosts=frozenset(hosts), networks=tuple(networks))


def forbidden_reason(address: IPAddress) -> str | None:
    """Why a webhook may not go to `address` unless allow-listed, or None for a public address."""
    if isinstance(address, ipaddress.IPv6Address):
        if address.ipv4_mapped is not None:
            # ::ffff:a.b.c.d is the IPv4 address itself, reached through a dual-stack socket.
            inner = forbidden_reason(address.ipv4_mapped)
            return f"the IPv4-mapped form of {inner}" if inner else None
        for kind, embedded in (("6to4", address.sixtofour), ("Teredo", address.teredo[1] if address.teredo else None)):
            inner = forbidden_reason(embedded) if embedded is not None else None
            if inner:
                return f"a {kind} address embedding {inner}"
    checks = [("an unspecified address", address.is_unspecified), ("a loopback address", address.is_loopback),
              ("a link-local address", address.is_link_local), ("a multicast address", address.is_multicast),
              ("a reserved address", address.is_reserved), ("a private address", address.is_private),
              ("not a globally routable address", not address.is_global)]
    return next((reason for reason, hit in checks if hit), None)


def resolve_destination(url: str, *, allow_list: AllowList, resolve: Resolver = socket.getaddrinfo) -> Destination:
    """Check `url` and resolve its host now. Raises DestinationRefused, or socket.gaierror when
    the name does not resolve (which may be transient)."""
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    if scheme not in _DEFAULT_PORTS:
        raise DestinationRefused(f"webhook URL scheme {scheme or '(none)'!r} is not http or https")
    host = (parts.hostname or "").rstrip(".")
    if not host:
        raise DestinationRefused("webhook URL has no host")
    try:
        port = parts.port or _DEFAULT_PORTS[scheme]
    except ValueError as exc:
        raise DestinationRefused(f"webhook URL has an invalid port: {exc}") from exc
    addresses = _addresses(resolve(host, port, type=socket.SOCK_STREAM))
    if not addresses:
        raise DestinationRefused(f"webhook host {host} resolves to no address")
    if host not in allow_list.hosts:
        for address in addresses:
            reason = forbidden_reason(address)
            if reason and not allow_list.allows_address(address):
                raise DestinationRefused(
                    f"webhook host {host} resolves to {address}, {reason}; to send there anyway, an admin adds "
                    f"the host or a network holding the address to VGPU_WEBHOOK_ALLOWED_HOSTS")
    auth = f"{unquote(parts.username)}:{unquote(parts.password or '')}" if parts.username else None
    target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    return Destination(scheme=scheme, host=host, port=port, address=str(addresses[0]), target=target,
                       basic_auth=auth)


def _addresses(infos: list[tuple[Any, ...]]) -> list[IPAddress]:
    seen: list[IPAddress] = []
    for info in infos:
        # sockaddr is (address, port) or (address, port, flow, scope); a scoped IPv6 address has "%zone".
        address = ipaddress.ip_address(str(info[4][0]).split("%", 1)[0])
        if address not in seen:
            seen.append(address)
    return seen


def post_to_destination(destination: Destination, *, body: bytes, headers: dict[str, str],
                        timeout_s: float) -> WebhookAnswer:
    """POST to the checked address only: no second DNS lookup, no redirect followed, no retry
    here (the Celery task retries). Raises urllib3.exceptions.HTTPError on network errors."""
    default_port = destination.port == _DEFAULT_PORTS[destination.scheme]
    host = f"[{destination.host}]" if ":" in destination.host else destination.host
    headers = {**headers, "Host": host if default_port else f"{host}:{destination.port}"}
    if destination.basic_auth:
        headers.update(urllib3.util.make_headers(basic_auth=destination.basic_auth))
    timeout = urllib3.Timeout(total=timeout_s)
    pool: urllib3.HTTPConnectionPool
    if destination.scheme == "https":
        pool = urllib3.HTTPSConnectionPool(destination.address, destination.port, timeout=timeout, retries=False,
                                           server_hostname=destination.host, assert_hostname=destination.host,
                                           cert_reqs="CERT_REQUIRED", ca_certs=certifi.where())
    else:
        pool = urllib3.HTTPConnectionPool(destination.address, destination.port, timeout=timeout, retries=False)
    with pool:
        response = pool.urlopen("POST", destination.target, body=body, headers=headers, redirect=False,
                                retries=False, assert_same_host=False)
    return WebhookAnswer(status=response.status, location=response.headers.get("Location", ""))


class WebhookRetry(Exception):
    """Not delivered for now: the host did not resolve, the network failed, or the receiver answered
    429 or 5xx. The caller's task tries again later."""


class WebhookRefused(Exception):
    """Not sent, and sending again would not help: the destination is not allowed (`status` None),
    or it answered with a redirect (never followed: only the URL an admin set was checked)."""

    def __init__(self, reason: str, *, status: int | None = None) -> None:
        super().__init__(reason)
        self.status = status


def send_webhook(url: str, *, body: bytes, headers: dict[str, str], timeout_s: float = 10) -> int:
    """POST `body` to `url` through the checked path (resolve_destination with the operator's
    VGPU_WEBHOOK_ALLOWED_HOSTS, then post_to_destination), the one way every notification posts;
    returns the receiver's status (2xx, or a 4xx other than 429, which retrying would not change).
    Raises WebhookRetry or WebhookRefused."""
    try:
        destination = resolve_destination(url, allow_list=parse_allow_list(settings.VGPU_WEBHOOK_ALLOWED_HOSTS))
    except DestinationRefused as exc:
        raise WebhookRefused(str(exc)) from exc
    except OSError as exc:  # socket.gaierror: the name did not resolve, perhaps only for now
        raise WebhookRetry(f"{url}: cannot resolve its host: {exc}") from exc
    try:
        answer = post_to_destination(destination, body=body, headers=headers, timeout_s=timeout_s)
    except urllib3.exceptions.HTTPError as exc:
        raise WebhookRetry(f"{url}: {exc}") from exc
    if answer.status == 429 or answer.status >= 500:
        raise WebhookRetry(f"{url} answered {answer.status}")
    if 300 <= answer.status < 400:
        raise WebhookRefused(f"{url} answered {answer.status} redirecting to {answer.location or '(no Location)'}; "
                             "redirects are not followed: set the final URL", status=answer.status)
    return answer.status


def record_webhook_refusal(*, tenant: str, url: str, event: str, reason: str, now: datetime) -> None:
    """A webhook that was not sent is an audit event the budget's admins can find, never a silent drop."""
    record_audit_event(at=now, actor_label="system", action="budget.webhook_refused", object_type="budget",
                       object_id=tenant, before=None, after={"url": url, "event": event, "reason": reason})
