"""OpenCost-compatible allocation sets (docs/allocation-api.md): the ledger's usage over a
window, per step, grouped by any of AGGREGATE_KEYS (and `label:<name>`), with the platform's idle as
`__idle__` or shared onto the allocations. The HTTP edge (billing.api.allocation) and the drill-down
pages call `allocation_sets`; billing.api.allocation_params turns OpenCost's query parameters into
its arguments, and both raise ParameterError naming the parameter.

Money (ledger precision, Decimal):
- `gpu_cost` is the usage charge; `shared_idle_cost` the idle the tenant is invoiced under the
  proportional idle policy (the ledger's idle_share) plus, with share_idle, a part of the platform's
  idle; `total_cost` their sum. Over a closed month Σ total_cost of every allocation without
  share_idle is Σ of that month's invoice lines (usage, idle and later adjustments for it, before
  tax and rounding), and adding `__idle__` gives Σ card cost.
- The platform's idle (card idle no tenant is invoiced) is `__idle__` with include_idle, one per set,
  or one per node (`<node>/__idle__`) with idle_by_node. share_idle spreads it over the set's
  allocations in proportion to their usage charge (per node with idle_by_node); idle on cards whose
  charge is 0 cannot be spread and stays `__idle__`.

Scope: a tenant member sees its tenants' allocations only; the platform's idle is the platform's,
so a tenant scope never gets `__idle__` and share_idle adds nothing for it.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from decimal import Decimal
from typing import NamedTuple

from django.utils.translation import gettext

from billing.calendar import floor_to, utc_midnight
from billing.errors import InvalidInput
from billing.ledger import allocation as ledger
from billing.ledger.energy import any_energy_rate
from billing.ledger.reads import no_cycle_collection
from billing.ledger.totals import get_priced_currency
from billing.money import allocate
from billing.queries.snapshot import beside
from billing.scope import Scope

__all__ = [
    "ACCUMULATE_UNITS",
    "AGGREGATE_KEYS",
    "DEFAULT_AGGREGATE",
    "IDLE",
    "LABEL_PREFIX",
    "MAX_SETS",
    "UNALLOCATED",
    "CostAllocation",
    "ParameterError",
    "Window",
    "accumulated",
    "align_window",
    "allocation_sets",
    "node_assets",
    "require_printable",
    "set_windows",
]

AGGREGATE_KEYS: tuple[str, ...] = ledger.GROUP_KEYS
LABEL_PREFIX = ledger.LABEL_PREFIX
UNALLOCATED = ledger.UNALLOCATED
IDLE = "__idle__"
# OpenCost's unaggregated allocation is one container on one node of one cluster.
DEFAULT_AGGREGATE: tuple[str, ...] = ("cluster", "node", "namespace", "pod", "container")
# More sets than this is a mistake (a step of 1h over a year is 8,784 sets), answered 400.
MAX_SETS = 1000

_ZERO = Decimal(0)
_HOUR = timedelta(hours=1)
_DAY = timedelta(days=1)
_S_PER_H = Decimal(3600)
_S_PER_H_FLOAT = 3600.0
_S_PER_MIN = Decimal(60)


class ParameterError(InvalidInput):
    """A query parameter the allocation API cannot take: `parameter` names it (the 400's body)."""

    def __init__(self, parameter: str, message: str) -> None:
        super().__init__(f"{parameter}: {message}")
        self.parameter = parameter


@dataclass(frozen=True)
class Window:
    """[start, end), UTC."""

    start: datetime
    end: datetime


class CostAllocation(NamedTuple):
    """One allocation of a set, in OpenCost's sense: the cost of a group of workloads (or `__idle__`)
    over the set's window, ledger units. (allocator's `Allocation` is the other meaning: the memory
    and SM share a container is granted.) A named tuple, as the ledger's UsageGroupRow: a per-pod
    month is ~40k of them at 1,000 GPUs, and a frozen dataclass sets each field through
    `object.__setattr__` (docs/architecture.md, "Per-pod allocation reads")."""

    # Ledger units: Decimals; from allocation_sets with `floats`, a workload allocation's minutes and
    # figures are floats (each the double nearest the ledger's figure), energy's excepted, and its
    # costs with shared idle.
    name: str
    properties: Mapping[str, str]  # aggregate key -> this group's value (label keys as "label:<name>")
    start: datetime  # first ledger hour with usage in the set (the set's start for idle)
    end: datetime  # end of the last such hour (the set's end for idle)
    minutes: Decimal  # end - start
    gpu_hours: Decimal  # Σ share of the cards (idle: the cards' unused GPU-hours)
    gpu_cost: Decimal  # usage charge (idle: the platform's idle left unshared)
    shared_idle_cost: Decimal  # invoiced idle share + platform idle shared onto it
    total_cost: Decimal
    currency: str
    mem_used_mb_s: Decimal
    mem_granted_mb_s: Decimal
    mem_requested_mb_s: Decimal | None  # None when a workload's request is unknown
    sm_used_s: Decimal
    sm_granted_s: Decimal
    sm_requested_s: Decimal | None
    seconds: Decimal = _ZERO  # Σ metered workload-seconds (per GPU)
    is_idle: bool = False
    # GPU energy, joules: a workload group's as the ledger split it (docs/billing.md, Energy), idle's the
    # cards' energy no workload was attributed. Sharing idle cost (shareIdle) does not move energy.
    energy_j: Decimal = _ZERO
    # Σ joules × price per kWh (× kg CO2e per kWh) of each node's location on each date (docs/billing.md,
    # Energy); None where some of the energy had none. Information beside the cost, never part of it.
    energy_cost_jp: Decimal | None = _ZERO
    co2e_jkg: Decimal | None = _ZERO


def plus(a: Decimal | None, b: Decimal | None) -> Decimal | None:
    """A sum that is unknown where a part is."""
    return None if a is None or b is None else a + b


# --- Windows ------------------------------------------------------------------------------------

# OpenCost's `accumulate` words beyond true/false: sets of whole calendar units.
ACCUMULATE_UNITS = ("hour", "day", "week", "month", "quarter")


def require_printable(parameter: str, text: str) -> str:
    """`text`, unless it holds a NUL, which no database string can (a 400, not a 500)."""
    if "\x00" in text:
        raise ParameterError(parameter, gettext("must not contain NUL characters"))
    return text


def align_window(window: Window) -> Window:
    """The window the ledger can answer: its start floored and its end ceiled to whole UTC hours
    (the ledger's resolution). The response states these bounds."""
    start = floor_to(window.start, _HOUR)
    end = floor_to(window.end, _HOUR)
    try:
        return Window(start, end if end == window.end else end + _HOUR)
    except OverflowError as exc:  # the last hour of year 9999
        raise ParameterError("window", gettext("the end is out of range")) from exc


# --- Sets ---------------------------------------------------------------------------------------


def set_windows(window: Window, step: timedelta | None, accumulate: str | None = None) -> list[Window]:
    """The sets of an aligned window: one (no step, or accumulate `all`), one per calendar unit
    (accumulate `day`...: the first and last clipped to the window), or one per step from its start
    (the last one may be shorter, ending with the window). More than MAX_SETS is a ParameterError."""
    if accumulate == "all" or (step is None and accumulate is None):
        return [window]
    if accumulate is not None:
        starts = _calendar_starts(window, accumulate)
        parameter = "accumulate"
    elif step is not None:
        step = min(step, window.end - window.start) or step  # a step past the window is one set
        count = -(-(window.end - window.start) // step)
        if count > MAX_SETS:
            raise ParameterError("step", gettext("gives %(count)d sets; at most %(max)d")
                                 % {"count": count, "max": MAX_SETS})
        starts = [window.start + i * step for i in range(count)]
        parameter = "step"
    else:  # unreachable: no step and no accumulate is one set above
        return [window]
    if len(starts) > MAX_SETS:
        raise ParameterError(parameter, gettext("gives %(count)d sets; at most %(max)d")
                             % {"count": len(starts), "max": MAX_SETS})
    ends = [*starts[1:], window.end]
    return [Window(a, b) for a, b in zip(starts, ends, strict=True)] or [window]


def _next_boundary(at: datetime, unit: str) -> datetime:
    """The first start of a `unit` after `at` (UTC; weeks start on Sunday, as OpenCost's)."""
    if unit == "hour":
        return floor_to(at, _HOUR) + _HOUR
    day = utc_midnight(at)
    if unit == "day":
        return day + _DAY
    if unit == "week":
        return day + timedelta(days=7 - (day.weekday() + 1) % 7)
    months = 1 if unit == "month" else 3 - (day.month - 1) % 3
    month = day.month - 1 + months
    return day.replace(year=day.year + month // 12, month=month % 12 + 1, day=1)


def _calendar_starts(window: Window, unit: str) -> list[datetime]:
    starts = [window.start]
    while True:
        following = _next_boundary(starts[-1], unit)
        if following >= window.end:
            return starts
        starts.append(following)
        if len(starts) > MAX_SETS:
            return starts


@dataclass
class _Group:
    """Sums of one allocation as its rows arrive (several with per-node idle sharing)."""

    first_hour: datetime
    last_hour: datetime
    seconds: Decimal = _ZERO
    share_gpu_s: Decimal = _ZERO
    charge: Decimal = _ZERO
    idle: Decimal = _ZERO
    mem_used: Decimal = _ZERO
    mem_granted: Decimal = _ZERO
    mem_requested: Decimal | None = _ZERO
    sm_used: Decimal = _ZERO
    sm_granted: Decimal = _ZERO
    sm_requested: Decimal | None = _ZERO
    energy_j: Decimal = _ZERO
    energy_cost_jp: Decimal | None = _ZERO
    co2e_jkg: Decimal | None = _ZERO

    @classmethod
    def of(cls, row: ledger.UsageGroupRow, shared_idle: Decimal) -> _Group:
        """The group of its first row: its sums as they are (adding them to zeros gives the same
        Decimals, the ledger's exponents being at most 0). A group of one row stays that row and
        its part of shared idle (_add_groups); this is the group a second row needs."""
        return cls(row.first_hour, row.last_hour, row.seconds, row.share_gpu_s, row.charge, row.idle_share + shared_idle,
                   row.mem_used_mb_s, row.mem_granted_mb_s, row.mem_requested_mb_s, row.sm_used_s, row.sm_granted_s,
                   row.sm_requested_s, row.energy_j, row.energy_cost_jp, row.co2e_jkg)

    def allocation_sums(self) -> ledger.UsageGroupRow:
        """The group's sums in a row's shape (its idle as the row's idle share), so its allocation is
        built as a group of one row's; the row's set, keys and node are not read there."""
        return ledger.UsageGroupRow(
            set_start=self.first_hour, keys=(), node="", first_hour=self.first_hour, last_hour=self.last_hour,
            seconds=self.seconds, share_gpu_s=self.share_gpu_s, charge=self.charge, idle_share=self.idle,
            mem_used_mb_s=self.mem_used, mem_granted_mb_s=self.mem_granted, mem_requested_mb_s=self.mem_requested,
            sm_used_s=self.sm_used, sm_granted_s=self.sm_granted, sm_requested_s=self.sm_requested,
            energy_j=self.energy_j, energy_cost_jp=self.energy_cost_jp, co2e_jkg=self.co2e_jkg)

    def add(self, row: ledger.UsageGroupRow, shared_idle: Decimal) -> None:
        self.first_hour = min(self.first_hour, row.first_hour)
        self.last_hour = max(self.last_hour, row.last_hour)
        self.seconds += row.seconds
        self.share_gpu_s += row.share_gpu_s
        self.charge += row.charge
        self.idle += row.idle_share + shared_idle
        self.mem_used += row.mem_used_mb_s
        self.mem_granted += row.mem_granted_mb_s
        self.sm_used += row.sm_used_s
        self.sm_granted += row.sm_granted_s
        self.energy_j += row.energy_j
        self.energy_cost_jp = plus(self.energy_cost_jp, row.energy_cost_jp)
        self.co2e_jkg = plus(self.co2e_jkg, row.co2e_jkg)
        self.mem_requested = None if self.mem_requested is None or row.mem_requested_mb_s is None \
            else self.mem_requested + row.mem_requested_mb_s
        self.sm_requested = None if self.sm_requested is None or row.sm_requested_s is None \
            else self.sm_requested + row.sm_requested_s


def _name(keys: Sequence[str]) -> str:
    return "/".join(keys)


def _minutes(start: datetime, end: datetime) -> Decimal:
    return Decimal(int((end - start).total_seconds())) / _S_PER_MIN


def _shared_idle(rows: Sequence[ledger.UsageGroupRow],
                 idle: Mapping[tuple[datetime, str], ledger.IdleRow]) -> list[Decimal]:
    """Each row's part of its set's (or set and node's) platform idle, in proportion to its charge
    among every charge on those cards, at ledger precision (billing.money.allocate: the parts of
    the whole set add up to that idle exactly; a filtered set gets its rows' parts only)."""
    parts = [_ZERO] * len(rows)
    by_key: dict[tuple[datetime, str], list[int]] = {}
    for i, row in enumerate(rows):
        by_key.setdefault((row.set_start, row.node), []).append(i)
    for key, members in by_key.items():
        card = idle.get(key)
        if card is None or card.charge <= 0 or card.platform_idle <= 0:
            continue
        weights = [rows[i].charge for i in members]
        # The charge of rows not asked for (filtered out) takes the rest: a filter changes no part
        # beyond the ledger unit.
        rest = card.charge - sum(weights, _ZERO)
        for i, part in zip(members, allocate(card.platform_idle, [*weights, max(rest, _ZERO)]), strict=False):
            parts[i] = part
    return parts


# A per-pod month builds ~80k tuples at 1,000 GPUs: no cycle collections while it does.
@no_cycle_collection()
def allocation_sets(
    scope: Scope, *, window: Window, aggregate: Sequence[str], step: timedelta | None = None,
    accumulate: bool | str | None = False, include_idle: bool = False, share_idle: bool = False,
    idle_by_node: bool = False, filters: Mapping[str, Sequence[str]] | None = None,
    tree: ledger.FilterTree | None = None, split_idle: bool = False, max_allocations: int | None = None,
    quantities: bool = True, floats: bool = False,
) -> list[dict[str, CostAllocation]]:
    """One dict per set (name -> Allocation; one set with `accumulate` or no `step`), in time order,
    each sorted by name with idle last. `window` is aligned to whole hours first (align_window);
    `filters` maps aggregate keys (or `label:<name>`) to the values allowed. See the module
    docstring for the money and scope rules. `accumulate` True (or `all`) is one set, a word of
    ACCUMULATE_UNITS one set per calendar unit; `tree` is OpenCost's filter (parse_filter_tree),
    ANDed with `filters`. Idle is one `__idle__` per set, as OpenCost merges it, unless `split_idle`:
    then `<node>/__idle__` with idle_by_node, else `<cluster>/__idle__`. With `max_allocations`, a
    query whose sets would hold more workload allocations than that is refused (ParameterError)
    before any is built. Without `quantities`, the workload allocations' memory, requests and energy
    are not read: zeros (None for requests), for a caller that shows none of them (OpenCost's summary).
    With `floats`, the workload allocations' usage figures (GPU-hours, costs, memory, SMs, requests;
    not energy) are floats, each the double nearest to its exact figure, for a caller that writes
    them as JSON numbers; with shared idle their costs stay Decimals (the parts are split by the exact
    charges), and shared per node none is a float (a group's rows per node are summed)."""
    window = align_window(window)
    aggregate = tuple(aggregate) or DEFAULT_AGGREGATE
    filters = dict(filters or {})
    for key in (*aggregate, *filters):
        parameter = "aggregate" if key in aggregate else "filter"
        if not ledger.is_group_key(require_printable(parameter, key)):
            raise ParameterError(parameter, gettext("unknown key %(key)r; use %(keys)s or label:<name>")
                                 % {"key": key, "keys": ", ".join(AGGREGATE_KEYS)})
    for values in filters.values():
        for value in values:
            require_printable("filter", value)
    for key in ledger.tree_keys(tree):
        if not ledger.is_group_key(key):
            raise ParameterError("filter", gettext("unknown key %(key)r") % {"key": key})
    unit = "all" if accumulate is True else (accumulate or None)
    if step is not None and step % _HOUR:
        raise ParameterError("step", gettext("must be a whole number of hours (the ledger's resolution)"))
    bounds = set_windows(window, step, unit)
    starts = [b.start for b in bounds] if len(bounds) > 1 else None
    sets: list[dict[str, CostAllocation]] = [{} for _ in bounds]
    if scope.tenants is not None and not scope.tenants:
        return sets
    platform = scope.sees_platform
    share = share_idle and platform
    rates = any_energy_rate()  # asked once for both reads
    # Floats are never summed: not where a group is read per node (shared idle per node), whose rows
    # are summed per group. Shared idle is split by the exact charges: they stay Decimals.
    by_node = share and idle_by_node
    floats = floats and not by_node
    read = functools.partial(
        ledger.list_usage_groups, start=window.start, end=window.end, starts=starts, keys=aggregate, filters=filters,
        tenants=scope.tenants, by_node=by_node, tree=tree, limit=None if max_allocations is None else max_allocations + 1,
        rates=rates, quantities=quantities, floats=floats, exact_costs=share)
    rows = _groups_in_parts(read, aggregate)
    if max_allocations is not None and len(rows) > max_allocations:
        raise ParameterError("aggregate", gettext(
            "the answer would hold more than %(max)s allocations; aggregate by fewer or coarser keys, take a "
            "longer step, or ask for a shorter window") % {"max": f"{max_allocations:,}"})
    idle_rows = (ledger.list_idle_rows(start=window.start, end=window.end, starts=starts, filters=filters,
                                       by_node=idle_by_node or split_idle, tree=tree, rates=rates)
                 if platform and (include_idle or share) else [])
    currency = get_priced_currency(start=window.start, end=window.end)
    index = {b.start: i for i, b in enumerate(bounds)}
    idle_by_key = {(r.set_start, r.node): r for r in idle_rows}

    # Shared per node only with idleByNode; split_idle alone reads idle per node to name it, not to share it.
    share_key = idle_by_key if idle_by_node or not split_idle else _merge_nodes(idle_rows)
    shared = _shared_idle(rows, share_key) if share else None
    _add_groups(sets, bounds, rows, aggregate=aggregate, shared=shared, currency=currency, floats=floats)
    if platform and include_idle:
        for r in sorted(idle_rows, key=lambda r: (r.set_start, r.node)):
            # Shared idle leaves __idle__ only where the cards carried no charge to share it by.
            left = r.platform_idle if not share or r.charge <= 0 else _ZERO
            if share and left == 0:
                continue
            i = index[r.set_start]
            name, properties = _idle_name(r, split=split_idle, by_node=idle_by_node)
            _add_idle(sets[i], name, properties, bounds[i], r, left, currency)
    return sets


def _groups_in_parts(read: Callable[..., list[ledger.UsageGroupRow]],
                     aggregate: Sequence[str]) -> list[ledger.UsageGroupRow]:
    """`read`'s groups; a group per pod (about a row each: tens of thousands in a month at 1,000
    GPUs) in two halves, one on a side connection in the caller's snapshot while this one reads the
    other (billing.queries.snapshot), where a side thread is free: the statement is Postgres' work
    on one core, and its halves take two. A per-pod month's groups were read in 339 ms so against
    494 in one statement (docs/benchmarks.md). The halves are disjoint and together every group."""
    other = beside(functools.partial(read, part=(1, 2))) if ledger.reads_per_pod(aggregate) else None
    if other is None:
        return read()
    return read(part=(0, 2)) + other()


def _add_groups(sets: list[dict[str, CostAllocation]], bounds: Sequence[Window], rows: Sequence[ledger.UsageGroupRow], *,
                aggregate: Sequence[str], shared: Sequence[Decimal] | None, currency: str, floats: bool) -> None:
    """Each set's allocations of the usage rows (with `shared`, each row's part of the platform's
    idle), sorted by their keys; with `floats` (rows of floats), their minutes and GPU-hours are
    floats too."""
    index = {b.start: i for i, b in enumerate(bounds)}
    # A group of one row (a per-pod month's usual group, ~40k at 1,000 GPUs) is its row and its part
    # of shared idle (None without) until a second row arrives: no _Group, its sums the row's
    # Decimals as they are (with shared idle per node, building a _Group per row and its sums back
    # was 9 % of the per-pod month's answer).
    # Rows of floats are each a group of their own (read without nodes, none shares a set and keys
    # with another): floats are never summed.
    groups: list[dict[tuple[str, ...], _Group | tuple[ledger.UsageGroupRow, Decimal | None]]] = [{} for _ in bounds]
    for i, row in enumerate(rows):
        part = None if shared is None else shared[i]
        in_set = groups[index[row.set_start]]
        group = in_set.get(row.keys)
        if group is None:
            in_set[row.keys] = (row, part)
        elif floats:
            raise ValueError(f"a second row of floats for {row.keys}: floats are never summed")
        elif isinstance(group, _Group):
            group.add(row, _ZERO if part is None else part)
        else:
            first, first_part = group
            in_set[row.keys] = merged = _Group.of(first, _ZERO if first_part is None else first_part)
            merged.add(row, _ZERO if part is None else part)
    minutes: dict[timedelta, Decimal | float] = {}  # per length: groups of one set share a few lengths
    for i, bound in enumerate(bounds):
        out, in_set = sets[i], groups[i]
        # The keys' order as tuples of them sort (code points, element by element), by one string
        # each: joined on NUL, which sorts below every character and which no text from PostgreSQL
        # holds. Half the time of sorting the tuples, whose every comparison compares elements in
        # Python (a per-pod month's 40k groups at 1,000 GPUs).
        for keys in sorted(in_set, key="\x00".join):
            g = in_set[keys]
            one, part = (g.allocation_sums(), None) if isinstance(g, _Group) else g
            # Unpacked once, by position (UsageGroupRow's field order): an attribute of a named tuple
            # is a descriptor call, and a row's eighteen were a third of this loop.
            (_, _, _, first_hour, last_hour, seconds, share_gpu_s, charge, idle_share, mem_used, mem_granted,
             mem_requested, sm_used, sm_granted, sm_requested, energy_j, energy_cost_jp, co2e_jkg, cost) = one
            if part is not None:
                idle_share += part  # as _Group.of sums a row with its part
            start = max(bound.start, first_hour)
            end = min(bound.end, last_hour + _HOUR)
            span = minutes.get(end - start)
            if span is None:
                span = minutes[end - start] = (end - start).total_seconds() / 60 if floats else _minutes(start, end)
            name = _name(keys)
            # By position (CostAllocation's field order; tuple.__new__ skips the named tuple's Python-level
            # __new__, as agents.interfaces builds its Grants): tests/billing/test_allocation_groups.py
            # checks every field against the rows summed in Python.
            out[name] = tuple.__new__(CostAllocation, (
                name, dict(zip(aggregate, keys, strict=True)), start, end, span,
                float(share_gpu_s) / _S_PER_H_FLOAT if floats else share_gpu_s / _S_PER_H,
                charge, idle_share, charge + idle_share if cost is None else cost, currency, mem_used, mem_granted,
                mem_requested, sm_used, sm_granted, sm_requested, seconds, False, energy_j, energy_cost_jp, co2e_jkg))


def _idle_name(r: ledger.IdleRow, *, split: bool, by_node: bool) -> tuple[str, dict[str, str]]:
    """OpenCost's idle names: one `__idle__`, or with splitIdle one per node (idleByNode) or cluster."""
    if not split:
        return IDLE, {}
    if by_node:
        return f"{r.node}/{IDLE}", {"node": r.node, "cluster": r.cluster}
    return f"{r.cluster}/{IDLE}", {"cluster": r.cluster}


def _add_idle(one: dict[str, CostAllocation], name: str, properties: dict[str, str], bound: Window, r: ledger.IdleRow,  # noqa: PLR0917 - a private helper whose one caller passes its loop's state in order
              left: Decimal, currency: str) -> None:
    """Adds a card group's platform idle to the set's idle allocation `name` (merging nodes)."""
    gpu_hours = (r.metered_seconds - r.share_gpu_s) / _S_PER_H
    before = one.get(name)
    if before is not None:
        one[name] = before._replace(gpu_hours=before.gpu_hours + gpu_hours, gpu_cost=before.gpu_cost + left,
                            total_cost=before.total_cost + left, energy_j=before.energy_j + r.idle_energy_j,
                            energy_cost_jp=plus(before.energy_cost_jp, r.energy_cost_jp),
                            co2e_jkg=plus(before.co2e_jkg, r.co2e_jkg))
        return
    one[name] = CostAllocation(
        name=name, properties=properties, start=bound.start, end=bound.end,
        minutes=_minutes(bound.start, bound.end), gpu_hours=gpu_hours,
        gpu_cost=left, shared_idle_cost=_ZERO, total_cost=left, currency=currency or r.currency,
        mem_used_mb_s=_ZERO, mem_granted_mb_s=_ZERO, mem_requested_mb_s=None, sm_used_s=_ZERO,
        sm_granted_s=_ZERO, sm_requested_s=None, is_idle=True, energy_j=r.idle_energy_j,
        energy_cost_jp=r.energy_cost_jp, co2e_jkg=r.co2e_jkg,
    )


def _merge_nodes(idle_rows: Sequence[ledger.IdleRow]) -> dict[tuple[datetime, str], ledger.IdleRow]:
    """Per-node idle rows summed per set under node "" (how a set's idle is shared without idleByNode)."""
    out: dict[tuple[datetime, str], ledger.IdleRow] = {}
    for r in idle_rows:
        key = (r.set_start, "")
        b = out.get(key)
        out[key] = replace(r, node="", cluster="") if b is None else replace(
            b, platform_idle=b.platform_idle + r.platform_idle, metered_seconds=b.metered_seconds + r.metered_seconds,
            share_gpu_s=b.share_gpu_s + r.share_gpu_s, charge=b.charge + r.charge,
            idle_energy_j=b.idle_energy_j + r.idle_energy_j, energy_cost_jp=plus(b.energy_cost_jp, r.energy_cost_jp),
            co2e_jkg=plus(b.co2e_jkg, r.co2e_jkg))
    return out


def accumulated(sets: Sequence[Mapping[str, CostAllocation]]) -> dict[str, CostAllocation]:
    """The sets summed into one (what `accumulate=true` computes in one read), per name."""
    out: dict[str, CostAllocation] = {}
    for one in sets:
        for name, a in one.items():
            b = out.get(name)
            out[name] = a if b is None else b._replace(
                start=min(a.start, b.start), end=max(a.end, b.end),
                minutes=_minutes(min(a.start, b.start), max(a.end, b.end)),
                gpu_hours=a.gpu_hours + b.gpu_hours, gpu_cost=a.gpu_cost + b.gpu_cost,
                shared_idle_cost=a.shared_idle_cost + b.shared_idle_cost, total_cost=a.total_cost + b.total_cost,
                mem_used_mb_s=a.mem_used_mb_s + b.mem_used_mb_s, mem_granted_mb_s=a.mem_granted_mb_s + b.mem_granted_mb_s,
                mem_requested_mb_s=None if a.mem_requested_mb_s is None or b.mem_requested_mb_s is None
                else a.mem_requested_mb_s + b.mem_requested_mb_s,
                sm_used_s=a.sm_used_s + b.sm_used_s, sm_granted_s=a.sm_granted_s + b.sm_granted_s,
                sm_requested_s=None if a.sm_requested_s is None or b.sm_requested_s is None
                else a.sm_requested_s + b.sm_requested_s, seconds=a.seconds + b.seconds,
                energy_j=a.energy_j + b.energy_j, energy_cost_jp=plus(a.energy_cost_jp, b.energy_cost_jp),
                co2e_jkg=plus(a.co2e_jkg, b.co2e_jkg),
            )
    return out


def node_assets(scope: Scope, *, window: Window) -> list[ledger.NodeAssetRow]:
    """The GPU nodes of the window (OpenCost's /assets), for scopes that see the platform; none for
    a tenant scope (nodes and their cards' cost are the platform's)."""
    if not scope.sees_platform:
        return []
    window = align_window(window)
    return ledger.list_node_assets(start=window.start, end=window.end)
