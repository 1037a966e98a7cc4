"""The agent's view of Kubernetes: the pods on its node, their namespaces, and a few writes.

``KubernetesPods`` is the seam (a Protocol); ``KubeClientPods`` implements it over the
official ``kubernetes`` client. It lists the node's pods (``spec.nodeName=<node>``) and all
namespaces, then keeps both current with watches that resume from the last
``resourceVersion`` and relist when the API server answers 410 Gone. Lookups are served
from that cache (no API call on the attribution path); evictions go through the Eviction
API (``policy/v1``) and events are ``core/v1`` Events. ResourceClaims are read from the
``resource.k8s.io`` version the API server serves (v1 > v1beta2 > v1beta1, found by
discovery and found again when a read answers 404, as after an upgrade).
``agents.fakes.kube.FakeKubernetes`` is an API server the tests point the real client at.
"""

from __future__ import annotations

import json
import logging
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from enum import Enum
from typing import Any, Protocol

import urllib3
from kubernetes import client, config, watch
from kubernetes.client.exceptions import ApiException

from agents.clock import utc_now

__all__ = [
    "COMPONENT",
    "RESOURCE_API_VERSIONS",
    "AllocatedDevice",
    "ClaimApiUnavailable",
    "ClaimConfig",
    "ContainerInfo",
    "EvictionOutcome",
    "KubeClientPods",
    "KubernetesPods",
    "PodInfo",
    "ResourceClaimInfo",
    "container_id_from_status",
    "controller_of",
    "pod_info_from_model",
]

log = logging.getLogger(__name__)

COMPONENT = "vgpu-ledger-agent"  # Event source / reportingComponent
GPU_RESOURCE = "nvidia.com/gpu"
# HAMi's names for a share of each vGPU that nvidia.com/gpu counts (docs/requests.md).
HAMI_RESOURCES = ("nvidia.com/gpumem", "nvidia.com/gpumem-percentage", "nvidia.com/gpucores")
RESOURCE_GROUP = "resource.k8s.io"
RESOURCE_API_VERSIONS = ("v1", "v1beta2", "v1beta1")  # the DRA versions read, most preferred first

# containerStatuses[].containerID is "<runtime>://<id>"; cgroups name the bare id.
_RUNTIME_SCHEMES = ("containerd://", "cri-o://", "docker://")


@dataclass(frozen=True, slots=True)
class ContainerInfo:
    """One container of a pod, as far as GPU accounting needs it."""

    name: str
    container_id: str | None  # runtime id without the scheme; None until the container has started
    gpu_limit: str | None  # resources.limits["nvidia.com/gpu"] as written (a quantity), None when absent
    claims: tuple[str, ...] = ()  # names of the ResourceClaim objects (pod's namespace) the container uses
    hami_limits: tuple[tuple[str, str], ...] = ()  # (name, quantity as written) of HAMI_RESOURCES in limits


@dataclass(frozen=True, slots=True)
class PodInfo:
    """A pod on this node: identity, metadata and containers (immutable snapshot of one version)."""

    namespace: str
    name: str
    uid: str
    resource_version: str
    labels: Mapping[str, str] = field(default_factory=dict)
    annotations: Mapping[str, str] = field(default_factory=dict)
    containers: tuple[ContainerInfo, ...] = ()
    # The ownerReference marked controller: (kind, name), as written; None for a bare pod.
    controller: tuple[str, str] | None = None

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    def container(self, name: str) -> ContainerInfo | None:
        return next((c for c in self.containers if c.name == name), None)


@dataclass(frozen=True, slots=True)
class ClaimConfig:
    """One opaque device configuration of a ResourceClaim (the same shape in every version read)."""

    driver: str
    parameters: Mapping[str, Any]  # the JSON object as stored in the claim
    source: str  # "FromClass" | "FromClaim" (allocation) or "Spec" (unallocated claim's spec)
    requests: tuple[str, ...] = ()  # the device requests it applies to; () means all of them


@dataclass(frozen=True, slots=True)
class AllocatedDevice:
    """One ``status.allocation.devices.results[]`` entry: a device the scheduler gave the claim."""

    driver: str
    pool: str
    device: str
    request: str  # the claim's request name ("<request>/<subrequest>" for a firstAvailable choice)
    # Capacity name -> quantity the allocation consumed of a device shared between claims
    # (consumable capacity, Kubernetes 1.34+); empty for a device allocated whole.
    consumed_capacity: Mapping[str, str] = field(default_factory=dict)
    share_id: str | None = None  # tells apart the shares of one multi-allocatable device


@dataclass(frozen=True, slots=True)
class ResourceClaimInfo:
    """The parts of a ResourceClaim that carry a structured GPU request."""

    namespace: str
    name: str
    allocated: bool
    configs: tuple[ClaimConfig, ...]  # allocation configs when allocated, else the spec's, in API order
    devices: tuple[AllocatedDevice, ...] = ()  # the allocation's results, in API order
    api_version: str = f"{RESOURCE_GROUP}/v1"  # the version it was read in


class ClaimApiUnavailable(Exception):
    """The API server serves no ``resource.k8s.io`` version this agent reads (so no claim can be)."""


class EvictionOutcome(Enum):
    EVICTED = "evicted"  # the API server accepted the eviction (graceful deletion started)
    REFUSED = "refused"  # 429: a PodDisruptionBudget forbids it now; retry later
    GONE = "gone"  # 404 or UID precondition failed: the pod (that version of it) no longer exists


class KubernetesPods(Protocol):
    """The pods on this node and their namespaces, cached; plus evictions and events."""

    def lookup(self, container_id: str) -> tuple[PodInfo, ContainerInfo] | None: ...

    def lookup_pod(self, pod_uid: str) -> PodInfo | None: ...

    def namespace_labels(self, namespace: str) -> Mapping[str, str] | None: ...

    def get_resource_claim(self, *, namespace: str, name: str) -> ResourceClaimInfo | None: ...

    def evict(
        self, *, namespace: str, pod: str, reason: str, message: str, pod_uid: str | None = None
    ) -> EvictionOutcome: ...

    def emit_event(
        self, *, namespace: str, pod: str, pod_uid: str | None, reason: str, message: str, type: str = "Warning"
    ) -> None: ...


def container_id_from_status(raw: str | None) -> str | None:
    """``containerd://<id>`` (or ``cri-o://``, ``docker://``) -> ``<id>``; None for an empty id."""
    if not raw:
        return None
    for scheme in _RUNTIME_SCHEMES:
        if raw.startswith(scheme):
            return raw[len(scheme) :]
    return raw.split("://", 1)[-1]


def pod_info_from_model(pod: client.V1Pod) -> PodInfo:
    """The cached view of a ``V1Pod`` (regular, init and ephemeral containers)."""
    meta = pod.metadata
    if meta is None or meta.name is None or meta.namespace is None or meta.uid is None:
        raise ValueError("pod without metadata.name, namespace or uid")
    spec = pod.spec
    status = pod.status
    ids: dict[str, str | None] = {}
    claim_objects: dict[str, str] = {}  # pod-level claim name -> ResourceClaim object name
    if status is not None:
        for statuses in (
            status.container_statuses,
            status.init_container_statuses,
            status.ephemeral_container_statuses,
        ):
            for container_status in statuses or ():
                ids[container_status.name] = container_id_from_status(container_status.container_id)
        for claim_status in status.resource_claim_statuses or ():
            if claim_status.resource_claim_name:
                claim_objects[claim_status.name] = claim_status.resource_claim_name
    containers: list[ContainerInfo] = []
    if spec is not None:
        for pod_claim in spec.resource_claims or ():
            if pod_claim.resource_claim_name:
                claim_objects.setdefault(pod_claim.name, pod_claim.resource_claim_name)
        for spec_container in [*spec.containers, *(spec.init_containers or ())]:
            resources = spec_container.resources
            limits = (resources.limits if resources is not None else None) or {}
            claim_refs = (resources.claims if resources is not None else None) or []
            containers.append(
                ContainerInfo(
                    name=spec_container.name,
                    container_id=ids.get(spec_container.name),
                    gpu_limit=limits.get(GPU_RESOURCE),
                    claims=tuple(claim_objects[ref.name] for ref in claim_refs if ref.name in claim_objects),
                    hami_limits=tuple((name, limits[name]) for name in HAMI_RESOURCES if name in limits),
                )
            )
        containers.extend(ContainerInfo(name=ephemeral.name, container_id=ids.get(ephemeral.name), gpu_limit=None)
                          for ephemeral in spec.ephemeral_containers or ())
    return PodInfo(
        namespace=meta.namespace,
        name=meta.name,
        uid=meta.uid,
        resource_version=meta.resource_version or "",
        labels=dict(meta.labels or {}),
        annotations=dict(meta.annotations or {}),
        containers=tuple(containers),
        controller=controller_of(meta),
    )


def controller_of(meta: client.V1ObjectMeta | None) -> tuple[str, str] | None:
    """The (kind, name) of the ownerReference with ``controller: true`` (at most one has it)."""
    for ref in (meta.owner_references if meta is not None else None) or ():
        if ref.controller and ref.kind and ref.name:
            return (ref.kind, ref.name)
    return None


# The claim models of each version read; their status and config parts have the same fields.
_ClaimModel = client.ResourceV1ResourceClaim | client.V1beta2ResourceClaim | client.V1beta1ResourceClaim


def _claim_info_from_model(claim: _ClaimModel, *, namespace: str, name: str, version: str) -> ResourceClaimInfo:
    """The request-bearing parts of a claim read in ``version``.

    v1beta1 keeps ``deviceClassName`` / ``count`` on ``spec.devices.requests[]`` where v1beta2
    and v1 have them under ``exactly``; nothing read here lies there: configs
    (``opaque.driver`` / ``parameters`` / ``requests``) and allocation results are alike.
    """
    api_version = f"{RESOURCE_GROUP}/{version}"
    allocation = claim.status.allocation if claim.status is not None else None
    if allocation is not None:
        allocated = allocation.devices
        configs = tuple(
            ClaimConfig(
                driver=c.opaque.driver,
                parameters=dict(c.opaque.parameters),
                source=c.source,
                requests=tuple(c.requests or ()),
            )
            for c in ((allocated.config if allocated is not None else None) or ())
            if c.opaque is not None
        )
        devices = tuple(
            AllocatedDevice(
                driver=r.driver,
                pool=r.pool,
                device=r.device,
                request=r.request,
                consumed_capacity=dict(r.consumed_capacity or {}),
                share_id=r.share_id,
            )
            for r in ((allocated.results if allocated is not None else None) or ())
        )
        return ResourceClaimInfo(
            namespace=namespace, name=name, allocated=True, configs=configs, devices=devices, api_version=api_version
        )
    spec_devices = claim.spec.devices if claim.spec is not None else None
    configs = tuple(
        ClaimConfig(
            driver=c.opaque.driver,
            parameters=dict(c.opaque.parameters),
            source="Spec",
            requests=tuple(c.requests or ()),
        )
        for c in ((spec_devices.config if spec_devices is not None else None) or ())
        if c.opaque is not None
    )
    return ResourceClaimInfo(namespace=namespace, name=name, allocated=False, configs=configs, api_version=api_version)


class _ClaimReader:
    """Reads ResourceClaims in the best ``resource.k8s.io`` version the API server serves.

    Discovery (``GET /apis/resource.k8s.io``) runs on the first read and again when a read
    answers 404: the version may have stopped being served (an upgrade that turned a beta
    off), in which case the read is retried in the new one; a 404 in a version still served
    means the claim does not exist.
    """

    def __init__(self, api_client: client.ApiClient) -> None:
        self._group = client.ResourceApi(api_client)
        self._apis: dict[str, Callable[..., _ClaimModel]] = {
            "v1": client.ResourceV1Api(api_client).read_namespaced_resource_claim,
            "v1beta2": client.ResourceV1beta2Api(api_client).read_namespaced_resource_claim,
            "v1beta1": client.ResourceV1beta1Api(api_client).read_namespaced_resource_claim,
        }
        self._lock = threading.Lock()
        self._version: str | None = None

    def read(self, *, namespace: str, name: str) -> ResourceClaimInfo | None:
        version = self._current_version()
        try:
            return self._read_in(version, namespace=namespace, name=name)
        except ApiException as error:
            if error.status != 404:
                raise
        rediscovered = self._discover()
        if rediscovered == version:
            return None
        log.info("resource.k8s.io is now read in %s (was %s)", rediscovered, version)
        try:
            return self._read_in(rediscovered, namespace=namespace, name=name)
        except ApiException as error:
            if error.status == 404:
                return None
            raise

    def _read_in(self, version: str, *, namespace: str, name: str) -> ResourceClaimInfo:
        claim = self._apis[version](name=name, namespace=namespace)
        return _claim_info_from_model(claim, namespace=namespace, name=name, version=version)

    def _current_version(self) -> str:
        with self._lock:
            version = self._version
        return version if version is not None else self._discover()

    def _discover(self) -> str:
        """The most preferred version served; ``ClaimApiUnavailable`` when there is none."""
        try:
            group = self._group.get_api_group()
        except ApiException as error:
            if error.status != 404:
                raise
            with self._lock:
                self._version = None
            raise ClaimApiUnavailable(
                f"the API server does not serve the {RESOURCE_GROUP} API group (dynamic resource allocation is off)"
            ) from error
        served = [v.version for v in (group.versions or ())]
        version = next((v for v in RESOURCE_API_VERSIONS if v in served), None)
        with self._lock:
            self._version = version
        if version is None:
            raise ClaimApiUnavailable(
                f"the API server serves {RESOURCE_GROUP} {', '.join(served) or 'in no version'}, "
                f"none of {', '.join(RESOURCE_API_VERSIONS)}"
            )
        return version


def _list_resource_version(meta: client.V1ListMeta | None) -> str:
    if meta is None or not meta.resource_version:
        raise ValueError("list response without metadata.resourceVersion: cannot watch from it")
    return meta.resource_version


class KubeClientPods:
    """``KubernetesPods`` over the official client: list, then watch, with a thread-safe cache.

    ``start()`` lists synchronously (so lookups work as soon as it returns; an unreachable
    API server raises here) and then watches pods and namespaces on two daemon threads.
    A watch that ends (server timeout, dropped connection) resumes from the last
    ``resourceVersion``; one answered 410 Gone relists and replaces the cache.
    """

    def __init__(
        self,
        *,
        api_client: client.ApiClient,
        node: str,
        watch_timeout_s: int = 300,
        retry_delay_s: float = 1.0,
        now: Callable[[], datetime] = utc_now,
    ) -> None:
        if not node:
            raise ValueError("node name is required (the agent watches the pods of its own node)")
        if watch_timeout_s < 1:
            raise ValueError(f"watch_timeout_s must be >= 1 s, got {watch_timeout_s}")
        self._core = client.CoreV1Api(api_client)
        self._apps = client.AppsV1Api(api_client)
        self._batch = client.BatchV1Api(api_client)
        self._claims = _ClaimReader(api_client)
        self._node = node
        self._field_selector = f"spec.nodeName={node}"
        self._watch_timeout_s = watch_timeout_s
        self._retry_delay_s = retry_delay_s
        self._now = now
        self._lock = threading.Lock()
        self._pods: dict[str, PodInfo] = {}  # pod uid -> pod
        self._by_container: dict[str, tuple[str, str]] = {}  # container id -> (pod uid, container name)
        self._namespaces: dict[str, Mapping[str, str]] = {}  # namespace -> labels
        self._stopping = threading.Event()
        self._watches: dict[str, watch.Watch] = {}
        self._threads: list[threading.Thread] = []
        self._relists = 0  # relists after 410 Gone

    @classmethod
    def from_environment(cls, *, node: str) -> KubeClientPods:
        """Configure from the pod's service account, or from ``~/.kube/config`` outside a cluster."""
        try:
            config.load_incluster_config()
        except config.ConfigException:
            config.load_kube_config()
        return cls(api_client=client.ApiClient(), node=node)

    # -- lifecycle ---------------------------------------------------------------------

    def start(self) -> None:
        pods_rv = self._relist_pods()
        namespaces_rv = self._relist_namespaces()
        # The client's own list methods: Watch derives the event object type from them.
        watches: list[
            tuple[str, str, Callable[..., Any], dict[str, str], Callable[[], str], Callable[[str, Any], None]]
        ] = [
            (
                "pods",
                pods_rv,
                self._core.list_pod_for_all_namespaces,
                {"field_selector": self._field_selector},
                self._relist_pods,
                self._apply_pod_event,
            ),
            (
                "namespaces",
                namespaces_rv,
                self._core.list_namespace,
                {},
                self._relist_namespaces,
                self._apply_namespace_event,
            ),
        ]
        for name, *args in watches:
            thread = threading.Thread(
                target=self._watch_forever, args=(name, *args), name=f"kube-watch-{name}", daemon=True
            )
            self._threads.append(thread)
            thread.start()

    @property
    def watching(self) -> bool:
        """True while both watch threads run (False before ``start()``, after ``stop()`` or a crash)."""
        return bool(self._threads) and all(t.is_alive() for t in self._threads)

    def stop(self, *, timeout_s: float = 5.0) -> None:
        """End the watches and join their threads.

        ``Watch.stop()`` can only cut a stream whose response has arrived, so it is repeated
        until each thread has noticed (a watch being opened at that moment included).
        """
        self._stopping.set()
        deadline = time.monotonic() + timeout_s
        for thread in self._threads:
            while thread.is_alive() and time.monotonic() < deadline:
                with self._lock:
                    watches = list(self._watches.values())
                for active in watches:
                    active.stop()
                thread.join(timeout=0.05)

    # -- reads (from the cache) ------------------------------------------------------------

    def lookup(self, container_id: str) -> tuple[PodInfo, ContainerInfo] | None:
        with self._lock:
            entry = self._by_container.get(container_id)
            if entry is None:
                return None
            pod = self._pods[entry[0]]
        container = pod.container(entry[1])
        return None if container is None else (pod, container)

    def lookup_pod(self, pod_uid: str) -> PodInfo | None:
        with self._lock:
            return self._pods.get(pod_uid)

    def namespace_labels(self, namespace: str) -> Mapping[str, str] | None:
        with self._lock:
            return self._namespaces.get(namespace)

    @property
    def relists(self) -> int:
        """How many times a watch expired (410 Gone) and a relist began."""
        with self._lock:
            return self._relists

    def pods(self) -> list[PodInfo]:
        with self._lock:
            return list(self._pods.values())

    # -- API calls -----------------------------------------------------------------------

    def get_resource_claim(self, *, namespace: str, name: str) -> ResourceClaimInfo | None:
        """The claim, or None when it does not exist (404).

        Other API errors raise ``ApiException``; an API server with no ``resource.k8s.io``
        version this agent reads raises ``ClaimApiUnavailable``.
        """
        return self._claims.read(namespace=namespace, name=name)

    def read_controller(self, *, namespace: str, kind: str, name: str) -> tuple[str, str] | None:
        """The controller of a pod's own controller, one level up (``agents.owners``): a ReplicaSet's
        Deployment, a Job's CronJob. None when it has none or is not one of those two kinds.

        Only ``metadata.ownerReferences`` is read, from the raw JSON: the rest of the object (its
        pod template) is not needed, and a model that fails to parse it must not cost the answer.
        API errors (403 without the RBAC rule, 404 for an owner already deleted) raise ``ApiException``.
        """
        response: Any  # the raw urllib3 response (_preload_content=False), not the model its signature names
        # Bounded: the first sight of an owner is read on the attribution path, inside a tick.
        options: dict[str, Any] = {"_preload_content": False, "_request_timeout": (2.0, 5.0)}
        if kind == "ReplicaSet":
            response = self._apps.read_namespaced_replica_set(name=name, namespace=namespace, **options)
        elif kind == "Job":
            response = self._batch.read_namespaced_job(name=name, namespace=namespace, **options)
        else:
            return None
        metadata = json.loads(response.data).get("metadata") or {}
        for ref in metadata.get("ownerReferences") or ():
            if ref.get("controller") and isinstance(ref.get("kind"), str) and isinstance(ref.get("name"), str):
                return (ref["kind"], ref["name"])
        return None

    def evict(
        self, *, namespace: str, pod: str, reason: str, message: str, pod_uid: str | None = None
    ) -> EvictionOutcome:
        """Evict through ``pods/eviction`` (honours PodDisruptionBudgets), then record an event.

        With ``pod_uid`` the eviction carries a UID precondition, so a replacement pod of
        the same name (a StatefulSet's) is never evicted by mistake.
        """
        preconditions = client.V1Preconditions(uid=pod_uid) if pod_uid else None
        body = client.V1Eviction(
            api_version="policy/v1",
            kind="Eviction",
            metadata=client.V1ObjectMeta(name=pod, namespace=namespace),
            delete_options=client.V1DeleteOptions(preconditions=preconditions) if preconditions else None,
        )
        try:
            self._core.create_namespaced_pod_eviction(name=pod, namespace=namespace, body=body)
        except ApiException as error:
            if error.status == 429:
                log.warning("eviction of pod %s/%s refused by a disruption budget (%s)", namespace, pod, reason)
                return EvictionOutcome.REFUSED
            if error.status in (404, 409):
                log.info("eviction of pod %s/%s skipped: pod gone (%s)", namespace, pod, error.status)
                return EvictionOutcome.GONE
            raise
        log.warning("evicted pod %s/%s: %s: %s", namespace, pod, reason, message)
        self.emit_event(namespace=namespace, pod=pod, pod_uid=pod_uid, reason=reason, message=message)
        return EvictionOutcome.EVICTED

    def emit_event(
        self, *, namespace: str, pod: str, pod_uid: str | None, reason: str, message: str, type: str = "Warning"
    ) -> None:
        """Create a ``core/v1`` Event about a pod (``kubectl describe pod`` shows it).

        An event that cannot be written is logged, never raised: events are advisory.
        """
        now = self._now()
        body = client.CoreV1Event(
            api_version="v1",
            kind="Event",
            # Named as the kubelet names its events: "<pod>.<unique suffix>" (a DNS subdomain, <= 253).
            metadata=client.V1ObjectMeta(name=f"{pod[:200]}.{uuid.uuid4().hex[:16]}", namespace=namespace),
            involved_object=client.V1ObjectReference(
                api_version="v1", kind="Pod", name=pod, namespace=namespace, uid=pod_uid
            ),
            reason=reason,
            message=message[:1024],  # the API server rejects longer event messages
            type=type,
            source=client.V1EventSource(component=COMPONENT, host=self._node),
            reporting_component=COMPONENT,
            reporting_instance=self._node,
            first_timestamp=now,
            last_timestamp=now,
            count=1,
        )
        try:
            self._core.create_namespaced_event(namespace=namespace, body=body)
        except (ApiException, urllib3.exceptions.HTTPError) as error:
            log.warning("could not record event %s on pod %s/%s: %s", reason, namespace, pod, error)

    # -- list and watch --------------------------------------------------------------------

    def _relist_pods(self) -> str:
        listed = self._core.list_pod_for_all_namespaces(field_selector=self._field_selector)
        pods: dict[str, PodInfo] = {}
        for item in listed.items:
            try:
                info = pod_info_from_model(item)
            except ValueError as error:
                log.warning("skipping a listed pod: %s", error)
                continue
            pods[info.uid] = info
        with self._lock:
            self._pods = pods
            self._by_container = {
                c.container_id: (p.uid, c.name) for p in pods.values() for c in p.containers if c.container_id
            }
        resource_version = _list_resource_version(listed.metadata)
        log.info("listed %d pods on node %s at resourceVersion %s", len(pods), self._node, resource_version)
        return resource_version

    def _relist_namespaces(self) -> str:
        listed = self._core.list_namespace()
        namespaces: dict[str, Mapping[str, str]] = {}
        for item in listed.items:
            if item.metadata is not None and item.metadata.name:
                namespaces[item.metadata.name] = dict(item.metadata.labels or {})
        with self._lock:
            self._namespaces = namespaces
        return _list_resource_version(listed.metadata)

    def _apply_pod_event(self, event_type: str, obj: Any) -> None:
        try:
            info = pod_info_from_model(obj)
        except ValueError as error:
            log.warning("skipping a %s pod event: %s", event_type, error)
            return
        with self._lock:
            old = self._pods.pop(info.uid, None)
            if old is not None:
                for container in old.containers:
                    if container.container_id:
                        self._by_container.pop(container.container_id, None)
            if event_type == "DELETED":
                return
            self._pods[info.uid] = info
            for container in info.containers:
                if container.container_id:
                    self._by_container[container.container_id] = (info.uid, container.name)

    def _apply_namespace_event(self, event_type: str, obj: Any) -> None:
        name = obj.metadata.name
        with self._lock:
            if event_type == "DELETED":
                self._namespaces.pop(name, None)
            else:
                self._namespaces[name] = dict(obj.metadata.labels or {})

    def _watch_forever(  # noqa: PLR0917 - a private helper whose one caller passes its loop's state in order
        self,
        name: str,
        resource_version: str,
        list_call: Callable[..., Any],
        list_kwargs: dict[str, str],
        relist: Callable[[], str],
        apply: Callable[[str, Any], None],
    ) -> None:
        while not self._stopping.is_set():
            try:
                resource_version = self._watch_once(name, resource_version, list_call, list_kwargs, apply)
            except ApiException as error:
                if self._stopping.is_set():
                    return
                if error.status != 410:
                    log.warning("watch of %s failed (%s %s); retrying", name, error.status, error.reason)
                    self._stopping.wait(self._retry_delay_s)
                    continue
                log.info("watch of %s expired at resourceVersion %s (410 Gone); relisting", name, resource_version)
                with self._lock:
                    self._relists += 1
                relisted = self._relist_until_done(name, relist)
                if relisted is None:
                    return
                resource_version = relisted
            except (urllib3.exceptions.HTTPError, OSError) as error:
                if self._stopping.is_set():
                    return
                log.warning("watch of %s lost its connection (%s); resuming from %s", name, error, resource_version)
                self._stopping.wait(self._retry_delay_s)

    def _relist_until_done(self, name: str, relist: Callable[[], str]) -> str | None:
        """The new resourceVersion, or None when stopped before a relist succeeded."""
        while not self._stopping.is_set():
            try:
                return relist()
            except (ApiException, urllib3.exceptions.HTTPError, OSError) as error:
                log.warning("relist of %s failed (%s); retrying", name, error)
                self._stopping.wait(self._retry_delay_s)
        return None

    def _watch_once(
        self,
        name: str,
        resource_version: str,
        list_call: Callable[..., Any],
        list_kwargs: dict[str, str],
        apply: Callable[[str, Any], None],
    ) -> str:
        """One watch request; returns the resourceVersion to resume from when the server ends it."""
        active = watch.Watch()
        with self._lock:
            self._watches[name] = active
        if self._stopping.is_set():
            return resource_version
        # Read timeout above the server-side timeout: a silent, half-open connection is noticed.
        timeouts = (10.0, float(self._watch_timeout_s) + 30.0)
        for event in active.stream(
            list_call,
            resource_version=resource_version,
            timeout_seconds=self._watch_timeout_s,
            allow_watch_bookmarks=True,
            _request_timeout=timeouts,
            **list_kwargs,
        ):
            event_type = event["type"]
            raw = event["raw_object"]
            resource_version = raw["metadata"]["resourceVersion"]
            if event_type != "BOOKMARK":
                apply(event_type, event["object"])
            if self._stopping.is_set():
                active.stop()
        return resource_version
