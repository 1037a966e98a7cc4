"""Typed domain errors. billing.api.errors maps them to HTTP status codes in one place."""

from __future__ import annotations

from dataclasses import dataclass


class DomainError(Exception):
    """Base class of errors that carry a message meant for the caller."""


@dataclass(frozen=True)
class FieldError:
    path: str
    message: str

    def as_dict(self) -> dict[str, str]:
        return {"path": self.path, "message": self.message}


class InvalidBatch(DomainError):
    """The batch breaks a rule of the wire protocol; nothing of it was stored (400)."""

    def __init__(self, errors: list[FieldError]) -> None:
        super().__init__("; ".join(f"{e.path}: {e.message}" for e in errors[:5]))
        self.errors = errors


class UnsupportedMediaType(DomainError):
    """The body is not JSON (415)."""


class PayloadTooLarge(DomainError):
    """The body, decompressed body or sample count is above the configured limit (413)."""


class BatchConflict(DomainError):
    """Same (node, batch_seq) already stored with different content (409)."""


class NotAuthenticated(DomainError):
    """Missing, malformed or unknown bearer token (401)."""


class Forbidden(DomainError):
    """A valid token that may not do this: revoked, or another node's (403)."""


class Overloaded(DomainError):
    """Shedding load; the caller should retry after `retry_after_s` (429)."""

    def __init__(self, message: str, *, retry_after_s: int) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class InvalidInput(DomainError):
    """Bad input to a command or form; the message names the field and the rule."""
