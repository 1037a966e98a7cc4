"""Every cost figure a page or document shows of a tenant's usage, computed once (docs/billing.md,
One figure everywhere): the finance dashboard's tenant rows and top workloads, every level of the
drill-down, the portal's workloads and their totals, their CSVs and the invoice's breakdown by
workload all read their numbers from one tree. Pure: the ledger reads the sums
(billing.ledger.allocation.list_figure_rows), billing.queries.figures and the exports build the tree.

The tree of a period: each tenant, then its namespaces, controllers, pods (by name), pod instances
(pod UID), containers and the GPUs they ran on (FIGURE_LEVELS). The exact sums at every node are
Postgres' (billing.ledger.allocation.list_figure_rows, one pass). What a node *shows*:

- **A tenant** shows what its invoice for the period shows: each invoice line (GPU model and SLA
  tier: usage, and idle spread onto it) rounded once to the currency's minor unit, the tenant's
  figure the sum of its rounded lines (billing.money.round_parts, as the close and the upcoming
  invoice round). GPU-hours (equivalent) follow the same rule at the page's places; the other
  quantities are the tenant's sum rounded once.
- **Every other node** shows its share of its parent's shown figure, in proportion to its exact
  figure, by the largest remainder (billing.money.apportion): the rows a row opens add up to it
  exactly, and each is within one unit of the last place of its exact share.

So one node shows one figure on every page: a pod instance on the dashboard's top workloads and on
its portal, a namespace in the drill-down and in its CSV. A grouping that cuts across the levels
(the drill-down's "pod / container" rows, which merge the instances of a pod name) shows the sum
of the nodes it groups, which adds up for the same reason. A requested quantity is unknown (None)
where any part's request was never reported; a node whose parent's is unknown shows its own, rounded.
"""

from __future__ import annotations

import operator
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any, NamedTuple

from billing.money import apportion, apportion_units, minor_unit_exponent, round_parts, round_quantities

__all__ = [
    "FIGURE_LEVELS",
    "LEVELS",
    "PAGE_PLACES",
    "FigureNode",
    "FigureRow",
    "FigureTree",
    "Figures",
    "TenantLines",
    "build_tree",
    "exact_sum",
    "figure_key",
    "group_nodes",
    "shown_sum",
    "total",
]

# The levels a tenant's figures open into, top down; "gpu" is a card on its node: the keys node and gpu.
FIGURE_LEVELS = ("namespace", "controller", "pod", "pod_uid", "container", "gpu")
# Quantities on the pages and in the invoice's usage by workload: 2 places (the CSVs ask for
# billing.money.QUANTITY_PLACES).
PAGE_PLACES = 2


class FigureRow(NamedTuple):
    """Usage summed at one node of a tenant's figure tree, or on one of its invoice lines, ledger
    units. `level` 0 is a line: keys (tenant, gpu_model, sla_tier); level n >= 1 is the tenant's path
    down to FIGURE_LEVELS[n - 1]: keys (tenant, namespace, ..., and at "gpu" node then gpu). A named
    tuple, as the allocation API's rows (docs/architecture.md, "Per-pod allocation reads"): a month's
    portal reads ~10k of them at 1,000 GPUs, and a frozen dataclass set each of its 25 fields through
    `object.__setattr__` (2.8 µs a row, against 0.3 µs built by position)."""

    level: int
    keys: tuple[str, ...]
    containers: tuple[str, ...]  # sorted
    sla_tiers: tuple[str, ...]  # sorted
    first_hour: datetime  # start of the first ledger hour with usage
    last_hour: datetime  # start of the last
    seconds: Decimal
    share_gpu_s: Decimal
    charge: Decimal
    idle_share: Decimal
    mem_used_mb_s: Decimal
    mem_granted_mb_s: Decimal
    mem_requested_mb_s: Decimal | None
    sm_used_s: Decimal
    sm_granted_s: Decimal
    sm_requested_s: Decimal | None
    # GPU energy attributed by the ledger's split of each card's energy (docs/billing.md, Energy), joules.
    energy_j: Decimal = Decimal(0)
    # Σ joules × price per kWh and × kg CO2e per kWh of each row's location on its date
    # (billing.ledger.energy); None where some of the energy had no price (no factor).
    energy_cost_jp: Decimal | None = None
    co2e_jkg: Decimal | None = None


LEVELS = ("tenant", *FIGURE_LEVELS)
_S_PER_H = Decimal(3600)
_MB_S_PER_GB_H = Decimal(1024 * 3600)  # GB·h as the pages write them (GiB, 1024 MB)
_J_PER_KWH = Decimal(3_600_000)
_ZERO = Decimal(0)


@dataclass(frozen=True)
class Figures:
    """One node's figures: exact (ledger precision) or as shown. Requested quantities are None
    when unknown."""

    cost: Decimal
    gpu_hours: Decimal
    mem_used_gb_h: Decimal
    mem_granted_gb_h: Decimal
    mem_requested_gb_h: Decimal | None
    sm_used_h: Decimal
    sm_granted_h: Decimal
    sm_requested_h: Decimal | None
    energy_kwh: Decimal
    # What that energy cost and emitted where it was drawn (docs/billing.md, Energy): None where some of
    # it had no price (no CO2e factor). Information beside the cost, never part of it.
    energy_cost: Decimal | None = None
    co2e_kg: Decimal | None = None

    def __add__(self, other: Figures) -> Figures:
        return _from_columns({name: _add(getattr(self, name), getattr(other, name)) for name in _NAMES})


_NAMES = tuple(f.name for f in fields(Figures))
_all_figures = operator.attrgetter(*_NAMES)  # a Figures' values in _NAMES' order
ZERO_FIGURES = Figures(*(_ZERO for _ in _NAMES))
# Figures in money, shown to the currency's minor unit; the rest are quantities, at the tree's places.
_MONEY = frozenset({"cost", "energy_cost"})


def _add(a: Decimal | None, b: Decimal | None) -> Decimal | None:
    return None if a is None or b is None else a + b


def _from_columns(values: Mapping[str, Decimal | None]) -> Figures:
    """Figures from name -> value; only the requested quantities may be unknown."""
    def known(name: str) -> Decimal:
        value = values[name]
        if value is None:
            raise ValueError(f"{name} is never unknown")
        return value

    return Figures(
        cost=known("cost"), gpu_hours=known("gpu_hours"), mem_used_gb_h=known("mem_used_gb_h"),
        mem_granted_gb_h=known("mem_granted_gb_h"), mem_requested_gb_h=values["mem_requested_gb_h"],
        sm_used_h=known("sm_used_h"), sm_granted_h=known("sm_granted_h"), sm_requested_h=values["sm_requested_h"],
        energy_kwh=known("energy_kwh"), energy_cost=values["energy_cost"], co2e_kg=values["co2e_kg"],
    )


def total(figures: Iterable[Figures]) -> Figures:
    """The sum of several nodes' figures (unknown where any is unknown)."""
    out = ZERO_FIGURES
    for f in figures:
        out += f
    return out


@dataclass(frozen=True)
class TenantLines:
    """A tenant's invoice lines of the period as shown: usage and idle share, each line rounded once
    to the currency's minor unit, and their sums (the dashboard's columns)."""

    charge: Decimal
    idle_share: Decimal

    @property
    def total(self) -> Decimal:
        return self.charge + self.idle_share


@dataclass
class FigureNode:
    keys: tuple[str, ...]  # the path from the tenant: (tenant, namespace, ...); at "gpu" node then gpu
    level: int  # index into LEVELS
    exact: Figures
    seconds: Decimal  # metered workload-seconds (per GPU), for means per second
    containers: tuple[str, ...] = ()
    sla_tiers: tuple[str, ...] = ()
    first_hour: datetime | None = None  # start of the first ledger hour with usage
    last_hour: datetime | None = None  # start of the last
    row: FigureRow | None = None  # the ledger's sums of this node (None for a tenant: its lines')
    children: dict[tuple[str, ...], FigureNode] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return self.keys[-1]

    def key(self, level: str) -> str:
        """This node's value of `level` (a level at or above its own)."""
        index = LEVELS.index(level)
        return self.keys[index] if level != "gpu" else self.keys[index + 1]


@dataclass
class FigureTree:
    """The period's figures, every tenant of the scope (and filters) with usage. Quantities are
    shown at `places`, money at the currency's minor unit."""

    currency: str
    places: int
    roots: dict[str, FigureNode]
    lines: dict[str, TenantLines]
    _line_quantities: dict[str, Decimal]
    # Each tenant's (charge, idle share) per invoice line, ledger precision, in the lines' order (GPU
    # model, SLA tier): what `lines` rounds, and what a month to date is made of
    # (billing.ledger.spend.TenantSpend.lines).
    line_sums: dict[str, tuple[tuple[Decimal, Decimal], ...]] = field(default_factory=dict)
    _shown: dict[tuple[str, ...], Figures] = field(default_factory=dict)
    # An opened parent's children's shown figures by column (_Column), and each child's position in
    # them: a child's Figures is made when it is asked for (a page shows a few hundred of the ~10k
    # children a month's portal opens at 1,000 GPUs).
    _opened: dict[tuple[str, ...], tuple[dict[tuple[str, ...], int], list[_Column]]] = field(default_factory=dict)

    @property
    def money_places(self) -> int:
        return minor_unit_exponent(self.currency)

    def shown(self, node: FigureNode) -> Figures:
        """The node's figures as every page shows them (module docstring)."""
        known = self._shown.get(node.keys)
        if known is None:
            if node.level == 0:
                known = self._root(node)
            else:
                parent = self.roots[node.keys[0]]
                for i in range(1, node.level):
                    parent = parent.children[node.keys[: _depth_len(i)]]
                positions, columns = self._opened.get(parent.keys) or self._open(parent)
                at = positions[node.keys]
                # By position: a parent's and its children's known figures are known (_open).
                values: tuple[Any, ...] = tuple(_cell(column, at) for column in columns)
                known = Figures(*values)
            self._shown[node.keys] = known
        return known

    def nodes(self, level: str, where: Mapping[str, str] | None = None) -> list[FigureNode]:
        """The nodes of `level` whose path matches every (level -> value) of `where`."""
        depth = LEVELS.index(level)
        conditions = dict(where or {})
        out: list[FigureNode] = []

        def walk(node: FigureNode) -> None:
            name = LEVELS[node.level]
            if name in conditions and node.key(name) != conditions[name]:
                return
            if node.level == depth:
                out.append(node)
                return
            for child in node.children.values():
                walk(child)

        for root in self.roots.values():
            walk(root)
        return out

    def _places(self, name: str) -> int:
        return self.money_places if name in _MONEY else self.places

    def _root(self, node: FigureNode) -> Figures:
        """A tenant: its invoice lines' rule for cost and GPU-hours, its sums rounded once for the rest."""
        tenant = node.keys[0]
        rounded = {name: _rounded(getattr(node.exact, name), self._places(name)) for name in _NAMES}
        return _from_columns({**rounded, "cost": self.lines[tenant].total, "gpu_hours": self._line_quantities[tenant]})

    def _open(self, parent: FigureNode) -> tuple[dict[tuple[str, ...], int], list[_Column]]:
        """Every child of `parent` shown: the parent's shown figure apportioned over them, by column
        (_NAMES' order, Figures' fields), and each child's position in the columns."""
        above = self.shown(parent)
        children = list(parent.children.values())
        if len(children) == 1:
            only = children[0]
            opened = self._opened[parent.keys] = ({only.keys: 0}, self._only_child(above, only.exact))
            return opened
        columns: dict[str, _Column] = {}
        # The children's figures by column, each child's read at once: a month's controller has
        # hundreds of pods at 1,000 GPUs, and a getattr per pod and figure was 5 % of opening them.
        by_column = zip(*(_all_figures(c.exact) for c in children), strict=True) if children else ((),) * len(_NAMES)
        for name, parts_of in zip(_NAMES, by_column, strict=True):
            places = self._places(name)
            whole = getattr(above, name)
            parts = list(parts_of)
            if whole is None or any(p is None for p in parts):
                # Unknown above: each child that is known is a figure of its own, rounded once.
                columns[name] = (parts, places, _ROUND)
            elif whole >= 0 and min(parts) >= 0:
                columns[name] = (apportion_units(whole, parts, places), places, _UNITS)
            else:  # apportion's own way with signs: a share of a negative whole, or its refusal
                columns[name] = (apportion(whole, parts, places), places, _AS_IS)
        # Figures are built by position from these (_NAMES is Figures' field order), and what
        # _from_columns checks holds here (a parent's and its children's known figures are known).
        opened = self._opened[parent.keys] = ({c.keys: i for i, c in enumerate(children)},
                                              [columns[name] for name in _NAMES])
        return opened


    def _only_child(self, above: Figures, exact: Figures) -> list[_Column]:
        """_open's columns for a parent of one child: what apportion gives a single part, its parent's
        shown figure (a multiple of the column's unit), without apportion's checks of a split that
        has nothing to split: a month's CSV opens each of ~10k pods into its one instance at 1,000
        GPUs, 11 columns each, and those calls were a fifth of it. A figure of another sign than its
        parent's goes through apportion, which refuses it."""
        columns: list[_Column] = []
        for name, whole, part in zip(_NAMES, _all_figures(above), _all_figures(exact), strict=True):
            places = self._places(name)
            if whole is None or part is None:
                columns.append(([part], places, _ROUND))
            elif whole >= 0 and part >= 0:
                # apportion's one part: the whole in units of the last place.
                columns.append(([int(whole.scaleb(places))], places, _UNITS))
            else:
                columns.append((apportion(whole, [part], places), places, _AS_IS))
        return columns


# How an opened column holds its children's shown figures: as they are; as whole units of its last
# place (apportion_units: a Decimal is made for the few children a page shows, not the ~10k a
# month's portal opens at 1,000 GPUs); or as exact figures, each rounded once when shown (unknown
# above).
_AS_IS, _UNITS, _ROUND = 0, 1, 2
_Column = tuple[Sequence[Any], int, int]  # (values, places, how)


def _cell(column: _Column, at: int) -> Decimal | None:
    """The shown figure at position `at` of an opened column."""
    values, places, how = column
    value = values[at]
    if how == _UNITS:
        # Exactly `places` decimals (the exponent -places), as apportion writes a share.
        return Decimal(value).scaleb(-places)
    if how == _ROUND:
        return _rounded(value, places)
    return value  # type: ignore[no-any-return]


def _depth_len(level: int) -> int:
    """Length of a node's keys at `level` (the "gpu" level has two: node and gpu)."""
    return level + 1 if LEVELS[level] != "gpu" else level + 2


def _rounded(value: Decimal | None, places: int) -> Decimal | None:
    return None if value is None else round_quantities([value], places)[0][0]


def _figures(row: FigureRow) -> Figures:
    return Figures(
        cost=row.charge + row.idle_share, gpu_hours=row.share_gpu_s / _S_PER_H,
        mem_used_gb_h=row.mem_used_mb_s / _MB_S_PER_GB_H, mem_granted_gb_h=row.mem_granted_mb_s / _MB_S_PER_GB_H,
        mem_requested_gb_h=None if row.mem_requested_mb_s is None else row.mem_requested_mb_s / _MB_S_PER_GB_H,
        sm_used_h=row.sm_used_s / _S_PER_H, sm_granted_h=row.sm_granted_s / _S_PER_H,
        sm_requested_h=None if row.sm_requested_s is None else row.sm_requested_s / _S_PER_H,
        energy_kwh=row.energy_j / _J_PER_KWH,
        energy_cost=None if row.energy_cost_jp is None else row.energy_cost_jp / _J_PER_KWH,
        co2e_kg=None if row.co2e_jkg is None else row.co2e_jkg / _J_PER_KWH,
    )


def build_tree(rows: Sequence[FigureRow], *, currency: str, places: int) -> FigureTree:
    """The tree of list_figure_rows' rows (pure; tests build trees from hand-made rows)."""
    charges: dict[str, list[Decimal]] = defaultdict(list)
    idles: dict[str, list[Decimal]] = defaultdict(list)
    hours: dict[str, list[Decimal]] = defaultdict(list)
    line_exact: dict[str, Figures] = {}
    line_seconds: dict[str, Decimal] = defaultdict(Decimal)
    by_level: dict[int, list[FigureRow]] = defaultdict(list)
    by_line: dict[str, list[FigureRow]] = defaultdict(list)
    for r in rows:
        if r.level == 0:
            tenant = r.keys[0]
            by_line[tenant].append(r)
            charges[tenant].append(r.charge)
            idles[tenant].append(r.idle_share)
            hours[tenant].append(r.share_gpu_s / _S_PER_H)
            line_exact[tenant] = line_exact.get(tenant, ZERO_FIGURES) + _figures(r)
            line_seconds[tenant] += r.seconds
        else:
            by_level[r.level].append(r)
    roots = {t: FigureNode((t,), 0, line_exact[t], line_seconds[t]) for t in sorted(line_exact)}
    index: dict[tuple[str, ...], FigureNode] = {(t,): n for t, n in roots.items()}
    for level in sorted(by_level):
        for r in sorted(by_level[level], key=lambda r: r.keys):
            node = FigureNode(tuple(r.keys), level, _figures(r), r.seconds, r.containers, r.sla_tiers, r.first_hour,
                              r.last_hour, r)
            parent = index[node.keys[: _depth_len(level - 1)]]
            parent.children[node.keys] = node
            index[node.keys] = node
    lines = {t: TenantLines(round_parts(charges[t], currency)[1], round_parts(idles[t], currency)[1]) for t in roots}
    quantities = {t: round_quantities(hours[t], places)[1] for t in roots}
    sums = {t: tuple((r.charge, r.idle_share) for r in sorted(by_line[t], key=lambda r: r.keys)) for t in roots}
    return FigureTree(currency, places, roots, lines, quantities, sums)


def shown_sum(tree: FigureTree, nodes: Iterable[FigureNode]) -> Figures:
    """What a row grouping several nodes shows: the sum of their shown figures."""
    return total(tree.shown(n) for n in nodes)


def exact_sum(nodes: Iterable[FigureNode]) -> Figures:
    return total(n.exact for n in nodes)


def group_nodes(nodes: Iterable[FigureNode], key: Callable[[FigureNode], tuple[str, ...]]
                ) -> dict[tuple[str, ...], list[FigureNode]]:
    """Nodes grouped by `key`, in first-seen order."""
    out: dict[tuple[str, ...], list[FigureNode]] = {}
    for n in nodes:
        out.setdefault(key(n), []).append(n)
    return out


def figure_key(kind: str, start: datetime | None = None, end: datetime | None = None, **scope: object) -> str:
    """The identity of a figure, written on the page beside it (`data-figure`), so that the same
    figure shown on two pages, two drill-down levels or in two languages can be found and compared
    (tests/test_page_sums.py): its kind, its period's bounds (UTC, ISO) and what narrows it (tenant,
    namespace, ... and any filter), in a fixed order. One figure, one key, wherever it is shown."""
    bounds = [b.astimezone(UTC).isoformat() if b else "" for b in (start, end)]
    narrowed = [f"{k}={v}" for k, v in sorted(scope.items()) if v]
    return "|".join([kind, *bounds, *narrowed])
