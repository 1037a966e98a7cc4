"""The agent's bearer token, read from a file.

In Kubernetes the file is the pod's projected ServiceAccount token, which the kubelet replaces
before it expires (an atomic swap of the volume's ``..data`` link); elsewhere it holds a node
token (``vgl_…``). Every client (uploads, policy, events, undelivered reports) calls
``read_token`` per request, so a rotated file applies to the next request, with no restart.
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["TokenError", "read_token"]


class TokenError(Exception):
    """The token file is missing, unreadable or empty."""


def read_token(path: str | Path) -> str:
    """The token with surrounding whitespace stripped; re-read on every request (rotation)."""
    try:
        token = Path(path).read_text(encoding="utf-8").strip()
    except FileNotFoundError:
        raise TokenError(f"token file {path} does not exist") from None
    except OSError as error:
        raise TokenError(f"token file {path} cannot be read: {error.strerror}") from error
    if not token:
        raise TokenError(f"token file {path} is empty")
    return token
