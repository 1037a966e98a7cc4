"""Attribution: cgroup parsing (table), and pid -> pod -> tenant end to end over the fake API server."""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from agents.attribution import CgroupRef, KubeAttributor, PidAttributor, parse_cgroup, read_pid_cgroup
from agents.fakes.kube import FakeKubernetes
from agents.interfaces import Workload
from agents.kube import KubeClientPods
from tests.agents.helpers import wait_until

FIXTURES = Path(__file__).parent / "fixtures"
NODE = "gpu-node-17"
UID = "6c1e2f3a-8b4d-4e5f-9a0b-1c2d3e4f5a6b"
UID_SYSTEMD = UID.replace("-", "_")
CID = "a3f9c2e17b4d5e6f8091a2b3c4d5e6f708192a3b4c5d6e7f8091a2b3c4d5e6f7"
STATIC_UID = "3b8e6f0c2d4a1e9f7b5c3a1d9e7f5b3c"  # static (mirror) pods: the config hash


def fixture(name: str) -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads((FIXTURES / name).read_text())
    return loaded


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param(
            f"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID_SYSTEMD}.slice/cri-containerd-{CID}.scope\n",
            CgroupRef(UID, CID),
            id="v2-systemd-containerd-burstable",
        ),
        pytest.param(
            f"0::/kubepods.slice/kubepods-pod{UID_SYSTEMD}.slice/crio-{CID}.scope\n",
            CgroupRef(UID, CID),
            id="v2-systemd-crio-guaranteed",
        ),
        pytest.param(
            f"0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{UID_SYSTEMD}.slice/docker-{CID}.scope\n",
            CgroupRef(UID, CID),
            id="v2-systemd-docker-besteffort",
        ),
        pytest.param(f"0::/kubepods/burstable/pod{UID}/{CID}\n", CgroupRef(UID, CID), id="v2-cgroupfs"),
        pytest.param(f"0::/kubepods/pod{UID}/{CID}\n", CgroupRef(UID, CID), id="v2-cgroupfs-guaranteed"),
        pytest.param(
            f"0::/../../kubepods-burstable-pod{UID_SYSTEMD}.slice/cri-containerd-{CID}.scope\n",
            CgroupRef(UID, CID),
            id="v2-seen-from-another-cgroup-namespace",
        ),
        pytest.param(
            f"0::/kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-burstable.slice/"
            f"kubelet-kubepods-burstable-pod{UID_SYSTEMD}.slice/cri-containerd-{CID}.scope\n",
            CgroupRef(UID, CID),
            id="kind-kubelet-in-its-own-slice",
        ),
        pytest.param(
            f"1:name=systemd:/system.slice/containerd.service/kubepods-burstable-pod{UID_SYSTEMD}.slice:cri-containerd:{CID}\n",
            CgroupRef(UID, CID),
            id="v1-containerd-systemd-colon-form",
        ),
        pytest.param(
            f"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{STATIC_UID}.slice/cri-containerd-{CID}.scope\n",
            CgroupRef(STATIC_UID, CID),
            id="static-pod-hash-uid",
        ),
        pytest.param(
            f"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID_SYSTEMD}.slice\n",
            CgroupRef(UID, None),
            id="process-in-the-pod-cgroup-itself",
        ),
        pytest.param(
            (FIXTURES / "cgroup" / "v1_systemd_containerd.txt").read_text(),
            CgroupRef(UID, CID),
            id="v1-multiline-systemd",
        ),
        pytest.param(
            (FIXTURES / "cgroup" / "v1_cgroupfs_docker.txt").read_text(),
            CgroupRef(
                "0f3c5e7a-9b1d-4f2a-8c6e-0a2b4c6d8e0f",
                "9d8c7b6a5f4e3d2c1b0a9f8e7d6c5b4a3f2e1d0c9b8a7f6e5d4c3b2a1f0e9d8c",
            ),
            id="v1-multiline-cgroupfs-memory-and-cpu-cpuacct",
        ),
        pytest.param(
            f"12:memory:/\n7:cpu,cpuacct:/kubepods/burstable/pod{UID}/{CID}\n0::/\n",
            CgroupRef(UID, CID),
            id="v1-only-cpu-controller-names-the-container",
        ),
        pytest.param((FIXTURES / "cgroup" / "v1_host_process.txt").read_text(), None, id="host-systemd-service"),
        pytest.param("0::/init.scope\n", None, id="v2-init"),
        pytest.param(f"0::/system.slice/docker-{CID}.scope\n", None, id="docker-container-outside-kubernetes"),
        pytest.param(f"0::/docker/{CID}\n", None, id="docker-cgroupfs-outside-kubernetes"),
        pytest.param("", None, id="empty-file"),
    ],
)
def test_parse_cgroup_finds_pod_uid_and_container_id(text: str, expected: CgroupRef | None) -> None:
    assert parse_cgroup(text) == expected


def test_read_pid_cgroup_reads_the_injected_proc_root_and_tolerates_exited_processes(tmp_path: Path) -> None:
    (tmp_path / "4242").mkdir()
    (tmp_path / "4242" / "cgroup").write_text(f"0::/kubepods/pod{UID}/{CID}\n")
    assert read_pid_cgroup(4242, proc_root=tmp_path) == f"0::/kubepods/pod{UID}/{CID}\n"
    assert read_pid_cgroup(4243, proc_root=tmp_path) is None


# -- end to end: /proc tree + real client + fake API server ---------------------------------


class ProcTree:
    """A ``/proc`` in a temp dir: one ``<pid>/cgroup`` file per process."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def spawn(self, pid: int, cgroup_text: str) -> None:
        (self.root / str(pid)).mkdir(exist_ok=True)
        (self.root / str(pid) / "cgroup").write_text(cgroup_text)

    def in_container(self, pid: int, *, pod_uid: str, container_id: str) -> None:
        underscored = pod_uid.replace("-", "_")
        self.spawn(
            pid,
            "0::/kubepods.slice/kubepods-burstable.slice/"
            f"kubepods-burstable-pod{underscored}.slice/cri-containerd-{container_id}.scope\n",
        )


@pytest.fixture
def fake() -> Iterator[FakeKubernetes]:
    with FakeKubernetes() as server:
        server.add_namespace(fixture("namespace_labelled.json"))
        server.add_namespace({"metadata": {"name": "acme-research", "labels": {}}})
        yield server


@pytest.fixture
def pods(fake: FakeKubernetes) -> Iterator[KubeClientPods]:
    cache = KubeClientPods(
        api_client=client.ApiClient(client.Configuration(host=fake.url)), node=NODE, retry_delay_s=0.05
    )
    cache.start()
    yield cache
    cache.stop()


@pytest.fixture
def proc(tmp_path: Path) -> ProcTree:
    return ProcTree(tmp_path)


TENANT_TIERS = {"acme": "silver", "acme-research": "bronze"}


@pytest.fixture
def attributor(pods: KubeClientPods, proc: ProcTree) -> KubeAttributor:
    return KubeAttributor(pods=pods, tenant_default_tier=lambda tenant: TENANT_TIERS[tenant], proc_root=proc.root)


def test_process_of_a_listed_pod_is_billed_to_the_namespace_label_tenant_and_pod_label_tier(
    fake: FakeKubernetes, pods: KubeClientPods, proc: ProcTree, attributor: KubeAttributor
) -> None:
    fake.add_pod(fixture("pod_gpu_containerd.json"))
    proc.in_container(4242, pod_uid=UID, container_id=CID)
    wait_until(lambda: pods.lookup(CID) is not None, what="pod cached")

    assert attributor.attribute(pid=4242) == Workload(
        tenant="acme",  # namespace label vgpu-ledger.io/tenant
        namespace="acme-prod",
        pod="bert-serving-7f9c6d5b8-x2kqp",
        container="server",
        pod_uid=UID,
        sla_tier="gold",  # pod label vgpu-ledger.io/sla-tier
    )


def test_without_labels_the_tenant_is_the_namespace_and_the_tier_the_tenants_default(
    fake: FakeKubernetes, pods: KubeClientPods, proc: ProcTree, attributor: KubeAttributor
) -> None:
    stored = fake.add_pod(fixture("pod_dra_claim.json"))
    cid = "0f1e2d3c4b5a69788796a5b4c3d2e1f00f1e2d3c4b5a69788796a5b4c3d2e1f0"
    proc.spawn(
        4300, f"0::/kubepods.slice/kubepods-pod{stored['metadata']['uid'].replace('-', '_')}.slice/crio-{cid}.scope\n"
    )
    wait_until(lambda: pods.lookup(cid) is not None, what="pod cached")

    workload = attributor.attribute(pid=4300)

    assert (workload.tenant, workload.namespace, workload.pod, workload.container, workload.sla_tier) == (
        "acme-research",
        "acme-research",
        "trainer-0",
        "trainer",
        "bronze",
    )


def test_process_added_pod_then_deleted_pod_goes_from_attributed_to_unattributed(
    fake: FakeKubernetes, pods: KubeClientPods, proc: ProcTree, attributor: KubeAttributor
) -> None:
    proc.in_container(5000, pod_uid=UID, container_id=CID)
    assert attributor.attribute(pid=5000) == PidAttributor().attribute(pid=5000)

    fake.add_pod(fixture("pod_gpu_containerd.json"))
    wait_until(lambda: attributor.attribute(pid=5000).pod == "bert-serving-7f9c6d5b8-x2kqp", what="attributed")

    fake.delete_pod("acme-prod", "bert-serving-7f9c6d5b8-x2kqp")
    wait_until(lambda: attributor.attribute(pid=5000).tenant == "unattributed", what="unattributed again")
    assert attributor.attribute(pid=5000).pod == "pid-5000"


def test_host_processes_and_exited_processes_are_metered_as_unattributed(
    proc: ProcTree, attributor: KubeAttributor
) -> None:
    proc.spawn(1, "0::/init.scope\n")
    for pid in (1, 999999):
        workload = attributor.attribute(pid=pid)
        assert (workload.tenant, workload.namespace, workload.pod) == ("unattributed", "unattributed", f"pid-{pid}")


def test_namespace_relabel_moves_the_workload_to_the_new_tenant(
    fake: FakeKubernetes, pods: KubeClientPods, proc: ProcTree, attributor: KubeAttributor
) -> None:
    fake.add_pod(fixture("pod_gpu_containerd.json"))
    proc.in_container(4242, pod_uid=UID, container_id=CID)
    wait_until(lambda: attributor.attribute(pid=4242).tenant == "acme", what="attributed")

    namespace = fixture("namespace_labelled.json")
    namespace["metadata"]["labels"]["vgpu-ledger.io/tenant"] = "acme-holdings"
    fake.update_namespace(namespace)

    wait_until(lambda: attributor.attribute(pid=4242).tenant == "acme-holdings", what="tenant relabelled")


def test_a_container_not_yet_in_the_pod_status_is_attributed_to_its_pod(
    fake: FakeKubernetes, pods: KubeClientPods, proc: ProcTree, attributor: KubeAttributor
) -> None:
    pod = fixture("pod_gpu_containerd.json")
    # The kubelet has not reported the server container's id yet.
    del pod["status"]["containerStatuses"][1]["containerID"]
    fake.add_pod(pod)
    proc.in_container(4242, pod_uid=UID, container_id=CID)
    wait_until(lambda: pods.lookup_pod(UID) is not None, what="pod cached")

    workload = attributor.attribute(pid=4242)

    assert (workload.pod, workload.container, workload.tenant) == ("bert-serving-7f9c6d5b8-x2kqp", "server", "acme")


def test_attribution_recovers_after_410_gone_with_a_relist(
    fake: FakeKubernetes, pods: KubeClientPods, proc: ProcTree, attributor: KubeAttributor
) -> None:
    old = copy.deepcopy(fixture("pod_gpu_containerd.json"))
    fake.add_pod(old)
    proc.in_container(4242, pod_uid=UID, container_id=CID)
    wait_until(lambda: attributor.attribute(pid=4242).pod == old["metadata"]["name"], what="attributed")

    # While the agent is cut off, the pod is replaced and etcd compacts its history.
    new_uid = "9a8b7c6d-5e4f-4a3b-8c2d-1e0f9a8b7c6d"
    new_cid = "c" * 64
    replacement = copy.deepcopy(old)
    replacement["metadata"].update(name="bert-serving-7f9c6d5b8-q8w2n", uid=new_uid)
    replacement["status"]["containerStatuses"][1]["containerID"] = f"containerd://{new_cid}"
    replacement["status"]["containerStatuses"][0]["containerID"] = "containerd://" + "d" * 64
    with fake.watches_held():
        fake.delete_pod("acme-prod", old["metadata"]["name"])
        fake.add_pod(replacement)
        fake.compact()
    proc.in_container(4343, pod_uid=new_uid, container_id=new_cid)

    wait_until(lambda: attributor.attribute(pid=4343).pod == "bert-serving-7f9c6d5b8-q8w2n", what="relisted")
    assert attributor.attribute(pid=4242).tenant == "unattributed"
    assert pods.relists >= 1
