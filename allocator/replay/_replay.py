"""Replaying GPU pods under a static or a dynamic allocation policy (docs/replay.md).

Time is continuous for occupancy (a card is busy from the moment its first pod is
placed until its last pod leaves, to the second) and stepped for use (``step_s``
steps with mean and peak use per step, from :mod:`allocator.replay._usage`).

Policies, per GPU shard of a pod (a pod asking for ``num_gpu`` GPUs has that many
shards, on distinct cards):

- ``static-whole``: each shard holds a whole card, whatever its share (the study's
  baseline: ``nvidia.com/gpu: 1``).
- ``static-profile``: each shard holds the smallest MIG-like profile whose memory fits
  the shard's peak memory over its life; profiles are 1, 2, 3, 4 or 7 of a card's 7
  slices, with that fraction of its SMs; placed first-fit by slices as pods arrive.
- ``dynamic``: each step a shard reserves its predicted peak × (1 + headroom) (the
  predictor is the peak of the last ``predictor_window_steps`` steps; the class's
  profile peak before any history), clamped to its request. An arriving shard goes to
  the busy card with the most reserved SM where its reservation fits in SM and memory,
  else to a new card. Pods never move. On each card and step, grants follow DESIGN §5
  through :func:`allocator.fairshare.fair_share`: SM is water-filled with each shard's
  peak use served first, memory is never granted below use.

An SLO violation is a second in which a shard's use exceeds its grant; violated
workload-seconds add SM and memory seconds, capped at the length of the step.
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
from allocator.replay._usage import BurstSignals, PodUsage, UsageModel, seconds_above

__all__ = [
    "MIG_PROFILES",
    "POLICIES",
    "SLICES_PER_CARD",
    "DynamicGrants",
    "Invariants",
    "MigProfile",
    "Policy",
    "ReplayConfig",
    "ReplayResult",
    "dynamic_grants",
    "replay",
    "select_profile",
]

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]
Policy = Literal["static-whole", "static-profile", "dynamic"]
POLICIES: tuple[Policy, ...] = get_args(Policy)

SLICES_PER_CARD = 7
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


def select_profile(peak_memory_mb: float) -> MigProfile:
    """The smallest profile (fewest slices) whose memory holds ``peak_memory_mb``."""
    if not (math.isfinite(peak_memory_mb) and peak_memory_mb >= 0):
        raise ValueError(f"peak_memory_mb must be finite and >= 0, got {peak_memory_mb!r}")
    for profile in MIG_PROFILES:
        if peak_memory_mb <= profile.memory_mb:
            return profile
    raise ValueError(f"peak memory {peak_memory_mb:.0f} MB does not fit any profile (largest 81920 MB)")


@dataclass(frozen=True, slots=True)
class ReplayConfig:
    """Which policy to replay, and its knobs."""

    policy: Policy
    headroom: float = 0.2  # dynamic: reservation = predicted peak × (1 + headroom)
    predictor_window_steps: int = 5  # dynamic: recent-peak predictor looks this many steps back
    usd_per_gpu_hour: Decimal = Decimal("5.12")  # the project's demo A100-80GB rate card

    def __post_init__(self) -> None:
        if self.policy not in POLICIES:
            raise ValueError(f"policy must be one of {', '.join(POLICIES)}, got {self.policy!r}")
        if not (math.isfinite(self.headroom) and 0 <= self.headroom <= 10):
            raise ValueError(f"headroom must be in [0, 10], got {self.headroom!r}")
        if not 1 <= self.predictor_window_steps <= 10_000:
            raise ValueError(f"predictor_window_steps must be in 1..10000, got {self.predictor_window_steps!r}")
        if not (self.usd_per_gpu_hour.is_finite() and self.usd_per_gpu_hour >= 0):
            raise ValueError(f"usd_per_gpu_hour must be finite and >= 0, got {self.usd_per_gpu_hour!r}")


@dataclass(frozen=True, slots=True)
class Invariants:
    """Checks the dynamic policy must pass on every card and step (trivial for static ones)."""

    max_sm_granted_fraction: float  # Σ SM grants / SMs, worst card-step; <= 1
    max_memory_granted_fraction: float  # Σ memory grants / card memory, worst card-step; <= 1
    min_memory_grant_minus_use_mb: float  # worst shard-step where the card is not overcommitted; >= 0
    memory_overcommitted_card_steps: int  # Σ peak memory use above the card: counted as violations
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
    containers_per_card: float  # workload_seconds / busy card-seconds
    slo_violation_workload_s: float
    slo_violation_sm_workload_s: float
    slo_violation_memory_workload_s: float
    slo_violation_share: float  # slo_violation_workload_s / workload_seconds
    profiles: Mapping[str, int] = field(default_factory=dict)  # static-profile: shards per profile
    invariants: Invariants | None = None  # dynamic only

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
            "containers_per_card": self.containers_per_card,
            "slo_violation_workload_s": self.slo_violation_workload_s,
            "slo_violation_sm_workload_s": self.slo_violation_sm_workload_s,
            "slo_violation_memory_workload_s": self.slo_violation_memory_workload_s,
            "slo_violation_share": self.slo_violation_share,
            "profiles": dict(self.profiles),
        }
        if self.invariants is not None:
            inv = self.invariants
            result["invariants"] = {
                "max_sm_granted_fraction": inv.max_sm_granted_fraction,
                "max_memory_granted_fraction": inv.max_memory_granted_fraction,
                "min_memory_grant_minus_use_mb": (
                    inv.min_memory_grant_minus_use_mb if math.isfinite(inv.min_memory_grant_minus_use_mb) else None
                ),
                "memory_overcommitted_card_steps": inv.memory_overcommitted_card_steps,
                "contended_card_steps": inv.contended_card_steps,
            }
        return result


@dataclass(slots=True)
class _Cards:
    """Occupancy of card slots over time; slots are reused lowest-first once empty."""

    members: list[set[int]] = field(default_factory=list)
    free_slices: list[int] = field(default_factory=list)
    empty_slots: list[int] = field(default_factory=list)  # heap
    busy: int = 0
    peak: int = 0
    busy_seconds: float = 0.0
    last_time: float = 0.0

    def advance(self, time: float) -> None:
        self.busy_seconds += self.busy * (time - self.last_time)
        self.last_time = time

    def busy_slots(self) -> list[int]:
        return [slot for slot, held in enumerate(self.members) if held]

    def open_slot(self) -> int:
        if self.empty_slots:
            return heapq.heappop(self.empty_slots)
        self.members.append(set())
        self.free_slices.append(SLICES_PER_CARD)
        return len(self.members) - 1

    def add(self, slot: int, pod: int, slices: int) -> None:
        if not self.members[slot]:
            self.busy += 1
            self.peak = max(self.peak, self.busy)
        self.members[slot].add(pod)
        self.free_slices[slot] -= slices

    def remove(self, slot: int, pod: int, slices: int) -> None:
        self.members[slot].discard(pod)
        self.free_slices[slot] += slices
        if not self.members[slot]:
            self.busy -= 1
            heapq.heappush(self.empty_slots, slot)


def _events(usage: PodUsage) -> list[tuple[float, int, int]]:
    """(time, 0 = leave / 1 = arrive, pod): at equal times pods leave before others arrive."""
    events = [(p.start_s, 1, i) for i, p in enumerate(usage.pods)]
    events += [(p.end_s, 0, i) for i, p in enumerate(usage.pods)]
    events.sort()
    return events


def _place_static(usage: PodUsage, slices: Sequence[int]) -> tuple[_Cards, list[tuple[int, ...]]]:
    """First-fit by slices; a pod's shards on distinct cards."""
    cards = _Cards()
    placement: list[tuple[int, ...]] = [() for _ in usage.pods]
    events = _events(usage)
    if events:
        cards.last_time = events[0][0]
    for time, kind, pod in events:
        cards.advance(time)
        need = slices[pod]
        if kind == 0:
            for slot in placement[pod]:
                cards.remove(slot, pod, need)
            continue
        chosen: list[int] = []
        for _ in range(usage.pods[pod].num_gpu):
            fitting = next(
                (
                    s
                    for s, held in enumerate(cards.members)
                    if held and s not in chosen and cards.free_slices[s] >= need
                ),
                None,
            )
            slot = cards.open_slot() if fitting is None else fitting
            cards.add(slot, pod, need)
            chosen.append(slot)
        placement[pod] = tuple(chosen)
    return cards, placement


def _reservations(usage: PodUsage, model: UsageModel, config: ReplayConfig) -> tuple[FloatArray, FloatArray]:
    """Per row: SM and memory reserved for the step (recent-peak predictor × (1 + headroom))."""
    rows = usage.rows
    pod = usage.pod_of_row()
    local = np.arange(rows, dtype=np.int64) - np.repeat(usage.offset, usage.steps)
    share = usage.share[pod]
    classes = model.classes
    prior_sm = np.array([c.sm_base + c.sm_burst for c in classes])[usage.class_index][pod] * model.card_sm_count
    prior_mem = np.array([c.mem_base_mb + c.mem_burst_mb for c in classes])[usage.class_index][pod]
    seen_sm = np.full(rows, -np.inf)
    seen_mem = np.full(rows, -np.inf)
    index = np.arange(rows, dtype=np.int64)
    for back in range(1, min(config.predictor_window_steps, int(usage.steps.max(initial=0))) + 1):
        has = local >= back
        seen_sm[has] = np.maximum(seen_sm[has], usage.sm_peak[index[has] - back])
        seen_mem[has] = np.maximum(seen_mem[has], usage.mem_peak_mb[index[has] - back])
    predicted_sm = np.where(local == 0, share * prior_sm, seen_sm)
    predicted_mem = np.where(local == 0, share * prior_mem, seen_mem)
    factor = 1.0 + config.headroom
    return (
        np.minimum(share * model.card_sm_count, predicted_sm * factor),
        np.minimum(share * model.card_memory_mb, predicted_mem * factor),
    )


def _place_dynamic(
    usage: PodUsage, model: UsageModel, res_sm: FloatArray, res_mem: FloatArray
) -> tuple[_Cards, list[tuple[int, ...]]]:
    """Online best fit on reserved SM among cards where the reservation fits."""
    cards = _Cards()
    placement: list[tuple[int, ...]] = [() for _ in usage.pods]
    step = float(usage.step_s)
    cap_sm, cap_mem = float(model.card_sm_count), model.card_memory_mb
    events = _events(usage)
    if events:
        cards.last_time = events[0][0]

    def row_at(pod: int, global_step: int) -> int:
        local = min(max(global_step - int(usage.first_step[pod]), 0), int(usage.steps[pod]) - 1)
        return int(usage.offset[pod]) + local

    for time, kind, pod in events:
        cards.advance(time)
        if kind == 0:
            for slot in placement[pod]:
                cards.remove(slot, pod, 0)
            continue
        now = int(math.floor(time / step))
        sums: dict[int, tuple[float, float]] = {}
        for slot in cards.busy_slots():
            rows = [row_at(m, now) for m in cards.members[slot]]
            sums[slot] = (float(res_sm[rows].sum()), float(res_mem[rows].sum()))
        first = int(usage.offset[pod])
        need_sm, need_mem = float(res_sm[first]), float(res_mem[first])
        chosen: list[int] = []
        for _ in range(usage.pods[pod].num_gpu):
            best: int | None = None
            for slot, (sm, mem) in sums.items():
                if slot in chosen or sm + need_sm > cap_sm + _EPS or mem + need_mem > cap_mem + _EPS:
                    continue
                if best is None or sm > sums[best][0]:
                    best = slot
            slot = cards.open_slot() if best is None else best
            cards.add(slot, pod, 0)
            chosen.append(slot)
            sm, mem = sums.get(slot, (0.0, 0.0))
            sums[slot] = (sm + need_sm, mem + need_mem)
        placement[pod] = tuple(chosen)
    return cards, placement


@dataclass(frozen=True, slots=True)
class DynamicGrants:
    """The dynamic policy's grants, one entry per (GPU shard, step); see :func:`dynamic_grants`."""

    rows: IntArray  # row of the PodUsage (pod and step) each entry belongs to
    slots: IntArray  # card slot the shard sits on
    global_step: IntArray
    sm: FloatArray  # SMs granted for the step
    mem: FloatArray  # MB granted for the step
    overcommitted: npt.NDArray[np.bool_]  # the card's peak memory use exceeds the card in this step
    invariants: Invariants


def _shard_rows(usage: PodUsage, placement: Sequence[tuple[int, ...]]) -> tuple[IntArray, IntArray]:
    """Row of ``usage`` and card slot of every (shard, step)."""
    shard_pod = np.array([p for p, slots in enumerate(placement) for _ in slots], dtype=np.int64)
    shard_slot = np.array([s for slots in placement for s in slots], dtype=np.int64)
    lengths = usage.steps[shard_pod]
    starts = usage.offset[shard_pod]
    within = np.arange(int(lengths.sum()), dtype=np.int64) - np.repeat(np.cumsum(lengths) - lengths, lengths)
    return np.repeat(starts, lengths) + within, np.repeat(shard_slot, lengths)


def _grant_dynamic(
    usage: PodUsage,
    model: UsageModel,
    rows: IntArray,
    slots: IntArray,
    res_sm: FloatArray,
    res_mem: FloatArray,
) -> DynamicGrants:
    cap_sm, cap_mem = float(model.card_sm_count), model.card_memory_mb
    row_pod = usage.pod_of_row()[rows]
    global_step = usage.first_step[row_pod] + (rows - usage.offset[row_pod])
    key = slots * (int(global_step.max(initial=0)) + 1) + global_step
    _, group = np.unique(key, return_inverse=True)
    groups = int(group.max(initial=-1)) + 1
    peak_sm, peak_mem = usage.sm_peak[rows], usage.mem_peak_mb[rows]
    grant_sm = np.maximum(res_sm[rows], peak_sm)
    grant_mem = np.maximum(res_mem[rows], peak_mem)
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
                # Peak use is served first (guarantee); reservations above it share the rest.
                sm = fair_share(
                    capacity=cap_sm,
                    claims=[
                        Claim(key=k, weight=1.0, demand=float(grant_sm[m]), guarantee=float(peak_sm[m]))
                        for k, m in zip(keys, members, strict=True)
                    ],
                )
                grant_sm[members] = [sm.grants[k] for k in keys]
            if not mem_contended[g]:
                continue
            mem = fair_share(
                capacity=cap_mem,
                claims=[
                    Claim(
                        key=k,
                        weight=1.0,
                        demand=float(grant_mem[m]),
                        current_use=float(peak_mem[m]),
                        preemptible=False,
                    )
                    for k, m in zip(keys, members, strict=True)
                ],
            )
            if mem.overcommitted:
                # Memory in use cannot be taken back and does not fit: the card runs out
                # (an OOM in practice). Grants are the card pro rata to use; every second
                # above them is a violation.
                overcommitted[members] = True
                grant_mem[members] = peak_mem[members] * (cap_mem / float(peak_mem[members].sum()))
            else:
                grant_mem[members] = [mem.grants[k] for k in keys]
    sum_sm = np.bincount(group, weights=grant_sm, minlength=groups)
    sum_mem = np.bincount(group, weights=grant_mem, minlength=groups)
    safe = ~overcommitted
    invariants = Invariants(
        max_sm_granted_fraction=float(sum_sm.max(initial=0.0)) / cap_sm,
        max_memory_granted_fraction=float(sum_mem.max(initial=0.0)) / cap_mem,
        min_memory_grant_minus_use_mb=float((grant_mem[safe] - peak_mem[safe]).min(initial=math.inf)),
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
    """Place and grant under the dynamic policy: (grants, peak busy cards, busy card-seconds)."""
    if config.policy != "dynamic":
        raise ValueError(f"dynamic_grants needs policy 'dynamic', got {config.policy!r}")
    res_sm, res_mem = _reservations(usage, model, config)
    cards, placement = _place_dynamic(usage, model, res_sm, res_mem)
    rows, slots = _shard_rows(usage, placement)
    return _grant_dynamic(usage, model, rows, slots, res_sm, res_mem), cards.peak, cards.busy_seconds


def replay(
    usage: PodUsage,
    model: UsageModel,
    signals: BurstSignals,
    config: ReplayConfig,
) -> ReplayResult:
    """Replay ``usage`` under ``config.policy``; deterministic for equal inputs."""
    if usage.step_s != model.step_s or signals.step_s != model.step_s:
        raise ValueError("usage, signals and model must share one step length")
    n = len(usage.pods)
    num_gpu = np.array([p.num_gpu for p in usage.pods], dtype=np.int64)
    pod = usage.pod_of_row()
    profiles: dict[str, int] = {}
    invariants: Invariants | None = None
    cap_sm = float(model.card_sm_count)

    if config.policy == "dynamic":
        grants, gpus_peak, busy = dynamic_grants(usage, model, config)
        rows = grants.rows
        invariants = grants.invariants
        seconds = usage.seconds[rows]
        served_sm = float(np.sum(np.minimum(usage.sm_mean[rows], grants.sm) * seconds))
        used_mem = float(np.sum(usage.mem_mean_mb[rows] * seconds))
        short_sm = np.flatnonzero(usage.sm_peak[rows] > grants.sm + _EPS)
        short_mem = np.flatnonzero(usage.mem_peak_mb[rows] > grants.mem + _EPS)
        over_sm = np.zeros(rows.shape[0])
        over_mem = np.zeros(rows.shape[0])
        over_sm[short_sm] = seconds_above(
            usage, model, signals, rows[short_sm], resource="sm", grant=grants.sm[short_sm]
        )
        over_mem[short_mem] = seconds_above(
            usage, model, signals, rows[short_mem], resource="memory", grant=grants.mem[short_mem]
        )
        violated = float(np.minimum(over_sm + over_mem, seconds).sum())
        violated_sm, violated_mem = float(over_sm.sum()), float(over_mem.sum())
    else:
        if config.policy == "static-whole":
            pod_slices = [SLICES_PER_CARD] * n
            grant_sm = np.full(n, cap_sm)
        else:
            peak_mem = np.maximum.reduceat(usage.mem_peak_mb, usage.offset) if n else np.zeros(0)
            chosen = [select_profile(float(m)) for m in peak_mem]
            pod_slices = [c.slices for c in chosen]
            grant_sm = np.array([c.sm_fraction * cap_sm for c in chosen], dtype=np.float64)
            for c, g in zip(chosen, num_gpu, strict=True):
                profiles[c.name] = profiles.get(c.name, 0) + int(g)
            profiles = {p.name: profiles[p.name] for p in MIG_PROFILES if p.name in profiles}
        cards, _ = _place_static(usage, pod_slices)
        gpus_peak, busy = cards.peak, cards.busy_seconds
        shards = num_gpu[pod].astype(np.float64)
        seconds = usage.seconds
        row_grant = grant_sm[pod]
        served_sm = float(np.sum(np.minimum(usage.sm_mean, row_grant) * seconds * shards))
        used_mem = float(np.sum(usage.mem_mean_mb * seconds * shards))
        short = np.flatnonzero(usage.sm_peak > row_grant + _EPS)
        over = seconds_above(usage, model, signals, short, resource="sm", grant=row_grant[short])
        violated_sm = float(np.sum(over * shards[short]))
        violated_mem = 0.0  # a profile holds the shard's lifetime peak memory by construction
        violated = violated_sm

    span = (max(p.end_s for p in usage.pods) - min(p.start_s for p in usage.pods)) if n else 0.0
    workload = float(sum(p.num_gpu * p.duration_s for p in usage.pods))
    gpu_hours = busy / 3_600.0
    memory_util = used_mem / (busy * model.card_memory_mb) if busy else 0.0
    return ReplayResult(
        policy=config.policy,
        step_s=model.step_s,
        pods=n,
        gpu_shards=int(num_gpu.sum()),
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
        containers_per_card=workload / busy if busy else 0.0,
        slo_violation_workload_s=violated,
        slo_violation_sm_workload_s=violated_sm,
        slo_violation_memory_workload_s=violated_mem,
        slo_violation_share=violated / workload if workload else 0.0,
        profiles=profiles,
        invariants=invariants,
    )
