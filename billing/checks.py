"""System checks (`manage.py check`, and before migrate / runserver): configuration that would
leave a guard open or refuse every caller, said to the operator before the first request."""

from __future__ import annotations

import ipaddress
from typing import Any

from django.conf import settings
from django.core.checks import CheckMessage, Error, Tags, Warning, register

from billing.ledger.retention import RetentionPolicy
from billing.services.identity import HOW_TO_CONFIGURE, load_admission_credentials

__all__ = ["check_admission_credentials", "check_invoice_issuer", "check_node_identity", "check_public_url",
           "check_retention", "check_webhook_allow_list"]

# A token shorter than this is guessable enough to be worth a warning (secrets.token_urlsafe(32) is 43).
MIN_TOKEN_CHARS = 32


@register(Tags.security)
def check_admission_credentials(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    credentials = load_admission_credentials()
    if credentials.problem:
        return [Error(f"Admission webhook credentials are misconfigured: {credentials.problem}. "
                      "Every admission review answers 401.", id="billing.E001")]
    if not credentials.configured:
        # A warning, not an error: a cluster without the webhook needs no credential, and the
        # webhook itself already refuses every review (401) until one is set.
        return [Warning("The admission webhook has no credential configured, so it answers 401 to every "
                        "review (budgets and GPU quotas are not enforced at admission).",
                        hint=HOW_TO_CONFIGURE, id="billing.W001")]
    if credentials.token and len(credentials.token) < MIN_TOKEN_CHARS:
        return [Warning(f"The admission webhook token is shorter than {MIN_TOKEN_CHARS} characters.",
                        hint="Generate one with: python -c 'import secrets; print(secrets.token_urlsafe(32))'",
                        id="billing.W002")]
    return []


@register(Tags.security)
def check_webhook_allow_list(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    """An entry that is neither a host name nor a network would silently allow nothing."""
    bad = []
    for entry in settings.VGPU_WEBHOOK_ALLOWED_HOSTS:
        if "/" in entry or ":" in entry:
            try:
                ipaddress.ip_network(entry, strict=False)
            except ValueError:
                bad.append(entry)
    if not bad:
        return []
    return [Error(f"VGPU_WEBHOOK_ALLOWED_HOSTS has entries that are neither a host name, an address nor a network: "
                  f"{', '.join(bad)}", hint='e.g. "hooks.internal,10.20.0.0/16,fd00::/8" (no scheme, no port)',
                  id="billing.E002")]


@register(Tags.security)
def check_node_identity(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    """ServiceAccount-token settings (billing/services/identity/node_identity.py) that would refuse every
    agent, or keep a refused pod's token working long after its pod is gone."""
    if not settings.VGPU_NODE_TOKENREVIEW:
        return []
    problems = []
    if not settings.VGPU_NODE_TOKEN_AUDIENCE:
        problems.append("VGPU_NODE_TOKEN_AUDIENCE is empty")
    malformed = [a for a in settings.VGPU_NODE_SERVICE_ACCOUNTS if len(a.split(":")) != 2 or not all(a.split(":"))]
    if malformed or not settings.VGPU_NODE_SERVICE_ACCOUNTS:
        problems.append(f"VGPU_NODE_SERVICE_ACCOUNTS must list namespace:name entries, got {malformed or 'none'}")
    if not 0 <= settings.VGPU_NODE_TOKENREVIEW_CACHE_S <= 600:
        problems.append(f"VGPU_NODE_TOKENREVIEW_CACHE_S must lie in [0, 600], got {settings.VGPU_NODE_TOKENREVIEW_CACHE_S}")
    if not settings.VGPU_KUBE_API_TIMEOUT_S > 0:
        problems.append(f"VGPU_KUBE_API_TIMEOUT_S must be > 0, got {settings.VGPU_KUBE_API_TIMEOUT_S}")
    if not problems:
        return []
    return [Error(f"Node identity by TokenReview is misconfigured: {'; '.join(problems)}.",
                  hint='e.g. VGPU_NODE_TOKEN_AUDIENCE=vgpu-ledger VGPU_NODE_SERVICE_ACCOUNTS=vgpu-ledger:vgpu-agent',
                  id="billing.E003")]


@register()
def check_retention(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    """Retention settings that would drop raw samples, minutes or hours still needed
    (billing.ledger.retention refuses to drop anything while they hold, so the operator hears it
    here first)."""
    problems = RetentionPolicy.from_settings().problems()
    if not problems:
        return []
    return [Error(f"Retention is misconfigured, so nothing is dropped: {'; '.join(problems)}.",
                  hint="e.g. VGPU_RAW_RETENTION_MARGIN_DAYS=2 VGPU_MINUTE_RETENTION_DAYS=100 "
                       "VGPU_HOUR_RETENTION_DAYS=396 (docs/operations.md, Retention)", id="billing.E004")]


@register()
def check_invoice_issuer(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    """In production an invoice must name its issuer: legal entity, address and tax id (copied onto
    every invoice and credit note when it is issued, so a later fix does not mend those)."""
    if not settings.PRODUCTION:
        return []
    unset = [name for name in ("VGPU_ISSUER_NAME", "VGPU_ISSUER_ADDRESS", "VGPU_ISSUER_TAX_ID")
             if not getattr(settings, name)]
    if not unset:
        return []
    return [Warning(f"{', '.join(unset)} unset: invoices and credit notes issued now will not name the issuer's "
                    "legal entity, address or tax id, and issued documents never change.",
                    hint='e.g. VGPU_ISSUER_NAME="Example GPU Cloud Ltd" VGPU_ISSUER_ADDRESS="1 Main St|London" '
                         "VGPU_ISSUER_TAX_ID=GB123456789 (docs/exports.md, Invoices)", id="billing.W010")]


@register()
def check_public_url(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    """Alerts link to Explore; in production, without the address people reach the service at, the
    link in an e-mail or a Slack message is a bare path nobody can open."""
    url = settings.VGPU_PUBLIC_URL
    if url and not url.startswith(("https://", "http://")):
        return [Error(f"VGPU_PUBLIC_URL {url!r} is not an http(s) URL", hint="e.g. https://gpu-cost.example.com",
                      id="billing.E005")]
    if settings.PRODUCTION and not url:
        return [Warning("VGPU_PUBLIC_URL is unset: alerts sent by e-mail, webhook and Slack link to Explore by a path "
                        "only, which their readers cannot open.", hint="e.g. VGPU_PUBLIC_URL=https://gpu-cost.example.com "
                        "(docs/alerts.md)", id="billing.W011")]
    return []
