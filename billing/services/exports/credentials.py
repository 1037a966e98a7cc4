"""Secrets the service must use but never show: an export destination's access key, sealed at rest.

Sealed with Fernet (AES-128-CBC with HMAC-SHA256, the `cryptography` package the webhook's CA already
uses) under VGPU_CREDENTIALS_KEY when it is set (a Fernet key: `python -c "from cryptography.fernet
import Fernet; print(Fernet.generate_key().decode())"`), else under a key derived from SECRET_KEY with
HKDF-SHA256, so a copy of the database alone reads nothing. Rotating the key that sealed them makes
them unreadable (`CredentialsUnreadable`): the page says so and asks for them again; nothing falls
back to sending without them.
"""

from __future__ import annotations

import base64
import json

from cryptography.fernet import Fernet, InvalidToken
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.kdf.hkdf import HKDF
from django.conf import settings

__all__ = ["CredentialsUnreadable", "hint", "readable", "seal", "unseal"]

_HKDF_INFO = b"vgpu-ledger export credentials v1"


class CredentialsUnreadable(Exception):
    """Sealed under another key (rotated) or damaged: they must be entered again."""


def _fernet() -> Fernet:
    configured = settings.VGPU_CREDENTIALS_KEY
    if configured:
        return Fernet(configured.encode())
    derived = HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=_HKDF_INFO).derive(settings.SECRET_KEY.encode())
    return Fernet(base64.urlsafe_b64encode(derived))


def seal(values: dict[str, str]) -> str:
    return _fernet().encrypt(json.dumps(values, sort_keys=True).encode()).decode()


def unseal(token: str) -> dict[str, str]:
    try:
        values = json.loads(_fernet().decrypt(token.encode()))
    except (InvalidToken, ValueError) as exc:
        raise CredentialsUnreadable("the stored credentials cannot be read with the current key") from exc
    if not isinstance(values, dict):
        raise CredentialsUnreadable("the stored credentials are not what this service sealed")
    return {str(k): str(v) for k, v in values.items()}


def readable(token: str) -> bool:
    """Whether sealed credentials open with the current key (nothing stored counts as readable)."""
    if not token:
        return True
    try:
        unseal(token)
    except CredentialsUnreadable:
        return False
    return True


def hint(access_key_id: str) -> str:
    """What the page shows of a key id: its last four characters, never more."""
    return f"…{access_key_id[-4:]}" if len(access_key_id) > 4 else "…"
