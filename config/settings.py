"""Django settings.

Everything that differs between machines comes from the environment:
DATABASE_URL, REDIS_URL (required; `python -m config.embedded` or the demo launcher
provide embedded servers when unset), DJANGO_SECRET_KEY, DJANGO_DEBUG,
DJANGO_ALLOWED_HOSTS, VGPU_PRODUCTION.
"""

from __future__ import annotations

import os
import secrets
from datetime import timedelta
from pathlib import Path
from typing import Any

import dj_database_url
from celery.schedules import crontab
from django.core.exceptions import ImproperlyConfigured
from django.utils.translation import gettext_lazy as _

BASE_DIR = Path(__file__).resolve().parent.parent
DATA_DIR = Path(os.environ.get("VGPU_DATA_DIR", BASE_DIR / ".data"))

PRODUCTION = os.environ.get("VGPU_PRODUCTION", "") == "1"
DEBUG = os.environ.get("DJANGO_DEBUG", "") == "1" and not PRODUCTION


def _secret_key() -> str:
    key = os.environ.get("DJANGO_SECRET_KEY", "")
    if key:
        return key
    if PRODUCTION:
        raise ImproperlyConfigured("DJANGO_SECRET_KEY must be set when VGPU_PRODUCTION=1")
    # Development: a random key kept beside the embedded data, never in the repository.
    path = DATA_DIR / "secret_key"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(secrets.token_urlsafe(50))
        path.chmod(0o600)
    return path.read_text().strip()


SECRET_KEY = _secret_key()
ALLOWED_HOSTS = [h for h in os.environ.get("DJANGO_ALLOWED_HOSTS", "127.0.0.1,localhost,testserver").split(",") if h]
# Callers inside the cluster name the web pod by its Service or its IP, not by the public host:
# agents (http://vgpu-ledger-web.vgpu-ledger.svc:8000), the kubelet's probes and Prometheus (the
# pod IP). deploy/k8s/control-plane.yaml sets this to "$(POD_IP),<the Service's names>".
ALLOWED_HOSTS += [h.strip() for h in os.environ.get("VGPU_INTERNAL_HOSTS", "").split(",") if h.strip()]

INSTALLED_APPS = [
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "django.contrib.postgres",
    "django.contrib.humanize",
    "rest_framework",
    "drf_spectacular",
    "axes",
    "billing",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    # First after security, so every answer carries it (whitenoise's static files, outage pages).
    "billing.web.csp.ContentSecurityPolicyMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.locale.LocaleMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "billing.web.language.UserLanguageMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "billing.api.errors.OutageMiddleware",
    # Last, as django-axes asks: it turns a lockout flagged during authentication into the lockout page.
    "axes.middleware.AxesMiddleware",
]

# Scripts, styles, images, fetches and forms only from this origin; no inline script or style
# (the templates have none: billing/web/csp.py), no plugins, no framing, no <base> rewriting.
VGPU_CONTENT_SECURITY_POLICY = ("default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
                                "connect-src 'self'; font-src 'self'; object-src 'none'; base-uri 'none'; "
                                "form-action 'self'; frame-ancestors 'none'")

ROOT_URLCONF = "config.urls"
WSGI_APPLICATION = "config.wsgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
                "django.template.context_processors.i18n",
                "billing.web.context.scope",
            ],
        },
    },
]

_database_url = os.environ.get("DATABASE_URL", "")
if not _database_url:
    raise ImproperlyConfigured(
        "DATABASE_URL is not set. Run through `make demo` / `make test`, or "
        "`python -m config.embedded -- COMMAND` to start an embedded Postgres."
    )
# Persistent connections, checked at the start of each request that reuses one (a `SELECT 1`
# round trip): without the check, the first request of each worker after a database restart
# met the dead connection and answered 503. Its ingest cost is measured in docs/benchmarks.md.
DATABASES = {"default": dj_database_url.parse(_database_url, conn_max_age=60, conn_health_checks=True)}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

REDIS_URL = os.environ.get("REDIS_URL", "")
if not REDIS_URL:
    raise ImproperlyConfigured("REDIS_URL is not set (see DATABASE_URL above for how to get embedded servers).")

CACHES = {"default": {"BACKEND": "django.core.cache.backends.redis.RedisCache", "LOCATION": REDIS_URL}}

# Argon2id first (billing/services/identity/passwords.py says why and with which parameters); the
# PBKDF2 hashers stay so passwords stored before verify, and are rewritten at their next login.
PASSWORD_HASHERS = [
    "billing.services.identity.passwords.Argon2idHasher",
    "django.contrib.auth.hashers.PBKDF2PasswordHasher",
    "django.contrib.auth.hashers.PBKDF2SHA1PasswordHasher",
]
AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]
# Login throttling (django-axes): failures counted per username + client address in Postgres (its
# database handler); at the limit that pair is locked out for the cool-off, restarted by each
# further attempt, and even the right password is refused. Each lockout is audited
# (billing.web.lockout); `manage.py axes_reset` (or axes_reset_username USER) unlocks at once.
AUTHENTICATION_BACKENDS = ["axes.backends.AxesStandaloneBackend", "django.contrib.auth.backends.ModelBackend"]
AXES_HANDLER = "axes.handlers.database.AxesDatabaseHandler"
AXES_FAILURE_LIMIT = int(os.environ.get("VGPU_LOGIN_FAILURE_LIMIT", "5"))
AXES_COOLOFF_TIME = timedelta(minutes=int(os.environ.get("VGPU_LOGIN_COOLOFF_MINUTES", "15")))
# Per pair, not per address alone, so one office behind NAT does not lock out its colleagues.
AXES_LOCKOUT_PARAMETERS = [["username", "ip_address"]]
AXES_RESET_ON_SUCCESS = True
AXES_LOCKOUT_CALLABLE = "billing.web.lockout.locked_out_response"
AXES_ENABLE_ADMIN = False
# The client address is REMOTE_ADDR (billing.web.lockout.client_address): X-Forwarded-For is
# whatever the client wrote. Behind a proxy that overwrites a header with the client's address
# (nginx: proxy_set_header X-Real-IP $remote_addr), name its META key, e.g. HTTP_X_REAL_IP.
AXES_CLIENT_IP_CALLABLE = "billing.web.lockout.client_address"
AXES_USERNAME_CALLABLE = "billing.web.lockout.attempted_username"
VGPU_LOGIN_CLIENT_IP_META = os.environ.get("VGPU_LOGIN_CLIENT_IP_META", "").strip()
# Failed bearer-token authentications (node, API, admission tokens) per client address, the same
# address as above (billing.services.identity.auth_throttle): the failure that reaches the limit blocks the
# address's unknown tokens for the cool-off (429, Retry-After, no database look-up); tokens known
# valid keep working, so a guesser behind a NAT does not lock out the healthy nodes behind it.
VGPU_AUTH_FAILURE_LIMIT = int(os.environ.get("VGPU_AUTH_FAILURE_LIMIT", "20"))
VGPU_AUTH_COOLOFF_S = int(os.environ.get("VGPU_AUTH_COOLOFF_S", "300"))
LOGIN_URL = "login"
# The login page answers with each role's own start page (billing.web.access.LoginView, which
# overrides this setting); an explicit `?next=` still wins. "/" leads to the same page.
LOGIN_REDIRECT_URL = "home"
LOGOUT_REDIRECT_URL = "login"

LANGUAGE_CODE = "en"
LANGUAGES = [("en", _("English")), ("zh-hans", _("Simplified Chinese"))]
LOCALE_PATHS = [BASE_DIR / "locale"]
FORMAT_MODULE_PATH = ["config.formats"]
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
STATIC_ROOT = BASE_DIR / "staticfiles"
STATICFILES_DIRS = [BASE_DIR / "templates" / "static"]
# Serve from the source folders too, so `collectstatic` is optional for the demo.
WHITENOISE_USE_FINDERS = True

# Security defaults. Production (VGPU_PRODUCTION=1) turns on the HTTPS-only parts.
CSRF_COOKIE_HTTPONLY = True
SESSION_COOKIE_HTTPONLY = True
SECURE_CONTENT_TYPE_NOSNIFF = True
X_FRAME_OPTIONS = "DENY"
if PRODUCTION:
    SESSION_COOKIE_SECURE = True
    CSRF_COOKIE_SECURE = True
    SECURE_SSL_REDIRECT = os.environ.get("VGPU_SSL_REDIRECT", "1") == "1"
    SECURE_HSTS_SECONDS = 31536000
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
    # Machine callers inside the cluster speak plain HTTP to the Service: a redirect would turn an
    # agent's POST into a GET and a probe into a check of nothing. They authenticate with bearer
    # tokens, never cookies; browsers reach the rest through the TLS-terminating ingress.
    SECURE_REDIRECT_EXEMPT = [r"^healthz$", r"^readyz$", r"^metrics$", r"^api/v1/usage/", r"^api/v1/nodes/",
                              r"^api/v1/admission/"]

REST_FRAMEWORK = {
    # An API token first (docs/api.md): it is the one a script sends, and its class answers the 401
    # challenge; a signed-in browser's session cookie (with its CSRF check) second.
    "DEFAULT_AUTHENTICATION_CLASSES": ["billing.api.auth.ApiTokenAuthentication",
                                       "billing.api.kube_auth.KubeServiceAccountAuthentication",
                                       "rest_framework.authentication.SessionAuthentication"],
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"],
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    "EXCEPTION_HANDLER": "billing.api.errors.exception_handler",
}
SPECTACULAR_SETTINGS = {
    "TITLE": "vGPU Ledger API",
    "DESCRIPTION": "Agent wire protocol v1 (usage batches, node policy, node events, undelivered batches; "
                   "docs/protocol.md), the admission webhook (docs/operations.md) and the read API (docs/api.md). "
                   "Every error answers {\"errors\": [{\"path\", \"message\"}]}.",
    "VERSION": "1.0.0",
    "SERVE_INCLUDE_SCHEMA": False,
    "PREPROCESSING_HOOKS": ["billing.api.openapi.without_kubecost_aliases"],
    # billing.api.openapi: the answers every operation can give (503, 401 with its challenge, ...).
    "POSTPROCESSING_HOOKS": ["drf_spectacular.hooks.postprocess_schema_enums",
                             "billing.api.openapi.complete_responses"],
}

# The invoice issuer (docs/exports.md "Invoices"): legal entity, postal address (lines separated by
# "\n" or "|") and tax id, copied onto each invoice and credit note when it is issued. Unset in
# production, `manage.py check` warns (billing.W010): invoices would name no legal entity.
VGPU_ISSUER_NAME = os.environ.get("VGPU_ISSUER_NAME", "").strip()
VGPU_ISSUER_ADDRESS = "\n".join(part.strip() for part in
                                os.environ.get("VGPU_ISSUER_ADDRESS", "").replace("|", "\n").splitlines()
                                if part.strip())
VGPU_ISSUER_TAX_ID = os.environ.get("VGPU_ISSUER_TAX_ID", "").strip()
# Days from an invoice's issue date to its due date, for tenants without their own terms.
VGPU_INVOICE_PAYMENT_TERMS_DAYS = int(os.environ.get("VGPU_INVOICE_PAYMENT_TERMS_DAYS", "30"))

# Ingest limits (docs/protocol.md). Bodies above the limit answer 413; the decompressed size is bounded too.
VGPU_INGEST_MAX_BODY_BYTES = int(os.environ.get("VGPU_INGEST_MAX_BODY_BYTES", str(8 * 1024 * 1024)))
VGPU_INGEST_MAX_JSON_BYTES = int(os.environ.get("VGPU_INGEST_MAX_JSON_BYTES", str(64 * 1024 * 1024)))
VGPU_INGEST_MAX_SAMPLES = int(os.environ.get("VGPU_INGEST_MAX_SAMPLES", "200_000"))
# Usage older than this is refused at ingest (400); within it, usage for a month that is already
# invoiced becomes an adjustment on a later invoice.
VGPU_LATE_USAGE_HORIZON = timedelta(days=int(os.environ.get("VGPU_LATE_USAGE_HORIZON_DAYS", "45")))
VGPU_INGEST_MAX_CLOCK_SKEW = timedelta(seconds=int(os.environ.get("VGPU_INGEST_MAX_CLOCK_SKEW_S", "120")))
# The tenant of a sample in a namespace no tenant lists (billing.services.ingest.tenant_mapping): "namespace"
# (the default) bills it to the tenant named like the namespace, so a node cannot bill a tenant by
# naming it; "claim" trusts the tenant the node's sample names, for a deployment that has not yet
# listed its namespaces. A namespace a tenant lists is always that tenant's, whatever the node claims.
VGPU_TENANT_UNMAPPED = os.environ.get("VGPU_TENANT_UNMAPPED", "namespace")
# /healthz turns degraded when the oldest batch waiting for the rollup arrived longer ago than this
# (20 rollup cycles of 15 s): billing has stalled.
VGPU_HEALTH_MAX_ROLLUP_LAG_S = int(os.environ.get("VGPU_HEALTH_MAX_ROLLUP_LAG_S", "300"))
# /healthz turns degraded when agents report more open undelivered batches than this: a node's own
# report is checked against what the service holds, but one node (or one stolen token) must not be
# able to page the SRE by itself. The nodes page and /metrics show every report, even below it.
VGPU_HEALTH_MAX_UNDELIVERED_BATCHES = int(os.environ.get("VGPU_HEALTH_MAX_UNDELIVERED_BATCHES", "10"))
# Retry-After of a 503 when the database or Redis is down (billing.api.errors.OutageMiddleware).
VGPU_OUTAGE_RETRY_AFTER_S = int(os.environ.get("VGPU_OUTAGE_RETRY_AFTER_S", "15"))
# Load shedding: at most this many ingest requests in flight per process before answering 429.
VGPU_INGEST_MAX_IN_FLIGHT = int(os.environ.get("VGPU_INGEST_MAX_IN_FLIGHT", "8"))
VGPU_INGEST_RETRY_AFTER_S = int(os.environ.get("VGPU_INGEST_RETRY_AFTER_S", "5"))
DATA_UPLOAD_MAX_MEMORY_SIZE = VGPU_INGEST_MAX_BODY_BYTES
# Side threads per web process for a page's reads that can run beside its others, each with its own
# database connection in the page's snapshot (billing.queries.snapshot.alongside); 0: none.
VGPU_PAGE_READ_THREADS = int(os.environ.get("VGPU_PAGE_READ_THREADS", "2"))
# Raw and minute partitions are created this many days ahead by the beat task (and on demand by
# ingest and the rollup).
VGPU_PARTITION_DAYS_AHEAD = int(os.environ.get("VGPU_PARTITION_DAYS_AHEAD", "7"))


def _days(name: str, default: int) -> timedelta:
    """A whole number of days from the environment; anything else stops every process at startup."""
    text = os.environ.get(name, str(default)).strip()
    if not text.isdigit():
        raise ImproperlyConfigured(f"{name} must be a whole number of days (0 or more), got {text!r}")
    return timedelta(days=int(text))


# Retention (billing.ledger.retention, docs/operations.md "Retention"): raw day partitions (the
# integral rows' inbox) and the batches are kept for the late-usage horizon plus this margin (at
# least 1 day: a batch accepted at the horizon's edge must still be rolled up and re-priceable),
# then dropped; minutes (the store of the integrals) are kept this long (at least the raw
# retention: a late batch adds into its minutes; the default covers a paired report over either of the two
# previous months with its 7-day look-back); hours this long (at least the minute retention; the
# default keeps last year's same month whole at hour precision until this month ends: 13 months
# are at most 397 days, and a day goes only once all of it is older, docs/operations.md). Days
# are kept forever. billing.E004 checks the rules at startup and the task refuses to drop
# anything while they are broken.
VGPU_RAW_RETENTION_MARGIN = _days("VGPU_RAW_RETENTION_MARGIN_DAYS", 2)
VGPU_MINUTE_RETENTION = _days("VGPU_MINUTE_RETENTION_DAYS", 100)
VGPU_HOUR_RETENTION = _days("VGPU_HOUR_RETENTION_DAYS", 396)
# A month closing with no progress written for this many seconds is shown as stalled (its Celery
# task was probably lost), and finance or an admin may resume it from the periods page.
VGPU_PERIOD_CLOSE_STALE_S = int(os.environ.get("VGPU_PERIOD_CLOSE_STALE_S", "900"))



def _rollup_shards(raw: str) -> int:
    """VGPU_ROLLUP_SHARDS: how many shard tasks each rollup cycle fans out into (billing.tasks)."""
    try:
        shards = int(raw)
    except ValueError:
        shards = 0
    if not 1 <= shards <= 1024:
        raise ImproperlyConfigured(f"VGPU_ROLLUP_SHARDS must be a whole number from 1 to 1024, got {raw!r}: "
                                   "the rollup cycle fans out into that many shard tasks, each rolling up the "
                                   "nodes with node_id % VGPU_ROLLUP_SHARDS == its shard")
    return shards


# The rollup (billing.ledger.rollup) is sharded by node: every cycle runs VGPU_ROLLUP_SHARDS shard
# tasks, which any number of workers take; a node is rolled up by one worker at a time whatever N
# is. Match it to the rollup workers' concurrency (more shards than workers only queues tasks).
VGPU_ROLLUP_SHARDS = _rollup_shards(os.environ.get("VGPU_ROLLUP_SHARDS", "2"))
# Nodes rolled up in one transaction (a transaction costs some twenty statements whatever its size,
# which dominates a cycle of one batch per node) and batches per transaction; the rest wait for the
# shard's next transaction or cycle. More nodes per transaction read more raw rows per statement:
# 8 nodes' backlog (200 MB) outgrew the benchmark's shared_buffers and ran 2.3x slower than 4.
VGPU_ROLLUP_NODES_PER_TRANSACTION = int(os.environ.get("VGPU_ROLLUP_NODES_PER_TRANSACTION", "4"))
VGPU_ROLLUP_MAX_BATCHES = int(os.environ.get("VGPU_ROLLUP_MAX_BATCHES", "5000"))
# work_mem of a rollup transaction: the raw GROUP BY stays a hash aggregate in memory.
VGPU_ROLLUP_WORK_MEM = os.environ.get("VGPU_ROLLUP_WORK_MEM", "64MB")

CELERY_BROKER_URL = REDIS_URL
CELERY_RESULT_BACKEND = REDIS_URL
CELERY_TASK_ACKS_LATE = True
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_TASK_SERIALIZER = "json"
CELERY_RESULT_SERIALIZER = "json"
CELERY_ACCEPT_CONTENT = ["json"]
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
CELERY_BEAT_SCHEDULE: dict[str, dict[str, Any]] = {
    "rollup-usage": {
        "task": "billing.tasks.rollup_usage",
        "schedule": float(os.environ.get("VGPU_ROLLUP_EVERY_S", "15")),
    },
    "ensure-raw-partitions": {"task": "billing.tasks.ensure_raw_partitions", "schedule": 3600.0},
    # Drops raw and minute day partitions past their retention (cheap when there is none to drop).
    "apply-retention": {
        "task": "billing.tasks.apply_retention",
        "schedule": float(os.environ.get("VGPU_RETENTION_EVERY_S", "3600")),
    },
    # Every 5 minutes: today's partitions fill all day and the rollup plans on their statistics.
    "analyze-ledger-partitions": {"task": "billing.tasks.analyze_ledger_partitions", "schedule": 300.0},
    "evaluate-budgets": {"task": "billing.tasks.evaluate_budgets", "schedule": 60.0},
    # Saved views' scheduled reports (docs/saved-views.md): due at whole hours, so a few minutes'
    # delay is all a report waits; each occurrence is claimed once, so running more often costs a query.
    "send-scheduled-reports": {"task": "billing.tasks.send_scheduled_reports",
                               "schedule": float(os.environ.get("VGPU_REPORTS_EVERY_S", "300"))},
    # Spend anomalies, idle share and over-granting (docs/alerts.md): the ledger hour they read is
    # complete once an hour, so a few minutes' delay loses nothing.
    "evaluate-alerts": {"task": "billing.tasks.evaluate_alerts",
                        "schedule": float(os.environ.get("VGPU_ALERTS_EVERY_S", "300"))},
    "close-previous-month": {
        "task": "billing.tasks.close_previous_month",
        "schedule": crontab(day_of_month="2", hour="1", minute="0"),
    },
    "propose-rebalance": {
        "task": "billing.tasks.propose_rebalance",
        "schedule": float(os.environ.get("VGPU_REBALANCE_EVERY_S", "3600")),
    },
    # Daily after the month's close (01:00 on the 2nd): the fleet FOCUS dataset of every month that
    # can still change (docs/exports.md); VGPU_FOCUS_DATASET_EVERY_S (the demo) makes it an interval.
    "write-focus-dataset": {
        "task": "billing.tasks.write_focus_dataset",
        "schedule": (float(os.environ["VGPU_FOCUS_DATASET_EVERY_S"]) if os.environ.get("VGPU_FOCUS_DATASET_EVERY_S")
                     else crontab(hour="2", minute="30")),
    },
    # The same months delivered to every enabled object-storage destination (docs/exports.md).
    "deliver-focus-dataset": {
        "task": "billing.tasks.deliver_focus_dataset",
        "schedule": (float(os.environ["VGPU_FOCUS_DATASET_EVERY_S"]) if os.environ.get("VGPU_FOCUS_DATASET_EVERY_S")
                     else crontab(hour="2", minute="45")),
    },
}

# The monthly FOCUS dataset of the whole fleet (billing.services.exports.focus_dataset): written under
# this folder as <YYYY-MM>/…csv, .parquet, focus-metadata.json and manifest.json. Empty: the daily task logs that it is off.
VGPU_FOCUS_DATASET_DIR = os.environ.get("VGPU_FOCUS_DATASET_DIR", "")

# Delivery of that dataset to S3-compatible object storage (billing.services.exports.delivery; the
# destinations are managed on /exports/): the key sealing their credentials (a Fernet key; when empty,
# one derived from SECRET_KEY), and the endpoints allowed although they resolve to loopback or private
# addresses (an on-prem MinIO, say), as host names, addresses or networks.
VGPU_CREDENTIALS_KEY = os.environ.get("VGPU_CREDENTIALS_KEY", "")
VGPU_EXPORT_ALLOWED_HOSTS = [h.strip() for h in os.environ.get("VGPU_EXPORT_ALLOWED_HOSTS", "").split(",")
                             if h.strip()]

# Pool rebalance (docs/rebalance.md): at most K moves per plan, demand = peak over the window.
# Plans are dry runs until an admin approves one; execution talks to VGPU_KUBE_API (a URL,
# e.g. `kubectl proxy`) or, when empty, to the API server of the cluster it runs in.
VGPU_REBALANCE_MAX_MOVES = int(os.environ.get("VGPU_REBALANCE_MAX_MOVES", "10"))
VGPU_REBALANCE_WINDOW_HOURS = int(os.environ.get("VGPU_REBALANCE_WINDOW_HOURS", "24"))
VGPU_KUBE_API = os.environ.get("VGPU_KUBE_API", "")

# Admission webhook: the API server must authenticate (billing/services/identity/admission_auth.py), with
# the bearer token (inline, or a file such as a mounted Secret) or a client certificate checked by
# the TLS-terminating proxy, which passes its subject DN in the named header. With none of them
# every review answers 401. Also: what to answer when the budget cannot be checked (default:
# admit, log an error and return a warning).
VGPU_ADMISSION_TOKEN = os.environ.get("VGPU_ADMISSION_TOKEN", "")
VGPU_ADMISSION_TOKEN_FILE = os.environ.get("VGPU_ADMISSION_TOKEN_FILE", "")
VGPU_ADMISSION_CLIENT_CERT_HEADER = os.environ.get("VGPU_ADMISSION_CLIENT_CERT_HEADER", "")
VGPU_ADMISSION_CLIENT_CERT_CNS = [n.strip() for n in os.environ.get("VGPU_ADMISSION_CLIENT_CERT_CNS", "").split(",")
                                  if n.strip()]
VGPU_ADMISSION_FAIL_CLOSED = os.environ.get("VGPU_ADMISSION_FAIL_CLOSED", "") == "1"

# Node identity in Kubernetes (docs/operations.md, "Node identity"). With VGPU_NODE_TOKENREVIEW=1
# an agent may present its projected ServiceAccount token instead of a node token (vgl_…): the
# service asks the API server (VGPU_KUBE_API, else the cluster it runs in) for a TokenReview with
# this audience, accepts only these ServiceAccounts ("namespace:name", comma-separated) and binds
# the token to the node its pod runs on. A successful review is reused for at most
# VGPU_NODE_TOKENREVIEW_CACHE_S seconds (never beyond the token's expiry); each call to the API
# server gives up after VGPU_KUBE_API_TIMEOUT_S (the agent's own timeout is 10 s).
VGPU_NODE_TOKENREVIEW = os.environ.get("VGPU_NODE_TOKENREVIEW", "") == "1"
VGPU_NODE_TOKEN_AUDIENCE = os.environ.get("VGPU_NODE_TOKEN_AUDIENCE", "vgpu-ledger").strip()
VGPU_NODE_SERVICE_ACCOUNTS = [a.strip() for a in os.environ.get("VGPU_NODE_SERVICE_ACCOUNTS",
                                                                "vgpu-ledger:vgpu-agent").split(",") if a.strip()]
VGPU_NODE_TOKENREVIEW_CACHE_S = int(os.environ.get("VGPU_NODE_TOKENREVIEW_CACHE_S", "60"))
VGPU_KUBE_API_TIMEOUT_S = float(os.environ.get("VGPU_KUBE_API_TIMEOUT_S", "5"))

# OpenCost's clients (kubectl-cost, the OpenCost UI) through the OpenCost gateway
# (docs/allocation-api.md, "Connecting kubectl-cost and the OpenCost UI"): a ServiceAccount token of
# this audience, checked by TokenReview, reads as the user its ServiceAccount is mapped to
# ("namespace:serviceaccount=username", comma-separated; empty: off). A successful review is
# reused for at most VGPU_KUBE_CLIENT_CACHE_S seconds.
VGPU_KUBE_CLIENTS = os.environ.get("VGPU_KUBE_CLIENTS", "")
VGPU_KUBE_CLIENT_AUDIENCE = os.environ.get("VGPU_KUBE_CLIENT_AUDIENCE", "vgpu-ledger-opencost").strip()
VGPU_KUBE_CLIENT_CACHE_S = int(os.environ.get("VGPU_KUBE_CLIENT_CACHE_S", "60"))

# Prometheus scrapes /metrics with this bearer token (billing/web/metrics.py): inline, or a file
# such as a mounted Secret (read at every scrape). With neither, /metrics answers 403.
VGPU_METRICS_TOKEN = os.environ.get("VGPU_METRICS_TOKEN", "")
VGPU_METRICS_TOKEN_FILE = os.environ.get("VGPU_METRICS_TOKEN_FILE", "")
# Other gunicorns' multiprocess directories whose counters this server's /metrics reports too
# (comma-separated): the web pod's webhook container counts admission reviews in its own.
VGPU_METRICS_MORE_DIRS = os.environ.get("VGPU_METRICS_MORE_DIRS", "")

# Budget webhooks go only to public addresses (billing/services/budgets/webhooks.py) unless this list
# names the host, the address or a network holding it: comma-separated, e.g.
# "hooks.internal,10.20.0.0/16". The demo lists its loopback receiver.
VGPU_WEBHOOK_ALLOWED_HOSTS = [h.strip() for h in os.environ.get("VGPU_WEBHOOK_ALLOWED_HOSTS", "").split(",")
                              if h.strip()]

# Budget notifications. The SMTP server and sender come from the environment.
EMAIL_BACKEND = os.environ.get("VGPU_EMAIL_BACKEND", "django.core.mail.backends.smtp.EmailBackend")
EMAIL_HOST = os.environ.get("VGPU_EMAIL_HOST", "127.0.0.1")
EMAIL_PORT = int(os.environ.get("VGPU_EMAIL_PORT", "25"))
EMAIL_TIMEOUT = 10
# With VGPU_EMAIL_BACKEND=django.core.mail.backends.filebased.EmailBackend (the demo), mail is
# written to files here instead of being sent.
EMAIL_FILE_PATH = os.environ.get("VGPU_EMAIL_FILE_PATH", str(DATA_DIR / "mail"))
DEFAULT_FROM_EMAIL = os.environ.get("VGPU_EMAIL_FROM", "vgpu-ledger@localhost")
# Where people reach the web interface (https://gpu-cost.example.com): alerts link to Explore with
# it. Empty: links are paths, which a mail reader cannot open (manage.py check warns).
VGPU_PUBLIC_URL = os.environ.get("VGPU_PUBLIC_URL", "").strip()

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "root": {"handlers": ["console"], "level": os.environ.get("VGPU_LOG_LEVEL", "INFO")},
    "loggers": {"django.db.backends": {"level": "WARNING"}},
}
