"""Placement and packing of pods on multi-GPU nodes (GPU milli, CPU, memory, GPU models).

Policies: ``bestfit`` and ``random`` as in the FGD simulator, ``fgd`` (fragmentation
gradient descent, Weng et al., ATC '23) and ``strand`` (ours: FGD's fragmentation plus the
GPU milli a node's remaining CPU and memory strand); ``best`` is an alias of ``strand``.
See ``docs/packing.md`` and ``allocator.experiments.fgd``.
"""

from allocator.packing._arrival import Arrival, arrival_rng, build_arrival, tuned_name
from allocator.packing._fragmentation import TYPICAL_POD_THRESHOLD, FragmentationModel, typical_pods
from allocator.packing._model import (
    GPU_MILLI,
    MAX_PODS_PER_NODE,
    Cluster,
    NodeSpec,
    PodSpec,
    TraceFormatError,
    read_nodes_csv,
    read_pods_csv,
)
from allocator.packing._policies import (
    BEST_POLICY,
    POLICY_NAMES,
    Choice,
    FgdPolicy,
    Policy,
    make_policy,
    policy_rng,
    resolve_policy_name,
    simulator_score,
)
from allocator.packing._simulate import SimulationResult, allocation_at, percent_events, simulate
from allocator.packing._state import ClusterState

__all__ = [
    "BEST_POLICY",
    "GPU_MILLI",
    "MAX_PODS_PER_NODE",
    "POLICY_NAMES",
    "TYPICAL_POD_THRESHOLD",
    "Arrival",
    "Choice",
    "Cluster",
    "ClusterState",
    "FgdPolicy",
    "FragmentationModel",
    "NodeSpec",
    "PodSpec",
    "Policy",
    "SimulationResult",
    "TraceFormatError",
    "allocation_at",
    "arrival_rng",
    "build_arrival",
    "make_policy",
    "percent_events",
    "policy_rng",
    "read_nodes_csv",
    "read_pods_csv",
    "resolve_policy_name",
    "simulate",
    "simulator_score",
    "tuned_name",
    "typical_pods",
]
