"""Grouping fields: what the agent says about a pod for grouping — its controller, resolved one level
through the real ``kubernetes`` client against ``FakeKubernetes``, and the allow-listed labels —
and how it travels in a batch (agents.owners, agents.attribution, agents.batch)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from agents.attribution import KubeAttributor
from agents.backends.nvml import NvmlBackend
from agents.batch import Sample, render_batch
from agents.entitlements import EntitledBackend
from agents.fakes.kube import FakeKubernetes
from agents.fakes.nvml import FakeNvml, FakeNvmlDevice
from agents.gpu_requests import GpuRequest, GpuRequestResolver
from agents.interfaces import GpuInfo, Workload, WorkloadMeta
from agents.kube import KubeClientPods
from agents.owners import DEFAULT_LABEL_KEYS, ControllerResolver, allowed_labels, parse_label_keys
from tests.agents.helpers import wait_until

FIXTURES = Path(__file__).parent / "fixtures"
NODE = "gpu-node-17"
UID = "6c1e2f3a-8b4d-4e5f-9a0b-1c2d3e4f5a6b"
CID = "a3f9c2e17b4d5e6f8091a2b3c4d5e6f708192a3b4c5d6e7f8091a2b3c4d5e6f7"
GPU = GpuInfo(uuid="GPU-0", model="NVIDIA A100-SXM4-80GB", memory_mb=81920, sm_count=108)


def recorded_pod() -> dict[str, Any]:
    """A Deployment's pod as the API server returned it: owned by ReplicaSet bert-serving-7f9c6d5b8."""
    loaded: dict[str, Any] = json.loads((FIXTURES / "pod_gpu_containerd.json").read_text())
    return loaded


def owner_ref(kind: str, name: str, *, controller: bool = True) -> dict[str, Any]:
    api = {"Deployment": "apps/v1", "ReplicaSet": "apps/v1", "StatefulSet": "apps/v1", "DaemonSet": "apps/v1",
           "Job": "batch/v1", "CronJob": "batch/v1"}.get(kind, "example.com/v1")
    return {"apiVersion": api, "kind": kind, "name": name, "uid": f"uid-{name}", "controller": controller}


def owned(kind: str, name: str, *, owner: dict[str, Any] | None) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": "acme-prod"}
    if owner is not None:
        meta["ownerReferences"] = [owner]
    return {"kind": kind, "metadata": meta}


@pytest.fixture
def fake() -> Iterator[FakeKubernetes]:
    with FakeKubernetes() as server:
        server.add_namespace({"metadata": {"name": "acme-prod", "labels": {"vgpu-ledger.io/tenant": "acme"}}})
        yield server


@pytest.fixture
def pods(fake: FakeKubernetes) -> Iterator[KubeClientPods]:
    cache = KubeClientPods(api_client=client.ApiClient(client.Configuration(host=fake.url)), node=NODE,
                           retry_delay_s=0.05)
    cache.start()
    yield cache
    cache.stop()


class Monotonic:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def owner_reads(fake: FakeKubernetes) -> int:
    return sum(1 for r in fake.requests if "/replicasets/" in r.path or "/jobs/" in r.path)


def test_a_replicaset_owned_by_a_deployment_reports_the_deployment_read_once(fake, pods) -> None:
    fake.add_owner(owned("ReplicaSet", "bert-serving-7f9c6d5b8", owner=owner_ref("Deployment", "bert-serving")))
    resolver = ControllerResolver(read=pods.read_controller)
    owner = ("ReplicaSet", "bert-serving-7f9c6d5b8")
    assert resolver.resolve(namespace="acme-prod", owner=owner) == ("Deployment", "bert-serving")
    assert resolver.resolve(namespace="acme-prod", owner=owner) == ("Deployment", "bert-serving")
    assert owner_reads(fake) == 1  # every pod of the ReplicaSet shares one read


def test_a_job_owned_by_a_cronjob_reports_the_cronjob(fake, pods) -> None:
    fake.add_owner(owned("Job", "nightly-29012345", owner=owner_ref("CronJob", "nightly")))
    fake.add_owner(owned("Job", "once", owner=None))
    resolver = ControllerResolver(read=pods.read_controller)
    assert resolver.resolve(namespace="acme-prod", owner=("Job", "nightly-29012345")) == ("CronJob", "nightly")
    assert resolver.resolve(namespace="acme-prod", owner=("Job", "once")) == ("Job", "once")


def test_other_kinds_are_reported_as_written_without_a_read(fake, pods) -> None:
    resolver = ControllerResolver(read=pods.read_controller)
    for owner in (("StatefulSet", "db"), ("DaemonSet", "exporter"), ("TFJob", "train")):
        assert resolver.resolve(namespace="acme-prod", owner=owner) == owner
    assert resolver.resolve(namespace="acme-prod", owner=None) is None
    assert owner_reads(fake) == 0


def test_a_replicaset_with_another_kind_of_owner_or_none_is_reported_itself(fake, pods) -> None:
    fake.add_owner(owned("ReplicaSet", "bare", owner=None))
    fake.add_owner(owned("ReplicaSet", "rollout-abc", owner=owner_ref("Rollout", "rollout")))
    resolver = ControllerResolver(read=pods.read_controller)
    assert resolver.resolve(namespace="acme-prod", owner=("ReplicaSet", "bare")) == ("ReplicaSet", "bare")
    assert resolver.resolve(namespace="acme-prod", owner=("ReplicaSet", "rollout-abc")) == ("ReplicaSet", "rollout-abc")


def test_an_unreadable_owner_falls_back_to_the_pods_own_controller_and_is_retried_later(fake, pods) -> None:
    fake.add_owner(owned("ReplicaSet", "bert-1", owner=owner_ref("Deployment", "bert")))
    fake.forbid_owner_reads = True  # the ClusterRole lacks replicasets: get
    clock = Monotonic()
    resolver = ControllerResolver(read=pods.read_controller, retry_s=60.0, monotonic=clock)
    assert resolver.resolve(namespace="acme-prod", owner=("ReplicaSet", "bert-1")) == ("ReplicaSet", "bert-1")
    fake.forbid_owner_reads = False
    clock.now = 30.0
    assert resolver.resolve(namespace="acme-prod", owner=("ReplicaSet", "bert-1")) == ("ReplicaSet", "bert-1")
    assert owner_reads(fake) == 1  # not before retry_s
    clock.now = 61.0
    assert resolver.resolve(namespace="acme-prod", owner=("ReplicaSet", "bert-1")) == ("Deployment", "bert")
    # A deleted owner (404) is not asked again: it will not come back.
    assert resolver.resolve(namespace="acme-prod", owner=("ReplicaSet", "gone")) == ("ReplicaSet", "gone")
    clock.now = 10_000.0
    reads = owner_reads(fake)
    assert resolver.resolve(namespace="acme-prod", owner=("ReplicaSet", "gone")) == ("ReplicaSet", "gone")
    assert owner_reads(fake) == reads


def test_attribution_describes_the_pod_with_its_deployment_and_allow_listed_labels(fake, pods, tmp_path) -> None:
    pod = recorded_pod()
    pod["metadata"]["labels"] |= {"app": "bert", "team": "search", "secret-ish": "not-sent"}
    fake.add_owner(owned("ReplicaSet", "bert-serving-7f9c6d5b8", owner=owner_ref("Deployment", "bert-serving")))
    fake.add_pod(pod)
    (tmp_path / "4242").mkdir()
    (tmp_path / "4242" / "cgroup").write_text(
        f"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID.replace('-', '_')}.slice/"
        f"cri-containerd-{CID}.scope\n")
    wait_until(lambda: pods.lookup(CID) is not None, what="pod cached")
    attributor = KubeAttributor(pods=pods, tenant_default_tier=lambda _t: "silver", proc_root=tmp_path,
                                label_keys=DEFAULT_LABEL_KEYS, controllers=ControllerResolver(read=pods.read_controller))
    workload = attributor.attribute(pid=4242)
    assert workload.meta == WorkloadMeta(
        controller_kind="Deployment", controller_name="bert-serving",
        labels=(("app", "bert"), ("app.kubernetes.io/name", "bert-serving"), ("team", "search")))
    # Without a resolver (or before RBAC allows it) the ownerReference as written; no labels named, none sent.
    plain = KubeAttributor(pods=pods, tenant_default_tier=lambda _t: "silver", proc_root=tmp_path)
    assert plain.attribute(pid=4242).meta == WorkloadMeta("ReplicaSet", "bert-serving-7f9c6d5b8")
    assert plain.attribute(pid=4242) == workload  # the description is not the identity


def test_a_bare_pod_without_allow_listed_labels_has_no_description(fake, pods, tmp_path) -> None:
    pod = recorded_pod()
    del pod["metadata"]["ownerReferences"]
    pod["metadata"]["labels"] = {"pod-template-hash": "x"}
    fake.add_pod(pod)
    wait_until(lambda: pods.lookup(CID) is not None, what="pod cached")
    found = pods.lookup(CID)
    assert found is not None
    attributor = KubeAttributor(pods=pods, tenant_default_tier=lambda _t: "silver", label_keys=DEFAULT_LABEL_KEYS)
    assert attributor.describe(found[0]) == WorkloadMeta()


WORKLOAD = Workload(tenant="acme", namespace="acme-prod", pod="bert-1", container="server", pod_uid="u1",
                    sla_tier="gold")


def sample(workload: Workload) -> Sample:
    return Sample(start=datetime(2026, 11, 30, 3, 0, 1, tzinfo=UTC), seconds=1, gpu=GPU.uuid, workload=workload,
                  mem_used_mb_s=1.0, mem_granted_mb_s=2.0, sm_used_s=0.5, sm_granted_s=1.0, pcie_mb=0.0)


def test_the_batch_carries_the_fields_only_when_known_and_the_checkpoint_keeps_them() -> None:
    meta = WorkloadMeta(controller_kind="Deployment", controller_name="bert", labels=(("app", "bert"),),
                        mem_requested_mb=8192, sm_requested=20.0)
    described = sample(replace(WORKLOAD, meta=meta))
    wire = described.to_wire()
    assert {k: wire[k] for k in ("controller_kind", "controller_name", "labels", "mem_requested_mb",
                                 "sm_requested")} == {"controller_kind": "Deployment", "controller_name": "bert",
                                                      "labels": {"app": "bert"}, "mem_requested_mb": 8192,
                                                      "sm_requested": 20.0}
    assert Sample.from_wire(wire).workload.meta == meta  # an open batch checkpointed and recovered
    plain = sample(WORKLOAD).to_wire()
    assert set(plain) == {"start", "seconds", "gpu", "tenant", "namespace", "pod", "container", "pod_uid",
                          "sla_tier", "mem_used_mb_s", "mem_granted_mb_s", "sm_used_s", "sm_granted_s", "pcie_mb"}
    window = (datetime(2026, 11, 30, 3, 0, tzinfo=UTC), datetime(2026, 11, 30, 3, 0, 10, tzinfo=UTC))
    with_cluster = json.loads(render_batch(node=NODE, batch_seq=1, window_start=window[0], window_end=window[1],
                                           gpus=[GPU], samples=[described], cluster="prod-eu-west-1", wire="v2"))
    assert with_cluster["cluster"] == "prod-eu-west-1"
    without = json.loads(render_batch(node=NODE, batch_seq=1, window_start=window[0], window_end=window[1],
                                      gpus=[GPU], samples=[described], wire="v2"))
    assert "cluster" not in without


def test_label_allow_lists_are_checked_and_never_take_more_than_named() -> None:
    assert parse_label_keys("app, team,app.kubernetes.io/name,app") == ("app", "team", "app.kubernetes.io/name")
    assert parse_label_keys("") == ()
    for bad in ("a b", "Example.com/app", "/app", "-app", ",".join(f"k{i}" for i in range(33))):
        with pytest.raises(ValueError, match="label key"):
            parse_label_keys(bad)
    labels = {"app": "bert", "team": "", "pod-template-hash": "7f9c"}
    assert allowed_labels(labels, ("team", "app", "missing")) == (("app", "bert"), ("team", ""))


def test_nvml_readings_carry_the_description_and_the_pods_own_request(fake, pods, tmp_path) -> None:
    """FakeNvml -> /proc -> pod -> EntitledBackend: a sample of the container says what it asked
    for on that GPU (its annotations: 8192 MiB, 20 SMs); an unattributed process asks nothing."""
    fake.add_owner(owned("ReplicaSet", "bert-serving-7f9c6d5b8", owner=owner_ref("Deployment", "bert-serving")))
    fake.add_pod(recorded_pod())
    for pid, cgroup in ((100, "v1_systemd_containerd.txt"), (7, "v1_host_process.txt")):
        (tmp_path / str(pid)).mkdir()
        (tmp_path / str(pid) / "cgroup").write_text((FIXTURES / "cgroup" / cgroup).read_text())
    wait_until(lambda: pods.lookup_pod(UID) is not None, what="pod cached")
    gpu = FakeNvmlDevice(uuid="GPU-a", processes={100: 3000 * 2**20, 7: 200 * 2**20}, samples=[(100, 10, 30)])
    attributor = KubeAttributor(pods=pods, tenant_default_tier=lambda _t: "bronze", proc_root=tmp_path,
                                label_keys=("app.kubernetes.io/name",),
                                controllers=ControllerResolver(read=pods.read_controller))
    backend = EntitledBackend(NvmlBackend(attributor=attributor, nvml=FakeNvml(devices=[gpu])),
                              resolver=GpuRequestResolver(pods=pods, tenant_default=lambda _t: GpuRequest()))

    readings = {r.workload.pod: r for r in backend.read(now=datetime(2026, 11, 30, 3, 0, tzinfo=UTC))}

    assert readings["bert-serving-7f9c6d5b8-x2kqp"].workload.meta == WorkloadMeta(
        controller_kind="Deployment", controller_name="bert-serving", labels=(("app.kubernetes.io/name", "bert-serving"),),
        mem_requested_mb=8192, sm_requested=20.0)
    assert readings["pid-7"].workload.meta == WorkloadMeta()
