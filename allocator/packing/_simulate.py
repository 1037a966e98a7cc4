"""One seed of the allocation experiment: try every arrived pod once, record the metric (§3, §6, §7)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from allocator.packing._arrival import Arrival
from allocator.packing._model import Cluster, IntArray, PodSpec
from allocator.packing._policies import Policy
from allocator.packing._state import ClusterState

__all__ = ["SimulationResult", "allocation_at", "percent_events", "simulate"]


@dataclass(frozen=True, slots=True, eq=False)
class SimulationResult:
    """Outcome per arrived pod (arrival order) and the cluster totals after each attempt."""

    node: IntArray  # (a,) node index, -1 when the pod fit nowhere
    gpus: tuple[tuple[int, ...], ...]  # GPU indices on that node; () for CPU pods and failures
    used_milli: IntArray  # (a,) allocated GPU milli after attempt i
    arrived_milli: IntArray  # (a,) Σ num_gpu × gpu_milli of pods attempted up to i
    total_gpus: int

    @property
    def placed(self) -> int:
        return int(np.count_nonzero(self.node >= 0))

    @property
    def failed(self) -> int:
        return int(np.count_nonzero(self.node < 0))

    def allocation_at(self, arrived_percent: int) -> float:
        return allocation_at(self.used_milli, self.arrived_milli, self.total_gpus, arrived_percent)


def percent_events(
    used_milli: Sequence[int] | IntArray, arrived_milli: Sequence[int] | IntArray, total_gpus: int
) -> tuple[list[int], list[float]]:
    """Per event: ``arrived% = round(arrived / G / 10)`` (half-even), ``alloc% = round(used / G / 10, 2)``."""
    if total_gpus <= 0:
        raise ValueError(f"total_gpus must be > 0, got {total_gpus}")
    arrived = [round(int(a) / total_gpus / 10) for a in arrived_milli]
    alloc = [round(int(u) / total_gpus / 10, 2) for u in used_milli]
    return arrived, alloc


def allocation_at(
    used_milli: Sequence[int] | IntArray, arrived_milli: Sequence[int] | IntArray, total_gpus: int, arrived_percent: int
) -> float:
    """Mean ``alloc%`` over the events whose ``arrived%`` equals ``arrived_percent``; NaN when none."""
    arrived, alloc = percent_events(used_milli, arrived_milli, total_gpus)
    hits = [a for p, a in zip(arrived, alloc, strict=True) if p == arrived_percent]
    return math.fsum(hits) / len(hits) if hits else math.nan


def simulate(*, cluster: Cluster, pods: Sequence[PodSpec], arrival: Arrival, policy: Policy) -> SimulationResult:
    """Try each arrived pod once in order; a pod that fits nowhere is dropped (still arrived)."""
    if len(arrival.origin) and (arrival.origin.min() < 0 or arrival.origin.max() >= len(pods)):
        raise ValueError("arrival refers to pods outside the pod list")
    state = ClusterState(cluster)
    count = arrival.size
    node = np.full(count, -1, dtype=np.int64)
    gpus: list[tuple[int, ...]] = [()] * count
    used = np.zeros(count, dtype=np.int64)
    arrived = np.zeros(count, dtype=np.int64)
    arrived_total = 0
    for i, origin in enumerate(arrival.origin):
        pod = pods[int(origin)]
        arrived_total += pod.gpu_request_milli
        candidates = np.flatnonzero(state.feasible(pod))
        if len(candidates):
            choice = policy.choose(state, pod, candidates)
            state.place(pod, choice.node, choice.gpus)
            policy.placed(state, choice)
            node[i] = choice.node
            gpus[i] = choice.gpus
        used[i] = state.used_milli
        arrived[i] = arrived_total
    return SimulationResult(
        node=node, gpus=tuple(gpus), used_milli=used, arrived_milli=arrived, total_gpus=cluster.total_gpus
    )
