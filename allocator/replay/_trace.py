"""Reading the three public traces the replay needs (data/traces/README.md).

- ``openb_pod_list_default.csv`` (Alibaba, FGD ATC '23): one row per pod.
- ``openb_node_list_gpu_node.csv``: the fleet; only its GPU count is used (every GPU
  is priced and sized as an A100-80GB, docs/replay.md).
- ``AzureLLMInferenceTrace_conv.csv`` (Azure, Splitwise ISCA '24): request arrivals and
  token counts, the source of burst shapes.

Holding rule for pods (docs/replay.md §Trace): a GPU pod holds its GPUs over
``[scheduled_time, deletion_time)``; ``creation_time`` stands in when ``scheduled_time``
is empty on a pod that is not Pending; a missing ``deletion_time`` means the pod still
runs at the end of the trace (the latest timestamp in the file). Pending pods never
held a GPU and are left out, as are CPU-only pods and pods whose interval is empty.

A pod list with none of the time columns (``pod_phase``, ``creation_time``,
``deletion_time``, ``scheduled_time``; openb's ``multigpu*`` lists, made for packing) is a
**snapshot**: every GPU pod in it is present from second 0 and held for ``snapshot_s``.
"""

from __future__ import annotations

import csv
import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import numpy.typing as npt

from allocator.predict import read_azure_llm_trace
from allocator.predict._signal import cell_number  # the one reading of a trace's number cell

__all__ = [
    "DEFAULT_SNAPSHOT_S",
    "AzureRequests",
    "Fleet",
    "GpuPod",
    "PodTrace",
    "TraceError",
    "read_azure_requests",
    "read_fleet",
    "read_pod_trace",
]

FloatArray = npt.NDArray[np.float64]

GPU_MILLI = 1000  # one whole GPU in the trace's unit
_POD_COLUMNS = ("name", "num_gpu", "gpu_milli")
_TIME_COLUMNS = ("pod_phase", "creation_time", "deletion_time", "scheduled_time")
DEFAULT_SNAPSHOT_S = 24 * 3_600.0  # how long a snapshot's pods are held when the caller names no time
_NODE_COLUMNS = ("sn", "gpu", "model")


class TraceError(ValueError):
    """A trace file is missing a column or holds a value the replay cannot use."""


@dataclass(frozen=True, slots=True)
class GpuPod:
    """One pod that held GPUs: ``num_gpu`` cards, ``gpu_milli`` thousandths of each."""

    name: str
    num_gpu: int  # >= 1
    gpu_milli: int  # 1..1000, the share of each of its GPUs
    start_s: float  # seconds from trace start; the GPUs are held from here ...
    end_s: float  # ... up to here (exclusive); end_s > start_s

    def __post_init__(self) -> None:
        if not self.name:
            raise TraceError("pod name must not be empty")
        if self.num_gpu < 1:
            raise TraceError(f"pod {self.name!r}: num_gpu must be >= 1, got {self.num_gpu}")
        if not 1 <= self.gpu_milli <= GPU_MILLI:
            raise TraceError(f"pod {self.name!r}: gpu_milli must be in 1..{GPU_MILLI}, got {self.gpu_milli}")
        if not (math.isfinite(self.start_s) and math.isfinite(self.end_s)) or self.start_s < 0:
            raise TraceError(f"pod {self.name!r}: start_s and end_s must be finite and start_s >= 0")
        if self.end_s <= self.start_s:
            raise TraceError(f"pod {self.name!r}: end_s ({self.end_s}) must be after start_s ({self.start_s})")

    @property
    def share(self) -> float:
        """Fraction of each of its GPUs the pod requested (gpu_milli / 1000)."""
        return self.gpu_milli / GPU_MILLI

    @property
    def duration_s(self) -> float:
        return self.end_s - self.start_s


@dataclass(frozen=True, slots=True)
class PodTrace:
    """The GPU pods to replay, sorted by (start_s, name), and what was left out and why."""

    pods: tuple[GpuPod, ...]
    rows: int  # data rows read
    cpu_only: int  # num_gpu == 0 or gpu_milli == 0
    pending: int  # pod_phase == Pending: never scheduled, never held a GPU
    empty_interval: int  # deletion at or before the start: nothing held
    still_running: int  # no deletion_time: held until the end of the trace
    snapshot_s: float | None = None  # a list without times: every pod held over [0, snapshot_s)

    def __post_init__(self) -> None:
        names = [p.name for p in self.pods]
        if len(set(names)) != len(names):
            raise TraceError("pod names must be unique")


@dataclass(frozen=True, slots=True)
class Fleet:
    """GPUs in the node list, by the trace's model code."""

    nodes: int
    gpus: int
    gpus_by_model: Mapping[str, int]


@dataclass(frozen=True, slots=True)
class AzureRequests:
    """LLM requests sorted by arrival; ``arrival_s`` counts from the first request."""

    arrival_s: FloatArray
    context_tokens: FloatArray
    generated_tokens: FloatArray

    def __post_init__(self) -> None:
        n = len(self.arrival_s)
        if n < 2:
            raise TraceError("the request trace needs at least two requests")
        if len(self.context_tokens) != n or len(self.generated_tokens) != n:
            raise TraceError("arrival_s, context_tokens and generated_tokens must have the same length")
        if not np.all(np.isfinite(self.arrival_s)) or np.any(np.diff(self.arrival_s) < 0) or self.arrival_s[0] < 0:
            raise TraceError("arrival_s must be finite, sorted and >= 0")
        if np.any(self.context_tokens < 0) or np.any(self.generated_tokens < 0):
            raise TraceError("token counts must be >= 0")


def _columns(path: Path, header: list[str] | None, needed: tuple[str, ...]) -> None:
    missing = [c for c in needed if c not in (header or [])]
    if missing:
        raise TraceError(f"{path}: missing column(s) {', '.join(missing)}")


def _number(row: Mapping[str, str], column: str, where: str) -> float | None:
    try:
        return cell_number(row.get(column), column, where)
    except ValueError as error:
        raise TraceError(str(error)) from None


def _integer(row: Mapping[str, str], column: str, where: str) -> int:
    value = _number(row, column, where)
    if value is None or value != int(value):
        raise TraceError(f"{where}: {column} must be a non-negative integer, got {row.get(column)!r}")
    return int(value)


def _gpu_request(row: Mapping[str, str], where: str) -> tuple[str, int, int]:
    """(name, num_gpu, gpu_milli) of a row; num_gpu or gpu_milli 0: CPU-only."""
    name = (row["name"] or "").strip()
    if not name:
        raise TraceError(f"{where}: empty pod name")
    return name, _integer(row, "num_gpu", where), _integer(row, "gpu_milli", where)


def _check_milli(milli: int, where: str) -> None:
    if milli > GPU_MILLI:
        raise TraceError(f"{where}: gpu_milli must be <= {GPU_MILLI}, got {milli}")


def read_pod_trace(path: Path | str, *, snapshot_s: float = DEFAULT_SNAPSHOT_S) -> PodTrace:
    """Read an ``openb_pod_list_*.csv`` file and apply the holding rule of this module.

    A list without time columns is a snapshot, each GPU pod held over ``[0, snapshot_s)``.
    """
    path = Path(path)
    if not (math.isfinite(snapshot_s) and snapshot_s > 0):
        raise TraceError(f"snapshot_s must be finite and > 0, got {snapshot_s!r}")
    raw: list[tuple[str, int, int, float, float | None]] = []
    rows = cpu_only = pending = empty = running = 0
    latest = 0.0
    with path.open(newline="", encoding="utf-8") as handle:
        reader = csv.DictReader(handle)
        header = list(reader.fieldnames or [])
        timed = any(c in header for c in _TIME_COLUMNS)
        # All the time columns or none (a snapshot): a list with some is damaged, not a snapshot.
        _columns(path, header, _POD_COLUMNS + (_TIME_COLUMNS if timed else ()))
        for line, row in enumerate(reader, start=2):
            rows += 1
            where = f"{path}:{line}"
            name, num_gpu, milli = _gpu_request(row, where)
            if not timed:
                if num_gpu and milli:
                    _check_milli(milli, where)
                    raw.append((name, num_gpu, milli, 0.0, snapshot_s))
                else:
                    cpu_only += 1
                continue
            created = _number(row, "creation_time", where)
            deleted = _number(row, "deletion_time", where)
            scheduled = _number(row, "scheduled_time", where)
            if created is None:
                raise TraceError(f"{where}: creation_time is empty")
            latest = max(latest, created, deleted or 0.0, scheduled or 0.0)
            if num_gpu == 0 or milli == 0:
                cpu_only += 1
                continue
            if (row["pod_phase"] or "").strip() == "Pending":
                pending += 1
                continue
            _check_milli(milli, where)
            raw.append((name, num_gpu, milli, scheduled if scheduled is not None else created, deleted))
    pods: list[GpuPod] = []
    for name, num_gpu, milli, start, deleted in raw:
        if deleted is None:
            running += 1
        end = latest if deleted is None else deleted
        if end <= start:
            empty += 1
            continue
        pods.append(GpuPod(name=name, num_gpu=num_gpu, gpu_milli=milli, start_s=start, end_s=end))
    pods.sort(key=lambda p: (p.start_s, p.name))
    return PodTrace(
        pods=tuple(pods),
        rows=rows,
        cpu_only=cpu_only,
        pending=pending,
        empty_interval=empty,
        still_running=running,
        snapshot_s=None if timed else snapshot_s,
    )


def read_fleet(path: Path | str) -> Fleet:
    """Read an ``openb_node_list_*.csv`` file: nodes and GPUs by model."""
    path = Path(path)
    by_model: dict[str, int] = {}
    nodes = 0
    with path.open(newline="", encoding="utf-8") as handle:
        reader = csv.DictReader(handle)
        _columns(path, list(reader.fieldnames or []), _NODE_COLUMNS)
        for line, row in enumerate(reader, start=2):
            nodes += 1
            gpus = _integer(row, "gpu", f"{path}:{line}")
            model = (row["model"] or "").strip() or "unknown"
            by_model[model] = by_model.get(model, 0) + gpus
    if nodes == 0:
        raise TraceError(f"{path}: no nodes")
    return Fleet(nodes=nodes, gpus=sum(by_model.values()), gpus_by_model=dict(sorted(by_model.items())))


def read_azure_requests(path: Path | str) -> AzureRequests:
    """Read ``TIMESTAMP,ContextTokens,GeneratedTokens`` (Azure LLM inference traces, 2023 and 2024)
    with the predictors' reader (:func:`allocator.predict.read_azure_llm_trace`: one reading of the
    format); its errors come out as :class:`TraceError`."""
    try:
        trace = read_azure_llm_trace(path)
    except ValueError as error:
        raise TraceError(str(error)) from None
    return AzureRequests(
        arrival_s=trace.arrival_s, context_tokens=trace.context_tokens, generated_tokens=trace.generated_tokens
    )
