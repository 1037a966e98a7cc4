"""Risk stated per resource and per SLA tier: the share of a workload's seconds its grant may fall short.

A memory shortfall is an out-of-memory failure (hard); an SM shortfall is a slowdown (soft), so
each tier names one target per resource. The node's allocation policy calibrates each workload's
margin toward its tier's targets; the service's SLA tiers carry them to the agents with the
policy. Pure data: the agent, the replay and the service all read it from here.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

__all__ = ["DEFAULT_MISS_TARGET", "DEFAULT_MISS_TARGETS", "MissTarget"]


@dataclass(frozen=True, slots=True)
class MissTarget:
    """Target share of workload-seconds whose use exceeds the grant, per resource, in (0, 1)."""

    memory: float
    sm: float

    def __post_init__(self) -> None:
        for name, value in (("memory", self.memory), ("sm", self.sm)):
            if not (math.isfinite(value) and 0 < value < 1):
                raise ValueError(f"{name} miss target must be in (0, 1), got {value!r}")


# The tier a workload without a known tier gets.
# Chosen from the replay (docs/replay.md): at these targets agent-default misses under 0.01 % of
# workload-seconds on the shipped traces and on a burstier request trace.
DEFAULT_MISS_TARGET = MissTarget(memory=1e-5, sm=2e-5)
DEFAULT_MISS_TARGETS: Mapping[str, MissTarget] = MappingProxyType(
    {
        "gold": MissTarget(memory=1e-6, sm=1e-5),
        "silver": MissTarget(memory=5e-6, sm=1.5e-5),
        "bronze": DEFAULT_MISS_TARGET,
        "best-effort": MissTarget(memory=1e-4, sm=1e-3),
    }
)
