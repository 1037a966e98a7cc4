"""The fleet view (docs/billing.md, Fleet view): per node and per GPU, what each card cost, what of it
workloads were charged and what stood idle, how busy it was, the energy it drew (priced, and its
CO2e) and its costliest workloads, sorted by a column, and against the previous period. Finance
and admins only (the caller checks the role: every row is every tenant's).

Figures add up as shown: the fleet's card cost is the finance dashboard's total GPU cost to the cent
(its tenants' invoice lines, each rounded once, plus the platform's idle rounded once), and that one
shown total is apportioned over every card's charged and idle parts by the largest remainder
(billing.money.apportion). So a card's cost is its attributed plus its idle, a node's figures are
its cards' sums, and the totals row is the nodes' sums, exactly as displayed.

A page shows `page_size` nodes of the sorted fleet (the CSV every node): the figures are the whole
fleet's whichever page shows them, the totals are over every node, and the nodes on other pages
are one row of their sums (`FleetView.others`), so a page's rows still add up to the total.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from decimal import Decimal

from billing.errors import InvalidInput
from billing.figures import PAGE_PLACES
from billing.ledger import cards as ledger
from billing.ledger import totals
from billing.money import apportion, display_amount, minor_unit_exponent, round_quantities
from billing.queries.trends import Change, PeriodCosts, PreviousPeriod, day_bounds, get_period_costs, previous_period
from billing.scope import Scope

__all__ = ["DEFAULT_PAGE_SIZE", "DEFAULT_SORT", "PAGE_SIZES", "SORTS", "TOP_WORKLOADS", "FleetComparison",
           "FleetFigures", "FleetGpu", "FleetNode", "FleetNodeChange", "FleetOthers", "FleetView", "FleetWorkload",
           "PageOutOfRange", "get_fleet"]

TOP_WORKLOADS = 3
# Column -> the order it sorts in: money, shares and energy costliest (largest) first, names A to Z.
SORTS: dict[str, bool] = {
    "idle_cost": True, "card_cost": True, "attributed": True, "idle_pct": True, "sm_pct": True, "mem_pct": True,
    "energy_kwh": True, "workloads": True, "name": False, "gpu_model": False,
}
DEFAULT_SORT = "idle_cost"  # the cards that earn least of their keep first
# Nodes a page shows: a fleet of 1,000 GPUs on one page was 2.5 MB of HTML and most of a 1.6 s
# answer (docs/benchmarks.md, "The fleet view at 1,000 GPUs"); the CSV keeps every GPU.
PAGE_SIZES = (25, 50, 100)
DEFAULT_PAGE_SIZE = 25
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
    # The page's nodes in its order, then (on the last page) those metered only before.
    nodes: list[FleetNodeChange]
    total: FleetNodeChange
    others: FleetNodeChange | None = None  # every node not in `nodes`, summed; None when there is none


@dataclass(frozen=True)
class FleetOthers:
    """The nodes on other pages, summed as shown: with the page's nodes they add up to the total."""

    nodes: int
    gpus: int
    figures: FleetFigures


class PageOutOfRange(InvalidInput):
    """A page past the last one of the period's nodes."""

    def __init__(self, page: int, pages: int, nodes: int) -> None:
        super().__init__(f"page {page} is past the last page, {pages}, of {nodes} nodes")
        self.page, self.pages, self.nodes = page, pages, nodes


@dataclass(frozen=True)
class FleetView:
    start: datetime
    end: datetime
    currency: str
    sort: str
    nodes: list[FleetNode]  # the page's (every node with page None)
    total: FleetFigures  # the whole fleet's, whichever page
    gpu_count: int  # the whole fleet's
    node_count: int
    page: int = 1
    pages: int = 1
    page_size: int | None = None  # None: every node on one page (the CSV)
    others: FleetOthers | None = None  # the nodes on other pages; None when the page shows every node
    comparison: FleetComparison | None = None

    @property
    def gpus(self) -> list[FleetGpu]:
        """The page's cards, in its order."""
        return [g for n in self.nodes for g in n.gpus]

    @property
    def first_node(self) -> int:
        """The page's first node's position in the sorted fleet, from 1 (0 when it has none)."""
        return (self.page - 1) * (self.page_size or 0) + 1 if self.nodes else 0

    @property
    def last_node(self) -> int:
        return self.first_node + len(self.nodes) - 1 if self.nodes else 0


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


def _shown_parts(*, costs: PeriodCosts, currency: str, cards: Sequence[ledger.CardRow]) -> list[Decimal]:
    """Every card's (attributed, idle) as shown, flat: the finance dashboard's total GPU cost
    (billing.web.tables.shown_costs: the tenants' invoice lines, each rounded once, `costs`, plus
    the platform's idle rounded once) apportioned."""
    idle_platform = sum((c.idle_cost - c.idle_allocated for c in cards), _ZERO)
    total = costs.total + display_amount(idle_platform, currency)
    # One shown total over every card's two parts: each part within a cent of its own figure.
    return apportion(total, [x for c in cards for x in (c.charged, c.idle_cost)],
                     minor_unit_exponent(currency)) if cards else []


def _comparison(*, costs: PeriodCosts, nodes: Sequence[FleetNode], shown: Sequence[FleetNode], last_page: bool,
                total: FleetFigures) -> FleetComparison:
    """The previous period (`costs`: its tenants' figures; billing.queries.trends.previous_period,
    the dashboard's rule) as /fleet/ shows it: one more read of the same cards statement, apportioned
    the same way. Rows for the page's nodes (`shown`, of the sorted fleet's `nodes`), then on the last
    page the nodes metered only before, and one row summing every other node."""
    p_start, p_end = costs.start, costs.end
    currency = totals.get_priced_currency(start=p_start, end=p_end)
    cards = ledger.list_cards(start=p_start, end=p_end)
    parts = _shown_parts(costs=costs, currency=currency, cards=cards)
    before: dict[str, tuple[Decimal, Decimal]] = {}
    for i, c in enumerate(cards):
        card, idle = before.get(c.node, (_ZERO, _ZERO))
        before[c.node] = (card + parts[2 * i] + parts[2 * i + 1], idle + parts[2 * i + 1])

    def change(name: str, now: FleetFigures | None) -> FleetNodeChange:
        card, idle = before.get(name, (_ZERO, _ZERO))
        return FleetNodeChange(name, Change(now.card_cost if now else _ZERO, card),
                               Change(now.idle_cost if now else _ZERO, idle))

    current = {n.name for n in nodes}
    only_before = [name for name in sorted(before) if name not in current]
    rows = [change(n.name, n.figures) for n in shown] + [change(name, None) for name in only_before if last_page]
    previous_total = (sum(parts, _ZERO), sum(parts[1::2], _ZERO))
    fleet = FleetNodeChange("", Change(total.card_cost, previous_total[0]), Change(total.idle_cost, previous_total[1]))

    def rest(figure: str) -> Change:
        # The total less the rows shown: every figure here is a sum of shown figures, so exact.
        whole, listed = getattr(fleet, figure), [getattr(r, figure) for r in rows]
        return Change(whole.current - sum((c.current for c in listed), _ZERO),
                      whole.previous - sum((c.previous for c in listed), _ZERO))

    others = None
    if len(rows) < len(nodes) + len(only_before):
        others = FleetNodeChange("", rest("card_cost"), rest("idle_cost"))
    return FleetComparison(p_start, p_end, rows, fleet, others)


def get_fleet(*, scope: Scope, start: datetime, end: datetime, sort: str = DEFAULT_SORT, page: int | None = 1,
              page_size: int = DEFAULT_PAGE_SIZE, energy_places: int = PAGE_PLACES, compare: bool = True) -> FleetView:
    """Every card with GPU rows in [start, end), by node, sorted by `sort` (one of SORTS; nodes by
    their own figure of it, cards within their node); `page` (from 1) of `page_size` (one of
    PAGE_SIZES) nodes, or every node with page None; energy and kg CO2e shown at `energy_places`;
    with `compare`, against the previous period. Every figure is the whole fleet's, whichever page
    shows it. PageOutOfRange for a page past the last (page 1 always is one, if empty)."""
    if sort not in SORTS:
        raise ValueError(f"unknown sort {sort!r}")
    if page_size not in PAGE_SIZES or (page is not None and page < 1):
        raise ValueError(f"no page {page!r} of {page_size!r} nodes")
    currency = totals.get_priced_currency(start=start, end=end)
    cards = ledger.list_cards(start=start, end=end)
    first, last = start.astimezone(UTC).date(), (end.astimezone(UTC) - _DAY).date()
    # The tenants' figures of the period and of the previous one in one read (their invoice lines).
    periods = [(start, end), day_bounds(*previous_period(first, last))] if compare else [(start, end)]
    costs = get_period_costs(scope=scope, periods=periods)
    parts = _shown_parts(costs=costs[0], currency=currency, cards=cards)
    energy, _ = round_quantities([c.energy_j / _J_PER_KWH for c in cards], energy_places)
    energy_cost = _shown_priced([None if c.energy_cost_jp is None else c.energy_cost_jp / _J_PER_KWH for c in cards],
                                minor_unit_exponent(currency), lambda x: display_amount(x, currency))
    co2e = _shown_priced([None if c.co2e_jkg is None else c.co2e_jkg / _J_PER_KWH for c in cards], energy_places,
                         lambda x: round_quantities([x], energy_places)[1])
    by_node: dict[str, list[FleetGpu]] = {}
    exact_by_node: dict[str, _Exact] = {}
    for i, c in enumerate(cards):
        gpu = FleetGpu(
            node=c.node, gpu_uuid=c.gpu_uuid, gpu_model=c.gpu_model,
            figures=_figures((parts[2 * i], parts[2 * i + 1], energy[i]), (energy_cost[i], co2e[i]), _exact(c),
                             c.workloads),
            workloads=[], more_workloads=0,  # the page's cards get theirs (_with_workloads)
        )
        by_node.setdefault(c.node, []).append(gpu)
        exact_by_node[c.node] = exact_by_node.get(c.node, _Exact()) + _exact(c)
    key = _sort_key(sort)
    nodes = [FleetNode(name, _sum([g.figures for g in gpus], exact_by_node[name]), sorted(gpus, key=key))
             for name, gpus in by_node.items()]
    nodes.sort(key=key)
    total = _sum([n.figures for n in nodes], sum(exact_by_node.values(), _Exact()))
    pages = max(1, -(-len(nodes) // page_size)) if page is not None else 1
    if page is not None and page > pages:
        raise PageOutOfRange(page, pages, len(nodes))
    first_shown, after_shown = (0, len(nodes)) if page is None else ((page - 1) * page_size, page * page_size)
    shown, rest = nodes[first_shown:after_shown], nodes[:first_shown] + nodes[after_shown:]
    others = FleetOthers(len(rest), sum(len(n.gpus) for n in rest),
                         _sum([n.figures for n in rest], sum((exact_by_node[n.name] for n in rest), _Exact()))
                         ) if rest else None
    shown = _with_workloads(start=start, end=end, nodes=shown, currency=currency, every=page is None)
    comparison = _comparison(costs=costs[1], nodes=nodes, shown=shown, last_page=page is None or page == pages,
                             total=total) if compare else None
    return FleetView(start=start, end=end, currency=currency, sort=sort, nodes=shown, total=total,
                     gpu_count=len(cards), node_count=len(nodes), page=page or 1, pages=pages,
                     page_size=None if page is None else page_size, others=others, comparison=comparison)


def _with_workloads(*, start: datetime, end: datetime, nodes: Sequence[FleetNode], currency: str,
                    every: bool) -> list[FleetNode]:
    """The nodes with each card's costliest workloads: one read, of these nodes' cards only (of
    every card when they are `every` node)."""
    cards = None if every else [(g.node, g.gpu_uuid) for n in nodes for g in n.gpus]
    top: dict[tuple[str, str], list[ledger.CardWorkloadRow]] = {}
    for w in ledger.list_card_workloads(start=start, end=end, top=TOP_WORKLOADS, cards=cards) if nodes else []:
        top.setdefault((w.node, w.gpu_uuid), []).append(w)

    def ranked(g: FleetGpu) -> FleetGpu:
        rows = top.get((g.node, g.gpu_uuid), [])
        return replace(g, workloads=[FleetWorkload(w.tenant, w.namespace, w.controller, w.pod, w.pod_uid,
                                                   display_amount(w.cost, currency)) for w in rows],
                       more_workloads=g.figures.workloads - len(rows))

    return [replace(n, gpus=[ranked(g) for g in n.gpus]) for n in nodes]
