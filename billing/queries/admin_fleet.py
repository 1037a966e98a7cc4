"""Reads for the admin pages: rate cards (finance and admins) and nodes with their tokens (admins).

Neither holds tenant data; the scope decides who may read at all, and a caller outside it gets
nothing back (the views answer 403 before asking)."""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass
from datetime import datetime, timedelta
from decimal import Decimal

from billing.ledger.state import list_quarantined_batches
from billing.models import Gpu, GpuModel, Node, NodeToken, RateCard
from billing.queries.locations import NodePlace, node_places
from billing.queries.undelivered import UndeliveredView, list_open_undelivered
from billing.scope import Scope
from billing.services.pricing import approved_gpu_models, known_gpu_models, unapproved_fleet_models

__all__ = [
    "NODE_STALE_AFTER",
    "GpuModelView",
    "GpuModelsPage",
    "NodeView",
    "RateCardGroup",
    "RateCardView",
    "RateCardsPage",
    "TokenView",
    "get_gpu_models_page",
    "get_node_token",
    "get_rate_cards_page",
    "list_nodes",
]

# A node last heard from longer ago than this is shown as stale (one never heard from shows "never").
NODE_STALE_AFTER = timedelta(minutes=5)


@dataclass(frozen=True)
class RateCardView:
    id: int
    gpu_model: str
    currency: str
    price_per_gpu_hour: Decimal
    # Decimals to show the price with: all it has, at least 2.
    price_places: int
    effective_from: datetime
    effective_to: datetime | None
    alpha: Decimal
    billed_basis: str
    billed_basis_label: str
    idle_policy: str
    idle_policy_label: str
    source_url: str
    source_note: str
    is_current: bool
    is_future: bool
    # Still changeable: not yet ended (an end in the future may move) and not retired.
    may_end: bool
    retired_at: datetime | None = None
    retired_by: str = ""
    retire_reason: str = ""


@dataclass(frozen=True)
class RateCardGroup:
    gpu_model: str
    current: RateCardView | None
    # Newest first.
    cards: tuple[RateCardView, ...]


def _places(value: Decimal) -> int:
    exponent = value.normalize().as_tuple().exponent
    return max(2, -exponent) if isinstance(exponent, int) else 2


def _list_rate_cards(*, scope: Scope, now: datetime) -> list[RateCardGroup]:
    """Every card, grouped by GPU model (models in name order, cards newest first)."""
    if not (scope.is_admin or scope.is_finance):
        return []
    by_model: dict[str, list[RateCardView]] = defaultdict(list)
    for c in RateCard.objects.order_by("gpu_model", "-effective_from"):
        by_model[c.gpu_model].append(RateCardView(
            id=c.pk, gpu_model=c.gpu_model, currency=c.currency, price_per_gpu_hour=c.price_per_gpu_hour,
            price_places=_places(c.price_per_gpu_hour), effective_from=c.effective_from, effective_to=c.effective_to, alpha=c.alpha,
            billed_basis=c.billed_basis, billed_basis_label=str(c.get_billed_basis_display()),
            idle_policy=c.idle_policy, idle_policy_label=str(c.get_idle_policy_display()),
            source_url=c.source_url, source_note=c.source_note,
            is_current=c.effective_from <= now and (c.effective_to is None or now < c.effective_to),
            is_future=c.effective_from > now,
            may_end=c.retired_at is None and (c.effective_to is None or c.effective_to > now),
            retired_at=c.retired_at, retired_by=c.retired_by, retire_reason=c.retire_reason,
        ))
    return [
        RateCardGroup(gpu_model=model, current=next((c for c in cards if c.is_current), None), cards=tuple(cards))
        for model, cards in sorted(by_model.items())
    ]


def _form_defaults(*, gpu_model: str, now: datetime) -> dict[str, object]:
    """Initial values of the new-price form for `gpu_model`: those of its current card (else its latest)."""
    if not gpu_model:
        return {}
    cards = RateCard.objects.filter(gpu_model=gpu_model, retired_at__isnull=True).order_by("-effective_from")
    card = next((c for c in cards if c.effective_from <= now and (c.effective_to is None or now < c.effective_to)),
                None) or cards.first()
    if card is None:
        return {"gpu_model": gpu_model}
    return {"gpu_model": gpu_model, "currency": card.currency, "alpha": card.alpha,
            "billed_basis": card.billed_basis, "idle_policy": card.idle_policy}


@dataclass(frozen=True)
class RateCardsPage:
    groups: list[RateCardGroup]
    # For admins only (empty otherwise): the form's GPU models (the fleet's and the cards') and initial values.
    known_models: list[str]
    form_defaults: dict[str, object]


def get_rate_cards_page(*, scope: Scope, now: datetime, gpu_model: str = "") -> RateCardsPage:
    """The rate-card page: every card for finance and admins; the form's data for admins."""
    groups = _list_rate_cards(scope=scope, now=now)
    if not scope.is_admin:
        return RateCardsPage(groups=groups, known_models=[], form_defaults={})
    return RateCardsPage(groups=groups, known_models=known_gpu_models(),
                         form_defaults=_form_defaults(gpu_model=gpu_model, now=now))


@dataclass(frozen=True)
class TokenView:
    id: int
    prefix: str
    created_at: datetime
    last_used_at: datetime | None
    revoked_at: datetime | None


@dataclass(frozen=True)
class NodeView:
    name: str
    created_at: datetime
    last_seen_at: datetime | None
    stale: bool
    gpu_count: int
    # (model, count), most numerous first.
    gpu_models: tuple[tuple[str, int], ...]
    active_tokens: tuple[TokenView, ...]
    revoked_tokens: tuple[TokenView, ...]
    # Batches its agent holds because ingest refused them: usage not billed until re-driven.
    undelivered: tuple[UndeliveredView, ...]
    # Batches stored but quarantined by the rollup: left out of the ledger until re-driven.
    quarantined: tuple[QuarantinedView, ...] = ()
    # Models among `gpu_models` that are not approved: their GPUs are flagged, their usage unpriced.
    unapproved_models: frozenset[str] = frozenset()

    @property
    def unapproved_gpus(self) -> int:
        return sum(count for model, count in self.gpu_models if model in self.unapproved_models)
    # Sample rows whose tenant claim the service's namespace mapping overrode (billed to the mapped
    # tenant): a node claiming other tenants' usage, or a namespace label the mapping disagrees with.
    tenant_claim_mismatches: int = 0
    # Where it is today and any move planned (docs/billing.md, Energy); None: no location yet.
    place: NodePlace | None = None
    last_tenant_claim_mismatch_at: datetime | None = None


@dataclass(frozen=True)
class QuarantinedView:
    batch_id: int
    batch_seq: int
    window_start: datetime
    window_end: datetime
    quarantined_at: datetime
    error: str


def list_nodes(*, scope: Scope, now: datetime) -> list[NodeView]:
    """Every node with its GPUs, tokens, undelivered and quarantined batches (admins only; others get an
    empty list)."""
    if not scope.is_admin:
        return []
    gpus: dict[int, Counter[str]] = defaultdict(Counter)
    for node_id, model in Gpu.objects.values_list("node_id", "model"):
        gpus[node_id][model] += 1
    tokens: dict[int, list[TokenView]] = defaultdict(list)
    for t in NodeToken.objects.order_by("-created_at", "-id"):
        tokens[t.node_id].append(TokenView(id=t.pk, prefix=t.prefix, created_at=t.created_at,
                                           last_used_at=t.last_used_at, revoked_at=t.revoked_at))
    undelivered = list_open_undelivered()
    quarantined: dict[int, list[QuarantinedView]] = defaultdict(list)
    for b in list_quarantined_batches():
        quarantined[b.node_id].append(QuarantinedView(
            batch_id=b.batch_id, batch_seq=b.batch_seq, window_start=b.window_start, window_end=b.window_end,
            quarantined_at=b.quarantined_at, error=b.error))
    approved = set(approved_gpu_models())
    places = node_places(scope=scope, now=now)
    views = []
    for n in Node.objects.order_by("name"):
        counts = gpus.get(n.pk, Counter())
        views.append(NodeView(
            name=n.name, created_at=n.created_at, last_seen_at=n.last_seen_at,
            stale=n.last_seen_at is not None and now - n.last_seen_at > NODE_STALE_AFTER,
            gpu_count=sum(counts.values()),
            gpu_models=tuple(sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))),
            active_tokens=tuple(t for t in tokens.get(n.pk, []) if t.revoked_at is None),
            revoked_tokens=tuple(t for t in tokens.get(n.pk, []) if t.revoked_at is not None),
            undelivered=tuple(undelivered.get(n.name, ())),
            quarantined=tuple(quarantined.get(n.pk, ())),
            unapproved_models=frozenset(m for m in counts if m not in approved),
            tenant_claim_mismatches=n.tenant_claim_mismatches,
            last_tenant_claim_mismatch_at=n.last_tenant_claim_mismatch_at, place=places.get(n.name),
        ))
    return views


def get_node_token(*, scope: Scope, token_id: int) -> tuple[str, TokenView] | None:
    """(node name, token) of one token, for the revoke confirmation (admins only)."""
    if not scope.is_admin:
        return None
    t = NodeToken.objects.select_related("node").filter(pk=token_id).first()
    if t is None:
        return None
    return t.node.name, TokenView(id=t.pk, prefix=t.prefix, created_at=t.created_at, last_used_at=t.last_used_at,
                                  revoked_at=t.revoked_at)


@dataclass(frozen=True)
class GpuModelView:
    name: str
    approved_at: datetime
    approved_by: str
    note: str
    retired_at: datetime | None
    retired_by: str
    retire_reason: str
    # GPUs in the fleet reporting this name now.
    gpus: int


@dataclass(frozen=True)
class GpuModelsPage:
    # Every name ever approved (retired ones too, marked), in name order.
    models: tuple[GpuModelView, ...]
    # (name, GPUs) reported by nodes and not approved: flagged, their usage unpriced.
    unapproved: tuple[tuple[str, int], ...]


def get_gpu_models_page(*, scope: Scope) -> GpuModelsPage:
    """The approved GPU models and the names nodes report that are not (admins only; others get
    nothing)."""
    if not scope.is_admin:
        return GpuModelsPage(models=(), unapproved=())
    gpus = Counter(Gpu.objects.values_list("model", flat=True))
    return GpuModelsPage(
        models=tuple(GpuModelView(name=m.name, approved_at=m.approved_at, approved_by=m.approved_by, note=m.note,
                                  retired_at=m.retired_at, retired_by=m.retired_by, retire_reason=m.retire_reason,
                                  gpus=gpus.get(m.name, 0))
                     for m in GpuModel.objects.order_by("name")),
        unapproved=tuple(unapproved_fleet_models().items()),
    )
