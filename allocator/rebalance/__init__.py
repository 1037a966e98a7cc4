"""Pool rebalancing: a plan of at most K moves that empties whole nodes, the capacity a fleet can
hand back, with the fewest evictions for the GPUs it frees.

``plan_rebalance`` builds the plan (deterministic; every intermediate state is within capacity),
``apply_moves`` replays and checks one, ``right_size`` estimates the GPUs a pool needs at P95 / P99
demand and ``whole_node_gpus`` the whole nodes that hold them. ``python -m allocator.rebalance``
runs both on a JSON file. The model, the algorithm and its limits: docs/rebalance.md. Pure
library: no Django, no clock.
"""

from allocator.rebalance._io import (
    INPUT_SCHEMA,
    PLAN_SCHEMA,
    RebalanceInput,
    load_rebalance_input,
    parse_rebalance_input,
    plan_to_json,
    pool_right_sizing,
    right_sizing_to_json,
)
from allocator.rebalance._model import SM_MILLI, GpuRef, Move, Pool, PoolNode, PoolWorkload
from allocator.rebalance._plan import (
    EXACT_CANDIDATES,
    HOURS_PER_MONTH,
    RebalancePlan,
    apply_moves,
    gpu_cost,
    plan_rebalance,
)
from allocator.rebalance._rightsize import (
    DemandSeries,
    RightSizeEstimate,
    RightSizing,
    nearest_rank,
    right_size,
    whole_node_gpus,
)
from allocator.rebalance._state import PoolState

__all__ = [
    "EXACT_CANDIDATES",
    "HOURS_PER_MONTH",
    "INPUT_SCHEMA",
    "PLAN_SCHEMA",
    "SM_MILLI",
    "DemandSeries",
    "GpuRef",
    "Move",
    "Pool",
    "PoolNode",
    "PoolState",
    "PoolWorkload",
    "RebalanceInput",
    "RebalancePlan",
    "RightSizeEstimate",
    "RightSizing",
    "apply_moves",
    "gpu_cost",
    "load_rebalance_input",
    "nearest_rank",
    "parse_rebalance_input",
    "plan_rebalance",
    "plan_to_json",
    "pool_right_sizing",
    "right_size",
    "right_sizing_to_json",
    "whole_node_gpus",
]
