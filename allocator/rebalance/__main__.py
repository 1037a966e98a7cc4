"""``python -m allocator.rebalance``: plan pool moves (dry run) from a JSON file.

Examples::

    python -m allocator.rebalance --input allocator/rebalance/examples/demo_fleet.json --max-moves 24
    python -m allocator.rebalance --input fleet.json --max-moves 10 --json

Input format and output: docs/rebalance.md. Nothing is executed: the plan is printed only.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from decimal import ROUND_HALF_EVEN, Decimal
from pathlib import Path

from allocator.rebalance._io import load_rebalance_input, plan_to_json, pool_right_sizing
from allocator.rebalance._model import Pool
from allocator.rebalance._plan import RebalancePlan, gpu_cost, plan_rebalance
from allocator.rebalance._rightsize import RightSizing, whole_node_gpus


def _max_moves(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {value}")
    return value


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m allocator.rebalance",
        description="Plan at most K workload moves that empty whole nodes with the fewest evictions, "
        "never overcommitting at any step (dry run; format: docs/rebalance.md).",
    )
    parser.add_argument("--input", type=Path, required=True, help="pool JSON (vgpu-ledger/rebalance-input/v1)")
    parser.add_argument("--max-moves", type=_max_moves, required=True, help="hard cap K on the number of moves")
    parser.add_argument("--json", action="store_true", help="print JSON instead of text")
    return parser


def _money(amount: Decimal) -> str:
    return f"{amount.quantize(Decimal('0.01'), rounding=ROUND_HALF_EVEN):,}"


def _text(plan: RebalancePlan, pool: Pool, currency: str, sizing: RightSizing | None) -> str:
    lines = [f"Rebalance plan (dry run): {len(plan.moves)} of at most {plan.max_moves} moves"]
    pods = {w.key: w for w in pool.workloads}
    for step, m in enumerate(plan.moves, start=1):
        w = pods[m.workload]
        lines.append(
            f"  {step:>3}. {m.workload:<34} {m.source!s:>14} -> {m.target!s:<14} ({w.memory_mb} MB, {w.sm_milli} SM milli)"
        )
    lines.append(
        f"Nodes in use: {plan.nodes_busy_before} -> {plan.nodes_busy_after} ({plan.nodes_freed} freed, "
        f"{plan.gpus_released} GPU(s) handed back) with {plan.evictions} eviction(s); GPUs in use: "
        f"{plan.gpus_busy_before} -> {plan.gpus_busy_after}"
    )
    if plan.freed_nodes:
        lines.append(f"Freed nodes: {', '.join(plan.freed_nodes)}")
    elif plan.smallest_release is not None:
        node, evictions = plan.smallest_release
        lines.append(f"No node can be emptied within {plan.max_moves} move(s); the fewest evictions that empty "
                     f"one: {node}, {evictions}")
    else:
        lines.append("No node can be emptied: no node's workloads fit on the others at their demand")
    if plan.idle_nodes:
        lines.append(f"Nodes with no workload (no move needed to hand them back): {', '.join(plan.idle_nodes)}")
    if plan.pinned_workloads:
        lines.append(f"Pinned (never moved): {', '.join(plan.pinned_workloads)}")
    if plan.overcommitted_at_start:
        lines.append(f"Over capacity at start (never given more load): {', '.join(plan.overcommitted_at_start)}")
    lines.append(
        f"Projected savings: {plan.gpus_released} GPU(s) of whole nodes x {plan.hours} h x {plan.price_per_gpu_hour} "
        f"{currency}/GPU-h = {_money(plan.projected_savings)} {currency}"
    )
    if sizing is not None:
        lines.append(
            f"Right-sizing over {sizing.steps} steps of {sizing.workloads} workloads "
            f"(GPU {sizing.gpu_memory_mb} MB / {sizing.gpu_sm_milli} SM milli, {sizing.hours_per_month} h/month):"
        )
        node_gpus = [n.gpus for n in pool.nodes]
        for e in sizing.estimates:
            kept = whole_node_gpus(node_gpus, e.gpus_needed)
            difference = gpu_cost(pool.total_gpus - kept, price_per_gpu_hour=sizing.price_per_gpu_hour,
                                  hours=sizing.hours_per_month)
            lines.append(
                f"  P{e.percentile}: lower bound {e.lower_bound_gpus}, first-fit decreasing {e.ffd_gpus} -> "
                f"{e.gpus_needed} GPU(s) needed of {e.current_gpus}, whole nodes of {kept} GPU(s); monthly "
                f"difference {_money(difference)} {currency}"
            )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        data = load_rebalance_input(args.input)
        plan = plan_rebalance(
            data.pool, max_moves=args.max_moves, price_per_gpu_hour=data.price_per_gpu_hour, hours=data.hours
        )
        sizing = pool_right_sizing(data)
    except (OSError, ValueError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(plan_to_json(plan, data.pool, currency=data.currency, sizing=sizing), indent=2))
    else:
        print(_text(plan, data.pool, data.currency, sizing))
    return 0


if __name__ == "__main__":
    sys.exit(main())
