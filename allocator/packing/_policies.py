"""Placement policies: choose a node and its GPUs for a pod among the feasible nodes.

Every policy gets a per-seed ``numpy.random.Generator``; policies that break ties draw a
fixed random priority of nodes from it once (docs/packing.md, Policies: bestfit), never a coin per pod.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

from allocator.packing._fragmentation import FloatArray, FragmentationModel, typical_pods
from allocator.packing._model import GPU_MILLI, Cluster, IntArray, PodSpec
from allocator.packing._state import ClusterState, is_whole_gpu_request, lowest_whole_gpus, tightest_gpu

__all__ = [
    "BEST_POLICY",
    "POLICY_NAMES",
    "Choice",
    "FgdPolicy",
    "Policy",
    "make_policy",
    "policy_rng",
    "resolve_policy_name",
    "simulator_score",
]


@dataclass(frozen=True, slots=True)
class Choice:
    node: int
    gpus: tuple[int, ...]


class Policy(Protocol):
    name: str

    def choose(self, state: ClusterState, pod: PodSpec, candidates: IntArray) -> Choice:
        """Pick one of ``candidates`` (feasible node indices, ascending, at least one)."""
        ...

    def placed(self, state: ClusterState, choice: Choice) -> None:
        """Called after ``state`` took the pod at ``choice``."""
        ...


def _gpus_in_node(state: ClusterState, pod: PodSpec, node: int) -> tuple[int, ...]:
    """BestFit's rule inside a node: lowest-index whole GPUs, or the tightest GPU for a share."""
    if pod.num_gpu == 0:
        return ()
    row = state.gpu_free[node]
    if is_whole_gpu_request(pod):
        return lowest_whole_gpus(row, pod.num_gpu)
    return (tightest_gpu(row, pod.gpu_milli),)


class RandomPolicy:
    """Uniform over feasible nodes; a share goes on a uniformly random GPU that fits."""

    name = "random"

    def __init__(self, rng: np.random.Generator) -> None:
        self._rng = rng

    def choose(self, state: ClusterState, pod: PodSpec, candidates: IntArray) -> Choice:
        node = int(candidates[0]) if len(candidates) == 1 else int(candidates[self._rng.integers(len(candidates))])
        if pod.num_gpu == 0 or is_whole_gpu_request(pod):
            return Choice(node, _gpus_in_node(state, pod, node))
        fits = np.flatnonzero(state.gpu_free[node] >= pod.gpu_milli)
        return Choice(node, (int(fits[self._rng.integers(len(fits))]),))

    def placed(self, state: ClusterState, choice: Choice) -> None:
        return None


class _Prioritised:
    """Holds the per-seed random node priority used to break ties (lower rank wins)."""

    def __init__(self, cluster: Cluster, rng: np.random.Generator) -> None:
        self.rank: IntArray = np.empty(cluster.size, dtype=np.int64)
        self.rank[rng.permutation(cluster.size)] = np.arange(cluster.size)


class BestFitPolicy(_Prioritised):
    """The simulator's BestFit score (§4): least CPU and GPU left over after placing."""

    name = "bestfit"

    def __init__(self, cluster: Cluster, rng: np.random.Generator) -> None:
        super().__init__(cluster, rng)
        # Normalisers: the largest node's CPU and GPU milli (128,000 and 8,000 on the openb list).
        self._cpu_norm = float(cluster.cpu_milli.max()) or 1.0
        self._gpu_norm = float(cluster.max_gpus * GPU_MILLI)

    def choose(self, state: ClusterState, pod: PodSpec, candidates: IntArray) -> Choice:
        if len(candidates) == 1:
            node = int(candidates[0])
        else:
            cpu_req = pod.cpu_milli if pod.cpu_milli != 0 else 100
            cpu_left = (state.cpu_free[candidates] - cpu_req) / self._cpu_norm
            gpu_left = (state.gpu_free[candidates].sum(axis=1) - pod.gpu_request_milli) / self._gpu_norm
            score = np.trunc((1 - (0.5 * cpu_left + 0.5 * gpu_left)) * 100)
            best = candidates[score == score.max()]
            node = int(best[np.argmin(self.rank[best])])
        return Choice(node, _gpus_in_node(state, pod, node))

    def placed(self, state: ClusterState, choice: Choice) -> None:
        return None


@dataclass(frozen=True, slots=True, eq=False)
class _Candidates:
    """Node states after a tentative placement; one row per (node, GPU choice)."""

    node: IntArray  # (c,)
    gpu: IntArray  # (c,) GPU a share would take, -1 for whole-GPU and CPU pods
    cpu_free: IntArray
    mem_free: IntArray
    gpu_free: IntArray  # (c, max_gpus)
    pod_count: IntArray
    model_index: IntArray


def _candidate_states(state: ClusterState, pod: PodSpec, candidates: IntArray) -> _Candidates:
    rows = state.gpu_free[candidates]
    if pod.num_gpu == 0:
        node, gpu, after = candidates, np.full(len(candidates), -1, dtype=np.int64), rows.copy()
    elif is_whole_gpu_request(pod):
        whole = rows == GPU_MILLI
        take = whole & (np.cumsum(whole, axis=1) <= pod.num_gpu)
        after = rows - take * pod.gpu_milli
        node, gpu = candidates, np.full(len(candidates), -1, dtype=np.int64)
    else:
        fits = rows >= pod.gpu_milli
        # GPUs with equal free milli on one node are interchangeable: keep the lowest index.
        width = rows.shape[1]
        earlier = np.tril(np.ones((width, width), dtype=np.bool_), k=-1)  # earlier[g, h]: h < g
        same = (rows[:, :, None] == rows[:, None, :]) & fits[:, None, :] & earlier[None, :, :]
        first = fits & ~same.any(axis=2)
        row_i, gpu = np.nonzero(first)
        node = candidates[row_i]
        after = rows[row_i].copy()
        after[np.arange(len(row_i)), gpu] -= pod.gpu_milli
    return _Candidates(
        node=node,
        gpu=gpu.astype(np.int64),
        cpu_free=state.cpu_free[node] - pod.cpu_milli,
        mem_free=state.mem_free[node] - pod.memory_mib,
        gpu_free=after,
        pod_count=state.pod_count[node] + 1,
        model_index=state.cluster.model_index[node],
    )


def simulator_score(delta: FloatArray) -> FloatArray:
    """The FGD simulator's node score for a change ``delta`` of fragmented GPU milli (higher is better).

    ``int(sigmoid(−delta / 1000) × 100)``, truncated: 0–100 in steps that are about 40 milli
    wide near ``delta = 0`` and wider further out, so near-equal placements tie and go to the
    node priority.
    """
    out: FloatArray = np.trunc(100.0 / (1.0 + np.exp(delta / 1000.0)))
    return out


class FgdPolicy(_Prioritised):
    """Fragmentation Gradient Descent: the placement that least increases expected fragmentation.

    The pod goes to the (node, GPU) whose expected fragmented GPU milli against the target
    workload (``FragmentationModel``) grows least, scored as the simulator scores it
    (``simulator_score``); ties go to the node priority, then the lower GPU index. As in the
    paper, CPU is the only host resource in the fragmentation measure (``use_memory=False``);
    as in the simulator the target workload is the typical pods only (``typical_pods``: the
    most popular shapes covering 95 % of pods) and a CPU pod of it counts all free GPU milli as
    fragment. ``integer_score=False`` and ``cpu_pods_fragment_all=False`` give the exact-float
    score and the fit-aware CPU-pod rule instead (the ablations in docs/packing.md).
    """

    name = "fgd"

    def __init__(
        self,
        cluster: Cluster,
        workload: Sequence[PodSpec],
        rng: np.random.Generator,
        *,
        integer_score: bool = True,
        cpu_pods_fragment_all: bool = True,
    ) -> None:
        super().__init__(cluster, rng)
        self.model = FragmentationModel.from_workload(
            typical_pods(workload), cluster, use_memory=False, cpu_pods_fragment_all=cpu_pods_fragment_all
        )
        self.integer_score = integer_score
        self._base: FloatArray | None = None

    def _score_nodes(self, state: ClusterState, nodes: IntArray) -> FloatArray:
        return self.model.score(
            cpu_free=state.cpu_free[nodes],
            mem_free=state.mem_free[nodes],
            gpu_free=state.gpu_free[nodes],
            model_index=state.cluster.model_index[nodes],
            pod_count=state.pod_count[nodes],
        )

    def _delta(self, state: ClusterState, cand: _Candidates) -> FloatArray:
        if self._base is None:
            self._base = self._score_nodes(state, np.arange(state.cluster.size))
        after = self.model.score(
            cpu_free=cand.cpu_free,
            mem_free=cand.mem_free,
            gpu_free=cand.gpu_free,
            model_index=cand.model_index,
            pod_count=cand.pod_count,
        )
        delta: FloatArray = after - self._base[cand.node]
        return delta

    def choose(self, state: ClusterState, pod: PodSpec, candidates: IntArray) -> Choice:
        cand = _candidate_states(state, pod, candidates)
        delta = np.round(self._delta(state, cand), 6)  # float noise must not split exact ties or steps
        cost = -simulator_score(delta) if self.integer_score else delta
        return _pick(state, pod, cand, (cand.gpu, self.rank[cand.node], cost))

    def placed(self, state: ClusterState, choice: Choice) -> None:
        if self._base is not None:
            node = np.array([choice.node])
            self._base[choice.node] = self._score_nodes(state, node)[0]


def _pick(state: ClusterState, pod: PodSpec, cand: _Candidates, keys: tuple[npt.NDArray[Any], ...]) -> Choice:
    """The candidate first in lexicographic order of ``keys`` (last key is primary)."""
    best = int(np.lexsort(keys)[0])
    node = int(cand.node[best])
    if cand.gpu[best] >= 0:
        return Choice(node, (int(cand.gpu[best]),))
    return Choice(node, _gpus_in_node(state, pod, node))


class StrandAwarePolicy(FgdPolicy):
    """FGD's fragmentation plus the GPU milli that host resources strand (our policy)."""

    name = "strand"

    def __init__(self, cluster: Cluster, workload: Sequence[PodSpec], rng: np.random.Generator) -> None:
        _Prioritised.__init__(self, cluster, rng)
        self.model = FragmentationModel.from_workload(workload, cluster, use_memory=True)
        self.integer_score = False  # exact floats: the stranding term is finer than the simulator's steps
        self._base = None
        gpu_pods = [p for p in workload if p.num_gpu > 0]
        cpu_per_milli = np.zeros(len(cluster.models))
        mem_per_milli = np.zeros(len(cluster.models))
        for m, model in enumerate(cluster.models):
            usable = [p for p in gpu_pods if not p.gpu_spec or model in p.gpu_spec]
            milli = sum(p.gpu_request_milli for p in usable)
            if milli:
                cpu_per_milli[m] = sum(p.cpu_milli for p in usable) / milli
                mem_per_milli[m] = sum(p.memory_mib for p in usable) / milli
        self._cpu_per_milli = cpu_per_milli
        self._mem_per_milli = mem_per_milli

    def _stranded(self, cpu: IntArray, mem: IntArray, gpu: IntArray, model: IntArray) -> FloatArray:
        free = gpu.sum(axis=1).astype(np.float64)
        rho = self._cpu_per_milli[model]
        sig = self._mem_per_milli[model]
        with np.errstate(divide="ignore", invalid="ignore"):
            by_cpu = np.where(rho > 0, cpu / rho, np.inf)
            by_mem = np.where(sig > 0, mem / sig, np.inf)
        out: FloatArray = np.maximum(0.0, free - np.minimum(by_cpu, by_mem))
        return out

    def _score_nodes(self, state: ClusterState, nodes: IntArray) -> FloatArray:
        frag = super()._score_nodes(state, nodes)
        strand = self._stranded(
            state.cpu_free[nodes], state.mem_free[nodes], state.gpu_free[nodes], state.cluster.model_index[nodes]
        )
        out: FloatArray = frag + strand
        return out

    def _delta(self, state: ClusterState, cand: _Candidates) -> FloatArray:
        if self._base is None:
            self._base = self._score_nodes(state, np.arange(state.cluster.size))
        after = self.model.score(
            cpu_free=cand.cpu_free,
            mem_free=cand.mem_free,
            gpu_free=cand.gpu_free,
            model_index=cand.model_index,
            pod_count=cand.pod_count,
        ) + self._stranded(cand.cpu_free, cand.mem_free, cand.gpu_free, cand.model_index)
        delta: FloatArray = after - self._base[cand.node]
        return delta


POLICY_NAMES = ("bestfit", "random", "fgd", "strand")
BEST_POLICY = "strand"  # ``best`` resolves to this


def policy_rng(seed: int) -> np.random.Generator:
    """The policy's generator for ``seed`` (stream 1; the arrival sequence uses stream 0)."""
    return np.random.default_rng([seed, 1])


def resolve_policy_name(name: str) -> str:
    """The policy ``name`` stands for (``best`` is an alias); ValueError for unknown names."""
    resolved = BEST_POLICY if name == "best" else name
    if resolved not in POLICY_NAMES:
        known = ", ".join((*POLICY_NAMES, "best"))
        raise ValueError(f"unknown policy {name!r}; known: {known}")
    return resolved


def make_policy(name: str, *, cluster: Cluster, workload: Sequence[PodSpec], rng: np.random.Generator) -> Policy:
    """A fresh policy for one seed; ``workload`` is the target workload FGD-style policies measure against."""
    resolved = resolve_policy_name(name)
    if resolved == "bestfit":
        return BestFitPolicy(cluster, rng)
    if resolved == "random":
        return RandomPolicy(rng)
    if resolved == "fgd":
        return FgdPolicy(cluster, workload, rng)
    return StrandAwarePolicy(cluster, workload, rng)
