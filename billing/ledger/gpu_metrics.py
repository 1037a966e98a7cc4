"""One hour of the ledger as OpenCost's GPU metrics see a fleet (billing.metrics.OpenCostCollector):
per node, its GPUs and their price; per container, the GPUs it was allocated. Two indexed reads of
the hour ledger (gpu_hour_hour_idx; usage rows by hour), so a scrape costs the same whatever the
ledger's age.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal

from django.db.models import Count, Q, Sum

from billing.ledger.models import GpuHour, UsageHour
from billing.models import Node

__all__ = ["ContainerGpus", "NodeGpus", "gpu_hour_state", "known_clusters"]


@dataclass(frozen=True)
class NodeGpus:
    node: str
    gpus: int  # distinct GPUs metered on the node in the hour, priced or not
    currency: str  # "" when no priced row, or rows in several currencies (then no price)
    card_cost: Decimal  # Σ card cost of the priced rows
    priced_gpu_seconds: Decimal  # Σ metered seconds of the priced rows


@dataclass(frozen=True)
class ContainerGpus:
    namespace: str
    pod: str
    container: str
    node: str
    share_gpu_s: Decimal  # Σ the container's card share over the hour, GPU-seconds


def gpu_hour_state(hour: datetime) -> tuple[list[NodeGpus], list[ContainerGpus]]:
    """The hour starting at `hour`: its nodes (by name) and its containers (by name)."""
    gpus = dict(GpuHour.objects.filter(hour=hour).values("node__name")
                .annotate(n=Count("gpu_uuid", distinct=True)).values_list("node__name", "n"))
    priced: dict[str, list[tuple[str, Decimal, Decimal]]] = {}
    for node, currency, cost, seconds in (
        GpuHour.objects.filter(hour=hour, priced=True).values("node__name", "currency")
        .annotate(cost=Sum("card_cost"), seconds=Sum("metered_seconds"))
        .values_list("node__name", "currency", "cost", "seconds")
    ):
        priced.setdefault(node, []).append((currency, cost, seconds))
    nodes = []
    for node in sorted(gpus):
        rows = priced.get(node, [])
        # One price per node, as OpenCost has: a node priced in two currencies in one hour has none.
        currency, cost, seconds = rows[0] if len(rows) == 1 else ("", Decimal(0), Decimal(0))
        nodes.append(NodeGpus(node=node, gpus=gpus[node], currency=currency, card_cost=cost,
                              priced_gpu_seconds=seconds))
    containers = [
        ContainerGpus(namespace=ns, pod=pod, container=container, node=node, share_gpu_s=share)
        for ns, pod, container, node, share in (
            UsageHour.objects.filter(hour=hour).values("namespace", "pod", "container", "node__name")
            .annotate(share=Sum("share_gpu_s")).filter(~Q(share=0))
            .order_by("namespace", "pod", "container", "node__name")
            .values_list("namespace", "pod", "container", "node__name", "share")
        )
    ]
    return nodes, containers


def known_clusters() -> list[str]:
    """The named clusters of the fleet's nodes (a node whose agent never said has "")."""
    return sorted(set(Node.objects.exclude(cluster="").values_list("cluster", flat=True)))
