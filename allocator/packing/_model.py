"""Nodes, pods and the cluster as numpy arrays (docs/packing.md, Semantics and Trace files).

Units: CPU in milli-cores, memory in MiB, GPU in milli-GPU (1000 = one whole GPU).
"""

from __future__ import annotations

import csv
import math
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
    "TraceFormatError",
    "read_nodes_csv",
    "read_pods_csv",
]

GPU_MILLI = 1000  # one whole GPU
MAX_PODS_PER_NODE = 1001  # a node takes a pod only while it holds fewer than this

IntArray = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]

NODE_COLUMNS = ("sn", "cpu_milli", "memory_mib", "gpu", "model")


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


Row = Mapping[str | None, str | None]  # a csv.DictReader row (None: extra fields / missing values)


class TraceFormatError(ValueError):
    """A node or pod CSV the reader cannot use; the message names the file, row and column."""


def _where(path: Path, line: int, column: str) -> str:
    return f"{path}: row {line}, column {column!r}"


def _cell(row: Row, column: str) -> str:
    return (row.get(column) or "").strip()


def _whole(path: Path, line: int, row: Row, column: str) -> int:
    """A whole number >= 0 (``12000`` or ``12000.0``); an empty cell is an error."""
    raw = _cell(row, column)
    if not raw:
        raise TraceFormatError(f"{_where(path, line, column)}: empty, expected a whole number >= 0")
    try:
        value = int(raw)
    except ValueError:
        try:
            number = float(raw)
        except ValueError:
            raise TraceFormatError(f"{_where(path, line, column)}: must be a number, got {raw!r}") from None
        if not math.isfinite(number) or not number.is_integer():
            raise TraceFormatError(f"{_where(path, line, column)}: must be a whole number, got {raw!r}") from None
        value = int(number)
    if value < 0:
        raise TraceFormatError(f"{_where(path, line, column)}: must be >= 0, got {raw!r}")
    return value


def _cores_as_milli(path: Path, line: int, row: Row, column: str) -> int:
    """CPU in cores (``cpu``, may be fractional) as milli-cores, truncated as the simulator's ``%dm`` does."""
    raw = _cell(row, column)
    try:
        cores = float(raw)
    except ValueError:
        raise TraceFormatError(f"{_where(path, line, column)}: must be a number of cores, got {raw!r}") from None
    if not math.isfinite(cores) or cores < 0:
        raise TraceFormatError(f"{_where(path, line, column)}: must be a finite number >= 0, got {raw!r}")
    return int(cores * 1000)


def _gpu_share(path: Path, line: int, row: Row) -> int:
    """``gpu_milli`` as the simulator reads it: absent column → 1000, empty cell → 0 (a CPU pod)."""
    if "gpu_milli" not in row:
        return GPU_MILLI
    raw = _cell(row, "gpu_milli")
    if not raw:
        return 0
    try:
        number = float(raw)
    except ValueError:
        raise TraceFormatError(f"{_where(path, line, 'gpu_milli')}: must be a number, got {raw!r}") from None
    if not math.isfinite(number) or not number.is_integer():
        raise TraceFormatError(f"{_where(path, line, 'gpu_milli')}: must be a whole number, got {raw!r}")
    return int(number)


def _open_table(path: Path, needed: Sequence[Sequence[str]]) -> tuple[list[str], list[tuple[int, Row]]]:
    """Header and (row number, row) pairs; each entry of ``needed`` lists alternatives, one of which must exist."""
    with path.open(newline="", encoding="utf-8-sig") as handle:
        reader = csv.DictReader(handle)
        if reader.fieldnames is None:
            wanted = ", ".join(" or ".join(alt) for alt in needed)
            raise TraceFormatError(f"{path}: empty file, expected a header with {wanted}")
        header = [h.strip() for h in reader.fieldnames]
        reader.fieldnames = header
        duplicated = sorted({h for h in header if header.count(h) > 1})
        if duplicated:
            raise TraceFormatError(f"{path}: column(s) {', '.join(map(repr, duplicated))} appear more than once")
        missing = [" or ".join(alt) for alt in needed if not any(a in header for a in alt)]
        if missing:
            raise TraceFormatError(f"{path}: missing column(s) {', '.join(missing)}")
        rows: list[tuple[int, Row]] = []
        for row in reader:
            extra = row.get(None)
            absent = sum(1 for k, v in row.items() if k is not None and v is None)
            if extra or absent:
                fields = len(header) + len(extra or []) - absent
                raise TraceFormatError(
                    f"{path}: row {reader.line_num} has {fields} field(s), the header has {len(header)}"
                )
            rows.append((reader.line_num, row))
    return header, rows


def read_nodes_csv(path: str | Path) -> tuple[NodeSpec, ...]:
    """Read a node list (columns ``sn,cpu_milli,memory_mib,gpu,model``, all required, as in the simulator).

    ``model`` may be empty only on a node without GPUs (the CPU nodes of ``openb_node_list_all_node``).
    """
    path = Path(path)
    _, rows = _open_table(path, [(c,) for c in NODE_COLUMNS])
    nodes: list[NodeSpec] = []
    seen: dict[str, int] = {}
    for line, row in rows:
        name = _cell(row, "sn")
        if not name:
            raise TraceFormatError(f"{_where(path, line, 'sn')}: empty node name")
        if name in seen:
            raise TraceFormatError(f"{_where(path, line, 'sn')}: node {name!r} already on row {seen[name]}")
        seen[name] = line
        gpus = _whole(path, line, row, "gpu")
        model = _cell(row, "model")
        if gpus > 0 and not model:
            raise TraceFormatError(f"{_where(path, line, 'model')}: empty, but the node has {gpus} GPU(s)")
        nodes.append(
            NodeSpec(
                name=name,
                cpu_milli=_whole(path, line, row, "cpu_milli"),
                memory_mib=_whole(path, line, row, "memory_mib"),
                gpus=gpus,
                model=model,
            )
        )
    return tuple(nodes)


def _pod_name(path: Path, line: int, row: Row) -> str:
    if "name" in row:
        name = _cell(row, "name")
        if not name:
            raise TraceFormatError(f"{_where(path, line, 'name')}: empty pod name")
        return name
    return f"job-{_whole(path, line, row, 'job_id'):04d}"  # the simulator's name for a job_id row


def read_pods_csv(path: str | Path) -> tuple[tuple[str, ...], tuple[dict[str, str], ...], tuple[PodSpec, ...]]:
    """Read a pod list: (header, raw rows, normalised pods), rows in file order.

    Accepts every shape the simulator's ``pod_csv_to_yaml.py`` reads (docs/packing.md, "Trace
    files"): ``name`` or ``job_id``; ``cpu_milli`` or ``cpu`` (cores); ``num_gpu``; optional
    ``memory_mib`` (absent: 0), ``gpu_milli`` (absent: 1000) and ``gpu_spec`` (absent or empty:
    any model). Other columns (``qos``, ``pod_phase``, the times...) are kept but not read. The
    raw rows keep every column so that an arrived workload can be written back in the same
    format; when the file has ``job_id`` but no ``name``, ``name`` is added to the header.
    """
    path = Path(path)
    header, rows = _open_table(path, [("name", "job_id"), ("cpu_milli", "cpu"), ("num_gpu",)])
    cpu_column = "cpu_milli" if "cpu_milli" in header else "cpu"
    raw_rows: list[dict[str, str]] = []
    pods: list[PodSpec] = []
    seen: dict[str, int] = {}
    for line, row in rows:
        name = _pod_name(path, line, row)
        if name in seen:
            raise TraceFormatError(f"{path}: row {line}: pod name {name!r} already on row {seen[name]}")
        seen[name] = line
        if cpu_column == "cpu_milli":
            cpu_milli = _whole(path, line, row, "cpu_milli")
        else:
            cpu_milli = _cores_as_milli(path, line, row, "cpu")
        memory_mib = _whole(path, line, row, "memory_mib") if "memory_mib" in row else 0
        num_gpu = _whole(path, line, row, "num_gpu")
        share = _gpu_share(path, line, row) if num_gpu else 0
        gpu_spec = _cell(row, "gpu_spec")
        raw_rows.append({k: (v or "") for k, v in row.items() if k is not None} | {"name": name})
        pods.append(
            PodSpec.from_request(
                name=name,
                cpu_milli=cpu_milli,
                memory_mib=memory_mib,
                num_gpu=num_gpu,
                gpu_milli=share,
                gpu_spec=gpu_spec,
            )
        )
    out_header = header if "name" in header else ["name", *header]
    return tuple(out_header), tuple(raw_rows), tuple(pods)
