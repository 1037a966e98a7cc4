"""Loading the traces once and replaying several policies on the same usage."""

from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path

from allocator.replay._predicted import PredictorChoice
from allocator.replay._replay import Policy, ReplayConfig, ReplayResult, replay
from allocator.replay._trace import (
    DEFAULT_SNAPSHOT_S,
    Fleet,
    PodTrace,
    read_azure_requests,
    read_fleet,
    read_pod_trace,
)
from allocator.replay._usage import BurstSignals, PodUsage, UsageModel, build_burst_signals, build_pod_usage

__all__ = [
    "COMPARED",
    "DEFAULT_TRACES",
    "SHIPPED",
    "Comparison",
    "ReplayInputs",
    "compare_policies",
    "format_comparison",
    "load_inputs",
    "run_policy",
]

# What --compare replays: the static baselines, the one-line rule and the agent's shipped policy.
# dynamic-predicted (the LSTM at the replay's 60 s step) is on the frontier and under --policy.
COMPARED: tuple[Policy, ...] = ("static-whole", "static-request", "static-profile", "dynamic-current-use", "agent-default")
SHIPPED: Policy = "agent-default"  # exactly what `vgpu-agent run` does with no flags

# data/traces in the repository (copies of the public traces; see their README).
DEFAULT_TRACES = Path(__file__).resolve().parents[2] / "data" / "traces"


@dataclass(frozen=True, slots=True)
class ReplayInputs:
    """Everything a replay reads, built once and shared by every policy."""

    trace: PodTrace
    fleet: Fleet
    model: UsageModel
    signals: BurstSignals
    usage: PodUsage


def load_inputs(
    *,
    pods_path: Path | str = DEFAULT_TRACES / "openb_pod_list_default.csv",
    nodes_path: Path | str = DEFAULT_TRACES / "openb_node_list_gpu_node.csv",
    azure_path: Path | str = DEFAULT_TRACES / "AzureLLMInferenceTrace_conv.csv",
    model: UsageModel | None = None,
    snapshot_s: float = DEFAULT_SNAPSHOT_S,
) -> ReplayInputs:
    """Read the three traces and build every pod's use under ``model`` (a pod list without times: a snapshot held ``snapshot_s``)."""
    model = model or UsageModel()
    trace = read_pod_trace(pods_path, snapshot_s=snapshot_s)
    if not trace.pods:
        raise ValueError(f"{pods_path}: no GPU pod held a GPU (nothing to replay)")
    fleet = read_fleet(nodes_path)
    signals = build_burst_signals(
        read_azure_requests(azure_path), step_s=model.step_s, decode_tokens_per_s=model.decode_tokens_per_s
    )
    usage = build_pod_usage(trace.pods, model, signals)
    return ReplayInputs(trace=trace, fleet=fleet, model=model, signals=signals, usage=usage)


def run_policy(inputs: ReplayInputs, config: ReplayConfig) -> ReplayResult:
    return replay(inputs.usage, inputs.model, inputs.signals, config)


@dataclass(frozen=True, slots=True)
class Comparison:
    """Every policy on one usage, in ``POLICIES`` order."""

    results: tuple[ReplayResult, ...]

    def result(self, policy: Policy) -> ReplayResult:
        return next(r for r in self.results if r.policy == policy)

    def cost_change(self, policy: Policy, baseline: Policy) -> float:
        """policy's cost / baseline's cost − 1 (the same rate on both sides, so GPU-hours suffice)."""
        base = self.result(baseline).gpu_hours
        return self.result(policy).gpu_hours / base - 1.0 if base else 0.0

    def density_ratio(self, policy: Policy, baseline: Policy) -> float:
        base = self.result(baseline).containers_per_card
        return self.result(policy).containers_per_card / base if base else 0.0

    def to_dict(self) -> dict[str, object]:
        others = [r.policy for r in self.results if r.policy != SHIPPED]
        return {
            "policies": {r.policy: r.to_dict() for r in self.results},
            "comparison": {f"{SHIPPED}_cost_change_vs_{b}": self.cost_change(SHIPPED, b) for b in others}
            | {f"{SHIPPED}_density_ratio_vs_{b}": self.density_ratio(SHIPPED, b) for b in others}
            | {f"{SHIPPED}_peak_pool_ratio_vs_{b}": self.pool_ratio(SHIPPED, b) for b in others}
            | {"gpus_peak": {r.policy: r.gpus_peak for r in self.results}},
        }

    def pool_ratio(self, policy: Policy, baseline: Policy) -> float:
        base = self.result(baseline).gpus_peak
        return self.result(policy).gpus_peak / base if base else 0.0


def compare_policies(
    inputs: ReplayInputs,
    *,
    headroom: float = 0.2,
    lag_steps: int = 0,
    predictor: PredictorChoice = "default",
    usd_per_gpu_hour: Decimal = Decimal("5.12"),
) -> Comparison:
    """Replay every policy in ``POLICIES`` on the same usage."""
    return Comparison(
        results=tuple(
            run_policy(
                inputs,
                ReplayConfig(
                    policy=policy,
                    headroom=headroom,
                    lag_steps=lag_steps,
                    predictor=predictor,
                    usd_per_gpu_hour=usd_per_gpu_hour,
                ),
            )
            for policy in COMPARED
        )
    )


def format_comparison(comparison: Comparison) -> str:
    """A Markdown table of the policies plus dynamic-predicted's cost and density against each other one."""
    res = comparison.results
    rate = res[0].usd_per_gpu_hour
    whole = comparison.result("static-whole")
    rows: list[tuple[str, ...]] = [
        ("figure", *(r.policy for r in res)),
        ("GPUs needed, peak", *(f"{r.gpus_peak:,}" for r in res)),
        ("GPUs needed, time-averaged", *(f"{r.gpus_time_avg:,.2f}" for r in res)),
        ("GPU-hours", *(f"{r.gpu_hours:,.0f}" for r in res)),
        (f"cost, USD at {rate}/GPU-h", *(f"{r.cost_usd:,}" for r in res)),
        ("SM utilisation", *(f"{r.sm_utilisation:.1%}" for r in res)),
        ("memory utilisation (used)", *(f"{r.memory_utilisation:.1%}" for r in res)),
        ("idle memory (1 − used)", *(f"{r.idle_memory_share:.1%}" for r in res)),
        ("memory granted", *(f"{r.memory_granted_share:.1%}" for r in res)),
        ("containers per card", *(f"{r.containers_per_card:.2f}" for r in res)),
        (
            "efficiency: SM used per card-s, × static-whole",
            *(f"×{r.sm_utilisation / whole.sm_utilisation:.2f}" if whole.sm_utilisation else "-" for r in res),
        ),
        ("SLO misses, workload-s", *(f"{r.slo_miss_workload_s:,.0f}" for r in res)),
        ("SLO misses, share of workload-s", *(f"{r.slo_miss_share:.3%}" for r in res)),
        ("  SM misses, workload-s", *(f"{r.slo_miss_sm_workload_s:,.0f}" for r in res)),
        ("  SM short, SM-s per missed s", *(_per(r.sm_short_sm_s, r.slo_miss_sm_workload_s) for r in res)),
        ("  memory misses, workload-s", *(f"{r.slo_miss_memory_workload_s:,.0f}" for r in res)),
        ("  memory short, MB per missed s", *(_per(r.memory_short_mb_s, r.slo_miss_memory_workload_s) for r in res)),
    ]
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]

    def line(cells: tuple[str, ...]) -> str:
        return (
            "| "
            + " | ".join(
                c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths, strict=True))
            )
            + " |"
        )

    table = [line(rows[0]), "|" + "|".join("-" * (w + 1) + (":" if i else "-") for i, w in enumerate(widths)) + "|"]
    table += [line(row) for row in rows[1:]]
    table.append("")
    table.append(
        f"{SHIPPED}: "
        + "; ".join(
            f"vs {r.policy} cost {comparison.cost_change(SHIPPED, r.policy):+.1%}, containers per card "
            f"×{comparison.density_ratio(SHIPPED, r.policy):.2f}, peak pool ×{comparison.pool_ratio(SHIPPED, r.policy):.2f}"
            for r in res
            if r.policy != SHIPPED
        )
    )
    return "\n".join(table)


def _per(total: float, seconds: float) -> str:
    return f"{total / seconds:,.1f}" if seconds else "-"
