"""The pool as the rebalancer sees it: nodes, their GPUs, workloads and moves.

Units: GPU memory in MB, GPU compute in SM milli (1000 = every SM of one GPU), host CPU in
milli-cores, host memory in MiB. Demands are integers, rounded up by the caller, so that a fit
is never optimistic. A workload's demand is *per GPU* it holds (its recent peak, or whatever
the caller wants the plan to reserve).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["SM_MILLI", "GpuRef", "Move", "Pool", "PoolNode", "PoolWorkload"]

SM_MILLI = 1000  # every SM of one GPU


def _check_int(value: object, what: str, *, minimum: int) -> None:
    # bool is an int subclass; True as "1 MB" is always an input mistake.
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{what} must be an integer, got {value!r}")
    if value < minimum:
        raise ValueError(f"{what} must be >= {minimum}, got {value}")


def _check_name(value: object, what: str) -> None:
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"{what} must be a non-empty string, got {value!r}")


@dataclass(frozen=True, slots=True)
class PoolNode:
    """One node: ``gpus`` identical GPUs of ``model``, and optional host capacity.

    ``cpu_milli`` / ``memory_mib`` of ``None`` mean "not checked" (the plan then only
    guarantees GPU capacity on that node).
    """

    name: str
    model: str
    gpus: int
    gpu_memory_mb: int
    gpu_sm_milli: int = SM_MILLI
    cpu_milli: int | None = None
    memory_mib: int | None = None

    def __post_init__(self) -> None:
        _check_name(self.name, "node name")
        _check_name(self.model, f"node {self.name!r}: model")
        _check_int(self.gpus, f"node {self.name!r}: gpus", minimum=0)
        _check_int(self.gpu_memory_mb, f"node {self.name!r}: gpu_memory_mb", minimum=1)
        _check_int(self.gpu_sm_milli, f"node {self.name!r}: gpu_sm_milli", minimum=1)
        if self.cpu_milli is not None:
            _check_int(self.cpu_milli, f"node {self.name!r}: cpu_milli", minimum=0)
        if self.memory_mib is not None:
            _check_int(self.memory_mib, f"node {self.name!r}: memory_mib", minimum=0)


@dataclass(frozen=True, slots=True)
class PoolWorkload:
    """One workload (a pod's GPU container) where it runs now and what it needs.

    ``memory_mb`` and ``sm_milli`` are per GPU in ``gpus``; ``cpu_milli`` and ``memory_mib``
    are the pod's host demand. ``movable=False`` pins it (a PodDisruptionBudget would be
    violated, it holds whole GPUs, ...). A workload on more than one GPU is always pinned: the
    planner moves single-GPU workloads only. ``models`` lists the GPU models it may run on
    (empty = any).
    """

    key: str
    node: str
    gpus: tuple[int, ...]
    memory_mb: int
    sm_milli: int
    namespace: str = ""
    pod: str = ""
    cpu_milli: int = 0
    memory_mib: int = 0
    movable: bool = True
    models: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        _check_name(self.key, "workload key")
        where = f"workload {self.key!r}"
        _check_name(self.node, f"{where}: node")
        if not isinstance(self.gpus, tuple) or not self.gpus:
            raise ValueError(f"{where}: gpus must be a non-empty tuple of GPU indices, got {self.gpus!r}")
        for gpu in self.gpus:
            _check_int(gpu, f"{where}: GPU index", minimum=0)
        if len(set(self.gpus)) != len(self.gpus):
            raise ValueError(f"{where}: GPU indices must be distinct, got {self.gpus}")
        _check_int(self.memory_mb, f"{where}: memory_mb", minimum=0)
        _check_int(self.sm_milli, f"{where}: sm_milli", minimum=0)
        _check_int(self.cpu_milli, f"{where}: cpu_milli", minimum=0)
        _check_int(self.memory_mib, f"{where}: memory_mib", minimum=0)
        if not isinstance(self.movable, bool):
            raise ValueError(f"{where}: movable must be true or false, got {self.movable!r}")
        if not isinstance(self.models, tuple) or not all(isinstance(m, str) and m for m in self.models):
            raise ValueError(f"{where}: models must be a tuple of non-empty strings, got {self.models!r}")

    @property
    def can_move(self) -> bool:
        """Whether the planner may move it: movable and on exactly one GPU."""
        return self.movable and len(self.gpus) == 1

    def allows(self, model: str) -> bool:
        return not self.models or model in self.models


@dataclass(frozen=True, slots=True, order=True)
class GpuRef:
    """One GPU: its node's name and its index on that node."""

    node: str
    gpu: int

    def __str__(self) -> str:
        return f"{self.node}/{self.gpu}"


@dataclass(frozen=True, slots=True)
class Move:
    """Move one single-GPU workload from one GPU to another (a pod restart there)."""

    workload: str
    from_node: str
    from_gpu: int
    to_node: str
    to_gpu: int

    @property
    def source(self) -> GpuRef:
        return GpuRef(self.from_node, self.from_gpu)

    @property
    def target(self) -> GpuRef:
        return GpuRef(self.to_node, self.to_gpu)


@dataclass(frozen=True, slots=True)
class Pool:
    """Nodes and the workloads placed on them, validated as a whole.

    A pool may start over capacity (demands are peaks, which need not coincide); the plan
    never adds load to a GPU or node that is, or would become, over capacity.
    """

    nodes: tuple[PoolNode, ...]
    workloads: tuple[PoolWorkload, ...]

    def __post_init__(self) -> None:
        if not isinstance(self.nodes, tuple) or not isinstance(self.workloads, tuple):
            raise ValueError("Pool nodes and workloads must be tuples")
        if not self.nodes:
            raise ValueError("a pool needs at least one node")
        by_name: dict[str, PoolNode] = {}
        for node in self.nodes:
            if not isinstance(node, PoolNode):
                raise ValueError(f"Pool nodes must be PoolNode, got {type(node).__name__}")
            if node.name in by_name:
                raise ValueError(f"node {node.name!r} appears more than once")
            by_name[node.name] = node
        keys: set[str] = set()
        for w in self.workloads:
            if not isinstance(w, PoolWorkload):
                raise ValueError(f"Pool workloads must be PoolWorkload, got {type(w).__name__}")
            if w.key in keys:
                raise ValueError(f"workload {w.key!r} appears more than once")
            keys.add(w.key)
            home = by_name.get(w.node)
            if home is None:
                raise ValueError(f"workload {w.key!r}: unknown node {w.node!r}")
            bad = [g for g in w.gpus if g >= home.gpus]
            if bad:
                raise ValueError(f"workload {w.key!r}: node {w.node!r} has {home.gpus} GPU(s), no GPU {bad[0]}")
            if not w.allows(home.model):
                raise ValueError(f"workload {w.key!r}: runs on {home.model!r} but allows only {', '.join(w.models)}")

    @classmethod
    def build(cls, nodes: Sequence[PoolNode], workloads: Sequence[PoolWorkload]) -> Pool:
        return cls(nodes=tuple(nodes), workloads=tuple(workloads))

    def node(self, name: str) -> PoolNode:
        for node in self.nodes:
            if node.name == name:
                return node
        raise ValueError(f"unknown node {name!r}")

    @property
    def total_gpus(self) -> int:
        return sum(n.gpus for n in self.nodes)
