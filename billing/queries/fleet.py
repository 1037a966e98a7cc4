"""The fleet view (docs/billing.md, Fleet view): per node and per GPU, what each card cost, what of it
workloads were charged and what stood idle, how busy it was, the energy it drew and its costliest
workloads, sorted by a column. Finance and admins only (the caller checks the role: every row is
every tenant's).

Figures add up as shown: the fleet's card cost is the finance dashboard's total GPU cost to the cent
(its tenants' invoice lines, each rounded once, plus the platform's idle rounded once), and that one
shown total is apportioned over every card's charged and idle parts by the largest remainder
(billing.money.apportion). So a card's cost is its attributed plus its idle, a node's figures are
its cards' sums, and the totals row is the nodes' sums, exactly as displayed.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from decimal import Decimal

from billing.figures import PAGE_PLACES
from billing.ledger import cards as ledger
from billing.ledger import totals
from billing.money import apportion, display_amount, minor_unit_exponent, round_quantities
from billing.queries.figures import get_figure_tree
from billing.scope import Scope

__all__ = ["DEFAULT_SORT", "SORTS", "TOP_WORKLOADS", "FleetFigures", "FleetGpu", "FleetNode", "FleetView",
           "FleetWorkload", "get_fleet", "shown_card_cost"]

TOP_WORKLOADS = 3
# Column -> the order it sorts in: money, shares and energy costliest (largest) first, names A to Z.
SORTS: dict[str, bool] = {
    "idle_cost": True, "card_cost": True, "attributed": True, "idle_pct": True, "sm_pct": True, "mem_pct": True,
    "energy_kwh": True, "workloads": True, "name": False, "gpu_model": False,
}
DEFAULT_SORT = "idle_cost"  # the cards that earn least of their keep first
_J_PER_KWH = Decimal(3_600_000)
_ZERO = Decimal(0)


@dataclass(frozen=True)
class FleetFigures:
    """A card's, a node's or the fleet's figures: money and energy as shown (they add up), shares
    from the exact sums (None where nothing was metered or the inventory lacks the card)."""

    card_cost: Decimal
    attributed: Decimal
    idle_cost: Decimal
    energy_kwh: Decimal
    idle_pct: Decimal | None
    sm_pct: Decimal | None
    mem_pct: Decimal | None
    workloads: int


@dataclass(frozen=True)
class _Exact:
    """The ledger's sums behind a row's shares."""

    card_cost: Decimal = _ZERO
    idle_cost: Decimal = _ZERO
    sm_used_s: Decimal = _ZERO
    sm_capacity_s: Decimal = _ZERO
    mem_used_mb_s: Decimal = _ZERO
    mem_capacity_mb_s: Decimal = _ZERO

    def __add__(self, other: _Exact) -> _Exact:
        return _Exact(*(a + b for a, b in zip(self._values(), other._values(), strict=True)))

    def _values(self) -> tuple[Decimal, ...]:
        return (self.card_cost, self.idle_cost, self.sm_used_s, self.sm_capacity_s, self.mem_used_mb_s,
                self.mem_capacity_mb_s)


@dataclass(frozen=True)
class FleetWorkload:
    tenant: str
    namespace: str
    controller: str
    pod: str
    pod_uid: str
    cost: Decimal  # on this card, charge + idle share, as shown


@dataclass(frozen=True)
class FleetGpu:
    node: str
    gpu_uuid: str
    gpu_model: str
    figures: FleetFigures
    workloads: list[FleetWorkload]  # the costliest TOP_WORKLOADS
    more_workloads: int  # how many others ran on the card

    @property
    def name(self) -> str:
        return self.gpu_uuid


@dataclass(frozen=True)
class FleetNode:
    name: str
    figures: FleetFigures
    gpus: list[FleetGpu] = field(default_factory=list)

    @property
    def gpu_model(self) -> str:
        """Its cards' models, for sorting and showing ("A100, H100")."""
        return ", ".join(sorted({g.gpu_model for g in self.gpus}))


@dataclass(frozen=True)
class FleetView:
    start: datetime
    end: datetime
    currency: str
    sort: str
    nodes: list[FleetNode]
    total: FleetFigures
    gpu_count: int

    @property
    def gpus(self) -> list[FleetGpu]:
        return [g for n in self.nodes for g in n.gpus]


def _pct(part: Decimal, whole: Decimal) -> Decimal | None:
    return part / whole * 100 if whole else None


def _figures(shown: Sequence[Decimal], exact: _Exact, workloads: int) -> FleetFigures:
    """From (attributed, idle, energy) as shown and the exact sums."""
    attributed, idle, energy = shown
    return FleetFigures(
        card_cost=attributed + idle, attributed=attributed, idle_cost=idle, energy_kwh=energy,
        idle_pct=_pct(exact.idle_cost, exact.card_cost), sm_pct=_pct(exact.sm_used_s, exact.sm_capacity_s),
        mem_pct=_pct(exact.mem_used_mb_s, exact.mem_capacity_mb_s), workloads=workloads,
    )


def _sum(figures: Sequence[FleetFigures], exact: _Exact) -> FleetFigures:
    shown = [sum((getattr(f, name) for f in figures), _ZERO) for name in ("attributed", "idle_cost", "energy_kwh")]
    return _figures(shown, exact, sum(f.workloads for f in figures))


def _exact(card: ledger.CardRow) -> _Exact:
    # Usage on a card missing from the inventory stays out with its capacity (as the dashboard's chart).
    known = card.sm_capacity_s is not None and card.mem_capacity_mb_s is not None
    return _Exact(card.card_cost, card.idle_cost, card.sm_used_s if known else _ZERO, card.sm_capacity_s or _ZERO,
                  card.mem_used_mb_s if known else _ZERO, card.mem_capacity_mb_s or _ZERO)


def shown_card_cost(*, scope: Scope, start: datetime, end: datetime, currency: str, idle_platform: Decimal) -> Decimal:
    """The fleet's card cost as the finance dashboard shows it (billing.web.tables.shown_costs): the
    tenants' invoice lines, each rounded once, plus the platform's idle rounded once."""
    # The shallowest tree: the lines (level 0) come with it; namespaces are few.
    tree = get_figure_tree(scope=scope, start=start, end=end, places=PAGE_PLACES, depth="namespace")
    attributed = sum((lines.total for lines in tree.lines.values()), _ZERO)
    return attributed + display_amount(idle_platform, currency)


def _sort_key(sort: str) -> Callable[[FleetNode | FleetGpu], tuple[object, ...]]:
    descending = SORTS[sort]

    def key(row: FleetNode | FleetGpu) -> tuple[object, ...]:
        if sort in ("name", "gpu_model"):
            return (getattr(row, sort), row.name)
        value: Decimal | int | None = getattr(row.figures, sort)
        # Unknown shares last whichever way; ties by name so the order is stable.
        if value is None:
            return (1, _ZERO, row.name)
        return (0, -value if descending else value, row.name)

    return key


def get_fleet(*, scope: Scope, start: datetime, end: datetime, sort: str = DEFAULT_SORT,
              energy_places: int = PAGE_PLACES) -> FleetView:
    """Every card with GPU rows in [start, end), by node, sorted by `sort` (one of SORTS; nodes by
    their own figure of it, cards within their node); energy shown at `energy_places`."""
    if sort not in SORTS:
        raise ValueError(f"unknown sort {sort!r}")
    currency = totals.get_priced_currency(start=start, end=end)
    cards = ledger.list_cards(start=start, end=end)
    top: dict[tuple[str, str], list[ledger.CardWorkloadRow]] = {}
    for w in ledger.list_card_workloads(start=start, end=end, top=TOP_WORKLOADS):
        top.setdefault((w.node, w.gpu_uuid), []).append(w)
    idle_platform = sum((c.idle_cost - c.idle_allocated for c in cards), _ZERO)
    total = shown_card_cost(scope=scope, start=start, end=end, currency=currency, idle_platform=idle_platform)
    # One shown total over every card's two parts: each part within a cent of its own figure.
    parts = apportion(total, [x for c in cards for x in (c.charged, c.idle_cost)],
                      minor_unit_exponent(currency)) if cards else []
    energy, _ = round_quantities([c.energy_j / _J_PER_KWH for c in cards], energy_places)
    by_node: dict[str, list[FleetGpu]] = {}
    exact_by_node: dict[str, _Exact] = {}
    for i, c in enumerate(cards):
        ranked = top.get((c.node, c.gpu_uuid), [])
        count = ranked[0].workloads if ranked else 0
        gpu = FleetGpu(
            node=c.node, gpu_uuid=c.gpu_uuid, gpu_model=c.gpu_model,
            figures=_figures((parts[2 * i], parts[2 * i + 1], energy[i]), _exact(c), count),
            workloads=[FleetWorkload(w.tenant, w.namespace, w.controller, w.pod, w.pod_uid,
                                     display_amount(w.cost, currency)) for w in ranked],
            more_workloads=count - len(ranked),
        )
        by_node.setdefault(c.node, []).append(gpu)
        exact_by_node[c.node] = exact_by_node.get(c.node, _Exact()) + _exact(c)
    key = _sort_key(sort)
    nodes = [FleetNode(name, _sum([g.figures for g in gpus], exact_by_node[name]), sorted(gpus, key=key))
             for name, gpus in by_node.items()]
    nodes.sort(key=key)
    fleet_exact = sum(exact_by_node.values(), _Exact())
    return FleetView(start=start, end=end, currency=currency, sort=sort, nodes=nodes,
                     total=_sum([n.figures for n in nodes], fleet_exact), gpu_count=len(cards))
