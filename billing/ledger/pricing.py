"""Pricing: how usage is priced (docs/billing.md).

One GPU window:

    p = price_per_gpu_hour / 3600                       (price per GPU-second)
    share_i = α · M_i / memory_mb + (1 − α) · S_i / sm_count     (GPU-seconds)
    charge_i = p × share_i × scale,  scale = min(1, seconds / Σ share)
    idle = p × seconds − Σ charge_i   (≥ 0, never hidden)

M_i and S_i are the workload's billed MB·s and SM·s: max(used, granted) by default, or
`granted` / `used`. A workload holding the whole card for s seconds pays exactly p × s.
Under the `proportional` idle policy the idle amount is spread over the window's
workloads pro rata to their charge; with no workload it stays with the platform.

The energy the card drew in the window (joules, when its agent metered it) is split the same way
(docs/billing.md, Energy): workload i gets E × share_i / seconds (its share of the card's time, after
any scaling), allocated by the largest remainder as charges are, and the rest is idle energy, spread
over the workloads like idle cost under `proportional`, else the platform's. Σ workload energy + idle
energy = E exactly, at ledger precision, priced or not.

A card covered by a commitment (reserved rate or on-prem cards, docs/billing.md, Commitments and
on-prem cards) is priced the same way at the commitment's rate instead of the market card's. In
each minute the commitments of a GPU model in force form one pool of Σ cards at their card-weighted
mean rate, and the model's cards metered in that minute are covered in a fixed order (node id, then
GPU UUID: `committed_keys`) up to the pool's size; the rest are priced by the market card.

This module is the one home of how usage is priced: the formula above (pure: no ORM, no clock),
which rate card prices a GPU-minute (`load_rate_cards`, `RateCards.card_for`: the card of the GPU's
model in force at that minute) and which commitments (`RateCards.pool_for`, `committed_keys`).
billing.services.pricing manages the cards and commitments themselves (who may create, end or
retire one, and re-pricing the ledger when one changes).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from decimal import Context, Decimal, localcontext

from django.db.models import F

from billing.models import Commitment, RateCard
from billing.money import allocate, ledger_amount

__all__ = [
    "CommitmentPool",
    "GpuWindowUsage",
    "PricedCard",
    "PricedCommitment",
    "PricedWindow",
    "Rate",
    "RateCards",
    "WorkloadQuantities",
    "committed_keys",
    "load_rate_cards",
    "price_gpu_window",
]

_CONTEXT = Context(prec=50)
_SECONDS_PER_HOUR = Decimal(3600)
BILLED_BASES = ("max", "granted", "used")
IDLE_POLICIES = ("platform", "proportional")


@dataclass(frozen=True)
class Rate:
    price_per_gpu_hour: Decimal
    alpha: Decimal = Decimal("0.5")
    billed_basis: str = "max"
    idle_policy: str = "platform"

    def __post_init__(self) -> None:
        if self.price_per_gpu_hour < 0:
            raise ValueError("price_per_gpu_hour must not be negative")
        if not Decimal(0) <= self.alpha <= Decimal(1):
            raise ValueError("alpha must lie in [0, 1]")
        if self.billed_basis not in BILLED_BASES:
            raise ValueError(f"billed_basis must be one of {BILLED_BASES}")
        if self.idle_policy not in IDLE_POLICIES:
            raise ValueError(f"idle_policy must be one of {IDLE_POLICIES}")


@dataclass(frozen=True)
class WorkloadQuantities:
    """Integrals of one workload on one GPU over the window. `*_max_*` is Σ per-sample max(used, granted)."""

    mem_used_mb_s: Decimal
    mem_granted_mb_s: Decimal
    mem_max_mb_s: Decimal
    sm_used_s: Decimal
    sm_granted_s: Decimal
    sm_max_s: Decimal

    def billed(self, basis: str) -> tuple[Decimal, Decimal]:
        if basis == "max":
            return self.mem_max_mb_s, self.sm_max_s
        if basis == "granted":
            return self.mem_granted_mb_s, self.sm_granted_s
        return self.mem_used_mb_s, self.sm_used_s


@dataclass(frozen=True)
class GpuWindowUsage:
    memory_mb: int
    sm_count: int
    metered_seconds: Decimal
    workloads: Sequence[WorkloadQuantities]
    energy_j: Decimal = Decimal(0)


@dataclass(frozen=True)
class PricedWindow:
    card_cost: Decimal
    billed_mem_mb_s: tuple[Decimal, ...]
    billed_sm_s: tuple[Decimal, ...]
    share_gpu_s: tuple[Decimal, ...]
    charges: tuple[Decimal, ...]
    idle_cost: Decimal
    idle_shares: tuple[Decimal, ...]
    # Each workload's energy (its share and, under `proportional`, its part of the idle), and the rest.
    energies: tuple[Decimal, ...] = ()
    idle_energy_j: Decimal = Decimal(0)

    @property
    def charged(self) -> Decimal:
        return sum(self.charges, Decimal(0))

    @property
    def idle_allocated(self) -> Decimal:
        return sum(self.idle_shares, Decimal(0))


def price_gpu_window(*, window: GpuWindowUsage, rate: Rate) -> PricedWindow:
    if window.memory_mb <= 0 or window.sm_count <= 0:
        raise ValueError("a GPU needs positive memory_mb and sm_count")
    if window.metered_seconds < 0:
        raise ValueError("metered_seconds must not be negative")
    with localcontext(_CONTEXT):
        p = rate.price_per_gpu_hour / _SECONDS_PER_HOUR
        card_cost = ledger_amount(p * window.metered_seconds)
        billed = [w.billed(rate.billed_basis) for w in window.workloads]
        alpha = rate.alpha
        raw_shares = [
            alpha * mem / window.memory_mb + (1 - alpha) * sm / window.sm_count for mem, sm in billed
        ]
        total_share = sum(raw_shares, Decimal(0))
        if total_share > window.metered_seconds and total_share > 0:
            # Billed shares exceed the card (possible with `max`): scale down pro rata,
            # so the whole card is charged once and idle is zero.
            scale = window.metered_seconds / total_share
            charged_total = card_cost
        else:
            scale = Decimal(1)
            charged_total = min(card_cost, ledger_amount(p * total_share))
        shares = [ledger_amount(s * scale) for s in raw_shares]
        charges = allocate(charged_total, raw_shares) if raw_shares else []
        idle_cost = card_cost - charged_total
        if rate.idle_policy == "proportional" and charges and idle_cost > 0:
            idle_shares = allocate(idle_cost, charges if any(charges) else raw_shares)
        else:
            idle_shares = [Decimal(0)] * len(charges)
        energies, idle_energy = _split_energy(window, raw_shares, charges, scale=scale,
                                              spread_idle=rate.idle_policy == "proportional")
    return PricedWindow(
        card_cost=card_cost,
        billed_mem_mb_s=tuple(m for m, _ in billed),
        billed_sm_s=tuple(s for _, s in billed),
        share_gpu_s=tuple(shares),
        charges=tuple(charges),
        idle_cost=idle_cost,
        idle_shares=tuple(idle_shares),
        energies=tuple(energies),
        idle_energy_j=idle_energy,
    )


def _split_energy(window: GpuWindowUsage, raw_shares: list[Decimal], charges: list[Decimal], *, scale: Decimal,
                  spread_idle: bool) -> tuple[list[Decimal], Decimal]:
    """The card's energy split as its cost is: by each workload's share of the card's time."""
    energy = ledger_amount(window.energy_j)
    if not raw_shares:
        return [], energy
    if energy <= 0 or window.metered_seconds <= 0:
        return [Decimal(0)] * len(raw_shares), energy
    used = min(energy, ledger_amount(energy * sum(raw_shares, Decimal(0)) * scale / window.metered_seconds))
    parts = allocate(used, raw_shares)
    idle = energy - used
    if spread_idle and idle > 0:
        spread = allocate(idle, charges if any(charges) else raw_shares)
        return [p + s for p, s in zip(parts, spread, strict=True)], Decimal(0)
    return parts, idle


@dataclass(frozen=True)
class PricedCard:
    """A rate card as the rollup applies it: its rate over [start, end)."""

    id: int
    start: datetime
    end: datetime | None
    currency: str
    rate: Rate


@dataclass(frozen=True)
class PricedCommitment:
    """A commitment as the rollup applies it: `cards` cards of its model at its rate over [start, end)."""

    id: int
    start: datetime
    end: datetime
    cards: int
    price_per_gpu_hour: Decimal
    currency: str


@dataclass(frozen=True)
class CommitmentPool:
    """The commitments of one GPU model in force at one minute, taken as one pool: `cards` cards
    (Σ of theirs) at the card-weighted mean of their rates, exact (not rounded: it only ever
    multiplies metered seconds, and the product is quantized once to ledger precision)."""

    cards: int
    price_per_gpu_hour: Decimal
    currency: str


@dataclass(frozen=True)
class RateCards:
    """Every rate card and commitment, by GPU model, in effective order, read once per rollup."""

    by_model: dict[str, list[PricedCard]]
    commitments: dict[str, list[PricedCommitment]] = field(default_factory=dict)

    def card_for(self, model: str, minute: datetime) -> PricedCard | None:
        """The card of `model` in force at `minute`; None leaves the minute unpriced (billed at 0,
        listed as unpriced usage until a card covers it)."""
        for card in self.by_model.get(model, ()):
            if card.start <= minute and (card.end is None or minute < card.end):
                return card
        return None

    def pool_for(self, model: str, minute: datetime) -> CommitmentPool | None:
        """The commitment pool of `model` at `minute`; None when no commitment of it is in force."""
        active = [c for c in self.commitments.get(model, ()) if c.start <= minute < c.end]
        if not active:
            return None
        cards = sum(c.cards for c in active)
        with localcontext(_CONTEXT):
            rate = sum((c.price_per_gpu_hour * c.cards for c in active), Decimal(0)) / cards
        return CommitmentPool(cards=cards, price_per_gpu_hour=rate, currency=active[0].currency)


def committed_keys(present: Mapping[tuple[int, str], Decimal], cards: int) -> set[tuple[int, str]]:
    """Which of one model's cards metered in one minute, (node id, GPU UUID) with their metered
    seconds, a pool of `cards` covers: the first `cards` of them with metered seconds, in that order. The order is fixed, so
    the same cards are covered whichever node's batch arrived first, and a rebuild covers the same
    ones again."""
    metered = sorted(k for k, seconds in present.items() if seconds > 0)
    return set(metered[:cards])


def load_rate_cards() -> RateCards:
    """The rate-card and commitment tables as `RateCards`. The rollup reads them under the ledger
    lock, so no rate-card or commitment change commits between this read and the rows it prices."""
    cards: dict[str, list[PricedCard]] = defaultdict(list)
    for rc in RateCard.objects.order_by("effective_from"):
        cards[rc.gpu_model].append(
            PricedCard(id=rc.pk, start=rc.effective_from, end=rc.effective_to, currency=rc.currency,
                       rate=Rate(price_per_gpu_hour=rc.price_per_gpu_hour, alpha=rc.alpha,
                                 billed_basis=rc.billed_basis, idle_policy=rc.idle_policy)))
    commitments: dict[str, list[PricedCommitment]] = defaultdict(list)
    for c in Commitment.objects.filter(effective_to__gt=F("effective_from")).order_by("effective_from", "id"):
        commitments[c.gpu_model].append(
            PricedCommitment(id=c.pk, start=c.effective_from, end=c.effective_to, cards=c.cards,
                             price_per_gpu_hour=c.price_per_gpu_hour, currency=c.currency))
    return RateCards(by_model=dict(cards), commitments=dict(commitments))
