"""Wire format v1 of a usage batch (docs/protocol.md): one place renders it."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from agents.interfaces import GpuInfo, Workload, WorkloadMeta

__all__ = ["SCHEMA", "Sample", "format_utc", "gpu_from_wire", "gpu_to_wire", "parse_utc", "render_batch"]

SCHEMA = "vgpu-ledger/usage-batch/v1"


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
) -> bytes:
    """The exact bytes sent for a batch (compact JSON, stable ordering); ``cluster`` only when set.
    ``energy_j``: the joules each GPU drew over the whole window, for the GPUs that metered it (an
    optional field of the batch's GPU, docs/protocol.md); to the millijoule."""
    if window_end <= window_start:
        raise ValueError(f"empty batch window [{window_start}, {window_end})")
    ordered = sorted(samples, key=lambda s: (s.start, s.gpu, s.workload.key))
    document: dict[str, Any] = {"schema": SCHEMA, "node": node}
    if cluster:
        document["cluster"] = cluster
    document |= {
        "batch_seq": batch_seq,
        "window": {"start": format_utc(window_start), "end": format_utc(window_end)},
        "gpus": [_with_energy(gpu_to_wire(g), (energy_j or {}).get(g.uuid)) for g in gpus],
        "samples": [s.to_wire() for s in ordered],
    }
    return json.dumps(document, separators=(",", ":"), allow_nan=False).encode("utf-8")
