"""Structured GPU requests: parsing (tables) and resolution over the fake API server."""

from __future__ import annotations

import copy
import json
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from agents.gpu_requests import (
    GpuRequest,
    GpuRequestResolver,
    InvalidGpuRequest,
    parse_annotations,
    parse_claim_configs,
    parse_gpu_limit,
)
from agents.interfaces import Entitlement, GpuInfo, Workload
from agents.kube import ClaimConfig, KubeClientPods, PodInfo
from agents.testing import FakeKubernetes, wait_until

FIXTURES = Path(__file__).parent / "fixtures"
NODE = "gpu-node-17"
POD = "acme-prod/bert"
A100 = GpuInfo(uuid="GPU-8f1c", model="NVIDIA A100-SXM4-80GB", memory_mb=81920, sm_count=108)


def fixture(name: str) -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads((FIXTURES / name).read_text())
    return loaded


# -- annotations -------------------------------------------------------------------------


def test_annotations_give_guarantees_and_limits() -> None:
    annotations = fixture("pod_gpu_containerd.json")["metadata"]["annotations"]
    assert parse_annotations(annotations, pod=POD) == GpuRequest(
        memory_mb=8192, memory_limit_mb=16384, sm_count=20, sm_limit=54, source="annotations"
    )


def test_bandwidth_annotations_are_read_in_mb_per_second() -> None:
    request = parse_annotations(
        {"vgpu-ledger.io/bandwidth-mbps": "2000", "vgpu-ledger.io/bandwidth-mbps-limit": "8000"}, pod=POD
    )
    assert request == GpuRequest(bandwidth_mbps=2000, bandwidth_limit_mbps=8000, source="annotations")


def test_a_pod_without_request_annotations_has_no_annotation_request() -> None:
    assert parse_annotations({"kubectl.kubernetes.io/restartedAt": "2026-11-29T18:02:11Z"}, pod=POD) is None


@pytest.mark.parametrize(
    ("annotations", "field", "problem"),
    [
        ({"vgpu-ledger.io/memory-mb": "8Gi"}, "vgpu-ledger.io/memory-mb", "whole number of MiB"),
        ({"vgpu-ledger.io/memory-mb": "-1"}, "vgpu-ledger.io/memory-mb", "whole number of MiB"),
        ({"vgpu-ledger.io/memory-mb": "1.5"}, "vgpu-ledger.io/memory-mb", "whole number of MiB"),
        ({"vgpu-ledger.io/memory-mb": ""}, "vgpu-ledger.io/memory-mb", "whole number of MiB"),
        ({"vgpu-ledger.io/sm-count": "twenty"}, "vgpu-ledger.io/sm-count", "whole number of SMs"),
        ({"vgpu-ledger.io/bandwidth-mbps": "1e3"}, "vgpu-ledger.io/bandwidth-mbps", "whole number of MB/s"),
        ({"vgpu-ledger.io/memory-mb-limit": "0"}, "vgpu-ledger.io/memory-mb-limit", "at least 1 MiB"),
        (
            {"vgpu-ledger.io/sm-count": "40", "vgpu-ledger.io/sm-count-limit": "20"},
            "vgpu-ledger.io/sm-count-limit",
            "below the guarantee vgpu-ledger.io/sm-count=40",
        ),
    ],
)
def test_invalid_annotations_name_the_pod_and_the_field(annotations: dict[str, str], field: str, problem: str) -> None:
    with pytest.raises(InvalidGpuRequest) as raised:
        parse_annotations(annotations, pod=POD)
    assert raised.value.field == field
    assert raised.value.pod == POD
    assert problem in str(raised.value) and POD in str(raised.value) and field in str(raised.value)


# -- DRA ResourceClaim opaque parameters -----------------------------------------------------


def _configs(claim: dict[str, Any]) -> list[ClaimConfig]:
    return [
        ClaimConfig(driver=c["opaque"]["driver"], parameters=c["opaque"]["parameters"], source=c["source"])
        for c in claim["status"]["allocation"]["devices"]["config"]
    ]


def test_claim_parameters_for_our_driver_give_the_request() -> None:
    configs = _configs(fixture("resourceclaim_v1_allocated.json"))
    assert parse_claim_configs(configs, pod=POD, claim="trainer-0-gpu-7x2lq") == GpuRequest(
        memory_mb=20480,
        memory_limit_mb=40960,
        sm_count=32,
        sm_limit=108,
        bandwidth_mbps=2000,
        source="resourceclaim/trainer-0-gpu-7x2lq",
    )


def test_claim_config_overrides_class_config_field_by_field() -> None:
    configs = [
        ClaimConfig(driver="vgpu-ledger.io", parameters={"memoryMB": 4096, "smCount": 10}, source="FromClass"),
        ClaimConfig(driver="vgpu-ledger.io", parameters={"memoryMB": 8192}, source="FromClaim"),
    ]
    request = parse_claim_configs(configs, pod=POD, claim="c")
    assert request is not None and (request.memory_mb, request.sm_count) == (8192, 10)


def test_a_claim_without_our_driver_has_no_request() -> None:
    configs = [ClaimConfig(driver="gpu.nvidia.com", parameters={"memoryMB": 1}, source="FromClass")]
    assert parse_claim_configs(configs, pod=POD, claim="c") is None


@pytest.mark.parametrize(
    ("parameters", "field", "problem"),
    [
        ({"memoryMB": "8192"}, "parameters.memoryMB", "non-negative whole number of MiB"),
        ({"memoryMB": 8192.0}, "parameters.memoryMB", "non-negative whole number of MiB"),
        ({"smCount": True}, "parameters.smCount", "non-negative whole number of SMs"),
        ({"smCount": -4}, "parameters.smCount", "non-negative whole number of SMs"),
        ({"memoryMb": 8192}, "parameters.memoryMb", "unknown parameter"),
        ({"apiVersion": "vgpu-ledger.io/v2"}, "parameters.apiVersion", "'vgpu-ledger.io/v1'"),
        ({"kind": "GpuConfig"}, "parameters.kind", "'GpuRequest'"),
        ({"smCount": 50, "smCountLimit": 10}, "parameters.smCountLimit", "below the guarantee"),
    ],
)
def test_invalid_claim_parameters_name_the_pod_claim_and_field(
    parameters: dict[str, Any], field: str, problem: str
) -> None:
    configs = [ClaimConfig(driver="vgpu-ledger.io", parameters=parameters, source="FromClaim")]
    with pytest.raises(InvalidGpuRequest) as raised:
        parse_claim_configs(configs, pod=POD, claim="gpu-claim")
    assert raised.value.field == f"resourceclaim/gpu-claim {field}"
    assert problem in str(raised.value) and POD in str(raised.value)


# -- nvidia.com/gpu --------------------------------------------------------------------------


def test_nvidia_gpu_limit_is_whole_gpus() -> None:
    assert parse_gpu_limit("2", pod=POD, container="server") == GpuRequest(whole_gpus=2, source="nvidia.com/gpu")
    assert parse_gpu_limit("0", pod=POD, container="server") is None
    with pytest.raises(InvalidGpuRequest) as raised:
        parse_gpu_limit("500m", pod=POD, container="server")
    assert raised.value.field == "containers[server].resources.limits[nvidia.com/gpu]"


# -- entitlement -----------------------------------------------------------------------------


def test_entitlement_is_capped_at_the_card_and_whole_gpus_hold_all_of_it() -> None:
    fractional = GpuRequest(memory_mb=8192, memory_limit_mb=200_000, sm_count=20, sm_limit=None)
    assert fractional.entitlement(gpu=A100) == Entitlement(
        guarantee_mem_mb=8192.0, limit_mem_mb=81920.0, guarantee_sm=20.0, limit_sm=None
    )
    assert GpuRequest(whole_gpus=1).entitlement(gpu=A100) == Entitlement(
        guarantee_mem_mb=81920.0, limit_mem_mb=81920.0, guarantee_sm=108.0, limit_sm=108.0
    )


def test_gpu_request_refuses_a_limit_below_its_guarantee() -> None:
    with pytest.raises(ValueError, match="sm_limit"):
        GpuRequest(sm_count=10, sm_limit=5)


# -- resolution over the fake API server ----------------------------------------------------

TENANT_DEFAULT = GpuRequest(memory_mb=1024, sm_count=4, source="tenant-default")


@pytest.fixture
def fake() -> Iterator[FakeKubernetes]:
    with FakeKubernetes() as server:
        yield server


@pytest.fixture
def pods(fake: FakeKubernetes) -> Iterator[KubeClientPods]:
    cache = KubeClientPods(
        api_client=client.ApiClient(client.Configuration(host=fake.url)), node=NODE, retry_delay_s=0.05
    )
    cache.start()
    yield cache
    cache.stop()


class Clock:
    def __init__(self) -> None:
        self.now_s = 0.0

    def __call__(self) -> float:
        return self.now_s


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def resolver(pods: KubeClientPods, clock: Clock) -> GpuRequestResolver:
    return GpuRequestResolver(pods=pods, tenant_default=lambda tenant: TENANT_DEFAULT, monotonic=clock)


def _add(fake: FakeKubernetes, pods: KubeClientPods, pod: dict[str, Any]) -> PodInfo:
    stored = fake.add_pod(pod)
    uid = stored["metadata"]["uid"]
    rv = stored["metadata"]["resourceVersion"]
    wait_until(lambda: (p := pods.lookup_pod(uid)) is not None and p.resource_version == rv, what="pod cached")
    found = pods.lookup_pod(uid)
    assert found is not None
    return found


def _workload(pod: PodInfo, container: str) -> Workload:
    return Workload(
        tenant="acme", namespace=pod.namespace, pod=pod.name, container=container, pod_uid=pod.uid, sla_tier="gold"
    )


def test_annotations_take_precedence_over_the_nvidia_gpu_limit(
    fake: FakeKubernetes, pods: KubeClientPods, resolver: GpuRequestResolver
) -> None:
    pod = _add(fake, pods, fixture("pod_gpu_containerd.json"))
    request = resolver.resolve(workload=_workload(pod, "server"))
    assert (request.source, request.memory_mb, request.whole_gpus) == ("annotations", 8192, 0)


def test_without_annotations_nvidia_gpu_means_whole_gpus(
    fake: FakeKubernetes, pods: KubeClientPods, resolver: GpuRequestResolver
) -> None:
    manifest = fixture("pod_gpu_containerd.json")
    manifest["metadata"]["annotations"] = {}
    pod = _add(fake, pods, manifest)
    assert resolver.resolve(workload=_workload(pod, "server")) == GpuRequest(whole_gpus=1, source="nvidia.com/gpu")
    # The sidecar asks for no GPU: its tenant's default applies.
    assert resolver.resolve(workload=_workload(pod, "metrics-sidecar")) == TENANT_DEFAULT


def test_the_dra_claim_allocated_to_the_pod_is_read_over_the_api(
    fake: FakeKubernetes, pods: KubeClientPods, resolver: GpuRequestResolver
) -> None:
    fake.add_resource_claim(fixture("resourceclaim_v1_allocated.json"))
    pod = _add(fake, pods, fixture("pod_dra_claim.json"))

    request = resolver.resolve(workload=_workload(pod, "trainer"))
    again = resolver.resolve(workload=_workload(pod, "trainer"))

    assert request == again and (request.memory_mb, request.sm_limit) == (20480, 108)
    assert request.source == "resourceclaim/trainer-0-gpu-7x2lq"
    reads = [r for r in fake.requests if r.path.endswith("/resourceclaims/trainer-0-gpu-7x2lq")]
    assert len(reads) == 1  # cached per pod version


def test_a_missing_claim_gives_the_tenant_default_and_is_retried_later(
    fake: FakeKubernetes, pods: KubeClientPods, resolver: GpuRequestResolver, clock: Clock
) -> None:
    pod = _add(fake, pods, fixture("pod_dra_claim.json"))
    assert resolver.resolve(workload=_workload(pod, "trainer")) == TENANT_DEFAULT
    fake.add_resource_claim(fixture("resourceclaim_v1_allocated.json"))
    assert resolver.resolve(workload=_workload(pod, "trainer")) == TENANT_DEFAULT  # not retried yet
    clock.now_s += 31
    assert resolver.resolve(workload=_workload(pod, "trainer")).memory_mb == 20480
    assert fake.events == []  # a missing claim is not the pod author's mistake


def test_an_invalid_annotation_falls_back_to_the_tenant_default_with_an_event_and_a_log_line(
    fake: FakeKubernetes, pods: KubeClientPods, resolver: GpuRequestResolver, caplog: pytest.LogCaptureFixture
) -> None:
    manifest = fixture("pod_gpu_containerd.json")
    manifest["metadata"]["annotations"]["vgpu-ledger.io/memory-mb"] = "8Gi"
    pod = _add(fake, pods, manifest)

    with caplog.at_level(logging.WARNING, logger="agents.gpu_requests"):
        first = resolver.resolve(workload=_workload(pod, "server"))
        second = resolver.resolve(workload=_workload(pod, "server"))

    assert first == second == TENANT_DEFAULT
    (event,) = fake.events  # once per pod version, not once per tick
    assert event["apiVersion"] == "v1" and event["kind"] == "Event"
    assert event["type"] == "Warning" and event["reason"] == "InvalidGpuRequest"
    assert event["involvedObject"]["name"] == pod.name and event["involvedObject"]["uid"] == pod.uid
    assert event["metadata"]["namespace"] == "acme-prod"
    assert "vgpu-ledger.io/memory-mb='8Gi'" in event["message"] and pod.key in event["message"]
    assert "tenant default" in event["message"]
    assert any("vgpu-ledger.io/memory-mb" in r.getMessage() and pod.key in r.getMessage() for r in caplog.records)


def test_fixing_the_annotation_takes_effect_on_the_next_pod_version(
    fake: FakeKubernetes, pods: KubeClientPods, resolver: GpuRequestResolver
) -> None:
    manifest = fixture("pod_gpu_containerd.json")
    manifest["metadata"]["annotations"]["vgpu-ledger.io/memory-mb"] = "lots"
    pod = _add(fake, pods, manifest)
    assert resolver.resolve(workload=_workload(pod, "server")) == TENANT_DEFAULT

    fixed = copy.deepcopy(fake.get_pod("acme-prod", pod.name))
    fixed["metadata"]["annotations"]["vgpu-ledger.io/memory-mb"] = "4096"
    pod = _add_update(fake, pods, fixed)

    assert resolver.resolve(workload=_workload(pod, "server")).memory_mb == 4096
    assert len(fake.events) == 1


def _add_update(fake: FakeKubernetes, pods: KubeClientPods, pod: dict[str, Any]) -> PodInfo:
    stored = fake.update_pod(pod)
    uid, rv = stored["metadata"]["uid"], stored["metadata"]["resourceVersion"]
    wait_until(lambda: (p := pods.lookup_pod(uid)) is not None and p.resource_version == rv, what="pod updated")
    found = pods.lookup_pod(uid)
    assert found is not None
    return found


def test_invalid_claim_parameters_produce_an_event_naming_the_claim_field(
    fake: FakeKubernetes, pods: KubeClientPods, resolver: GpuRequestResolver
) -> None:
    claim = fixture("resourceclaim_v1_allocated.json")
    claim["status"]["allocation"]["devices"]["config"][1]["opaque"]["parameters"]["smCount"] = 32.5
    fake.add_resource_claim(claim)
    pod = _add(fake, pods, fixture("pod_dra_claim.json"))

    assert resolver.resolve(workload=_workload(pod, "trainer")) == TENANT_DEFAULT
    (event,) = fake.events
    assert "resourceclaim/trainer-0-gpu-7x2lq parameters.smCount=32.5" in event["message"]


def test_a_workload_in_no_known_pod_gets_its_tenant_default(resolver: GpuRequestResolver) -> None:
    unattributed = Workload(
        tenant="unattributed", namespace="unattributed", pod="pid-7", container="process", pod_uid="pid-7", sla_tier="x"
    )
    assert resolver.resolve(workload=unattributed) == TENANT_DEFAULT
