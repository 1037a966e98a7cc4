"""System checks (`manage.py check`, and before migrate / runserver): configuration that would
leave a guard open or refuse every caller, said to the operator before the first request."""

from __future__ import annotations

from typing import Any

from django.core.checks import CheckMessage, Error, Tags, Warning, register

from billing.services.admission_auth import HOW_TO_CONFIGURE, load_admission_credentials

__all__ = ["check_admission_credentials"]

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
