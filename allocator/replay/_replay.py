"""Replaying GPU pods under static and dynamic allocation policies (docs/replay.md).

Time is continuous for occupancy (a card is busy from the moment its first pod is
placed until its last pod leaves, to the second) and stepped for use (``step_s``
steps with mean and peak use per step, from :mod:`allocator.replay._usage`).

Policies, per GPU shard of a pod (a pod asking for ``num_gpu`` GPUs has that many
shards, on distinct cards):

- ``static-whole``: each shard holds a whole card, whatever its share (the study's
  baseline: ``nvidia.com/gpu: 1``).
- ``static-request``: each shard holds the fraction of a card its pod asked for
  (``gpu_milli``), SM and memory, as time-slicing with limits or HAMi would give.
- ``static-profile``: each shard holds the smallest MIG-like profile (1, 2, 3, 4 or 7 of
  7 slices) whose SM share and memory both cover the request; chosen at admission from
  the request alone.
- ``dynamic-current-use``: each step a shard reserves the last known step's peak use ×
  (1 + headroom), clamped to its request.
- ``dynamic-predicted``: the same with the agent's predictors (:mod:`allocator.predict`)
  fed the step peaks known so far: max(last use, forecast) × (1 + headroom).

Dynamic grants for step ``t`` are decided from use up to step ``t − 1 − lag_steps``
(``lag_steps`` models control lag); before anything is known a shard reserves its class's
profile peak scaled to its request. Placement is online best fit on reserved SM; on each
card and step the reservations are granted as they are where they fit, else through
:func:`allocator.fairshare.fair_share`. Grants never look at the step's own use.

An SLO miss is a second in which a shard's use exceeds its grant, counted in
workload-seconds for SM and memory apart, with the amount short (SM-seconds, MB-seconds).
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from decimal import ROUND_HALF_EVEN, Decimal
from typing import Literal, get_args

import numpy as np
import numpy.typing as npt

from allocator.fairshare import Claim, fair_share
from allocator.policy import DEFAULT_MARGIN_CONFIG, MarginConfig
from allocator.predict import Resource
from allocator.rebalance import SM_MILLI, Pool, PoolNode, PoolWorkload, plan_rebalance
from allocator.replay._agent import agent_rows, capped_outcomes
from allocator.replay._predicted import PREDICTOR_CHOICES, PredictorChoice, history_window, step_forecasts
from allocator.replay._usage import BurstSignals, PodUsage, UsageModel, shortfall
from allocator.risk import DEFAULT_MISS_TARGET, MissTarget

__all__ = [
    "DYNAMIC_POLICIES",
    "MIG_PROFILES",
    "POLICIES",
    "SLICES_PER_CARD",
    "DynamicGrants",
    "Invariants",
    "MigProfile",
    "Policy",
    "ReplayConfig",
    "ReplayResult",
    "StaticGrants",
    "dynamic_grants",
    "replay",
    "select_profile",
    "static_grants",
]

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]
BoolMask = npt.NDArray[np.bool_]
Policy = Literal[
    "static-whole", "static-request", "static-profile", "dynamic-current-use", "dynamic-predicted", "agent-default"
]
POLICIES: tuple[Policy, ...] = get_args(Policy)
DYNAMIC_POLICIES: frozenset[Policy] = frozenset({"dynamic-current-use", "dynamic-predicted", "agent-default"})

SLICES_PER_CARD = 7
# The service's rebalance schedule (config/settings.py, billing/services/fleet/rebalance.py): a plan of at
# most 10 moves every hour, each pod's demand its largest over the last 24 hours.
REBALANCE_EVERY_S = 3_600.0
REBALANCE_MAX_MOVES = 10
REBALANCE_WINDOW_S = 24 * 3_600.0
_UNITS = 7_000  # a card in placement units: 1,000 per slice, 7 per gpu_milli
_EPS = 1e-9
_CENT = Decimal("0.01")


@dataclass(frozen=True, slots=True)
class MigProfile:
    """A fixed vGPU profile of an A100-80GB: ``slices`` of 7, with that share of the SMs."""

    name: str
    slices: int
    memory_mb: float

    @property
    def sm_fraction(self) -> float:
        return self.slices / SLICES_PER_CARD


MIG_PROFILES: tuple[MigProfile, ...] = (
    MigProfile("1g.10gb", 1, 10_240.0),
    MigProfile("2g.20gb", 2, 20_480.0),
    MigProfile("3g.40gb", 3, 40_960.0),
    MigProfile("4g.40gb", 4, 40_960.0),
    MigProfile("7g.80gb", 7, 81_920.0),
)


def select_profile(share: float, card_memory_mb: float = 81_920.0) -> MigProfile:
    """The smallest profile (fewest slices) whose SM share and memory both cover a request of ``share``."""
    if not (math.isfinite(share) and 0 < share <= 1):
        raise ValueError(f"share must be in (0, 1], got {share!r}")
    for profile in MIG_PROFILES:
        if share <= profile.sm_fraction + _EPS and share * card_memory_mb <= profile.memory_mb + _EPS:
            return profile
    raise AssertionError("7g.80gb covers every share <= 1")  # unreachable: the last profile is the card


@dataclass(frozen=True, slots=True)
class ReplayConfig:
    """Which policy to replay, and its knobs."""

    policy: Policy
    headroom: float = 0.2  # dynamic: reservation = predicted peak × (1 + headroom)
    lag_steps: int = 0  # dynamic: a grant for step t is decided from use up to step t - 1 - lag_steps
    predictor: PredictorChoice = "default"  # dynamic-predicted: calibrated default predictors, or raw
    usd_per_gpu_hour: Decimal = Decimal("5.12")  # the project's demo A100-80GB rate card
    # agent-default: the policy object's knobs and the miss target its margins calibrate toward
    # (the trace names no SLA tier: every pod has the tier-less default).
    margin: MarginConfig = DEFAULT_MARGIN_CONFIG
    miss_target: MissTarget = DEFAULT_MISS_TARGET
    # dynamic: the rebalance planner's schedule (None: never) and its cap on moves per plan
    rebalance_every_s: float | None = REBALANCE_EVERY_S
    rebalance_max_moves: int = REBALANCE_MAX_MOVES

    def __post_init__(self) -> None:
        if self.policy not in POLICIES:
            raise ValueError(f"policy must be one of {', '.join(POLICIES)}, got {self.policy!r}")
        if not (math.isfinite(self.headroom) and 0 <= self.headroom <= 10):
            raise ValueError(f"headroom must be in [0, 10], got {self.headroom!r}")
        if not 0 <= self.lag_steps <= 1_000:
            raise ValueError(f"lag_steps must be in 0..1000, got {self.lag_steps!r}")
        if self.predictor not in PREDICTOR_CHOICES:
            raise ValueError(f"predictor must be one of {', '.join(PREDICTOR_CHOICES)}, got {self.predictor!r}")
        if self.rebalance_every_s is not None and not (
            math.isfinite(self.rebalance_every_s) and self.rebalance_every_s >= 60
        ):
            raise ValueError(f"rebalance_every_s must be None or >= 60, got {self.rebalance_every_s!r}")
        if not 0 <= self.rebalance_max_moves <= 1_000:
            raise ValueError(f"rebalance_max_moves must be in 0..1000, got {self.rebalance_max_moves!r}")
        if not (self.usd_per_gpu_hour.is_finite() and self.usd_per_gpu_hour >= 0):
            raise ValueError(f"usd_per_gpu_hour must be finite and >= 0, got {self.usd_per_gpu_hour!r}")


@dataclass(frozen=True, slots=True)
class Invariants:
    """Checks a dynamic policy must pass on every card and step (trivial for static ones)."""

    max_sm_granted_fraction: float  # Σ SM grants / SMs, worst card-step; <= 1
    max_memory_granted_fraction: float  # Σ memory grants / card memory, worst card-step; <= 1
    memory_overcommitted_card_steps: int  # Σ known memory use above the card: granted pro rata to it
    contended_card_steps: int  # Σ reservations or uses above the card: resolved by fair share


@dataclass(frozen=True, slots=True)
class ReplayResult:
    """Figures of one replay; definitions in docs/replay.md §Metrics."""

    policy: Policy
    step_s: int
    pods: int
    gpu_shards: int
    span_s: float  # first pod start to last pod end
    workload_seconds: float  # Σ shards × seconds held
    gpus_peak: int  # most cards with at least one shard at once
    gpus_time_avg: float  # busy card-seconds / span
    gpu_hours: float  # busy card-seconds / 3600
    usd_per_gpu_hour: Decimal
    cost_usd: Decimal  # gpu_hours × rate, to the cent (ROUND_HALF_EVEN)
    sm_utilisation: float  # SM-seconds served / (busy card-seconds × SMs)
    memory_utilisation: float  # MB-seconds used / (busy card-seconds × card MB)
    idle_memory_share: float  # 1 - memory_utilisation
    memory_granted_share: float  # MB-seconds granted / (busy card-seconds × card MB)
    containers_per_card: float  # workload_seconds / busy card-seconds
    slo_miss_workload_s: float  # seconds with SM or memory use above grant, ≤ step per shard-step
    slo_miss_sm_workload_s: float
    slo_miss_memory_workload_s: float
    slo_miss_share: float  # slo_miss_workload_s / workload_seconds
    sm_short_sm_s: float  # Σ over missed seconds of (SM use − SM grant)
    memory_short_mb_s: float  # Σ over missed seconds of (memory use − memory grant)
    profiles: Mapping[str, int] = field(default_factory=dict)  # static-profile: shards per profile
    invariants: Invariants | None = None  # dynamic only
    rebalance_plans: int = 0  # dynamic: plans the rebalance planner made (at least two busy cards)
    shards_moved: int = 0  # dynamic: moves those plans made

    def to_dict(self) -> dict[str, object]:
        """JSON-ready: money as a decimal string, everything else numbers."""
        result: dict[str, object] = {
            "policy": self.policy,
            "step_s": self.step_s,
            "pods": self.pods,
            "gpu_shards": self.gpu_shards,
            "span_s": self.span_s,
            "workload_seconds": self.workload_seconds,
            "gpus_peak": self.gpus_peak,
            "gpus_time_avg": self.gpus_time_avg,
            "gpu_hours": self.gpu_hours,
            "usd_per_gpu_hour": str(self.usd_per_gpu_hour),
            "cost_usd": str(self.cost_usd),
            "sm_utilisation": self.sm_utilisation,
            "memory_utilisation": self.memory_utilisation,
            "idle_memory_share": self.idle_memory_share,
            "memory_granted_share": self.memory_granted_share,
            "containers_per_card": self.containers_per_card,
            "slo_miss_workload_s": self.slo_miss_workload_s,
            "slo_miss_sm_workload_s": self.slo_miss_sm_workload_s,
            "slo_miss_memory_workload_s": self.slo_miss_memory_workload_s,
            "slo_miss_share": self.slo_miss_share,
            "sm_short_sm_s": self.sm_short_sm_s,
            "memory_short_mb_s": self.memory_short_mb_s,
            "profiles": dict(self.profiles),
            "rebalance_plans": self.rebalance_plans,
            "shards_moved": self.shards_moved,
        }
        if self.invariants is not None:
            inv = self.invariants
            result["invariants"] = {
                "max_sm_granted_fraction": inv.max_sm_granted_fraction,
                "max_memory_granted_fraction": inv.max_memory_granted_fraction,
                "memory_overcommitted_card_steps": inv.memory_overcommitted_card_steps,
                "contended_card_steps": inv.contended_card_steps,
            }
        return result


@dataclass(slots=True)
class _Cards:
    """Occupancy of card slots over time; slots are reused lowest-first once empty.

    ``load`` holds, per slot, what its shards take in the placement's two units (static: units of
    ``_UNITS`` and nothing; dynamic: SMs and MB reserved), and ``busy_mask`` which slots hold a
    shard: arrays, so that an arrival weighs every card at once. A pod list without times places
    all its pods at one instant, on thousands of cards; a scan per card and arrival would be
    quadratic in Python.
    """

    members: list[set[int]] = field(default_factory=list)
    load: FloatArray = field(default_factory=lambda: np.zeros((0, 2)))
    busy_mask: BoolMask = field(default_factory=lambda: np.zeros(0, dtype=np.bool_))
    empty_slots: list[int] = field(default_factory=list)  # heap
    busy: int = 0
    peak: int = 0
    busy_seconds: float = 0.0
    last_time: float = 0.0

    def advance(self, time: float) -> None:
        self.busy_seconds += self.busy * (time - self.last_time)
        self.last_time = time

    def busy_slots(self) -> list[int]:
        return [int(slot) for slot in np.flatnonzero(self.busy_mask)]

    def open_slot(self) -> int:
        if self.empty_slots:
            return heapq.heappop(self.empty_slots)
        slot = len(self.members)
        self.members.append(set())
        if slot == self.load.shape[0]:  # grow by doubling: amortised O(1) per new card
            size = max(64, 2 * slot)
            self.load = np.concatenate([self.load, np.zeros((size - slot, 2))])
            self.busy_mask = np.concatenate([self.busy_mask, np.zeros(size - slot, dtype=np.bool_)])
        return slot

    def add(self, slot: int, pod: int, load: tuple[float, float] = (0.0, 0.0)) -> None:
        if not self.members[slot]:
            self.busy += 1
            self.peak = max(self.peak, self.busy)
            self.busy_mask[slot] = True
        self.members[slot].add(pod)
        self.load[slot] += load

    def remove(self, slot: int, pod: int, load: tuple[float, float] = (0.0, 0.0)) -> None:
        self.members[slot].discard(pod)
        self.load[slot] -= load
        if not self.members[slot]:
            self.busy -= 1
            self.busy_mask[slot] = False
            self.load[slot] = 0.0
            heapq.heappush(self.empty_slots, slot)

    def fitting(self, room: tuple[float, float], need: tuple[float, float], exclude: Sequence[int]) -> BoolMask:
        """Which busy slots, not in ``exclude``, still take ``need`` within ``room`` (up to ``_EPS``)."""
        size = len(self.members)
        load = self.load[:size]
        fits = self.busy_mask[:size].copy()
        fits &= load[:, 0] + need[0] <= room[0] + _EPS
        fits &= load[:, 1] + need[1] <= room[1] + _EPS
        fits[list(exclude)] = False
        return fits


def _events(usage: PodUsage) -> list[tuple[float, int, int]]:
    """(time, 0 = leave / 1 = arrive, pod): at equal times pods leave before others arrive."""
    events = [(p.start_s, 1, i) for i, p in enumerate(usage.pods)]
    events += [(p.end_s, 0, i) for i, p in enumerate(usage.pods)]
    events.sort()
    return events


def _place_static(usage: PodUsage, units: Sequence[int]) -> tuple[_Cards, list[tuple[int, ...]]]:
    """First-fit by units of a card (``_UNITS`` per card); a pod's shards on distinct cards."""
    cards = _Cards()
    placement: list[tuple[int, ...]] = [() for _ in usage.pods]
    events = _events(usage)
    if events:
        cards.last_time = events[0][0]
    for time, kind, pod in events:
        cards.advance(time)
        need = units[pod]
        if kind == 0:
            for slot in placement[pod]:
                cards.remove(slot, pod, (need, 0.0))
            continue
        chosen: list[int] = []
        for _ in range(usage.pods[pod].num_gpu):
            fits = cards.fitting((_UNITS, 0.0), (need, 0.0), chosen)
            first = int(np.argmax(fits)) if fits.any() else None  # the lowest slot that fits
            slot = cards.open_slot() if first is None else first
            cards.add(slot, pod, (need, 0.0))
            chosen.append(slot)
        placement[pod] = tuple(chosen)
    return cards, placement


def _known_rows(usage: PodUsage, lag_steps: int) -> tuple[IntArray, IntArray, npt.NDArray[np.bool_]]:
    """Per row: its step within the pod, the latest row whose use is known when its grant is decided, and
    whether there is one (the grant for step t is decided from steps up to t − 1 − lag)."""
    index = np.arange(usage.rows, dtype=np.int64)
    local = index - np.repeat(usage.offset, usage.steps)
    known = local - 1 - lag_steps
    return local, index - 1 - lag_steps, known >= 0


def _forecast(  # noqa: PLR0917 - a private helper whose one caller passes its loop's state in order
    usage: PodUsage,
    peaks: FloatArray,
    known_row: IntArray,
    has: npt.NDArray[np.bool_],
    resource: Literal["memory", "sm"],
    choice: PredictorChoice,
) -> FloatArray:
    """The predictor's forecast for each row that has a known row, fed the step peaks up to it."""
    res: Resource = "memory_mb" if resource == "memory" else "sm"
    size = history_window(res)
    out = np.zeros(usage.rows)
    rows = np.flatnonzero(has)
    if not rows.size:
        return out
    end = known_row[rows]
    first = np.repeat(usage.offset, usage.steps)[rows]
    if size == 1:
        out[rows] = step_forecasts(peaks[end][:, None], res, choice)
        return out
    # A row's history is fixed by its class, share, the burst window of its last known step and
    # how many steps it has seen (capped at the window): evaluate each distinct history once.
    pod = usage.pod_of_row()[rows]
    seen = np.minimum(end - first, size - 1)
    milli = np.array([p.gpu_milli for p in usage.pods], dtype=np.int64)[pod]
    key = (usage.class_index[pod] * 1_001 + milli) * (int(usage.window.max(initial=0)) + 1) + usage.window[end]
    key = key * size + seen
    _, pick, inverse = np.unique(key, return_index=True, return_inverse=True)
    ends, firsts = end[pick], first[pick]
    idx = np.maximum(ends[:, None] - np.arange(size - 1, -1, -1, dtype=np.int64)[None, :], firsts[:, None])
    out[rows] = step_forecasts(peaks[idx], res, choice)[inverse.reshape(-1)]
    return out


def _reservations(usage: PodUsage, model: UsageModel, config: ReplayConfig) -> tuple[FloatArray, FloatArray]:
    """Per row: SM and memory reserved for the step, from use known before it (``_known_rows``)."""
    pod = usage.pod_of_row()
    share = usage.share[pod]
    classes = model.classes
    prior_sm = np.array([c.sm_base + c.sm_burst for c in classes])[usage.class_index][pod] * model.card_sm_count
    prior_mem = np.array([c.mem_base_mb + c.mem_burst_mb for c in classes])[usage.class_index][pod]
    _, known, has = _known_rows(usage, config.lag_steps)
    safe = np.where(has, known, 0)
    last_sm = np.where(has, usage.sm_peak[safe], 0.0)
    last_mem = np.where(has, usage.mem_peak_mb[safe], 0.0)
    if config.policy == "dynamic-predicted":
        last_sm = np.maximum(last_sm, _forecast(usage, usage.sm_peak, known, has, "sm", config.predictor))
        last_mem = np.maximum(last_mem, _forecast(usage, usage.mem_peak_mb, known, has, "memory", config.predictor))
    predicted_sm = np.where(has, last_sm, share * prior_sm)
    predicted_mem = np.where(has, last_mem, share * prior_mem)
    factor = 1.0 + config.headroom
    return (
        np.minimum(share * model.card_sm_count, predicted_sm * factor),
        np.minimum(share * model.card_memory_mb, predicted_mem * factor),
    )


@dataclass(frozen=True, slots=True)
class _Moved:
    """A shard the rebalance planner moved: from ``step`` on it sits on ``slot``."""

    pod: int
    step: int
    slot: int


@dataclass(frozen=True, slots=True)
class _Placement:
    """Where each pod's shards were placed on arrival, the moves since, and the occupancy."""

    cards: _Cards
    initial: list[tuple[int, ...]]
    moves: list[_Moved]
    rebalances: int  # plans made
    moved: int  # shards moved in all


def _rebalance_times(usage: PodUsage, every_s: float | None) -> list[float]:
    """The planner's schedule: every ``every_s`` from the first step boundary after the first arrival."""
    if every_s is None or not usage.pods:
        return []
    step = float(usage.step_s)
    first = (math.floor(min(p.start_s for p in usage.pods) / step) + 1) * step
    last = max(p.end_s for p in usage.pods)
    return [float(t) for t in np.arange(first, last, every_s, dtype=np.float64)]


def _pool_at(  # noqa: PLR0917 - a private helper whose one caller passes its loop's state in order
    usage: PodUsage, model: UsageModel, cards: _Cards, now_step: int, window_steps: int, demand: _Demand
) -> Pool:
    """The pool the planner is given: each busy card a node of one GPU (the replay has no node layout),
    each shard a workload whose demand is its largest reservation over the window before now, rounded
    up, in the planner's units; multi-GPU pods are pinned, as the service pins them.

    The service (billing/services/fleet/rebalance.py) gives the planner each pod's largest
    per-minute mean *use*; a shard moved on that figure lands where its reservations, which follow
    its per-second peaks, do not fit, and fair share then cuts them (docs/replay.md, the pool)."""
    nodes: list[PoolNode] = []
    workloads: list[PoolWorkload] = []
    sm_milli = SM_MILLI / float(model.card_sm_count)
    for slot in cards.busy_slots():
        name = f"card-{slot}"
        nodes.append(PoolNode(name=name, model="A100-80GB", gpus=1, gpu_memory_mb=int(model.card_memory_mb)))
        for pod in sorted(cards.members[slot]):
            first, offset = int(usage.first_step[pod]), int(usage.offset[pod])
            lo, hi = max(0, now_step - window_steps - first), min(int(usage.steps[pod]), now_step - first)
            rows = slice(offset + lo, offset + max(lo, hi))  # before its first step ends: its admission reservation
            if hi <= lo:
                rows = slice(offset, offset + 1)
            memory = float(demand.mem[rows].max(initial=0.0))
            sm = float(demand.sm[rows].max(initial=0.0))
            movable = usage.pods[pod].num_gpu == 1
            workloads.append(
                PoolWorkload(
                    key=f"{pod}@{slot}",
                    node=name,
                    gpus=(0,),
                    memory_mb=math.ceil(memory),
                    sm_milli=math.ceil(sm * sm_milli),
                    movable=movable,
                )
            )
    return Pool.build(nodes, workloads)


@dataclass(frozen=True, slots=True)
class _Demand:
    """Per row of the usage: what the planner reads as the shard's demand (its reservations)."""

    sm: FloatArray
    mem: FloatArray


def _load_reservations(usage: PodUsage, cards: _Cards, now: int, res_sm: FloatArray, res_mem: FloatArray) -> None:
    """Set each busy card's load to its shards' reservations at step ``now`` (a shard past its last step
    keeps its last one: it leaves within the step)."""
    pairs = [(slot, pod) for slot in cards.busy_slots() for pod in cards.members[slot]]
    slots, pods = np.array(pairs, dtype=np.int64).reshape(-1, 2).T
    local = np.clip(now - usage.first_step[pods], 0, usage.steps[pods] - 1)
    rows = usage.offset[pods] + local
    size = cards.load.shape[0]
    cards.load[:, 0] = np.bincount(slots, weights=res_sm[rows], minlength=size)
    cards.load[:, 1] = np.bincount(slots, weights=res_mem[rows], minlength=size)


def _place_dynamic(  # noqa: PLR0917 - the dynamic replays pass their arrays in order
    usage: PodUsage, model: UsageModel, res_sm: FloatArray, res_mem: FloatArray, config: ReplayConfig, demand: _Demand
) -> _Placement:
    """Online best fit on reserved SM among cards where the reservation fits; at the service's schedule,
    the rebalance planner's moves (``allocator.rebalance``, as the service runs it) are applied."""
    cards = _Cards()
    placement: list[tuple[int, ...]] = [() for _ in usage.pods]
    moves: list[_Moved] = []
    step = float(usage.step_s)
    cap_sm, cap_mem = float(model.card_sm_count), model.card_memory_mb
    events = [(t, 2, -1) for t in _rebalance_times(usage, config.rebalance_every_s)] + _events(usage)
    events.sort()  # at equal times: leave, arrive, rebalance
    if events:
        cards.last_time = events[0][0]
    window_steps = round(REBALANCE_WINDOW_S / step)
    rebalances = 0
    moved_to: dict[int, int] = {}  # a moved (single-GPU) pod's card now

    loaded_step: int | None = None  # the step ``cards.load`` holds the reservations of; None: stale

    for time, kind, pod in events:
        cards.advance(time)
        if kind == 2:
            if cards.busy < 2:  # nothing to empty a card onto
                continue
            now = round(time / step)
            plan = plan_rebalance(
                _pool_at(usage, model, cards, now, window_steps, demand),
                max_moves=config.rebalance_max_moves,
                price_per_gpu_hour=config.usd_per_gpu_hour,
            )
            rebalances += 1
            for move in plan.moves:
                moved, source = (int(part) for part in move.workload.split("@"))
                target = int(move.to_node.removeprefix("card-"))
                cards.remove(source, moved)
                cards.add(target, moved)
                moves.append(_Moved(pod=moved, step=now, slot=target))
                moved_to[moved] = target
            loaded_step = None
            continue
        if kind == 0:
            for slot in (moved_to[pod],) if pod in moved_to else placement[pod]:
                cards.remove(slot, pod)
            loaded_step = None
            continue
        now = math.floor(time / step)
        if loaded_step != now:
            _load_reservations(usage, cards, now, res_sm, res_mem)
            loaded_step = now
        first = int(usage.offset[pod])
        need = (float(res_sm[first]), float(res_mem[first]))
        chosen: list[int] = []
        for _ in range(usage.pods[pod].num_gpu):
            fits = cards.fitting((cap_sm, cap_mem), need, chosen)
            # Best fit: the most reserved SM among the cards it fits on, the lowest slot of equals.
            best = int(np.argmax(np.where(fits, cards.load[: fits.size, 0], -np.inf))) if fits.any() else None
            slot = cards.open_slot() if best is None else best
            cards.add(slot, pod, need)
            chosen.append(slot)
        placement[pod] = tuple(chosen)
    return _Placement(cards=cards, initial=placement, moves=moves, rebalances=rebalances, moved=len(moves))


@dataclass(frozen=True, slots=True)
class DynamicGrants:
    """A dynamic policy's grants, one entry per (GPU shard, step); see :func:`dynamic_grants`."""

    rows: IntArray  # row of the PodUsage (pod and step) each entry belongs to
    slots: IntArray  # card slot the shard sits on
    global_step: IntArray
    sm: FloatArray  # SMs granted for the step
    mem: FloatArray  # MB granted for the step
    overcommitted: npt.NDArray[np.bool_]  # memory known in use on the card exceeded it when granting
    invariants: Invariants


def _shard_rows(usage: PodUsage, placement: _Placement) -> tuple[IntArray, IntArray]:
    """Row of ``usage`` and card slot of every (shard, step), moves applied from their step on."""
    initial = placement.initial
    shard_pod = np.array([p for p, slots in enumerate(initial) for _ in slots], dtype=np.int64)
    shard_slot = np.array([s for slots in initial for s in slots], dtype=np.int64)
    lengths = usage.steps[shard_pod]
    starts = usage.offset[shard_pod]
    begins = np.cumsum(lengths) - lengths
    within = np.arange(int(lengths.sum()), dtype=np.int64) - np.repeat(begins, lengths)
    slots = np.repeat(shard_slot, lengths)
    if placement.moves:
        # Only single-GPU pods move: their one shard's entries are contiguous; later moves override.
        first_shard = np.searchsorted(shard_pod, np.arange(len(initial)))
        for move in placement.moves:
            local = max(0, move.step - int(usage.first_step[move.pod]))
            shard = int(first_shard[move.pod])
            if local < lengths[shard]:
                slots[begins[shard] + local : begins[shard] + lengths[shard]] = move.slot
    return np.repeat(starts, lengths) + within, slots


def _grant_dynamic(  # noqa: PLR0917 - a private helper whose one caller passes its loop's state in order
    usage: PodUsage,
    model: UsageModel,
    config: ReplayConfig,
    rows: IntArray,
    slots: IntArray,
    res_sm: FloatArray,
    res_mem: FloatArray,
) -> DynamicGrants:
    """Grant each card-step's reservations; where they exceed the card, share it (docs/design.md, Weighted fair sharing).

    Only what is known when the grant is decided is read: the reservations and the memory use
    of the latest known step (memory in use is not taken back).
    """
    cap_sm, cap_mem = float(model.card_sm_count), model.card_memory_mb
    row_pod = usage.pod_of_row()[rows]
    global_step = usage.first_step[row_pod] + (rows - usage.offset[row_pod])
    key = slots * (int(global_step.max(initial=0)) + 1) + global_step
    _, group = np.unique(key, return_inverse=True)
    group = group.reshape(-1)
    groups = int(group.max(initial=-1)) + 1
    _, known, has = _known_rows(usage, config.lag_steps)
    # Memory in use as last known; a shard with no known step yet counts its admission reservation.
    known_mem = np.where(has, usage.mem_peak_mb[np.where(has, known, 0)], res_mem)[rows]
    grant_sm = res_sm[rows].copy()
    grant_mem = res_mem[rows].copy()
    want_sm = np.bincount(group, weights=grant_sm, minlength=groups)
    want_mem = np.bincount(group, weights=grant_mem, minlength=groups)
    sm_contended = want_sm > cap_sm + _EPS
    mem_contended = want_mem > cap_mem + _EPS
    contended = np.flatnonzero(sm_contended | mem_contended)
    overcommitted = np.zeros(rows.shape[0], dtype=np.bool_)
    if contended.size:
        order = np.argsort(group, kind="stable")
        bounds = np.searchsorted(group[order], np.arange(groups + 1))
        for g in contended:
            members = order[bounds[g] : bounds[g + 1]]
            keys = [str(int(m)) for m in members]
            if sm_contended[g]:
                sm = fair_share(
                    capacity=cap_sm,
                    claims=[
                        Claim(key=k, weight=1.0, demand=float(grant_sm[m])) for k, m in zip(keys, members, strict=True)
                    ],
                )
                grant_sm[members] = [sm.grants[k] for k in keys]
            if not mem_contended[g]:
                continue
            in_use = np.minimum(known_mem[members], grant_mem[members])
            mem = fair_share(
                capacity=cap_mem,
                claims=[
                    Claim(key=k, weight=1.0, demand=float(grant_mem[m]), current_use=float(u), preemptible=False)
                    for k, m, u in zip(keys, members, in_use, strict=True)
                ],
            )
            if mem.overcommitted:
                # Memory known in use does not fit: grants are the card pro rata to it.
                overcommitted[members] = True
                grant_mem[members] = in_use * (cap_mem / float(in_use.sum()))
            else:
                grant_mem[members] = [mem.grants[k] for k in keys]
    sum_sm = np.bincount(group, weights=grant_sm, minlength=groups)
    sum_mem = np.bincount(group, weights=grant_mem, minlength=groups)
    invariants = Invariants(
        max_sm_granted_fraction=float(sum_sm.max(initial=0.0)) / cap_sm,
        max_memory_granted_fraction=float(sum_mem.max(initial=0.0)) / cap_mem,
        memory_overcommitted_card_steps=int(np.unique(group[overcommitted]).size),
        contended_card_steps=int(contended.size),
    )
    return DynamicGrants(
        rows=rows,
        slots=slots,
        global_step=global_step,
        sm=grant_sm,
        mem=grant_mem,
        overcommitted=overcommitted,
        invariants=invariants,
    )


def dynamic_grants(usage: PodUsage, model: UsageModel, config: ReplayConfig) -> tuple[DynamicGrants, int, float]:
    """Place and grant under a dynamic policy: (grants, peak busy cards, busy card-seconds)."""
    grants, placement = _dynamic(usage, model, config)
    return grants, placement.cards.peak, placement.cards.busy_seconds


def _dynamic(usage: PodUsage, model: UsageModel, config: ReplayConfig) -> tuple[DynamicGrants, _Placement]:
    if config.policy not in DYNAMIC_POLICIES:
        raise ValueError(f"dynamic_grants needs a dynamic policy, got {config.policy!r}")
    res_sm, res_mem = _reservations(usage, model, config)
    placement = _place_dynamic(usage, model, res_sm, res_mem, config, _Demand(sm=res_sm, mem=res_mem))
    rows, slots = _shard_rows(usage, placement)
    return _grant_dynamic(usage, model, config, rows, slots, res_sm, res_mem), placement


@dataclass(frozen=True, slots=True)
class StaticGrants:
    """A static policy's grant per pod shard (the same every step) and its placement units."""

    sm: FloatArray  # per pod
    mem: FloatArray  # per pod
    units: tuple[int, ...]  # per pod, of ``_UNITS`` per card
    profiles: Mapping[str, int]  # static-profile: shards per profile


def static_grants(usage: PodUsage, model: UsageModel, policy: Policy) -> StaticGrants:
    """Grants of ``static-whole``, ``static-request`` or ``static-profile``, decided at admission."""
    cap_sm, cap_mem = float(model.card_sm_count), model.card_memory_mb
    n = len(usage.pods)
    if policy == "static-whole":
        return StaticGrants(np.full(n, cap_sm), np.full(n, cap_mem), (_UNITS,) * n, {})
    if policy == "static-request":
        milli = [p.gpu_milli for p in usage.pods]
        share = np.asarray(milli, dtype=np.float64) / 1_000.0
        return StaticGrants(share * cap_sm, share * cap_mem, tuple(7 * m for m in milli), {})
    if policy != "static-profile":
        raise ValueError(f"static_grants needs a static policy, got {policy!r}")
    chosen = [select_profile(p.share, cap_mem) for p in usage.pods]
    counts: dict[str, int] = {}
    for c, p in zip(chosen, usage.pods, strict=True):
        counts[c.name] = counts.get(c.name, 0) + p.num_gpu
    return StaticGrants(
        np.array([c.sm_fraction * cap_sm for c in chosen], dtype=np.float64),
        np.array([c.memory_mb for c in chosen], dtype=np.float64),
        tuple(c.slices * (_UNITS // SLICES_PER_CARD) for c in chosen),
        {p.name: counts[p.name] for p in MIG_PROFILES if p.name in counts},
    )


def _misses(  # noqa: PLR0917 - a private helper whose one caller passes its loop's state in order
    usage: PodUsage, model: UsageModel, signals: BurstSignals, rows: IntArray, sm: FloatArray, mem: FloatArray
) -> tuple[FloatArray, FloatArray, FloatArray, FloatArray]:
    """Per entry: seconds above the SM grant and the memory grant, and the amounts short."""
    sm_s, sm_amount = np.zeros(rows.shape[0]), np.zeros(rows.shape[0])
    mem_s, mem_amount = np.zeros(rows.shape[0]), np.zeros(rows.shape[0])
    short = np.flatnonzero(usage.sm_peak[rows] > sm + _EPS)
    sm_s[short], sm_amount[short] = shortfall(usage, model, signals, rows[short], resource="sm", grant=sm[short])
    short = np.flatnonzero(usage.mem_peak_mb[rows] > mem + _EPS)
    mem_s[short], mem_amount[short] = shortfall(usage, model, signals, rows[short], resource="memory", grant=mem[short])
    return sm_s, mem_s, sm_amount, mem_amount


def replay(
    usage: PodUsage,
    model: UsageModel,
    signals: BurstSignals,
    config: ReplayConfig,
) -> ReplayResult:
    """Replay ``usage`` under ``config.policy``; deterministic for equal inputs."""
    if usage.step_s != model.step_s or signals.step_s != model.step_s:
        raise ValueError("usage, signals and model must share one step length")
    num_gpu = np.array([p.num_gpu for p in usage.pods], dtype=np.int64)
    profiles: Mapping[str, int] = {}
    invariants: Invariants | None = None

    if config.policy == "agent-default":
        return _replay_agent(usage, model, signals, config)
    plans = moved = 0
    if config.policy in DYNAMIC_POLICIES:
        grants, placement = _dynamic(usage, model, config)
        gpus_peak, busy = placement.cards.peak, placement.cards.busy_seconds
        plans, moved = placement.rebalances, placement.moved
        rows, grant_sm, grant_mem = grants.rows, grants.sm, grants.mem
        invariants = grants.invariants
        weight = np.ones(rows.shape[0])  # one entry per shard
    else:
        fixed = static_grants(usage, model, config.policy)
        profiles = fixed.profiles
        cards, _ = _place_static(usage, fixed.units)
        gpus_peak, busy = cards.peak, cards.busy_seconds
        rows = np.arange(usage.rows, dtype=np.int64)
        pod = usage.pod_of_row()
        grant_sm, grant_mem = fixed.sm[pod], fixed.mem[pod]
        weight = num_gpu[pod].astype(np.float64)  # every shard of a pod uses and holds the same
    seconds = usage.seconds[rows]
    served_sm = float(np.sum(np.minimum(usage.sm_mean[rows], grant_sm) * seconds * weight))
    used_mem = float(np.sum(usage.mem_mean_mb[rows] * seconds * weight))
    granted_mem = float(np.sum(grant_mem * seconds * weight))
    over_sm, over_mem, short_sm, short_mem = _misses(usage, model, signals, rows, grant_sm, grant_mem)
    missed = float(np.sum(np.minimum(over_sm + over_mem, seconds) * weight))

    return _result(
        usage,
        model,
        config,
        _Totals(gpus_peak=gpus_peak, busy=busy, served_sm=served_sm, used_mem=used_mem, granted_mem=granted_mem,
                missed=missed, missed_sm=float(np.sum(over_sm * weight)), missed_mem=float(np.sum(over_mem * weight)),
                short_sm=float(np.sum(short_sm * weight)), short_mem=float(np.sum(short_mem * weight)),
                rebalance_plans=plans, shards_moved=moved),
        profiles=profiles,
        invariants=invariants,
    )


@dataclass(frozen=True, slots=True)
class _Totals:
    """A replay's sums, before they become figures."""

    gpus_peak: int
    busy: float  # busy card-seconds
    served_sm: float
    used_mem: float
    granted_mem: float
    missed: float
    missed_sm: float
    missed_mem: float
    short_sm: float
    short_mem: float
    rebalance_plans: int = 0
    shards_moved: int = 0


def _replay_agent(usage: PodUsage, model: UsageModel, signals: BurstSignals, config: ReplayConfig) -> ReplayResult:
    """agent-default: the policy object over per-second use (``_agent``), placed and fair-shared by its reservations.

    Placement reads the reservation in force at each step's first second; a card-step whose
    shards' largest reservations exceed the card is fair-shared on them, and those shards'
    seconds are counted again against the reservations cut to their share.
    """
    agent = agent_rows(usage, model, signals, margin=config.margin, target=config.miss_target)
    demand = _Demand(sm=agent.peak[:, 1], mem=agent.peak[:, 0])
    placement = _place_dynamic(usage, model, agent.first[:, 1], agent.first[:, 0], config, demand)
    rows, slots = _shard_rows(usage, placement)
    cards = placement.cards
    grants = _grant_dynamic(usage, model, config, rows, slots, agent.peak[:, 1], agent.peak[:, 0])
    missed, short = agent.missed[rows], agent.short[rows]
    served, reserved = agent.served_sm[rows], agent.reserved_mem[rows]
    cut = np.flatnonzero((grants.sm < agent.peak[rows, 1] - _EPS) | (grants.mem < agent.peak[rows, 0] - _EPS))
    if cut.size:
        grant = np.stack([grants.mem[cut], grants.sm[cut]], axis=1)
        missed[cut], short[cut], served[cut], reserved[cut] = capped_outcomes(
            usage, model, signals, agent, rows[cut], grant, window_blocks=config.margin.window_blocks
        )
    scale = usage.seconds[rows] / float(usage.step_s)  # the burst window is the step; the pod held part of it
    return _result(
        usage,
        model,
        config,
        _Totals(
            gpus_peak=cards.peak,
            busy=cards.busy_seconds,
            served_sm=float(np.sum(served * scale)),
            used_mem=float(np.sum(usage.mem_mean_mb[rows] * usage.seconds[rows])),
            granted_mem=float(np.sum(reserved * scale)),
            missed=float(np.sum(missed[:, 2] * scale)),
            missed_sm=float(np.sum(missed[:, 1] * scale)),
            missed_mem=float(np.sum(missed[:, 0] * scale)),
            short_sm=float(np.sum(short[:, 1] * scale)),
            short_mem=float(np.sum(short[:, 0] * scale)),
            rebalance_plans=placement.rebalances,
            shards_moved=placement.moved,
        ),
        profiles={},
        invariants=grants.invariants,
    )


def _result(
    usage: PodUsage,
    model: UsageModel,
    config: ReplayConfig,
    totals: _Totals,
    *,
    profiles: Mapping[str, int],
    invariants: Invariants | None,
) -> ReplayResult:
    n = len(usage.pods)
    cap_sm = float(model.card_sm_count)
    busy, gpus_peak = totals.busy, totals.gpus_peak
    served_sm, used_mem, granted_mem, missed = totals.served_sm, totals.used_mem, totals.granted_mem, totals.missed
    span = (max(p.end_s for p in usage.pods) - min(p.start_s for p in usage.pods)) if n else 0.0
    workload = float(sum(p.num_gpu * p.duration_s for p in usage.pods))
    gpu_hours = busy / 3_600.0
    card_mb_s = busy * model.card_memory_mb
    memory_util = used_mem / card_mb_s if busy else 0.0
    return ReplayResult(
        policy=config.policy,
        step_s=model.step_s,
        pods=n,
        gpu_shards=sum(p.num_gpu for p in usage.pods),
        span_s=span,
        workload_seconds=workload,
        gpus_peak=gpus_peak,
        gpus_time_avg=busy / span if span else 0.0,
        gpu_hours=gpu_hours,
        usd_per_gpu_hour=config.usd_per_gpu_hour,
        cost_usd=(Decimal(repr(gpu_hours)) * config.usd_per_gpu_hour).quantize(_CENT, rounding=ROUND_HALF_EVEN),
        sm_utilisation=served_sm / (busy * cap_sm) if busy else 0.0,
        memory_utilisation=memory_util,
        idle_memory_share=1.0 - memory_util if busy else 0.0,
        memory_granted_share=granted_mem / card_mb_s if busy else 0.0,
        containers_per_card=workload / busy if busy else 0.0,
        slo_miss_workload_s=missed,
        slo_miss_sm_workload_s=totals.missed_sm,
        slo_miss_memory_workload_s=totals.missed_mem,
        slo_miss_share=missed / workload if workload else 0.0,
        sm_short_sm_s=totals.short_sm,
        memory_short_mb_s=totals.short_mem,
        profiles=profiles,
        invariants=invariants,
        rebalance_plans=totals.rebalance_plans,
        shards_moved=totals.shards_moved,
    )
