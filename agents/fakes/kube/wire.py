"""What the fake API server's parts share: the kinds it stores, ``meta/v1`` Status bodies and
the errors that become them, field selectors, merge patches and timestamps."""

from __future__ import annotations

import copy
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

_POD_FIELDS = {"spec.nodeName", "metadata.name", "metadata.namespace", "status.phase"}
_NAMESPACE_FIELDS = {"metadata.name", "status.phase"}


def status_body(*, code: int, reason: str, message: str, details: dict[str, Any] | None = None) -> dict[str, Any]:
    """A ``meta/v1`` Status object as the API server sends it with an error (or eviction) response."""
    body: dict[str, Any] = {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Success" if code < 400 else "Failure",
        "code": code,
    }
    if code >= 400:
        body["message"] = message
        body["reason"] = reason
    if details is not None:
        body["details"] = details
    return body


def _field_value(obj: dict[str, Any], path: str) -> str:
    value: Any = obj
    for part in path.split("."):
        value = value.get(part, "") if isinstance(value, dict) else ""
    return "" if value is None else str(value)


@dataclass(frozen=True)
class Selector:
    """A parsed ``fieldSelector``: a conjunction of ``field=value`` / ``field!=value`` terms."""

    terms: tuple[tuple[str, bool, str], ...]  # (field path, equal?, value)

    def matches(self, obj: dict[str, Any] | None) -> bool:
        if obj is None:
            return False
        return all((_field_value(obj, path) == value) == equal for path, equal, value in self.terms)


def parse_field_selector(raw: str | None, *, supported: set[str], resource: str) -> Selector:
    terms: list[tuple[str, bool, str]] = []
    for term in (raw or "").split(","):
        if not term:
            continue
        if "!=" in term:
            path, value = term.split("!=", 1)
            equal = False
        elif "==" in term:
            path, value = term.split("==", 1)
            equal = True
        elif "=" in term:
            path, value = term.split("=", 1)
            equal = True
        else:
            raise ApiError(400, "BadRequest", f'invalid selector: "{raw}"; can\'t understand "{term}"')
        if path not in supported:
            raise ApiError(400, "BadRequest", f'"{path}" is not a known field selector: only "{resource}"')
        terms.append((path, equal, value))
    return Selector(tuple(terms))


class ApiError(Exception):
    def __init__(self, code: int, reason: str, message: str, details: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.reason = reason
        self.message = message
        self.details = details


@dataclass(frozen=True)
class Change:
    """One entry of the fake's change history (what etcd keeps until compaction)."""

    resource_version: int
    resource: str  # "pods" | "namespaces"
    before: dict[str, Any] | None  # None: created
    after: dict[str, Any] | None  # None: deleted


@dataclass(frozen=True)
class KubeRequest:
    """One request the fake answered: method, path and decoded query parameters."""

    method: str
    path: str
    query: dict[str, str]


@dataclass(frozen=True)
class Kind:
    resource: str
    kind: str
    api_version: str
    fields: frozenset[str]


PODS = Kind("pods", "Pod", "v1", frozenset(_POD_FIELDS))
NAMESPACES = Kind("namespaces", "Namespace", "v1", frozenset(_NAMESPACE_FIELDS))
NODES = Kind("nodes", "Node", "v1", frozenset({"metadata.name"}))
CLAIMS = Kind(
    "resourceclaims", "ResourceClaim", "resource.k8s.io/v1", frozenset({"metadata.name", "metadata.namespace"})
)
# A pod's owners, read by name only (agents.owners resolves a ReplicaSet's Deployment, a Job's CronJob).
REPLICA_SETS = Kind("replicasets", "ReplicaSet", "apps/v1", frozenset({"metadata.name", "metadata.namespace"}))
JOBS = Kind("jobs", "Job", "batch/v1", frozenset({"metadata.name", "metadata.namespace"}))
OWNER_KINDS = {"replicaset": REPLICA_SETS, "job": JOBS}


def merge_patch(target: dict[str, Any], patch: dict[str, Any]) -> None:
    for key, value in patch.items():
        if value is None:
            target.pop(key, None)
        elif isinstance(value, dict) and isinstance(target.get(key), dict):
            merge_patch(target[key], value)
        else:
            target[key] = copy.deepcopy(value)


def rfc3339(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
