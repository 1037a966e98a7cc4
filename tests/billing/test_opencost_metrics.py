"""OpenCost's GPU metric families at /metrics/opencost (billing.metrics.OpenCostCollector): the names,
types and label sets of OpenCost's pkg/costmodel/metrics.go, with values from the last complete hour
of the hour ledger, and nothing from any other hour."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

import pytest
from django.test import Client
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families

from billing.ledger.models import GpuHour, UsageHour
from billing.metrics import render_opencost_metrics
from billing.models import Node

pytestmark = pytest.mark.django_db

D = Decimal
NOW = datetime(2031, 5, 14, 10, 17, 42, tzinfo=UTC)
LAST_HOUR = datetime(2031, 5, 14, 9, tzinfo=UTC)  # the last complete hour at NOW
TOKEN = "opencost-scrape-token"
_ZEROS = {f: D(0) for f in ("mem_billed_mb_s", "sm_billed_s", "pcie_mb", "mem_granted_mb_s", "sm_granted_s",
                            "mem_used_mb_s", "sm_used_s")}
NODE_LABELS = {"instance", "node", "instance_type", "region", "provider_id", "arch"}
CONTAINER_LABELS = {"namespace", "pod", "container", "instance", "node"}


def card(node: Node, gpu: str, hour: datetime, *, cost: str, seconds: str = "3600", priced: bool = True,
         currency: str = "USD") -> None:
    GpuHour.objects.create(gpu_uuid=gpu, node=node, gpu_model="A100", hour=hour, metered_seconds=D(seconds),
                           card_cost=D(cost), charged=D(0), idle_cost=D(cost), idle_allocated=D(0),
                           currency=currency if priced else "", priced=priced)


def use(node: Node, gpu: str, hour: datetime, *, pod: str, share: str, container: str = "main",
        namespace: str = "acme-prod") -> None:
    UsageHour.objects.create(gpu_uuid=gpu, node=node, tenant="acme", namespace=namespace, pod=pod,
                             container=container, pod_uid=f"uid-{pod}", sla_tier="gold", seconds=D(3600),
                             share_gpu_s=D(share), charge=D(0), idle_share=D(0), hour=hour, **_ZEROS)


def families(text: str) -> dict[str, Any]:
    return {f.name: f for f in text_string_to_metric_families(text)}


def samples(family: Any) -> dict[tuple[tuple[str, str], ...], float]:
    return {tuple(sorted(s.labels.items())): s.value for s in family.samples}


def node_key(node: str) -> tuple[tuple[str, str], ...]:
    return tuple(sorted({"instance": node, "node": node, "instance_type": "", "region": "", "provider_id": "",
                         "arch": ""}.items()))


def test_the_last_complete_hour_as_opencosts_gpu_families() -> None:
    a = Node.objects.create(name="gpu-a", cluster="east")
    b = Node.objects.create(name="gpu-b", cluster="west")
    Node.objects.create(name="cpu-only")  # no cluster, no GPU rows: in no family
    card(a, "GPU-a0", LAST_HOUR, cost="3")
    card(a, "GPU-a1", LAST_HOUR, cost="1.5", seconds="1800")  # metered half the hour: 3 per GPU-hour too
    card(b, "GPU-b0", LAST_HOUR, cost="0", priced=False)  # no rate card: counted, not priced
    use(a, "GPU-a0", LAST_HOUR, pod="bert", share="1800")
    use(a, "GPU-a1", LAST_HOUR, pod="bert", share="900")  # the same container on a second card: summed
    use(b, "GPU-b0", LAST_HOUR, pod="llm", share="3600", namespace="globex-prod", container="server")
    # The current hour and the one before the last are not the last complete hour.
    for other in (LAST_HOUR + timedelta(hours=1), LAST_HOUR - timedelta(hours=1)):
        card(a, "GPU-a0", other, cost="99")
        use(a, "GPU-a0", other, pod="other", share="3600")

    got = families(render_opencost_metrics(now=NOW).decode())

    assert {name: f.type for name, f in got.items()} == {
        "node_gpu_count": "gauge", "node_gpu_hourly_cost": "gauge", "container_gpu_allocation": "gauge",
        "kubecost_cluster_info": "gauge"}
    assert samples(got["node_gpu_count"]) == {node_key("gpu-a"): 2, node_key("gpu-b"): 1}
    assert samples(got["node_gpu_hourly_cost"]) == {node_key("gpu-a"): pytest.approx(3.0)}
    allocation = {(s.labels["namespace"], s.labels["pod"], s.labels["container"], s.labels["node"]): s.value
                  for s in got["container_gpu_allocation"].samples}
    assert allocation == {("acme-prod", "bert", "main", "gpu-a"): 0.75, ("globex-prod", "llm", "server", "gpu-b"): 1.0}
    assert all(set(s.labels) == CONTAINER_LABELS and s.labels["instance"] == s.labels["node"]
               for s in got["container_gpu_allocation"].samples)
    assert all(set(s.labels) == NODE_LABELS for s in got["node_gpu_count"].samples)
    assert {(s.labels["id"], s.labels["name"], s.value) for s in got["kubecost_cluster_info"].samples} == {
        ("east", "east", 1), ("west", "west", 1)}


def test_a_node_priced_in_two_currencies_in_the_hour_has_a_count_and_no_price() -> None:
    node = Node.objects.create(name="gpu-mixed")
    card(node, "GPU-0", LAST_HOUR, cost="3", currency="USD")
    card(node, "GPU-1", LAST_HOUR, cost="3", currency="EUR")
    got = families(render_opencost_metrics(now=NOW).decode())
    assert samples(got["node_gpu_count"]) == {node_key("gpu-mixed"): 2}
    assert samples(got["node_gpu_hourly_cost"]) == {}


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(shares=st.lists(st.tuples(st.integers(0, 3), st.integers(0, 2), st.integers(1, 3600)), min_size=1,
                       max_size=12))
def test_the_allocation_series_add_up_to_the_hours_share(shares: list[tuple[int, int, int]]) -> None:
    """Σ container_gpu_allocation × 3600 = Σ share_gpu_s of the hour, per node and in all."""
    UsageHour.objects.all().delete()
    node = Node.objects.get_or_create(name="gpu-h")[0]
    for pod, gpu, share in shares:
        use(node, f"GPU-{gpu}", LAST_HOUR, pod=f"pod-{pod}", share=str(share))
    got = families(render_opencost_metrics(now=NOW).decode())
    total = sum(s.value for s in got["container_gpu_allocation"].samples)
    assert total * 3600 == pytest.approx(sum(share for _, _, share in shares))
    assert len(got["container_gpu_allocation"].samples) == len({pod for pod, _, _ in shares})


def test_the_endpoint_takes_the_scrape_token(client: Client, settings: Any, time_machine: Any) -> None:
    time_machine.move_to(NOW, tick=False)
    settings.VGPU_METRICS_TOKEN, settings.VGPU_METRICS_TOKEN_FILE = TOKEN, ""
    card(Node.objects.create(name="gpu-a"), "GPU-a0", LAST_HOUR, cost="2")
    assert client.get("/metrics/opencost").status_code == 401
    assert client.get("/metrics/opencost", HTTP_AUTHORIZATION="Bearer wrong").status_code == 401
    answer = client.get("/metrics/opencost", HTTP_AUTHORIZATION=f"Bearer {TOKEN}")
    assert answer.status_code == 200
    assert answer["Content-Type"].startswith("text/plain; version=0.0.4")
    assert samples(families(answer.content.decode())["node_gpu_hourly_cost"]) == {node_key("gpu-a"): 2.0}
    # The service's own families stay at /metrics, without OpenCost's.
    own = families(client.get("/metrics", HTTP_AUTHORIZATION=f"Bearer {TOKEN}").content.decode())
    assert "vgpu_ledger_batches_pending" in own
    assert "node_gpu_count" not in own
