"""Trace replay of static and dynamic GPU allocation (docs/replay.md).

Replays the Alibaba ``openb`` pod trace in time with a usage model (workload classes
from the study, bursts from the Azure LLM inference trace) under five policies —
``static-whole``, ``static-request``, ``static-profile``, ``dynamic-current-use`` and
``dynamic-predicted`` — and reports GPUs needed,
GPU-hours, cost, utilisation, idle memory, containers per card and SLO violations.
``python -m allocator.replay --help`` is the command-line entry point.
"""

from allocator.replay._compare import (
    DEFAULT_TRACES,
    Comparison,
    ReplayInputs,
    compare_policies,
    format_comparison,
    load_inputs,
    run_policy,
)
from allocator.replay._replay import (
    DYNAMIC_POLICIES,
    MIG_PROFILES,
    POLICIES,
    SLICES_PER_CARD,
    DynamicGrants,
    Invariants,
    MigProfile,
    Policy,
    ReplayConfig,
    ReplayResult,
    StaticGrants,
    dynamic_grants,
    replay,
    select_profile,
    static_grants,
)
from allocator.replay._trace import (
    AzureRequests,
    Fleet,
    GpuPod,
    PodTrace,
    TraceError,
    read_azure_requests,
    read_fleet,
    read_pod_trace,
)
from allocator.replay._usage import (
    A100_MEMORY_MB,
    A100_SM_COUNT,
    DEFAULT_CLASSES,
    BurstSignals,
    PodUsage,
    UsageModel,
    WorkloadClass,
    build_burst_signals,
    build_pod_usage,
)

__all__ = [
    "A100_MEMORY_MB",
    "A100_SM_COUNT",
    "DEFAULT_CLASSES",
    "DEFAULT_TRACES",
    "DYNAMIC_POLICIES",
    "MIG_PROFILES",
    "POLICIES",
    "SLICES_PER_CARD",
    "AzureRequests",
    "BurstSignals",
    "Comparison",
    "DynamicGrants",
    "Fleet",
    "GpuPod",
    "Invariants",
    "MigProfile",
    "PodTrace",
    "PodUsage",
    "Policy",
    "ReplayConfig",
    "ReplayInputs",
    "ReplayResult",
    "StaticGrants",
    "TraceError",
    "UsageModel",
    "WorkloadClass",
    "build_burst_signals",
    "build_pod_usage",
    "compare_policies",
    "dynamic_grants",
    "format_comparison",
    "load_inputs",
    "read_azure_requests",
    "read_fleet",
    "read_pod_trace",
    "replay",
    "run_policy",
    "select_profile",
    "static_grants",
]
