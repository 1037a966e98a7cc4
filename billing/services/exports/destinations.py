"""Object-storage destinations of the fleet FOCUS dataset (docs/exports.md, Delivery to object
storage): saved, changed and retired by admins, each change validated and audited in its
transaction. The audit log records which key id (its last four characters) was set, never the key.

An endpoint is where the worker connects from inside the cluster, so, as a budget webhook's, it is
refused when its host resolves to a loopback, private, link-local or otherwise non-public address,
unless VGPU_EXPORT_ALLOWED_HOSTS names the host or a network holding it (an on-prem MinIO). It is
checked when saved and again before every delivery (`check_endpoint`).
"""

from __future__ import annotations

import ipaddress
import re
import socket
from dataclasses import dataclass
from datetime import datetime
from typing import Any
from urllib.parse import urlsplit

from django.conf import settings
from django.db import IntegrityError, transaction
from django.utils.translation import gettext as _

from billing.errors import InvalidInput
from billing.models import ExportDestination
from billing.services.audit import record_audit_event
from billing.services.budgets import forbidden_reason, parse_allow_list
from billing.services.exports.credentials import hint, seal

__all__ = ["DestinationInput", "check_endpoint", "retire_destination", "save_destination"]

# S3's bucket naming rules: 3-63 characters, lowercase letters, digits, dots and hyphens, starting and
# ending with a letter or digit, no two dots in a row, not shaped like an IP address.
_BUCKET = re.compile(r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")
_REGION = re.compile(r"^[a-z0-9][a-z0-9-]{0,30}$")
_KEY_ID = re.compile(r"^[A-Za-z0-9_+=/.@-]{3,128}$")
_PREFIX_MAX = 400  # leaves room under S3's 1,024-byte keys for the layout's folders and file names
_NAME_MAX = 100
_SECRET_MAX = 256


@dataclass(frozen=True)
class DestinationInput:
    """What an admin typed. Blank key id and secret on a change keep the stored ones; `clear_credentials`
    drops them (the worker's own credentials are used then)."""

    name: str
    endpoint_url: str
    region: str
    bucket: str
    prefix: str
    access_key_id: str
    secret_access_key: str
    enabled: bool
    clear_credentials: bool = False


def check_endpoint(url: str) -> None:
    """`InvalidInput` unless `url` is empty (Amazon S3) or an http(s) URL whose host resolves only to
    public addresses or is allow-listed (VGPU_EXPORT_ALLOWED_HOSTS). http is allowed only to an
    allow-listed host: credentials and data must not cross a network in the clear."""
    if not url:
        return
    parts = urlsplit(url)
    host = (parts.hostname or "").rstrip(".").lower()
    if parts.scheme not in ("http", "https") or not host or parts.username or parts.query or parts.fragment:
        raise InvalidInput(_("endpoint must be an http(s) URL with a host and nothing after the path, such as "
                             "https://minio.example.com:9000"))
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError as exc:
        raise InvalidInput(_("endpoint has an invalid port")) from exc
    allow = parse_allow_list(settings.VGPU_EXPORT_ALLOWED_HOSTS)
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError) as exc:
        raise InvalidInput(_("endpoint host %(host)s does not resolve") % {"host": host}) from exc
    addresses = {ipaddress.ip_address(str(info[4][0]).split("%", 1)[0]) for info in infos}
    listed = host in allow.hosts or all(allow.allows_address(a) for a in addresses)
    if parts.scheme == "http" and not listed:
        raise InvalidInput(_("endpoint %(host)s is plain http: only an allow-listed host (VGPU_EXPORT_ALLOWED_HOSTS) "
                             "may be reached without TLS") % {"host": host})
    if listed:
        return
    for address in sorted(addresses, key=str):
        reason = forbidden_reason(address)
        if reason and not allow.allows_address(address):
            raise InvalidInput(_("endpoint host %(host)s resolves to %(address)s, %(reason)s; an operator may allow it "
                                 "in VGPU_EXPORT_ALLOWED_HOSTS") % {"host": host, "address": address, "reason": reason})


def _text(value: str, *, field: str, max_len: int) -> str:
    value = value.strip()
    if len(value) > max_len:
        raise InvalidInput(_("%(field)s may have at most %(n)s characters") % {"field": field, "n": max_len})
    if any(ord(c) < 32 or ord(c) == 127 for c in value):
        raise InvalidInput(_("%(field)s may not hold control characters") % {"field": field})
    return value


def _checked(data: DestinationInput) -> dict[str, Any]:
    name = _text(data.name, field=_("name"), max_len=_NAME_MAX)
    if not name:
        raise InvalidInput(_("name is required"))
    endpoint = _text(data.endpoint_url, field=_("endpoint"), max_len=500).rstrip("/")
    check_endpoint(endpoint)
    region = data.region.strip()
    if not _REGION.match(region):
        raise InvalidInput(_("region %(region)r is not a region name such as us-east-1") % {"region": region[:40]})
    bucket = data.bucket.strip()
    if not _BUCKET.match(bucket) or ".." in bucket or re.fullmatch(r"[0-9.]+", bucket):
        raise InvalidInput(_("bucket %(bucket)r is not a bucket name: 3 to 63 lowercase letters, digits, dots and "
                             "hyphens, starting and ending with a letter or digit") % {"bucket": bucket[:70]})
    prefix = _text(data.prefix, field=_("prefix"), max_len=_PREFIX_MAX).strip("/")
    if ".." in prefix.split("/") or "//" in prefix or "\\" in prefix:
        raise InvalidInput(_("prefix %(prefix)r must be folder names separated by /, without . or .. parts")
                           % {"prefix": prefix[:70]})
    return {"name": name, "endpoint_url": endpoint, "region": region, "bucket": bucket,
            "prefix": f"{prefix}/" if prefix else "", "enabled": data.enabled}


def _credentials(data: DestinationInput) -> tuple[str, str] | None:
    """(sealed, hint) for new credentials, None to keep what is stored."""
    key_id, secret = data.access_key_id.strip(), data.secret_access_key.strip()
    if data.clear_credentials:
        return "", ""
    if not key_id and not secret:
        return None
    if not _KEY_ID.match(key_id):
        raise InvalidInput(_("access key id must be 3 to 128 letters, digits or + = / . @ _ -"))
    if not secret or len(secret) > _SECRET_MAX or any(ord(c) < 33 or ord(c) == 127 for c in secret):
        raise InvalidInput(_("secret access key is required with a key id: up to %(n)s printable characters")
                           % {"n": _SECRET_MAX})
    return seal({"access_key_id": key_id, "secret_access_key": secret}), hint(key_id)


def _snapshot(d: ExportDestination) -> dict[str, Any]:
    return {"id": d.pk, "name": d.name, "endpoint_url": d.endpoint_url, "region": d.region, "bucket": d.bucket,
            "prefix": d.prefix, "access_key": d.access_key_hint or None, "enabled": d.enabled,
            "retired_at": d.retired_at.isoformat() if d.retired_at else None}


def save_destination(*, destination_id: int | None, data: DestinationInput, now: datetime, actor_label: str,
                     actor_id: int | None = None) -> ExportDestination:
    """Create a destination, or change one (`destination_id`). Audited `export_destination.created` /
    `.changed` with before and after (the key id's last four characters, never a secret)."""
    fields = _checked(data)
    credentials = _credentials(data)
    with transaction.atomic():
        if destination_id is None:
            destination = ExportDestination(created_at=now, created_by=actor_label)
            before = None
        else:
            found = ExportDestination.objects.select_for_update().filter(pk=destination_id,
                                                                         retired_at__isnull=True).first()
            if found is None:
                raise InvalidInput(_("no destination with id %(id)s") % {"id": destination_id})
            destination, before = found, _snapshot(found)
        for name, value in fields.items():
            setattr(destination, name, value)
        if credentials is not None:
            destination.credentials, destination.access_key_hint = credentials
        destination.updated_at, destination.updated_by = now, actor_label
        try:
            with transaction.atomic():
                destination.save()
        except IntegrityError as exc:
            raise InvalidInput(_("a destination named %(name)r exists already") % {"name": fields["name"]}) from exc
        record_audit_event(at=now, actor_id=actor_id, actor_label=actor_label,
                           action="export_destination.created" if before is None else "export_destination.changed",
                           object_type="export_destination", object_id=str(destination.pk), before=before,
                           after=_snapshot(destination))
    return destination


def retire_destination(*, destination_id: int, now: datetime, actor_label: str,
                       actor_id: int | None = None) -> ExportDestination:
    """Stop delivering to a destination and forget its credentials; its history stays. Audited."""
    with transaction.atomic():
        destination = ExportDestination.objects.select_for_update().filter(pk=destination_id,
                                                                           retired_at__isnull=True).first()
        if destination is None:
            raise InvalidInput(_("no destination with id %(id)s") % {"id": destination_id})
        before = _snapshot(destination)
        destination.retired_at, destination.retired_by = now, actor_label
        destination.enabled, destination.credentials, destination.access_key_hint = False, "", ""
        destination.save()
        record_audit_event(at=now, actor_id=actor_id, actor_label=actor_label, action="export_destination.retired",
                           object_type="export_destination", object_id=str(destination.pk), before=before,
                           after=_snapshot(destination))
    return destination
