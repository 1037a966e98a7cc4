"""Right-sizing: how many GPUs a pool needs at the P95 / P99 of its demand.

Two numbers per percentile, both on GPUs of one capacity:

* **lower bound**: take the percentile of the *total* demand per step (per resource), then
  ``max(ceil(total memory / GPU memory), ceil(total SM / GPU SM))`` — no packing can do with
  fewer GPUs while serving that total;
* **first-fit decreasing**: take each workload's own percentile (per resource) over the steps it
  ran (``DemandSeries.ran``; a step before it started is not a step of no demand), sort workloads
  by their larger share of one GPU (ties by key) and put each on the first GPU where both
  resources still fit. A series that is not ``packed`` (a workload that ended within the window)
  counts in the total demand of the steps it ran, never in the packing.

Steps are the ones the pool was metered: a caller passes no step where nothing was measured, so
a gap in the record never reads as a pool with no demand.

``gpus_needed = max(lower bound, FFD)``: a sum of per-workload percentiles is usually above the
percentile of the sum, but need not be, so the larger of the two is the estimate. Percentiles
are nearest-rank (the smallest sample with at least p % of samples at or below it), exact on
integers. Money: ``gpu_cost(current − needed)`` (``(current − needed) × hours × price``, by
default 730 h, a month): the rule of a plan's projected savings, so both read against the
same pool at the same rate over the same horizon. Positive: GPUs the pool could give up;
negative: the pool is short, and growing it to the estimate costs that much.

A fleet hands back or adds whole nodes, not GPUs: ``whole_node_gpus`` is the GPUs of the smallest
set of the pool's nodes that holds an estimate (or of the pool and the nodes, like its most
common, it must add), so the difference a service prices is whole nodes' GPUs.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from decimal import Decimal

from allocator.rebalance._model import SM_MILLI
from allocator.rebalance._plan import HOURS_PER_MONTH, gpu_cost

__all__ = ["DemandSeries", "RightSizeEstimate", "RightSizing", "nearest_rank", "right_size", "whole_node_gpus"]


@dataclass(frozen=True, slots=True)
class DemandSeries:
    """One workload's demand per time step (equal steps, aligned across workloads)."""

    key: str
    memory_mb: tuple[int, ...]
    sm_milli: tuple[int, ...]
    # The steps the workload ran (empty: every step); its own percentile is over these only.
    ran: tuple[bool, ...] = ()
    # False: a workload no longer running, part of the total demand but not packed.
    packed: bool = True

    def __post_init__(self) -> None:
        if not isinstance(self.key, str) or not self.key:
            raise ValueError(f"demand series key must be a non-empty string, got {self.key!r}")
        for name, values in (("memory_mb", self.memory_mb), ("sm_milli", self.sm_milli)):
            if not isinstance(values, tuple) or not values:
                raise ValueError(f"demand series {self.key!r}: {name} must be a non-empty tuple")
            for value in values:
                if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                    raise ValueError(f"demand series {self.key!r}: {name} values must be integers >= 0, got {value!r}")
        if len(self.memory_mb) != len(self.sm_milli):
            raise ValueError(
                f"demand series {self.key!r}: memory_mb has {len(self.memory_mb)} steps, "
                f"sm_milli has {len(self.sm_milli)}"
            )
        if self.ran and len(self.ran) != len(self.memory_mb):
            raise ValueError(f"demand series {self.key!r}: ran has {len(self.ran)} steps, "
                             f"memory_mb has {len(self.memory_mb)}")

    def own_percentile(self, percentile: int) -> tuple[int, int]:
        """Its memory and SM demand at `percentile` of the steps it ran (0, 0 when it ran none)."""
        steps = [t for t in range(len(self.memory_mb)) if not self.ran or self.ran[t]]
        if not steps:
            return 0, 0
        return (nearest_rank([self.memory_mb[t] for t in steps], percentile),
                nearest_rank([self.sm_milli[t] for t in steps], percentile))


@dataclass(frozen=True, slots=True)
class RightSizeEstimate:
    """GPUs needed at one percentile, against the pool's current size."""

    percentile: int
    total_memory_mb: int  # percentile of the summed demand
    total_sm_milli: int
    lower_bound_gpus: int
    ffd_gpus: int
    gpus_needed: int
    current_gpus: int
    monthly_cost_difference: Decimal  # gpu_cost(current − needed); > 0 a saving, < 0 the cost to grow

    @property
    def gpus_saved(self) -> int:
        return self.current_gpus - self.gpus_needed


@dataclass(frozen=True, slots=True)
class RightSizing:
    gpu_memory_mb: int
    gpu_sm_milli: int
    steps: int
    workloads: int
    price_per_gpu_hour: Decimal
    hours_per_month: Decimal
    estimates: tuple[RightSizeEstimate, ...]


def nearest_rank(values: Sequence[int], percentile: int) -> int:
    """The nearest-rank percentile: the ``ceil(p/100 × n)``-th smallest value (1-based)."""
    if not values:
        raise ValueError("nearest_rank needs at least one value")
    if isinstance(percentile, bool) or not isinstance(percentile, int) or not 0 < percentile <= 100:
        raise ValueError(f"percentile must be an integer in 1..100, got {percentile!r}")
    rank = -(-percentile * len(values) // 100)  # ceil without floats
    return sorted(values)[rank - 1]


def _first_fit_decreasing(items: list[tuple[str, int, int]], memory_mb: int, sm_milli: int) -> int:
    items = sorted(items, key=lambda it: (-max(it[1] / memory_mb, it[2] / sm_milli), it[0]))
    bins: list[list[int]] = []  # [memory used, SM used]
    for key, mem, sm in items:
        if mem > memory_mb or sm > sm_milli:
            raise ValueError(
                f"workload {key!r} needs {mem} MB / {sm} SM milli at this percentile, "
                f"more than one GPU ({memory_mb} MB / {sm_milli} SM milli)"
            )
        for used in bins:
            if used[0] + mem <= memory_mb and used[1] + sm <= sm_milli:
                used[0] += mem
                used[1] += sm
                break
        else:
            bins.append([mem, sm])
    return len(bins)


def right_size(
    series: Sequence[DemandSeries],
    *,
    gpu_memory_mb: int,
    current_gpus: int,
    price_per_gpu_hour: Decimal,
    gpu_sm_milli: int = SM_MILLI,
    percentiles: Sequence[int] = (95, 99),
    hours: Decimal = HOURS_PER_MONTH,
) -> RightSizing:
    """GPUs needed at each percentile and the cost difference with ``current_gpus`` over
    ``hours`` (a plan's horizon: pass the plan's ``hours`` to read both side by side)."""
    if not series:
        raise ValueError("right_size needs at least one demand series")
    for name, value in (("gpu_memory_mb", gpu_memory_mb), ("gpu_sm_milli", gpu_sm_milli)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
    if isinstance(current_gpus, bool) or not isinstance(current_gpus, int) or current_gpus < 0:
        raise ValueError(f"current_gpus must be an integer >= 0, got {current_gpus!r}")
    if not isinstance(price_per_gpu_hour, Decimal) or not price_per_gpu_hour.is_finite() or price_per_gpu_hour < 0:
        raise ValueError(f"price_per_gpu_hour must be a finite Decimal >= 0, got {price_per_gpu_hour!r}")
    if not isinstance(hours, Decimal) or not hours.is_finite() or hours < 0:
        raise ValueError(f"hours must be a finite Decimal >= 0, got {hours!r}")
    if not percentiles:
        raise ValueError("percentiles must name at least one percentile")
    steps = len(series[0].memory_mb)
    keys: set[str] = set()
    for s in series:
        if s.key in keys:
            raise ValueError(f"demand series {s.key!r} appears more than once")
        keys.add(s.key)
        if len(s.memory_mb) != steps:
            raise ValueError(f"demand series {s.key!r} has {len(s.memory_mb)} steps, {series[0].key!r} has {steps}")
    total_memory = [sum(s.memory_mb[t] for s in series) for t in range(steps)]
    total_sm = [sum(s.sm_milli[t] for s in series) for t in range(steps)]

    estimates: list[RightSizeEstimate] = []
    for p in percentiles:
        memory_p = nearest_rank(total_memory, p)
        sm_p = nearest_rank(total_sm, p)
        lower = max(-(-memory_p // gpu_memory_mb), -(-sm_p // gpu_sm_milli))
        items = [(s.key, *s.own_percentile(p)) for s in series if s.packed]
        ffd = _first_fit_decreasing(items, gpu_memory_mb, gpu_sm_milli)
        needed = max(lower, ffd)
        estimates.append(
            RightSizeEstimate(
                percentile=p,
                total_memory_mb=memory_p,
                total_sm_milli=sm_p,
                lower_bound_gpus=lower,
                ffd_gpus=ffd,
                gpus_needed=needed,
                current_gpus=current_gpus,
                monthly_cost_difference=gpu_cost(current_gpus - needed, price_per_gpu_hour=price_per_gpu_hour,
                                                 hours=hours),
            )
        )
    return RightSizing(
        gpu_memory_mb=gpu_memory_mb,
        gpu_sm_milli=gpu_sm_milli,
        steps=steps,
        workloads=sum(1 for s in series if s.packed),
        price_per_gpu_hour=price_per_gpu_hour,
        hours_per_month=hours,
        estimates=tuple(estimates),
    )


def whole_node_gpus(node_gpus: Sequence[int], gpus_needed: int) -> int:
    """The GPUs of the fewest-GPU set of whole nodes (GPU counts ``node_gpus``) holding at least
    ``gpus_needed``; when the pool holds fewer, the pool plus as many nodes of its most common
    size (the larger on a tie) as make up the rest."""
    if isinstance(gpus_needed, bool) or not isinstance(gpus_needed, int) or gpus_needed < 0:
        raise ValueError(f"gpus_needed must be an integer >= 0, got {gpus_needed!r}")
    if any(isinstance(n, bool) or not isinstance(n, int) or n < 0 for n in node_gpus):
        raise ValueError(f"node GPU counts must be integers >= 0, got {list(node_gpus)!r}")
    total = sum(node_gpus)
    if gpus_needed > total:
        if not any(node_gpus):
            raise ValueError("a pool with no GPUs cannot grow by nodes like its own")
        size = max((n for n in node_gpus if n), key=lambda n: (node_gpus.count(n), n))
        return total + -(-(gpus_needed - total) // size) * size
    reachable = {0}  # subset sums of whole nodes' GPUs
    for n in node_gpus:
        reachable |= {r + n for r in reachable}
    return min(r for r in reachable if r >= gpus_needed)
