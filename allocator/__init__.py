"""Allocation algorithms shared by the node agent and the service.

Pure Python (+numpy), deterministic, frozen dataclasses in and out (the agent's tick:
columns in, named tuples of lists out); no Django, no ``agents``, no ``billing`` imports.
The per-GPU fair share is exported here (the agent's hot path); the heavier subpackages are imported by name: ``allocator.packing`` (placement
and the FGD experiment), ``allocator.predict`` (load prediction), ``allocator.replay``
(static vs dynamic trace replay).
"""

from allocator.fairshare import (
    UNLIMITED,
    Allocation,
    AllocationPolicy,
    Claim,
    ColumnGrants,
    GpuCapacity,
    GpuColumns,
    GpuGrants,
    PredictedPeak,
    ResourceColumns,
    Resources,
    Shares,
    WorkloadState,
    allocate_columns,
    allocate_gpu,
    fair_share,
    workload_demand,
)

__all__ = [
    "UNLIMITED",
    "Allocation",
    "AllocationPolicy",
    "Claim",
    "ColumnGrants",
    "GpuCapacity",
    "GpuColumns",
    "GpuGrants",
    "PredictedPeak",
    "ResourceColumns",
    "Resources",
    "Shares",
    "WorkloadState",
    "allocate_columns",
    "allocate_gpu",
    "fair_share",
    "workload_demand",
]
