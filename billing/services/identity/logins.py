"""Login lockouts in the audit log. django-axes counts failures per username + client address
and refuses logins during the cool-off; this records each lockout for the admins."""

from __future__ import annotations

from datetime import datetime, timedelta

from django.db import connection, transaction

from billing.models import AuditEvent
from billing.services.audit import record_audit_event

__all__ = ["LOCKED_OUT", "record_login_lockout"]

LOCKED_OUT = "login.locked_out"
# Usernames come from an anonymous form: keep what the audit row can hold (AuditEvent.object_id).
_MAX_USERNAME = 150


def record_login_lockout(*, username: str, ip_address: str, failure_limit: int, cool_off: timedelta,
                         now: datetime) -> AuditEvent | None:
    """One audit row per lockout of (username, address). Axes signals on the failure that locks
    and again on every attempt refused during the cool-off (each restarts it), so a row is
    written only when none was in the last cool-off: a brute force cannot flood the log, and a
    lockout that lasts shows again once per cool-off. Returns the row, or None when deduplicated."""
    username = username[:_MAX_USERNAME]
    with transaction.atomic():
        # Concurrent refused attempts of one key would otherwise both see no row and both write.
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", [f"{LOCKED_OUT}:{username}:{ip_address}"])
        recent = AuditEvent.objects.filter(action=LOCKED_OUT, object_type="login", object_id=username,
                                           after__ip_address=ip_address, at__gt=now - cool_off)
        if recent.exists():
            return None
        return record_audit_event(
            at=now, actor_label="system", action=LOCKED_OUT, object_type="login", object_id=username, before=None,
            after={"username": username, "ip_address": ip_address, "failure_limit": failure_limit,
                   "cool_off_minutes": int(cool_off.total_seconds() // 60)},
        )
