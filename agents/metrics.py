"""Prometheus ``/metrics`` of the agent (``prometheus-client``), off unless ``--metrics-port``.

Per workload and GPU (labels ``tenant``, ``namespace``, ``pod``, ``container``, ``gpu``):
grants and use of memory (bytes: Prometheus wants base units; the agent's MB are MiB) and SMs, as
of the last tick; series of workloads that
left are removed. Node-wide: tick latency (histogram, seconds of computation per tick),
spool depth by state and undelivered batches (read from the spool at scrape time), upload and event-upload
errors by outcome, and the policy's age and ETag. With per-workload prediction
(``agents.prediction``): the predicted peak over the look-ahead, the rolling under-prediction
rate, the mean over-reservation (forecast above the realised peak) and the online margin, read
from the predictors at scrape time.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from wsgiref.simple_server import WSGIServer

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from agents.interfaces import Grant, UsageReading
from agents.prediction import PredictionStats
from agents.spool import Spool

__all__ = ["AgentMetrics", "MetricsServer", "serve_metrics"]

_WORKLOAD_LABELS = ("tenant", "namespace", "pod", "container", "gpu")
# The agent's "MB" (grants, readings, the wire protocol) are MiB: NVML's bytes / 2^20.
_BYTES_PER_MB = 1024 * 1024
# Tick computation is ~0.1-5 ms on a busy node (docs/benchmarks.md); the top buckets catch stalls.
_TICK_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)


class _SpoolCollector(Collector):
    """Spool depth by state, counted when scraped (the spool is thread-safe)."""

    def __init__(self, spool: Spool) -> None:
        self._spool = spool

    def collect(self) -> Iterable[GaugeMetricFamily]:
        family = GaugeMetricFamily(
            "vgpu_agent_spool_batches", "Usage batches in the spool, by state", labels=["state"]
        )
        for state in ("pending", "dead"):
            family.add_metric([state], float(self._spool.count(state=state)))
        yield family
        # Refused batches no re-drive has replaced yet: usage the service has not billed.
        yield GaugeMetricFamily(
            "vgpu_agent_undelivered_batches",
            "Batches the service refused (400/409/413/415), kept in the spool until re-driven",
            value=float(self._spool.count_undelivered()),
        )
        yield GaugeMetricFamily(
            "vgpu_agent_undelivered_unreported_batches",
            "Undelivered batches the service has not acknowledged a report of yet",
            value=float(self._spool.count_undelivered(unreported=True)),
        )


class _PolicyCollector(Collector):
    def __init__(self, age_s: Callable[[], float | None], etag: Callable[[], str | None]) -> None:
        self._age_s = age_s
        self._etag = etag

    def collect(self) -> Iterable[GaugeMetricFamily]:
        age = self._age_s()
        yield GaugeMetricFamily(
            "vgpu_agent_policy_age_seconds",
            "Seconds since the service last confirmed the node policy (NaN: never; built-in defaults)",
            value=math.nan if age is None else age,
        )
        info = GaugeMetricFamily("vgpu_agent_policy_info", "The node policy in force (1)", labels=["etag"])
        info.add_metric([self._etag() or ""], 1.0)
        yield info


class _PredictionCollector(Collector):
    """Per workload and GPU: what its predictors forecast and how well, as of the last tick."""

    def __init__(self, stats: Callable[[], Sequence[PredictionStats]]) -> None:
        self._stats = stats

    def collect(self) -> Iterable[GaugeMetricFamily]:
        labels = list(_WORKLOAD_LABELS)

        def family(name: str, documentation: str) -> GaugeMetricFamily:
            return GaugeMetricFamily(name, documentation, labels=labels)

        mem_predicted = family(
            "vgpu_agent_memory_predicted_bytes", "Predicted peak memory over the look-ahead (0.5-2 s), bytes"
        )
        sm_predicted = family("vgpu_agent_sm_predicted", "Predicted peak SMs over the look-ahead (0.5-2 s)")
        mem_under = family(
            "vgpu_agent_memory_underprediction_ratio",
            "Share of recent memory forecasts below the use read over their look-ahead",
        )
        sm_under = family(
            "vgpu_agent_sm_underprediction_ratio", "Share of recent SM forecasts below the use read over their look-ahead"
        )
        mem_over = family(
            "vgpu_agent_memory_over_reservation_bytes",
            "Mean of recent memory forecasts above the peak use of their look-ahead (0 if below), bytes",
        )
        sm_over = family(
            "vgpu_agent_sm_over_reservation",
            "Mean of recent SM forecasts above the peak use of their look-ahead (0 if below)",
        )
        mem_margin = family(
            "vgpu_agent_memory_prediction_margin_bytes", "Online calibration margin added to the memory forecast, bytes"
        )
        sm_margin = family("vgpu_agent_sm_prediction_margin", "Online calibration margin added to the SM forecast")
        for s in self._stats():
            w = s.workload
            values = [w.tenant, w.namespace, w.pod, w.container, s.gpu]
            mem_predicted.add_metric(values, s.mem_predicted_mb * _BYTES_PER_MB)
            sm_predicted.add_metric(values, s.sm_predicted)
            mem_margin.add_metric(values, s.mem_margin_mb * _BYTES_PER_MB)
            sm_margin.add_metric(values, s.sm_margin)
            # No series before a workload's first forecast has been checked (2 s after it appeared).
            if s.mem_underprediction_rate is not None:
                mem_under.add_metric(values, s.mem_underprediction_rate)
            if s.sm_underprediction_rate is not None:
                sm_under.add_metric(values, s.sm_underprediction_rate)
            if s.mem_over_reservation_mb is not None:
                mem_over.add_metric(values, s.mem_over_reservation_mb * _BYTES_PER_MB)
            if s.sm_over_reservation is not None:
                sm_over.add_metric(values, s.sm_over_reservation)
        yield from (mem_predicted, sm_predicted, mem_under, sm_under, mem_over, sm_over, mem_margin, sm_margin)


class AgentMetrics:
    """The agent's metrics on their own registry (several agents in one test process stay apart)."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        r = self.registry
        self.mem_granted = Gauge(
            "vgpu_agent_memory_granted_bytes", "Memory granted to a workload on a GPU, bytes", _WORKLOAD_LABELS,
            registry=r,
        )
        self.mem_used = Gauge(
            "vgpu_agent_memory_used_bytes", "Memory a workload holds on a GPU, bytes", _WORKLOAD_LABELS, registry=r
        )
        self.sm_granted = Gauge(
            "vgpu_agent_sm_granted", "SMs granted to a workload on a GPU", _WORKLOAD_LABELS, registry=r
        )
        self.sm_used = Gauge(
            "vgpu_agent_sm_used", "SMs a workload keeps busy on a GPU (utilisation x SM count)", _WORKLOAD_LABELS,
            registry=r,
        )
        self.tick_seconds = Histogram(
            "vgpu_agent_tick_seconds", "Computation time of one allocation tick, s", buckets=_TICK_BUCKETS, registry=r
        )
        self.upload_errors = Counter(
            "vgpu_agent_upload_errors", "Usage batch uploads that did not deliver, by outcome", ["outcome"], registry=r
        )
        self._series: set[tuple[str, ...]] = set()

    def watch_spool(self, spool: Spool) -> None:
        self.registry.register(_SpoolCollector(spool))

    def watch_policy(self, *, age_s: Callable[[], float | None], etag: Callable[[], str | None]) -> None:
        self.registry.register(_PolicyCollector(age_s, etag))

    def watch_predictions(self, stats: Callable[[], Sequence[PredictionStats]]) -> None:
        """Export the per-workload predictors' ``stats`` (``WorkloadPredictors.stats``) at scrape time."""
        self.registry.register(_PredictionCollector(stats))

    def observe(self, *, grants: Sequence[Grant], readings: Sequence[UsageReading]) -> None:
        """Grants and use of this tick; the series of workloads no longer present are removed."""
        used = {(r.gpu, r.workload.key): r for r in readings}
        series: set[tuple[str, ...]] = set()
        for g in grants:
            w = g.workload
            labels = (w.tenant, w.namespace, w.pod, w.container, g.gpu)
            series.add(labels)
            self.mem_granted.labels(*labels).set(g.mem_mb * _BYTES_PER_MB)
            self.sm_granted.labels(*labels).set(g.sm)
            reading = used.get((g.gpu, w.key))
            self.mem_used.labels(*labels).set(reading.mem_used_mb * _BYTES_PER_MB if reading is not None else 0.0)
            self.sm_used.labels(*labels).set(reading.sm_used if reading is not None else 0.0)
        for gone in self._series - series:
            for gauge in (self.mem_granted, self.mem_used, self.sm_granted, self.sm_used):
                gauge.remove(*gone)
        self._series = series

    def record_tick(self, seconds: float) -> None:
        self.tick_seconds.observe(seconds)

    def record_upload_error(self, outcome: str) -> None:
        self.upload_errors.labels(outcome).inc()


@dataclass
class MetricsServer:
    server: WSGIServer
    address: str

    @property
    def port(self) -> int:
        return int(self.server.server_port)

    @property
    def url(self) -> str:
        return f"http://{self.address}:{self.port}/metrics"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def serve_metrics(metrics: AgentMetrics, *, address: str = "127.0.0.1", port: int) -> MetricsServer:
    """Serve ``/metrics`` on a daemon thread; ``port=0`` takes a free port (see ``MetricsServer.port``)."""
    server, _thread = start_http_server(port, addr=address, registry=metrics.registry)
    return MetricsServer(server=server, address=address)
