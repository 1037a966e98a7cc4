"""Readings with entitlements: each workload's structured GPU request, per GPU (docs/requests.md).

``NvmlBackend`` reports one reading per process with no entitlement; ``EntitledBackend``
merges a container's processes on one GPU into one reading (the allocator shares per
workload) and fills in what the container was promised, from ``GpuRequestResolver``
(annotations, DRA ResourceClaim, ``nvidia.com/gpu``, or the tenant default). A request the pod
made itself is also reported in the batches (``mem_requested_mb``, ``sm_requested``: the guarantee
on that GPU, docs/protocol.md), for the drill-down's "requested" column; a tenant default is not.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from datetime import datetime
from typing import Protocol

from agents.gpu_requests import GpuRequestResolver
from agents.interfaces import GpuInfo, UsageReading, Workload

__all__ = ["EntitledBackend", "ProcessBackend"]


class ProcessBackend(Protocol):
    """A ``GpuBackend`` that also knows the host PIDs of each workload's GPU processes."""

    def inventory(self) -> Sequence[GpuInfo]: ...

    def read(self, *, now: datetime) -> Sequence[UsageReading]: ...

    def processes(self, workload: Workload) -> Sequence[int]: ...


class EntitledBackend:
    """``GpuBackend`` over another one: readings merged per workload and GPU, entitlements filled."""

    def __init__(self, backend: ProcessBackend, *, resolver: GpuRequestResolver) -> None:
        self._backend = backend
        self._resolver = resolver
        self._gpus = {g.uuid: g for g in backend.inventory()}

    def inventory(self) -> Sequence[GpuInfo]:
        return self._backend.inventory()

    def processes(self, workload: Workload) -> Sequence[int]:
        return self._backend.processes(workload)

    def read(self, *, now: datetime) -> Sequence[UsageReading]:
        merged: dict[tuple[str, str], UsageReading] = {}
        for r in self._backend.read(now=now):
            key = (r.gpu, r.workload.key)
            held = merged.get(key)
            if held is None:
                merged[key] = r
                continue
            # Several processes of one container on one GPU: their use adds up, capped at the card.
            gpu = self._gpus[r.gpu]
            merged[key] = UsageReading(
                workload=held.workload,
                gpu=r.gpu,
                mem_used_mb=min(held.mem_used_mb + r.mem_used_mb, float(gpu.memory_mb)),
                sm_used=min(held.sm_used + r.sm_used, float(gpu.sm_count)),
                pcie_mb_per_s=held.pcie_mb_per_s + r.pcie_mb_per_s,
            )
        return [self._entitled(r) for r in merged.values()]

    def _entitled(self, reading: UsageReading) -> UsageReading:
        workload = reading.workload
        request = self._resolver.resolve(workload=workload)
        entitlement = request.entitlement(gpu=self._gpus[reading.gpu])
        if request.source != "tenant-default":
            # Capped at the card by ``entitlement``, so within what the service accepts.
            workload = replace(workload, meta=replace(
                workload.meta, mem_requested_mb=round(entitlement.guarantee_mem_mb),
                sm_requested=entitlement.guarantee_sm))
        return UsageReading(
            workload=workload,
            gpu=reading.gpu,
            mem_used_mb=reading.mem_used_mb,
            sm_used=reading.sm_used,
            pcie_mb_per_s=reading.pcie_mb_per_s,
            entitlement=entitlement,
        )
