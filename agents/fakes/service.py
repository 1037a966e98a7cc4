"""The ledger service's HTTP API as ``agents.uploader`` and ``agents.events`` reach it: a
``requests.Session`` that answers from a script instead of the network."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import requests

__all__ = ["RecordedRequest", "ScriptedSession"]


@dataclass(frozen=True)
class RecordedRequest:
    url: str
    body: bytes
    headers: dict[str, str]
    timeout: float


class ScriptedSession(requests.Session):
    """A ``requests.Session`` that answers ``post`` from a script instead of the network.

    Each script entry is ``(status, headers, body)`` or an exception to raise
    (e.g. ``requests.ConnectionError``). Every request is recorded in ``sent``.
    """

    def __init__(self, script: list[tuple[int, dict[str, str], bytes] | Exception]) -> None:
        super().__init__()
        self._script = list(script)
        self.sent: list[RecordedRequest] = []

    def post(
        self, url: str | bytes, data: Any = None, json: Any = None, **kwargs: Any
    ) -> requests.Response:  # signature of requests.Session.post
        self.sent.append(
            RecordedRequest(url=str(url), body=bytes(data), headers=dict(kwargs["headers"]), timeout=kwargs["timeout"])
        )
        entry = self._script.pop(0)
        if isinstance(entry, Exception):
            raise entry
        status, headers, body = entry
        response = requests.Response()
        response.status_code = status
        response.headers.update(headers)
        response._content = body
        response.url = str(url)
        return response
