"""The drill-down (docs/drilldown.md): tenant → namespace → controller → pod → GPU, scoped like every read.

Each level is a grouping of the period's figure tree (billing.queries.figures, the one place a page's
cost figures come from), read for the filters (label, node, GPU model, SLA tier) and the tenant of
the path, never narrowed further: a row shows the figure it shows on every page, and the rows a
row opens add up to it exactly. This module names the levels, adds the efficiency ratios and, for
workloads, the right-sizing rules (billing.services.fleet.rightsizing). A tenant outside the
caller's scope raises `TenantNotFound`, as the portal does, and the tree itself never holds another
tenant's usage, whatever the path or filters say.

Levels and what their rows are:

    tenant      one row per tenant                      (the tree's tenants)
    namespace   the tenant's namespaces
    controller  the namespace's controllers             (OpenCost's "kind:name")
    pod         the controller's workloads: pod/container (the instances of a pod name summed) + right-sizing
                (memory and SMs)
    gpu         the pod's GPUs, per container           (container, node, gpu)

A workload without Kubernetes metadata groups under `__unallocated__` (OpenCost's name), which is
followed like any other value. Cost is what the tenant is charged: usage plus the idle spread onto
it by the proportional idle policy; the platform's own idle is the finance dashboard's.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from decimal import Decimal

from django.utils.translation import gettext

from billing.figures import FigureNode, Figures, FigureTree, exact_sum, group_nodes, shown_sum
from billing.models import Tenant
from billing.queries.allocation import MAX_SETS, UNALLOCATED, Window, allocation_sets
from billing.queries.figures import get_figure_tree
from billing.queries.portal import TenantNotFound
from billing.queries.trends import day_bounds, previous_period
from billing.scope import Scope
from billing.services.fleet import (
    MemoryUse,
    SmUse,
    Suggestion,
    mean_mb,
    percent_of,
    suggest_memory_request,
    suggest_sm_request,
)

__all__ = [
    "DEFAULT_SORT",
    "LEVELS",
    "LEVEL_KEYS",
    "SORT_COLUMNS",
    "STEPS",
    "Explore",
    "ExploreFilters",
    "ExplorePath",
    "ExploreRow",
    "TenantNotFound",
    "check_tenant_visible",
    "get_explore",
    "sort_rows",
]

LEVELS = ("tenant", "namespace", "controller", "pod", "gpu")
# The allocation keys each level groups by; a row's values for them name it and lead down.
LEVEL_KEYS: dict[str, tuple[str, ...]] = {
    "tenant": ("tenant",),
    "namespace": ("namespace",),
    "controller": ("controller",),
    "pod": ("pod", "container"),
    "gpu": ("container", "node", "gpu"),
}
# The query parameters of a path, in order; each needs the one before it.
STEPS = ("tenant", "namespace", "controller", "pod", "container")
# The columns a level may be sorted by (`sort=gpu_hours`, `sort=-cost` for the largest first); a
# row's name, its shown figures, and its cost's change against the previous period.
SORT_COLUMNS = ("name", "cost", "previous_cost", "change", "gpu_hours", "mem_used_gb_h", "mem_granted_gb_h",
                "mem_requested_gb_h", "sm_used_h", "sm_granted_h", "sm_requested_h")
DEFAULT_SORT = "-cost"
_HOUR = timedelta(hours=1)
_DAY = timedelta(days=1)
_MB_S_PER_GB_H = Decimal(1024 * 3600)  # GB·h as the portal writes them (GiB, 1024 MB)
_S_PER_H = Decimal(3600)


@dataclass(frozen=True)
class ExplorePath:
    """Where the reader stands: each step narrows the next (a namespace only inside a tenant...)."""

    tenant: str = ""
    namespace: str = ""
    controller: str = ""
    pod: str = ""
    # A workload row is one container of a pod, so its GPUs are that container's: the level below
    # adds up to the row that opened it. Without it, the GPU level lists every container's GPUs.
    container: str = ""

    @property
    def level(self) -> str:
        """The level whose rows are listed here: the first step not yet taken (GPUs below a pod)."""
        for step, level in zip(("tenant", "namespace", "controller", "pod"), LEVELS, strict=False):
            if not getattr(self, step):
                return level
        return "gpu"

    def steps(self) -> list[tuple[str, str]]:
        """(level, value) of each step taken, in order."""
        return [(s, getattr(self, s)) for s in STEPS if getattr(self, s)]

    def down(self, **steps: str) -> ExplorePath:
        return replace(self, **steps)


@dataclass(frozen=True)
class ExploreFilters:
    """Rows must match every filter given: a label (name → value), and for node, GPU model and SLA
    tier any of the values listed."""

    labels: tuple[tuple[str, str], ...] = ()
    nodes: tuple[str, ...] = ()
    gpu_models: tuple[str, ...] = ()
    sla_tiers: tuple[str, ...] = ()

    def allocation_filters(self) -> dict[str, list[str]]:
        out: dict[str, list[str]] = {f"label:{name}": [value] for name, value in self.labels}
        for key, values in (("node", self.nodes), ("gpu_model", self.gpu_models), ("sla_tier", self.sla_tiers)):
            if values:
                out[key] = list(values)
        return out


@dataclass(frozen=True)
class ExploreRow:
    """One row in ledger precision, and `shown`: its figures as every page shows them
    (billing.queries.figures). Memory in GB·h (1024 MB), SMs in SM·h; a requested figure is None
    when the request of any part of the row is unknown."""

    name: str
    keys: tuple[tuple[str, str], ...]  # (allocation key, value), in the level's order
    label: str  # what the page shows: the values joined, a tenant's name at the tenant level
    down: ExplorePath | None  # the path of the next level, None at the GPU level
    cost: Decimal
    currency: str
    gpu_hours: Decimal
    mem_used_gb_h: Decimal
    mem_granted_gb_h: Decimal
    mem_requested_gb_h: Decimal | None
    sm_used_h: Decimal
    sm_granted_h: Decimal
    sm_requested_h: Decimal | None
    shown: Figures
    seconds: Decimal  # metered workload-seconds (per GPU)
    # Workloads (the pod level) only: memory and SMs per GPU and the rule's suggestion for each.
    memory: MemoryUse | None = None
    suggestion: Suggestion | None = None
    sm: SmUse | None = None
    sm_suggestion: Suggestion | None = None
    # The same row's cost over the previous period, as Explore shows that period (0: no usage then).
    previous_cost: Decimal = Decimal(0)

    def key(self, name: str) -> str:
        return dict(self.keys).get(name, "")

    @property
    def change(self) -> Decimal:
        """The shown cost against the previous period's."""
        return self.shown.cost - self.previous_cost

    @property
    def change_pct(self) -> Decimal | None:
        return self.change / self.previous_cost * 100 if self.previous_cost else None

    @property
    def mem_used_of_granted_pct(self) -> Decimal | None:
        return percent_of(self.mem_used_gb_h, self.mem_granted_gb_h)

    @property
    def mem_used_of_requested_pct(self) -> Decimal | None:
        return percent_of(self.mem_used_gb_h, self.mem_requested_gb_h)

    @property
    def sm_used_of_granted_pct(self) -> Decimal | None:
        return percent_of(self.sm_used_h, self.sm_granted_h)

    @property
    def sm_used_of_requested_pct(self) -> Decimal | None:
        return percent_of(self.sm_used_h, self.sm_requested_h)

    @property
    def freed_gb_h(self) -> Decimal | None:
        """GB·h of request a lowered request would have given back over the period."""
        if not self.suggestion:
            return None
        return self.suggestion.freed(self.mem_granted_gb_h if self.suggestion.against_grant else self.mem_requested_gb_h)

    @property
    def freed_sm_h(self) -> Decimal | None:
        """SM·h of request a lowered SM request would have given back over the period."""
        if not self.sm_suggestion:
            return None
        return self.sm_suggestion.freed(self.sm_granted_h if self.sm_suggestion.against_grant else self.sm_requested_h)


@dataclass(frozen=True)
class Explore:
    path: ExplorePath
    filters: ExploreFilters
    start: datetime
    end: datetime
    rows: list[ExploreRow] = field(default_factory=list)  # in `sort` order (costliest first by default)
    previous_start: datetime | None = None
    previous_end: datetime | None = None
    search: str = ""
    sort: str = DEFAULT_SORT

    @property
    def level(self) -> str:
        return self.path.level

    @property
    def currency(self) -> str:
        return next((r.currency for r in self.rows if r.currency), "")


# The tree level whose nodes a level's rows group, and the keys a row is named by.
_NODE_LEVEL = {"tenant": "tenant", "namespace": "namespace", "controller": "controller", "pod": "container",
               "gpu": "gpu"}


def get_explore(*, scope: Scope, path: ExplorePath, filters: ExploreFilters, start: datetime,
                end: datetime, places: int, rightsizing_limit: int | None = None, search: str = "",
                sort: str = DEFAULT_SORT) -> Explore:
    """The rows of `path`'s level over [start, end), of the caller's scope only, whose name holds
    `search` (any case; "" for all), in `sort` order (SORT_COLUMNS, "-" first for the largest
    first; ties by name), each with its cost over the previous period (billing.queries.trends),
    quantities shown at `places`. At the pod level the first `rightsizing_limit` rows (all: None)
    get the right-sizing rule; the rest have `memory` and `suggestion` None. The rule needs every
    hour of the period (one allocation set per hour), so a page that shows 100 rows reads the hours
    of those only."""
    check_tenant_visible(scope, path.tenant)
    level = path.level
    keys = LEVEL_KEYS[level]
    narrowed = filters.allocation_filters()
    if path.tenant:
        narrowed["tenant"] = [path.tenant]
    rows = _level_rows(scope, path, narrowed, (start, end), places)
    if search:
        needle = search.casefold()
        rows = [r for r in rows if needle in r.name.casefold() or needle in r.label.casefold()]
    previous = day_bounds(*previous_period(start.date(), (end - _DAY).date()))
    if rows:
        before = {r.name: r.shown.cost for r in _level_rows(scope, path, narrowed, previous, places)}
        rows = [replace(r, previous_cost=before.get(r.name, Decimal(0))) for r in rows]
    rows = sort_rows(rows, sort)
    if level == "pod" and rows:
        chosen = rows if rightsizing_limit is None else rows[:rightsizing_limit]
        window = Window(start=start, end=end)
        pods = sorted({r.key("pod") for r in chosen})
        peaks = _peak_hour_means(scope, window, keys, {**narrowed, **{k: [v] for k, v in path.steps()}, "pod": pods})
        sized = {r.name for r in chosen}
        rows = [_sized(r, *peaks.get(r.name, _NO_PEAK)) if r.name in sized else r for r in rows]
    return Explore(path=path, filters=filters, start=start, end=end, rows=rows, previous_start=previous[0],
                   previous_end=previous[1], search=search, sort=sort)


def _level_rows(scope: Scope, path: ExplorePath, narrowed: dict[str, list[str]], period: tuple[datetime, datetime],
                places: int) -> list[ExploreRow]:
    """The level's rows over `period` ([start, end)), costliest first, tenants named."""
    start, end = period
    level = path.level
    keys = LEVEL_KEYS[level]
    # The tenant level reads its tenants' lines (and namespaces, the shallowest depth a read has).
    depth = "namespace" if level == "tenant" else _NODE_LEVEL[level]
    tree = get_figure_tree(scope=scope, start=start, end=end, places=places, depth=depth, filters=narrowed)
    where = dict(path.steps())
    groups = group_nodes(tree.nodes(_NODE_LEVEL[level], where), lambda n: tuple(_value(n, k) for k in keys))
    rows = sorted((_row(tree, values, nodes, level, keys, path) for values, nodes in groups.items()),
                  key=lambda r: (-r.cost, r.name))
    if level == "tenant":
        names = _tenant_names([r.name for r in rows])
        rows = [replace(r, label=names.get(r.name) or r.label) for r in rows]
    return rows


def _sort_value(row: ExploreRow, column: str) -> Decimal | str | None:
    if column == "name":
        return row.label.casefold()
    if column == "cost":
        return row.shown.cost
    if column in ("previous_cost", "change"):
        return row.previous_cost if column == "previous_cost" else row.change
    value: Decimal | None = getattr(row.shown, column)
    return value


def sort_rows(rows: Sequence[ExploreRow], sort: str) -> list[ExploreRow]:
    """`rows` in `sort` order (a column of SORT_COLUMNS, "-" first for descending); ties by name,
    and an unknown figure (a request nobody reported) last either way. ValueError for any other column."""
    column = sort.removeprefix("-")
    if column not in SORT_COLUMNS:
        raise ValueError(f"unknown sort column {column!r}")
    by_name = sorted(rows, key=lambda r: r.name)
    known = [r for r in by_name if _sort_value(r, column) is not None]
    unknown = [r for r in by_name if _sort_value(r, column) is None]
    # Stable sorts: by name first, then by the column, so ties keep the name order.
    ordered = sorted(known, key=lambda r: _sort_value(r, column), reverse=sort.startswith("-"))  # type: ignore[arg-type,return-value]
    return ordered + unknown


def _value(node: FigureNode, key: str) -> str:
    """A node's value of an allocation key of the levels (node: the GPU's node)."""
    if key == "node":
        return node.keys[-2]
    return node.key(key)


def check_tenant_visible(scope: Scope, tenant: str) -> None:
    """A tenant outside the scope is not found, like one that does not exist (the rows are scoped
    in the allocation query regardless; this keeps the page from even naming it)."""
    if tenant and scope.tenants is not None and tenant not in scope.tenants:
        raise TenantNotFound(tenant)


_NO_PEAK = (Decimal(0), Decimal(0))


def _peak_hour_means(scope: Scope, window: Window, keys: Sequence[str],
                     filters: Mapping[str, Sequence[str]]) -> dict[str, tuple[Decimal, Decimal]]:
    """Each workload's highest hourly means of memory (MB) and of SMs in use per GPU, each its own
    peak hour: one allocation set per hour, read in spans of at most MAX_SETS hours (the query's
    limit on sets per read)."""
    peaks: dict[str, tuple[Decimal, Decimal]] = {}
    span = MAX_SETS * _HOUR
    at = window.start
    while at < window.end:
        part = Window(start=at, end=min(at + span, window.end))
        for hour in allocation_sets(scope, window=part, aggregate=keys, step=_HOUR, filters=filters):
            for name, a in hour.items():
                mem, sm = peaks.get(name, _NO_PEAK)
                peaks[name] = (max(mem, mean_mb(a.mem_used_mb_s, a.seconds)), max(sm, mean_mb(a.sm_used_s, a.seconds)))
        at = part.end
    return peaks


def _tenant_names(slugs: Sequence[str]) -> dict[str, str]:
    return dict(Tenant.objects.filter(slug__in=slugs).values_list("slug", "name"))


def _row(tree: FigureTree, values: tuple[str, ...], nodes: list[FigureNode], level: str,  # noqa: PLR0917 - a private helper whose one caller passes its loop's state in order
         keys: Sequence[str], path: ExplorePath) -> ExploreRow:
    """One row: the nodes it groups, exact and as shown."""
    pairs = tuple(zip(keys, values, strict=True))
    unknown = gettext("(not known)")  # how a page names __unallocated__
    label = " · ".join(unknown if v == UNALLOCATED else v for _k, v in pairs)
    # A row opens the next level narrowed by its own values (a workload row: its pod and container).
    down = None if level == "gpu" else path.down(**{k: v for k, v in pairs if k in STEPS})
    exact = exact_sum(nodes)
    return ExploreRow(
        name="/".join(values), keys=pairs, label=label, down=down, cost=exact.cost, currency=tree.currency,
        gpu_hours=exact.gpu_hours, mem_used_gb_h=exact.mem_used_gb_h, mem_granted_gb_h=exact.mem_granted_gb_h,
        mem_requested_gb_h=exact.mem_requested_gb_h, sm_used_h=exact.sm_used_h, sm_granted_h=exact.sm_granted_h,
        sm_requested_h=exact.sm_requested_h, shown=shown_sum(tree, nodes), seconds=sum((n.seconds for n in nodes), Decimal(0)),
    )


def _sized(row: ExploreRow, peak_hour_mean_mb: Decimal, peak_hour_mean_sm: Decimal) -> ExploreRow:
    """The row with its memory and SMs per GPU and the right-sizing rule's suggestion for each."""
    seconds = row.seconds
    request = (row.mem_requested_gb_h * _MB_S_PER_GB_H / seconds
               if row.mem_requested_gb_h is not None and seconds > 0 else None)
    # The grant per GPU: what the rule is held against where no request was reported.
    memory = MemoryUse(request_mb=request, mean_used_mb=mean_mb(row.mem_used_gb_h * _MB_S_PER_GB_H, seconds),
                       peak_hour_mean_mb=peak_hour_mean_mb,
                       granted_mb=mean_mb(row.mem_granted_gb_h * _MB_S_PER_GB_H, seconds) if seconds > 0 else None)
    sm_request = row.sm_requested_h * _S_PER_H / seconds if row.sm_requested_h is not None and seconds > 0 else None
    sm = SmUse(request_sm=sm_request, mean_used_sm=mean_mb(row.sm_used_h * _S_PER_H, seconds),
               peak_hour_mean_sm=peak_hour_mean_sm,
               granted_sm=mean_mb(row.sm_granted_h * _S_PER_H, seconds) if seconds > 0 else None)
    return replace(row, memory=memory, suggestion=suggest_memory_request(memory), sm=sm,
                   sm_suggestion=suggest_sm_request(sm))
