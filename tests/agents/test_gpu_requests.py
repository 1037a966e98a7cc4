"""Structured GPU requests: parsing (tables) and resolution over the fake API server."""

from __future__ import annotations

import copy
import json
import logging
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from agents.fakes.kube import FakeKubernetes
from agents.gpu_requests import (
    GpuRequest,
    GpuRequestResolver,
    InvalidGpuRequest,
    parse_annotations,
    parse_claim,
    parse_claim_configs,
    parse_gpu_limit,
    parse_hami_limits,
    parse_nvidia_sharing,
)
from agents.interfaces import Entitlement, GpuInfo, Workload
from agents.kube import AllocatedDevice, ClaimConfig, KubeClientPods, PodInfo, ResourceClaimInfo
from tests.agents.helpers import wait_until

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
    assert problem in str(raised.value)
    assert POD in str(raised.value)
    assert field in str(raised.value)


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
    assert request is not None
    assert (request.memory_mb, request.sm_count) == (8192, 10)


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
    assert problem in str(raised.value)
    assert POD in str(raised.value)


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

    assert request == again
    assert (request.memory_mb, request.sm_limit) == (20480, 108)
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
    assert event["apiVersion"] == "v1"
    assert event["kind"] == "Event"
    assert event["type"] == "Warning"
    assert event["reason"] == "InvalidGpuRequest"
    assert event["involvedObject"]["name"] == pod.name
    assert event["involvedObject"]["uid"] == pod.uid
    assert event["metadata"]["namespace"] == "acme-prod"
    assert "vgpu-ledger.io/memory-mb='8Gi'" in event["message"]
    assert pod.key in event["message"]
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


# -- NVIDIA's DRA driver: GpuConfig sharing --------------------------------------------------

CLAIM = "trainer-0-gpu-7x2lq"
GPU0 = AllocatedDevice(driver="gpu.nvidia.com", pool="gpu-node-17", device="gpu-0", request="gpu")
GPU1 = AllocatedDevice(driver="gpu.nvidia.com", pool="gpu-node-17", device="gpu-1", request="gpu")
H100 = GpuInfo(uuid="GPU-1a2b", model="NVIDIA H100 80GB HBM3", memory_mb=81559, sm_count=132)


def _claim_info(claim: dict[str, Any]) -> ResourceClaimInfo:
    allocation = claim["status"]["allocation"]["devices"]
    return ResourceClaimInfo(
        namespace=claim["metadata"]["namespace"],
        name=claim["metadata"]["name"],
        allocated=True,
        configs=tuple(
            ClaimConfig(
                driver=c["opaque"]["driver"],
                parameters=c["opaque"]["parameters"],
                source=c["source"],
                requests=tuple(c.get("requests", ())),
            )
            for c in allocation["config"]
        ),
        devices=tuple(
            AllocatedDevice(
                driver=r["driver"],
                pool=r["pool"],
                device=r["device"],
                request=r["request"],
                consumed_capacity=r.get("consumedCapacity", {}),
                share_id=r.get("shareID"),
            )
            for r in allocation["results"]
        ),
    )


def _mps_claim(mps: dict[str, Any], *, devices: tuple[AllocatedDevice, ...] = (GPU0,)) -> ResourceClaimInfo:
    parameters = {
        "apiVersion": "resource.nvidia.com/v1beta1",
        "kind": "GpuConfig",
        "sharing": {"strategy": "MPS", "mpsConfig": mps},
    }
    config = ClaimConfig(driver="gpu.nvidia.com", parameters=parameters, source="FromClaim", requests=("gpu",))
    return ResourceClaimInfo(namespace="acme-research", name=CLAIM, allocated=True, configs=(config,), devices=devices)


def test_mps_sharing_caps_sms_at_the_thread_percentage_and_memory_at_the_pinned_limit() -> None:
    request = parse_claim(_claim_info(fixture("resourceclaim_v1beta1_mps.json")), pod=POD)
    assert request == GpuRequest(
        memory_limit_mb=10240, sm_limit_percent=25, source=f"resourceclaim/{CLAIM}/gpu.nvidia.com"
    )
    # Limits only: MPS reserves nothing. A quarter of the card's SMs, whichever card it is.
    assert request.entitlement(gpu=A100) == Entitlement(
        guarantee_mem_mb=0.0, limit_mem_mb=10240.0, guarantee_sm=0.0, limit_sm=27.0
    )
    assert request.entitlement(gpu=H100).limit_sm == 33.0


def test_time_slicing_promises_nothing_and_caps_nothing_below_the_card() -> None:
    request = parse_claim(_claim_info(fixture("resourceclaim_v1beta2_timeslicing.json")), pod=POD)
    assert request == GpuRequest(source=f"resourceclaim/{CLAIM}/gpu.nvidia.com")
    assert request.entitlement(gpu=A100) == Entitlement(
        guarantee_mem_mb=0.0, limit_mem_mb=None, guarantee_sm=0.0, limit_sm=None
    )


def test_our_own_parameters_win_over_nvidias_sharing_settings_in_the_same_claim() -> None:
    # The recorded v1 claim has a class GpuConfig (TimeSlicing) and our GpuRequest.
    request = parse_claim(_claim_info(fixture("resourceclaim_v1_allocated.json")), pod=POD)
    assert request is not None
    assert request.source == f"resourceclaim/{CLAIM}"
    assert request.memory_mb == 20480


def test_per_device_pinned_limits_apply_to_the_card_named_by_uuid() -> None:
    request = parse_nvidia_sharing(
        _mps_claim(
            {"defaultPinnedDeviceMemoryLimit": "8Gi", "defaultPerDevicePinnedMemoryLimit": {"GPU-1a2b": "20Gi"}},
            devices=(GPU0, GPU1),
        ),
        pod=POD,
    )
    assert request is not None
    assert request.memory_limit_mb_by_gpu == (("GPU-1a2b", 20480),)
    assert request.entitlement(gpu=H100).limit_mem_mb == 20480.0
    assert request.entitlement(gpu=A100).limit_mem_mb == 8192.0


def test_a_device_index_names_the_only_device_of_a_single_device_claim() -> None:
    request = parse_nvidia_sharing(
        _mps_claim({"defaultPinnedDeviceMemoryLimit": "8Gi", "defaultPerDevicePinnedMemoryLimit": {"0": "12Gi"}}),
        pod=POD,
    )
    assert request is not None
    assert request.memory_limit_mb == 12288


def test_the_class_config_applies_unless_the_claim_names_the_request() -> None:
    class_mps = ClaimConfig(
        driver="gpu.nvidia.com",
        parameters={
            "apiVersion": "resource.nvidia.com/v1beta1",
            "kind": "GpuConfig",
            "sharing": {"strategy": "MPS", "mpsConfig": {"defaultActiveThreadPercentage": 10}},
        },
        source="FromClass",
    )
    claim_ts = ClaimConfig(
        driver="gpu.nvidia.com",
        parameters={
            "apiVersion": "resource.nvidia.com/v1beta1",
            "kind": "GpuConfig",
            "sharing": {"strategy": "TimeSlicing"},
        },
        source="FromClaim",
        requests=("gpu",),
    )
    # A firstAvailable subrequest ("gpu/large") is covered by its main request's name.
    chosen = AllocatedDevice(driver="gpu.nvidia.com", pool="p", device="gpu-0", request="gpu/large")
    claim = ResourceClaimInfo(
        namespace="acme-research", name=CLAIM, allocated=True, configs=(claim_ts, class_mps), devices=(chosen,)
    )
    assert parse_nvidia_sharing(claim, pod=POD) == GpuRequest(source=f"resourceclaim/{CLAIM}/gpu.nvidia.com")
    other = AllocatedDevice(driver="gpu.nvidia.com", pool="p", device="gpu-1", request="spare")
    only_class = ResourceClaimInfo(
        namespace="acme-research", name=CLAIM, allocated=True, configs=(claim_ts, class_mps), devices=(other,)
    )
    request = parse_nvidia_sharing(only_class, pod=POD)
    assert request is not None
    assert request.sm_limit_percent == 10


@pytest.mark.parametrize(
    ("mps", "devices", "field", "problem"),
    [
        ({"defaultActiveThreadPercentage": 150}, (GPU0,), "mpsConfig.defaultActiveThreadPercentage", "1-100"),
        ({"defaultActiveThreadPercentage": "25"}, (GPU0,), "mpsConfig.defaultActiveThreadPercentage", "1-100"),
        ({"defaultPinnedDeviceMemoryLimit": "lots"}, (GPU0,), "mpsConfig.defaultPinnedDeviceMemoryLimit", "quantity"),
        ({"defaultPinnedDeviceMemoryLimit": "512Ki"}, (GPU0,), "mpsConfig.defaultPinnedDeviceMemoryLimit", "1Mi"),
        ({"defaultActiveThreadPct": 25}, (GPU0,), "mpsConfig.defaultActiveThreadPct", "unknown field"),
        (
            {"defaultPerDevicePinnedMemoryLimit": {"1": "4Gi"}},
            (GPU0,),
            "mpsConfig.defaultPerDevicePinnedMemoryLimit.1",
            "no device 1",
        ),
        (
            {"defaultPerDevicePinnedMemoryLimit": {"1": "4Gi"}},
            (GPU0, GPU1),
            "mpsConfig.defaultPerDevicePinnedMemoryLimit.1",
            "by its UUID",
        ),
    ],
)
def test_invalid_mps_settings_name_the_claim_and_field(
    mps: dict[str, Any], devices: tuple[AllocatedDevice, ...], field: str, problem: str
) -> None:
    with pytest.raises(InvalidGpuRequest) as raised:
        parse_nvidia_sharing(_mps_claim(mps, devices=devices), pod=POD)
    assert raised.value.field == f"resourceclaim/{CLAIM} gpu.nvidia.com parameters.sharing.{field}"
    assert problem in str(raised.value)


@pytest.mark.parametrize(
    ("sharing", "field", "problem"),
    [
        ({"strategy": "Exclusive"}, "sharing.strategy", "'TimeSlicing' or 'MPS'"),
        ({"strategy": "MPS", "timeSlicingConfig": {"interval": "Long"}}, "sharing.timeSlicingConfig", "not with MPS"),
        ({"strategy": "TimeSlicing", "mpsConfig": {}}, "sharing.mpsConfig", "not with TimeSlicing"),
        ({"strategy": "MPS", "mpsConfig": []}, "sharing.mpsConfig", "must be an object"),
    ],
)
def test_invalid_sharing_settings_are_refused_as_the_driver_refuses_them(
    sharing: dict[str, Any], field: str, problem: str
) -> None:
    parameters = {"apiVersion": "resource.nvidia.com/v1beta1", "kind": "GpuConfig", "sharing": sharing}
    config = ClaimConfig(driver="gpu.nvidia.com", parameters=parameters, source="FromClaim")
    claim = ResourceClaimInfo(namespace="n", name=CLAIM, allocated=True, configs=(config,), devices=(GPU0,))
    with pytest.raises(InvalidGpuRequest) as raised:
        parse_nvidia_sharing(claim, pod=POD)
    assert raised.value.field == f"resourceclaim/{CLAIM} gpu.nvidia.com parameters.{field}"
    assert problem in str(raised.value)


def test_gpus_of_one_claim_with_different_sharing_settings_are_reported() -> None:
    def mps(percent: int, request: str) -> ClaimConfig:
        parameters = {
            "apiVersion": "resource.nvidia.com/v1beta1",
            "kind": "GpuConfig",
            "sharing": {"strategy": "MPS", "mpsConfig": {"defaultActiveThreadPercentage": percent}},
        }
        return ClaimConfig(driver="gpu.nvidia.com", parameters=parameters, source="FromClaim", requests=(request,))

    small = AllocatedDevice(driver="gpu.nvidia.com", pool="p", device="gpu-0", request="small")
    large = AllocatedDevice(driver="gpu.nvidia.com", pool="p", device="gpu-1", request="large")
    mixed = ResourceClaimInfo(
        namespace="n", name=CLAIM, allocated=True, configs=(mps(20, "small"), mps(80, "large")), devices=(small, large)
    )
    with pytest.raises(InvalidGpuRequest) as raised:
        parse_nvidia_sharing(mixed, pod=POD)
    assert raised.value.field == f"resourceclaim/{CLAIM} gpu.nvidia.com config"
    assert raised.value.value == ["large", "small"]
    assert "different sharing settings" in str(raised.value)
    # The same settings written for each request are one setting.
    alike = replace(mixed, configs=(mps(20, "small"), mps(20, "large")))
    request = parse_nvidia_sharing(alike, pod=POD)
    assert request is not None
    assert request.sm_limit_percent == 20


def test_a_gpu_config_without_sharing_or_for_no_allocated_gpu_gives_no_request() -> None:
    bare = ClaimConfig(
        driver="gpu.nvidia.com",
        parameters={"apiVersion": "resource.nvidia.com/v1beta1", "kind": "GpuConfig"},
        source="FromClass",
    )
    claim = ResourceClaimInfo(namespace="n", name=CLAIM, allocated=True, configs=(bare,), devices=(GPU0,))
    assert parse_claim(claim, pod=POD) is None
    nic = AllocatedDevice(driver="rdma.example.com", pool="p", device="mlx5-0", request="nic")
    no_gpu = _mps_claim({"defaultActiveThreadPercentage": 20}, devices=(nic,))
    assert parse_claim(no_gpu, pod=POD) is None


# -- consumed capacity ------------------------------------------------------------------------


def test_consumed_capacity_is_the_guarantee_under_the_mps_limits() -> None:
    request = parse_claim(_claim_info(fixture("resourceclaim_v1_consumed_capacity.json")), pod=POD)
    assert request == GpuRequest(memory_mb=10240, sm_limit_percent=50, source=f"resourceclaim/{CLAIM}/gpu.nvidia.com")
    assert request.entitlement(gpu=A100) == Entitlement(
        guarantee_mem_mb=10240.0, limit_mem_mb=None, guarantee_sm=0.0, limit_sm=54.0
    )


def test_what_the_scheduler_consumed_beats_what_the_claim_asked_and_lifts_a_lower_limit() -> None:
    ours = ClaimConfig(
        driver="vgpu-ledger.io",
        parameters={"memoryMB": 4096, "memoryMBLimit": 8192, "smCount": 8, "smCountLimit": 16},
        source="FromClaim",
    )
    shares = (
        AllocatedDevice(
            driver="gpu.nvidia.com",
            pool="p",
            device="gpu-0-mig-3g40gb-0",
            request="gpu",
            consumed_capacity={"memory": "10Gi", "multiprocessors": "42"},
        ),
        AllocatedDevice(
            driver="gpu.nvidia.com",
            pool="p",
            device="gpu-1-mig-3g40gb-0",
            request="gpu",
            consumed_capacity={"gpu.nvidia.com/memory": "12Gi", "gpu.nvidia.com/multiprocessors": "40"},
        ),
    )
    claim = ResourceClaimInfo(namespace="n", name=CLAIM, allocated=True, configs=(ours,), devices=shares)
    request = parse_claim(claim, pod=POD)
    # The smallest share holds on every card; limits below it are raised to it.
    assert request == GpuRequest(
        memory_mb=10240, memory_limit_mb=10240, sm_count=40, sm_limit=40, source=f"resourceclaim/{CLAIM}"
    )


def test_consumed_capacity_alone_is_a_request() -> None:
    device = AllocatedDevice(
        driver="gpu.example.com", pool="p", device="d", request="gpu", consumed_capacity={"memory": "6000Mi"}
    )
    claim = ResourceClaimInfo(namespace="n", name=CLAIM, allocated=True, configs=(), devices=(device,))
    assert parse_claim(claim, pod=POD) == GpuRequest(memory_mb=6000, source=f"resourceclaim/{CLAIM}")


# -- HAMi ---------------------------------------------------------------------------------------


def test_hami_gpumem_and_gpucores_are_a_share_of_each_vgpu() -> None:
    request = parse_hami_limits(
        (("nvidia.com/gpumem", "3000"), ("nvidia.com/gpucores", "30")), gpu_limit="2", pod=POD, container="resnet"
    )
    assert request == GpuRequest(
        memory_mb=3000, memory_limit_mb=3000, sm_percent=30, sm_limit_percent=30, source="hami"
    )
    assert request.entitlement(gpu=A100) == Entitlement(
        guarantee_mem_mb=3000.0, limit_mem_mb=3000.0, guarantee_sm=32.4, limit_sm=32.4
    )


def test_hami_memory_percentage_and_hamis_defaults() -> None:
    by_percent = parse_hami_limits((("nvidia.com/gpumem-percentage", "25"),), gpu_limit="1", pod=POD, container="c")
    assert by_percent is not None
    assert by_percent.entitlement(gpu=A100) == Entitlement(
        guarantee_mem_mb=20480.0, limit_mem_mb=20480.0, guarantee_sm=0.0, limit_sm=None
    )
    # Cores alone: HAMi gives the vGPU all of the card's memory.
    cores_only = parse_hami_limits((("nvidia.com/gpucores", "50"),), gpu_limit="1", pod=POD, container="c")
    assert cores_only is not None
    assert (cores_only.memory_percent, cores_only.memory_limit_percent, cores_only.sm_percent) == (100, 100, 50)
    assert parse_hami_limits((), gpu_limit="1", pod=POD, container="c") is None


@pytest.mark.parametrize(
    ("limits", "gpu", "field", "problem"),
    [
        ((("nvidia.com/gpucores", "101"),), "1", "nvidia.com/gpucores", "0-100"),
        ((("nvidia.com/gpucores", "50%"),), "1", "nvidia.com/gpucores", "0-100"),
        ((("nvidia.com/gpumem-percentage", "0"),), "1", "nvidia.com/gpumem-percentage", "1-100"),
        ((("nvidia.com/gpumem", "3Gi"),), "1", "nvidia.com/gpumem", "whole number of MiB"),
        (
            (("nvidia.com/gpumem", "3000"), ("nvidia.com/gpumem-percentage", "50")),
            "1",
            "nvidia.com/gpumem-percentage",
            "cannot be given with nvidia.com/gpumem",
        ),
        ((("nvidia.com/gpumem", "3000"),), None, "nvidia.com/gpumem", "need nvidia.com/gpu >= 1"),
        ((("nvidia.com/gpumem", "3000"),), "0", "nvidia.com/gpumem", "need nvidia.com/gpu >= 1"),
    ],
)
def test_invalid_hami_limits_name_the_container_and_resource(
    limits: tuple[tuple[str, str], ...], gpu: str | None, field: str, problem: str
) -> None:
    with pytest.raises(InvalidGpuRequest) as raised:
        parse_hami_limits(limits, gpu_limit=gpu, pod=POD, container="resnet")
    assert raised.value.field == f"containers[resnet].resources.limits[{field}]"
    assert problem in str(raised.value)


# -- resolution of the new sources over the fake API server ------------------------------------


def test_an_mps_claim_on_a_v1beta1_only_api_server_gives_the_mps_limits(
    fake: FakeKubernetes, pods: KubeClientPods, resolver: GpuRequestResolver
) -> None:
    fake.resource_api_versions = ("v1beta1",)
    fake.add_resource_claim(fixture("resourceclaim_v1beta1_mps.json"))
    pod = _add(fake, pods, fixture("pod_dra_claim.json"))
    request = resolver.resolve(workload=_workload(pod, "trainer"))
    assert (request.source, request.memory_limit_mb, request.sm_limit_percent) == (
        f"resourceclaim/{CLAIM}/gpu.nvidia.com",
        10240,
        25,
    )


def test_no_dra_api_gives_the_tenant_default_with_a_log_line_and_a_retry(
    fake: FakeKubernetes,
    pods: KubeClientPods,
    resolver: GpuRequestResolver,
    clock: Clock,
    caplog: pytest.LogCaptureFixture,
) -> None:
    fake.resource_api_versions = ()
    fake.add_resource_claim(fixture("resourceclaim_v1_allocated.json"))
    pod = _add(fake, pods, fixture("pod_dra_claim.json"))
    with caplog.at_level(logging.WARNING, logger="agents.gpu_requests"):
        assert resolver.resolve(workload=_workload(pod, "trainer")) == TENANT_DEFAULT
    assert any(
        "does not serve the resource.k8s.io API group" in r.getMessage() and pod.key in r.getMessage()
        for r in caplog.records
    )
    assert fake.events == []  # the cluster's configuration, not the pod author's mistake
    fake.resource_api_versions = ("v1",)  # DRA turned on
    clock.now_s += 31
    assert resolver.resolve(workload=_workload(pod, "trainer")).memory_mb == 20480


def test_a_hami_pod_gets_its_per_vgpu_share_not_whole_gpus(
    fake: FakeKubernetes, pods: KubeClientPods, resolver: GpuRequestResolver
) -> None:
    pod = _add(fake, pods, fixture("pod_hami.json"))
    request = resolver.resolve(workload=_workload(pod, "resnet"))
    assert (request.source, request.whole_gpus, request.memory_mb, request.sm_percent) == ("hami", 0, 3000, 30)


def test_an_invalid_hami_limit_falls_back_to_the_tenant_default_with_an_event(
    fake: FakeKubernetes, pods: KubeClientPods, resolver: GpuRequestResolver
) -> None:
    manifest = fixture("pod_hami.json")
    manifest["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpucores"] = "130"
    pod = _add(fake, pods, manifest)
    assert resolver.resolve(workload=_workload(pod, "resnet")) == TENANT_DEFAULT
    (event,) = fake.events
    assert event["reason"] == "InvalidGpuRequest"
    assert "containers[resnet].resources.limits[nvidia.com/gpucores]='130'" in event["message"]


def test_an_invalid_gpu_config_in_a_claim_produces_an_event(
    fake: FakeKubernetes, pods: KubeClientPods, resolver: GpuRequestResolver
) -> None:
    claim = fixture("resourceclaim_v1beta2_timeslicing.json")
    claim["status"]["allocation"]["devices"]["config"][0]["opaque"]["parameters"]["sharing"]["strategy"] = "Mps"
    fake.resource_api_versions = ("v1beta2", "v1beta1")
    fake.add_resource_claim(claim)
    pod = _add(fake, pods, fixture("pod_dra_claim.json"))
    assert resolver.resolve(workload=_workload(pod, "trainer")) == TENANT_DEFAULT
    (event,) = fake.events
    assert f"resourceclaim/{CLAIM} gpu.nvidia.com parameters.sharing.strategy='Mps'" in event["message"]
