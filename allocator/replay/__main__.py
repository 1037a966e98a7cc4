"""``python -m allocator.replay``: replay a pod trace under one policy or compare all three.

Examples::

    python -m allocator.replay --policy dynamic --json
    python -m allocator.replay --compare
    python -m allocator.replay --frontier --svg docs/replay-frontier.svg
    python -m allocator.replay --nodes data/traces/openb_node_list_gpu_node.csv \\
        --pods data/traces/openb_pod_list_default.csv --compare --json
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from collections.abc import Sequence
from decimal import Decimal, InvalidOperation
from pathlib import Path

from allocator.replay._compare import (
    DEFAULT_TRACES,
    ReplayInputs,
    compare_policies,
    format_comparison,
    load_inputs,
    run_policy,
)
from allocator.replay._frontier import format_frontier, frontier, frontier_svg
from allocator.replay._predicted import PREDICTOR_CHOICES
from allocator.replay._pricing import compare_per_model, format_per_model
from allocator.replay._replay import POLICIES, ReplayConfig
from allocator.replay._trace import DEFAULT_SNAPSHOT_S, TraceError
from allocator.replay._usage import UsageModel


def _rate(text: str) -> Decimal:
    try:
        value = Decimal(text)
    except InvalidOperation:
        raise argparse.ArgumentTypeError(f"not a decimal number: {text!r}") from None
    if not value.is_finite() or value < 0:
        raise argparse.ArgumentTypeError(f"must be a finite number >= 0, got {text!r}")
    return value


FRONTIER_SOURCES = ("AzureLLMInferenceTrace_conv.csv", "AzureLLMInferenceTrace_code.csv")


def _source_label(path: Path) -> str:
    """``AzureLLMInferenceTrace_code.csv`` → ``code``: the burst source's name in tables and the picture."""
    return path.stem.removeprefix("AzureLLMInferenceTrace_") or path.stem


def _hours(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not (math.isfinite(value) and 0 < value <= 24 * 366):
        raise argparse.ArgumentTypeError(f"must be in (0, 8784] hours, got {text!r}")
    return value


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m allocator.replay",
        description="Replay GPU pods in time under static and dynamic allocation policies "
        "(usage model and metrics: docs/replay.md).",
    )
    parser.add_argument("--pods", type=Path, default=DEFAULT_TRACES / "openb_pod_list_default.csv")
    parser.add_argument("--nodes", type=Path, default=DEFAULT_TRACES / "openb_node_list_gpu_node.csv")
    parser.add_argument(
        "--azure",
        type=Path,
        default=DEFAULT_TRACES / "AzureLLMInferenceTrace_conv.csv",
        help="request trace whose bursts shape every pod's use",
    )
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--policy", choices=POLICIES)
    mode.add_argument("--compare", action="store_true", help="replay every policy and compare them")
    mode.add_argument(
        "--frontier",
        action="store_true",
        help="sweep each dynamic policy's knob over each --frontier-azure burst source: cost against SLO misses",
    )
    parser.add_argument(
        "--frontier-azure",
        type=Path,
        action="append",
        help="with --frontier: a burst source (repeat for several; default the shipped conversation and code traces)",
    )
    parser.add_argument("--svg", type=Path, help="with --frontier: also draw the frontier into this SVG file")
    parser.add_argument(
        "--per-model",
        action="store_true",
        help="with --compare: also replay each GPU model of the fleet as its own pool, priced at its rate",
    )
    parser.add_argument(
        "--snapshot-hours",
        type=_hours,
        default=DEFAULT_SNAPSHOT_S / 3_600,
        help="a pod list without times (a snapshot, e.g. openb's multigpu lists): every pod runs from 0 for this "
        "many hours (default %(default)g)",
    )
    parser.add_argument("--json", action="store_true", help="print JSON instead of text")
    parser.add_argument("--seed", type=int, default=UsageModel().seed, help="seed of class and burst assignment")
    parser.add_argument("--step-seconds", type=int, default=60, help="time step of the use model (1..3600)")
    parser.add_argument("--headroom", type=float, default=0.2, help="dynamic: reservation = peak × (1 + headroom)")
    parser.add_argument(
        "--lag-steps", type=int, default=0, help="dynamic: a grant for step t uses use up to step t-1-lag (control lag)"
    )
    parser.add_argument(
        "--predictor",
        choices=PREDICTOR_CHOICES,
        default="default",
        help="dynamic-predicted: the agent's calibrated default predictors, or the same uncalibrated",
    )
    parser.add_argument(
        "--rate", type=_rate, default=Decimal("5.12"), help="USD per A100-80GB GPU-hour (default: demo rate card)"
    )
    return parser


def _context(inputs: ReplayInputs) -> dict[str, object]:
    trace = inputs.trace
    return {
        "trace": {
            "rows": trace.rows,
            "gpu_pods_replayed": len(trace.pods),
            "cpu_only_left_out": trace.cpu_only,
            "pending_left_out": trace.pending,
            "empty_interval_left_out": trace.empty_interval,
            "still_running_at_end": trace.still_running,
            "snapshot_s": trace.snapshot_s,
        },
        "fleet": {"nodes": inputs.fleet.nodes, "gpus": inputs.fleet.gpus},
        "usage_model": {
            "seed": inputs.model.seed,
            "step_s": inputs.model.step_s,
            "classes": [c.name for c in inputs.model.classes],
        },
    }


def _load(args: argparse.Namespace, model: UsageModel, azure: Path) -> ReplayInputs:
    return load_inputs(
        pods_path=args.pods, nodes_path=args.nodes, azure_path=azure, model=model, snapshot_s=args.snapshot_hours * 3_600
    )


def _frontier(args: argparse.Namespace, model: UsageModel) -> tuple[ReplayInputs, dict[str, object], str]:
    """Every knob over every burst source; the SVG where asked. Returns the first source's inputs for the context."""
    sources = args.frontier_azure or [DEFAULT_TRACES / name for name in FRONTIER_SOURCES]
    traces = {_source_label(path): _load(args, model, path) for path in sources}
    points = frontier(traces)
    if args.svg:
        args.svg.write_text(frontier_svg(points), encoding="utf-8")
    return next(iter(traces.values())), {"frontier": [p.to_dict() for p in points]}, format_frontier(points)


def _compare(args: argparse.Namespace, inputs: ReplayInputs) -> tuple[dict[str, object], str]:
    comparison = compare_policies(
        inputs, headroom=args.headroom, lag_steps=args.lag_steps, predictor=args.predictor, usd_per_gpu_hour=args.rate
    )
    payload = comparison.to_dict()
    text = format_comparison(comparison)
    if args.per_model:
        priced = compare_per_model(inputs, headroom=args.headroom, lag_steps=args.lag_steps, predictor=args.predictor)
        payload["per_model"] = priced.to_dict()
        text += "\n\nPer GPU model of the fleet (each its own pool, priced at its rate):\n\n"
        text += format_per_model(priced)
    return payload, text


def _one(args: argparse.Namespace, inputs: ReplayInputs) -> tuple[dict[str, object], str]:
    config = ReplayConfig(
        policy=args.policy,
        headroom=args.headroom,
        lag_steps=args.lag_steps,
        predictor=args.predictor,
        usd_per_gpu_hour=args.rate,
    )
    payload = run_policy(inputs, config).to_dict()
    return payload, "\n".join(f"{key}: {value}" for key, value in payload.items())


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if args.per_model and not args.compare:
        parser.error("--per-model needs --compare")
    if (args.svg or args.frontier_azure) and not args.frontier:
        parser.error("--svg and --frontier-azure need --frontier")
    started = time.perf_counter()  # the reported run time; results never depend on it
    try:
        model = UsageModel(step_s=args.step_seconds, seed=args.seed)
        if args.frontier:
            inputs, payload, text = _frontier(args, model)
        else:
            inputs = _load(args, model, args.azure)
            payload, text = _compare(args, inputs) if args.compare else _one(args, inputs)
    except (OSError, TraceError, ValueError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    run_time = time.perf_counter() - started
    if args.json:
        payload.update(_context(inputs))
        payload["run_time_s"] = round(run_time, 3)
        print(json.dumps(payload, indent=2, sort_keys=True))
    else:
        fleet = inputs.fleet.gpus
        snapshot = inputs.trace.snapshot_s
        held = f"a snapshot: every pod held from 0 for {snapshot / 3_600:g} h; " if snapshot else ""
        print(text)
        print(
            f"\n{len(inputs.trace.pods):,} GPU pods replayed of {inputs.trace.rows:,} rows "
            f"({held}{inputs.trace.cpu_only:,} CPU-only and {inputs.trace.pending:,} Pending left out); "
            f"fleet {fleet:,} GPUs; the first table sizes and prices every card as an A100-80GB; run time {run_time:.1f} s"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
