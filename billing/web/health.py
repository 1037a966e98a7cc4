"""GET /healthz: database, broker, worker and ledger status as JSON (200 when all are well, else 503).

The ledger is well when the rollup keeps up (the oldest batch waiting for it arrived less than
VGPU_HEALTH_MAX_ROLLUP_LAG_S ago), no batch is quarantined and no agent holds a batch ingest refused
(billing.queries.undelivered): each means money is not reaching the books, which is what an SRE
must be woken for. Open undelivered reports degrade it only above VGPU_HEALTH_MAX_UNDELIVERED_BATCHES,
so one node cannot take the service's health down with a report of its own (docs/reliability.md).

Anyone may ask for the status (a load balancer, an uptime check); only an admin (a session of a
staff user or platform admin, or an admin's API token) sees the detail behind it: worker host
names, backlog figures and error messages describe the deployment to whoever reads them.
Kubernetes probes use /readyz, which says nothing but whether this process can serve.

`unapproved_gpus` counts GPUs whose reported model no admin approved (their usage is metered but
unpriced; /gpu-models/ lists them). A count only, no names, shown with the other detail to admins,
and never a failure: any node could otherwise turn the service unhealthy by reporting a made-up
model, and that usage blocks nothing (the close bills the rest). The alert
VgpuLedgerUnapprovedGpuModels says it."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import redis
from django.conf import settings
from django.db import connection
from django.http import HttpRequest, JsonResponse
from django.utils import timezone
from django.views.decorators.cache import never_cache

from billing.errors import NotAuthenticated
from billing.ledger.retention import get_retention_state
from billing.ledger.state import get_batch_backlog
from billing.queries.undelivered import count_open_undelivered
from billing.scope import get_scope
from billing.services.identity import API_TOKEN_PREFIX, authenticate_api_token
from billing.services.pricing import count_unapproved_gpus
from config.celery import app as celery_app


def _check(fn: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    started = time.monotonic()
    try:
        detail = fn()
    except _Unwell as exc:
        return {"ok": False, "error": str(exc)[:300], **exc.detail}
    except Exception as exc:  # noqa: BLE001 - a health check reports any failure instead of raising
        return {"ok": False, "error": f"{type(exc).__name__}: {exc}"[:300]}
    return {"ok": True, "ms": round((time.monotonic() - started) * 1000, 1), **(detail or {})}


def _database() -> dict[str, Any]:
    with connection.cursor() as cur:
        cur.execute("SELECT 1")
        cur.fetchone()
    return {}


def _broker() -> dict[str, Any]:
    client = redis.Redis.from_url(settings.CELERY_BROKER_URL, socket_timeout=1, socket_connect_timeout=1)
    client.ping()
    return {}


def _worker() -> dict[str, Any]:
    # limit=1: answer as soon as one worker replies instead of waiting out the timeout.
    replies = celery_app.control.ping(timeout=1.0, limit=1)
    if not replies:
        raise RuntimeError("no Celery worker answered a ping within 1 s")
    return {"workers": sorted(name for reply in replies for name in reply)}


def _ledger() -> dict[str, Any]:
    backlog = get_batch_backlog()
    lag, quarantined = backlog.rollup_lag_s(timezone.now()), backlog.quarantined
    undelivered = count_open_undelivered()
    # Shown, never a failure of its own: the batches that hold a partition past its retention
    # already make this check fail (quarantined, or the rollup's lag).
    held = get_retention_state(now=timezone.now()).held_partitions
    detail = {"backlog_batches": backlog.pending, "rollup_lag_s": round(lag, 1), "quarantined_batches": quarantined,
              "undelivered_batches": undelivered,
              "max_undelivered_batches": settings.VGPU_HEALTH_MAX_UNDELIVERED_BATCHES, "max_rollup_lag_s": settings.VGPU_HEALTH_MAX_ROLLUP_LAG_S,
              "retention_held_partitions": sum(held.values()), "unapproved_gpus": count_unapproved_gpus()}
    problems = []
    if lag > settings.VGPU_HEALTH_MAX_ROLLUP_LAG_S:
        problems.append(f"the rollup is {lag:.0f} s behind (allowed {settings.VGPU_HEALTH_MAX_ROLLUP_LAG_S} s)")
    if quarantined:
        problems.append(f"{quarantined} batch(es) quarantined: `manage.py redrive_batches` lists them")
    if undelivered > settings.VGPU_HEALTH_MAX_UNDELIVERED_BATCHES:
        problems.append(f"agents hold {undelivered} batch(es) ingest refused: /nodes/ lists them, "
                        "`vgpu-agent redrive` re-sends them")
    if problems:
        raise _Unwell("; ".join(problems), detail)
    return detail


class _Unwell(Exception):
    """A check that answered, with its figures, but found something wrong."""

    def __init__(self, message: str, detail: dict[str, Any]) -> None:
        super().__init__(message)
        self.detail = detail


@never_cache
def healthz(request: HttpRequest) -> JsonResponse:
    status = {"database": _check(_database), "broker": _check(_broker)}
    status["ledger"] = _check(_ledger) if status["database"]["ok"] else {"ok": False, "error": "database down"}
    status["worker"] = _check(_worker) if status["broker"]["ok"] else {"ok": False, "error": "broker down"}
    healthy = all(s["ok"] for s in status.values())
    body: dict[str, Any] = {"status": "ok" if healthy else "degraded"}
    if _sees_detail(request):
        body |= status
    return JsonResponse(body, status=200 if healthy else 503)


def _sees_detail(request: HttpRequest) -> bool:
    """A staff or platform-admin session, or an admin's API token. A wrong token is no error here:
    the caller still gets the status, as anyone does."""
    user: Any = request.user if getattr(request, "user", None) is not None else None
    if user is None or not user.is_authenticated:
        scheme, _, token = request.headers.get("Authorization", "").partition(" ")
        token = token.strip()
        if scheme.lower() != "bearer" or not token.startswith(API_TOKEN_PREFIX):
            return False
        try:
            user = authenticate_api_token(token, now=timezone.now())
        except NotAuthenticated:
            return False
    return bool(user.is_staff) or get_scope(user).is_admin


@never_cache
def readyz(request: HttpRequest) -> JsonResponse:
    """Readiness of this web process: it can serve ingest when its database answers. A stalled
    rollup, a quarantined batch or a dead worker make /healthz degraded, but must not take every
    web pod out of its Service: agents would then have nowhere to upload."""
    database = _check(_database)
    return JsonResponse({"status": "ok" if database["ok"] else "degraded", "database": database},
                        status=200 if database["ok"] else 503)
