"""Structured GPU requests: what a container asks for in MiB, SMs and MB/s (docs/requests.md).

A request comes from the first of these sources that a container has:

1. pod annotations ``vgpu-ledger.io/memory-mb``, ``…/sm-count``, ``…/bandwidth-mbps``
   (guarantees) and the ``…-limit`` variants;
2. the opaque parameters (driver ``vgpu-ledger.io``) of a DRA ResourceClaim
   (``resource.k8s.io/v1``) the container uses;
3. ``resources.limits["nvidia.com/gpu"]: N``, read as N whole GPUs;
4. the tenant's default request (from the policy API, supplied by the caller).

An invalid source does not fall through to the next one: the container gets its tenant
default, and the problem (pod and field named) is logged and recorded as a Kubernetes
Warning event on the pod, once per pod version.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import urllib3
from kubernetes.client.exceptions import ApiException

from agents.interfaces import Entitlement, GpuInfo, Workload
from agents.kube import ClaimConfig, ContainerInfo, KubernetesPods, PodInfo

__all__ = [
    "ANNOTATION_PREFIX",
    "CLAIM_API_VERSION",
    "CLAIM_DRIVER",
    "CLAIM_KIND",
    "INVALID_REQUEST_REASON",
    "GpuRequest",
    "GpuRequestResolver",
    "InvalidGpuRequest",
    "parse_annotations",
    "parse_claim_configs",
    "parse_gpu_limit",
]

log = logging.getLogger(__name__)

ANNOTATION_PREFIX = "vgpu-ledger.io/"
CLAIM_DRIVER = "vgpu-ledger.io"  # opaque config entries for this driver carry a request
CLAIM_API_VERSION = "vgpu-ledger.io/v1"
CLAIM_KIND = "GpuRequest"
INVALID_REQUEST_REASON = "InvalidGpuRequest"  # Event reason

# Whole numbers only, no sign, no unit suffix ("8Gi" is refused: the unit is in the name).
_DIGITS = re.compile(r"^[0-9]{1,10}$")


@dataclass(frozen=True, slots=True)
class GpuRequest:
    """A container's structured GPU request, per GPU it uses.

    Guarantees default to 0 (nothing promised); a limit of None means up to the card.
    ``whole_gpus`` > 0 is the ``nvidia.com/gpu: N`` form: N cards held whole, and the other
    fields are then unused. Memory in MiB, compute in SMs, bandwidth (host<->device) in MB/s.
    """

    memory_mb: int = 0
    sm_count: int = 0
    bandwidth_mbps: int = 0
    memory_limit_mb: int | None = None
    sm_limit: int | None = None
    bandwidth_limit_mbps: int | None = None
    whole_gpus: int = 0
    source: str = "tenant-default"  # "annotations", "resourceclaim/<name>", "nvidia.com/gpu", "tenant-default"

    def __post_init__(self) -> None:
        for name in ("memory_mb", "sm_count", "bandwidth_mbps", "whole_gpus"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        for guarantee, limit in _LIMIT_OF.items():
            value = getattr(self, limit)
            if value is not None and (value < 1 or value < getattr(self, guarantee)):
                raise ValueError(f"{limit} ({value}) must be >= 1 and >= {guarantee} ({getattr(self, guarantee)})")

    def entitlement(self, *, gpu: GpuInfo) -> Entitlement:
        """What this request promises on one GPU, capped at the card (the allocation loop's input)."""
        if self.whole_gpus > 0:
            return Entitlement(
                guarantee_mem_mb=float(gpu.memory_mb),
                limit_mem_mb=float(gpu.memory_mb),
                guarantee_sm=float(gpu.sm_count),
                limit_sm=float(gpu.sm_count),
            )
        return Entitlement(
            guarantee_mem_mb=float(min(self.memory_mb, gpu.memory_mb)),
            limit_mem_mb=None if self.memory_limit_mb is None else float(min(self.memory_limit_mb, gpu.memory_mb)),
            guarantee_sm=float(min(self.sm_count, gpu.sm_count)),
            limit_sm=None if self.sm_limit is None else float(min(self.sm_limit, gpu.sm_count)),
        )


_LIMIT_OF = {"memory_mb": "memory_limit_mb", "sm_count": "sm_limit", "bandwidth_mbps": "bandwidth_limit_mbps"}


@dataclass(frozen=True, slots=True)
class _Field:
    attr: str  # GpuRequest field
    annotation: str  # pod annotation key
    parameter: str  # key in the ResourceClaim's opaque parameters
    unit: str


_FIELDS = (
    _Field("memory_mb", "vgpu-ledger.io/memory-mb", "memoryMB", "MiB"),
    _Field("memory_limit_mb", "vgpu-ledger.io/memory-mb-limit", "memoryMBLimit", "MiB"),
    _Field("sm_count", "vgpu-ledger.io/sm-count", "smCount", "SMs"),
    _Field("sm_limit", "vgpu-ledger.io/sm-count-limit", "smCountLimit", "SMs"),
    _Field("bandwidth_mbps", "vgpu-ledger.io/bandwidth-mbps", "bandwidthMBps", "MB/s"),
    _Field("bandwidth_limit_mbps", "vgpu-ledger.io/bandwidth-mbps-limit", "bandwidthMBpsLimit", "MB/s"),
)
_BY_ATTR = {f.attr: f for f in _FIELDS}
_ANNOTATION_KEYS = frozenset(f.annotation for f in _FIELDS)


class InvalidGpuRequest(ValueError):
    """A request field that cannot be used; the message names the pod and the field."""

    def __init__(self, *, pod: str, field: str, value: object, problem: str) -> None:
        self.pod = pod  # "<namespace>/<name>"
        self.field = field  # annotation key, "resourceclaim/<name> parameters.<key>", or the limit path
        self.value = value
        self.problem = problem
        super().__init__(f"pod {pod}: {field}={value!r}: {problem}")


def _build(values: dict[str, int], *, source: str, pod: str, field_name: Callable[[_Field], str]) -> GpuRequest:
    """A request from validated single values; limits below their guarantee are refused here."""
    for guarantee, limit in _LIMIT_OF.items():
        if limit not in values:
            continue
        spec = _BY_ATTR[limit]
        if values[limit] < 1:
            raise InvalidGpuRequest(
                pod=pod, field=field_name(spec), value=values[limit], problem=f"a limit must be at least 1 {spec.unit}"
            )
        if values[limit] < values.get(guarantee, 0):
            raise InvalidGpuRequest(
                pod=pod,
                field=field_name(spec),
                value=values[limit],
                problem=f"the limit is below the guarantee {field_name(_BY_ATTR[guarantee])}={values[guarantee]}",
            )
    return GpuRequest(
        memory_mb=values.get("memory_mb", 0),
        sm_count=values.get("sm_count", 0),
        bandwidth_mbps=values.get("bandwidth_mbps", 0),
        memory_limit_mb=values.get("memory_limit_mb"),
        sm_limit=values.get("sm_limit"),
        bandwidth_limit_mbps=values.get("bandwidth_limit_mbps"),
        source=source,
    )


def parse_annotations(annotations: Mapping[str, str], *, pod: str) -> GpuRequest | None:
    """The request in a pod's ``vgpu-ledger.io/*`` annotations; None when it has none of them."""
    values: dict[str, int] = {}
    for spec in _FIELDS:
        raw = annotations.get(spec.annotation)
        if raw is None:
            continue
        if not _DIGITS.match(raw):
            raise InvalidGpuRequest(
                pod=pod, field=spec.annotation, value=raw, problem=f'must be a whole number of {spec.unit}, e.g. "8192"'
            )
        values[spec.attr] = int(raw)
    if not values:
        return None
    return _build(values, source="annotations", pod=pod, field_name=lambda f: f.annotation)


def parse_claim_configs(configs: Sequence[ClaimConfig], *, pod: str, claim: str) -> GpuRequest | None:
    """The request in a ResourceClaim's opaque configs for driver ``vgpu-ledger.io``; None without one.

    Configs apply in API order, a later one overriding an earlier one field by field (an
    allocation lists the DeviceClass's configs before the claim's, so the claim wins).
    """
    values: dict[str, int] = {}
    found = False
    for config in configs:
        if config.driver != CLAIM_DRIVER:
            continue
        found = True
        values.update(_parse_parameters(config.parameters, pod=pod, claim=claim))
    if not found:
        return None
    return _build(
        values, source=f"resourceclaim/{claim}", pod=pod, field_name=lambda f: _claim_field(claim, f.parameter)
    )


def _claim_field(claim: str, key: str) -> str:
    return f"resourceclaim/{claim} parameters.{key}"


def _parse_parameters(parameters: Mapping[str, Any], *, pod: str, claim: str) -> dict[str, int]:
    expected = {"apiVersion": CLAIM_API_VERSION, "kind": CLAIM_KIND}
    by_parameter = {f.parameter: f for f in _FIELDS}
    values: dict[str, int] = {}
    for key, value in parameters.items():
        if key in expected:
            if value != expected[key]:
                raise InvalidGpuRequest(
                    pod=pod, field=_claim_field(claim, key), value=value, problem=f"must be {expected[key]!r}"
                )
            continue
        spec = by_parameter.get(key)
        if spec is None:
            known = ", ".join(sorted([*expected, *by_parameter]))
            raise InvalidGpuRequest(
                pod=pod, field=_claim_field(claim, key), value=value, problem=f"unknown parameter (known: {known})"
            )
        # JSON booleans are ints to Python; floats are refused even when whole (8192.0).
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise InvalidGpuRequest(
                pod=pod,
                field=_claim_field(claim, key),
                value=value,
                problem=f"must be a non-negative whole number of {spec.unit}",
            )
        values[spec.attr] = value
    return values


def parse_gpu_limit(value: str, *, pod: str, container: str) -> GpuRequest | None:
    """``nvidia.com/gpu: N`` as N whole GPUs; None for ``0``. Extended resources are whole numbers."""
    field = f"containers[{container}].resources.limits[nvidia.com/gpu]"
    if not _DIGITS.match(value):
        raise InvalidGpuRequest(pod=pod, field=field, value=value, problem="must be a whole number of GPUs")
    count = int(value)
    if count == 0:
        return None
    return GpuRequest(whole_gpus=count, source="nvidia.com/gpu")


class _ClaimUnreadable(Exception):
    """A ResourceClaim named by the pod could not be read (missing, or the API failed)."""


@dataclass(frozen=True, slots=True)
class _Resolved:
    request: GpuRequest | None  # None: the tenant default applies
    retry_at: float | None  # monotonic seconds; None: valid for this pod version


class GpuRequestResolver:
    """A container's ``GpuRequest`` from its pod (cached per pod version), with the fallbacks above.

    ``tenant_default`` gives a tenant's default request (the policy API's); it is asked on
    every fallback, so policy changes apply at once. A claim that cannot be read (API
    error, or missing) gives the tenant default and is retried after ``claim_retry_s``.
    """

    _PRUNE_AT = 512  # cached entries before dropping those of pods gone from the node

    def __init__(
        self,
        *,
        pods: KubernetesPods,
        tenant_default: Callable[[str], GpuRequest],
        claim_retry_s: float = 30.0,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self._pods = pods
        self._tenant_default = tenant_default
        self._claim_retry_s = claim_retry_s
        self._monotonic = monotonic
        self._lock = threading.Lock()
        self._cache: dict[tuple[object, ...], _Resolved] = {}

    def resolve(self, *, workload: Workload) -> GpuRequest:
        """The request of an attributed workload; the tenant default for one in no known pod."""
        pod = self._pods.lookup_pod(workload.pod_uid)
        if pod is None:
            return self._tenant_default(workload.tenant)
        return self.resolve_pod(pod=pod, container=workload.container, tenant=workload.tenant)

    def resolve_pod(self, *, pod: PodInfo, container: str, tenant: str) -> GpuRequest:
        info = pod.container(container)
        key = _cache_key(pod, container, info)
        with self._lock:
            cached = self._cache.get(key)
        if cached is None or (cached.retry_at is not None and self._monotonic() >= cached.retry_at):
            cached = self._resolve_uncached(pod, info)
            with self._lock:
                self._cache[key] = cached
                if len(self._cache) > self._PRUNE_AT:
                    self._prune()
        return cached.request if cached.request is not None else self._tenant_default(tenant)

    def _resolve_uncached(self, pod: PodInfo, info: ContainerInfo | None) -> _Resolved:
        try:
            return _Resolved(request=self._from_sources(pod, info), retry_at=None)
        except InvalidGpuRequest as error:
            message = f"invalid GPU request: {error}; using the tenant default request"
            log.warning("%s", message)
            self._pods.emit_event(
                namespace=pod.namespace, pod=pod.name, pod_uid=pod.uid, reason=INVALID_REQUEST_REASON, message=message
            )
            return _Resolved(request=None, retry_at=None)
        except _ClaimUnreadable as error:
            log.warning("pod %s: %s; using the tenant default request for now", pod.key, error)
            return _Resolved(request=None, retry_at=self._monotonic() + self._claim_retry_s)

    def _from_sources(self, pod: PodInfo, info: ContainerInfo | None) -> GpuRequest | None:
        from_annotations = parse_annotations(pod.annotations, pod=pod.key)
        if from_annotations is not None:
            return from_annotations
        if info is None:
            return None
        for claim_name in info.claims:
            try:
                claim = self._pods.get_resource_claim(namespace=pod.namespace, name=claim_name)
            except (ApiException, urllib3.exceptions.HTTPError) as error:
                raise _ClaimUnreadable(f"resourceclaim {claim_name} could not be read ({error})") from error
            if claim is None:
                raise _ClaimUnreadable(f"resourceclaim {claim_name} does not exist")
            from_claim = parse_claim_configs(claim.configs, pod=pod.key, claim=claim_name)
            if from_claim is not None:
                return from_claim
        if info.gpu_limit is not None:
            return parse_gpu_limit(info.gpu_limit, pod=pod.key, container=info.name)
        return None

    def _prune(self) -> None:
        for key in [k for k in self._cache if self._pods.lookup_pod(str(k[0])) is None]:
            del self._cache[key]


def _cache_key(pod: PodInfo, container: str, info: ContainerInfo | None) -> tuple[object, ...]:
    """What a container's request depends on: a new key (so a new parse, and event) when it changes."""
    annotations = tuple(sorted((k, v) for k, v in pod.annotations.items() if k in _ANNOTATION_KEYS))
    claims = info.claims if info is not None else ()
    gpu_limit = info.gpu_limit if info is not None else None
    return (pod.uid, container, annotations, claims, gpu_limit)
