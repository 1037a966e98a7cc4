"""Fakes for the agent's seams, shipped with the code (docs/design.md, House rules)."""

from __future__ import annotations

import base64
import binascii
import contextlib
import copy
import functools
import hashlib
import hmac
import json
import logging
import re
import secrets
import threading
import time
import urllib.parse
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import SimpleNamespace
from typing import Any

import pynvml
import requests

from agents.clock import from_us, to_us

__all__ = [
    "FakeClock",
    "FakeKubernetes",
    "FakeNvml",
    "FakeNvmlDevice",
    "NVML_FIXTURE_SCHEMA",
    "KubeRequest",
    "RecordedRequest",
    "ScriptedSession",
    "wait_until",
]

log = logging.getLogger(__name__)

# JSON written by ``python -m agents.gpu_check --save-fixtures`` from a real driver's answers.
NVML_FIXTURE_SCHEMA = "vgpu-ledger/nvml-fixture/v1"


class FakeClock:
    """A ``Clock`` that stands still until slept on; ``sleep`` advances it exactly.

    Time is kept in integer microseconds so that ticks never drift.
    """

    def __init__(self, *, start: datetime) -> None:
        self._start_us = to_us(start)
        self._elapsed_us = 0

    def now(self) -> datetime:
        return from_us(self._start_us + self._elapsed_us)

    def monotonic(self) -> float:
        return self._elapsed_us / 1_000_000

    def sleep(self, seconds: float) -> None:
        if seconds < 0:
            raise ValueError(f"cannot sleep a negative time ({seconds} s)")
        self._elapsed_us += round(seconds * 1_000_000)

    def advance(self, delta: timedelta) -> None:
        """Move time forward without a sleep (e.g. a stalled tick)."""
        self.sleep(delta.total_seconds())


@dataclass
class FakeNvmlDevice:
    """One GPU as ``FakeNvml`` reports it; tests mutate ``processes`` and ``samples``."""

    uuid: str
    name: str = "NVIDIA A100-SXM4-80GB"
    memory_total_bytes: int = 81920 * 1024 * 1024
    compute_capability: tuple[int, int] = (8, 0)
    cuda_cores: int = 6912
    mig_sm_count: int | None = None  # served by nvmlDeviceGetAttributes only when set
    processes: dict[int, int | None] = field(default_factory=dict)  # pid -> bytes (None: withheld)
    samples: list[tuple[int, int, int]] = field(default_factory=list)  # (pid, timestamp µs, SM %)
    # Device PCIe throughput as nvmlDeviceGetPcieThroughput reports it, KB/s; None: not supported.
    pcie_tx_kb_s: int | None = None
    pcie_rx_kb_s: int | None = None
    # MIG: when ``mig_instances`` is non-empty the device is in MIG mode and these are its
    # instances (each a device of its own, with ``mig_sm_count`` set).
    mig_instances: list[FakeNvmlDevice] = field(default_factory=list)


class FakeNvml:
    """The subset of ``pynvml`` that ``NvmlBackend`` calls, over in-memory devices.

    Errors are real ``pynvml.NVMLError`` instances with NVML's codes.
    """

    @classmethod
    def from_fixture(cls, fixture: dict[str, Any]) -> FakeNvml:
        """The devices of an NVML fixture (``NVML_FIXTURE_SCHEMA``; ``nvml_fixture`` writes one)."""
        if fixture.get("schema") != NVML_FIXTURE_SCHEMA:
            raise ValueError(f"not an NVML fixture: schema {fixture.get('schema')!r}, expected {NVML_FIXTURE_SCHEMA!r}")
        return cls(devices=[_device_from_json(d) for d in fixture["devices"]])

    def to_fixture(self, **source: Any) -> dict[str, Any]:
        """These devices as an NVML fixture; ``source`` says where the answers came from."""
        return {
            "schema": NVML_FIXTURE_SCHEMA,
            "source": source,
            "devices": [_device_to_json(d) for d in self.devices],
        }

    NVML_SUCCESS = pynvml.NVML_SUCCESS
    NVML_ERROR_NOT_FOUND = pynvml.NVML_ERROR_NOT_FOUND
    NVML_ERROR_NOT_SUPPORTED = pynvml.NVML_ERROR_NOT_SUPPORTED
    NVML_DEVICE_MIG_ENABLE = pynvml.NVML_DEVICE_MIG_ENABLE
    NVML_PCIE_UTIL_TX_BYTES = pynvml.NVML_PCIE_UTIL_TX_BYTES
    NVML_PCIE_UTIL_RX_BYTES = pynvml.NVML_PCIE_UTIL_RX_BYTES
    NVMLError = pynvml.NVMLError

    def __init__(self, *, devices: list[FakeNvmlDevice]) -> None:
        self.devices = devices
        self.initialised = True

    def nvmlShutdown(self) -> None:
        self.initialised = False

    def nvmlDeviceGetCount(self) -> int:
        return len(self.devices)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> FakeNvmlDevice:
        return self.devices[index]

    def nvmlDeviceGetUUID(self, handle: FakeNvmlDevice) -> str:
        return handle.uuid

    def nvmlDeviceGetName(self, handle: FakeNvmlDevice) -> str:
        return handle.name

    def nvmlDeviceGetMemoryInfo(self, handle: FakeNvmlDevice) -> SimpleNamespace:
        return SimpleNamespace(total=handle.memory_total_bytes)

    def nvmlDeviceGetAttributes(self, handle: FakeNvmlDevice) -> SimpleNamespace:
        if handle.mig_sm_count is None:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return SimpleNamespace(multiprocessorCount=handle.mig_sm_count)

    def nvmlDeviceGetCudaComputeCapability(self, handle: FakeNvmlDevice) -> tuple[int, int]:
        return handle.compute_capability

    def nvmlDeviceGetNumGpuCores(self, handle: FakeNvmlDevice) -> int:
        return handle.cuda_cores

    def nvmlDeviceGetMigMode(self, handle: FakeNvmlDevice) -> tuple[int, int]:
        mode = pynvml.NVML_DEVICE_MIG_ENABLE if handle.mig_instances else pynvml.NVML_DEVICE_MIG_DISABLE
        return mode, mode

    def nvmlDeviceGetMaxMigDeviceCount(self, handle: FakeNvmlDevice) -> int:
        return 7 if handle.mig_instances else 0

    def nvmlDeviceGetMigDeviceHandleByIndex(self, handle: FakeNvmlDevice, index: int) -> FakeNvmlDevice:
        if index >= len(handle.mig_instances):
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_FOUND)
        return handle.mig_instances[index]

    def nvmlDeviceGetPcieThroughput(self, handle: FakeNvmlDevice, counter: int) -> int:
        value = handle.pcie_tx_kb_s if counter == pynvml.NVML_PCIE_UTIL_TX_BYTES else handle.pcie_rx_kb_s
        if value is None:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return value

    def nvmlDeviceGetComputeRunningProcesses(self, handle: FakeNvmlDevice) -> list[SimpleNamespace]:
        return [SimpleNamespace(pid=pid, usedGpuMemory=used) for pid, used in handle.processes.items()]

    def nvmlDeviceGetProcessUtilization(self, handle: FakeNvmlDevice, last_seen_us: int) -> list[SimpleNamespace]:
        fresh = [
            SimpleNamespace(pid=pid, timeStamp=ts, smUtil=sm) for pid, ts, sm in handle.samples if ts > last_seen_us
        ]
        if not fresh:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_FOUND)
        return fresh


def _device_to_json(device: FakeNvmlDevice) -> dict[str, Any]:
    return {
        "uuid": device.uuid,
        "name": device.name,
        "memory_total_bytes": device.memory_total_bytes,
        "compute_capability": list(device.compute_capability),
        "cuda_cores": device.cuda_cores,
        "mig_sm_count": device.mig_sm_count,
        # JSON keys are strings: [pid, bytes or null] pairs keep the pid an integer.
        "processes": [[pid, used] for pid, used in sorted(device.processes.items())],
        "samples": [list(s) for s in device.samples],
        "pcie_tx_kb_s": device.pcie_tx_kb_s,
        "pcie_rx_kb_s": device.pcie_rx_kb_s,
        "mig_instances": [_device_to_json(m) for m in device.mig_instances],
    }


def _device_from_json(raw: dict[str, Any]) -> FakeNvmlDevice:
    major, minor = raw["compute_capability"]
    return FakeNvmlDevice(
        uuid=raw["uuid"],
        name=raw["name"],
        memory_total_bytes=int(raw["memory_total_bytes"]),
        compute_capability=(int(major), int(minor)),
        cuda_cores=int(raw["cuda_cores"]),
        mig_sm_count=raw["mig_sm_count"],
        processes={int(pid): used for pid, used in raw["processes"]},
        samples=[(int(pid), int(ts), int(sm)) for pid, ts, sm in raw["samples"]],
        pcie_tx_kb_s=raw["pcie_tx_kb_s"],
        pcie_rx_kb_s=raw["pcie_rx_kb_s"],
        mig_instances=[_device_from_json(m) for m in raw["mig_instances"]],
    )


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


def wait_until(predicate: Callable[[], bool], *, timeout_s: float = 5.0, what: str = "condition") -> None:
    """Poll ``predicate`` until true (for effects of background watches); raise after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() >= deadline:
            raise TimeoutError(f"{what} not reached within {timeout_s} s")
        time.sleep(0.01)


# --------------------------------------------------------------------------------------
# Kubernetes API server fake
# --------------------------------------------------------------------------------------

_POD_FIELDS = {"spec.nodeName", "metadata.name", "metadata.namespace", "status.phase"}
_NAMESPACE_FIELDS = {"metadata.name", "status.phase"}


def _status_body(*, code: int, reason: str, message: str, details: dict[str, Any] | None = None) -> dict[str, Any]:
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
class _Selector:
    """A parsed ``fieldSelector``: a conjunction of ``field=value`` / ``field!=value`` terms."""

    terms: tuple[tuple[str, bool, str], ...]  # (field path, equal?, value)

    def matches(self, obj: dict[str, Any] | None) -> bool:
        if obj is None:
            return False
        return all((_field_value(obj, path) == value) == equal for path, equal, value in self.terms)


def _parse_field_selector(raw: str | None, *, supported: set[str], resource: str) -> _Selector:
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
            raise _ApiError(400, "BadRequest", f'invalid selector: "{raw}"; can\'t understand "{term}"')
        if path not in supported:
            raise _ApiError(400, "BadRequest", f'"{path}" is not a known field selector: only "{resource}"')
        terms.append((path, equal, value))
    return _Selector(tuple(terms))


class _ApiError(Exception):
    def __init__(self, code: int, reason: str, message: str, details: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.reason = reason
        self.message = message
        self.details = details


@dataclass(frozen=True)
class _Change:
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
class _Kind:
    resource: str
    kind: str
    api_version: str
    fields: frozenset[str]


_PODS = _Kind("pods", "Pod", "v1", frozenset(_POD_FIELDS))
_NAMESPACES = _Kind("namespaces", "Namespace", "v1", frozenset(_NAMESPACE_FIELDS))
_NODES = _Kind("nodes", "Node", "v1", frozenset({"metadata.name"}))
_CLAIMS = _Kind(
    "resourceclaims", "ResourceClaim", "resource.k8s.io/v1", frozenset({"metadata.name", "metadata.namespace"})
)
# A pod's owners, read by name only (agents.owners resolves a ReplicaSet's Deployment, a Job's CronJob).
_REPLICA_SETS = _Kind("replicasets", "ReplicaSet", "apps/v1", frozenset({"metadata.name", "metadata.namespace"}))
_JOBS = _Kind("jobs", "Job", "batch/v1", frozenset({"metadata.name", "metadata.namespace"}))
_OWNER_KINDS = {"replicaset": _REPLICA_SETS, "job": _JOBS}


# -- Dynamic resource allocation (resource.k8s.io) -------------------------------------------
# Served in the versions of ``FakeKubernetes.resource_api_versions``, as API servers of
# different releases do (1.32: v1beta1; 1.33: v1beta1, v1beta2; 1.34+: v1 as well). Claims
# are stored in the v1 shape and converted on the way in and out, as the API server
# converts between versions: only ``spec.devices.requests[]`` differs (v1beta1 has no
# ``exactly``).

RESOURCE_GROUP_VERSIONS = ("v1", "v1beta2", "v1beta1")  # what the fake can serve, newest first
_CLAIM_VERSION = r"(?P<version>v1|v1beta2|v1beta1)"
_DRA_ROUTES: list[tuple[str, re.Pattern[str]]] = [
    ("resource_group", re.compile(r"^/apis/resource\.k8s\.io/?$")),
    ("claims", re.compile(rf"^/apis/resource\.k8s\.io/{_CLAIM_VERSION}/resourceclaims$")),
    (
        "namespaced_claims",
        re.compile(rf"^/apis/resource\.k8s\.io/{_CLAIM_VERSION}/namespaces/(?P<ns>[^/]+)/resourceclaims$"),
    ),
    (
        "claim",
        re.compile(
            rf"^/apis/resource\.k8s\.io/{_CLAIM_VERSION}/namespaces/(?P<ns>[^/]+)/resourceclaims/(?P<name>[^/]+)$"
        ),
    ),
]
_DRA_ROUTE_NAMES = frozenset(name for name, _ in _DRA_ROUTES)


def _not_served(path: str) -> _ApiError:
    """The API server's answer for a group or version it does not serve (as for any unknown path)."""
    return _ApiError(404, "NotFound", f"the server could not find the requested resource ({path})")


def _resource_group(versions: tuple[str, ...]) -> dict[str, Any]:
    """The ``APIGroup`` discovery document for resource.k8s.io; the first version is the preferred one."""
    listed = [{"groupVersion": f"resource.k8s.io/{v}", "version": v} for v in versions]
    return {
        "kind": "APIGroup",
        "apiVersion": "v1",
        "name": "resource.k8s.io",
        "versions": listed,
        "preferredVersion": listed[0],
    }


def _claim_to_v1(claim: dict[str, Any]) -> dict[str, Any]:
    """A claim in any served version's shape, as stored (v1)."""
    stored = copy.deepcopy(claim)
    if stored.get("apiVersion", "resource.k8s.io/v1") == "resource.k8s.io/v1beta1":
        for request in (stored.get("spec") or {}).get("devices", {}).get("requests") or ():
            if "firstAvailable" not in request:
                exactly = {k: request.pop(k) for k in list(request) if k != "name"}
                request["exactly"] = exactly
    return stored


def _claim_in_version(stored: dict[str, Any], version: str) -> dict[str, Any]:
    """A stored (v1) claim as the API server returns it in ``version``."""
    claim = copy.deepcopy(stored)
    if "apiVersion" in claim:  # list items carry none
        claim["apiVersion"] = f"resource.k8s.io/{version}"
    if version == "v1beta1":
        for request in (claim.get("spec") or {}).get("devices", {}).get("requests") or ():
            request.update(request.pop("exactly", {}))
    return claim


def _serve_dra(
    fake: FakeKubernetes, route: str, params: dict[str, str], query: dict[str, str], path: str
) -> dict[str, Any]:
    """GET of the discovery document, a claim, or a list of claims (watches are not served)."""
    versions = fake.resource_api_versions
    if not versions:
        raise _not_served(path)
    if route == "resource_group":
        return _resource_group(versions)
    version = params["version"]
    if version not in versions:
        raise _not_served(path)
    if route == "claim":
        return _claim_in_version(fake._get(_CLAIMS, (params["ns"], params["name"])), version)
    if query.get("watch") in ("true", "1"):
        raise _ApiError(405, "MethodNotAllowed", "FakeKubernetes does not watch resourceclaims")
    selector = _parse_field_selector(
        query.get("fieldSelector"), supported=set(_CLAIMS.fields), resource=", ".join(sorted(_CLAIMS.fields))
    )
    listed = fake._list(_CLAIMS, namespace=params.get("ns"), selector=selector)
    listed["apiVersion"] = f"resource.k8s.io/{version}"
    listed["items"] = [_claim_in_version(item, version) for item in listed["items"]]
    return listed


_ROUTES: list[tuple[str, re.Pattern[str]]] = [
    ("pods", re.compile(r"^/api/v1/pods$")),
    ("namespaced_pods", re.compile(r"^/api/v1/namespaces/(?P<ns>[^/]+)/pods$")),
    ("pod", re.compile(r"^/api/v1/namespaces/(?P<ns>[^/]+)/pods/(?P<name>[^/]+)$")),
    ("tokenreviews", re.compile(r"^/apis/authentication\.k8s\.io/v1/tokenreviews$")),
    ("eviction", re.compile(r"^/api/v1/namespaces/(?P<ns>[^/]+)/pods/(?P<name>[^/]+)/eviction$")),
    ("core_events", re.compile(r"^/api/v1/namespaces/(?P<ns>[^/]+)/events$")),
    ("namespaces", re.compile(r"^/api/v1/namespaces$")),
    ("node", re.compile(r"^/api/v1/nodes/(?P<name>[^/]+)$")),
    ("namespace", re.compile(r"^/api/v1/namespaces/(?P<name>[^/]+)$")),
    ("events_v1", re.compile(r"^/apis/events\.k8s\.io/v1/namespaces/(?P<ns>[^/]+)/events$")),
    ("replicaset", re.compile(r"^/apis/apps/v1/namespaces/(?P<ns>[^/]+)/replicasets/(?P<name>[^/]+)$")),
    ("job", re.compile(r"^/apis/batch/v1/namespaces/(?P<ns>[^/]+)/jobs/(?P<name>[^/]+)$")),
    *_DRA_ROUTES,
]


# -- core/v1 Secrets and admissionregistration.k8s.io/v1 ValidatingWebhookConfigurations --------
# What `manage.py webhook_certificate --apply` calls: get / create / replace (PUT) Secrets, get /
# patch the webhook configuration (the client sends a dict as a strategic merge patch).

_SECRETS = _Kind("secrets", "Secret", "v1", frozenset({"metadata.name", "metadata.namespace"}))
_WEBHOOK_CONFIGS = _Kind(
    "validatingwebhookconfigurations",
    "ValidatingWebhookConfiguration",
    "admissionregistration.k8s.io/v1",
    frozenset({"metadata.name"}),
)
_CERTIFICATE_ROUTES: list[tuple[str, re.Pattern[str]]] = [
    ("secrets", re.compile(r"^/api/v1/namespaces/(?P<ns>[^/]+)/secrets$")),
    ("secret", re.compile(r"^/api/v1/namespaces/(?P<ns>[^/]+)/secrets/(?P<name>[^/]+)$")),
    (
        "validating_webhook_configuration",
        re.compile(r"^/apis/admissionregistration\.k8s\.io/v1/validatingwebhookconfigurations/(?P<name>[^/]+)$"),
    ),
]
_ROUTES.extend(_CERTIFICATE_ROUTES)
# The lists the API's strategic merge patch merges by key instead of replacing
# (``patchMergeKey`` in the OpenAPI schema), by path from the object's root.
_STRATEGIC_MERGE_KEYS: dict[tuple[str, ...], str] = {("webhooks",): "name"}


def _check_base64(values: dict[str, Any], *, field_path: str) -> None:
    """The API server decodes ``[]byte`` fields and refuses a value that is not base64."""
    for key, value in values.items():
        try:
            base64.b64decode(str(value), validate=True)
        except binascii.Error as error:
            raise _ApiError(400, "BadRequest", f"{field_path}[{key}]: illegal base64 data: {error}") from error


def _validate_secret(secret: dict[str, Any], *, before: dict[str, Any] | None) -> None:
    """The API server's validation of a Secret that matters here: base64 data, the keys a
    ``kubernetes.io/tls`` Secret must have, and ``type`` immutable once created."""
    data = secret.get("data") or {}
    if not isinstance(data, dict):
        raise _ApiError(400, "BadRequest", "Secret.data must be an object of base64 strings")
    _check_base64(data, field_path="data")
    kind = secret.get("type") or "Opaque"
    if kind == "kubernetes.io/tls":
        missing = [key for key in ("tls.crt", "tls.key") if key not in data]
        if missing:
            raise _ApiError(422, "Invalid", f"Secret \"{secret['metadata']['name']}\" is invalid: data[{missing[0]}]: "
                            "Required value")
    if before is not None and (before.get("type") or "Opaque") != kind:
        raise _ApiError(422, "Invalid", f"Secret \"{secret['metadata']['name']}\" is invalid: type: Invalid value: "
                        f"\"{kind}\": field is immutable")


def _strategic_merge(target: dict[str, Any], patch: dict[str, Any], *, path: tuple[str, ...] = ()) -> None:
    """Strategic merge patch: a JSON merge patch, except that the lists named in
    ``_STRATEGIC_MERGE_KEYS`` merge element by element on their key. Directives (``$patch``,
    ``$setElementOrder``...) are refused rather than misapplied."""
    for key, value in patch.items():
        if key.startswith("$"):
            raise _ApiError(422, "Invalid", f"FakeKubernetes does not implement the patch directive {key!r}")
        merge_key = _STRATEGIC_MERGE_KEYS.get((*path, key))
        if value is None:
            target.pop(key, None)
        elif merge_key is not None and isinstance(value, list):
            current = target.setdefault(key, [])
            for element in value:
                if not isinstance(element, dict) or merge_key not in element:
                    raise _ApiError(400, "BadRequest", f"{key}: every element must have its merge key {merge_key!r}")
                match = next((e for e in current if e.get(merge_key) == element[merge_key]), None)
                if match is None:
                    current.append(copy.deepcopy(element))
                else:
                    _strategic_merge(match, element, path=(*path, key))
        elif isinstance(value, dict) and isinstance(target.get(key), dict):
            _strategic_merge(target[key], value, path=(*path, key))
        else:
            target[key] = copy.deepcopy(value)


class _CertificateObjects:
    """Secrets and webhook configurations, mixed into ``FakeKubernetes`` (which owns the lock,
    the object store and the resource version)."""

    _cond: threading.Condition
    _objects: dict[str, dict[tuple[str, str], dict[str, Any]]]
    _resource_version: int

    def add_secret(self, secret: dict[str, Any]) -> dict[str, Any]:
        namespace = secret.get("metadata", {}).get("namespace", "default")
        return self._create_namespaced(_SECRETS, namespace, secret)

    def get_secret(self, namespace: str, name: str) -> dict[str, Any]:
        """The Secret as stored (``data`` base64, as on the wire)."""
        return self._get_object(_SECRETS, (namespace, name))

    def add_validating_webhook_configuration(self, config: dict[str, Any]) -> dict[str, Any]:
        return self._store_object(_WEBHOOK_CONFIGS, ("", config["metadata"]["name"]), config, create=True)

    def get_validating_webhook_configuration(self, name: str) -> dict[str, Any]:
        return self._get_object(_WEBHOOK_CONFIGS, ("", name))

    def _serve_certificate_objects(
        self, method: str, route: str, params: dict[str, str], body: dict[str, Any], content_type: str
    ) -> tuple[int, dict[str, Any]]:
        if route == "secrets" and method == "POST":
            return 201, self._create_namespaced(_SECRETS, params["ns"], body)
        if route == "secret" and method == "GET":
            return 200, self._get_object(_SECRETS, (params["ns"], params["name"]))
        if route == "secret" and method == "PUT":
            return 200, self._replace_secret(params["ns"], params["name"], body)
        if route == "validating_webhook_configuration" and method == "GET":
            return 200, self._get_object(_WEBHOOK_CONFIGS, ("", params["name"]))
        if route == "validating_webhook_configuration" and method == "PATCH":
            return 200, self._patch_webhook_configuration(params["name"], body, content_type)
        raise _ApiError(405, "MethodNotAllowed", f"{method} is not supported on {route}")

    def _create_namespaced(self, kind: _Kind, namespace: str, body: dict[str, Any]) -> dict[str, Any]:
        meta = body.get("metadata") or {}
        if meta.get("namespace", namespace) != namespace:
            raise _ApiError(400, "BadRequest", "the namespace of the provided object does not match the namespace "
                            "sent on the request")
        if not meta.get("name"):
            raise _ApiError(422, "Invalid", f"{kind.kind}.metadata.name: Required value: name or generateName is "
                            "required")
        if kind is _SECRETS:
            _validate_secret(body, before=None)
        stored = copy.deepcopy(body)
        stored["metadata"]["namespace"] = namespace
        return self._store_object(kind, (namespace, meta["name"]), stored, create=True)

    def _replace_secret(self, namespace: str, name: str, body: dict[str, Any]) -> dict[str, Any]:
        meta = body.get("metadata") or {}
        if meta.get("name") != name:
            raise _ApiError(400, "BadRequest", "the name of the object does not match the name on the URL")
        if meta.get("namespace", namespace) != namespace:
            raise _ApiError(400, "BadRequest", "the namespace of the provided object does not match the namespace "
                            "sent on the request")
        _validate_secret(body, before=self._get_object(_SECRETS, (namespace, name)))
        stored = copy.deepcopy(body)
        stored["metadata"]["namespace"] = namespace
        return self._store_object(_SECRETS, (namespace, name), stored, create=False)

    def _patch_webhook_configuration(self, name: str, patch: Any, content_type: str) -> dict[str, Any]:
        config = self._get_object(_WEBHOOK_CONFIGS, ("", name))
        if not isinstance(patch, dict):
            raise _ApiError(415, "UnsupportedMediaType", "FakeKubernetes patches webhook configurations with merge "
                            "or strategic merge patches only")
        if "strategic-merge-patch" in content_type:
            _strategic_merge(config, patch)
        elif "merge-patch" in content_type:
            _merge_patch(config, patch)
        else:
            raise _ApiError(415, "UnsupportedMediaType", f"the body of a PATCH must match {content_type}")
        for hook in config.get("webhooks") or []:
            bundle = (hook.get("clientConfig") or {}).get("caBundle")
            if bundle:
                _check_base64({"caBundle": bundle}, field_path=f"webhooks[{hook.get('name')}].clientConfig")
        # A resourceVersion in the patch is a precondition, as in the API server.
        return self._store_object(_WEBHOOK_CONFIGS, ("", name), config, create=False)

    def _get_object(self, kind: _Kind, key: tuple[str, str]) -> dict[str, Any]:
        with self._cond:
            obj = self._objects.setdefault(kind.resource, {}).get(key)
            if obj is None:
                raise _ApiError(404, "NotFound", f'{kind.resource} "{key[1]}" not found',
                                {"name": key[1], "kind": kind.resource})
            return copy.deepcopy(obj)

    def _store_object(self, kind: _Kind, key: tuple[str, str], obj: dict[str, Any], *, create: bool) -> dict[str, Any]:
        """Create or update with the API server's optimistic concurrency: an update that names a
        ``resourceVersion`` other than the stored one is a 409 Conflict."""
        stored = copy.deepcopy(obj)
        meta = stored.setdefault("metadata", {})
        with self._cond:
            objects = self._objects.setdefault(kind.resource, {})
            before = objects.get(key)
            if create and before is not None:
                raise _ApiError(409, "AlreadyExists", f'{kind.resource} "{key[1]}" already exists',
                                {"name": key[1], "kind": kind.resource})
            if not create and before is None:
                raise _ApiError(404, "NotFound", f'{kind.resource} "{key[1]}" not found',
                                {"name": key[1], "kind": kind.resource})
            wanted = meta.get("resourceVersion")
            if before is not None and wanted and wanted != before["metadata"]["resourceVersion"]:
                raise _ApiError(409, "Conflict", f'Operation cannot be fulfilled on {kind.resource} "{key[1]}": the '
                                "object has been modified; please apply your changes to the latest version and try "
                                "again")
            self._resource_version += 1
            meta["resourceVersion"] = str(self._resource_version)
            if before is not None:
                meta["uid"] = before["metadata"]["uid"]
                meta["creationTimestamp"] = before["metadata"]["creationTimestamp"]
            else:
                meta["uid"] = str(uuid.uuid4())
                meta["creationTimestamp"] = _rfc3339(datetime.now(UTC))
            stored["kind"] = kind.kind
            stored["apiVersion"] = kind.api_version
            objects[key] = stored
            self._cond.notify_all()
            return copy.deepcopy(stored)


class FakeKubernetes(_CertificateObjects):
    """A Kubernetes API server on loopback that speaks the real JSON shapes over real HTTP.

    Point the official client at it with ``kubernetes.client.Configuration(host=fake.url)``.
    It serves pods (list and watch, ``fieldSelector``, ``resourceVersion``), namespaces
    (get, list, watch), ``pods/eviction`` (``policy/v1`` Eviction), events (``core/v1`` and
    ``events.k8s.io/v1``), ReplicaSets and Jobs (get: pods' owners) and ``resource.k8s.io`` ResourceClaims (get, list, and the group's
    discovery document) in the versions of ``resource_api_versions``.

    Watches stream newline-delimited JSON events (ADDED / MODIFIED / DELETED, BOOKMARK at a
    timeout when asked for) in a chunked response, as the API server does. A watch from a
    ``resourceVersion`` older than the last ``compact()`` gets the API server's
    ``ERROR`` event with a 410 ``Expired`` Status. Tests drive changes with ``add_pod`` /
    ``update_pod`` / ``delete_pod`` (and the namespace and claim equivalents) and read what
    the client did from ``evictions``, ``events`` and ``requests``.
    """

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._resource_version = 1000  # etcd revisions are large; start away from 0 ("any")
        self._compacted_rv = 0
        self._history: list[_Change] = []
        self._objects: dict[str, dict[tuple[str, str], dict[str, Any]]] = {
            "pods": {},
            "namespaces": {},
            "resourceclaims": {},
            "nodes": {},
            "replicasets": {},
            "jobs": {},
        }
        self._watch_generation = 0
        self._watches_held = False
        self._active_watches = 0
        self._closing = False
        self.evictions: list[dict[str, Any]] = []  # Eviction bodies the client posted
        self.events: list[dict[str, Any]] = []  # Event objects as stored (core/v1 or events.k8s.io/v1)
        self.requests: list[KubeRequest] = []
        # True: evictions are refused with 429, as when a PodDisruptionBudget forbids them.
        self.refuse_evictions = False
        # True: ReplicaSet and Job reads answer 403, as for an agent whose ClusterRole lacks them.
        self.forbid_owner_reads = False
        # resource.k8s.io versions discovery lists, preferred first; claims are served in those of
        # RESOURCE_GROUP_VERSIONS among them. () serves no DRA API at all.
        self.resource_api_versions: tuple[str, ...] = ("v1",)
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _handler_for(self))
        self._server.daemon_threads = True
        self._thread = threading.Thread(
            target=self._server.serve_forever, args=(0.05,), name="fake-kube-api", daemon=True
        )
        self._thread.start()

    # -- lifecycle ---------------------------------------------------------------------

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    def close(self) -> None:
        with self._cond:
            self._closing = True
            self._cond.notify_all()
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)

    def __enter__(self) -> FakeKubernetes:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # -- state changes (each one is a watch event) ---------------------------------------

    def add_namespace(self, namespace: dict[str, Any]) -> dict[str, Any]:
        return self._put(_NAMESPACES, namespace, create=True)

    def update_namespace(self, namespace: dict[str, Any]) -> dict[str, Any]:
        return self._put(_NAMESPACES, namespace, create=False)

    def delete_namespace(self, name: str) -> None:
        self._delete(_NAMESPACES, ("", name))

    def add_pod(self, pod: dict[str, Any]) -> dict[str, Any]:
        """Store a pod (``metadata.uid`` and ``resourceVersion`` are filled in); returns the stored copy."""
        return self._put(_PODS, pod, create=True)

    def update_pod(self, pod: dict[str, Any]) -> dict[str, Any]:
        return self._put(_PODS, pod, create=False)

    def delete_pod(self, namespace: str, name: str) -> None:
        self._delete(_PODS, (namespace, name))

    def add_node(self, node: dict[str, Any]) -> dict[str, Any]:
        """Store a node (cluster-scoped); the client may GET it and PATCH it (e.g. cordon)."""
        return self._put(_NODES, node, create=True)

    def get_node(self, name: str) -> dict[str, Any]:
        with self._cond:
            return copy.deepcopy(self._objects["nodes"][("", name)])

    def add_resource_claim(self, claim: dict[str, Any]) -> dict[str, Any]:
        """Store a claim written in any resource.k8s.io version (``apiVersion``; v1 when absent)."""
        return self._put(_CLAIMS, _claim_to_v1(claim), create=True)

    def add_owner(self, obj: dict[str, Any]) -> dict[str, Any]:
        """Store a ReplicaSet (``kind: ReplicaSet``) or a Job (``kind: Job``) that pods name as owner."""
        return self._put(_OWNER_KINDS[obj["kind"].lower()], obj, create=True)

    def get_pod(self, namespace: str, name: str) -> dict[str, Any]:
        with self._cond:
            return copy.deepcopy(self._objects["pods"][(namespace, name)])

    def compact(self) -> None:
        """Drop the change history, as etcd compaction does: older watches get 410 Gone."""
        with self._cond:
            self._resource_version += 1
            self._compacted_rv = self._resource_version
            self._history.clear()

    @contextlib.contextmanager
    def watches_held(self) -> Iterator[None]:
        """End every open watch stream and hold new watch requests until the block exits.

        Models a client cut off from the API server: changes made inside the block (and a
        ``compact()``) are what the client must recover when it reconnects.
        """
        with self._cond:
            self._watches_held = True
            self._watch_generation += 1
            self._cond.notify_all()
        try:
            yield
        finally:
            with self._cond:
                self._watches_held = False
                self._cond.notify_all()

    def wait_for_watches(self, count: int, *, timeout_s: float = 5.0) -> None:
        """Block until ``count`` watch streams are open (a test's sync point)."""
        with self._cond:
            if not self._cond.wait_for(lambda: self._active_watches >= count, timeout=timeout_s):
                raise TimeoutError(f"{self._active_watches} watch streams open after {timeout_s} s, wanted {count}")

    # -- ServiceAccount tokens and TokenReview -------------------------------------------------
    #
    # Bound ServiceAccount tokens as the kubelet's projected `serviceAccountToken` volume gets
    # them (TokenRequest bound to a pod), and `POST /apis/authentication.k8s.io/v1/tokenreviews`
    # answering as the API server's ServiceAccount authenticator does (pkg/serviceaccount): a
    # token is valid while it has not expired, its audience meets the review's, its ServiceAccount
    # exists and the pod it is bound to exists with the same uid (a pod deleted more than 60 s ago
    # invalidates it). The fake signs with HMAC-SHA256 under a key of its own (the real server
    # signs RS256 with its service-account key); the token's holder cannot tell the difference.

    #: the audience of a token or a review that names none (the API server's own)
    API_SERVER_AUDIENCE = "https://kubernetes.default.svc.cluster.local"
    #: True: every TokenReview is refused with 403, as RBAC refuses a reviewer without `create`
    forbid_token_reviews = False

    @functools.cached_property
    def _sa_tokens(self) -> _ServiceAccountTokens:
        return _ServiceAccountTokens(key=secrets.token_bytes(32))

    def use_token_clock(self, now: Callable[[], datetime]) -> None:
        """Check token expiry (and pod deletion) against ``now`` instead of the wall clock."""
        with self._cond:
            self._sa_tokens.now = now

    def service_account_uid(self, namespace: str, name: str) -> str:
        """The ServiceAccount's uid (the API server creates ``default`` in each namespace; the
        fake creates any ServiceAccount a pod names on first use)."""
        with self._cond:
            return self._sa_tokens.accounts.setdefault((namespace, name), str(uuid.uuid4()))

    def delete_service_account(self, namespace: str, name: str) -> None:
        """Every token of this ServiceAccount stops authenticating."""
        with self._cond:
            self._sa_tokens.accounts.pop((namespace, name), None)

    def issue_service_account_token(
        self,
        *,
        namespace: str,
        pod: str | None = None,
        service_account: str | None = None,
        audiences: list[str] | None = None,
        expiration_s: int = 3600,
        issued_at: datetime | None = None,
    ) -> str:
        """A token as TokenRequest issues it: a JWT with ``aud``, ``exp``, ``iat``, ``nbf``,
        ``iss``, ``jti``, ``sub`` and the ``kubernetes.io`` claims.

        With ``pod``, bound to that pod as the kubelet's projected volume gets it (claims:
        namespace, pod, serviceaccount and, since 1.30, the pod's node when the node exists);
        without, bound to nothing, as ``kubectl create token <service_account>`` gets it."""
        if expiration_s < 600:
            raise ValueError(f"expirationSeconds must be at least 600 (10 minutes), got {expiration_s}")
        bound = self.get_pod(namespace, pod) if pod is not None else None  # KeyError: TokenRequest's 404
        spec = (bound or {}).get("spec") or {}
        account = service_account or spec.get("serviceAccountName") or "default"
        if bound is not None and account != (spec.get("serviceAccountName") or "default"):
            raise ValueError(f"pod {namespace}/{pod} runs as {spec.get('serviceAccountName')!r}, not {account!r}")
        with self._cond:
            tokens = self._sa_tokens
            moment = issued_at if issued_at is not None else tokens.now()
            node_name = spec.get("nodeName") or ""
            node = self._objects["nodes"].get(("", node_name)) if node_name else None
        private: dict[str, Any] = {
            "namespace": namespace,
            "serviceaccount": {"name": account, "uid": self.service_account_uid(namespace, account)},
        }
        if bound is not None:
            private["pod"] = {"name": pod, "uid": bound["metadata"]["uid"]}
        if node is not None:
            private["node"] = {"name": node_name, "uid": node["metadata"]["uid"]}
        claims: dict[str, Any] = {
            "aud": list(audiences) if audiences else [self.API_SERVER_AUDIENCE],
            "exp": int(moment.timestamp()) + expiration_s,
            "iat": int(moment.timestamp()),
            "nbf": int(moment.timestamp()),
            "iss": self.API_SERVER_AUDIENCE,
            "jti": str(uuid.uuid4()),
            "sub": f"system:serviceaccount:{namespace}:{account}",
            "kubernetes.io": private,
        }
        return tokens.sign(claims)

    def _review_token(self, body: dict[str, Any]) -> dict[str, Any]:
        if body.get("kind", "TokenReview") != "TokenReview" or body.get("apiVersion", _AUTHENTICATION_API) != (
            _AUTHENTICATION_API
        ):
            raise _ApiError(400, "BadRequest", f"the body of a tokenreviews request must be an {_AUTHENTICATION_API} TokenReview")
        if self.forbid_token_reviews:
            raise _ApiError(
                403,
                "Forbidden",
                'tokenreviews.authentication.k8s.io is forbidden: User "system:anonymous" cannot create resource '
                '"tokenreviews" in API group "authentication.k8s.io" at the cluster scope',
                {"group": "authentication.k8s.io", "kind": "tokenreviews"},
            )
        spec = body.get("spec") or {}
        token = spec.get("token") or ""
        if not token:
            raise _ApiError(400, "BadRequest", "token is required for TokenReview in authentication")
        requested = list(spec.get("audiences") or [self.API_SERVER_AUDIENCE])
        status = self._authenticate_token(token, requested)
        return {
            "kind": "TokenReview",
            "apiVersion": _AUTHENTICATION_API,
            "metadata": {"creationTimestamp": None},
            "spec": copy.deepcopy(spec),
            "status": status,
        }

    def _authenticate_token(self, token: str, requested: list[str]) -> dict[str, Any]:
        """A TokenReview's ``status``. As in Go, ``authenticated`` and ``audiences`` are left out
        when false or empty, ``user`` is ``{}`` when nobody was authenticated, and an error is a
        string in ``error``, never an HTTP error."""
        with self._cond:
            tokens = self._sa_tokens
            claims = tokens.verify(token)
            if claims is None:
                # Not one of this server's tokens: no authenticator claims it, and none errs.
                return {"user": {}}
            now = tokens.now()
            if claims["exp"] <= now.timestamp():
                return {"user": {}, "error": "service account token has expired"}
            audiences = [a for a in claims["aud"] if a in requested]
            if not audiences:
                return {
                    "user": {},
                    "error": f"token audiences {json.dumps(claims['aud'])} is invalid for the target audiences "
                    f"{json.dumps(requested)}",
                }
            bound = claims["kubernetes.io"]
            namespace = bound["namespace"]
            account = bound["serviceaccount"]
            if tokens.accounts.get((namespace, account["name"])) != account["uid"]:
                return {"user": {}, "error": "service account token has been invalidated"}
            if "pod" in bound:
                pod = self._objects["pods"].get((namespace, bound["pod"]["name"]))
                if pod is None or _deleted_before(pod, now - timedelta(seconds=60)):
                    return {"user": {}, "error": "service account token has been invalidated"}
                if pod["metadata"]["uid"] != bound["pod"]["uid"]:
                    return {
                        "user": {},
                        "error": f"pod UID ({pod['metadata']['uid']}) does not match claim ({bound['pod']['uid']})",
                    }
        extra = {"authentication.kubernetes.io/credential-id": [f"JTI={claims['jti']}"]}
        if "pod" in bound:
            extra["authentication.kubernetes.io/pod-name"] = [bound["pod"]["name"]]
            extra["authentication.kubernetes.io/pod-uid"] = [bound["pod"]["uid"]]
        if "node" in bound:
            extra["authentication.kubernetes.io/node-name"] = [bound["node"]["name"]]
            extra["authentication.kubernetes.io/node-uid"] = [bound["node"]["uid"]]
        return {
            "authenticated": True,
            "user": {
                "username": claims["sub"],
                "uid": account["uid"],
                "groups": ["system:serviceaccounts", f"system:serviceaccounts:{namespace}", "system:authenticated"],
                "extra": extra,
            },
            "audiences": audiences,
        }

    # -- internals -----------------------------------------------------------------------

    def _put(self, kind: _Kind, obj: dict[str, Any], *, create: bool) -> dict[str, Any]:
        stored = copy.deepcopy(obj)
        meta = stored.setdefault("metadata", {})
        namespace = "" if kind in (_NAMESPACES, _NODES) else meta.setdefault("namespace", "default")
        key = (namespace, meta["name"])
        with self._cond:
            before = self._objects[kind.resource].get(key)
            if create and before is not None:
                raise ValueError(f"{kind.resource} {key} already exists")
            if not create and before is None:
                raise KeyError(f"{kind.resource} {key} does not exist")
            self._resource_version += 1
            meta["resourceVersion"] = str(self._resource_version)
            if before is not None:
                meta["uid"] = before["metadata"]["uid"]
                meta["creationTimestamp"] = before["metadata"]["creationTimestamp"]
            else:
                meta.setdefault("uid", str(uuid.uuid4()))
                meta.setdefault("creationTimestamp", _rfc3339(datetime.now(UTC)))
            stored["kind"] = kind.kind
            stored["apiVersion"] = kind.api_version
            self._objects[kind.resource][key] = stored
            if kind not in (_CLAIMS, _REPLICA_SETS, _JOBS):  # not watched
                self._history.append(_Change(self._resource_version, kind.resource, before, stored))
            self._cond.notify_all()
            return copy.deepcopy(stored)

    def _delete(self, kind: _Kind, key: tuple[str, str]) -> None:
        with self._cond:
            before = self._objects[kind.resource].pop(key)
            self._resource_version += 1
            gone = copy.deepcopy(before)
            gone["metadata"]["resourceVersion"] = str(self._resource_version)
            # The DELETED event carries the object's last state at the deletion's revision.
            self._history.append(_Change(self._resource_version, kind.resource, gone, None))
            self._cond.notify_all()

    def _list(self, kind: _Kind, *, namespace: str | None, selector: _Selector) -> dict[str, Any]:
        with self._cond:
            items = []
            for (ns, _), obj in sorted(self._objects[kind.resource].items()):
                if namespace is not None and ns != namespace:
                    continue
                if selector.matches(obj):
                    item = copy.deepcopy(obj)
                    # List items carry no kind / apiVersion; the list does.
                    item.pop("kind", None)
                    item.pop("apiVersion", None)
                    items.append(item)
            return {
                "kind": f"{kind.kind}List",
                "apiVersion": kind.api_version,
                "metadata": {"resourceVersion": str(self._resource_version)},
                "items": items,
            }

    def _get(self, kind: _Kind, key: tuple[str, str]) -> dict[str, Any]:
        with self._cond:
            obj = self._objects[kind.resource].get(key)
            if obj is None:
                raise _ApiError(
                    404,
                    "NotFound",
                    f'{kind.resource} "{key[1]}" not found',
                    {"name": key[1], "kind": kind.resource},
                )
            return copy.deepcopy(obj)

    def _evict(self, namespace: str, name: str, body: dict[str, Any]) -> dict[str, Any]:
        if body.get("kind") != "Eviction" or body.get("apiVersion") != "policy/v1":
            raise _ApiError(400, "BadRequest", "the body of a pods/eviction request must be a policy/v1 Eviction")
        if (body.get("metadata") or {}).get("name") != name:
            raise _ApiError(400, "BadRequest", "name in URL does not match name in Eviction object")
        pod = self._get(_PODS, (namespace, name))
        wanted_uid = ((body.get("deleteOptions") or {}).get("preconditions") or {}).get("uid")
        if wanted_uid is not None and wanted_uid != pod["metadata"]["uid"]:
            raise _ApiError(
                409,
                "Conflict",
                f"Precondition failed: UID in precondition: {wanted_uid}, UID in object meta: {pod['metadata']['uid']}",
            )
        if self.refuse_evictions:
            raise _ApiError(
                429,
                "TooManyRequests",
                "Cannot evict pod as it would violate the pod's disruption budget.",
                {"causes": [{"reason": "DisruptionBudget", "message": "The disruption budget needs 1 healthy pods"}]},
            )
        with self._cond:
            self.evictions.append(copy.deepcopy(body))
        # Eviction is a graceful delete: the pod stays, marked, until its containers stop.
        pod["metadata"]["deletionTimestamp"] = _rfc3339(datetime.now(UTC))
        pod["metadata"]["deletionGracePeriodSeconds"] = 30
        self._put(_PODS, pod, create=False)
        return _status_body(code=201, reason="", message="")

    def _patch_node(self, name: str, patch: Any, content_type: str) -> dict[str, Any]:
        """JSON merge patch and strategic merge patch (as a merge patch: enough for ``spec``
        fields); a JSON Patch list of ``add`` / ``replace`` / ``remove`` operations."""
        node = self._get(_NODES, ("", name))
        if isinstance(patch, dict) and "json-patch" not in content_type:
            _merge_patch(node, patch)
        elif isinstance(patch, list):
            for op in patch:
                *parents, leaf = [p for p in str(op.get("path", "")).split("/") if p]
                target = node
                for part in parents:
                    target = target.setdefault(part, {})
                if op.get("op") in ("add", "replace"):
                    target[leaf] = op.get("value")
                elif op.get("op") == "remove":
                    target.pop(leaf, None)
                else:
                    raise _ApiError(422, "Invalid", f"FakeKubernetes does not implement JSON Patch op {op.get('op')!r}")
        else:
            raise _ApiError(415, "UnsupportedMediaType", f"the body of a PATCH must match {content_type}")
        return self._put(_NODES, node, create=False)

    def _create_event(self, namespace: str, body: dict[str, Any], *, api_version: str) -> dict[str, Any]:
        if body.get("kind") != "Event" or body.get("apiVersion") != api_version:
            raise _ApiError(400, "BadRequest", f"the body must be an {api_version} Event")
        subject_field = "involvedObject" if api_version == "v1" else "regarding"
        if not isinstance(body.get(subject_field), dict):
            raise _ApiError(422, "Invalid", f"Event.{subject_field}: Required value")
        stored = copy.deepcopy(body)
        meta = stored.setdefault("metadata", {})
        if meta.get("namespace", namespace) != namespace:
            raise _ApiError(
                400, "BadRequest", "the namespace of the object does not match the namespace on the request"
            )
        meta["namespace"] = namespace
        if not meta.get("name"):
            if not meta.get("generateName"):
                raise _ApiError(422, "Invalid", "metadata.name: Required value: name or generateName is required")
            meta["name"] = meta["generateName"] + uuid.uuid4().hex[:5]
        with self._cond:
            self._resource_version += 1
            meta["resourceVersion"] = str(self._resource_version)
            meta["uid"] = str(uuid.uuid4())
            meta["creationTimestamp"] = _rfc3339(datetime.now(UTC))
            self.events.append(copy.deepcopy(stored))
        return stored

    def _watch(
        self,
        handler: BaseHTTPRequestHandler,
        kind: _Kind,
        *,
        namespace: str | None,
        selector: _Selector,
        query: dict[str, str],
    ) -> None:
        timeout_s = float(query.get("timeoutSeconds", "1800"))
        deadline = time.monotonic() + timeout_s
        bookmarks = query.get("allowWatchBookmarks") in ("true", "1")
        requested = query.get("resourceVersion", "")
        with self._cond:
            self._cond.wait_for(lambda: not self._watches_held or self._closing)
            generation = self._watch_generation
            initial: list[dict[str, Any]] = []
            expired = False
            if requested in ("", "0"):
                # "Any" version: synthetic ADDED events for the current state, then changes.
                since = self._resource_version
                for (ns, _), obj in sorted(self._objects[kind.resource].items()):
                    if (namespace is None or ns == namespace) and selector.matches(obj):
                        initial.append({"type": "ADDED", "object": copy.deepcopy(obj)})
            elif not requested.isdigit():
                raise _ApiError(400, "BadRequest", f'resourceVersion: Invalid value: "{requested}"')
            elif int(requested) < self._compacted_rv:
                expired = True
                since = self._resource_version
            else:
                since = int(requested)
            self._active_watches += 1
            self._cond.notify_all()
        try:
            handler.send_response(200)
            handler.send_header("Content-Type", "application/json")
            handler.send_header("Transfer-Encoding", "chunked")
            handler.end_headers()
            if expired:
                error = _status_body(
                    code=410, reason="Expired", message=f"too old resource version: {requested} ({since})"
                )
                _write_chunk(handler, {"type": "ERROR", "object": error})
            else:
                for event in initial:
                    _write_chunk(handler, event)
                self._stream_changes(
                    handler,
                    kind,
                    since=since,
                    generation=generation,
                    deadline=deadline,
                    namespace=namespace,
                    selector=selector,
                    bookmarks=bookmarks,
                )
            handler.wfile.write(b"0\r\n\r\n")  # the last chunk: the API server ended the watch
            handler.wfile.flush()
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client hung up (Watch.stop() or a reconnect): the stream just ends
        finally:
            handler.close_connection = True
            with self._cond:
                self._active_watches -= 1

    def _stream_changes(
        self,
        handler: BaseHTTPRequestHandler,
        kind: _Kind,
        *,
        since: int,
        generation: int,
        deadline: float,
        namespace: str | None,
        selector: _Selector,
        bookmarks: bool,
    ) -> None:
        while True:
            with self._cond:
                if self._closing or generation != self._watch_generation:
                    break  # cut off: nothing more reaches this client
                pending = [c for c in self._history if c.resource == kind.resource and c.resource_version > since]
                if not pending:
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        break
                    self._cond.wait(timeout=min(remaining, 0.5))
                    continue
            for change in pending:
                since = change.resource_version
                event = _watch_event(change, namespace=namespace, selector=selector)
                if event is not None:
                    _write_chunk(handler, event)
        with self._cond:
            timed_out = not self._closing and generation == self._watch_generation
            current = str(self._resource_version)
        if bookmarks and timed_out:
            # Sent before a watch times out, so the client resumes from here.
            bookmark = {"kind": kind.kind, "apiVersion": kind.api_version, "metadata": {"resourceVersion": current}}
            _write_chunk(handler, {"type": "BOOKMARK", "object": bookmark})


def _merge_patch(target: dict[str, Any], patch: dict[str, Any]) -> None:
    for key, value in patch.items():
        if value is None:
            target.pop(key, None)
        elif isinstance(value, dict) and isinstance(target.get(key), dict):
            _merge_patch(target[key], value)
        else:
            target[key] = copy.deepcopy(value)


def _watch_event(change: _Change, *, namespace: str | None, selector: _Selector) -> dict[str, Any] | None:
    """The event a watcher with this selector sees for one change (or None).

    As in the API server, an object that starts matching the selector arrives as ADDED and
    one that stops matching as DELETED.
    """

    def visible(obj: dict[str, Any] | None) -> bool:
        if obj is None:
            return False
        if namespace is not None and obj["metadata"].get("namespace") != namespace:
            return False
        return selector.matches(obj)

    was, now = visible(change.before), visible(change.after)
    if now and was:
        return {"type": "MODIFIED", "object": copy.deepcopy(change.after)}
    if now:
        return {"type": "ADDED", "object": copy.deepcopy(change.after)}
    if was and change.before is not None:
        last = copy.deepcopy(change.after if change.after is not None else change.before)
        return {"type": "DELETED", "object": last}
    return None


def _write_chunk(handler: BaseHTTPRequestHandler, event: dict[str, Any]) -> None:
    line = json.dumps(event, separators=(",", ":")).encode() + b"\n"
    handler.wfile.write(f"{len(line):x}\r\n".encode() + line + b"\r\n")
    handler.wfile.flush()


def _rfc3339(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


# --------------------------------------------------------------------------------------
# ServiceAccount tokens (FakeKubernetes.issue_service_account_token, TokenReview)
# --------------------------------------------------------------------------------------

_AUTHENTICATION_API = "authentication.k8s.io/v1"


def _b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _b64url_decode(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


@dataclass
class _ServiceAccountTokens:
    """The fake API server's token signer and its ServiceAccounts ((namespace, name) -> uid)."""

    key: bytes
    accounts: dict[tuple[str, str], str] = field(default_factory=dict)
    now: Callable[[], datetime] = field(default=lambda: datetime.now(UTC))

    def sign(self, claims: dict[str, Any]) -> str:
        header = _b64url(json.dumps({"alg": "HS256", "kid": "fake-kube-apiserver"}, separators=(",", ":")).encode())
        payload = _b64url(json.dumps(claims, separators=(",", ":")).encode())
        signature = hmac.new(self.key, f"{header}.{payload}".encode(), hashlib.sha256).digest()
        return f"{header}.{payload}.{_b64url(signature)}"

    def verify(self, token: str) -> dict[str, Any] | None:
        """The claims of a token this server signed; None for anything else."""
        parts = token.split(".")
        if len(parts) != 3:
            return None
        expected = hmac.new(self.key, f"{parts[0]}.{parts[1]}".encode(), hashlib.sha256).digest()
        try:
            if not hmac.compare_digest(expected, _b64url_decode(parts[2])):
                return None
            claims: dict[str, Any] = json.loads(_b64url_decode(parts[1]))
        except ValueError:  # bad base64 (binascii.Error) or JSON
            return None
        return claims


def _deleted_before(obj: dict[str, Any], moment: datetime) -> bool:
    stamp = obj["metadata"].get("deletionTimestamp")
    return stamp is not None and datetime.strptime(stamp, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC) < moment


def _handler_for(fake: FakeKubernetes) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive and chunked watch streams, as the API server

        def log_message(self, format: str, *args: Any) -> None:  # signature of BaseHTTPRequestHandler
            log.debug("fake kube-apiserver: " + format, *args)

        def do_GET(self) -> None:
            self._serve("GET")

        def do_POST(self) -> None:
            self._serve("POST")

        def do_PATCH(self) -> None:
            self._serve("PATCH")

        def do_PUT(self) -> None:
            self._serve("PUT")

        def _serve(self, method: str) -> None:
            parsed = urllib.parse.urlsplit(self.path)
            query = dict(urllib.parse.parse_qsl(parsed.query, keep_blank_values=True))
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length) if length else b""
            with fake._cond:
                fake.requests.append(KubeRequest(method=method, path=parsed.path, query=query))
            try:
                route, match = _route(parsed.path)
                body = json.loads(raw) if raw else {}
                status, payload = self._dispatch(method, route, match.groupdict(), query, body)
            except _ApiError as error:
                status = error.code
                payload = _status_body(
                    code=error.code, reason=error.reason, message=error.message, details=error.details
                )
            except json.JSONDecodeError as error:
                status = 400
                payload = _status_body(code=400, reason="BadRequest", message=f"invalid JSON body: {error}")
            if payload is None:  # a watch stream, already written
                return
            data = json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _dispatch(
            self, method: str, route: str, params: dict[str, str], query: dict[str, str], body: dict[str, Any]
        ) -> tuple[int, dict[str, Any] | None]:
            if route in {name for name, _ in _CERTIFICATE_ROUTES}:
                return fake._serve_certificate_objects(method, route, params, body, self.headers.get("Content-Type", ""))
            watching = query.get("watch") in ("true", "1")
            if method == "POST" and route == "tokenreviews":
                return 201, fake._review_token(body)
            if method == "GET" and route in _DRA_ROUTE_NAMES:
                return 200, _serve_dra(fake, route, params, query, urllib.parse.urlsplit(self.path).path)
            if method == "GET" and route in ("pods", "namespaced_pods", "namespaces"):
                kind = {"pods": _PODS, "namespaced_pods": _PODS, "namespaces": _NAMESPACES}[route]
                selector = _parse_field_selector(
                    query.get("fieldSelector"), supported=set(kind.fields), resource=", ".join(sorted(kind.fields))
                )
                if query.get("labelSelector"):
                    raise _ApiError(400, "BadRequest", "FakeKubernetes does not implement labelSelector")
                namespace = params.get("ns")
                if watching:
                    fake._watch(self, kind, namespace=namespace, selector=selector, query=query)
                    return 200, None
                return 200, fake._list(kind, namespace=namespace, selector=selector)
            if method == "GET" and route == "pod":
                return 200, fake._get(_PODS, (params["ns"], params["name"]))
            if method == "GET" and route == "namespace":
                return 200, fake._get(_NAMESPACES, ("", params["name"]))
            if method == "GET" and route == "node":
                return 200, fake._get(_NODES, ("", params["name"]))
            if method == "GET" and route in _OWNER_KINDS:
                kind = _OWNER_KINDS[route]
                if fake.forbid_owner_reads:
                    raise _ApiError(403, "Forbidden", f'{kind.resource} "{params["name"]}" is forbidden: '
                                    f'cannot get resource "{kind.resource}" in the namespace "{params["ns"]}"')
                return 200, fake._get(kind, (params["ns"], params["name"]))
            if method == "PATCH" and route == "node":
                return 200, fake._patch_node(params["name"], body, self.headers.get("Content-Type", ""))
            if method == "POST" and route == "eviction":
                return 201, fake._evict(params["ns"], params["name"], body)
            if method == "POST" and route == "core_events":
                return 201, fake._create_event(params["ns"], body, api_version="v1")
            if method == "POST" and route == "events_v1":
                return 201, fake._create_event(params["ns"], body, api_version="events.k8s.io/v1")
            raise _ApiError(405, "MethodNotAllowed", f"{method} is not supported on {route}")

    return Handler


def _route(path: str) -> tuple[str, re.Match[str]]:
    for name, pattern in _ROUTES:
        match = pattern.match(path)
        if match is not None:
            return name, match
    raise _ApiError(404, "NotFound", f"the server could not find the requested resource ({path})")
