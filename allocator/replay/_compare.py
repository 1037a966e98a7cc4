"""Loading the traces once and replaying several policies on the same usage."""

from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path

from allocator.replay._replay import POLICIES, ReplayConfig, ReplayResult, replay
from allocator.replay._trace import Fleet, PodTrace, read_azure_requests, read_fleet, read_pod_trace
from allocator.replay._usage import BurstSignals, PodUsage, UsageModel, build_burst_signals, build_pod_usage

__all__ = [
    "DEFAULT_TRACES",
    "Comparison",
    "ReplayInputs",
    "compare_policies",
    "format_comparison",
    "load_inputs",
    "run_policy",
]

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
) -> ReplayInputs:
    """Read the three traces and build every pod's use under ``model``."""
    model = model or UsageModel()
    trace = read_pod_trace(pods_path)
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
    """The three policies on one usage, and dynamic's savings against each static one."""

    static_whole: ReplayResult
    static_profile: ReplayResult
    dynamic: ReplayResult

    @property
    def results(self) -> tuple[ReplayResult, ReplayResult, ReplayResult]:
        return (self.static_whole, self.static_profile, self.dynamic)

    @property
    def cost_reduction_vs_static_whole(self) -> float:
        return _reduction(self.static_whole, self.dynamic)

    @property
    def cost_reduction_vs_static_profile(self) -> float:
        return _reduction(self.static_profile, self.dynamic)

    @property
    def density_ratio_vs_static_whole(self) -> float:
        return _density(self.static_whole, self.dynamic)

    @property
    def density_ratio_vs_static_profile(self) -> float:
        return _density(self.static_profile, self.dynamic)

    def to_dict(self) -> dict[str, object]:
        return {
            "policies": {r.policy: r.to_dict() for r in self.results},
            "comparison": {
                "cost_reduction_vs_static_whole": self.cost_reduction_vs_static_whole,
                "cost_reduction_vs_static_profile": self.cost_reduction_vs_static_profile,
                "density_ratio_vs_static_whole": self.density_ratio_vs_static_whole,
                "density_ratio_vs_static_profile": self.density_ratio_vs_static_profile,
                "gpus_peak": {r.policy: r.gpus_peak for r in self.results},
            },
        }


def _reduction(static: ReplayResult, dynamic: ReplayResult) -> float:
    """1 - dynamic cost / static cost (the same rate on both sides, so GPU-hours suffice)."""
    return 1.0 - dynamic.gpu_hours / static.gpu_hours if static.gpu_hours else 0.0


def _density(static: ReplayResult, dynamic: ReplayResult) -> float:
    return dynamic.containers_per_card / static.containers_per_card if static.containers_per_card else 0.0


def compare_policies(
    inputs: ReplayInputs,
    *,
    headroom: float = 0.2,
    predictor_window_steps: int = 5,
    usd_per_gpu_hour: Decimal = Decimal("5.12"),
) -> Comparison:
    """Replay static-whole, static-profile and dynamic on the same usage."""
    results = {
        policy: run_policy(
            inputs,
            ReplayConfig(
                policy=policy,
                headroom=headroom,
                predictor_window_steps=predictor_window_steps,
                usd_per_gpu_hour=usd_per_gpu_hour,
            ),
        )
        for policy in POLICIES
    }
    return Comparison(
        static_whole=results["static-whole"], static_profile=results["static-profile"], dynamic=results["dynamic"]
    )


def format_comparison(comparison: Comparison) -> str:
    """A Markdown table of the three policies plus dynamic's savings."""
    rows: list[tuple[str, ...]] = [
        ("figure", *(r.policy for r in comparison.results)),
        ("GPUs needed, peak", *(f"{r.gpus_peak:,}" for r in comparison.results)),
        ("GPUs needed, time-averaged", *(f"{r.gpus_time_avg:,.2f}" for r in comparison.results)),
        ("GPU-hours", *(f"{r.gpu_hours:,.0f}" for r in comparison.results)),
        (
            f"cost, USD at {comparison.dynamic.usd_per_gpu_hour}/GPU-h",
            *(f"{r.cost_usd:,}" for r in comparison.results),
        ),
        ("SM utilisation", *(f"{r.sm_utilisation:.1%}" for r in comparison.results)),
        ("memory utilisation", *(f"{r.memory_utilisation:.1%}" for r in comparison.results)),
        ("idle-memory share", *(f"{r.idle_memory_share:.1%}" for r in comparison.results)),
        ("containers per card", *(f"{r.containers_per_card:.2f}" for r in comparison.results)),
        ("SLO violations, workload-s", *(f"{r.slo_violation_workload_s:,.0f}" for r in comparison.results)),
        ("SLO violations, share of workload-s", *(f"{r.slo_violation_share:.3%}" for r in comparison.results)),
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
        f"dynamic vs static-whole: cost {-comparison.cost_reduction_vs_static_whole:+.1%}, "
        f"containers per card ×{comparison.density_ratio_vs_static_whole:.2f}; "
        f"vs static-profile: cost {-comparison.cost_reduction_vs_static_profile:+.1%}, "
        f"containers per card ×{comparison.density_ratio_vs_static_profile:.2f}"
    )
    return "\n".join(table)
