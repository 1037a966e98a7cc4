"""GET /healthz: database, broker and worker status as JSON (200 when all are up, else 503).

`undelivered_batches` counts batches agents hold because ingest refused them (billing.queries.undelivered):
usage not billed until someone re-drives it. It is a number to alert on, not a failure of this process,
so it does not change the status."""

from __future__ import annotations

import time

import redis
from django.conf import settings
from django.db import connection
from django.http import HttpRequest, JsonResponse
from django.views.decorators.cache import never_cache

from billing.queries.undelivered import count_open_undelivered
from config.celery import app as celery_app


def _check(fn) -> dict:
    started = time.monotonic()
    try:
        detail = fn()
    except Exception as exc:  # noqa: BLE001 - a health check reports any failure instead of raising
        return {"ok": False, "error": f"{type(exc).__name__}: {exc}"[:300]}
    return {"ok": True, "ms": round((time.monotonic() - started) * 1000, 1), **(detail or {})}


def _database() -> dict:
    with connection.cursor() as cur:
        cur.execute("SELECT 1")
        cur.fetchone()
    return {"undelivered_batches": count_open_undelivered()}


def _broker() -> dict:
    client = redis.Redis.from_url(settings.CELERY_BROKER_URL, socket_timeout=1, socket_connect_timeout=1)
    client.ping()
    return {}


def _worker() -> dict:
    # limit=1: answer as soon as one worker replies instead of waiting out the timeout.
    replies = celery_app.control.ping(timeout=1.0, limit=1)
    if not replies:
        raise RuntimeError("no Celery worker answered a ping within 1 s")
    return {"workers": sorted(name for reply in replies for name in reply)}


@never_cache
def healthz(request: HttpRequest) -> JsonResponse:
    status = {"database": _check(_database), "broker": _check(_broker)}
    status["worker"] = _check(_worker) if status["broker"]["ok"] else {"ok": False, "error": "broker down"}
    healthy = all(s["ok"] for s in status.values())
    undelivered = status["database"].pop("undelivered_batches", None)  # None: the database did not answer
    return JsonResponse({"status": "ok" if healthy else "degraded", "undelivered_batches": undelivered, **status},
                        status=200 if healthy else 503)
