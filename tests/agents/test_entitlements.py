"""NVML mode end to end on the node: FakeNvml processes -> /proc cgroups -> pods in the fake API
server -> one reading per container and GPU, carrying the container's structured request."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
from kubernetes import client

from agents.attribution import KubeAttributor
from agents.backends.nvml import NvmlBackend
from agents.entitlements import EntitledBackend
from agents.fakes.kube import FakeKubernetes
from agents.fakes.nvml import FakeNvml, FakeNvmlDevice
from agents.gpu_requests import GpuRequest, GpuRequestResolver
from agents.interfaces import Entitlement
from agents.kube import KubeClientPods
from tests.agents.helpers import wait_until

FIXTURES = Path(__file__).parent / "fixtures"
NOW = datetime(2026, 11, 30, 3, 0, 0, tzinfo=UTC)
MIB = 1024 * 1024


@pytest.fixture
def pods() -> Iterator[KubeClientPods]:
    with FakeKubernetes() as fake:
        pod = json.loads((FIXTURES / "pod_gpu_containerd.json").read_text())
        node = pod["spec"]["nodeName"]
        fake.add_namespace(json.loads((FIXTURES / "namespace_labelled.json").read_text()))
        fake.add_pod(pod)
        cache = KubeClientPods(api_client=client.ApiClient(client.Configuration(host=fake.url)), node=node)
        cache.start()
        wait_until(lambda: cache.lookup_pod(pod["metadata"]["uid"]) is not None, what="pod cached")
        yield cache
        cache.stop()


def test_a_containers_processes_merge_into_one_entitled_reading(pods: KubeClientPods, tmp_path: Path) -> None:
    proc = tmp_path / "proc"
    for pid, cgroup in ((100, "v1_systemd_containerd.txt"), (101, "v1_systemd_containerd.txt"), (7, "v1_host_process.txt")):
        (proc / str(pid)).mkdir(parents=True)
        (proc / str(pid) / "cgroup").write_text((FIXTURES / "cgroup" / cgroup).read_text())
    gpu = FakeNvmlDevice(
        uuid="GPU-a", processes={100: 3000 * MIB, 101: 1000 * MIB, 7: 200 * MIB}, samples=[(100, 10, 30), (101, 10, 10)]
    )
    attributor = KubeAttributor(pods=pods, tenant_default_tier=lambda _t: "bronze", proc_root=proc)
    nvml = NvmlBackend(attributor=attributor, nvml=FakeNvml(devices=[gpu]))
    backend = EntitledBackend(nvml, resolver=GpuRequestResolver(pods=pods, tenant_default=lambda _t: GpuRequest()))

    readings = {r.workload.pod: r for r in backend.read(now=NOW)}

    server = readings["bert-serving-7f9c6d5b8-x2kqp"]
    assert server.workload.container == "server"
    assert server.workload.sla_tier == "gold"
    assert server.mem_used_mb == pytest.approx(4000.0)
    assert server.sm_used == pytest.approx(0.40 * 108)
    # The pod's annotations: 8192 MiB / 20 SMs guaranteed, up to 16384 MiB / 54 SMs.
    assert server.entitlement == Entitlement(
        guarantee_mem_mb=8192.0, limit_mem_mb=16384.0, guarantee_sm=20.0, limit_sm=54.0
    )
    assert backend.processes(server.workload) == (100, 101)
    host = readings["pid-7"]
    assert host.workload.tenant == "unattributed"
    assert host.entitlement == Entitlement()
