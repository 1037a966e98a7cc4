"""The agent's Prometheus endpoint, scraped over loopback."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import requests
from prometheus_client.parser import text_string_to_metric_families

from agents.interfaces import Grant, UsageReading, Workload
from agents.metrics import AgentMetrics, MetricsServer, serve_metrics
from agents.spool import Spool
from agents.uploader import Outcome

NOW = datetime(2026, 11, 30, 3, 0, 0, tzinfo=UTC)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def spool(tmp_path: Path) -> Iterator[Spool]:
    opened = Spool(tmp_path / "spool.sqlite", node="gpu-node-03", now=lambda: NOW)
    yield opened
    opened.close()


@pytest.fixture
def served(spool: Spool) -> Iterator[tuple[AgentMetrics, MetricsServer]]:
    metrics = AgentMetrics()
    metrics.watch_spool(spool)
    metrics.watch_policy(age_s=lambda: 12.5, etag=lambda: '"abc"')
    server = serve_metrics(metrics, address="127.0.0.1", port=free_port())
    yield metrics, server
    server.close()


def workload(pod: str) -> Workload:
    return Workload(tenant="acme", namespace="acme-prod", pod=pod, container="server", pod_uid=pod, sla_tier="gold")


def scrape(server: MetricsServer) -> str:
    response = requests.get(server.url, timeout=5)
    assert response.status_code == 200
    return response.text


def value_of(text: str, name: str, **labels: str) -> float:
    """The one sample of `name` whose labels include `labels`."""
    values = [s.value for family in text_string_to_metric_families(text) for s in family.samples
              if s.name == name and labels.items() <= s.labels.items()]
    assert len(values) == 1, (name, labels, values)
    return float(values[0])


def test_grants_use_ticks_spool_uploads_and_policy_are_exposed(
    served: tuple[AgentMetrics, MetricsServer], spool: Spool
) -> None:
    metrics, server = served
    w = workload("bert-1")
    metrics.observe(
        grants=[Grant(workload=w, gpu="GPU-1", mem_mb=512.0, sm=13.5)],
        readings=[UsageReading(workload=w, gpu="GPU-1", mem_used_mb=312.5, sm_used=7.75, pcie_mb_per_s=0.0)],
    )
    metrics.record_tick(0.002)
    metrics.record_upload_error(Outcome.RETRY.value)
    spool.store_batch(window_start=NOW, window_end=NOW + timedelta(seconds=10), render=lambda seq: b"{}")
    text = scrape(server)
    labels = 'container="server",gpu="GPU-1",namespace="acme-prod",pod="bert-1",tenant="acme"'
    # Bytes, Prometheus's base unit: the agent's MB are MiB.
    assert value_of(text, "vgpu_agent_memory_granted_bytes", pod="bert-1") == 512 * 2**20
    assert value_of(text, "vgpu_agent_memory_used_bytes", pod="bert-1") == 312.5 * 2**20
    assert f"vgpu_agent_sm_granted{{{labels}}} 13.5" in text
    assert f"vgpu_agent_sm_used{{{labels}}} 7.75" in text
    assert "vgpu_agent_tick_seconds_count 1.0" in text
    assert 'vgpu_agent_tick_seconds_bucket{le="0.0025"} 1.0' in text
    assert 'vgpu_agent_spool_batches{state="pending"} 1.0' in text
    assert 'vgpu_agent_spool_batches{state="dead"} 0.0' in text
    assert 'vgpu_agent_upload_errors_total{outcome="retry"} 1.0' in text
    assert "vgpu_agent_policy_age_seconds 12.5" in text
    assert 'vgpu_agent_policy_info{etag="\\"abc\\""} 1.0' in text


def test_a_workload_that_left_has_no_series_any_more(served: tuple[AgentMetrics, MetricsServer]) -> None:
    metrics, server = served
    staying, leaving = workload("stays"), workload("leaves")
    metrics.observe(
        grants=[Grant(workload=w, gpu="GPU-1", mem_mb=1.0, sm=1.0) for w in (staying, leaving)], readings=[]
    )
    metrics.observe(grants=[Grant(workload=staying, gpu="GPU-1", mem_mb=1.0, sm=1.0)], readings=[])
    text = scrape(server)
    assert 'pod="stays"' in text
    assert 'pod="leaves"' not in text


def test_the_endpoint_binds_loopback_only_by_default(served: tuple[AgentMetrics, MetricsServer]) -> None:
    _, server = served
    assert server.server.server_address[0] == "127.0.0.1"
