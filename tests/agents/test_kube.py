"""KubeClientPods: the real ``kubernetes`` client over HTTP against ``FakeKubernetes``."""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import requests
from kubernetes import client

from agents.fakes.kube import FakeKubernetes
from agents.kube import (
    AllocatedDevice,
    ClaimApiUnavailable,
    EvictionOutcome,
    KubeClientPods,
    container_id_from_status,
    pod_info_from_model,
)
from tests.agents.helpers import wait_until

FIXTURES = Path(__file__).parent / "fixtures"
NODE = "gpu-node-17"
SERVER_ID = "a3f9c2e17b4d5e6f8091a2b3c4d5e6f708192a3b4c5d6e7f8091a2b3c4d5e6f7"
SIDECAR_ID = "5b1f0c7e3d2a9b8c7d6e5f4a3b2c1d0e9f8a7b6c5d4e3f2a1b0c9d8e7f6a5b4c"


def fixture(name: str) -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads((FIXTURES / name).read_text())
    return loaded


def pod_named(name: str, *, container_id: str, node: str = NODE, namespace: str = "acme-prod") -> dict[str, Any]:
    """The recorded GPU pod under another name, uid and container id."""
    pod = copy.deepcopy(fixture("pod_gpu_containerd.json"))
    pod["metadata"].update(name=name, namespace=namespace)
    del pod["metadata"]["uid"]
    pod["spec"]["nodeName"] = node
    pod["status"]["containerStatuses"][1]["containerID"] = f"containerd://{container_id}"
    sidecar_id = ("e" if container_id[0] != "e" else "d") + container_id[1:]
    pod["status"]["containerStatuses"][0]["containerID"] = f"containerd://{sidecar_id}"
    return pod


@pytest.fixture
def fake() -> Iterator[FakeKubernetes]:
    with FakeKubernetes() as server:
        server.add_namespace(fixture("namespace_labelled.json"))
        yield server


@pytest.fixture
def pods(fake: FakeKubernetes) -> Iterator[KubeClientPods]:
    api = client.ApiClient(client.Configuration(host=fake.url))
    cache = KubeClientPods(
        api_client=api, node=NODE, retry_delay_s=0.05, now=lambda: datetime(2026, 11, 30, 3, 0, tzinfo=UTC)
    )
    cache.start()
    yield cache
    cache.stop()


def test_pod_info_reads_container_ids_gpu_limits_and_claims_from_recorded_pods() -> None:
    gpu_pod = pod_info_from_model(client.V1Pod.model_validate(fixture("pod_gpu_containerd.json")))
    dra_pod = pod_info_from_model(client.V1Pod.model_validate(fixture("pod_dra_claim.json")))

    server = gpu_pod.container("server")
    assert server is not None
    assert server.container_id == SERVER_ID
    assert server.gpu_limit == "1"
    sidecar = gpu_pod.container("metrics-sidecar")
    assert sidecar is not None
    assert sidecar.container_id == SIDECAR_ID
    assert sidecar.gpu_limit is None
    assert gpu_pod.labels["vgpu-ledger.io/sla-tier"] == "gold"
    # A claim from a template is named in status.resourceClaimStatuses.
    trainer = dra_pod.container("trainer")
    assert trainer is not None
    assert trainer.claims == ("trainer-0-gpu-7x2lq",)
    assert trainer.container_id == "0f1e2d3c4b5a69788796a5b4c3d2e1f00f1e2d3c4b5a69788796a5b4c3d2e1f0"


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("containerd://abc", "abc"),
        ("cri-o://abc", "abc"),
        ("docker://abc", "abc"),
        ("", None),
        (None, None),
    ],
)
def test_container_id_from_status_strips_the_runtime_scheme(raw: str | None, expected: str | None) -> None:
    assert container_id_from_status(raw) == expected


def test_start_lists_only_this_nodes_pods_with_a_field_selector(fake: FakeKubernetes) -> None:
    fake.add_pod(pod_named("here", container_id="1" * 64))
    fake.add_pod(pod_named("elsewhere", container_id="2" * 64, node="gpu-node-3"))
    cache = KubeClientPods(api_client=client.ApiClient(client.Configuration(host=fake.url)), node=NODE)
    cache.start()
    try:
        assert [p.name for p in cache.pods()] == ["here"]
        assert cache.lookup("2" * 64) is None
        listed = [r for r in fake.requests if r.path == "/api/v1/pods" and "watch" not in r.query]
        assert listed[0].query["fieldSelector"] == f"spec.nodeName={NODE}"
    finally:
        cache.stop()


def test_watch_follows_pods_added_modified_and_deleted(fake: FakeKubernetes, pods: KubeClientPods) -> None:
    stored = fake.add_pod(pod_named("bert", container_id="3" * 64))
    wait_until(lambda: pods.lookup("3" * 64) is not None, what="pod added")
    found = pods.lookup("3" * 64)
    assert found is not None
    assert found[0].uid == stored["metadata"]["uid"]
    assert found[1].name == "server"

    # A container restart: the status names a new id, the old one no longer maps.
    stored["status"]["containerStatuses"][1]["containerID"] = "containerd://" + "4" * 64
    fake.update_pod(stored)
    wait_until(lambda: pods.lookup("4" * 64) is not None, what="pod modified")
    assert pods.lookup("3" * 64) is None

    fake.delete_pod("acme-prod", "bert")
    wait_until(lambda: pods.lookup_pod(stored["metadata"]["uid"]) is None, what="pod deleted")
    assert pods.lookup("4" * 64) is None


def test_a_pod_bound_to_this_node_after_creation_arrives_through_the_watch(
    fake: FakeKubernetes, pods: KubeClientPods
) -> None:
    pending = pod_named("late", container_id="5" * 64, node="")
    stored = fake.add_pod(pending)
    stored["spec"]["nodeName"] = NODE
    fake.update_pod(stored)
    wait_until(lambda: pods.lookup("5" * 64) is not None, what="bound pod seen")


def test_namespace_labels_follow_the_namespace_watch(fake: FakeKubernetes, pods: KubeClientPods) -> None:
    assert pods.namespace_labels("acme-prod") == {
        "kubernetes.io/metadata.name": "acme-prod",
        "vgpu-ledger.io/tenant": "acme",
    }
    fake.add_namespace({"metadata": {"name": "globex", "labels": {"vgpu-ledger.io/tenant": "globex-corp"}}})
    wait_until(lambda: pods.namespace_labels("globex") is not None, what="namespace added")
    fake.update_namespace({"metadata": {"name": "globex", "labels": {}}})
    wait_until(lambda: pods.namespace_labels("globex") == {}, what="label removed")
    fake.delete_namespace("globex")
    wait_until(lambda: pods.namespace_labels("globex") is None, what="namespace deleted")


def test_watch_resumes_from_its_resource_version_when_the_server_ends_it(fake: FakeKubernetes) -> None:
    cache = KubeClientPods(
        api_client=client.ApiClient(client.Configuration(host=fake.url)), node=NODE, watch_timeout_s=1
    )
    cache.start()
    try:
        fake.add_pod(pod_named("before", container_id="6" * 64))
        wait_until(lambda: cache.lookup("6" * 64) is not None, what="first pod")
        # Past the 1 s server-side timeout the client re-watches; changes keep arriving.
        wait_until(
            lambda: sum(1 for r in fake.requests if r.path == "/api/v1/pods" and r.query.get("watch")) >= 2,
            what="second pod watch",
        )
        fake.add_pod(pod_named("after", container_id="7" * 64))
        wait_until(lambda: cache.lookup("7" * 64) is not None, what="pod after reconnect")
        assert cache.relists == 0
        resumed = [r for r in fake.requests if r.path == "/api/v1/pods" and r.query.get("watch")]
        assert all(r.query.get("resourceVersion") not in (None, "", "0") for r in resumed)
    finally:
        cache.stop()


def test_watch_relists_after_410_gone_and_drops_pods_deleted_meanwhile(
    fake: FakeKubernetes, pods: KubeClientPods
) -> None:
    fake.add_pod(pod_named("old", container_id="8" * 64))
    wait_until(lambda: pods.lookup("8" * 64) is not None, what="old pod")
    with fake.watches_held():
        fake.delete_pod("acme-prod", "old")
        fake.add_pod(pod_named("new", container_id="9" * 64))
        fake.compact()
    wait_until(lambda: pods.lookup("9" * 64) is not None, what="new pod after relist")
    assert pods.lookup("8" * 64) is None
    assert pods.relists >= 1


def test_evict_posts_a_policy_v1_eviction_with_a_uid_precondition_and_an_event(
    fake: FakeKubernetes, pods: KubeClientPods
) -> None:
    stored = fake.add_pod(pod_named("hog", container_id="a" * 64))
    uid = stored["metadata"]["uid"]

    outcome = pods.evict(
        namespace="acme-prod", pod="hog", pod_uid=uid, reason="GpuMemoryOverGrant", message="used 30 GiB of 16 GiB"
    )

    assert outcome is EvictionOutcome.EVICTED
    assert fake.evictions == [
        {
            "apiVersion": "policy/v1",
            "kind": "Eviction",
            "metadata": {"name": "hog", "namespace": "acme-prod"},
            "deleteOptions": {"preconditions": {"uid": uid}},
        }
    ]
    assert "deletionTimestamp" in fake.get_pod("acme-prod", "hog")["metadata"]
    (event,) = fake.events
    assert event["involvedObject"] == {
        "apiVersion": "v1",
        "kind": "Pod",
        "name": "hog",
        "namespace": "acme-prod",
        "uid": uid,
    }
    assert (event["reason"], event["type"], event["message"]) == (
        "GpuMemoryOverGrant",
        "Warning",
        "used 30 GiB of 16 GiB",
    )
    assert event["source"] == {"component": "vgpu-ledger-agent", "host": NODE}


def test_evict_reports_a_disruption_budget_refusal_and_a_vanished_pod(
    fake: FakeKubernetes, pods: KubeClientPods
) -> None:
    stored = fake.add_pod(pod_named("guarded", container_id="b" * 64))
    fake.refuse_evictions = True
    assert pods.evict(namespace="acme-prod", pod="guarded", reason="r", message="m") is EvictionOutcome.REFUSED
    fake.refuse_evictions = False
    assert pods.evict(namespace="acme-prod", pod="missing", reason="r", message="m") is EvictionOutcome.GONE
    # A same-named replacement (another uid) is not evicted.
    assert (
        pods.evict(
            namespace="acme-prod", pod="guarded", pod_uid="not-" + stored["metadata"]["uid"], reason="r", message="m"
        )
        is EvictionOutcome.GONE
    )
    assert fake.evictions == []
    assert fake.events == []


def test_get_resource_claim_reads_the_allocated_configs(fake: FakeKubernetes, pods: KubeClientPods) -> None:
    fake.add_resource_claim(fixture("resourceclaim_v1_allocated.json"))
    claim = pods.get_resource_claim(namespace="acme-research", name="trainer-0-gpu-7x2lq")
    assert claim is not None
    assert claim.allocated
    assert [(c.source, c.driver) for c in claim.configs] == [
        ("FromClass", "gpu.nvidia.com"),
        ("FromClaim", "vgpu-ledger.io"),
    ]
    assert claim.configs[1].parameters["memoryMB"] == 20480
    assert pods.get_resource_claim(namespace="acme-research", name="absent") is None


def test_an_unallocated_claim_offers_its_spec_configs(fake: FakeKubernetes, pods: KubeClientPods) -> None:
    pending = fixture("resourceclaim_v1_allocated.json")
    del pending["status"]
    fake.add_resource_claim(pending)
    claim = pods.get_resource_claim(namespace="acme-research", name="trainer-0-gpu-7x2lq")
    assert claim is not None
    assert not claim.allocated
    assert [(c.source, c.driver) for c in claim.configs] == [("Spec", "vgpu-ledger.io")]


def test_fake_answers_an_expired_watch_with_the_api_servers_410_error_event(fake: FakeKubernetes) -> None:
    listed = requests.get(f"{fake.url}/api/v1/namespaces", timeout=5).json()
    fake.compact()
    response = requests.get(
        f"{fake.url}/api/v1/namespaces",
        params={"watch": "true", "resourceVersion": listed["metadata"]["resourceVersion"], "timeoutSeconds": "1"},
        timeout=5,
    )
    assert response.status_code == 200
    assert response.headers["Transfer-Encoding"] == "chunked"
    (line,) = [raw for raw in response.text.splitlines() if raw]
    event = json.loads(line)
    assert event["type"] == "ERROR"
    assert (event["object"]["kind"], event["object"]["code"], event["object"]["reason"]) == ("Status", 410, "Expired")


def test_fake_rejects_field_selectors_the_api_server_does_not_support(fake: FakeKubernetes) -> None:
    core = client.CoreV1Api(client.ApiClient(client.Configuration(host=fake.url)))
    with pytest.raises(client.ApiException) as raised:
        core.list_pod_for_all_namespaces(field_selector="spec.schedulerName=default-scheduler")
    assert raised.value.status == 400


# -- resource.k8s.io in whichever version is served ------------------------------------------

CLAIM = "trainer-0-gpu-7x2lq"
DISCOVERY = "/apis/resource.k8s.io/"


def _reads(fake: FakeKubernetes, path_part: str) -> list[str]:
    return [r.path for r in fake.requests if path_part in r.path]


@pytest.mark.parametrize(
    ("served", "expected"),
    [
        (("v1", "v1beta2", "v1beta1"), "v1"),  # 1.34+
        (("v1beta1", "v1beta2"), "v1beta2"),  # 1.33, whichever the server prefers
        (("v1beta1",), "v1beta1"),  # 1.32
    ],
)
def test_claims_are_read_in_the_most_preferred_version_served_discovered_once(
    fake: FakeKubernetes, pods: KubeClientPods, served: tuple[str, ...], expected: str
) -> None:
    fake.resource_api_versions = served
    fake.add_resource_claim(fixture("resourceclaim_v1beta1_mps.json"))  # stored as the API server converts it

    first = pods.get_resource_claim(namespace="acme-research", name=CLAIM)
    again = pods.get_resource_claim(namespace="acme-research", name=CLAIM)

    assert first == again
    assert first is not None
    assert first.api_version == f"resource.k8s.io/{expected}"
    assert first.allocated
    assert [(c.source, c.driver, c.requests) for c in first.configs] == [("FromClaim", "gpu.nvidia.com", ("gpu",))]
    assert first.configs[0].parameters["sharing"]["mpsConfig"]["defaultPinnedDeviceMemoryLimit"] == "10Gi"
    assert (
        _reads(fake, "/resourceclaims/")
        == [f"/apis/resource.k8s.io/{expected}/namespaces/acme-research/resourceclaims/{CLAIM}"] * 2
    )
    assert _reads(fake, DISCOVERY).count(DISCOVERY) == 1


def test_the_fake_serves_v1beta1_claims_in_their_own_shape(fake: FakeKubernetes) -> None:
    fake.resource_api_versions = ("v1", "v1beta1")
    fake.add_resource_claim(fixture("resourceclaim_v1_allocated.json"))
    url = f"{fake.url}/apis/resource.k8s.io/{{}}/namespaces/acme-research/resourceclaims/{CLAIM}"
    beta = requests.get(url.format("v1beta1"), timeout=5).json()
    ga = requests.get(url.format("v1"), timeout=5).json()
    assert beta["apiVersion"] == "resource.k8s.io/v1beta1"
    assert beta["spec"]["devices"]["requests"] == [
        {"name": "gpu", "deviceClassName": "gpu.nvidia.com", "allocationMode": "ExactCount", "count": 1}
    ]
    assert ga["spec"]["devices"]["requests"][0]["exactly"]["deviceClassName"] == "gpu.nvidia.com"
    assert requests.get(url.format("v1beta2"), timeout=5).status_code == 404  # not served


def test_a_claim_is_read_in_the_new_version_when_an_upgrade_stops_serving_the_old_one(
    fake: FakeKubernetes, pods: KubeClientPods
) -> None:
    fake.resource_api_versions = ("v1beta1",)
    fake.add_resource_claim(fixture("resourceclaim_v1_allocated.json"))
    before = pods.get_resource_claim(namespace="acme-research", name=CLAIM)
    assert before is not None
    assert before.api_version == "resource.k8s.io/v1beta1"

    fake.resource_api_versions = ("v1",)  # the beta turned off by the upgrade
    after = pods.get_resource_claim(namespace="acme-research", name=CLAIM)

    assert after is not None
    assert after.api_version == "resource.k8s.io/v1"
    assert after.configs == before.configs
    assert after.devices == before.devices
    assert _reads(fake, DISCOVERY).count(DISCOVERY) == 2
    # A claim missing in a version still served is missing: one more discovery, no retry loop.
    assert pods.get_resource_claim(namespace="acme-research", name="absent") is None
    assert _reads(fake, DISCOVERY).count(DISCOVERY) == 3


@pytest.mark.parametrize(
    ("served", "problem"),
    [
        ((), "does not serve the resource.k8s.io API group"),
        (("v1alpha3",), "serves resource.k8s.io v1alpha3, none of v1, v1beta2, v1beta1"),
    ],
)
def test_an_api_server_without_a_readable_dra_version_is_an_error_not_a_missing_claim(
    fake: FakeKubernetes, pods: KubeClientPods, served: tuple[str, ...], problem: str
) -> None:
    fake.resource_api_versions = served
    with pytest.raises(ClaimApiUnavailable, match=problem):
        pods.get_resource_claim(namespace="acme-research", name=CLAIM)


def test_allocation_results_carry_consumed_capacity_and_the_share_id(
    fake: FakeKubernetes, pods: KubeClientPods
) -> None:
    fake.add_resource_claim(fixture("resourceclaim_v1_consumed_capacity.json"))
    claim = pods.get_resource_claim(namespace="acme-research", name=CLAIM)
    assert claim is not None
    assert claim.devices == (
        AllocatedDevice(
            driver="gpu.nvidia.com",
            pool="gpu-node-17",
            device="gpu-0",
            request="gpu",
            consumed_capacity={"memory": "10Gi"},
            share_id="5f0c2a9e-7b41-4d8e-9a63-2c1e0b7d4f85",
        ),
    )


def test_pod_info_keeps_hamis_share_limits_with_the_vgpu_count() -> None:
    pod = pod_info_from_model(client.V1Pod.model_validate(fixture("pod_hami.json")))
    resnet = pod.container("resnet")
    assert resnet is not None
    assert resnet.gpu_limit == "2"
    assert resnet.hami_limits == (("nvidia.com/gpumem", "3000"), ("nvidia.com/gpucores", "30"))
