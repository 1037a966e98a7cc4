"""Wire formats of a usage batch (docs/protocol.md): one place renders them. v1 carries the
per-second samples (what the spool keeps as evidence, and what an agent run with ``--wire v1``
sends); v2 carries their integrals per workload, GPU and UTC minute (``windows_of``)."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from agents.interfaces import GpuInfo, Workload, WorkloadMeta

__all__ = ["SCHEMA", "SCHEMA_V2", "Sample", "Window", "format_utc", "gpu_from_wire", "gpu_to_wire", "parse_utc",
           "render_batch", "render_windows", "windows_of"]

SCHEMA = "vgpu-ledger/usage-batch/v1"
SCHEMA_V2 = "vgpu-ledger/usage-batch/v2"
_MINUTE_S = 60


def format_utc(moment: datetime) -> str:
    """``2026-11-30T03:00:00Z``; the wire carries whole UTC seconds only."""
    if moment.tzinfo is None or moment.utcoffset() != UTC.utcoffset(None):
        raise ValueError(f"{moment!r} is not an aware UTC datetime")
    if moment.microsecond:
        raise ValueError(f"{moment.isoformat()} is not aligned to a whole second")
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_utc(text: str) -> datetime:
    """The inverse of ``format_utc``."""
    if not text.endswith("Z"):
        raise ValueError(f"{text!r} is not a UTC timestamp ending in Z")
    return datetime.fromisoformat(text[:-1] + "+00:00")


def gpu_to_wire(gpu: GpuInfo) -> dict[str, Any]:
    return {"uuid": gpu.uuid, "model": gpu.model, "memory_mb": gpu.memory_mb, "sm_count": gpu.sm_count}


def _with_energy(wire: dict[str, Any], joules: float | None) -> dict[str, Any]:
    return wire if joules is None else {**wire, "energy_j": round(joules, 3)}


def gpu_from_wire(item: Mapping[str, Any]) -> GpuInfo:
    return GpuInfo(uuid=item["uuid"], model=item["model"], memory_mb=item["memory_mb"], sm_count=item["sm_count"])


@dataclass(frozen=True, slots=True)
class Sample:
    """Integrals of one workload on one GPU over ``[start, start + seconds)``."""

    start: datetime
    seconds: int
    gpu: str
    workload: Workload
    mem_used_mb_s: float
    mem_granted_mb_s: float
    sm_used_s: float  # one SM fully busy for one second = 1 SM·s
    sm_granted_s: float
    pcie_mb: float

    def to_wire(self) -> dict[str, Any]:
        w = self.workload
        wire: dict[str, Any] = {
            "start": format_utc(self.start),
            "seconds": self.seconds,
            "gpu": self.gpu,
            "tenant": w.tenant,
            "namespace": w.namespace,
            "pod": w.pod,
            "container": w.container,
            "pod_uid": w.pod_uid,
            "sla_tier": w.sla_tier,
            "mem_used_mb_s": self.mem_used_mb_s,
            "mem_granted_mb_s": self.mem_granted_mb_s,
            "sm_used_s": self.sm_used_s,
            "sm_granted_s": self.sm_granted_s,
            "pcie_mb": self.pcie_mb,
        }
        # The optional grouping fields (docs/protocol.md), only those known: old servers ignore them.
        wire.update(w.meta.to_wire())
        return wire

    @classmethod
    def from_wire(cls, item: Mapping[str, Any]) -> Sample:
        """A sample as ``to_wire`` wrote it (the spool's checkpoint of an open batch)."""
        return cls(
            start=parse_utc(item["start"]),
            seconds=item["seconds"],
            gpu=item["gpu"],
            workload=Workload(
                tenant=item["tenant"],
                namespace=item["namespace"],
                pod=item["pod"],
                container=item["container"],
                pod_uid=item["pod_uid"],
                sla_tier=item["sla_tier"],
                meta=WorkloadMeta(
                    controller_kind=item.get("controller_kind", ""),
                    controller_name=item.get("controller_name", ""),
                    labels=tuple(sorted(item.get("labels", {}).items())),
                    mem_requested_mb=item.get("mem_requested_mb"),
                    sm_requested=item.get("sm_requested"),
                ),
            ),
            mem_used_mb_s=item["mem_used_mb_s"],
            mem_granted_mb_s=item["mem_granted_mb_s"],
            sm_used_s=item["sm_used_s"],
            sm_granted_s=item["sm_granted_s"],
            pcie_mb=item["pcie_mb"],
        )


@dataclass(frozen=True, slots=True)
class Window:
    """One workload's integrals on one GPU over the part of one UTC minute its samples cover: the
    sums of those samples, and of max(used, granted) per sample (the ``max`` billed basis). Each
    sample's integrals are multiples of 2^-10 (agents/meter.py), so these float sums are exact."""

    minute: datetime
    gpu: str
    workload: Workload
    seconds: int = 0
    mem_used_mb_s: float = 0.0
    mem_granted_mb_s: float = 0.0
    mem_billed_mb_s: float = 0.0
    sm_used_s: float = 0.0
    sm_granted_s: float = 0.0
    sm_billed_s: float = 0.0
    pcie_mb: float = 0.0
    mem_peak_mb: float = 0.0  # the largest per-sample mean of used memory
    sm_peak: float = 0.0

    def plus(self, s: Sample) -> Window:
        return Window(
            minute=self.minute, gpu=self.gpu, workload=s.workload, seconds=self.seconds + s.seconds,
            mem_used_mb_s=self.mem_used_mb_s + s.mem_used_mb_s,
            mem_granted_mb_s=self.mem_granted_mb_s + s.mem_granted_mb_s,
            mem_billed_mb_s=self.mem_billed_mb_s + max(s.mem_used_mb_s, s.mem_granted_mb_s),
            sm_used_s=self.sm_used_s + s.sm_used_s, sm_granted_s=self.sm_granted_s + s.sm_granted_s,
            sm_billed_s=self.sm_billed_s + max(s.sm_used_s, s.sm_granted_s), pcie_mb=self.pcie_mb + s.pcie_mb,
            mem_peak_mb=max(self.mem_peak_mb, s.mem_used_mb_s / s.seconds),
            sm_peak=max(self.sm_peak, s.sm_used_s / s.seconds),
        )

    def to_wire(self) -> dict[str, Any]:
        w = self.workload
        wire: dict[str, Any] = {
            "minute": format_utc(self.minute), "seconds": self.seconds, "gpu": self.gpu,
            "tenant": w.tenant, "namespace": w.namespace, "pod": w.pod, "container": w.container,
            "pod_uid": w.pod_uid, "sla_tier": w.sla_tier,
            "mem_used_mb_s": self.mem_used_mb_s, "mem_granted_mb_s": self.mem_granted_mb_s,
            "mem_billed_mb_s": self.mem_billed_mb_s, "sm_used_s": self.sm_used_s, "sm_granted_s": self.sm_granted_s,
            "sm_billed_s": self.sm_billed_s, "pcie_mb": self.pcie_mb,
            "mem_peak_mb": self.mem_peak_mb, "sm_peak": self.sm_peak,
        }
        wire.update(w.meta.to_wire())  # the newest sample's grouping fields, as v1's latest sample wins
        return wire


def windows_of(samples: Sequence[Sample]) -> list[Window]:
    """The samples summed per (GPU, workload, UTC minute), in time order. A sample never crosses a
    minute: the meter's periods are whole seconds that divide a minute or are whole minutes
    (agents.loop.AgentConfig), and a period longer than a minute is split by the service in v1 only."""
    windows: dict[tuple[datetime, str, str], Window] = {}
    for s in sorted(samples, key=lambda s: (s.start, s.gpu, s.workload.key)):
        if s.seconds > _MINUTE_S or (s.start.second + s.seconds) > _MINUTE_S:
            raise ValueError(f"a sample of {s.seconds} s at {s.start.isoformat()} crosses a UTC minute")
        minute = s.start.replace(second=0)
        key = (minute, s.gpu, s.workload.key)
        windows[key] = windows.get(key, Window(minute=minute, gpu=s.gpu, workload=s.workload)).plus(s)
    return list(windows.values())


def render_batch(
    *,
    node: str,
    batch_seq: int,
    window_start: datetime,
    window_end: datetime,
    gpus: Sequence[GpuInfo],
    samples: Sequence[Sample],
    cluster: str = "",
    energy_j: Mapping[str, float] | None = None,
    wire: str,
) -> bytes:
    """The exact bytes sent for a batch (compact JSON, stable ordering); ``cluster`` only when set.
    ``energy_j``: the joules each GPU drew over the whole window, for the GPUs that metered it (an
    optional field of the batch's GPU, docs/protocol.md); to the millijoule. ``wire``: "v1" sends
    the samples, "v2" their integrals per workload-minute."""
    if wire not in {"v1", "v2"}:
        raise ValueError(f"wire must be 'v1' or 'v2', got {wire!r}")
    ordered = sorted(samples, key=lambda s: (s.start, s.gpu, s.workload.key))
    if wire == "v2":
        return render_windows(node=node, batch_seq=batch_seq, window_start=window_start, window_end=window_end,
                              gpus=gpus, windows=windows_of(ordered), cluster=cluster, energy_j=energy_j)
    document = _head(SCHEMA, node=node, batch_seq=batch_seq, window_start=window_start, window_end=window_end,
                     gpus=gpus, cluster=cluster, energy_j=energy_j)
    document["samples"] = [s.to_wire() for s in ordered]
    return _encode(document)


def render_windows(
    *,
    node: str,
    batch_seq: int,
    window_start: datetime,
    window_end: datetime,
    gpus: Sequence[GpuInfo],
    windows: Sequence[Window],
    cluster: str = "",
    energy_j: Mapping[str, float] | None = None,
) -> bytes:
    """A v2 batch of windows already summed, in the order given (``windows_of``'s: by first
    sample, GPU and workload key). ``render_batch`` sends what this renders from the samples'
    ``windows_of``; a caller that sums the windows itself (bench/fleet.py, from arrays) gets the
    same bytes for the same windows."""
    document = _head(SCHEMA_V2, node=node, batch_seq=batch_seq, window_start=window_start, window_end=window_end,
                     gpus=gpus, cluster=cluster, energy_j=energy_j)
    document["windows"] = [w.to_wire() for w in windows]
    return _encode(document)


def _head(schema: str, *, node: str, batch_seq: int, window_start: datetime, window_end: datetime,
          gpus: Sequence[GpuInfo], cluster: str, energy_j: Mapping[str, float] | None) -> dict[str, Any]:
    if window_end <= window_start:
        raise ValueError(f"empty batch window [{window_start}, {window_end})")
    document: dict[str, Any] = {"schema": schema, "node": node}
    if cluster:
        document["cluster"] = cluster
    return document | {
        "batch_seq": batch_seq,
        "window": {"start": format_utc(window_start), "end": format_utc(window_end)},
        "gpus": [_with_energy(gpu_to_wire(g), (energy_j or {}).get(g.uuid)) for g in gpus],
    }


def _encode(document: dict[str, Any]) -> bytes:
    return json.dumps(document, separators=(",", ":"), allow_nan=False).encode("utf-8")
