"""Why a workload costs what it does: the tenant portal's panel (docs/billing.md, Why a workload
costs what it does). What it was billed on, the part of its charge due to over-granting, and its
containers' right-sizing (billing.services.fleet.rightsizing: memory and SMs, as the drill-down).

Billing is on max(used, granted) of memory and SMs by default (billing.ledger.pricing), so a pod that
uses a tenth of the SMs it was granted pays for all of them. The part of a charge due to
over-granting is what billing on *used* instead would not have charged, by the pricing formula:

    billed share = α · billed memory card-seconds + (1 − α) · billed SM card-seconds
    used share   = α · used memory card-seconds   + (1 − α) · used SM card-seconds
    over-granted = charge × (billed share − used share) ÷ billed share

per rate card that priced the workload (each card has its α and basis), summed. It is 0 on a card
that bills on use, and never negative: where a card bills on `granted` and use exceeded the grant,
billing on use would charge more, which is no over-granting. The charge is taken as priced, so on a
card whose billed shares were scaled down to fit it (docs/billing.md, Reconciliation invariant) the
part is the same fraction of the scaled charge.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from decimal import Context, Decimal, localcontext

from billing.ledger.billed_basis import BilledBasisRow, ContainerUseRow, list_billed_basis_rows, list_container_use
from billing.money import ledger_amount
from billing.services.fleet import MemoryUse, SmUse, Suggestion, mean_mb, suggest_memory_request, suggest_sm_request

__all__ = ["ContainerSizing", "CostReasons", "PricedUsage", "get_cost_reasons", "overgranted_charge"]

_ZERO = Decimal(0)
_CONTEXT = Context(prec=50)
_MB_S_PER_GB_H = Decimal(1024 * 3600)  # GB·h as the pages write them (GiB, 1024 MB)
_S_PER_H = Decimal(3600)


@dataclass(frozen=True)
class PricedUsage:
    """A workload's usage priced by one rate card: its charge, the card's α and billed basis, and
    memory and SMs in card-seconds (one second holding all of a card's memory, or all its SMs)."""

    charge: Decimal
    alpha: Decimal
    basis: str
    mem_used_card_s: Decimal
    mem_billed_card_s: Decimal
    sm_used_card_s: Decimal
    sm_billed_card_s: Decimal


def overgranted_charge(usage: PricedUsage) -> Decimal:
    """The part of `usage.charge` that billing on used would not have charged (module docstring),
    at ledger precision."""
    if not _ZERO <= usage.alpha <= 1:
        raise ValueError("alpha must lie in [0, 1]")
    with localcontext(_CONTEXT):
        billed = _share(usage.alpha, usage.mem_billed_card_s, usage.sm_billed_card_s)
        used = _share(usage.alpha, usage.mem_used_card_s, usage.sm_used_card_s)
        if usage.basis == "used" or billed <= 0 or used >= billed:
            return _ZERO
        return ledger_amount(usage.charge * (billed - used) / billed)


def _share(alpha: Decimal, mem_card_s: Decimal, sm_card_s: Decimal) -> Decimal:
    """The pricing formula's share of a card (billing.ledger.pricing), from card-seconds."""
    return alpha * mem_card_s + (1 - alpha) * sm_card_s


@dataclass(frozen=True)
class ContainerSizing:
    """One container's right-sizing, memory and SMs per GPU, as the drill-down's workload rows have
    it; the GB·h and SM·h a lowered request would have given back (None: request unknown)."""

    container: str
    memory: MemoryUse
    suggestion: Suggestion
    freed_gb_h: Decimal | None
    sm: SmUse
    sm_suggestion: Suggestion
    freed_sm_h: Decimal | None


@dataclass(frozen=True)
class CostReasons:
    """One workload's panel: the bases and α of the cards that priced it, its over-granted part
    at ledger precision (pages show it rounded once, like every amount) and its containers' sizing."""

    bases: tuple[str, ...]  # sorted; empty when no card priced it
    alphas: tuple[Decimal, ...]  # sorted
    overgranted: Decimal
    unpriced: bool  # some of its hours no rate card priced (billed at 0)
    sizing: tuple[ContainerSizing, ...] = ()  # by container name

    def overgranted_pct(self, cost: Decimal) -> Decimal | None:
        """The over-granted part as a percentage of the workload's cost (charge and idle share, at
        ledger precision); None for a workload that cost nothing."""
        return self.overgranted * 100 / cost if cost > 0 else None


def get_cost_reasons(*, tenant: str, start: datetime, end: datetime, now: datetime,
                     workloads: Sequence[tuple[str, str, str]]) -> dict[tuple[str, str, str], CostReasons]:
    """Each of `workloads` (pod instances: namespace, pod, pod UID) of `tenant` with usage in [start,
    end), read at `now`. Only the workloads a page shows: reading every workload of a big tenant's
    month was most of the portal's time (billing.ledger.billed_basis)."""
    if not workloads:
        return {}
    by_workload: dict[tuple[str, str, str], list[BilledBasisRow]] = defaultdict(list)
    for row in list_billed_basis_rows(tenant=tenant, start=start, end=end, now=now, workloads=workloads):
        by_workload[(row.namespace, row.pod, row.pod_uid)].append(row)
    sizing: dict[tuple[str, str, str], list[ContainerSizing]] = defaultdict(list)
    uses = list_container_use(tenant=tenant, start=start, end=end, workloads=workloads)
    for use in sorted(uses, key=lambda u: u.container):
        sizing[(use.namespace, use.pod, use.pod_uid)].append(_sizing(use))
    return {key: _reasons(rows, tuple(sizing.get(key, ()))) for key, rows in by_workload.items()}


def _reasons(rows: Sequence[BilledBasisRow], sizing: tuple[ContainerSizing, ...]) -> CostReasons:
    priced = [r for r in rows if r.alpha is not None and r.billed_basis is not None]
    unpriced = any(r.alpha is None or r.billed_basis is None for r in rows)
    overgranted = sum((overgranted_charge(_priced(r)) for r in priced), _ZERO)
    return CostReasons(bases=tuple(sorted({str(r.billed_basis) for r in priced})),
                       alphas=tuple(sorted({r.alpha for r in priced if r.alpha is not None})),
                       overgranted=overgranted, unpriced=unpriced, sizing=sizing)


def _per(value: Decimal | None, unit: Decimal) -> Decimal | None:
    return None if value is None else value / unit


def _sizing(use: ContainerUseRow) -> ContainerSizing:
    """The right-sizing rule on one container's use, per GPU (the drill-down's, by container)."""
    seconds = use.seconds
    known = seconds > 0
    memory = MemoryUse(request_mb=use.mem_requested_mb_s / seconds if known and use.mem_requested_mb_s is not None
                       else None, mean_used_mb=mean_mb(use.mem_used_mb_s, seconds),
                       peak_hour_mean_mb=use.peak_hour_mean_mb,
                       granted_mb=use.mem_granted_mb_s / seconds if known else None)
    sm = SmUse(request_sm=use.sm_requested_s / seconds if known and use.sm_requested_s is not None else None,
               mean_used_sm=mean_mb(use.sm_used_s, seconds), peak_hour_mean_sm=use.peak_hour_mean_sm,
               granted_sm=use.sm_granted_s / seconds if known else None)
    suggestion, sm_suggestion = suggest_memory_request(memory), suggest_sm_request(sm)
    # What a lower request gives back is of the request, or of the grant where it was held against it.
    mem_of = use.mem_granted_mb_s if suggestion.against_grant else use.mem_requested_mb_s
    sm_of = use.sm_granted_s if sm_suggestion.against_grant else use.sm_requested_s
    return ContainerSizing(
        container=use.container, memory=memory, suggestion=suggestion,
        freed_gb_h=suggestion.freed(_per(mem_of, _MB_S_PER_GB_H)),
        sm=sm, sm_suggestion=sm_suggestion, freed_sm_h=sm_suggestion.freed(_per(sm_of, _S_PER_H)),
    )


def _priced(row: BilledBasisRow) -> PricedUsage:
    if row.alpha is None or row.billed_basis is None:
        raise ValueError("an unpriced row has no card to price it again")
    return PricedUsage(charge=row.charge, alpha=row.alpha, basis=row.billed_basis,
                       mem_used_card_s=row.mem_used_card_s, mem_billed_card_s=row.mem_billed_card_s,
                       sm_used_card_s=row.sm_used_card_s, sm_billed_card_s=row.sm_billed_card_s)
