"""An invoice's usage by workload (docs/billing.md, Workload breakdown): each workload of the
tenant's month exactly as the drill-down's controller level shows it, read from the same figure tree
(billing.figures): the tenant's figure (its invoice lines of the month, usage and the idle spread
onto them, each rounded once) apportioned to its namespaces, then each namespace's to its
controllers, by the largest remainder. Apportioning a line straight to workloads would round once
instead of twice and could differ from the drill-down by a cent; reading the tree cannot.

So the workloads add up to the tenant's figure, the sum of the invoice's own-month lines, not line
by line: the tree has no GPU model or SLA tier below the tenant. Pure: the close reads the tree
(`read_month_tree`) and stores the result with the lines."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal

from billing.figures import LEVELS, FigureTree, build_tree
from billing.ledger.allocation import list_figure_rows
from billing.ledger.totals import get_priced_currency
from billing.money import to_minor_units

__all__ = ["BREAKDOWN_LEVEL", "WorkloadAmount", "read_month_tree", "workloads_of"]

# The drill-down's level whose rows the breakdown repeats: a namespace's controllers (`<kind>:<name>`,
# `__unallocated__` for pods no controller was reported for).
BREAKDOWN_LEVEL = "controller"


@dataclass(frozen=True)
class WorkloadAmount:
    namespace: str
    workload: str
    gpu_hours: Decimal  # as the tree shows it, at the tree's places
    amount_minor: int


def read_month_tree(*, start: datetime, end: datetime, places: int) -> FigureTree:
    """The figure tree of [start, end) down to the breakdown's level, every tenant, no filters: the
    read the drill-down makes (billing.queries.figures), whose per-tenant figures do not depend on
    the other tenants read with it."""
    rows = list_figure_rows(start=start, end=end, depth=LEVELS.index(BREAKDOWN_LEVEL), filters={}, tenants=None).rows
    return build_tree(rows, currency=get_priced_currency(start=start, end=end), places=places)


def workloads_of(tree: FigureTree, tenant: str) -> list[WorkloadAmount]:
    """The tenant's workloads as the tree shows them, ordered by namespace and workload; none when
    the tree has no usage of the tenant (an invoice of adjustments only)."""
    out = []
    for node in tree.nodes(BREAKDOWN_LEVEL, {"tenant": tenant}):
        shown = tree.shown(node)
        out.append(WorkloadAmount(namespace=node.key("namespace"), workload=node.key(BREAKDOWN_LEVEL),
                                  gpu_hours=shown.gpu_hours, amount_minor=to_minor_units(shown.cost, tree.currency)))
    return sorted(out, key=lambda w: (w.namespace, w.workload))
