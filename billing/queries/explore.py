"""The drill-down (docs/drilldown.md): tenant → namespace → controller → pod → GPU, scoped like every read.

Each level is one aggregation of the allocation query (billing.queries.allocation, the one place
that sums the ledger by Kubernetes objects and labels), narrowed by the path walked so far and by
the filters (label, node, GPU model, SLA tier); this module only names the levels, turns
allocations into rows with efficiency ratios and, for workloads, the right-sizing rule
(billing.services.fleet.rightsizing). A tenant outside the caller's scope raises `TenantNotFound`, as the
portal does, and the allocation query itself never returns another tenant's usage, whatever the
path or filters say.

Levels and what their rows are:

    tenant      one row per tenant                      (aggregate tenant)
    namespace   the tenant's namespaces                 (aggregate namespace)
    controller  the namespace's controllers             (aggregate controller, OpenCost's "kind:name")
    pod         the controller's workloads: pod/container (aggregate pod, container) + right-sizing
    gpu         the pod's GPUs, per container           (aggregate container, node, gpu)

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

from billing.models import Tenant
from billing.queries.allocation import MAX_SETS, UNALLOCATED, CostAllocation, Window, allocation_sets
from billing.queries.portal import TenantNotFound
from billing.scope import Scope
from billing.services.fleet import MemoryUse, Suggestion, mean_mb, percent_of, suggest_memory_request

__all__ = [
    "LEVELS",
    "LEVEL_KEYS",
    "STEPS",
    "Explore",
    "ExploreFilters",
    "ExplorePath",
    "ExploreRow",
    "TenantNotFound",
    "check_tenant_visible",
    "get_explore",
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
_HOUR = timedelta(hours=1)
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
    """One row in ledger precision (pages and CSVs round, billing.money). Memory in GB·h (1024 MB),
    SMs in SM·h; a requested figure is None when the request of any part of the row is unknown."""

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
    # Workloads (the pod level) only: memory per GPU and the rule's suggestion.
    memory: MemoryUse | None = None
    suggestion: Suggestion | None = None

    def key(self, name: str) -> str:
        return dict(self.keys).get(name, "")

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
        if self.suggestion is None or self.mem_requested_gb_h is None:
            return None
        return self.mem_requested_gb_h * self.suggestion.freed_fraction


@dataclass(frozen=True)
class Explore:
    path: ExplorePath
    filters: ExploreFilters
    start: datetime
    end: datetime
    rows: list[ExploreRow] = field(default_factory=list)  # costliest first

    @property
    def level(self) -> str:
        return self.path.level

    @property
    def currency(self) -> str:
        return next((r.currency for r in self.rows if r.currency), "")


def get_explore(*, scope: Scope, path: ExplorePath, filters: ExploreFilters, start: datetime,
                end: datetime, rightsizing_limit: int | None = None) -> Explore:
    """The rows of `path`'s level over [start, end), of the caller's scope only, costliest first.
    At the pod level the `rightsizing_limit` costliest workloads (all: None) get the right-sizing
    rule; the rest have `memory` and `suggestion` None. The rule needs every hour of the period
    (one allocation set per hour), so a page that shows 100 rows reads the hours of those only."""
    check_tenant_visible(scope, path.tenant)
    level = path.level
    keys = LEVEL_KEYS[level]
    narrowed = {**filters.allocation_filters(), **{step: [value] for step, value in path.steps()}}
    window = Window(start=start, end=end)
    sets = allocation_sets(scope, window=window, aggregate=keys, accumulate=True, filters=narrowed)
    allocations = sorted((sets[0] if sets else {}).values(), key=lambda a: (-a.total_cost, a.name))
    sized: dict[str, Decimal] = {}
    if level == "pod" and allocations:
        chosen = allocations if rightsizing_limit is None else allocations[:rightsizing_limit]
        pods = sorted({a.properties.get("pod", "") for a in chosen})
        peaks = _peak_hour_means(scope, window, keys, {**narrowed, "pod": pods})
        sized = {a.name: peaks.get(a.name, Decimal(0)) for a in chosen}
    names = _tenant_names([a.name for a in allocations]) if level == "tenant" else {}
    rows = [_row(a, level, keys, path, sized, names) for a in allocations]
    return Explore(path=path, filters=filters, start=start, end=end, rows=rows)


def check_tenant_visible(scope: Scope, tenant: str) -> None:
    """A tenant outside the scope is not found, like one that does not exist (the rows are scoped
    in the allocation query regardless; this keeps the page from even naming it)."""
    if tenant and scope.tenants is not None and tenant not in scope.tenants:
        raise TenantNotFound(tenant)


def _peak_hour_means(scope: Scope, window: Window, keys: Sequence[str],
                     filters: Mapping[str, Sequence[str]]) -> dict[str, Decimal]:
    """Each workload's highest hourly mean of memory in use per GPU: one allocation set per hour,
    read in spans of at most MAX_SETS hours (the query's limit on sets per read)."""
    peaks: dict[str, Decimal] = {}
    span = MAX_SETS * _HOUR
    at = window.start
    while at < window.end:
        part = Window(start=at, end=min(at + span, window.end))
        for hour in allocation_sets(scope, window=part, aggregate=keys, step=_HOUR, filters=filters):
            for name, a in hour.items():
                peaks[name] = max(peaks.get(name, Decimal(0)), mean_mb(a.mem_used_mb_s, a.seconds))
        at = part.end
    return peaks


def _tenant_names(slugs: Sequence[str]) -> dict[str, str]:
    return dict(Tenant.objects.filter(slug__in=slugs).values_list("slug", "name"))


def _row(a: CostAllocation, level: str, keys: Sequence[str], path: ExplorePath,  # noqa: PLR0917 - a private helper whose one caller passes its loop's state in order
         peaks: Mapping[str, Decimal], names: Mapping[str, str]) -> ExploreRow:
    """`peaks`: the peak-hour means of the workloads to right-size; `names`: tenants' names."""
    pairs = tuple((k, a.properties.get(k, "")) for k in keys)
    unknown = gettext("(not known)")  # how a page names __unallocated__
    label = names.get(a.name) or " · ".join(unknown if v == UNALLOCATED else v for _k, v in pairs)
    # A row opens the next level narrowed by its own values (a workload row: its pod and container).
    down = None if level == "gpu" else path.down(**{k: v for k, v in pairs if k in STEPS})
    memory = suggestion = None
    if a.name in peaks:
        seconds = a.seconds
        request = a.mem_requested_mb_s / seconds if a.mem_requested_mb_s is not None and seconds > 0 else None
        memory = MemoryUse(request_mb=request, mean_used_mb=mean_mb(a.mem_used_mb_s, seconds),
                           peak_hour_mean_mb=peaks[a.name])
        suggestion = suggest_memory_request(memory)
    return ExploreRow(
        name=a.name, keys=pairs, label=label, down=down, cost=a.total_cost, currency=a.currency, gpu_hours=a.gpu_hours,
        mem_used_gb_h=a.mem_used_mb_s / _MB_S_PER_GB_H, mem_granted_gb_h=a.mem_granted_mb_s / _MB_S_PER_GB_H,
        mem_requested_gb_h=None if a.mem_requested_mb_s is None else a.mem_requested_mb_s / _MB_S_PER_GB_H,
        sm_used_h=a.sm_used_s / _S_PER_H, sm_granted_h=a.sm_granted_s / _S_PER_H,
        sm_requested_h=None if a.sm_requested_s is None else a.sm_requested_s / _S_PER_H,
        memory=memory, suggestion=suggestion,
    )
