"""The figure tree of a period for a caller (billing.figures: every cost figure a page shows,
computed once), read for the caller's scope: the ledger's sums (one pass), the currency of the
period's priced rows, the tree built."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime

from billing.figures import LEVELS, FigureTree, build_tree
from billing.ledger import allocation as ledger
from billing.ledger.totals import get_priced_currency
from billing.scope import Scope

__all__ = ["get_figure_tree", "get_top_figure_tree"]


def get_figure_tree(*, scope: Scope, start: datetime, end: datetime, places: int, depth: str = "gpu",
                    filters: Mapping[str, Sequence[str]] | None = None) -> FigureTree:
    """The figures of [start, end) of the scope's tenants (and rows matching `filters`: allocation
    keys -> allowed values), down to the level `depth`, quantities shown at `places`."""
    currency = get_priced_currency(start=start, end=end)
    if scope.tenants is not None and not scope.tenants:
        return build_tree([], currency=currency, places=places)
    read = ledger.list_figure_rows(start=start, end=end, depth=LEVELS.index(depth), filters=dict(filters or {}),
                                   tenants=scope.tenants)
    return build_tree(read.rows, currency=currency, places=places)


def get_top_figure_tree(*, scope: Scope, start: datetime, end: datetime, places: int, top_pods: int,
                        top_order: Sequence[str] = ()) -> tuple[FigureTree, dict[str, int]]:
    """The figure tree of [start, end) for a page that shows the tenants and the `top_pods` costliest
    pod instances only: whole down to controllers, and below them only the pods those few are
    apportioned among (billing.ledger.allocation.list_figure_rows), with each tenant's count of pod
    instances (`top_order`: the levels that rank pods of equal cost, default the path). Those tenants'
    and pods' shown figures are the whole tree's; the tree's other pods are missing or partial, so
    nothing else may be read from its pod levels."""
    currency = get_priced_currency(start=start, end=end)
    if scope.tenants is not None and not scope.tenants:
        return build_tree([], currency=currency, places=places), {}
    read = ledger.list_figure_rows(start=start, end=end, depth=LEVELS.index("pod_uid"), filters={},
                                   tenants=scope.tenants, top_pods=top_pods, top_order=top_order)
    return build_tree(read.rows, currency=currency, places=places), read.pod_instances
