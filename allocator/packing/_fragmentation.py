"""Expected GPU fragmentation of a node against a target workload (Weng et al., ATC '23, §4).

The target workload is the observed pod list. Its pods are grouped by GPU demand
``(num_gpu, gpu_milli, gpu_spec)``; a group's popularity is its share of all pods (CPU pods
form their own group). For one pod ``m`` of the workload, the fragment of node ``n`` is the
free GPU milli that ``m`` cannot use there:

* all free milli when ``m`` cannot run on ``n`` at all (CPU, memory, GPU model, pod count,
  or too few fully free GPUs for a whole-GPU request, or no GPU with enough free milli);
* otherwise the free milli of the GPUs whose free milli is below ``m``'s share (a CPU pod
  that fits leaves no fragment, unless ``cpu_pods_fragment_all``: then a CPU pod counts all
  free milli, fit or not, as the FGD simulator counts it, since it can use none of it).

``F_n`` is the popularity-weighted mean over the workload. Within a group the chance that a
pod's CPU and memory fit is read from a cumulative table built once from the workload, so the
score is exact for the observed distribution and costs ``O(groups)`` per candidate.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from allocator.packing._model import GPU_MILLI, MAX_PODS_PER_NODE, Cluster, IntArray, PodSpec
from allocator.packing._state import is_whole_gpu_request

__all__ = ["TYPICAL_POD_THRESHOLD", "FragmentationModel", "typical_pods"]

FloatArray = npt.NDArray[np.float64]

TYPICAL_POD_THRESHOLD = 0.95  # the simulator's podPopularityThreshold default (95 %, step 1)


def typical_pods(pods: Sequence[PodSpec], threshold: float = TYPICAL_POD_THRESHOLD) -> tuple[PodSpec, ...]:
    """The pods of the most popular request shapes, as the FGD simulator's ``GetTypicalPods``.

    A shape is ``(cpu_milli, gpu_milli, num_gpu, gpu_spec)`` (memory is not part of it). Shapes
    are taken most frequent first (equal counts: the larger shape first, as the simulator's
    reversed sort) one at a time until they cover at least ``threshold`` of the pods; the pods
    of the other shapes are left out of the target workload.
    """
    if not 0 < threshold <= 1:
        raise ValueError(f"typical-pod threshold must be in (0, 1], got {threshold}")
    if not pods:
        raise ValueError("the target workload has no pods")

    def shape(p: PodSpec) -> tuple[int, int, int, str]:
        return (p.cpu_milli, p.gpu_milli, p.num_gpu, "|".join(p.gpu_spec))

    counts = Counter(shape(p) for p in pods)
    kept: set[tuple[int, int, int, str]] = set()
    covered = 0
    for key, count in sorted(counts.items(), key=lambda kv: (kv[1], kv[0]), reverse=True):
        if covered >= threshold * len(pods):
            break
        kept.add(key)
        covered += count
    return tuple(p for p in pods if shape(p) in kept)


@dataclass(frozen=True, slots=True, eq=False)
class FragmentationModel:
    """Workload groups and the tables that score a node's expected fragmentation."""

    popularity: FloatArray  # (k,) share of pods per group, sums to 1
    share: IntArray  # (k,) per-GPU milli a pod of the group needs on each GPU (0 for CPU pods)
    num_gpu: IntArray  # (k,)
    whole: npt.NDArray[np.bool_]  # (k,) group needs fully free GPUs
    model_ok: npt.NDArray[np.bool_]  # (k, models) group may use this GPU model
    cpu_values: IntArray  # sorted distinct CPU requests
    mem_values: IntArray  # sorted distinct memory requests
    fit_table: FloatArray  # (k, len(cpu_values)+1, len(mem_values)+1) share of the group that fits
    use_memory: bool
    cpu_pods_fragment_all: bool  # a CPU pod of the workload counts every free GPU milli as fragment

    @classmethod
    def from_workload(
        cls, pods: Sequence[PodSpec], cluster: Cluster, *, use_memory: bool = True, cpu_pods_fragment_all: bool = False
    ) -> FragmentationModel:
        if not pods:
            raise ValueError("the target workload has no pods")
        keys: dict[tuple[int, int, tuple[str, ...]], int] = {}
        group = np.empty(len(pods), dtype=np.int64)
        for i, pod in enumerate(pods):
            key = (pod.num_gpu, pod.gpu_milli, pod.gpu_spec)
            group[i] = keys.setdefault(key, len(keys))
        k = len(keys)
        share = np.zeros(k, dtype=np.int64)
        num_gpu = np.zeros(k, dtype=np.int64)
        whole = np.zeros(k, dtype=np.bool_)
        model_ok = np.ones((k, len(cluster.models)), dtype=np.bool_)
        for (n_gpu, milli, spec), g in keys.items():
            probe = PodSpec(name="", cpu_milli=0, memory_mib=0, num_gpu=n_gpu, gpu_milli=milli, gpu_spec=spec)
            num_gpu[g] = n_gpu
            whole[g] = is_whole_gpu_request(probe)
            share[g] = GPU_MILLI if whole[g] else milli
            if spec:
                model_ok[g] = [m in spec for m in cluster.models]
        counts = np.bincount(group, minlength=k).astype(np.float64)
        cpu = np.array([p.cpu_milli for p in pods], dtype=np.int64)
        mem = np.array([p.memory_mib for p in pods], dtype=np.int64)
        cpu_values = np.unique(cpu)
        mem_values = np.unique(mem)
        table = np.zeros((k, len(cpu_values) + 1, len(mem_values) + 1), dtype=np.float64)
        np.add.at(table, (group, np.searchsorted(cpu_values, cpu) + 1, np.searchsorted(mem_values, mem) + 1), 1.0)
        table = table.cumsum(axis=1).cumsum(axis=2) / counts[:, None, None]
        return cls(
            popularity=counts / counts.sum(),
            share=share,
            num_gpu=num_gpu,
            whole=whole,
            model_ok=model_ok,
            cpu_values=cpu_values,
            mem_values=mem_values,
            fit_table=table,
            use_memory=use_memory,
            cpu_pods_fragment_all=cpu_pods_fragment_all,
        )

    def fit_share(self, cpu_free: IntArray, mem_free: IntArray) -> FloatArray:
        """``(c, k)``: share of each group whose CPU (and memory) request fits what is free."""
        ci = np.searchsorted(self.cpu_values, cpu_free, side="right")
        if self.use_memory:
            mi = np.searchsorted(self.mem_values, mem_free, side="right")
        else:
            mi = np.full_like(ci, len(self.mem_values))
        out: FloatArray = self.fit_table[:, ci, mi].T
        return out

    def usable(
        self, *, cpu_free: IntArray, mem_free: IntArray, gpu_free: IntArray, model_index: IntArray, pod_count: IntArray
    ) -> FloatArray:
        """``(c, k)``: probability that a pod of each group can run on each candidate node state and use its GPUs."""
        whole_free = np.count_nonzero(gpu_free == GPU_MILLI, axis=1)
        max_free = gpu_free.max(axis=1)
        gpu_ok = np.where(
            self.whole[None, :],
            whole_free[:, None] >= self.num_gpu[None, :],
            max_free[:, None] >= self.share[None, :],
        )
        gpu_pod = (self.num_gpu > 0)[None, :]
        if self.cpu_pods_fragment_all:
            gpu_ok &= gpu_pod  # a CPU pod can use none of the free milli, so all of it is its fragment
        else:
            gpu_ok |= ~gpu_pod
        ok = gpu_ok & self.model_ok[:, model_index].T & (pod_count < MAX_PODS_PER_NODE)[:, None]
        out: FloatArray = ok * self.fit_share(cpu_free, mem_free)
        return out

    def fragments(self, gpu_free: IntArray) -> tuple[FloatArray, FloatArray]:
        """``(c, k)`` free milli below each group's share, and ``(c,)`` total free milli."""
        gpu = gpu_free.astype(np.float64)
        below = gpu[:, :, None] < self.share[None, None, :]
        partial: FloatArray = np.einsum("cg,cgk->ck", gpu, below)
        total: FloatArray = gpu.sum(axis=1)
        return partial, total

    def score(
        self, *, cpu_free: IntArray, mem_free: IntArray, gpu_free: IntArray, model_index: IntArray, pod_count: IntArray
    ) -> FloatArray:
        """``(c,)`` expected fragmented GPU milli of each candidate node state."""
        usable = self.usable(
            cpu_free=cpu_free, mem_free=mem_free, gpu_free=gpu_free, model_index=model_index, pod_count=pod_count
        )
        partial, total = self.fragments(gpu_free)
        frag = usable * partial + (1.0 - usable) * total[:, None]
        out: FloatArray = frag @ self.popularity
        return out
