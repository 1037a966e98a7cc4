"""Static alternatives to dynamic allocation, placed on the fleet the ledger saw (docs/billing.md,
"Static alternatives on the actual fleet"). Pure: no Django, no database, no clock; the ledger
reads and the pricing of the card time placed here are billing.ledger.minutes'.

Each static allocation gives every workload (one container on one GPU) a fixed slice of a card
for as long as it runs:

- ``whole_card``: the whole card;
- ``request_fraction``: its need in memory and in SMs, on a card shared by time-slicing with
  HAMi-style limits (a card holds slices while their memory and their SMs each fit);
- ``fixed_profile``: the smallest MIG profile of the card's model that holds its need, at a
  position the model's MIG placement rules allow (a model without MIG: the whole card).

A workload's need, per resource, is the larger of what it asked for (its request) and the most it
used in any one minute: a static slice is not lent back and forth, so to run the same work it must
hold the workload's busiest minute (less memory would have killed it, fewer SMs slowed it).

Slices are placed on the fleet's own cards of the model the workload ran on, first-fit in the
fleet's order (node name, GPU UUID), largest slice first among workloads that start in the same
minute; a slice stays on its card until the workload's run of minutes ends (or the card leaves
the fleet, when it is placed again): a workload the ledger has no minute of for a while is one
slice per run, all of one size. A slice that fits on none of the fleet's cards goes on a card the fleet does
not have: the alternative is then not feasible, and what it lacked is reported, never priced.
"""

from __future__ import annotations

import math
import re
from bisect import insort
from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from decimal import Decimal
from functools import lru_cache

__all__ = [
    "ALPHA",
    "ALTERNATIVES",
    "Assignment",
    "FleetCard",
    "MigGeometry",
    "MigProfile",
    "Placement",
    "Shortfall",
    "WorkloadSlice",
    "choose_baseline",
    "choose_profile",
    "mig_geometry",
    "place",
    "profile_name",
    "slice_share",
]

# The ledger's weight of memory against compute in a card's price (docs/billing.md, What is billed).
ALPHA = Decimal("0.5")
ALTERNATIVES = ("whole_card", "request_fraction", "fixed_profile")


@dataclass(frozen=True, slots=True)
class MigProfile:
    """One MIG GPU-instance profile: its compute slices and memory slices of the card, and the
    memory slices an instance of it may start at (NVIDIA's placements, `nvidia-smi mig -lgipp`)."""

    compute: int
    memory: int
    starts: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class MigGeometry:
    """A card model's MIG layout: its compute slices, memory slices and profiles."""

    compute: int
    memory: int
    profiles: tuple[MigProfile, ...]

    @property
    def partitions(self) -> bool:
        return len(self.profiles) > 1


# A100, H100, H200, H20 and B200: 7 compute slices over 8 memory slices; profiles 1g.(1/8),
# 1g.(2/8), 2g.(2/8), 3g.(4/8), 4g.(4/8), 7g.(8/8) of the card (on an A100 80GB: 1g.10gb,
# 1g.20gb, 2g.20gb, 3g.40gb, 4g.40gb, 7g.80gb).
_SEVEN_SLICES = MigGeometry(7, 8, (
    MigProfile(1, 1, (0, 1, 2, 3, 4, 5, 6)),
    MigProfile(1, 2, (0, 2, 4, 6)),
    MigProfile(2, 2, (0, 2, 4)),
    MigProfile(3, 4, (0, 4)),
    MigProfile(4, 4, (0,)),
    MigProfile(7, 8, (0,)),
))
# A30: 4 compute slices over 4 memory slices; 1g.6gb, 2g.12gb, 4g.24gb.
_FOUR_SLICES = MigGeometry(4, 4, (
    MigProfile(1, 1, (0, 1, 2, 3)),
    MigProfile(2, 2, (0, 2)),
    MigProfile(4, 4, (0,)),
))
# Any other model has no MIG: its one "profile" is the whole card.
WHOLE_CARD_ONLY = MigGeometry(1, 1, (MigProfile(1, 1, (0,)),))
_MODELS = ((re.compile(r"\b(A100|H100|H200|H20|GH200|B200|GB200)\b", re.IGNORECASE), _SEVEN_SLICES),
           (re.compile(r"\bA30\b", re.IGNORECASE), _FOUR_SLICES))
_CARD_GB = re.compile(r"(\d+)\s*GB", re.IGNORECASE)


def mig_geometry(model: str) -> MigGeometry:
    """The MIG layout of a GPU model by its name (WHOLE_CARD_ONLY for a model without MIG)."""
    for pattern, geometry in _MODELS:
        if pattern.search(model):
            return geometry
    return WHOLE_CARD_ONLY


def profile_name(geometry: MigGeometry, profile: MigProfile, *, model: str, memory_mb: int) -> str:
    """NVIDIA's name of a profile on this model ("3g.40gb" on an A100 80GB); "" without MIG."""
    if not geometry.partitions:
        return ""
    named = _CARD_GB.search(model)
    card_gb = int(named.group(1)) if named else round(memory_mb / 1024)
    return f"{profile.compute}g.{math.floor(card_gb * profile.memory / geometry.memory + 0.5)}gb"


def _share(memory: Decimal, compute: Decimal) -> Decimal:
    """A slice's share of the card, priced as the ledger prices use: α × its share of the memory +
    (1 − α) × its share of the compute. Slices that fit on one card never share more than 1."""
    return ALPHA * memory + (1 - ALPHA) * compute


@lru_cache(maxsize=4096)
def choose_profile(geometry: MigGeometry, *, mem_mb: Decimal, sm: Decimal, memory_mb: int,
                   sm_count: int) -> MigProfile:
    """The smallest profile (by share of the card) whose memory and compute slices hold the need;
    the largest profile when none does (a need is at most the card)."""
    memory_slices = max(1, math.ceil(mem_mb * geometry.memory / memory_mb))
    compute_slices = max(1, math.ceil(sm * geometry.compute / sm_count))
    holding = [p for p in geometry.profiles if p.memory >= memory_slices and p.compute >= compute_slices]
    if not holding:
        return geometry.profiles[-1]
    return min(holding, key=lambda p: (_profile_share(geometry, p), p.compute, p.memory))


def _profile_share(geometry: MigGeometry, profile: MigProfile) -> Decimal:
    return _share(Decimal(profile.memory) / geometry.memory, Decimal(profile.compute) / geometry.compute)


def choose_baseline(costs: dict[str, Decimal | None]) -> str | None:
    """The headline's baseline: the cheapest feasible alternative (a None cost: not feasible), equal
    costs to the first in ALTERNATIVES' order; None when none is feasible."""
    feasible = {a: c for a, c in costs.items() if c is not None}
    return min(feasible, key=lambda a: (feasible[a], ALTERNATIVES.index(a))) if feasible else None


@dataclass(frozen=True, slots=True)
class FleetCard:
    """One card of the fleet over one unbroken run of minutes it metered: from the first (`start`)
    to the minute after the last. A card metered some hours only (a burst node) is several."""

    node_id: int
    node: str
    uuid: str
    model: str
    memory_mb: int
    sm_count: int
    start: datetime
    end: datetime


@dataclass(frozen=True, slots=True)
class WorkloadSlice:
    """One workload on one GPU, from its first minute (`start`) to the minute after its last, and
    its need: the larger of its request and its busiest minute, per resource, at most the card."""

    key: tuple[str, ...]  # tenant, namespace, pod, container, pod UID, the GPU it ran on
    model: str
    memory_mb: int  # of the card it ran on
    sm_count: int
    start: datetime
    end: datetime
    mem_mb: Decimal
    sm: Decimal

    @property
    def workload(self) -> tuple[str, ...]:
        """The workload without its GPU: its slices on several GPUs need several cards."""
        return self.key[:-1]

    @property
    def held(self) -> tuple[Decimal, Decimal]:
        """Its need in memory (MB) and SMs, at most the card."""
        return min(self.mem_mb, Decimal(self.memory_mb)), min(self.sm, Decimal(self.sm_count))


def slice_share(alternative: str, s: WorkloadSlice) -> tuple[Decimal, str]:
    """A slice's share of its card under an alternative, and the MIG profile's name (fixed
    profiles on a MIG model only, else "")."""
    if alternative == "whole_card":
        return Decimal(1), ""
    mem_mb, sm = s.held
    if alternative == "request_fraction":
        return _share(mem_mb / s.memory_mb, sm / s.sm_count), ""
    geometry = mig_geometry(s.model)
    profile = choose_profile(geometry, mem_mb=mem_mb, sm=sm, memory_mb=s.memory_mb, sm_count=s.sm_count)
    return _profile_share(geometry, profile), profile_name(geometry, profile, model=s.model, memory_mb=s.memory_mb)


@dataclass(frozen=True, slots=True)
class Shortfall:
    """The moment an alternative lacked the most cards of one model: it needed `needed` cards
    holding a slice, the fleet had `had` cards of that model then."""

    at: datetime
    model: str
    needed: int
    had: int


@dataclass(frozen=True, slots=True)
class Assignment:
    """Where a slice was from `since` to `until`: a fleet card, or (`uuid` "") a card the fleet
    lacked; `first_slot` is the first MIG memory slice it held (fixed profiles), else 0."""

    key: tuple[str, ...]
    node_id: int
    uuid: str
    since: datetime
    until: datetime
    first_slot: int


@dataclass(frozen=True)
class Placement:
    """An alternative placed on the fleet. `occupied`: (node id, GPU UUID, since, until) of every
    stretch a fleet card held at least one slice; `assignments`: where every slice was, when;
    `shares`: each slice's share of its card; `profiles`: each slice's MIG profile name (fixed
    profiles on MIG models)."""

    alternative: str
    occupied: tuple[tuple[int, str, datetime, datetime], ...]
    assignments: tuple[Assignment, ...]
    peak_cards: int  # the most cards holding a slice at once, the fleet's and any it lacked
    peak_at: datetime | None
    fleet_cards_at_peak: int
    shortfall: Shortfall | None  # None: every slice fitted on the fleet's cards, always
    shares: dict[tuple[str, ...], Decimal]
    profiles: dict[tuple[str, ...], str]

    @property
    def feasible(self) -> bool:
        return self.shortfall is None


@dataclass(eq=False)
class _Card:
    """A card while slices are placed: what its slices hold of it."""

    spec: FleetCard | None  # None: a card the fleet does not have
    model: str
    memory_mb: int
    sm_count: int
    order: tuple[str, str]
    held: dict[tuple[str, ...], tuple[Decimal, Decimal, frozenset[int], int]] = field(default_factory=dict)
    workloads: Counter[tuple[str, ...]] = field(default_factory=Counter)
    mem_mb: Decimal = Decimal(0)
    sm: Decimal = Decimal(0)
    slots: set[int] = field(default_factory=set)
    compute: int = 0

    def take(self, s: WorkloadSlice, claim: tuple[Decimal, Decimal, frozenset[int], int]) -> None:
        self.held[s.key] = claim
        self.workloads[s.workload] += 1
        self.mem_mb += claim[0]
        self.sm += claim[1]
        self.slots |= claim[2]
        self.compute += claim[3]

    def release(self, s: WorkloadSlice) -> None:
        mem_mb, sm, slots, compute = self.held.pop(s.key)
        self.workloads[s.workload] -= 1
        self.mem_mb -= mem_mb
        self.sm -= sm
        self.slots -= slots
        self.compute -= compute


def _claim(alternative: str, card: _Card, s: WorkloadSlice) -> tuple[Decimal, Decimal, frozenset[int], int] | None:
    """What `s` would hold of `card` under the alternative, or None when it does not fit there."""
    if card.workloads[s.workload]:
        return None  # a workload's slices on several GPUs need as many cards
    if alternative == "whole_card":
        return None if card.held else (Decimal(0), Decimal(0), frozenset(), 0)
    mem_mb, sm = s.held
    if alternative == "request_fraction":
        fits = card.mem_mb + mem_mb <= card.memory_mb and card.sm + sm <= card.sm_count
        return (mem_mb, sm, frozenset(), 0) if fits else None
    geometry = mig_geometry(card.model)
    profile = choose_profile(geometry, mem_mb=mem_mb, sm=sm, memory_mb=card.memory_mb, sm_count=card.sm_count)
    if card.compute + profile.compute > geometry.compute:
        return None
    for start in profile.starts:
        slots = frozenset(range(start, start + profile.memory))
        if not slots & card.slots:
            return Decimal(0), Decimal(0), slots, profile.compute
    return None


class _Fleet:
    """The cards present at each step, by model, in the fleet's order, and the cards it lacked."""

    def __init__(self, alternative: str) -> None:
        self.alternative = alternative
        self.live: dict[str, list[tuple[tuple[str, str], _Card]]] = defaultdict(list)
        self.by_uuid: dict[tuple[int, str], _Card] = {}
        self.lacking: dict[str, list[_Card]] = defaultdict(list)
        self.where: dict[tuple[str, ...], _Card] = {}

    def add_card(self, spec: FleetCard) -> _Card:
        card = _Card(spec, spec.model, spec.memory_mb, spec.sm_count, (spec.node, spec.uuid))
        insort(self.live[spec.model], (card.order, card), key=lambda item: item[0])
        self.by_uuid[(spec.node_id, spec.uuid)] = card
        return card

    def remove_card(self, spec: FleetCard) -> _Card:
        card = self.by_uuid.pop((spec.node_id, spec.uuid))
        self.live[spec.model] = [item for item in self.live[spec.model] if item[1] is not card]
        return card

    def put(self, s: WorkloadSlice) -> _Card:
        """First fit on the fleet's cards of the slice's model, else on a card it lacks."""
        card = self.put_on_fleet(s) or self._first_fit(self.lacking[s.model], s)
        if card is None:
            card = _Card(None, s.model, s.memory_mb, s.sm_count, ("", ""))
            card.take(s, _claim(self.alternative, card, s) or (Decimal(0), Decimal(0), frozenset(), 0))
            self.lacking[s.model].append(card)
        self.where[s.key] = card
        return card

    def put_on_fleet(self, s: WorkloadSlice) -> _Card | None:
        card = self._first_fit([c for _, c in self.live[s.model]], s)
        if card is not None:
            self.where[s.key] = card
        return card

    def _first_fit(self, cards: list[_Card], s: WorkloadSlice) -> _Card | None:
        for card in cards:
            claim = _claim(self.alternative, card, s)
            if claim is not None:
                card.take(s, claim)
                return card
        return None

    def drop_empty_lacking(self) -> None:
        for model, cards in self.lacking.items():
            self.lacking[model] = [c for c in cards if c.held]


def place(alternative: str, cards: Sequence[FleetCard], slices: Sequence[WorkloadSlice]) -> Placement:
    """Place every slice under `alternative` on `cards` over time (module docstring)."""
    if alternative not in ALTERNATIVES:
        raise ValueError(f"unknown alternative {alternative!r}")
    shares: dict[tuple[str, ...], Decimal] = {}
    profiles: dict[tuple[str, ...], str] = {}
    for s in slices:
        shares[s.key], name = slice_share(alternative, s)
        if name:
            profiles[s.key] = name
    run = _Run(alternative, cards, slices, shares)
    run.play()
    return Placement(alternative=alternative, occupied=tuple(sorted(run.occupied)),
                     assignments=tuple(run.assignments), peak_cards=run.peak_cards,
                     peak_at=run.peak_at, fleet_cards_at_peak=run.fleet_at_peak, shortfall=run.shortfall,
                     shares=shares, profiles=profiles)


class _Run:
    """One placement over time: at each instant something starts or ends, slices that end leave
    their cards, cards that leave the fleet hand their slices back, new cards join, then the
    slices that start (and those handed back) are placed, largest first."""

    def __init__(self, alternative: str, cards: Sequence[FleetCard], slices: Sequence[WorkloadSlice],
                 shares: dict[tuple[str, ...], Decimal]) -> None:
        self.fleet = _Fleet(alternative)
        self.shares = shares
        self.slices = {s.key: s for s in slices}  # a workload's runs share their key, model and size
        self.card_starts: dict[datetime, list[FleetCard]] = defaultdict(list)
        self.card_ends: dict[datetime, list[FleetCard]] = defaultdict(list)
        for c in cards:
            self.card_starts[c.start].append(c)
            self.card_ends[c.end].append(c)
        self.slice_starts: dict[datetime, list[WorkloadSlice]] = defaultdict(list)
        self.slice_ends: dict[datetime, list[WorkloadSlice]] = defaultdict(list)
        for s in slices:
            self.slice_starts[s.start].append(s)
            self.slice_ends[s.end].append(s)
        self.open_since: dict[int, tuple[FleetCard, datetime]] = {}  # id(card) -> its card, busy since
        self.occupied: list[tuple[int, str, datetime, datetime]] = []
        self.assignments: list[Assignment] = []
        self.since: dict[tuple[str, ...], datetime] = {}
        self.live_count: Counter[str] = Counter()
        self.busy_count: Counter[str] = Counter()
        self.peak_cards = 0
        self.peak_at: datetime | None = None
        self.fleet_at_peak = 0
        self.shortfall: Shortfall | None = None
        self._lacked = 0

    def play(self) -> None:
        for at in sorted({*self.card_starts, *self.card_ends, *self.slice_starts, *self.slice_ends}):
            self._step(at)

    def _step(self, at: datetime) -> None:
        fleet = self.fleet
        touched: list[_Card] = []
        for s in self.slice_ends.get(at, []):
            card = fleet.where.pop(s.key)
            self._record(s.key, card, at)
            card.release(s)
            touched.append(card)
        homeless: list[WorkloadSlice] = []
        for spec in self.card_ends.get(at, []):
            card = fleet.remove_card(spec)
            self.live_count[spec.model] -= 1
            for key in list(card.held):
                self._record(key, card, at)
                card.release(self.slices[key])
                del fleet.where[key]
                homeless.append(self.slices[key])
            touched.append(card)
        for spec in self.card_starts.get(at, []):
            fleet.add_card(spec)
            self.live_count[spec.model] += 1
        for s in sorted([*self.slice_starts.get(at, []), *homeless], key=lambda s: (-self.shares[s.key], s.key)):
            touched.append(fleet.put(s))
            self.since[s.key] = at
        touched.extend(self._rehome(at))
        for card in touched:
            self._settle(card, at)
        fleet.drop_empty_lacking()
        self._measure(at)

    def _rehome(self, at: datetime) -> list[_Card]:
        """Slices on cards the fleet lacked move to fleet cards with room now (a pod that did not
        fit is scheduled once there is room), so the fleet lacks a card only while it must."""
        moved: list[_Card] = []
        for cards in self.fleet.lacking.values():
            for card in cards:
                for key in sorted(card.held, key=lambda k: (-self.shares[k], k)):
                    target = self.fleet.put_on_fleet(self.slices[key])
                    if target is not None:
                        self._record(key, card, at)
                        card.release(self.slices[key])
                        self.since[key] = at
                        moved.append(target)
        return moved

    def _record(self, key: tuple[str, ...], card: _Card, until: datetime) -> None:
        slots = card.held[key][2]
        node_id, uuid = (card.spec.node_id, card.spec.uuid) if card.spec else (0, "")
        self.assignments.append(Assignment(key, node_id, uuid, self.since.pop(key), until, min(slots, default=0)))

    def _settle(self, card: _Card, at: datetime) -> None:
        """Open or close a fleet card's busy stretch when it changed at `at`."""
        if card.spec is None:
            return
        busy = bool(card.held) and (card.spec.node_id, card.spec.uuid) in self.fleet.by_uuid
        was = id(card) in self.open_since
        if busy and not was:
            self.open_since[id(card)] = (card.spec, at)
            self.busy_count[card.model] += 1
        elif was and not busy:
            spec, since = self.open_since.pop(id(card))
            self.occupied.append((spec.node_id, spec.uuid, since, at))
            self.busy_count[card.model] -= 1

    def _measure(self, at: datetime) -> None:
        """The step's cards in use, and whether the fleet lacks more cards now than ever before.
        A card is lacked only when every fleet card of its model holds a slice (an empty card
        takes any one slice), so `needed` = the model's busy cards + the ones it lacked > `had`."""
        lacking = {model: len(cards) for model, cards in self.fleet.lacking.items() if cards}
        total = sum(self.busy_count.values()) + sum(lacking.values())
        if total > self.peak_cards:
            self.peak_cards, self.peak_at, self.fleet_at_peak = total, at, sum(self.live_count.values())
        for model in sorted(lacking, key=lambda m: (-lacking[m], m))[:1]:
            if lacking[model] > self._lacked:
                self._lacked = lacking[model]
                self.shortfall = Shortfall(at=at, model=model, needed=self.busy_count[model] + lacking[model],
                                           had=self.live_count[model])
