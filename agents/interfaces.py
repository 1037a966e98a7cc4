"""Value types and the Protocols at the agent's edges (NVML, clock, enforcement).

Fakes for these seams live in ``agents.fakes`` (one module per edge).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import NamedTuple, Protocol, runtime_checkable

__all__ = [
    "NO_META",
    "Attributor",
    "BatchPredictor",
    "Clock",
    "EnergyReader",
    "Enforcer",
    "Entitlement",
    "GpuBackend",
    "GpuInfo",
    "Grant",
    "Prediction",
    "Predictor",
    "TickObserver",
    "UsageReading",
    "Workload",
    "WorkloadMeta",
]


@dataclass(frozen=True, slots=True)
class GpuInfo:
    """One physical GPU as it appears in a batch's ``gpus`` list."""

    uuid: str
    model: str
    memory_mb: int  # total device memory, MiB
    sm_count: int  # streaming multiprocessors


@dataclass(frozen=True, slots=True)
class WorkloadMeta:
    """What Kubernetes says about a workload beyond its identity, for grouping (the optional batch fields): the
    optional sample fields of wire protocol v1 (docs/protocol.md). Empty fields are not sent."""

    controller_kind: str = ""  # the pod's controller, resolved one level (agents.owners)
    controller_name: str = ""
    labels: tuple[tuple[str, str], ...] = ()  # the allow-listed pod labels, sorted by key
    mem_requested_mb: int | None = None  # what the container asked for on this GPU (agents.gpu_requests)
    sm_requested: float | None = None

    def to_wire(self) -> dict[str, object]:
        wire: dict[str, object] = {}
        if self.controller_kind:
            wire["controller_kind"] = self.controller_kind
            wire["controller_name"] = self.controller_name
        if self.labels:
            wire["labels"] = dict(self.labels)
        if self.mem_requested_mb is not None:
            wire["mem_requested_mb"] = self.mem_requested_mb
        if self.sm_requested is not None:
            wire["sm_requested"] = self.sm_requested
        return wire


NO_META = WorkloadMeta()


@dataclass(frozen=True, slots=True)
class Workload:
    """One container using GPUs; the identity a usage sample is billed to."""

    tenant: str
    namespace: str
    pod: str
    container: str
    pod_uid: str
    sla_tier: str
    # Description, not identity: two readings of one container are one workload whatever their
    # labels say, so it takes no part in equality (nor in ``key``).
    meta: WorkloadMeta = field(default=NO_META, compare=False)
    # Unique per node: a container is one workload. Formatted once here rather than by a property:
    # the round, the predictor and its forgetting pass each read it per reading every tick.
    key: str = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "key", f"{self.namespace}/{self.pod}/{self.container}")


@dataclass(frozen=True, slots=True)
class Entitlement:
    """What a workload was promised on one GPU (pod request, annotation, claim)."""

    guarantee_mem_mb: float = 0.0
    limit_mem_mb: float | None = None  # None: up to the card
    guarantee_sm: float = 0.0
    limit_sm: float | None = None  # None: up to the card
    weight: float | None = None  # None: the SLA tier's weight from the policy


@dataclass(frozen=True, slots=True)
class UsageReading:
    """A workload's use of one GPU at one instant; held constant until the next tick."""

    workload: Workload
    gpu: str  # GPU uuid
    mem_used_mb: float  # MiB allocated now
    sm_used: float  # SMs busy on average (0..sm_count), i.e. SM utilisation x sm_count
    pcie_mb_per_s: float  # host<->device traffic rate, MB/s
    entitlement: Entitlement = field(default_factory=Entitlement)


class Grant(NamedTuple):
    """What the allocation loop grants a workload on one GPU for the next tick.

    A named tuple, not a frozen dataclass: the agent builds one per workload every tick, and a
    frozen dataclass's ``__init__`` (one ``object.__setattr__`` per field) cost three times as much.
    """

    workload: Workload
    gpu: str
    mem_mb: float  # MiB
    sm: float  # SMs


class Prediction(NamedTuple):
    """Predicted peak use over the look-ahead horizon (0.5-2 s, docs/prediction.md); a named
    tuple for the reason ``Grant`` is one."""

    mem_peak_mb: float
    sm_peak: float


class GpuBackend(Protocol):
    """Source of GPU inventory and per-workload usage (NVML or the simulator)."""

    def inventory(self) -> Sequence[GpuInfo]: ...

    def read(self, *, now: datetime) -> Sequence[UsageReading]: ...


@runtime_checkable
class EnergyReader(Protocol):
    """A backend that meters GPU energy: per GPU, a cumulative count of joules since an arbitrary origin
    (NVML's total energy, or power integrated over time). The meter takes differences of it, so only the
    count's growth matters; a GPU that cannot report energy is absent from the answer."""

    def energy_j(self, *, now: datetime) -> Mapping[str, float]: ...


class Clock(Protocol):
    """Wall time for timestamps, monotonic time for intervals."""

    def now(self) -> datetime: ...  # aware, UTC

    def monotonic(self) -> float: ...  # seconds, arbitrary origin

    def sleep(self, seconds: float) -> None: ...


class Enforcer(Protocol):
    """Applies grants on the node (MPS limits, watchdog, or dry-run logging)."""

    def apply(self, grants: Sequence[Grant]) -> None: ...


class Attributor(Protocol):
    """Maps a GPU process to the workload that owns it (pid -> cgroup -> pod)."""

    def attribute(self, *, pid: int) -> Workload: ...


class Predictor(Protocol):
    """Predicts a workload's near-term peak from its readings."""

    def predict(self, *, reading: UsageReading, now: datetime) -> Prediction: ...


@runtime_checkable
class BatchPredictor(Predictor, Protocol):
    """A ``Predictor`` that also predicts a whole tick's readings in one call (one model pass for all).

    ``predict_many`` returns one ``Prediction`` per reading, in order, equal to what ``predict``
    would give reading by reading; ``compute_grants`` uses it when the predictor has it.
    """

    def predict_many(self, *, readings: Sequence[UsageReading], now: datetime) -> Sequence[Prediction]: ...


class TickObserver(Protocol):
    """Sees each allocation round after the enforcer: the watchdog, budget evictions, metrics."""

    def observe(self, *, grants: Sequence[Grant], readings: Sequence[UsageReading]) -> None: ...
