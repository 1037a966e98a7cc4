"""The fleet view (docs/billing.md, Fleet view): per node and per GPU, what each card cost, what of it
workloads were charged and what stood idle, how busy it was, the energy it drew (priced, and its
CO2e) and its costliest workloads, sorted by a column, and against the previous period. Finance
and admins only (the caller checks the role: every row is every tenant's).

Figures add up as shown: the fleet's card cost is the finance dashboard's total GPU cost to the cent
(its tenants' invoice lines, each rounded once, plus the platform's idle rounded once), and that one
shown total is apportioned over every card's charged and idle parts by the largest remainder
(billing.money.apportion). So a card's cost is its attributed plus its idle, a node's figures are
its cards' sums, and the totals row is the nodes' sums, exactly as displayed.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from decimal import Decimal

from billing.figures import PAGE_PLACES
from billing.ledger import cards as ledger
from billing.ledger import totals
from billing.money import apportion, display_amount, minor_unit_exponent, round_quantities
from billing.queries.figures import get_figure_tree
from billing.queries.trends import Change, PreviousPeriod, day_bounds, previous_period
from billing.scope import Scope

__all__ = ["DEFAULT_SORT", "SORTS", "TOP_WORKLOADS", "FleetComparison", "FleetFigures", "FleetGpu", "FleetNode",
           "FleetNodeChange", "FleetView", "FleetWorkload", "get_fleet", "shown_card_cost"]

TOP_WORKLOADS = 3
# Column -> the order it sorts in: money, shares and energy costliest (largest) first, names A to Z.
SORTS: dict[str, bool] = {
    "idle_cost": True, "card_cost": True, "attributed": True, "idle_pct": True, "sm_pct": True, "mem_pct": True,
    "energy_kwh": True, "workloads": True, "name": False, "gpu_model": False,
}
DEFAULT_SORT = "idle_cost"  # the cards that earn least of their keep first
_J_PER_KWH = Decimal(3_600_000)
_ZERO = Decimal(0)
_DAY = timedelta(days=1)


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
    # The energy priced and its emissions at the node's location, as shown (they add up too); None
    # where some of the energy had no price (no CO2e factor). Information, never part of the cost.
    energy_cost: Decimal | None = None
    co2e_kg: Decimal | None = None


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
class FleetNodeChange:
    """A node's (or the fleet's) card cost and idle cost against the previous period's, as /fleet/
    shows each period; a node metered in only one of them is compared at 0 in the other."""

    name: str
    card_cost: Change
    idle_cost: Change


@dataclass(frozen=True)
class FleetComparison(PreviousPeriod):
    nodes: list[FleetNodeChange]  # the page's nodes in its order, then those metered only before
    total: FleetNodeChange


@dataclass(frozen=True)
class FleetView:
    start: datetime
    end: datetime
    currency: str
    sort: str
    nodes: list[FleetNode]
    total: FleetFigures
    gpu_count: int
    comparison: FleetComparison | None = None

    @property
    def gpus(self) -> list[FleetGpu]:
        return [g for n in self.nodes for g in n.gpus]


def _pct(part: Decimal, whole: Decimal) -> Decimal | None:
    return part / whole * 100 if whole else None


def _figures(shown: Sequence[Decimal], priced: Sequence[Decimal | None], exact: _Exact, workloads: int) -> FleetFigures:
    """From (attributed, idle, energy) and (energy cost, kg CO2e) as shown and the exact sums."""
    attributed, idle, energy = shown
    return FleetFigures(
        card_cost=attributed + idle, attributed=attributed, idle_cost=idle, energy_kwh=energy,
        idle_pct=_pct(exact.idle_cost, exact.card_cost), sm_pct=_pct(exact.sm_used_s, exact.sm_capacity_s),
        mem_pct=_pct(exact.mem_used_mb_s, exact.mem_capacity_mb_s), workloads=workloads,
        energy_cost=priced[0], co2e_kg=priced[1],
    )


def _known_sum(values: Sequence[Decimal | None]) -> Decimal | None:
    """The sum of shown figures, unknown if any of them is."""
    if any(v is None for v in values):
        return None
    return sum((v for v in values if v is not None), _ZERO)


def _sum(figures: Sequence[FleetFigures], exact: _Exact) -> FleetFigures:
    shown = [sum((getattr(f, name) for f in figures), _ZERO) for name in ("attributed", "idle_cost", "energy_kwh")]
    priced = [_known_sum([getattr(f, name) for f in figures]) for name in ("energy_cost", "co2e_kg")]
    return _figures(shown, priced, exact, sum(f.workloads for f in figures))


def _shown_priced(exact: Sequence[Decimal | None], places: int,
                  rounded: Callable[[Decimal], Decimal]) -> list[Decimal | None]:
    """Each card's energy cost (or kg CO2e) as shown: the known cards' exact sum rounded once
    (`rounded`, billing.money) and apportioned over them by the largest remainder, so the cards
    add up to it as shown; None stays None (no price: "—", never 0)."""
    known = [x for x in exact if x is not None]
    shares = iter(apportion(rounded(sum(known, _ZERO)), known, places) if known else [])
    return [None if x is None else next(shares) for x in exact]


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


def _shown_parts(*, scope: Scope, start: datetime, end: datetime, currency: str,
                 cards: Sequence[ledger.CardRow]) -> list[Decimal]:
    """Every card's (attributed, idle) as shown, flat: the dashboard's total GPU cost apportioned."""
    idle_platform = sum((c.idle_cost - c.idle_allocated for c in cards), _ZERO)
    total = shown_card_cost(scope=scope, start=start, end=end, currency=currency, idle_platform=idle_platform)
    # One shown total over every card's two parts: each part within a cent of its own figure.
    return apportion(total, [x for c in cards for x in (c.charged, c.idle_cost)],
                     minor_unit_exponent(currency)) if cards else []


def _comparison(*, scope: Scope, start: datetime, end: datetime, nodes: Sequence[FleetNode],
                total: FleetFigures) -> FleetComparison:
    """The previous period (billing.queries.trends.previous_period, the dashboard's rule) as /fleet/
    shows it: one more read of the same cards statement, apportioned the same way."""
    first, last = start.astimezone(UTC).date(), (end.astimezone(UTC) - _DAY).date()
    p_start, p_end = day_bounds(*previous_period(first, last))
    currency = totals.get_priced_currency(start=p_start, end=p_end)
    cards = ledger.list_cards(start=p_start, end=p_end)
    parts = _shown_parts(scope=scope, start=p_start, end=p_end, currency=currency, cards=cards)
    before: dict[str, tuple[Decimal, Decimal]] = {}
    for i, c in enumerate(cards):
        card, idle = before.get(c.node, (_ZERO, _ZERO))
        before[c.node] = (card + parts[2 * i] + parts[2 * i + 1], idle + parts[2 * i + 1])

    def change(name: str, now: FleetFigures | None) -> FleetNodeChange:
        card, idle = before.get(name, (_ZERO, _ZERO))
        return FleetNodeChange(name, Change(now.card_cost if now else _ZERO, card),
                               Change(now.idle_cost if now else _ZERO, idle))

    shown = {n.name for n in nodes}
    rows = [change(n.name, n.figures) for n in nodes] + [change(name, None) for name in sorted(before)
                                                         if name not in shown]
    previous_total = (sum(parts, _ZERO), sum(parts[1::2], _ZERO))
    return FleetComparison(p_start, p_end, rows, FleetNodeChange("", Change(total.card_cost, previous_total[0]),
                                                                 Change(total.idle_cost, previous_total[1])))


def get_fleet(*, scope: Scope, start: datetime, end: datetime, sort: str = DEFAULT_SORT,
              energy_places: int = PAGE_PLACES, compare: bool = True) -> FleetView:
    """Every card with GPU rows in [start, end), by node, sorted by `sort` (one of SORTS; nodes by
    their own figure of it, cards within their node); energy and kg CO2e shown at `energy_places`;
    with `compare`, against the previous period."""
    if sort not in SORTS:
        raise ValueError(f"unknown sort {sort!r}")
    currency = totals.get_priced_currency(start=start, end=end)
    cards = ledger.list_cards(start=start, end=end)
    top: dict[tuple[str, str], list[ledger.CardWorkloadRow]] = {}
    for w in ledger.list_card_workloads(start=start, end=end, top=TOP_WORKLOADS):
        top.setdefault((w.node, w.gpu_uuid), []).append(w)
    parts = _shown_parts(scope=scope, start=start, end=end, currency=currency, cards=cards)
    energy, _ = round_quantities([c.energy_j / _J_PER_KWH for c in cards], energy_places)
    energy_cost = _shown_priced([None if c.energy_cost_jp is None else c.energy_cost_jp / _J_PER_KWH for c in cards],
                                minor_unit_exponent(currency), lambda x: display_amount(x, currency))
    co2e = _shown_priced([None if c.co2e_jkg is None else c.co2e_jkg / _J_PER_KWH for c in cards], energy_places,
                         lambda x: round_quantities([x], energy_places)[1])
    by_node: dict[str, list[FleetGpu]] = {}
    exact_by_node: dict[str, _Exact] = {}
    for i, c in enumerate(cards):
        ranked = top.get((c.node, c.gpu_uuid), [])
        count = ranked[0].workloads if ranked else 0
        gpu = FleetGpu(
            node=c.node, gpu_uuid=c.gpu_uuid, gpu_model=c.gpu_model,
            figures=_figures((parts[2 * i], parts[2 * i + 1], energy[i]), (energy_cost[i], co2e[i]), _exact(c), count),
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
    total = _sum([n.figures for n in nodes], fleet_exact)
    comparison = _comparison(scope=scope, start=start, end=end, nodes=nodes, total=total) if compare else None
    return FleetView(start=start, end=end, currency=currency, sort=sort, nodes=nodes, total=total,
                     gpu_count=len(cards), comparison=comparison)
