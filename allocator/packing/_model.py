"""Nodes, pods and the cluster as numpy arrays (FGD_EXPERIMENT.md §1).

Units: CPU in milli-cores, memory in MiB, GPU in milli-GPU (1000 = one whole GPU).
"""

from __future__ import annotations

import csv
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import numpy.typing as npt

__all__ = [
    "GPU_MILLI",
    "MAX_PODS_PER_NODE",
    "Cluster",
    "NodeSpec",
    "PodSpec",
    "read_nodes_csv",
    "read_pods_csv",
]

GPU_MILLI = 1000  # one whole GPU
MAX_PODS_PER_NODE = 1001  # a node takes a pod only while it holds fewer than this

IntArray = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]

NODE_COLUMNS = ("sn", "cpu_milli", "memory_mib", "gpu", "model")
POD_COLUMNS = ("name", "cpu_milli", "memory_mib", "num_gpu", "gpu_milli", "gpu_spec")


@dataclass(frozen=True, slots=True)
class NodeSpec:
    """One node: capacities and its GPU model (every GPU on a node is of that model)."""

    name: str
    cpu_milli: int
    memory_mib: int
    gpus: int
    model: str


@dataclass(frozen=True, slots=True)
class PodSpec:
    """One pod's request, already normalised.

    ``num_gpu == 0`` (a CPU pod) whenever the trace asks for no GPU or a share ``<= 0``;
    ``gpu_milli`` is the share per GPU, clipped to 1000. ``gpu_spec`` lists the allowed
    GPU models; empty means any model.
    """

    name: str
    cpu_milli: int
    memory_mib: int
    num_gpu: int
    gpu_milli: int
    gpu_spec: tuple[str, ...] = ()

    @classmethod
    def from_request(
        cls, *, name: str, cpu_milli: int, memory_mib: int, num_gpu: int, gpu_milli: int, gpu_spec: str = ""
    ) -> PodSpec:
        """Apply the trace's rules: clip the share to 1000, a share <= 0 or no GPU means a CPU pod."""
        if cpu_milli < 0 or memory_mib < 0 or num_gpu < 0:
            raise ValueError(
                f"pod {name!r}: cpu_milli, memory_mib and num_gpu must be >= 0, "
                f"got {cpu_milli}, {memory_mib}, {num_gpu}"
            )
        share = min(gpu_milli, GPU_MILLI)
        if num_gpu == 0 or share <= 0:
            return cls(name=name, cpu_milli=cpu_milli, memory_mib=memory_mib, num_gpu=0, gpu_milli=0)
        models = tuple(sorted({m.strip() for m in gpu_spec.split("|") if m.strip()}))
        return cls(
            name=name, cpu_milli=cpu_milli, memory_mib=memory_mib, num_gpu=num_gpu, gpu_milli=share, gpu_spec=models
        )

    @property
    def gpu_request_milli(self) -> int:
        """Total GPU milli this pod asks for (``num_gpu * gpu_milli``)."""
        return self.num_gpu * self.gpu_milli


@dataclass(frozen=True, slots=True, eq=False)
class Cluster:
    """Node capacities as arrays (index = node position in ``nodes``)."""

    nodes: tuple[NodeSpec, ...]
    cpu_milli: IntArray  # (n,)
    memory_mib: IntArray  # (n,)
    gpus: IntArray  # (n,) GPUs per node
    model_index: IntArray  # (n,) index into ``models``
    models: tuple[str, ...]  # sorted distinct GPU models
    max_gpus: int  # widest node; GPU arrays are (n, max_gpus)

    @classmethod
    def from_nodes(cls, nodes: Sequence[NodeSpec]) -> Cluster:
        if not nodes:
            raise ValueError("a cluster needs at least one node")
        seen: set[str] = set()
        for node in nodes:
            if node.name in seen:
                raise ValueError(f"node {node.name!r} appears more than once")
            seen.add(node.name)
            if node.cpu_milli < 0 or node.memory_mib < 0 or node.gpus < 0:
                raise ValueError(f"node {node.name!r}: capacities must be >= 0")
        models = tuple(sorted({n.model for n in nodes}))
        lookup = {m: i for i, m in enumerate(models)}
        gpus = np.array([n.gpus for n in nodes], dtype=np.int64)
        return cls(
            nodes=tuple(nodes),
            cpu_milli=np.array([n.cpu_milli for n in nodes], dtype=np.int64),
            memory_mib=np.array([n.memory_mib for n in nodes], dtype=np.int64),
            gpus=gpus,
            model_index=np.array([lookup[n.model] for n in nodes], dtype=np.int64),
            models=models,
            max_gpus=max(1, int(gpus.max())),
        )

    @property
    def size(self) -> int:
        return len(self.nodes)

    @property
    def total_gpus(self) -> int:
        return int(self.gpus.sum())

    def allowed_nodes(self, gpu_spec: tuple[str, ...]) -> BoolArray:
        """Nodes whose GPU model a pod with this ``gpu_spec`` may use (all when empty)."""
        if not gpu_spec:
            return np.ones(self.size, dtype=np.bool_)
        allowed = np.array([m in gpu_spec for m in self.models], dtype=np.bool_)
        return allowed[self.model_index]


def _int_field(row: Mapping[str, str], column: str, where: str) -> int:
    raw = (row.get(column) or "").strip()
    try:
        return int(raw)
    except ValueError:
        try:
            value = float(raw)
        except ValueError:
            raise ValueError(f"{where}: column {column!r} must be a number, got {raw!r}") from None
        if not value.is_integer():
            raise ValueError(f"{where}: column {column!r} must be a whole number, got {raw!r}") from None
        return int(value)


def _check_columns(path: Path, header: Sequence[str] | None, needed: Sequence[str]) -> list[str]:
    if header is None:
        raise ValueError(f"{path}: empty file, expected a header with {', '.join(needed)}")
    missing = [c for c in needed if c not in header]
    if missing:
        raise ValueError(f"{path}: missing column(s) {', '.join(missing)}")
    return list(header)


def read_nodes_csv(path: str | Path) -> tuple[NodeSpec, ...]:
    """Read a node list (columns ``sn,cpu_milli,memory_mib,gpu,model``)."""
    path = Path(path)
    with path.open(newline="", encoding="utf-8") as handle:
        reader = csv.DictReader(handle)
        _check_columns(path, reader.fieldnames, NODE_COLUMNS)
        nodes = []
        for line, row in enumerate(reader, start=2):
            where = f"{path}:{line}"
            nodes.append(
                NodeSpec(
                    name=row["sn"],
                    cpu_milli=_int_field(row, "cpu_milli", where),
                    memory_mib=_int_field(row, "memory_mib", where),
                    gpus=_int_field(row, "gpu", where),
                    model=(row["model"] or "").strip(),
                )
            )
    return tuple(nodes)


def read_pods_csv(path: str | Path) -> tuple[tuple[str, ...], tuple[dict[str, str], ...], tuple[PodSpec, ...]]:
    """Read a pod list: (header, raw rows, normalised pods), rows in file order.

    The raw rows keep every column so that an arrived workload can be written back in the
    same format.
    """
    path = Path(path)
    with path.open(newline="", encoding="utf-8") as handle:
        reader = csv.DictReader(handle)
        header = _check_columns(path, reader.fieldnames, POD_COLUMNS)
        rows: list[dict[str, str]] = []
        pods: list[PodSpec] = []
        for line, row in enumerate(reader, start=2):
            where = f"{path}:{line}"
            rows.append({k: (v if v is not None else "") for k, v in row.items() if k is not None})
            pods.append(
                PodSpec.from_request(
                    name=row["name"],
                    cpu_milli=_int_field(row, "cpu_milli", where),
                    memory_mib=_int_field(row, "memory_mib", where),
                    num_gpu=_int_field(row, "num_gpu", where),
                    gpu_milli=_int_field(row, "gpu_milli", where),
                    gpu_spec=row.get("gpu_spec") or "",
                )
            )
    names = [p.name for p in pods]
    if len(set(names)) != len(names):
        raise ValueError(f"{path}: pod names must be unique")
    return tuple(header), tuple(rows), tuple(pods)
