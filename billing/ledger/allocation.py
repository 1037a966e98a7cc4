"""The allocation API's reads (for billing.queries.allocation): usage summed per set (a step
of the window) and per grouping key, and the platform's idle per set and node. Frozen rows in ledger
units; naming, idle sharing and scope rules are the query's.

A grouping key is one of GROUP_KEYS or `label:<name>`; each maps to a fixed SQL expression below
(label names and filter values travel as parameters, never in the statement text). Workload facts
the ledger rows lack (controller, labels, per-container requests) come from WorkloadMeta joined on
the ledger's own key and node (node, namespace, pod, pod_uid: a node describes only its own pods);
a workload without that row, or a label it does not carry, groups under UNALLOCATED, OpenCost's
name for it. A node without a cluster does too.

The window is read from the day ledger when it is whole UTC days and every set is (billing.ledger.
reads.ledger_for), else from hours; a set is the last of the sets' starts at or before a row
(`width_bucket`), so a set's rows are exactly those of its hours or days, for fixed steps and
calendar months alike. Every statement is one pass over the window's rows.
"""

from __future__ import annotations

import operator
import re
from collections import defaultdict
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any, NamedTuple

from billing.figures import FIGURE_LEVELS, FigureRow
from billing.ledger import reads
from billing.ledger.energy import any_energy_rate, energy_rate_join, window_energy
from billing.ledger.models import WorkloadMeta
from billing.ledger.reads import fetch_rows, period_read_cursor
from billing.ledger.requests import row_requested_sql, stored_requested
from billing.models.fleet import Node

__all__ = [
    "CONTROLLER_SQL",
    "GPU_KEYS",
    "GROUP_KEYS",
    "LABEL_PREFIX",
    "OPS",
    "UNALLOCATED",
    "AllOf",
    "AnyOf",
    "FigureRows",
    "FilterTree",
    "IdleRow",
    "Match",
    "NodeAssetRow",
    "UsageGroupRow",
    "is_group_key",
    "list_figure_rows",
    "list_idle_rows",
    "list_node_assets",
    "list_usage_groups",
    "reads_per_pod",
    "set_ledger",
    "tree_keys",
]

UNALLOCATED = "__unallocated__"
LABEL_PREFIX = "label:"
_DAY = timedelta(days=1)

_META = WorkloadMeta._meta.db_table
_NODE = Node._meta.db_table

# Grouping key -> SQL over the usage row `u`, its GPU row `g`, node `n` and metadata `m`.
_KEY_SQL: dict[str, str] = {
    "cluster": f"coalesce(nullif(n.cluster, ''), '{UNALLOCATED}')",
    "node": "n.name",
    "namespace": "u.namespace",
    # OpenCost writes kinds in lower case (`deployment`); agents report Kubernetes' `Deployment`.
    "controllerKind": f"coalesce(nullif(lower(m.controller_kind), ''), '{UNALLOCATED}')",
    # OpenCost names a controller "<kind>:<name>", so two kinds' same-named controllers stay apart.
    "controller": (f"CASE WHEN coalesce(m.controller_name, '') = '' THEN '{UNALLOCATED}' "
                   "WHEN m.controller_kind = '' THEN m.controller_name "
                   "ELSE lower(m.controller_kind) || ':' || m.controller_name END"),
    "controllerName": f"coalesce(nullif(m.controller_name, ''), '{UNALLOCATED}')",
    **{kind: (f"CASE WHEN lower(m.controller_kind) = '{kind}' AND m.controller_name <> '' "
              f"THEN m.controller_name ELSE '{UNALLOCATED}' END")
       for kind in ("deployment", "statefulset", "daemonset", "job")},
    # Agents report no Services nor annotations: every workload has none (OpenCost's unallocated).
    "service": f"'{UNALLOCATED}'::text",
    "pod": "u.pod",
    "container": "u.container",
    "tenant": "u.tenant",
    "gpu_model": "u.gpu_model",
    "sla_tier": "u.sla_tier",
    "gpu": "u.gpu_uuid",
}
GROUP_KEYS: tuple[str, ...] = tuple(_KEY_SQL)
ANNOTATION_PREFIX = "annotation:"
# Keys a GPU row has too: the only filters that narrow the platform's idle.
GPU_KEYS = frozenset({"cluster", "node", "gpu_model", "gpu"})
# A workload's controller as Explore's path names it (`deployment:bert`), over metadata `m`.
CONTROLLER_SQL = _KEY_SQL["controller"]
_GPU_KEY_SQL = {"cluster": _KEY_SQL["cluster"], "node": "n.name", "gpu_model": "g.gpu_model", "gpu": "g.gpu_uuid"}


def is_group_key(key: str) -> bool:
    return key in _KEY_SQL or any(key.startswith(p) and len(key) > len(p) for p in (LABEL_PREFIX, ANNOTATION_PREFIX))


def _key_sql(key: str, params: dict[str, Any]) -> str:
    if key in _KEY_SQL:
        return _KEY_SQL[key]
    if not is_group_key(key):
        raise ValueError(f"unknown grouping key {key!r}")
    if key.startswith(ANNOTATION_PREFIX):
        return f"'{UNALLOCATED}'::text"
    name = f"label_{len(params)}"
    params[name] = key[len(LABEL_PREFIX):]
    return f"coalesce(m.labels ->> %({name})s, '{UNALLOCATED}')"


def set_ledger(start: datetime, end: datetime, starts: Sequence[datetime] | None) -> reads.Ledger:
    """Days when the window and every set are whole UTC days, else hours."""
    ledger = reads.ledger_for(start, end)
    if starts is not None and any(s.hour or s.minute or s.second or s.microsecond for s in starts):
        return reads.hour_ledger(start)
    return ledger


class UsageGroupRow(NamedTuple):
    """Usage of one set (`set_start`) and one group (`keys`, in the order asked; `node` too when
    asked per node), ledger units. A requested figure is None when any row of the group has no
    known request. A named tuple, not a frozen dataclass: a per-pod month is ~40k of them at 1,000
    GPUs, and a frozen dataclass's `__init__` sets each of its 18 fields through
    `object.__setattr__` (docs/architecture.md, "Per-pod allocation reads")."""

    set_start: datetime
    keys: tuple[str, ...]
    node: str
    first_hour: datetime  # start of the first ledger hour with usage
    last_hour: datetime  # start of the last
    # The sums from `seconds` to `sm_requested_s` are floats where list_usage_groups was asked for
    # `floats` (_FLOAT_SUMS; the charge and idle share not with `exact_costs`): each the double
    # nearest to its exact sum.
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
    energy_j: Decimal  # attributed by the ledger's split of the cards' energy (docs/billing.md, Energy)
    # Σ joules × the price per kWh (× kg CO2e per kWh) of each row's location on its date; None where
    # some energy had none (billing.ledger.energy).
    energy_cost_jp: Decimal | None = None
    co2e_jkg: Decimal | None = None
    # With `floats` (and not `exact_costs`), charge + idle_share as one double: the double nearest their
    # exact sum, which the sum of their two doubles may miss by a unit in the last place. None otherwise.
    cost: float | None = None


_GROUP_ROW_SUMS = UsageGroupRow._fields[3:-1]
# A group's sums without its memory, requests and energy (list_usage_groups without `quantities`):
# OpenCost's summary of a per-pod month shows GPU-hours, cost and SM efficiency only, and the seven
# sums it does not show, the requests' pre-check and the energy rates' join were a third of the
# statement and of its rows' conversion (docs/benchmarks.md). The rows carry zeros and None (unknown)
# in their place, the values of a group that used no memory and asked for none.
_LEAN_READ = ("first_hour", "last_hour", "seconds", "share_gpu_s", "charge", "idle_share", "sm_used_s", "sm_granted_s")
_LEAN_SUMS = (("sum(u.seconds)", "seconds"), ("sum(u.share_gpu_s)", "share_gpu_s"), ("sum(u.charge)", "charge"),
              ("sum(u.idle_share)", "idle_share"), ("sum(u.sm_used_s)", "sm_used_s"), ("sum(u.sm_granted_s)", "sm_granted_s"))
_LEAN_MEMORY = (Decimal(0), Decimal(0), None)  # mem_used_mb_s, mem_granted_mb_s, mem_requested_mb_s
_LEAN_REST = (None, Decimal(0), Decimal(0), Decimal(0))  # sm_requested_s, energy_j, energy_cost_jp, co2e_jkg
# The sums list_usage_groups reads as float8 with `floats`: for a caller that writes them as JSON
# numbers (the allocation API), Postgres' exact sum converted once to the nearest double is the
# float the Decimal would give, and it costs less to make than the Decimal alone: a per-pod month is
# ~40k rows of ten such sums at 1,000 GPUs, and their numeric text, Decimals and float() were ~0.3 s
# of the answer against ~0.1 s as float8 (docs/benchmarks.md). Energy stays exact: its cost is
# rounded at ledger precision before it is written.
_FLOAT_SUMS = frozenset({"seconds", "share_gpu_s", "charge", "idle_share", "mem_used_mb_s", "mem_granted_mb_s",
                        "mem_requested_mb_s", "sm_used_s", "sm_granted_s", "sm_requested_s"})
_COSTS = frozenset({"charge", "idle_share"})


def _set_sql(at: str, alias: str, starts: Sequence[datetime] | None, params: dict[str, Any]) -> str:
    """The start of the set a row belongs to: the window start, or the last of `starts` (sorted,
    the first the window's start) at or before the row (so calendar months, of unequal length,
    are sets as well as fixed steps)."""
    if starts is None:
        return "%(start)s::timestamptz"
    params["starts"] = list(starts)
    return (f"(%(starts)s::timestamptz[])[width_bucket({alias}.{at}, %(starts)s::timestamptz[])]")


def _filters_sql(filters: Mapping[str, Sequence[str]], params: dict[str, Any], sql_of: Any) -> str:
    clauses = []
    for key in sorted(filters):
        name = f"filter_{len(params)}"
        params[name] = list(filters[key])
        clauses.append(f"{sql_of(key, params)} = ANY(%({name})s::text[])")
    return "".join(f" AND {c}" for c in clauses)


@dataclass(frozen=True)
class Match:
    """One comparison of OpenCost's filter language: `key` (a grouping key) `op` any of `values`
    (for a negated op: none of them)."""

    key: str
    op: str  # one of OPS
    values: tuple[str, ...]


@dataclass(frozen=True)
class AllOf:
    parts: tuple[FilterTree, ...]


@dataclass(frozen=True)
class AnyOf:
    parts: tuple[FilterTree, ...]


FilterTree = Match | AllOf | AnyOf
# op -> SQL of one value `v` against the expression `x`; the `!` ops are their negations.
_OP_SQL = {"eq": "{x} = {v}", "contains": "strpos({x}, {v}) > 0", "prefix": "starts_with({x}, {v})",
           "suffix": "right({x}, length({v})) = {v}"}
OPS = frozenset({*_OP_SQL, *(f"!{op}" for op in _OP_SQL)})


def tree_keys(tree: FilterTree | None) -> set[str]:
    if tree is None:
        return set()
    if isinstance(tree, Match):
        return {tree.key}
    return set().union(*(tree_keys(p) for p in tree.parts))


def _tree_sql(tree: FilterTree, params: dict[str, Any], sql_of: Any) -> str:
    """The tree as a SQL condition; values travel as parameters. `sql_of(key, params)` None: a key
    this read has no column for, taken as true (idle has no namespace: such a filter keeps it)."""
    if isinstance(tree, AllOf | AnyOf):
        joiner = " AND " if isinstance(tree, AllOf) else " OR "
        return "(" + (joiner.join(_tree_sql(p, params, sql_of) for p in tree.parts) or "TRUE") + ")"
    x = sql_of(tree.key, params)
    if x is None:
        return "TRUE"
    name = f"filter_{len(params)}"
    params[name] = list(tree.values)
    one = _OP_SQL[tree.op.lstrip("!")].format(x=f"({x})", v="v")
    found = f"EXISTS (SELECT 1 FROM unnest(%({name})s::text[]) AS v WHERE {one})"  # noqa: S608 - fixed SQL, values are parameters
    return f"(NOT {found})" if tree.op.startswith("!") else found


_META_ON = "m.node_id = u.node_id AND m.namespace = u.namespace AND m.pod = u.pod AND m.pod_uid = u.pod_uid"


def _meta_join(ledger: reads.Ledger, tenants: Collection[str] | None) -> str:
    """A usage row's metadata (its pod's, on its node). The metadata is kept for good, a row per pod
    ever run, and the join (hashed: the period reads' nested loops are off) hashes all of it, the
    fleet's whole history. A read of some tenants' days and months (about a row per pod and day, or
    per pod for whole months, of a fraction of the fleet's pods) looks each row's up in the
    metadata's key instead, behind a fence (OFFSET 0) that keeps it a lookup: it grows with those
    tenants' rows, not with the history. With 13 months of the 1,000-GPU bench's pods' metadata
    (510k rows) the biggest tenant's month page took 1.44 s hashing it and 1.08 s probing, its last 7
    days 0.93 and 0.68 s; with one month's (39k rows) both the same (docs/benchmarks.md). A read of
    the whole fleet probes about as many rows as a month's metadata holds (/finance/'s month 0.83 ->
    0.93 s with one month's) and a read of hours dozens of rows per pod: both hash. What would bound
    those too is the slim per-pod ledger's pod id (docs/scaling.md, "Held under 2 TB"): filtering
    the metadata by its [first_seen, last_seen) would hold only for rows the rollup writes, and an
    index on `last_seen` would cost every batch's upsert its HOT update."""
    if tenants is not None and ledger.at == "day":
        return f" LEFT JOIN LATERAL (SELECT * FROM {_META} m WHERE {_META_ON} OFFSET 0) m ON true"  # noqa: S608 - the model's own table
    return f" LEFT JOIN {_META} m ON {_META_ON}"


# The groups' and idle's reads hash: the planner sorted the rows (every hour row of a week of hourly
# sets, 922k at 1,000 GPUs, on disk) for merge joins into the requests (a relation they joined
# then, before the rows stored their requested figures) and for sorted aggregates.
# Hash joins and hash aggregates took a week's hourly sets from 10.5 s to 5.8 s (groups) and 6.2 s
# to 4.5 s (idle), a per-pod month's groups from 1.1 s to 0.9 s, on the loaded bench machine
# (EXPLAIN ANALYZE, docs/benchmarks.md).
_GROUP_READ_SETTINGS = {"enable_sort": "off", "enable_mergejoin": "off", "work_mem": "64MB"}
# Keys that name a pod or its container make about as many groups as rows (a per-pod month: 39k
# groups of 39k month rows at 1,000 GPUs). Those groups are sorted, not hashed: their running sums
# (about 3 kB a group, 130 MB there) overflow the hash table to disk, and the statement took
# 0.34-0.37 s sorted against 0.41-0.46 s hashed (EXPLAIN ANALYZE, five runs each). Fewer, bigger
# groups (a namespace, a day) still hash.
_PER_POD_KEYS = frozenset({"pod", "container"})
_PER_POD_READ_SETTINGS = {**_GROUP_READ_SETTINGS, "enable_sort": "on", "enable_hashagg": "off"}


# The keys that tell most rows apart first (a pod's name before its container's, its node or cluster):
# where the groups are sorted (_PER_POD_KEYS) a sort compares the first key of two rows and stops
# there when they differ. A per-pod-and-container month's 45k rows by cluster, node, namespace, pod
# and container compared the one cluster of every row first: its statement 257-266 ms, 208-230 ms
# by pod first (EXPLAIN ANALYZE, alternating four times). Groups are the same in any order.
_MOST_DISTINCT_FIRST = ("pod", "gpu", "controller", "controllerName", "deployment", "statefulset", "daemonset",
                        "job", "node", "namespace", "container", "controllerKind", "sla_tier", "gpu_model", "tenant")


def _most_distinct_first(keys: Sequence[str]) -> list[int]:
    """The keys' positions by _MOST_DISTINCT_FIRST, labels and annotations after the named keys."""
    def rank(i: int) -> int:
        key = keys[i]
        return _MOST_DISTINCT_FIRST.index(key) if key in _MOST_DISTINCT_FIRST else len(_MOST_DISTINCT_FIRST)

    return sorted(range(len(keys)), key=rank)


def _group_by(keys: Sequence[str]) -> str:
    """list_usage_groups' GROUP BY: the keys' columns (2 on, after the set's) by _MOST_DISTINCT_FIRST,
    then the set's column and the node's."""
    return ", ".join(str(c) for c in [*(i + 2 for i in _most_distinct_first(keys)), 1, len(keys) + 2])


def reads_per_pod(keys: Sequence[str]) -> bool:
    """Whether groups of these keys are about a row each (a pod's or its container's): the reads
    worth splitting into parts (list_usage_groups' `part`)."""
    return bool(_PER_POD_KEYS & set(keys))


def _part_sql(key_sql: Sequence[str], keys: Sequence[str], part: tuple[int, int], params: dict[str, Any]) -> str:
    """Rows whose most distinct key hashes to part[0] of part[1] (a power of two): every row of a
    group is in one part, and the parts together are every row once (a NULL key hashes as '')."""
    index, count = part
    if count < 1 or count & (count - 1) or not 0 <= index < count:
        raise ValueError(f"part {index} of {count}: the count must be a power of two above the index")
    params["part_mask"], params["part_index"] = count - 1, index
    first = key_sql[_most_distinct_first(keys)[0]]
    return f" AND (hashtext(coalesce(({first})::text, '')) & %(part_mask)s) = %(part_index)s"


def list_usage_groups(
    *, start: datetime, end: datetime, starts: Sequence[datetime] | None, keys: Sequence[str],
    filters: Mapping[str, Sequence[str]], tenants: Collection[str] | None, by_node: bool,
    tree: FilterTree | None = None, limit: int | None = None, rates: bool | None = None, quantities: bool = True,
    floats: bool = False, exact_costs: bool = False, part: tuple[int, int] | None = None,
) -> list[UsageGroupRow]:
    """Usage of [start, end) per set (from each of `starts`, sorted, the first `start`; None: one
    set) and per value of `keys` (and per node with `by_node`), of `tenants` only unless None, of
    rows matching every filter (key -> allowed values) and `tree`. Unordered. With `limit`, at most
    that many, which ones unsaid: for a caller that refuses a larger answer rather than reads it.
    `rates`: billing.ledger.energy.any_energy_rate() where the caller asked already (None: asked here).
    Without `quantities`, the rows' memory, requests and energy are not read (_LEAN_READ): for a
    caller that shows none of them. With `floats`, the _FLOAT_SUMS are floats: for a caller that
    writes them as JSON numbers and adds none of them up; with `exact_costs` too, but the charge and
    idle share, which stay Decimals (and no cost is read): for a caller that splits idle by them.
    With `part` (i, n), only the groups in part i of n (_part_sql): a caller reads the parts of a
    large answer side by side, each a statement of its own."""
    ledger = set_ledger(start, end, starts)
    params: dict[str, Any] = {"start": start, "end": end,
                              "tenants": None if tenants is None else sorted(tenants)}
    key_sql = [_key_sql(k, params) for k in keys]
    where = _filters_sql(filters, params, _key_sql)
    if tree is not None:
        where += f" AND {_tree_sql(tree, params, _key_sql)}"
    # A row is grouped or filtered by its GPU row's model only where it has a GPU row (the rollup
    # writes both; a hand-written ledger may not).
    needs_gpu = "gpu_model" in keys or "gpu_model" in filters or "gpu_model" in tree_keys(tree)
    if needs_gpu:
        where += " AND u.gpu_model IS NOT NULL"
    if part is not None:
        where += _part_sql(key_sql, keys, part, params)
    rows_sql = reads.usage_rows(ledger, start, end, params, months=reads.month_range(ledger, start, end, starts=starts),
                                model=needs_gpu, requested=True)
    # Each key its own column (not one array per row to hash and parse), the set as its index in
    # `starts` (not a timestamp to parse per row): both turned back into the row's fields below. The
    # keys in the "C" collation: groups are the same (equal is equal bytes in any deterministic
    # collation), nothing is ordered by them (Python sorts the groups), and a sort of a per-pod month's
    # 45k rows compares bytes instead of calling strcoll (the statement 220-327 -> 194-205 ms).
    key_columns = "".join(f'({s})::text COLLATE "C" AS k_{i}, ' for i, s in enumerate(key_sql))
    set_index = "width_bucket(u.at, %(starts)s::timestamptz[])" if starts is not None else "1"
    if starts is not None:
        params["starts"] = list(starts)
    node = "n.name" if by_node else "''"
    # The rows' stored requested figures (billing.ledger.requests), not a join of each to the requests.
    requested = stored_requested() if quantities else None
    # The metadata and the node only where a key or filter reads them (each is at most one row per
    # usage row, and every usage row has its node): a join per row less (~0.5 s of a week's hourly
    # sets at 1,000 GPUs).
    read = " ".join([*key_sql, where, node])
    meta = _meta_join(ledger, tenants) if re.search(r"\bm\.", read) else ""
    node_join = f" JOIN {_NODE} n ON n.id = u.node_id" if re.search(r"\bn\.", read) else ""
    sum_columns: tuple[tuple[str, str], ...]  # (SQL, name)
    if requested is None:
        sum_columns, joins = _LEAN_SUMS, ""
    else:
        energy = window_energy("u", "at", "energy_j", rates=any_energy_rate() if rates is None else rates, within=params)
        # A group's requested figure is known only if every one of its rows' is: its request (a row's
        # seconds are never NULL), not the product, which Postgres would compute a second time per row
        # (~0.1 s of a week's hourly sets at 1,000 GPUs).
        sum_columns = (
            ("sum(u.seconds)", "seconds"), ("sum(u.share_gpu_s)", "share_gpu_s"), ("sum(u.charge)", "charge"),
            ("sum(u.idle_share)", "idle_share"), ("sum(u.mem_used_mb_s)", "mem_used_mb_s"),
            ("sum(u.mem_granted_mb_s)", "mem_granted_mb_s"),
            (f"CASE WHEN bool_and({requested.mem_mb} IS NOT NULL) THEN sum({requested.mem_mb}) END", "mem_requested_mb_s"),
            ("sum(u.sm_used_s)", "sm_used_s"), ("sum(u.sm_granted_s)", "sm_granted_s"),
            (f"CASE WHEN bool_and({requested.sm} IS NOT NULL) THEN sum({requested.sm}) END", "sm_requested_s"),
            ("sum(u.energy_j)", "energy_j"), (energy.cost, "energy_cost_jp"), (energy.co2e, "co2e_jkg"),
        )
        joins = f"{energy.join}{requested.join}"
    as_floats = (_FLOAT_SUMS - _COSTS if exact_costs else _FLOAT_SUMS) if floats else frozenset()
    sums = ", ".join(f"({sql})::float8 AS {name}" if name in as_floats else f"{sql} AS {name}" for sql, name in sum_columns)
    cost = floats and not exact_costs
    if cost:
        sums += ", (sum(u.charge) + sum(u.idle_share))::float8 AS cost"
    sql = (
        f"SELECT {set_index} AS set_index, {key_columns}{node} AS node, "  # noqa: S608 - fixed SQL
        f"min(u.first_hour) AS first_hour, max(u.last_hour) AS last_hour, {sums} "
        f"FROM {rows_sql} u{node_join}{joins}{meta} "
        f"WHERE TRUE{where} GROUP BY {_group_by(keys)}"
        + ("" if limit is None else " LIMIT %(limit)s")
    )
    params["limit"] = limit
    read_sums = _GROUP_ROW_SUMS if quantities else _LEAN_READ
    expected = ("set_index", *(f"k_{i}" for i in range(len(key_sql))), "node", *read_sums, *(("cost",) if cost else ()))
    set_starts = [None, *(starts or [start])]  # width_bucket counts from 1
    settings = _PER_POD_READ_SETTINGS if _PER_POD_KEYS & set(keys) else _GROUP_READ_SETTINGS
    with period_read_cursor(settings) as cur:
        cur.execute(sql, params)
        names = tuple(column.name for column in cur.description)
        if names != expected:
            raise TypeError(f"the statement's columns {names} are not {expected}")
        # Built by position, the columns being the fields in order (checked above): a per-pod month is
        # ~40k rows at 1,000 GPUs.
        after = len(key_sql) + 1
        # Without the cost column, None in its place.
        no_cost = () if cost else (None,)
        if quantities:
            return [tuple.__new__(UsageGroupRow, (set_starts[v[0]], v[1:after], *v[after:], *no_cost))
                    for v in cur.fetchall()]
        # The node, the lean sums from first_hour to idle_share, then sm_used_s and sm_granted_s (_LEAN_READ).
        sm, rest = after + 7, after + 9
        return [tuple.__new__(UsageGroupRow, (set_starts[v[0]], v[1:after], *v[after:sm], *_LEAN_MEMORY, *v[sm:rest],
                                              *_LEAN_REST, *v[rest:], *no_cost)) for v in cur.fetchall()]


# The pod instance is a grouping the figures need (two instances of a StatefulSet's pod share a
# name); the allocation API has no such key, so it is not one of GROUP_KEYS.
_FIGURE_KEY_SQL = {**_KEY_SQL, "pod_uid": "u.pod_uid"}
_POD_LEVEL = FIGURE_LEVELS.index("pod") + 1

# The figure read aggregates in two steps. First the period's usage rows (`base`: each row with what
# its keys and figures need joined, nothing summed) per leaf (every key of every level asked, and
# the container), with nothing but sums, mins and flags; then the leaves per level (GROUPING SETS),
# where the sorts of each set and the distinct lists of containers and tiers meet one row per leaf
# instead of one per usage row (a pod's days or hours).
# Sums of numeric are exact, so summing sums gives Postgres' own figures to the last digit; a
# figure unknown in any row (a request, an energy price) stays unknown through a flag per leaf.
_BASE_COLUMNS = (
    "u.first_hour, u.last_hour, u.seconds, u.share_gpu_s, u.charge, u.idle_share, u.mem_used_mb_s, u.mem_granted_mb_s, "
    f"u.sm_used_s, u.sm_granted_s, {row_requested_sql('mem_mb')} AS mem_req, {row_requested_sql('sm')} AS sm_req, "
    "u.energy_j, er.price_per_kwh, er.co2e_kg_per_kwh"
)
_LEAF_SUMS = (
    "min(u.first_hour) AS first_hour, max(u.last_hour) AS last_hour, "
    "sum(u.seconds) AS seconds, sum(u.share_gpu_s) AS share_gpu_s, sum(u.charge) AS charge, "
    "sum(u.idle_share) AS idle_share, sum(u.mem_used_mb_s) AS mem_used_mb_s, "
    "sum(u.mem_granted_mb_s) AS mem_granted_mb_s, sum(u.sm_used_s) AS sm_used_s, sum(u.sm_granted_s) AS sm_granted_s, "
    "bool_and(u.mem_req IS NOT NULL) AS mem_req_known, sum(u.mem_req) AS mem_req, "
    "bool_and(u.sm_req IS NOT NULL) AS sm_req_known, sum(u.sm_req) AS sm_req, sum(u.energy_j) AS energy_j, "
    # billing.ledger.energy's known sums, split: the flag and the sum, recombined per level.
    "bool_and(u.energy_j = 0 OR u.price_per_kwh IS NOT NULL) AS cost_known, "
    "sum(u.energy_j * coalesce(u.price_per_kwh, 0)) AS energy_cost_jp, "
    "bool_and(u.energy_j = 0 OR u.co2e_kg_per_kwh IS NOT NULL) AS co2e_known, "
    "sum(u.energy_j * coalesce(u.co2e_kg_per_kwh, 0)) AS co2e_jkg"
)
# A leaf that is one usage row (_LEAF_SUMS of one row, column by column): _leaf_sql.
_LEAF_ROW = (
    "u.first_hour, u.last_hour, u.seconds, u.share_gpu_s, u.charge, u.idle_share, u.mem_used_mb_s, "
    "u.mem_granted_mb_s, u.sm_used_s, u.sm_granted_s, u.mem_req IS NOT NULL AS mem_req_known, u.mem_req, "
    "u.sm_req IS NOT NULL AS sm_req_known, u.sm_req, u.energy_j, "
    "u.energy_j = 0 OR u.price_per_kwh IS NOT NULL AS cost_known, "
    "u.energy_j * coalesce(u.price_per_kwh, 0) AS energy_cost_jp, "
    "u.energy_j = 0 OR u.co2e_kg_per_kwh IS NOT NULL AS co2e_known, "
    "u.energy_j * coalesce(u.co2e_kg_per_kwh, 0) AS co2e_jkg"
)
# The planner takes every usage row for a leaf of its own (it cannot know a pod spans days) and
# sorts them all to group them, on disk: at 1,000 GPUs x 16 workloads 150 MB, 8 s of the month's
# 20 s statement. Hashing them (the leaves fit in memory: a row per pod instance and container) took
# the statement from 12-18 s to 7-8 s there (docs/benchmarks.md). The per-level sets still sort: the
# distinct lists need it.
_FIGURE_READ_SETTINGS = {"enable_sort": "off"}
_LEVEL_SUMS = (
    "min(first_hour) AS first_hour, max(last_hour) AS last_hour, sum(seconds) AS seconds, "
    "sum(share_gpu_s) AS share_gpu_s, sum(charge) AS charge, sum(idle_share) AS idle_share, "
    "sum(mem_used_mb_s) AS mem_used_mb_s, sum(mem_granted_mb_s) AS mem_granted_mb_s, sum(sm_used_s) AS sm_used_s, "
    "sum(sm_granted_s) AS sm_granted_s, "
    "CASE WHEN bool_and(mem_req_known) THEN sum(mem_req) END AS mem_requested_mb_s, "
    "CASE WHEN bool_and(sm_req_known) THEN sum(sm_req) END AS sm_requested_s, "
    "sum(energy_j) AS energy_j, CASE WHEN bool_and(cost_known) THEN sum(energy_cost_jp) END AS energy_cost_jp, "
    "CASE WHEN bool_and(co2e_known) THEN sum(co2e_jkg) END AS co2e_jkg"
)


@dataclass(frozen=True)
class FigureRows:
    """list_figure_rows' answer: the rows, and with `top_pods` the pod instances each tenant has
    (its tree then holds only some of them)."""

    rows: list[FigureRow]
    pod_instances: dict[str, int]


@dataclass(frozen=True)
class _Part:
    """Grouping sets of the figure read summed in one SELECT, over the leaves `where` holds."""

    sets: list[tuple[str, ...]]
    where: str = ""


def _kept_pods_sql(path: Sequence[str], k: Mapping[str, str], top_order: Sequence[str]) -> tuple[str, str, dict[str, str]]:
    """With top_pods: the CTEs that rank the pod instances of `base` (`top`) and count them per
    namespace (`counts`), the joins that find a leaf's pod among those kept, and the leaf's keys
    of pod and pod instance (NULL where not kept)."""
    instance = ", ".join(k[c] for c in path)
    ranked = ", ".join(f'{k[c]} COLLATE "C"' for c in top_order or path)
    # Which pod instances are the costliest needs two sums per pod instance, not every figure per
    # leaf: the rows are read once (materialised) for the ranking and for the leaves, which then keep
    # only the pods the tree shows.
    ctes = (
        f", pods AS (SELECT {instance}, sum(charge) + sum(idle_share) AS cost FROM base GROUP BY {instance}), "  # noqa: S608 - fixed SQL
        f"top AS (SELECT {instance} FROM pods ORDER BY cost DESC, {ranked} LIMIT %(top)s), "
        # Each tenant's pod instances, counted per namespace (that level is whole).
        f"counts AS (SELECT {k['tenant']}, {k['namespace']}, count(*) AS pod_instances FROM pods "
        f"GROUP BY {k['tenant']}, {k['namespace']})"
    )
    # A pod is kept in the controllers of the top pod instances (its figure is apportioned among
    # them), a pod instance (and its pod) where a top one's pod name is. Elsewhere the key is NULL (no
    # key of the ledger is): a controller's other pods are one leaf per line and container, summed
    # into the levels above and in no pod's set.
    names = [c for c in path if c in ("tenant", "namespace", "pod")]  # a pod's name, across controllers
    kept = "".join(
        f" LEFT JOIN (SELECT DISTINCT {', '.join(k[c] for c in on)}, true AS hit FROM top) {alias} "  # noqa: S608 - fixed SQL
        f"USING ({', '.join(k[c] for c in on)})"
        for alias, on in (("c", path[:_POD_LEVEL]), ("p", names)))
    pod, uid = k[path[_POD_LEVEL]], k[path[_POD_LEVEL + 1]]
    return ctes, kept, {path[_POD_LEVEL]: f"CASE WHEN c.hit OR p.hit THEN u.{pod} END",
                        path[_POD_LEVEL + 1]: f"CASE WHEN p.hit THEN u.{uid} END"}


def _levels_sql(parts: Sequence[_Part], sets: Sequence[tuple[str, ...]], columns: Sequence[str],
                k: Mapping[str, str]) -> tuple[str, dict[tuple[int, int], int]]:
    """The leaves summed per level, one SELECT per part; and (part, GROUPING's mask) -> level.
    GROUPING's mask has a bit set for each column of its part a row is not grouped by (the part's
    first column the highest bit)."""
    levels: dict[tuple[int, int], int] = {}
    selects = []
    for i, part in enumerate(parts):
        grouped = [c for c in columns if any(c in one for one in part.sets)]
        for one in part.sets:
            levels[i, sum(1 << (len(grouped) - 1 - j) for j, c in enumerate(grouped) if c not in one)] = sets.index(one)
        selects.append(
            f"SELECT {i} AS part, GROUPING({', '.join(k[c] for c in grouped)}) AS mask, "  # noqa: S608 - fixed SQL
            + ", ".join(k[c] if c in grouped else f"NULL::text AS {k[c]}" for c in columns) + ", "
            # Names order as Python orders str (code points: "C"), whatever the database's collation.
            'array_agg(DISTINCT container COLLATE "C" ORDER BY container COLLATE "C") AS containers, '
            f'array_agg(DISTINCT {k["sla_tier"]} COLLATE "C" ORDER BY {k["sla_tier"]} COLLATE "C") AS sla_tiers, '
            f"{_LEVEL_SUMS} FROM leaf{part.where} GROUP BY GROUPING SETS "
            f"({', '.join('(' + ', '.join(k[c] for c in one) + ')' for one in part.sets)})"
        )
    return " UNION ALL ".join(selects), levels


def _leaf_sql(keys: str, key_count: int, kept: str, *, whole_months: bool, top_pods: bool) -> str:
    """The leaves of the figure read: the base rows summed per leaf (`keys`, the first `key_count`
    columns, through the `kept` pods' joins); in a read of whole months down to pod instances, each
    row of a pod with its own leaf is that leaf on its own (_LEAF_ROW): a month row per pod, card
    and container, and the day rows of the day or two not yet closed into them, so summing them per
    leaf first gained nothing and was a sixth of the portal's month statement at 1,000 GPUs. The
    pods a top read does not keep are one leaf per line, controller and container: summed first."""
    def summed(where: str = "") -> str:
        # By position: the kept pods' joins have columns of the keys' names.
        return (f"SELECT {keys}, {_LEAF_SUMS} FROM base u{kept}{where} "  # noqa: S608 - fixed SQL
                f"GROUP BY {', '.join(map(str, range(1, key_count + 1)))}")

    if not whole_months:
        return summed()
    own = f"SELECT {keys}, {_LEAF_ROW} FROM base u{kept}"  # noqa: S608 - fixed SQL
    if not top_pods:
        return own
    return f"{own} WHERE c.hit OR p.hit UNION ALL {summed(' WHERE NOT coalesce(c.hit OR p.hit, false)')}"


def list_figure_rows(
    *, start: datetime, end: datetime, depth: int, filters: Mapping[str, Sequence[str]],
    tenants: Collection[str] | None, top_pods: int | None = None, top_order: Sequence[str] = (),
) -> FigureRows:
    """Usage of [start, end) of `tenants` (None: all) matching every filter (key -> allowed values),
    summed per invoice line (tenant, GPU model, SLA tier) and per node of each tenant's tree down
    to FIGURE_LEVELS[depth - 1], in one statement (GROUPING SETS): every level's sums are Postgres',
    exact. Unordered.

    With `top_pods` (depth: the pod instance) the tree holds the `top_pods` costliest pod instances
    (by cost, then by the keys of `top_order`, default the path, in code-point order: as the page
    ranks them) and only what their shown figures are apportioned among: the pods of their
    controllers and every instance of their pods' names, not the period's every pod (the dashboard
    shows ten; a month of 1,000 GPUs runs ~100k). The levels above are whole, and each tenant's
    count of pod instances comes with it. Other nodes of those levels are partial: their figures
    are not to be shown."""
    if not 1 <= depth <= len(FIGURE_LEVELS):
        raise ValueError(f"depth must be 1..{len(FIGURE_LEVELS)}")
    if top_pods is not None and depth != FIGURE_LEVELS.index("pod_uid") + 1:
        raise ValueError("top_pods needs the tree down to pod instances")
    ledger = set_ledger(start, end, None)
    months = reads.month_range(ledger, start, end)
    params: dict[str, Any] = {"start": start, "end": end, "tenants": None if tenants is None else sorted(tenants)}
    where = _filters_sql(filters, params, _key_sql)
    path = ["tenant", *(k for level in FIGURE_LEVELS[:depth] for k in (("node", "gpu") if level == "gpu" else (level,)))]
    columns = ["tenant", "gpu_model", "sla_tier", *path[1:]]
    k = {name: f"k_{i}" for i, name in enumerate(columns)}
    # The rows' GPU model: a usage row always has its GPU row (the rollup writes both), but a
    # model is only a line's name, so a row without one stays (model "").
    expr = {c: f"({_FIGURE_KEY_SQL[c]})::text" for c in columns} | {"gpu_model": "(coalesce(u.gpu_model, ''))::text"}
    # The node only where a key or filter reads it (every usage row has its node).
    node = f" JOIN {_NODE} n ON n.id = u.node_id" if re.search(r"\bn\.", " ".join([*expr.values(), where])) else ""
    rows = reads.usage_rows(ledger, start, end, params, months=months, model=True, requested=True)
    base = (
        f"SELECT {', '.join(f'{expr[c]} AS {k[c]}' for c in columns)}, u.container::text AS container, "  # noqa: S608 - fixed SQL
        f"{_BASE_COLUMNS} FROM {rows} u{node}{energy_rate_join('u', 'at', within=params)}{_meta_join(ledger, tenants)} "
        f"WHERE TRUE{where}"
    )
    sets: list[tuple[str, ...]] = [("tenant", "gpu_model", "sla_tier")]
    sets += [tuple(path[: i + 1]) for i in range(1, len(path)) if path[i] != "node"]
    leaf_keys = {c: f"u.{k[c]}" for c in columns}
    ctes, kept, parts = "", "", [_Part(sets)]
    if top_pods is not None:
        params["top"] = top_pods
        ctes, kept, kept_keys = _kept_pods_sql(path, k, top_order)
        leaf_keys |= kept_keys
        pod, uid = k[path[_POD_LEVEL]], k[path[_POD_LEVEL + 1]]
        # The sets of every leaf; the pods' over the leaves of the pods kept; the pod instances' over
        # the leaves of the instances kept only (those a top one's name kept, not every pod of its
        # controller). One statement grouping both sets of the kept pods summed an instance for each
        # of a month's ~10k pods at 1,000 GPUs, to keep the ~100 a page shows (a fifth of it).
        parts = [_Part([s for s in sets if "pod" not in s]),
                 _Part([s for s in sets if "pod" in s and "pod_uid" not in s], where=f" WHERE {pod} IS NOT NULL"),
                 _Part([s for s in sets if "pod_uid" in s], where=f" WHERE {uid} IS NOT NULL")]
    leaf = _leaf_sql(f"{', '.join(f'{leaf_keys[c]} AS {k[c]}' for c in columns)}, u.container", len(columns) + 1,
                     kept, whole_months=months == (start, end) and "pod_uid" in path, top_pods=top_pods is not None)
    body, levels = _levels_sql(parts, sets, columns, k)
    if top_pods is not None:
        part, mask = next(key for key, level in levels.items() if level == 1)
        body = (f"SELECT f.*, coalesce(counts.pod_instances, 0) AS pod_instances FROM ({body}) f "  # noqa: S608 - fixed SQL
                f"LEFT JOIN counts ON f.part = {part} AND f.mask = {mask} AND counts.{k['tenant']} = f.{k['tenant']} "
                f"AND counts.{k['namespace']} = f.{k['namespace']}")
    # A CTE read twice is materialised: with top_pods, the rows (ranked, then summed) and the leaves.
    sql = f"WITH base AS ({base}){ctes}, leaf AS ({leaf}) {body}"
    out: list[FigureRow] = []
    pod_instances: dict[str, int] = defaultdict(int)
    with period_read_cursor(_FIGURE_READ_SETTINGS) as cur:
        cur.execute(sql, params)
        at = {c[0]: i for i, c in enumerate(cur.description)}
        # Each row taken apart by position, with getters made once: a month's portal reads ~10k rows
        # of thirty columns at 1,000 GPUs, and a dict per row and FigureRow's fields by name made this
        # loop take 40 % longer.
        figures = operator.itemgetter(*(at[name] for name in FigureRow._fields[4:]))
        # A tuple each: every level has two keys or more (a line's three, a node's tenant and its own).
        keys_of = {level: operator.itemgetter(*(at[f"k_{i}"] for i, c in enumerate(columns) if c in sets[level]))
                   for level in set(levels.values())}
        part, mask, containers, tiers = at["part"], at["mask"], at["containers"], at["sla_tiers"]
        tenant, instances = at["k_0"], at.get("pod_instances")
        for raw in cur.fetchall():
            level = levels[raw[part], raw[mask]]
            if instances is not None and level == 1:
                pod_instances[raw[tenant]] += raw[instances]
            # By position (the columns from first_hour on are FigureRow's fields in order, looked up
            # by name above): tuple.__new__ skips the named tuple's Python-level __new__.
            out.append(tuple.__new__(FigureRow, (level, keys_of[level](raw), tuple(raw[containers]),
                                                 tuple(raw[tiers]), *figures(raw))))
    return FigureRows(out, dict(pod_instances))


@dataclass(frozen=True)
class IdleRow:
    """The platform's idle of one set (and node, with `by_node`; else node ""): the idle cost no
    tenant is invoiced (idle_cost - idle_allocated), the cards' metered seconds and the tenants'
    share of them, and every tenant's charge on those cards (the weights for sharing idle)."""

    set_start: datetime
    node: str
    cluster: str
    platform_idle: Decimal
    metered_seconds: Decimal
    share_gpu_s: Decimal
    charge: Decimal
    currency: str
    idle_energy_j: Decimal  # the cards' energy no workload is attributed
    # Σ that energy's joules × price per kWh (× kg CO2e per kWh) of its location; None: some had none.
    energy_cost_jp: Decimal | None = None
    co2e_jkg: Decimal | None = None


def list_idle_rows(
    *, start: datetime, end: datetime, starts: Sequence[datetime] | None, filters: Mapping[str, Sequence[str]],
    by_node: bool, tree: FilterTree | None = None, rates: bool | None = None,
) -> list[IdleRow]:
    """Per set (and node) of [start, end): the GPU rows' platform idle and metered seconds, and the
    share and charge of the usage on them (every tenant's), restricted by the filters on GPU_KEYS
    only (the others name workloads, which idle has none of). Unordered.

    The usage on a card is the GPU row's own sums: `charged` (Σ its workloads' charge, as priced)
    and `share_gpu_s` (Σ their share, written with them), so a usage row counts exactly where it
    has a GPU row, and the usage rows are not read again: for a week's hourly sets at 1,000 GPUs
    that read was 0.9 s of the 1.0 s of this statement (docs/benchmarks.md). `rates` as
    list_usage_groups'."""
    ledger = set_ledger(start, end, starts)
    params: dict[str, Any] = {"start": start, "end": end}
    where = _filters_sql({k: v for k, v in filters.items() if k in GPU_KEYS}, params, lambda key, _params: _GPU_KEY_SQL[key])
    if tree is not None:
        where += f" AND {_tree_sql(tree, params, lambda key, _params: _GPU_KEY_SQL.get(key))}"
    # Per node only when asked (its id: node names are unique); else one group per set.
    cards_by = "g.node_id" if by_node else "0"
    at = ledger.at
    node, cluster = ("n.name", _KEY_SQL["cluster"]) if by_node else ("''", "''")
    node_join = f" JOIN {_NODE} n ON n.id = c.node_id" if by_node else ""
    energy = window_energy("g", at, "idle_energy_j", rates=any_energy_rate() if rates is None else rates, within=params)
    sql = (
        # The GPU rows per set (and node): energy is priced per GPU row, by its date.
        f"WITH cards AS (SELECT {_set_sql(at, 'g', starts, params)} AS set_start, {cards_by} AS node_id, "  # noqa: S608 - fixed SQL
        "sum(g.idle_cost - g.idle_allocated) AS platform_idle, sum(g.metered_seconds) AS metered_seconds, "
        "sum(g.share_gpu_s) AS share_gpu_s, sum(g.charged) AS charge, "
        "max(nullif(g.currency, '')) AS currency, sum(g.idle_energy_j) AS idle_energy_j, "
        f"{energy.cost} AS energy_cost_jp, {energy.co2e} AS co2e_jkg "
        f"FROM {ledger.gpu_table} g JOIN {_NODE} n ON n.id = g.node_id{energy.join} "
        f"WHERE g.{at} >= %(start)s AND g.{at} < %(end)s{where} GROUP BY 1, 2) "
        f"SELECT c.set_start, {node} AS node, {cluster} AS cluster, c.platform_idle, c.metered_seconds, "
        "c.share_gpu_s, c.charge, coalesce(c.currency, '') AS currency, c.idle_energy_j, c.energy_cost_jp, c.co2e_jkg "
        f"FROM cards c{node_join}"
    )
    with period_read_cursor(_GROUP_READ_SETTINGS) as cur:
        cur.execute(sql, params)
        return fetch_rows(cur, IdleRow)


@dataclass(frozen=True)
class NodeAssetRow:
    """One node's GPUs over a window (OpenCost's Node asset, GPUs only): the cards' cost, metered
    seconds, and how many cards reported."""

    node: str
    cluster: str
    gpu_count: int
    gpu_model: str
    metered_seconds: Decimal
    card_cost: Decimal
    first_hour: datetime
    last_hour: datetime
    currency: str


def list_node_assets(*, start: datetime, end: datetime) -> list[NodeAssetRow]:
    """Per node with GPU rows in [start, end): Σ card cost and metered seconds, by node name."""
    ledger = reads.ledger_for(start, end)
    at = ledger.at
    sql = (
        f"SELECT n.name AS node, {_KEY_SQL['cluster']} AS cluster, count(DISTINCT g.gpu_uuid) AS gpu_count, "  # noqa: S608 - fixed SQL
        "coalesce(max(g.gpu_model), '') AS gpu_model, sum(g.metered_seconds) AS metered_seconds, "
        f"sum(g.card_cost) AS card_cost, min(g.{at}) AS first_hour, max(g.{at}) AS last_hour, "
        "coalesce(max(nullif(g.currency, '')), '') AS currency "
        f"FROM {ledger.gpu_table} g JOIN {_NODE} n ON n.id = g.node_id "
        f"WHERE g.{at} >= %(start)s AND g.{at} < %(end)s GROUP BY n.name, 2 ORDER BY n.name"
    )
    with period_read_cursor() as cur:
        cur.execute(sql, {"start": start, "end": end})
        return fetch_rows(cur, NodeAssetRow)
