"""Structured GPU requests: what a container asks for in MiB, SMs and MB/s (docs/requests.md).

A request comes from the first of these sources that a container has:

1. pod annotations ``vgpu-ledger.io/memory-mb``, ``…/sm-count``, ``…/bandwidth-mbps``
   (guarantees) and the ``…-limit`` variants;
2. a DRA ResourceClaim the container uses (any ``resource.k8s.io`` version served): the
   opaque parameters for driver ``vgpu-ledger.io``, else NVIDIA's ``GpuConfig`` sharing
   settings (driver ``gpu.nvidia.com``), with what the scheduler consumed of a shared
   device (``consumedCapacity``) as the guarantee;
3. HAMi's ``nvidia.com/gpumem`` / ``gpumem-percentage`` / ``gpucores`` limits, per vGPU;
4. ``resources.limits["nvidia.com/gpu"]: N``, read as N whole GPUs;
5. the tenant's default request (from the policy API, supplied by the caller).

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
from dataclasses import dataclass, replace
from decimal import ROUND_CEILING, Decimal
from typing import Any

import urllib3
from kubernetes.client.exceptions import ApiException
from kubernetes.utils import parse_quantity

from agents.interfaces import Entitlement, GpuInfo, Workload
from agents.kube import (
    AllocatedDevice,
    ClaimApiUnavailable,
    ClaimConfig,
    ContainerInfo,
    KubernetesPods,
    PodInfo,
    ResourceClaimInfo,
)

__all__ = [
    "ANNOTATION_PREFIX",
    "CLAIM_API_VERSION",
    "CLAIM_DRIVER",
    "CLAIM_KIND",
    "HAMI_SOURCE",
    "INVALID_REQUEST_REASON",
    "NVIDIA_DRIVER",
    "GpuRequest",
    "GpuRequestResolver",
    "InvalidGpuRequest",
    "parse_annotations",
    "parse_claim",
    "parse_claim_configs",
    "parse_gpu_limit",
    "parse_hami_limits",
    "parse_nvidia_sharing",
]

log = logging.getLogger(__name__)

ANNOTATION_PREFIX = "vgpu-ledger.io/"
CLAIM_DRIVER = "vgpu-ledger.io"  # opaque config entries for this driver carry a request
CLAIM_API_VERSION = "vgpu-ledger.io/v1"
CLAIM_KIND = "GpuRequest"
INVALID_REQUEST_REASON = "InvalidGpuRequest"  # Event reason
NVIDIA_DRIVER = "gpu.nvidia.com"  # NVIDIA's DRA driver; its opaque configs may set MPS / time-slicing
NVIDIA_CONFIG_API_VERSION = "resource.nvidia.com/v1beta1"
NVIDIA_SHARING_KINDS = ("GpuConfig", "MigDeviceConfig")  # the config kinds that carry ``sharing``
HAMI_SOURCE = "hami"
_MIB = 1024 * 1024

# Whole numbers only, no sign, no unit suffix ("8Gi" is refused: the unit is in the name).
_DIGITS = re.compile(r"^[0-9]{1,10}$")


@dataclass(frozen=True, slots=True)
class GpuRequest:
    """A container's structured GPU request, per GPU it uses.

    Guarantees default to 0 (nothing promised); a limit of None means up to the card.
    ``whole_gpus`` > 0 is the ``nvidia.com/gpu: N`` form: N cards held whole, and the other
    fields are then unused. Memory in MiB, compute in SMs, bandwidth (host<->device) in MB/s.
    The ``*_percent`` fields are shares of whichever card the container runs on (HAMi's
    ``gpucores``, MPS's active thread percentage), resolved per card by ``entitlement``; a
    field is given either in units or in percent, not both. ``memory_limit_mb_by_gpu``
    overrides the memory limit on the cards it names by UUID (MPS per-device limits).
    """

    memory_mb: int = 0
    sm_count: int = 0
    bandwidth_mbps: int = 0
    memory_limit_mb: int | None = None
    sm_limit: int | None = None
    bandwidth_limit_mbps: int | None = None
    whole_gpus: int = 0
    memory_percent: int | None = None  # guarantee, % of the card's memory
    memory_limit_percent: int | None = None
    sm_percent: int | None = None  # guarantee, % of the card's SMs
    sm_limit_percent: int | None = None
    memory_limit_mb_by_gpu: tuple[tuple[str, int], ...] = ()  # (GPU UUID, MiB)
    # "annotations", "resourceclaim/<name>", "resourceclaim/<name>/gpu.nvidia.com", "hami",
    # "nvidia.com/gpu", "tenant-default"
    source: str = "tenant-default"

    def __post_init__(self) -> None:
        for name in ("memory_mb", "sm_count", "bandwidth_mbps", "whole_gpus"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        for guarantee, limit in _LIMIT_OF.items():
            value = getattr(self, limit)
            if value is not None and (value < 1 or value < getattr(self, guarantee)):
                raise ValueError(f"{limit} ({value}) must be >= 1 and >= {guarantee} ({getattr(self, guarantee)})")
        self._check_percentages()
        for gpu, mib in self.memory_limit_mb_by_gpu:
            if mib < 1 or mib < self.memory_mb:
                raise ValueError(f"memory limit on {gpu} ({mib} MiB) must be >= 1 and >= memory_mb ({self.memory_mb})")

    def _check_percentages(self) -> None:
        pairs = (
            ("memory_mb", "memory_percent", "memory_limit_mb", "memory_limit_percent"),
            ("sm_count", "sm_percent", "sm_limit", "sm_limit_percent"),
        )
        for units, percent, limit_units, limit_percent in pairs:
            guarantee, limit = getattr(self, percent), getattr(self, limit_percent)
            if guarantee is not None and not 0 <= guarantee <= 100:
                raise ValueError(f"{percent} must be 0-100, got {guarantee}")
            if limit is not None and not 1 <= limit <= 100:
                raise ValueError(f"{limit_percent} must be 1-100, got {limit}")
            if guarantee is not None and getattr(self, units) > 0:
                raise ValueError(f"{units} and {percent} are the same guarantee: give one")
            if limit is not None and getattr(self, limit_units) is not None:
                raise ValueError(f"{limit_units} and {limit_percent} are the same limit: give one")
            if guarantee is not None and limit is not None and limit < guarantee:
                raise ValueError(f"{limit_percent} ({limit}) must be >= {percent} ({guarantee})")

    def entitlement(self, *, gpu: GpuInfo) -> Entitlement:
        """What this request promises on one GPU, capped at the card (the allocation loop's input)."""
        if self.whole_gpus > 0:
            return Entitlement(
                guarantee_mem_mb=float(gpu.memory_mb),
                limit_mem_mb=float(gpu.memory_mb),
                guarantee_sm=float(gpu.sm_count),
                limit_sm=float(gpu.sm_count),
            )
        memory_limit_mb = dict(self.memory_limit_mb_by_gpu).get(gpu.uuid, self.memory_limit_mb)
        guarantee_mem = _on_card(self.memory_mb, self.memory_percent, gpu.memory_mb)
        guarantee_sm = _on_card(self.sm_count, self.sm_percent, gpu.sm_count)
        return Entitlement(
            guarantee_mem_mb=guarantee_mem,
            limit_mem_mb=_limit_on_card(memory_limit_mb, self.memory_limit_percent, gpu.memory_mb, guarantee_mem),
            guarantee_sm=guarantee_sm,
            limit_sm=_limit_on_card(self.sm_limit, self.sm_limit_percent, gpu.sm_count, guarantee_sm),
        )


def _on_card(units: int, percent: int | None, card: int) -> float:
    """A guarantee on one card: its units, or its percentage of the card, at most the card."""
    return float(min(units, card)) if percent is None else card * percent / 100


def _limit_on_card(units: int | None, percent: int | None, card: int, guarantee: float) -> float | None:
    """A limit on one card, never below the guarantee (a consumed-capacity guarantee can exceed a
    percentage limit only once the card is known); None means up to the card."""
    if units is None and percent is None:
        return None
    limit = float(min(units, card)) if units is not None else card * (percent or 0) / 100
    return max(limit, guarantee)


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


# -- DRA claims: NVIDIA's sharing settings and consumed capacity --------------------------


def parse_claim(claim: ResourceClaimInfo, *, pod: str) -> GpuRequest | None:
    """A ResourceClaim's request; None when the claim says nothing about a share.

    Our own parameters (driver ``vgpu-ledger.io``) are the request when present, else NVIDIA's
    ``GpuConfig`` sharing settings. What the scheduler consumed of a shared device
    (``consumedCapacity``) then replaces the guarantee: it is what was actually set aside.
    """
    request = parse_claim_configs(claim.configs, pod=pod, claim=claim.name)
    if request is None:
        request = parse_nvidia_sharing(claim, pod=pod)
    return _with_consumed_capacity(request, claim, pod=pod)


def parse_nvidia_sharing(claim: ResourceClaimInfo, *, pod: str) -> GpuRequest | None:
    """The MPS or time-slicing settings NVIDIA's DRA driver applies to the claim's GPUs; None without."""
    selected = _nvidia_sharing_config(claim, pod=pod)
    if selected is None:
        return None
    config, devices = selected
    return _parse_gpu_config(config.parameters, devices=devices, pod=pod, claim=claim.name)


def _nvidia_field(claim: str, path: str) -> str:
    return f"resourceclaim/{claim} {NVIDIA_DRIVER} parameters.{path}"


def _applies_to(config: ClaimConfig, request: str) -> bool:
    """As the API defines ``config[].requests``: empty means every request, and a main request
    name covers its subrequests (results name them ``<request>/<subrequest>``)."""
    return not config.requests or request in config.requests or request.split("/", 1)[0] in config.requests


def _nvidia_sharing_config(
    claim: ResourceClaimInfo, *, pod: str
) -> tuple[ClaimConfig, tuple[AllocatedDevice, ...]] | None:
    """The sharing config that applies to the claim's NVIDIA devices, and those devices.

    As the driver chooses: per allocated device, the last config that names its request (or
    names none), the class's configs before the claim's. An unallocated claim has only its
    spec, where the last one is taken.
    """
    order = {"FromClass": 0}  # FromClaim and Spec sort after the class's configs, keeping API order
    candidates = sorted(
        (c for c in claim.configs if c.driver == NVIDIA_DRIVER and c.parameters.get("kind") in NVIDIA_SHARING_KINDS),
        key=lambda c: order.get(c.source, 1),
    )
    if not candidates:
        return None
    if not claim.allocated:
        return candidates[-1], ()
    picks: dict[int | None, list[AllocatedDevice]] = {}
    for device in claim.devices:
        if device.driver != NVIDIA_DRIVER:
            continue
        pick = next((i for i in reversed(range(len(candidates))) if _applies_to(candidates[i], device.request)), None)
        picks.setdefault(pick, []).append(device)
    settings = [None if i is None else candidates[i].parameters for i in picks]
    if any(other != settings[0] for other in settings[1:]):  # the same settings twice are one
        requests = sorted({d.request for devices in picks.values() for d in devices})
        raise InvalidGpuRequest(
            pod=pod,
            field=f"resourceclaim/{claim.name} {NVIDIA_DRIVER} config",
            value=requests,
            problem="the claim's GPUs have different sharing settings; the agent reads one request per container "
            "(use one claim per setting)",
        )
    if not picks:
        return None  # no device of NVIDIA's driver was allocated: its configs apply to nothing
    pick = next(iter(picks))
    devices = tuple(d for group in picks.values() for d in group)
    return None if pick is None else (candidates[pick], devices)


def _only_keys(mapping: Mapping[str, Any], allowed: Sequence[str], *, pod: str, field: Callable[[str], str]) -> None:
    """Unknown keys are refused, as the driver's strict decoder refuses them."""
    for key, value in mapping.items():
        if key not in allowed:
            raise InvalidGpuRequest(
                pod=pod, field=field(key), value=value, problem=f"unknown field (known: {', '.join(allowed)})"
            )


def _object(value: Any, *, pod: str, field: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise InvalidGpuRequest(pod=pod, field=field, value=value, problem="must be an object")
    return value


def _parse_gpu_config(
    parameters: Mapping[str, Any], *, devices: Sequence[AllocatedDevice], pod: str, claim: str
) -> GpuRequest | None:
    """``GpuConfig`` / ``MigDeviceConfig`` (``resource.nvidia.com/v1beta1``) as a request."""

    def field(path: str) -> str:
        return _nvidia_field(claim, path)

    _only_keys(parameters, ("apiVersion", "kind", "sharing"), pod=pod, field=field)
    if parameters.get("apiVersion") != NVIDIA_CONFIG_API_VERSION:
        raise InvalidGpuRequest(
            pod=pod,
            field=field("apiVersion"),
            value=parameters.get("apiVersion"),
            problem=f"must be {NVIDIA_CONFIG_API_VERSION!r}",
        )
    if parameters.get("sharing") is None:
        return None  # the driver's default (an exclusive GPU unless it is set to time-slice)
    sharing = _object(parameters["sharing"], pod=pod, field=field("sharing"))
    _only_keys(sharing, ("strategy", "timeSlicingConfig", "mpsConfig"), pod=pod, field=lambda k: field(f"sharing.{k}"))
    source = f"resourceclaim/{claim}/{NVIDIA_DRIVER}"
    strategy = sharing.get("strategy")
    if strategy == "TimeSlicing":
        if sharing.get("mpsConfig") is not None:
            raise InvalidGpuRequest(
                pod=pod, field=field("sharing.mpsConfig"), value=sharing["mpsConfig"], problem="not with TimeSlicing"
            )
        # Time-slicing partitions nothing: every process may use all of the card's memory and
        # SMs in its turn, so nothing is promised and nothing capped below the card.
        return GpuRequest(source=source)
    if strategy != "MPS":
        raise InvalidGpuRequest(
            pod=pod, field=field("sharing.strategy"), value=strategy, problem="must be 'TimeSlicing' or 'MPS'"
        )
    if sharing.get("timeSlicingConfig") is not None:
        raise InvalidGpuRequest(
            pod=pod,
            field=field("sharing.timeSlicingConfig"),
            value=sharing["timeSlicingConfig"],
            problem="not with MPS",
        )
    # An absent mpsConfig is the driver's defaults: nothing capped. An empty list is no object.
    raw_mps = sharing.get("mpsConfig")
    mps = {} if raw_mps is None else _object(raw_mps, pod=pod, field=field("sharing.mpsConfig"))
    return _parse_mps_config(
        mps, devices=devices, pod=pod, field=lambda k: field(f"sharing.mpsConfig.{k}"), source=source
    )


def _parse_mps_config(
    mps: Mapping[str, Any],
    *,
    devices: Sequence[AllocatedDevice],
    pod: str,
    field: Callable[[str], str],
    source: str,
) -> GpuRequest:
    """MPS caps each client: SMs at the active thread percentage, memory at the pinned limit.

    Both are limits (MPS reserves nothing), so the request's guarantees stay 0.
    """
    known = ("defaultActiveThreadPercentage", "defaultPinnedDeviceMemoryLimit", "defaultPerDevicePinnedMemoryLimit")
    _only_keys(mps, known, pod=pod, field=field)
    percent = mps.get("defaultActiveThreadPercentage")
    if percent is not None and (isinstance(percent, bool) or not isinstance(percent, int) or not 1 <= percent <= 100):
        raise InvalidGpuRequest(
            pod=pod, field=field(known[0]), value=percent, problem="must be a whole percentage of the SMs, 1-100"
        )
    limit_mb = None
    if mps.get(known[1]) is not None:
        limit_mb = _limit_mib(mps[known[1]], pod=pod, field=field(known[1]))
    by_gpu: dict[str, int] = {}
    raw_per_device = mps.get(known[2])
    per_device = {} if raw_per_device is None else _object(raw_per_device, pod=pod, field=field(known[2]))
    for key, quantity in per_device.items():
        mib = _limit_mib(quantity, pod=pod, field=field(f"{known[2]}.{key}"))
        if not key.isdigit():
            by_gpu[key] = mib  # a GPU (or MIG device) UUID, as NVML names the card
            continue
        # An index counts the devices this config applies to. Which card that is needs the
        # node's ResourceSlice; with a single device it can only be that one.
        if len(devices) == 1 and int(key) == 0:
            limit_mb = mib
            continue
        problem = (
            f"the configuration applies to {len(devices)} allocated device(s), so there is no device {key}"
            if int(key) >= len(devices)
            else "the agent cannot tell which card a device index names when there are several; "
            "name the GPU by its UUID"
        )
        raise InvalidGpuRequest(pod=pod, field=field(f"{known[2]}.{key}"), value=quantity, problem=problem)
    return GpuRequest(
        memory_limit_mb=limit_mb,
        sm_limit_percent=percent,
        memory_limit_mb_by_gpu=tuple(sorted(by_gpu.items())),
        source=source,
    )


def _quantity_bytes(value: Any, *, pod: str, field: str) -> Decimal:
    """A Kubernetes quantity (``"10Gi"``, ``"512M"``, or a JSON integer of bytes)."""
    if isinstance(value, bool) or not isinstance(value, str | int):
        raise InvalidGpuRequest(pod=pod, field=field, value=value, problem='must be a Kubernetes quantity, e.g. "10Gi"')
    try:
        return Decimal(parse_quantity(value))
    except ValueError as error:
        raise InvalidGpuRequest(
            pod=pod, field=field, value=value, problem='must be a Kubernetes quantity, e.g. "10Gi"'
        ) from error


def _limit_mib(value: Any, *, pod: str, field: str) -> int:
    """A memory limit quantity in whole MiB, rounded down as the driver passes it to MPS."""
    mib = int(_quantity_bytes(value, pod=pod, field=field).to_integral_value(ROUND_CEILING)) // _MIB
    if mib < 1:
        raise InvalidGpuRequest(pod=pod, field=field, value=value, problem="a memory limit must be at least 1Mi")
    return mib


def _with_consumed_capacity(request: GpuRequest | None, claim: ResourceClaimInfo, *, pod: str) -> GpuRequest | None:
    """The request with what the scheduler consumed of shared devices as its guarantee.

    ``memory`` (bytes, rounded down to MiB) and ``multiprocessors`` (SMs) are read; other
    capacities are no share this agent meters. Over several devices the smallest amount is
    the guarantee (it holds on each card). A limit below it is raised to it.
    """
    memory: list[int] = []
    sms: list[int] = []
    for index, device in enumerate(claim.devices):
        for name, raw in device.consumed_capacity.items():
            capacity = name.removeprefix(f"{device.driver}/")
            field = f"resourceclaim/{claim.name} status.allocation.devices.results[{index}].consumedCapacity.{name}"
            if capacity == "memory":
                memory.append(int(_quantity_bytes(raw, pod=pod, field=field)) // _MIB)
            elif capacity == "multiprocessors":
                sms.append(int(_quantity_bytes(raw, pod=pod, field=field)))
    if not memory and not sms:
        return request
    base = request if request is not None else GpuRequest(source=f"resourceclaim/{claim.name}")
    memory_mb = min(memory) if memory else base.memory_mb
    sm_count = min(sms) if sms else base.sm_count
    return replace(
        base,
        memory_mb=memory_mb,
        memory_percent=None if memory else base.memory_percent,
        memory_limit_mb=None if base.memory_limit_mb is None else max(base.memory_limit_mb, memory_mb),
        memory_limit_mb_by_gpu=tuple((gpu, max(mib, memory_mb)) for gpu, mib in base.memory_limit_mb_by_gpu),
        sm_count=sm_count,
        sm_percent=None if sms else base.sm_percent,
        sm_limit=None if base.sm_limit is None else max(base.sm_limit, sm_count),
    )


# -- HAMi -------------------------------------------------------------------------------------


def parse_hami_limits(
    limits: Sequence[tuple[str, str]], *, gpu_limit: str | None, pod: str, container: str
) -> GpuRequest | None:
    """HAMi's per-vGPU share (``nvidia.com/gpumem`` MiB or ``gpumem-percentage``, ``gpucores`` %).

    HAMi's scheduler sets the share aside on each of the ``nvidia.com/gpu`` cards and its
    in-container library caps use at it, so each is both guarantee and limit. Without a
    memory share HAMi gives the vGPU all of the card's memory; ``gpucores`` 0 or absent
    reserves no SMs and caps none. None when the container has none of the three.
    """
    if not limits:
        return None
    given = dict(limits)

    def field(name: str) -> str:
        return f"containers[{container}].resources.limits[{name}]"

    first = next(iter(given))
    if gpu_limit is None or not _DIGITS.match(gpu_limit) or int(gpu_limit) < 1:
        raise InvalidGpuRequest(
            pod=pod,
            field=field(first),
            value=given[first],
            problem=f"HAMi shares are per vGPU and need nvidia.com/gpu >= 1 (the number of vGPUs), got {gpu_limit!r}",
        )
    if "nvidia.com/gpumem" in given and "nvidia.com/gpumem-percentage" in given:
        raise InvalidGpuRequest(
            pod=pod,
            field=field("nvidia.com/gpumem-percentage"),
            value=given["nvidia.com/gpumem-percentage"],
            problem="cannot be given with nvidia.com/gpumem (HAMi refuses the pair)",
        )
    values = {name: _hami_number(name, raw, pod=pod, field=field(name)) for name, raw in given.items()}
    memory_mb = values.get("nvidia.com/gpumem")
    # Without a memory share HAMi gives each vGPU the whole card's memory.
    memory_percent = None if memory_mb is not None else values.get("nvidia.com/gpumem-percentage", 100)
    cores = values.get("nvidia.com/gpucores", 0) or None
    return GpuRequest(
        memory_mb=memory_mb or 0,
        memory_limit_mb=memory_mb,
        memory_percent=memory_percent,
        memory_limit_percent=memory_percent,
        sm_percent=cores,
        sm_limit_percent=cores,
        source=HAMI_SOURCE,
    )


# name -> (smallest, largest or None, what it is)
_HAMI_RANGES = {
    "nvidia.com/gpumem": (1, None, "a whole number of MiB per vGPU, at least 1"),
    "nvidia.com/gpumem-percentage": (1, 100, "a whole percentage of each card's memory, 1-100"),
    "nvidia.com/gpucores": (0, 100, "a whole percentage of each card's SMs, 0-100"),
}


def _hami_number(name: str, raw: str, *, pod: str, field: str) -> int:
    """HAMi reads its resources as plain integers (a suffix such as ``Gi`` is not a unit to it)."""
    low, high, what = _HAMI_RANGES[name]
    if not _DIGITS.match(raw) or int(raw) < low or (high is not None and int(raw) > high):
        raise InvalidGpuRequest(pod=pod, field=field, value=raw, problem=f"must be {what}")
    return int(raw)


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
            except ClaimApiUnavailable as error:
                raise _ClaimUnreadable(f"resourceclaim {claim_name} could not be read: {error}") from error
            if claim is None:
                raise _ClaimUnreadable(f"resourceclaim {claim_name} does not exist")
            from_claim = parse_claim(claim, pod=pod.key)
            if from_claim is not None:
                return from_claim
        from_hami = parse_hami_limits(info.hami_limits, gpu_limit=info.gpu_limit, pod=pod.key, container=info.name)
        if from_hami is not None:
            return from_hami
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
    hami_limits = info.hami_limits if info is not None else ()
    return (pod.uid, container, annotations, claims, gpu_limit, hami_limits)
