"""Pricing the replay per GPU model of the trace's fleet (docs/replay.md §Per-model pricing).

The node list names each node's GPU model; the pod list names none (``gpu_spec`` is empty in
every row, so any pod could run on any model) and does not say where each pod ran. The replay
therefore gives each pod one model by a keyed hash of ``(seed, pod name)``, with each model's
probability its share of the fleet's GPUs, replays every model as its own pool (a card holds
pods of its own model only) and prices each pool's GPU-hours at that model's rate.

Capacities stay those of an A100-80GB on every model (81,920 MB, 108 SMs): the workload
classes are A100 measurements and nothing in the traces says how much slower a T4 or a P100
runs them, so only the price differs between models.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal

from allocator.replay._compare import COMPARED, SHIPPED, Comparison, ReplayInputs, compare_policies
from allocator.replay._predicted import PredictorChoice
from allocator.replay._replay import Policy
from allocator.replay._trace import Fleet, GpuPod
from allocator.replay._usage import build_pod_usage

__all__ = [
    "DEFAULT_RATE",
    "GPU_RATES",
    "GpuRate",
    "ModelPool",
    "PricedComparison",
    "assign_models",
    "compare_per_model",
    "format_per_model",
]


@dataclass(frozen=True, slots=True)
class GpuRate:
    """Public on-demand price of one GPU of a model for an hour, and where it comes from."""

    model: str
    usd_per_gpu_hour: Decimal
    source: str
    public: bool = True  # False: the model is undisclosed, so the default rate stands in


# On-demand list prices, USD per GPU-hour (Linux, us-east-1 / us-central1), divided by the GPUs
# of the instance. Read from the providers' price pages; re-check them before quoting money.
DEFAULT_RATE = GpuRate(
    "A100-80GB", Decimal("5.12"), "AWS EC2 p4de.24xlarge, 8 × A100 80GB, 40.96 USD/h ÷ 8 (the project's demo card)"
)
GPU_RATES: Mapping[str, GpuRate] = {
    "T4": GpuRate("T4", Decimal("0.526"), "AWS EC2 g4dn.xlarge, 1 × T4 16GB, 0.526 USD/h"),
    "P100": GpuRate("P100", Decimal("1.46"), "Google Cloud NVIDIA P100 GPU price, 1.46 USD/h (AWS offers no P100)"),
    "V100M16": GpuRate("V100M16", Decimal("3.06"), "AWS EC2 p3.2xlarge, 1 × V100 16GB, 3.06 USD/h"),
    "V100M32": GpuRate("V100M32", Decimal("3.9015"), "AWS EC2 p3dn.24xlarge, 8 × V100 32GB, 31.212 USD/h ÷ 8"),
    "A10": GpuRate("A10", Decimal("1.006"), "AWS EC2 g5.xlarge, 1 × A10G 24GB (AWS's A10 variant), 1.006 USD/h"),
    "G2": GpuRate("G2", DEFAULT_RATE.usd_per_gpu_hour, "undisclosed Alibaba model code: the A100 default", False),
    "G3": GpuRate("G3", DEFAULT_RATE.usd_per_gpu_hour, "undisclosed Alibaba model code: the A100 default", False),
}


def rate_of(model: str) -> GpuRate:
    """The model's rate; a code the table does not know is priced at the default and marked so."""
    known = GPU_RATES.get(model)
    if known is not None:
        return known
    return GpuRate(model, DEFAULT_RATE.usd_per_gpu_hour, "not in the rate table: the A100 default", False)


def assign_models(pods: Sequence[GpuPod], fleet: Fleet, seed: int) -> dict[str, str]:
    """Pod name → GPU model, drawn by a keyed hash with probability GPUs of the model / GPUs of the fleet."""
    models = [(m, n) for m, n in sorted(fleet.gpus_by_model.items()) if n > 0]
    total = sum(n for _, n in models)
    if not total:
        raise ValueError("the fleet has no GPUs to assign pods to")
    result: dict[str, str] = {}
    for pod in pods:
        digest = hashlib.blake2b(f"{seed}:model:{pod.name}".encode(), digest_size=8).digest()
        draw = int.from_bytes(digest, "big") % total
        for model, gpus in models:
            if draw < gpus:
                result[pod.name] = model
                break
            draw -= gpus
    return result


@dataclass(frozen=True, slots=True)
class ModelPool:
    """One GPU model's pool: its GPUs in the fleet, its rate, and every policy replayed on its pods."""

    model: str
    gpus_in_fleet: int
    pods: int
    rate: GpuRate
    comparison: Comparison


@dataclass(frozen=True, slots=True)
class PricedComparison:
    """Every policy replayed per model pool and priced at the model's rate."""

    pools: tuple[ModelPool, ...]

    def cost_usd(self, policy: Policy) -> Decimal:
        """Σ over models of the pool's cost (each already rounded to the cent)."""
        return sum((p.comparison.result(policy).cost_usd for p in self.pools), Decimal("0"))

    def gpu_hours(self, policy: Policy) -> float:
        return sum(p.comparison.result(policy).gpu_hours for p in self.pools)

    def cost_change(self, policy: Policy, baseline: Policy) -> float:
        base = self.cost_usd(baseline)
        return float(self.cost_usd(policy) / base) - 1.0 if base else 0.0

    def to_dict(self) -> dict[str, object]:
        return {
            "pools": {
                p.model: {
                    "gpus_in_fleet": p.gpus_in_fleet,
                    "pods": p.pods,
                    "usd_per_gpu_hour": str(p.rate.usd_per_gpu_hour),
                    "rate_source": p.rate.source,
                    "rate_is_public": p.rate.public,
                    "gpus_peak": {r.policy: r.gpus_peak for r in p.comparison.results},
                    "gpu_hours": {r.policy: r.gpu_hours for r in p.comparison.results},
                    "cost_usd": {r.policy: str(r.cost_usd) for r in p.comparison.results},
                }
                for p in self.pools
            },
            "total_cost_usd": {policy: str(self.cost_usd(policy)) for policy in COMPARED},
            "total_gpu_hours": {policy: self.gpu_hours(policy) for policy in COMPARED},
        }


def compare_per_model(
    inputs: ReplayInputs,
    *,
    headroom: float = 0.2,
    lag_steps: int = 0,
    predictor: PredictorChoice = "default",
) -> PricedComparison:
    """Replay every policy on each model's pods as its own pool, priced at the model's rate."""
    by_model = assign_models(inputs.trace.pods, inputs.fleet, inputs.model.seed)
    pools: list[ModelPool] = []
    for model, gpus in sorted(inputs.fleet.gpus_by_model.items()):
        pods = [p for p in inputs.trace.pods if by_model.get(p.name) == model]
        if not pods:
            continue
        usage = build_pod_usage(pods, inputs.model, inputs.signals)
        rate = rate_of(model)
        comparison = compare_policies(
            dataclasses.replace(inputs, usage=usage),
            headroom=headroom,
            lag_steps=lag_steps,
            predictor=predictor,
            usd_per_gpu_hour=rate.usd_per_gpu_hour,
        )
        pools.append(ModelPool(model=model, gpus_in_fleet=gpus, pods=len(pods), rate=rate, comparison=comparison))
    return PricedComparison(pools=tuple(pools))


def format_per_model(priced: PricedComparison) -> str:
    """A Markdown table: per model, its rate, pods, and each policy's GPU-hours and cost; then the totals."""
    head = ["model", "GPUs in fleet", "pods", "USD/GPU-h"] + [f"{p}, GPU-h / USD" for p in COMPARED]
    lines = ["| " + " | ".join(head) + " |", "|---|" + "---:|" * (len(head) - 1)]
    for pool in priced.pools:
        rate = f"{pool.rate.usd_per_gpu_hour}" + ("" if pool.rate.public else " (assumed)")
        cells = [pool.model, f"{pool.gpus_in_fleet:,}", f"{pool.pods:,}", rate]
        for policy in COMPARED:
            r = pool.comparison.result(policy)
            cells.append(f"{r.gpu_hours:,.0f} / {r.cost_usd:,}")
        lines.append("| " + " | ".join(cells) + " |")
    total = ["**all**", f"{sum(p.gpus_in_fleet for p in priced.pools):,}", f"{sum(p.pods for p in priced.pools):,}", ""]
    total += [f"{priced.gpu_hours(p):,.0f} / {priced.cost_usd(p):,}" for p in COMPARED]
    lines.append("| " + " | ".join(total) + " |")
    dynamic: Policy = SHIPPED
    lines.append("")
    lines.append(
        f"{dynamic}, priced per model: "
        + "; ".join(f"vs {b} {priced.cost_change(dynamic, b):+.1%}" for b in COMPARED if b != dynamic)
    )
    return "\n".join(lines)
