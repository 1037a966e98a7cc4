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
from allocator.rebalance._plan import RebalancePlan, plan_rebalance
from allocator.rebalance._rightsize import RightSizing


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
        description="Plan at most K workload moves that free whole GPUs, then whole nodes, never "
        "overcommitting at any step (dry run; format: docs/rebalance.md).",
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
        f"GPUs in use: {plan.gpus_busy_before} -> {plan.gpus_busy_after} ({plan.gpus_freed} freed); "
        f"nodes in use: {plan.nodes_busy_before} -> {plan.nodes_busy_after} ({plan.nodes_freed} freed)"
    )
    if plan.freed_nodes:
        lines.append(f"Freed nodes: {', '.join(plan.freed_nodes)}")
    if plan.pinned_workloads:
        lines.append(f"Pinned (never moved): {', '.join(plan.pinned_workloads)}")
    if plan.overcommitted_at_start:
        lines.append(f"Over capacity at start (never given more load): {', '.join(plan.overcommitted_at_start)}")
    lines.append(
        f"Projected savings: {plan.gpus_freed} GPU(s) x {plan.hours} h x {plan.price_per_gpu_hour} {currency}/GPU-h "
        f"= {_money(plan.projected_savings)} {currency}"
    )
    if sizing is not None:
        lines.append(
            f"Right-sizing over {sizing.steps} steps of {sizing.workloads} workloads "
            f"(GPU {sizing.gpu_memory_mb} MB / {sizing.gpu_sm_milli} SM milli, {sizing.hours_per_month} h/month):"
        )
        lines.extend(
            f"  P{e.percentile}: lower bound {e.lower_bound_gpus}, first-fit decreasing {e.ffd_gpus} -> "
            f"{e.gpus_needed} GPU(s) needed of {e.current_gpus}; monthly difference "
            f"{_money(e.monthly_cost_difference)} {currency}"
            for e in sizing.estimates
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
