"""Fleet: the GPUs themselves. Rebalance plans (proposed from measured use, approved by a second
admin, executed through the Kubernetes API), right-sizing suggestions for memory and SM requests, and
handing a GPU over from one node to another.

The facade: code outside this package imports from here, never from its modules."""

from __future__ import annotations

from billing.services.fleet.gpu_ownership import reassign_gpu
from billing.services.fleet.locations import (
    FIRST_LOCATION_FROM,
    add_location,
    earliest_energy_change,
    fleet_currency,
    set_location_rate,
    set_node_location,
)
from billing.services.fleet.rebalance import (
    CapacityLine,
    ExecutionStep,
    approve_plan,
    capacity_lines,
    confirmation_code,
    count_executions,
    counts_whole_nodes,
    execution_outcome,
    kube_from_settings,
    plan_steps,
    propose_rebalance,
    reject_plan,
    run_execution,
    unapprove_unqueued_plan,
)
from billing.services.fleet.rightsizing import (
    HEADROOM,
    MemoryUse,
    SmUse,
    Suggestion,
    gib,
    mean_mb,
    percent_of,
    suggest_memory_request,
    suggest_sm_request,
)

__all__ = [
    "FIRST_LOCATION_FROM",
    "HEADROOM",
    "CapacityLine",
    "ExecutionStep",
    "MemoryUse",
    "SmUse",
    "Suggestion",
    "add_location",
    "approve_plan",
    "capacity_lines",
    "confirmation_code",
    "count_executions",
    "counts_whole_nodes",
    "earliest_energy_change",
    "execution_outcome",
    "fleet_currency",
    "gib",
    "kube_from_settings",
    "mean_mb",
    "percent_of",
    "plan_steps",
    "propose_rebalance",
    "reassign_gpu",
    "reject_plan",
    "run_execution",
    "set_location_rate",
    "set_node_location",
    "suggest_memory_request",
    "suggest_sm_request",
    "unapprove_unqueued_plan",
]
