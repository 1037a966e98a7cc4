"""The service's Prometheus metrics, served at /metrics (billing.web.metrics).

Two kinds, each made correct under several gunicorn workers in its own way:

- **State of the ledger** (backlog, rollup lag, quarantined and undelivered batches, billing
  periods, budgets, this month's cost, GPUs of unapproved models, rebalance executions by outcome)
  is read from Postgres by
  `LedgerCollector` at each scrape,
  so it is the same answer whichever worker serves the scrape, and is never stale.
- **Events seen by a process** (samples ingested, ingest answers, admission reviews) are
  prometheus_client counters. Under gunicorn they run in multiprocess mode: config/gunicorn.conf.py
  points PROMETHEUS_MULTIPROC_DIR at a directory, wiped when the master starts, where every worker
  keeps its counts in a memory-mapped file; a scrape sums the files of all workers, live and dead,
  so a counter never goes back while the master lives (Prometheus's rate() handles a pod restart).
  Without that variable (runserver, tests in one process) the counters are the process's own.

The ingest counter is not derived from the database (Σ sample_count of stored batches would be
exact too) because that sum reads every batch ever stored at every scrape of every pod.

Every figure is in base units (seconds; money in the currency's major unit, as a float: display
only, never billing). No tenant name is in a label: budgets are counted by state and action.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable
from datetime import UTC, datetime, timedelta
from pathlib import Path

from django.conf import settings
from django.utils import timezone
from prometheus_client import CollectorRegistry, Counter, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from billing.ledger.gpu_metrics import gpu_hour_state, known_clusters
from billing.ledger.retention import get_retention_state
from billing.queries.ledger_state import PERIOD_STATES, get_ledger_state
from billing.services.fleet import count_executions
from billing.services.identity import configured_token
from billing.services.ingest import count_claim_mismatches_by_node
from billing.services.pricing import count_unapproved_gpus

__all__ = [
    "ADMISSION_RESULTS",
    "LedgerCollector",
    "OpenCostCollector",
    "count_admission_review",
    "count_ingest_answer",
    "count_ingested_samples",
    "render_metrics",
    "render_opencost_metrics",
    "scrape_token",
]

ADMISSION_RESULTS = ("allowed", "denied", "unauthenticated", "invalid", "failed_open", "failed_closed")

# registry=None: the counters are not in prometheus_client's global registry; render_metrics
# builds the registry of each scrape (multiprocess files, or these objects).
_INGEST_SAMPLES = Counter("vgpu_ledger_ingest_samples", "Samples stored by ingest (duplicates not counted)",
                          registry=None)
_INGEST_BATCHES = Counter("vgpu_ledger_ingest_batches", "Answers of the batch upload endpoint, by HTTP status",
                          ["code"], registry=None)
_ADMISSION_REVIEWS = Counter("vgpu_ledger_admission_reviews",
                             "Admission reviews answered, by result (failed_*: the check raised; the "
                             "configured policy admitted or denied)", ["result"], registry=None)
_PROCESS_COUNTERS = (_INGEST_SAMPLES, _INGEST_BATCHES, _ADMISSION_REVIEWS)

# Zero series from the start, so rate() and the alerts see the first increment.
for _result in ADMISSION_RESULTS:
    _ADMISSION_REVIEWS.labels(_result)
for _code in ("201", "200"):
    _INGEST_BATCHES.labels(_code)


def count_ingested_samples(samples: int) -> None:
    _INGEST_SAMPLES.inc(samples)


def count_ingest_answer(status_code: int) -> None:
    _INGEST_BATCHES.labels(str(status_code)).inc()


def count_admission_review(result: str) -> None:
    if result not in ADMISSION_RESULTS:
        raise ValueError(f"unknown admission result {result!r}")
    _ADMISSION_REVIEWS.labels(result).inc()


class LedgerCollector(Collector):
    """The ledger's state, read from the database when scraped."""

    def collect(self) -> Iterable[Metric]:
        started = time.monotonic()
        state = get_ledger_state(now=timezone.now())
        yield GaugeMetricFamily("vgpu_ledger_batches_pending", "Stored batches waiting for the rollup",
                                value=state.pending_batches)
        yield GaugeMetricFamily("vgpu_ledger_rollup_lag_seconds",
                                "Age of the oldest batch waiting for the rollup (0: none waits)",
                                value=state.rollup_lag_s)
        yield GaugeMetricFamily("vgpu_ledger_batches_quarantined",
                                "Batches the rollup could not roll up, kept out of the books until re-driven",
                                value=state.quarantined_batches)
        undelivered = GaugeMetricFamily("vgpu_ledger_undelivered_batches",
                                        "Batches a node holds that ingest refused, until a re-drive lands them "
                                        "(nodes with none have no series)", labels=["node"])
        for node, count in state.undelivered_by_node.items():
            undelivered.add_metric([node], count)
        yield undelivered
        mismatches = CounterMetricFamily("vgpu_ledger_tenant_claim_mismatches",
                                         "Sample rows whose claimed tenant the namespace mapping overrode, by node "
                                         "(billed to the mapped tenant; nodes with none have no series)",
                                         labels=["node"])
        for node, count in count_claim_mismatches_by_node().items():
            mismatches.add_metric([node], count)
        yield mismatches
        periods = GaugeMetricFamily("vgpu_ledger_billing_periods",
                                    "Billing periods by state (stalled: closing, no progress for "
                                    "VGPU_PERIOD_CLOSE_STALE_S)", labels=["state"])
        for period_state in PERIOD_STATES:
            periods.add_metric([period_state], state.periods_by_state[period_state])
        yield periods
        budgets = GaugeMetricFamily("vgpu_ledger_budgets", "Budgets by this month's state and their hard action",
                                    labels=["state", "action"])
        for (budget_state, action), count in sorted(state.budgets_by_state_action.items()):
            budgets.add_metric([budget_state, action], count)
        yield budgets
        cost = GaugeMetricFamily("vgpu_ledger_month_cost", "This month's priced GPU cost so far, major currency "
                                 "units (card: whole cards; charged: to tenants; idle: not used)",
                                 labels=["currency", "part"])
        for (currency, part), amount in sorted(state.month_cost.items()):
            cost.add_metric([currency, part], float(amount))
        yield cost
        seconds = GaugeMetricFamily("vgpu_ledger_month_gpu_seconds", "GPU-seconds metered this month (priced=false: "
                                    "no rate card covered them)", labels=["priced"])
        for priced in (True, False):
            seconds.add_metric([str(priced).lower()], float(state.month_gpu_seconds[priced]))
        yield seconds
        # No model name in a label: names come from nodes, and a label per made-up name would let
        # any node grow the series without bound.
        yield GaugeMetricFamily("vgpu_ledger_unapproved_gpus",
                                "GPUs whose reported model no admin approved: metered, unpriced, flagged",
                                value=count_unapproved_gpus())
        yield from _retention_metrics()
        yield from _rebalance_metrics()
        yield GaugeMetricFamily("vgpu_ledger_metrics_collect_seconds",
                                "Time this scrape spent reading the ledger's state", value=time.monotonic() - started)


def _retention_metrics() -> Iterable[Metric]:
    """Day partitions past their retention that are still there: held because batches with
    samples in them are pending or quarantined (docs/operations.md, "A partition is kept")."""
    state = get_retention_state(now=timezone.now())
    held = GaugeMetricFamily("vgpu_ledger_retention_held_partitions",
                             "Day partitions past their retention kept because batches in them are not rolled up "
                             "(ledger: raw or minute)", labels=["ledger"])
    held_bytes = GaugeMetricFamily("vgpu_ledger_retention_held_bytes",
                                   "Disk held by those partitions, bytes (indexes included)", labels=["ledger"])
    for ledger in ("raw", "minute"):
        held.add_metric([ledger], state.held_partitions[ledger])
        held_bytes.add_metric([ledger], state.held_bytes[ledger])
    yield held
    yield held_bytes


def _rebalance_metrics() -> Iterable[Metric]:
    """Rebalance executions by outcome, counted from the plans (an execution runs in a Celery
    worker, which no scrape reaches, and a plan is never deleted, so the count never goes back)."""
    executions = CounterMetricFamily("vgpu_rebalance_executions",
                                     "Rebalance plan executions that ended, by outcome (partial: done, "
                                     "some evictions not carried out)", labels=["outcome"])
    for outcome, count in count_executions().items():
        executions.add_metric([outcome], count)
    yield executions


class _ProcessCounters(Collector):
    """This process's counters, for a server that is not gunicorn under config/gunicorn.conf.py."""

    def collect(self) -> Iterable[Metric]:
        for counter in _PROCESS_COUNTERS:
            yield from counter.collect()


class _WorkerFiles(Collector):
    """The counters of every gunicorn worker: this server's (PROMETHEUS_MULTIPROC_DIR) and those of
    the other gunicorns named in VGPU_METRICS_MORE_DIRS, such as the web pod's webhook container,
    whose admission reviews would otherwise be scraped from nowhere. One merge over all the files,
    so a counter counted by both servers is one series, summed."""

    def __init__(self, directories: list[str]) -> None:
        self.directories = directories

    def collect(self) -> Iterable[Metric]:
        from prometheus_client import multiprocess  # noqa: PLC0415 - loaded only where a multiprocess directory is collected

        files = [str(f) for directory in self.directories for f in sorted(Path(directory).glob("*.db"))]
        # prometheus_client leaves merge() unannotated; it returns the merged metric families.
        merged: Iterable[Metric] = multiprocess.MultiProcessCollector.merge(
            files, accumulate=True)
        return merged


def render_metrics() -> bytes:
    """The exposition of one scrape: the counters of every worker, then the ledger's state."""
    registry = CollectorRegistry(auto_describe=False)
    if own := os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        more = [d.strip() for d in settings.VGPU_METRICS_MORE_DIRS.split(",") if d.strip()]
        registry.register(_WorkerFiles([own, *more]))
    else:
        registry.register(_ProcessCounters())
    registry.register(LedgerCollector())
    return generate_latest(registry)


# OpenCost's label sets (pkg/costmodel/metrics.go), in its order: `instance` and `node` are both the
# node's name; the cloud labels are "" here (the ledger knows GPUs, not machine types or regions).
_OPENCOST_NODE_LABELS = ["instance", "node", "instance_type", "region", "provider_id", "arch"]
_OPENCOST_CONTAINER_LABELS = ["namespace", "pod", "container", "instance", "node"]
_SECONDS_PER_HOUR = 3600


class OpenCostCollector(Collector):
    """OpenCost's GPU metric families, from the last complete UTC hour of the hour ledger, so
    dashboards and alerts written for OpenCost show this fleet. OpenCost sets them from its live
    model; here each holds the hour before the current one, as the rollup has written it (a rollup
    behind, vgpu_ledger_rollup_lag_seconds, shows the part it has), and changes once an hour.

    Gauges, as in OpenCost: node_gpu_count (GPUs metered on the node), node_gpu_hourly_cost (price
    of one GPU-hour on the node, the billing currency's major unit), container_gpu_allocation (GPUs
    the container held on average: its vGPU share, Σ share GPU-seconds / 3600), and
    kubecost_cluster_info (1 per named cluster)."""

    def __init__(self, *, now: datetime | None = None) -> None:
        self.now = now

    def collect(self) -> Iterable[Metric]:
        now = self.now or timezone.now()
        hour = now.astimezone(UTC).replace(minute=0, second=0, microsecond=0) - timedelta(hours=1)
        nodes, containers = gpu_hour_state(hour)
        count = GaugeMetricFamily("node_gpu_count", "node_gpu_count count of gpu on this node",
                                  labels=_OPENCOST_NODE_LABELS)
        price = GaugeMetricFamily("node_gpu_hourly_cost", "node_gpu_hourly_cost hourly cost for each gpu on this node",
                                  labels=_OPENCOST_NODE_LABELS)
        for node in nodes:
            labels = [node.node, node.node, "", "", "", ""]
            count.add_metric(labels, node.gpus)
            if node.priced_gpu_seconds > 0:
                # Display only, as every money figure here; the ledger keeps the Decimals.
                price.add_metric(labels, float(node.card_cost * _SECONDS_PER_HOUR / node.priced_gpu_seconds))
        yield count
        yield price
        allocation = GaugeMetricFamily("container_gpu_allocation", "container_gpu_allocation GPU used",
                                       labels=_OPENCOST_CONTAINER_LABELS)
        for c in containers:
            allocation.add_metric([c.namespace, c.pod, c.container, c.node, c.node],
                                  float(c.share_gpu_s / _SECONDS_PER_HOUR))
        yield allocation
        info = GaugeMetricFamily("kubecost_cluster_info", "kubecost_cluster_info ClusterInfo", labels=["id", "name"])
        for cluster in known_clusters():
            info.add_metric([cluster, cluster], 1)
        yield info


def render_opencost_metrics(*, now: datetime | None = None) -> bytes:
    """The exposition of /metrics/opencost: OpenCost's families alone, at a path of their own,
    because their `instance` label is the node's (Prometheus must scrape them with honor_labels,
    which the service's own families must not get)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(OpenCostCollector(now=now))
    return generate_latest(registry)


def scrape_token() -> tuple[str, str]:
    """(token, problem): the bearer token a scrape must present, from VGPU_METRICS_TOKEN or the file
    VGPU_METRICS_TOKEN_FILE (a mounted Secret, read at every scrape so rotating it needs no restart)."""
    token, problem = configured_token("VGPU_METRICS_TOKEN")
    if not token and not problem:
        problem = "no scrape token is configured: set VGPU_METRICS_TOKEN_FILE"
    return token, problem
