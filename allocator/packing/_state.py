"""Mutable free-capacity arrays of a cluster during one simulation (docs/packing.md: feasibility, the GPU in a node).

GPU arrays are ``(n_nodes, max_gpus)``; GPU slots a node does not have hold 0 free milli,
so they never fit a request, never count as whole free GPUs and add nothing to sums.
"""

from __future__ import annotations

import numpy as np

from allocator.packing._model import GPU_MILLI, MAX_PODS_PER_NODE, BoolArray, Cluster, IntArray, PodSpec

__all__ = ["ClusterState", "is_whole_gpu_request", "lowest_whole_gpus", "tightest_gpu"]


def is_whole_gpu_request(pod: PodSpec) -> bool:
    """Whole-GPU requests take fully free GPUs; only single-GPU shares below 1000 share a GPU."""
    return pod.num_gpu > 1 or (pod.num_gpu == 1 and pod.gpu_milli >= GPU_MILLI)


def lowest_whole_gpus(free_row: IntArray, count: int) -> tuple[int, ...]:
    """The ``count`` lowest-index fully free GPUs of one node."""
    whole = np.flatnonzero(free_row == GPU_MILLI)[:count]
    return tuple(int(g) for g in whole)


def tightest_gpu(free_row: IntArray, share: int) -> int:
    """The GPU with the least free milli that still fits ``share`` (lowest index on ties)."""
    fits = free_row >= share
    masked = np.where(fits, free_row, np.iinfo(np.int64).max)
    return int(np.argmin(masked))


class ClusterState:
    """Free CPU, memory and per-GPU milli of every node, and the pods each holds."""

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        n, width = cluster.size, cluster.max_gpus
        self.cpu_free: IntArray = cluster.cpu_milli.copy()
        self.mem_free: IntArray = cluster.memory_mib.copy()
        slots = np.arange(width)[None, :] < cluster.gpus[:, None]
        self.gpu_free: IntArray = np.where(slots, GPU_MILLI, 0).astype(np.int64)
        self.pod_count: IntArray = np.zeros(n, dtype=np.int64)
        self.whole_free: IntArray = cluster.gpus.copy()  # fully free GPUs per node
        self.max_free: IntArray = np.where(cluster.gpus > 0, GPU_MILLI, 0).astype(np.int64)
        self.used_milli = 0  # allocated GPU milli over the cluster
        self._allowed: dict[tuple[str, ...], BoolArray] = {}

    def allowed(self, pod: PodSpec) -> BoolArray:
        spec = pod.gpu_spec if pod.num_gpu > 0 else ()
        mask = self._allowed.get(spec)
        if mask is None:
            mask = self.cluster.allowed_nodes(spec)
            self._allowed[spec] = mask
        return mask

    def feasible(self, pod: PodSpec) -> BoolArray:
        """Nodes that can take ``pod`` now (§3)."""
        ok = (self.cpu_free >= pod.cpu_milli) & (self.mem_free >= pod.memory_mib)
        ok &= self.pod_count < MAX_PODS_PER_NODE
        if pod.num_gpu == 0:
            return ok
        ok &= self.allowed(pod)
        if is_whole_gpu_request(pod):
            return ok & (self.whole_free >= pod.num_gpu)
        return ok & (self.max_free >= pod.gpu_milli)

    def can_place(self, pod: PodSpec, node: int, gpus: tuple[int, ...]) -> bool:
        """Whether ``pod`` fits on exactly these GPUs of ``node``."""
        if not bool(self.feasible(pod)[node]):
            return False
        if pod.num_gpu == 0:
            return gpus == ()
        if len(gpus) != pod.num_gpu or len(set(gpus)) != len(gpus):
            return False
        if any(g < 0 or g >= int(self.cluster.gpus[node]) for g in gpus):
            return False
        need = GPU_MILLI if is_whole_gpu_request(pod) else pod.gpu_milli
        return all(int(self.gpu_free[node, g]) >= need for g in gpus)

    def place(self, pod: PodSpec, node: int, gpus: tuple[int, ...]) -> None:
        if not self.can_place(pod, node, gpus):
            raise ValueError(f"pod {pod.name!r} does not fit on node {node} GPUs {gpus}")
        self.cpu_free[node] -= pod.cpu_milli
        self.mem_free[node] -= pod.memory_mib
        self.pod_count[node] += 1
        for g in gpus:
            self.gpu_free[node, g] -= pod.gpu_milli
        row = self.gpu_free[node]
        self.whole_free[node] = int(np.count_nonzero(row == GPU_MILLI))
        self.max_free[node] = int(row.max())
        self.used_milli += pod.gpu_request_milli
