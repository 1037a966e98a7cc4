"""What each node of a figure tree shows (billing.figures): its parent's shown figure apportioned over
the parent's children by their exact figures, column by column, each child within a unit of the last
place of its share; a figure unknown above or in a child is that child's own, rounded. On random
trees whose parents have one child or several (a parent of one child skips apportion's checks and
must give what apportion gives, exponent included)."""

from __future__ import annotations

from dataclasses import fields
from datetime import UTC, datetime
from decimal import Decimal

from hypothesis import given, settings
from hypothesis import strategies as st

from billing.figures import LEVELS, FigureRow, Figures, FigureTree, build_tree
from billing.money import apportion, round_quantities

HOUR = datetime(2026, 3, 1, tzinfo=UTC)
DEPTH = LEVELS.index("pod_uid")  # tenant's levels down to pod instances
_amount = st.integers(0, 10**15).map(lambda n: Decimal(n).scaleb(-12))
_known_or_not = st.one_of(st.none(), _amount)


@st.composite
def _rows(draw: st.DrawFn) -> list[FigureRow]:
    """A tenant's invoice line and its tree down to pod instances: 1-3 children per node."""

    def row(level: int, keys: tuple[str, ...]) -> FigureRow:
        return FigureRow(level, keys, ("main",), ("gold",), HOUR, HOUR, draw(_amount), draw(_amount), draw(_amount),
                         draw(_amount), draw(_amount), draw(_amount), draw(_known_or_not), draw(_amount), draw(_amount),
                         draw(_known_or_not), energy_j=draw(_amount), energy_cost_jp=draw(_known_or_not),
                         co2e_jkg=draw(_known_or_not))

    rows = [row(0, ("acme", "A100", "gold"))]
    paths: list[tuple[str, ...]] = [("acme",)]
    for level in range(1, DEPTH + 1):
        children = []
        for path in paths:
            for i in range(draw(st.integers(1, 3))):
                child = (*path, f"{LEVELS[level]}-{i}")
                rows.append(row(level, child))
                children.append(child)
        paths = children
    return rows


def _expected(tree: FigureTree, name: str, whole: Decimal | None, parts: list[Decimal | None], at: int) -> Decimal | None:
    places = tree.money_places if name in ("cost", "energy_cost") else tree.places
    if whole is None or any(p is None for p in parts):
        part = parts[at]
        return None if part is None else round_quantities([part], places)[0][0]
    return apportion(whole, [p for p in parts if p is not None], places)[at]


@settings(max_examples=60, deadline=None)
@given(rows=_rows(), places=st.integers(0, 3))
def test_each_node_shows_its_parents_figure_apportioned_over_its_siblings(rows: list[FigureRow], places: int) -> None:
    tree = build_tree(rows, currency="USD", places=places)
    names = [f.name for f in fields(Figures)]
    for level in LEVELS[1:DEPTH + 1]:
        for node in tree.nodes(level):
            parent = tree.roots["acme"]
            for depth in range(1, node.level):
                parent = parent.children[node.keys[: depth + 1]]
            siblings = list(parent.children.values())
            at = siblings.index(node)
            above, shown = tree.shown(parent), tree.shown(node)
            for name in names:
                want = _expected(tree, name, getattr(above, name), [getattr(s.exact, name) for s in siblings], at)
                got = getattr(shown, name)
                # To the last digit and exponent: pages write a figure as it is.
                assert (got is None and want is None) or (got is not None and want is not None
                                                          and got.as_tuple() == want.as_tuple()), (node.keys, name)
