"""Mutable loads of a pool while a plan is built or replayed.

Every move is checked against the loads *at that step*: the target GPU's memory and SM, and,
when the move changes node, the target node's host CPU and memory. Sources only lose load, so
a sequence of moves that each pass this check never overcommits anything at any step.
"""

from __future__ import annotations

from allocator.rebalance._model import GpuRef, Move, Pool, PoolNode, PoolWorkload

__all__ = ["PoolState"]


class PoolState:
    """GPU and host loads per node, the workloads on each GPU, and where each one runs."""

    def __init__(self, pool: Pool) -> None:
        self.pool = pool
        self.nodes: dict[str, PoolNode] = {n.name: n for n in pool.nodes}
        self.workloads: dict[str, PoolWorkload] = {w.key: w for w in pool.workloads}
        self.gpu_memory_mb: dict[GpuRef, int] = {}
        self.gpu_sm_milli: dict[GpuRef, int] = {}
        self.members: dict[GpuRef, set[str]] = {}
        for node in pool.nodes:
            for g in range(node.gpus):
                ref = GpuRef(node.name, g)
                self.gpu_memory_mb[ref] = 0
                self.gpu_sm_milli[ref] = 0
                self.members[ref] = set()
        # Per-node sums kept in step with the per-GPU ones (ordering reads them on every step).
        self.node_memory_mb: dict[str, int] = dict.fromkeys(self.nodes, 0)
        self.node_sm_milli: dict[str, int] = dict.fromkeys(self.nodes, 0)
        self.busy_count: dict[str, int] = dict.fromkeys(self.nodes, 0)
        self.host_cpu_milli: dict[str, int] = dict.fromkeys(self.nodes, 0)
        self.host_memory_mib: dict[str, int] = dict.fromkeys(self.nodes, 0)
        self.where: dict[str, GpuRef] = {}  # single-GPU workloads only
        for w in pool.workloads:
            for g in w.gpus:
                ref = GpuRef(w.node, g)
                self.gpu_memory_mb[ref] += w.memory_mb
                self.gpu_sm_milli[ref] += w.sm_milli
                self.members[ref].add(w.key)
                self.node_memory_mb[w.node] += w.memory_mb
                self.node_sm_milli[w.node] += w.sm_milli
            self.host_cpu_milli[w.node] += w.cpu_milli
            self.host_memory_mib[w.node] += w.memory_mib
            if len(w.gpus) == 1:
                self.where[w.key] = GpuRef(w.node, w.gpus[0])
        for ref, keys in self.members.items():
            if keys:
                self.busy_count[ref.node] += 1
        self._sorted_gpus = tuple(sorted(self.members))

    # --- reads ------------------------------------------------------------------------------

    def gpus(self) -> tuple[GpuRef, ...]:
        """Every GPU of the pool, sorted by node name and index."""
        return self._sorted_gpus

    def busy(self, ref: GpuRef) -> bool:
        return bool(self.members[ref])

    def busy_gpus(self) -> set[GpuRef]:
        return {ref for ref, keys in self.members.items() if keys}

    def node_busy(self, node: str) -> bool:
        return self.busy_count[node] > 0

    def gpu_load(self, ref: GpuRef) -> float:
        """Memory and SM use as fractions of the GPU, added (0..2); for ordering only."""
        node = self.nodes[ref.node]
        return self.gpu_memory_mb[ref] / node.gpu_memory_mb + self.gpu_sm_milli[ref] / node.gpu_sm_milli

    def node_load(self, node: str) -> float:
        """``gpu_load`` summed over the node's GPUs (0..2 × GPUs); for ordering only."""
        spec = self.nodes[node]
        return self.node_memory_mb[node] / spec.gpu_memory_mb + self.node_sm_milli[node] / spec.gpu_sm_milli

    def overcommitted(self) -> list[str]:
        """What is over capacity now, as ``'<node>/<gpu> memory'``-style labels, sorted."""
        found: list[str] = []
        for ref in self.gpus():
            node = self.nodes[ref.node]
            if self.gpu_memory_mb[ref] > node.gpu_memory_mb:
                found.append(f"{ref} memory")
            if self.gpu_sm_milli[ref] > node.gpu_sm_milli:
                found.append(f"{ref} sm")
        for name in sorted(self.nodes):
            node = self.nodes[name]
            if node.cpu_milli is not None and self.host_cpu_milli[name] > node.cpu_milli:
                found.append(f"{name} cpu")
            if node.memory_mib is not None and self.host_memory_mib[name] > node.memory_mib:
                found.append(f"{name} host memory")
        return found

    # --- checks and writes --------------------------------------------------------------------

    def refusal(self, key: str, target: GpuRef) -> str | None:
        """Why moving ``key`` to ``target`` now would be invalid, or ``None`` when it is valid."""
        w = self.workloads.get(key)
        if w is None:
            return f"unknown workload {key!r}"
        if not w.movable:
            return f"workload {key!r} is not movable"
        if len(w.gpus) != 1:
            return f"workload {key!r} spans {len(w.gpus)} GPUs; only single-GPU workloads move"
        node = self.nodes.get(target.node)
        if node is None:
            return f"unknown node {target.node!r}"
        if not 0 <= target.gpu < node.gpus:
            return f"node {target.node!r} has {node.gpus} GPU(s), no GPU {target.gpu}"
        source = self.where[key]
        if source == target:
            return f"workload {key!r} is already on {target}"
        if not w.allows(node.model):
            return f"workload {key!r} allows only {', '.join(w.models)}, {target} is {node.model!r}"
        memory = self.gpu_memory_mb[target] + w.memory_mb
        if memory > node.gpu_memory_mb:
            return f"{target} would hold {memory} MB of {node.gpu_memory_mb} MB"
        sm = self.gpu_sm_milli[target] + w.sm_milli
        if sm > node.gpu_sm_milli:
            return f"{target} would use {sm} SM milli of {node.gpu_sm_milli}"
        if target.node != source.node:
            cpu = self.host_cpu_milli[target.node] + w.cpu_milli
            if node.cpu_milli is not None and cpu > node.cpu_milli:
                return f"node {target.node!r} would use {cpu} CPU milli of {node.cpu_milli}"
            mib = self.host_memory_mib[target.node] + w.memory_mib
            if node.memory_mib is not None and mib > node.memory_mib:
                return f"node {target.node!r} would use {mib} MiB host memory of {node.memory_mib}"
        return None

    def move(self, key: str, target: GpuRef) -> Move:
        """Apply one checked move; raises ``ValueError`` with the reason when it is invalid."""
        reason = self.refusal(key, target)
        if reason is not None:
            raise ValueError(reason)
        w = self.workloads[key]
        source = self.where[key]
        self._shift(w, source, target)
        return Move(workload=key, from_node=source.node, from_gpu=source.gpu, to_node=target.node, to_gpu=target.gpu)

    def undo(self, move: Move) -> None:
        """Take back the last applied ``move`` (no checks: it restores an earlier state)."""
        self._shift(self.workloads[move.workload], move.target, move.source)

    def _shift(self, w: PoolWorkload, source: GpuRef, target: GpuRef) -> None:
        self.gpu_memory_mb[source] -= w.memory_mb
        self.gpu_sm_milli[source] -= w.sm_milli
        self.node_memory_mb[source.node] -= w.memory_mb
        self.node_sm_milli[source.node] -= w.sm_milli
        self.members[source].discard(w.key)
        if not self.members[source]:
            self.busy_count[source.node] -= 1
        if not self.members[target]:
            self.busy_count[target.node] += 1
        self.gpu_memory_mb[target] += w.memory_mb
        self.gpu_sm_milli[target] += w.sm_milli
        self.node_memory_mb[target.node] += w.memory_mb
        self.node_sm_milli[target.node] += w.sm_milli
        self.members[target].add(w.key)
        if source.node != target.node:
            self.host_cpu_milli[source.node] -= w.cpu_milli
            self.host_memory_mib[source.node] -= w.memory_mib
            self.host_cpu_milli[target.node] += w.cpu_milli
            self.host_memory_mib[target.node] += w.memory_mib
        self.where[w.key] = target
