"""Bearer tokens that machines present to the service (the API server to the admission webhook,
Prometheus to /metrics): read from a setting or from a mounted Secret, and compared safely."""

from __future__ import annotations

import hashlib
import hmac
from pathlib import Path

from django.conf import settings

__all__ = ["configured_token", "presents_bearer"]


def configured_token(name: str) -> tuple[str, str]:
    """(token, problem) from the setting `name` or the file named by `name`_FILE (a mounted Secret,
    read on every call so a rotated Secret takes effect without a restart). Both at once is a
    problem: it would be unclear which one the caller holds. Neither: ("", "")."""
    inline, path = getattr(settings, name).strip(), getattr(settings, f"{name}_FILE").strip()
    if inline and path:
        return "", f"set {name} or {name}_FILE, not both"
    if not path:
        return inline, ""
    try:
        token = Path(path).read_text().strip()
    except OSError as exc:
        return "", f"{name}_FILE {path} cannot be read: {exc.strerror or exc}"
    if not token:
        return "", f"{name}_FILE {path} is empty"
    return token, ""


def presents_bearer(authorization: str, token: str) -> bool:
    """Whether an Authorization header carries `token` as its bearer credential."""
    scheme, _, given = authorization.strip().partition(" ")
    # Digests: the time taken does not depend on the lengths or on the first byte that differs.
    return bool(token) and scheme.lower() == "bearer" and hmac.compare_digest(
        hashlib.sha256(given.strip().encode()).digest(), hashlib.sha256(token.encode()).digest())
