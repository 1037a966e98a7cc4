"""Attribution of GPU processes to workloads: pid -> cgroup -> container -> pod -> tenant.

``/proc/<pid>/cgroup`` names the pod (by UID) and the container (by runtime id) for every
cgroup layout the kubelet produces: cgroup v1 and v2, the ``systemd`` and ``cgroupfs``
drivers, containerd, CRI-O and Docker. ``parse_cgroup`` is a pure function over the
file's text; ``KubeAttributor`` joins its result with the node's pod cache
(``agents.kube.KubernetesPods``). A process that belongs to no known pod is metered as
``unattributed`` (``PidAttributor``), never dropped.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from agents.interfaces import NO_META, Attributor, Workload, WorkloadMeta
from agents.kube import ContainerInfo, KubernetesPods, PodInfo
from agents.owners import ControllerResolver, allowed_labels

__all__ = [
    "SLA_TIER_LABEL",
    "TENANT_LABEL",
    "UNATTRIBUTED",
    "CgroupRef",
    "KubeAttributor",
    "PidAttributor",
    "parse_cgroup",
    "read_pid_cgroup",
]

log = logging.getLogger(__name__)

UNATTRIBUTED = "unattributed"
TENANT_LABEL = "vgpu-ledger.io/tenant"  # on the namespace; absent: the tenant is the namespace name
SLA_TIER_LABEL = "vgpu-ledger.io/sla-tier"  # on the pod; absent: the tenant's default tier (policy API)


class PidAttributor:
    """``Attributor`` that knows only the pid: each process is its own pseudo-pod.

    Samples land on tenant and namespace ``unattributed`` with pod ``pid-<pid>``; this is
    also ``KubeAttributor``'s answer for processes outside any known pod.
    """

    def attribute(self, *, pid: int) -> Workload:
        return Workload(
            tenant=UNATTRIBUTED,
            namespace=UNATTRIBUTED,
            pod=f"pid-{pid}",
            container="process",
            pod_uid=f"pid-{pid}",
            sla_tier="best-effort",
        )


@dataclass(frozen=True, slots=True)
class CgroupRef:
    """What a process's cgroup path says about it."""

    pod_uid: str  # with dashes, as in metadata.uid (static pods: the 32-hex config hash)
    container_id: str | None  # 64-hex runtime id; None when the process sits in the pod's own cgroup


# The pod segment: "pod<uid>" in cgroupfs paths, "kubepods[-<qos>]-pod<uid with _>.slice" under
# systemd (with a parent prefix such as "kubelet-" when the kubelet runs in its own slice, as in
# kind). A UID is a dashed UUID, or 32 hex digits for static (mirror) pods.
_POD_SEGMENT = re.compile(
    r"^(?:[a-z0-9_.-]*kubepods(?:-(?:burstable|besteffort|guaranteed))?-)?pod"
    r"(?P<uid>[0-9a-f]{8}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{12}|[0-9a-f]{32})"
    r"(?:\.slice)?$"
)
# The container segment: "<64hex>" (cgroupfs), "cri-containerd-<id>.scope", "crio-<id>.scope",
# "docker-<id>.scope" (systemd), and containerd's "<pod slice>:cri-containerd:<id>" form.
_CONTAINER_SEGMENT = re.compile(r"^(?:(?:cri-containerd|crio|docker)-)?(?P<id>[0-9a-f]{64})(?:\.scope)?$")
_CONTAINERD_SYSTEMD_SEGMENT = re.compile(r"^(?P<pod>[^:]+):cri-containerd:(?P<id>[0-9a-f]{64})$")


def _parse_path(path: str) -> CgroupRef | None:
    segments = [s for s in path.split("/") if s and s != ".."]
    if not any("kubepods" in s for s in segments):
        return None  # not under the kubelet's hierarchy: a host process or a non-Kubernetes container
    pod_uid: str | None = None
    container_id: str | None = None
    for segment in segments:
        combined = _CONTAINERD_SYSTEMD_SEGMENT.match(segment)
        if combined is not None:
            pod_match = _POD_SEGMENT.match(combined.group("pod"))
            if pod_match is not None:
                pod_uid = pod_match.group("uid")
                container_id = combined.group("id")
            continue
        pod_match = _POD_SEGMENT.match(segment)
        if pod_match is not None:
            pod_uid = pod_match.group("uid")
            container_id = None
            continue
        container_match = _CONTAINER_SEGMENT.match(segment)
        if container_match is not None and pod_uid is not None:
            container_id = container_match.group("id")
    if pod_uid is None:
        return None
    return CgroupRef(pod_uid=pod_uid.replace("_", "-"), container_id=container_id)


def parse_cgroup(text: str) -> CgroupRef | None:
    """The pod and container named by a ``/proc/<pid>/cgroup`` file, or None outside Kubernetes.

    Lines are ``<hierarchy-id>:<controllers>:<path>``: cgroup v2 has the single line
    ``0::<path>``; v1 has one line per controller (``memory``, ``cpu,cpuacct``,
    ``name=systemd``, ...), which agree for a container. The first line that names a
    container wins; failing that, the first that names a pod.
    """
    pod_only: CgroupRef | None = None
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        ref = _parse_path(parts[2].strip())
        if ref is None:
            continue
        if ref.container_id is not None:
            return ref
        if pod_only is None:
            pod_only = ref
    return pod_only


def read_pid_cgroup(pid: int, *, proc_root: Path = Path("/proc")) -> str | None:
    """The text of ``<proc_root>/<pid>/cgroup``; None when the process has exited.

    On a node the agent runs with ``hostPID: true`` (or the host's ``/proc`` mounted and
    ``proc_root`` pointing at it) so that it sees the GPU processes of other pods.
    """
    try:
        return (proc_root / str(pid) / "cgroup").read_text(encoding="utf-8", errors="replace")
    except (FileNotFoundError, ProcessLookupError, NotADirectoryError):
        return None


class KubeAttributor:
    """``Attributor``: pid -> cgroup -> container id -> pod (cached) -> namespace -> tenant, tier.

    - tenant: the namespace's ``vgpu-ledger.io/tenant`` label, else the namespace name;
    - SLA tier: the pod's ``vgpu-ledger.io/sla-tier`` label, else ``tenant_default_tier(tenant)``
      (the policy API's default for that tenant, supplied by the caller);
    - a process in no pod known to the cache (host process, exited process, pod not yet or
      no longer listed) is attributed by ``fallback`` (``PidAttributor``: ``unattributed``);
    - its description (the optional grouping fields of the batch): the pod's controller, resolved by
      ``controllers`` (``agents.owners``; without one, the ownerReference as written), and the
      pod labels ``label_keys`` names.
    """

    def __init__(
        self,
        *,
        pods: KubernetesPods,
        tenant_default_tier: Callable[[str], str],
        proc_root: Path = Path("/proc"),
        fallback: Attributor | None = None,
        label_keys: Sequence[str] = (),
        controllers: ControllerResolver | None = None,
    ) -> None:
        self._pods = pods
        self._label_keys = tuple(label_keys)
        self._controllers = controllers
        self._tenant_default_tier = tenant_default_tier
        self._proc_root = proc_root
        self._fallback = fallback if fallback is not None else PidAttributor()

    def attribute(self, *, pid: int) -> Workload:
        located = self.locate(pid=pid)
        if located is None:
            return self._fallback.attribute(pid=pid)
        pod, container_name = located
        tenant = self.tenant_of(pod.namespace)
        tier = pod.labels.get(SLA_TIER_LABEL) or self._tenant_default_tier(tenant)
        return Workload(
            tenant=tenant,
            namespace=pod.namespace,
            pod=pod.name,
            container=container_name,
            pod_uid=pod.uid,
            sla_tier=tier,
            meta=self.describe(pod),
        )

    def describe(self, pod: PodInfo) -> WorkloadMeta:
        """The pod's controller and allow-listed labels (no API call once its owner is cached)."""
        owner = pod.controller
        if self._controllers is not None:
            owner = self._controllers.resolve(namespace=pod.namespace, owner=owner)
        labels = allowed_labels(pod.labels, self._label_keys)
        if owner is None and not labels:
            return NO_META
        kind, name = owner if owner is not None else ("", "")
        return WorkloadMeta(controller_kind=kind, controller_name=name, labels=labels)

    def locate(self, *, pid: int) -> tuple[PodInfo, str] | None:
        """The pod and container name a process runs in, or None when it is in no known pod."""
        text = read_pid_cgroup(pid, proc_root=self._proc_root)
        if text is None:
            return None
        ref = parse_cgroup(text)
        if ref is None:
            return None
        if ref.container_id is not None:
            found = self._pods.lookup(ref.container_id)
            if found is not None:
                pod, container = found
                return pod, container.name
        pod_info = self._pods.lookup_pod(ref.pod_uid)
        if pod_info is None:
            log.debug("pid %d is in pod %s, which is not (or no longer) on this node's list", pid, ref.pod_uid)
            return None
        # The pod is known but its status does not list this container id yet (it just
        # started) or the process sits in the pod cgroup itself.
        return pod_info, _container_name_without_status(pod_info, ref.container_id)

    def tenant_of(self, namespace: str) -> str:
        labels = self._pods.namespace_labels(namespace) or {}
        return labels.get(TENANT_LABEL) or namespace


def _container_name_without_status(pod: PodInfo, container_id: str | None) -> str:
    """A container name when the cgroup's id is not (yet) in the pod's status.

    A pod with one container: that one. Otherwise the name records the runtime id, so the
    sample stays distinct and traceable (``kubectl get pod -o yaml`` shows the id).
    """
    if len(pod.containers) == 1:
        return pod.containers[0].name
    not_started: list[ContainerInfo] = [c for c in pod.containers if c.container_id is None]
    if container_id is not None and len(not_started) == 1:
        return not_started[0].name
    return f"container-{container_id[:12]}" if container_id is not None else "pod-cgroup"
