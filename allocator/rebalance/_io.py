"""The CLI's JSON input (``vgpu-ledger/rebalance-input/v1``) and output (``.../rebalance-plan/v1``).

The format is documented in docs/rebalance.md. Unknown keys are errors (a misspelt
``movable`` must not silently mean "movable"). Fractional demands are rounded *up* to whole
MB / SM milli so that a fit is never optimistic; capacities must be whole numbers.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from decimal import ROUND_HALF_EVEN, Decimal, InvalidOperation
from pathlib import Path

from allocator.rebalance._model import SM_MILLI, Pool, PoolNode, PoolWorkload
from allocator.rebalance._plan import HOURS_PER_MONTH, RebalancePlan, gpu_cost
from allocator.rebalance._rightsize import DemandSeries, RightSizing, right_size, whole_node_gpus

__all__ = [
    "INPUT_SCHEMA",
    "PLAN_SCHEMA",
    "RebalanceInput",
    "load_rebalance_input",
    "parse_rebalance_input",
    "plan_to_json",
    "pool_right_sizing",
    "right_sizing_to_json",
]

INPUT_SCHEMA = "vgpu-ledger/rebalance-input/v1"
PLAN_SCHEMA = "vgpu-ledger/rebalance-plan/v1"
CENT = Decimal("0.01")

_TOP_KEYS = {"schema", "currency", "price_per_gpu_hour", "hours", "nodes", "workloads"}
_NODE_KEYS = {"name", "model", "gpus", "gpu_memory_mb", "gpu_sm_milli", "cpu_milli", "memory_mib"}
_WORKLOAD_KEYS = {
    "key", "namespace", "pod", "node", "gpus", "memory_mb", "sm_milli",
    "cpu_milli", "memory_mib", "movable", "models", "history",
}  # fmt: skip


@dataclass(frozen=True, slots=True)
class RebalanceInput:
    pool: Pool
    price_per_gpu_hour: Decimal
    currency: str
    hours: Decimal
    history: tuple[DemandSeries, ...]  # empty, or one series per workload


def _object(value: object, where: str, allowed: set[str], required: tuple[str, ...]) -> Mapping[str, object]:
    if not isinstance(value, dict):
        raise ValueError(f"{where}: expected an object, got {type(value).__name__}")
    unknown = sorted(set(value) - allowed)
    if unknown:
        raise ValueError(f"{where}: unknown key(s) {', '.join(unknown)}")
    missing = [k for k in required if k not in value]
    if missing:
        raise ValueError(f"{where}: missing key(s) {', '.join(missing)}")
    return value


def _whole(value: object, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"{where}: expected a whole number, got {value!r}")
    if isinstance(value, float):
        if not value.is_integer():
            raise ValueError(f"{where}: expected a whole number, got {value!r}")
        return int(value)
    return value


def _demand(value: object, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"{where}: expected a number, got {value!r}")
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"{where}: expected a finite number >= 0, got {value!r}")
    return math.ceil(value)


def _decimal(value: object, where: str) -> Decimal:
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        raise ValueError(f'{where}: expected a decimal number (a string such as "5.12"), got {value!r}')
    try:
        number = Decimal(str(value))
    except InvalidOperation:
        raise ValueError(f"{where}: not a decimal number: {value!r}") from None
    if not number.is_finite() or number < 0:
        raise ValueError(f"{where}: expected a finite number >= 0, got {value!r}")
    return number


def _text(value: object, where: str) -> str:
    if not isinstance(value, str):
        raise ValueError(f"{where}: expected a string, got {value!r}")
    return value


def _list(value: object, where: str) -> list[object]:
    if not isinstance(value, list):
        raise ValueError(f"{where}: expected a list, got {type(value).__name__}")
    return value


def _node(raw: object, where: str) -> PoolNode:
    data = _object(raw, where, _NODE_KEYS, ("name", "model", "gpus", "gpu_memory_mb"))
    try:
        return PoolNode(
            name=_text(data["name"], f"{where}.name"),
            model=_text(data["model"], f"{where}.model"),
            gpus=_whole(data["gpus"], f"{where}.gpus"),
            gpu_memory_mb=_whole(data["gpu_memory_mb"], f"{where}.gpu_memory_mb"),
            gpu_sm_milli=_whole(data.get("gpu_sm_milli", SM_MILLI), f"{where}.gpu_sm_milli"),
            cpu_milli=None if data.get("cpu_milli") is None else _whole(data["cpu_milli"], f"{where}.cpu_milli"),
            memory_mib=None if data.get("memory_mib") is None else _whole(data["memory_mib"], f"{where}.memory_mib"),
        )
    except ValueError as error:
        message = str(error)
        raise ValueError(message if message.startswith(where) else f"{where}: {message}") from None


def _series(raw: object, where: str, key: str) -> DemandSeries:
    data = _object(raw, where, {"memory_mb", "sm_milli"}, ("memory_mb", "sm_milli"))
    memory = tuple(_demand(v, f"{where}.memory_mb[{i}]") for i, v in enumerate(_list(data["memory_mb"], where)))
    sm = tuple(_demand(v, f"{where}.sm_milli[{i}]") for i, v in enumerate(_list(data["sm_milli"], where)))
    try:
        return DemandSeries(key=key, memory_mb=memory, sm_milli=sm)
    except ValueError as error:
        raise ValueError(f"{where}: {error}") from None


def _workload(raw: object, where: str) -> tuple[PoolWorkload, DemandSeries | None]:
    data = _object(raw, where, _WORKLOAD_KEYS, ("key", "node", "gpus", "memory_mb", "sm_milli"))
    movable = data.get("movable", True)
    if not isinstance(movable, bool):
        raise ValueError(f"{where}.movable: expected true or false, got {movable!r}")
    gpus = tuple(_whole(g, f"{where}.gpus[{i}]") for i, g in enumerate(_list(data["gpus"], f"{where}.gpus")))
    models = tuple(_text(m, f"{where}.models[{i}]") for i, m in enumerate(_list(data.get("models", []), where)))
    key = _text(data["key"], f"{where}.key")
    try:
        workload = PoolWorkload(
            key=key,
            node=_text(data["node"], f"{where}.node"),
            gpus=gpus,
            memory_mb=_demand(data["memory_mb"], f"{where}.memory_mb"),
            sm_milli=_demand(data["sm_milli"], f"{where}.sm_milli"),
            namespace=_text(data.get("namespace", ""), f"{where}.namespace"),
            pod=_text(data.get("pod", ""), f"{where}.pod"),
            cpu_milli=_demand(data.get("cpu_milli", 0), f"{where}.cpu_milli"),
            memory_mib=_demand(data.get("memory_mib", 0), f"{where}.memory_mib"),
            movable=movable,
            models=models,
        )
    except ValueError as error:
        message = str(error)
        raise ValueError(message if message.startswith(where) else f"{where}: {message}") from None
    history = None if data.get("history") is None else _series(data["history"], f"{where}.history", key)
    return workload, history


def parse_rebalance_input(data: object) -> RebalanceInput:
    """Validate a decoded input document; ``ValueError`` names the offending path."""
    top = _object(data, "input", _TOP_KEYS, ("nodes", "workloads"))
    schema = top.get("schema", INPUT_SCHEMA)
    if schema != INPUT_SCHEMA:
        raise ValueError(f"input.schema: expected {INPUT_SCHEMA!r}, got {schema!r}")
    nodes = [_node(raw, f"nodes[{i}]") for i, raw in enumerate(_list(top["nodes"], "nodes"))]
    parsed = [_workload(raw, f"workloads[{i}]") for i, raw in enumerate(_list(top["workloads"], "workloads"))]
    history = [h for _, h in parsed if h is not None]
    if history and len(history) != len(parsed):
        raise ValueError(
            f"workloads: history given for {len(history)} of {len(parsed)} workloads; give it for all or none"
        )
    try:
        pool = Pool.build(nodes, [w for w, _ in parsed])
    except ValueError as error:
        raise ValueError(f"input: {error}") from None
    return RebalanceInput(
        pool=pool,
        price_per_gpu_hour=_decimal(top.get("price_per_gpu_hour", "5.12"), "input.price_per_gpu_hour"),
        currency=_text(top.get("currency", "USD"), "input.currency"),
        hours=_decimal(top.get("hours", str(HOURS_PER_MONTH)), "input.hours"),
        history=tuple(history),
    )


def load_rebalance_input(path: str | Path) -> RebalanceInput:
    path = Path(path)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as error:
        raise ValueError(f"{path}: not valid JSON: {error}") from None
    try:
        return parse_rebalance_input(data)
    except ValueError as error:
        raise ValueError(f"{path}: {error}") from None


def pool_right_sizing(data: RebalanceInput) -> RightSizing | None:
    """Right-size the pool from the workloads' history, when every workload has one.

    Needs one GPU capacity across the pool (``ValueError`` otherwise).
    """
    if not data.history:
        return None
    shapes = {(n.gpu_memory_mb, n.gpu_sm_milli) for n in data.pool.nodes if n.gpus}
    if len(shapes) != 1:
        raise ValueError("right-sizing needs every node's GPUs to have the same memory and SM capacity")
    ((memory_mb, sm_milli),) = shapes
    return right_size(
        data.history,
        gpu_memory_mb=memory_mb,
        gpu_sm_milli=sm_milli,
        current_gpus=data.pool.total_gpus,
        price_per_gpu_hour=data.price_per_gpu_hour,
        hours=data.hours,  # the plan's horizon, so its savings and this difference compare
    )


def _money(amount: Decimal) -> str:
    return str(amount.quantize(CENT, rounding=ROUND_HALF_EVEN))


def right_sizing_to_json(sizing: RightSizing, currency: str, *, pool: Pool | None = None) -> dict[str, object]:
    """Right-sizing as a JSON-ready dict; with the ``pool``, each estimate also in whole nodes: the
    GPUs of the nodes that hold it and what handing the others back saves (or adding nodes costs)."""
    node_gpus = [n.gpus for n in pool.nodes] if pool is not None else None
    return {
        "gpu_memory_mb": sizing.gpu_memory_mb,
        "gpu_sm_milli": sizing.gpu_sm_milli,
        "steps": sizing.steps,
        "workloads": sizing.workloads,
        "hours_per_month": str(sizing.hours_per_month),
        "price_per_gpu_hour": str(sizing.price_per_gpu_hour),
        "currency": currency,
        "estimates": [
            {
                "percentile": e.percentile,
                "total_memory_mb": e.total_memory_mb,
                "total_sm_milli": e.total_sm_milli,
                "lower_bound_gpus": e.lower_bound_gpus,
                "ffd_gpus": e.ffd_gpus,
                "gpus_needed": e.gpus_needed,
                "current_gpus": e.current_gpus,
                "gpus_saved": e.gpus_saved,
                "monthly_cost_difference": _money(e.monthly_cost_difference),
                **({} if node_gpus is None else _whole_nodes(sizing, e.gpus_needed, node_gpus)),
            }
            for e in sizing.estimates
        ],
    }


def _whole_nodes(sizing: RightSizing, gpus_needed: int, node_gpus: list[int]) -> dict[str, object]:
    kept = whole_node_gpus(node_gpus, gpus_needed)
    released = sum(node_gpus) - kept
    return {"whole_node_gpus": kept, "whole_node_gpus_released": released,
            "whole_node_monthly_difference": _money(gpu_cost(released, price_per_gpu_hour=sizing.price_per_gpu_hour,
                                                             hours=sizing.hours_per_month))}


def plan_to_json(
    plan: RebalancePlan, pool: Pool, *, currency: str, sizing: RightSizing | None = None
) -> dict[str, object]:
    """The plan as a JSON-ready dict (money as strings, rounded to cents half-even)."""
    workloads = {w.key: w for w in pool.workloads}
    return {
        "schema": PLAN_SCHEMA,
        "dry_run": True,
        "max_moves": plan.max_moves,
        "moves": [
            {
                "step": step,
                "workload": m.workload,
                "namespace": workloads[m.workload].namespace,
                "pod": workloads[m.workload].pod,
                "from_node": m.from_node,
                "from_gpu": m.from_gpu,
                "to_node": m.to_node,
                "to_gpu": m.to_gpu,
            }
            for step, m in enumerate(plan.moves, start=1)
        ],
        "gpus_busy_before": plan.gpus_busy_before,
        "gpus_busy_after": plan.gpus_busy_after,
        "gpus_freed": plan.gpus_freed,
        "nodes_busy_before": plan.nodes_busy_before,
        "nodes_busy_after": plan.nodes_busy_after,
        "nodes_freed": plan.nodes_freed,
        "freed_gpus": [str(ref) for ref in plan.freed_gpus],
        "freed_nodes": list(plan.freed_nodes),
        "gpus_released": plan.gpus_released,
        "evictions": plan.evictions,
        "idle_nodes": list(plan.idle_nodes),
        "smallest_release": None if plan.smallest_release is None else {
            "node": plan.smallest_release[0], "evictions": plan.smallest_release[1]},
        "exhaustive": plan.exhaustive,
        "pinned_workloads": list(plan.pinned_workloads),
        "overcommitted_at_start": list(plan.overcommitted_at_start),
        "projected_savings": {
            "amount": _money(plan.projected_savings),
            "currency": currency,
            "hours": str(plan.hours),
            "price_per_gpu_hour": str(plan.price_per_gpu_hour),
        },
        "right_sizing": None if sizing is None else right_sizing_to_json(sizing, currency, pool=pool),
    }
