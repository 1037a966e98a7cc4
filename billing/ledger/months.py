"""The month ledger (UsageMonth): the day ledger summed per UTC month with the same grouping (GPU +
workload identity), over the *closed* days only: the UTC days before `closed_through`
(billing_month_closed, one row). A read of a whole month takes its month rows and the day rows from
`closed_through` on (billing.ledger.reads.usage_rows), in one statement, so it sees one state of both.

Why closed days: a month row re-derived on every rollup cycle re-sums up to 31 days of day rows per
GPU, several times a minute, for every GPU the cycle touches; the day in progress changes every cycle
and yesterday's almost never. So the rollup's day step keeps the month rows of closed days only
(`recompute_months`: a late batch for an earlier day), and `close_days` adds each day into its month
once, when it ends: the month's rows merged with that day's rows, not its days summed again.

A month row also carries what a read of days joins per day row: the GPU-day's model, part of its
group. billing.ledger.reads decides when a month row may stand in for its days.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Any

from django.db import connection, transaction
from django.db.backends.utils import CursorWrapper

from billing.ledger.locks import lock_ledger
from billing.ledger.models import MONTH_KEY_HASHED
from billing.ledger.reads import CLOSED_THROUGH, period_read_cursor
from billing.ledger.requests import REQUESTED_COLUMNS, requested_sums

__all__ = ["close_days", "rebuild_months", "recompute_months"]

_KEYS = ("tenant", "namespace", "pod", "container", "pod_uid", "sla_tier")
_SUMS = ("seconds", "mem_used_mb_s", "mem_granted_mb_s", "mem_billed_mb_s", "sm_used_s", "sm_granted_s",
         "sm_billed_s", "pcie_mb", "share_gpu_s", "charge", "idle_share", "energy_j")
_WHOLE_MONTHS = {"enable_sort": "off", "work_mem": "64MB"}
_GROUP = ("month", "gpu_uuid", "node_id", *_KEYS, "gpu_model")
_REQUESTED = tuple(REQUESTED_COLUMNS.values())
_COLUMNS = (*_GROUP, *_SUMS, "first_hour", "last_hour", *_REQUESTED)


def _day_rows(source: str, days: str = "billing_usageday") -> str:
    """One month-shaped row per day row `d` of `days` (a table or subquery) with `source` (joins and a
    WHERE over `d`), closed days only."""
    return (
        f"SELECT date_trunc('month', d.day, 'UTC') AS month, d.gpu_uuid, d.node_id, "  # noqa: S608 - built from constant column lists
        f"{', '.join(f'd.{k}' for k in _KEYS)}, g.gpu_model, "
        f"{', '.join(f'd.{c}' for c in _SUMS)}, d.first_hour, d.last_hour, {', '.join(f'd.{c}' for c in _REQUESTED)} "
        f"FROM {days} d LEFT JOIN billing_gpuday g ON g.node_id = d.node_id AND g.gpu_uuid = d.gpu_uuid "
        f"AND g.day = d.day {source} AND d.day < {CLOSED_THROUGH}"
    )


def _insert(rows: str) -> str:
    """Month rows summed from month-shaped `rows`."""
    group = ", ".join(f"r.{c}" for c in _GROUP)
    sums = ", ".join(f"sum(r.{c})" for c in _SUMS)
    return (
        f"INSERT INTO billing_usagemonth ({', '.join(_COLUMNS)}) "  # noqa: S608 - built from constant column lists
        f"SELECT {group}, {sums}, min(r.first_hour), max(r.last_hour), {requested_sums('r')} "
        f"FROM ({rows}) r GROUP BY {group}"
    )


def _closed_through(cur: CursorWrapper) -> datetime:
    cur.execute(f"SELECT {CLOSED_THROUGH}")
    closed: datetime = cur.fetchone()[0]
    return closed


def recompute_months(cur: CursorWrapper, workload_days: Iterable[tuple[Any, ...]],
                     gpu_days: Iterable[tuple[int, str, datetime]] = ()) -> None:
    """Replace the month rows of the workloads of `workload_days` ((node, GPU, midnight, *the six
    names) whose day rows were just replaced), and every month row of the GPU-months of `gpu_days`
    ((node, GPU, midnight) whose GPU-day row changed its model), in months of closed days; the other
    days are not in month rows yet.

    The workloads' rows only, not their GPU-months': a late batch (one past CLOSE_GRACE) changes the
    day rows of its own workloads, but a GPU-month holds a row for every pod the GPU ran that month
    (8,000 by the month's end where pods churn), and re-deriving them all rewrote them for each late
    batch. A GPU-day whose model changed changes the group of every month row of that day (the model
    is in it), so its whole GPU-month is re-derived."""
    closed = _closed_through(cur)
    whole = {(n, g, _month(d)) for n, g, d in gpu_days if d < closed}
    if whole:
        _replace(cur, sorted(whole), None)
    keys = sorted({(n, g, _month(d), *names) for n, g, d, *names in workload_days
                   if d < closed and (n, g, _month(d)) not in whole})
    if keys:
        _replace(cur, sorted({k[:3] for k in keys}), keys)


# The GPU-months being replaced, and each one's rows read by its index (usage_month_node_gpu_idx for
# month rows, usage_day_node_gpu_idx for days) behind a fence, then kept by a hashed lookup of the
# workloads where only some are replaced: a GPU-month's rows are read once whatever the planner makes
# of the arrays' sizes (without the index, at 182k month rows, it read the whole ledger).
_GPU_MONTHS = "unnest(%(nodes)s::bigint[], %(gpus)s::varchar[], %(months)s::timestamptz[]) AS a(node_id, gpu_uuid, month)"
_MONTH_ROWS_OF = (
    f"SELECT u.* FROM {_GPU_MONTHS} CROSS JOIN LATERAL (SELECT u.ctid, u.* FROM billing_usagemonth u "  # noqa: S608 - fixed SQL; values are parameters
    "WHERE u.node_id = a.node_id AND u.gpu_uuid = a.gpu_uuid AND u.month = a.month OFFSET 0) u"
)
_DAY_ROWS_OF = (
    f"(SELECT u.* FROM {_GPU_MONTHS} CROSS JOIN LATERAL (SELECT * FROM billing_usageday u "  # noqa: S608 - fixed SQL; values are parameters
    "WHERE u.node_id = a.node_id AND u.gpu_uuid = a.gpu_uuid AND u.day >= a.month "
    "AND u.day < a.month + interval '1 month' OFFSET 0) u)"
)
_WORKLOAD_MONTH = ("node_id", "gpu_uuid", "month", *_KEYS)
_OF_WORKLOADS = (f"IN (SELECT * FROM unnest(%(w0)s::bigint[], %(w1)s::varchar[], %(w2)s::timestamptz[], "  # noqa: S608 - fixed SQL; values are parameters
                 f"{', '.join(f'%(w{i})s::varchar[]' for i in range(3, len(_WORKLOAD_MONTH)))}))")


def _replace(cur: CursorWrapper, gpu_months: list[tuple[Any, ...]], workloads: list[tuple[Any, ...]] | None) -> None:
    """Delete the month rows of `gpu_months` (of `workloads` only, where given) and sum them again
    from their closed days."""
    params: dict[str, Any] = {"nodes": [k[0] for k in gpu_months], "gpus": [k[1] for k in gpu_months],
                              "months": [k[2] for k in gpu_months]}
    month_of, day_of = "true", "true"
    if workloads is not None:
        params.update({f"w{i}": [k[i] for k in workloads] for i in range(len(_WORKLOAD_MONTH))})
        month_of = f"({', '.join(f'u.{c}' for c in _WORKLOAD_MONTH)}) {_OF_WORKLOADS}"
        day_of = (f"(d.node_id, d.gpu_uuid, date_trunc('month', d.day, 'UTC'), {', '.join(f'd.{k}' for k in _KEYS)}) "
                  f"{_OF_WORKLOADS}")
    cur.execute(f"DELETE FROM billing_usagemonth WHERE ctid = ANY(ARRAY(SELECT u.ctid FROM ({_MONTH_ROWS_OF}) u "  # noqa: S608 - fixed SQL; values are parameters
                f"WHERE {month_of}))", params)
    cur.execute(_insert(_day_rows(f"WHERE {day_of}", days=_DAY_ROWS_OF)), params)


def rebuild_months(cur: CursorWrapper, *, lo: datetime, hi: datetime, gpu_uuid: str | None) -> None:
    """Recompute the month rows of every UTC month that meets the days [lo, hi) (midnights), of one
    GPU or of all, from the day ledger as it is."""
    cur.execute("SELECT date_trunc('month', %s::timestamptz, 'UTC'), "
                "date_trunc('month', %s::timestamptz - interval '1 microsecond', 'UTC') + interval '1 month'",
                [lo, hi])
    first, last = cur.fetchone()
    gpu = "" if gpu_uuid is None else " AND gpu_uuid = %s"
    params: list[Any] = [first, last] if gpu_uuid is None else [first, last, gpu_uuid]
    cur.execute(f"DELETE FROM billing_usagemonth WHERE month >= %s AND month < %s{gpu}", params)  # noqa: S608 - a constant filter; values are parameters
    # A month of every GPU is every day row of it: hashed, not sorted on disk (4.7 s to 3.5 s at 1,000 GPUs).
    with period_read_cursor(_WHOLE_MONTHS) as whole:
        whole.execute(_insert(_day_rows("WHERE d.day >= %s AND d.day < %s" + gpu.replace("gpu_uuid", "d.gpu_uuid"))),
                      params)


def close_days(*, now: datetime) -> int:
    """Add the UTC days before `now`'s that are not in the month rows yet into them, each month's
    rows merged with those days' rows in one statement; returns the days closed (0: nothing to do).
    Under the exclusive ledger lock, so no rollup writes a day row meanwhile that neither this nor
    its own month step would count."""
    midnight = now.astimezone(UTC).replace(hour=0, minute=0, second=0, microsecond=0)
    with connection.cursor() as cur:
        if _closed_through(cur) >= midnight:  # the common case, without waiting for the lock
            return 0
    with transaction.atomic(), connection.cursor() as cur:
        lock_ledger()
        cur.execute("SELECT closed_through FROM billing_month_closed FOR UPDATE")
        old: datetime = cur.fetchone()[0]
        if old >= midnight:
            return 0
        cur.execute("UPDATE billing_month_closed SET closed_through = %s", [midnight])
        with period_read_cursor(_WHOLE_MONTHS) as whole:
            for month in _months_meeting(old, midnight):
                _merge_days(whole, month=month, lo=max(old, month), hi=min(midnight, _next_month(month)))
        return (midnight - old).days


def _merge_days(cur: CursorWrapper, *, month: datetime, lo: datetime, hi: datetime) -> None:
    """The day rows of [lo, hi) added into the month's rows: each month row of a workload those days
    have (its whole group: GPU, names and model) is deleted and summed with them into its
    replacement (sums of exact numerics: the same as summing every day of the month again); a month
    row those days do not have is left as it is.

    Not the month's rows all rewritten: where pods churn, most of a month's rows are of pods that are
    gone by the day being closed, and the month holds a day's rows times the days so far (83 M rows
    on the 30th at 10,000 GPUs whose pods live 5-360 minutes), rewritten each midnight under the
    ledger lock. The rows met are found by a probe of usage_month_key_idx per workload of the days
    (node, month, a hash of the rest of the group; migration 0046), behind a fence (OFFSET 0) so that
    the planner, estimating a few days' rows against a month's, never hashes the month instead."""
    days = _day_rows("WHERE d.day >= %(lo)s AND d.day < %(hi)s")
    cur.execute(
        f"WITH days AS MATERIALIZED ({days}), "  # noqa: S608 - built from constant column lists
        f"met AS (DELETE FROM billing_usagemonth WHERE ctid = ANY(ARRAY("
        f"SELECT m.ctid FROM (SELECT DISTINCT {_KEY_GROUP} FROM days) k CROSS JOIN LATERAL ("
        f"SELECT u.ctid FROM billing_usagemonth u WHERE u.node_id = k.node_id AND u.month = %(month)s "
        f"AND {_month_key('u')} = {_month_key('k')} AND ({_row('u')}) IS NOT DISTINCT FROM ({_row('k')}) "
        "OFFSET 0) m)) RETURNING *) "
        + _insert(f"SELECT {', '.join(_COLUMNS)} FROM met UNION ALL SELECT {', '.join(_COLUMNS)} FROM days"),  # noqa: S608 - constant column names
        {"month": month, "lo": lo, "hi": hi})


# A month row's group but its month (the days merged are all of one month), and that group hashed as
# usage_month_key_idx hashes it (the model's index, whose columns are the group's but month and node:
# the node is the index's first column, so not hashed). Taken from the model, so that the probe is the
# index's expression: a probe that differs from it finds nothing by the index and scans instead.
_KEY_GROUP = ", ".join(c for c in _GROUP if c != "month")
_HASHED = MONTH_KEY_HASHED


def _month_key(alias: str) -> str:
    return f"billing_month_key({', '.join(f'{alias}.{c}' for c in _HASHED)})"


def _row(alias: str) -> str:
    return ", ".join(f"{alias}.{c}" for c in _GROUP if c != "month")


def _months_meeting(lo: datetime, hi: datetime) -> list[datetime]:
    month, out = _month(lo), []
    while month < hi:
        out.append(month)
        month = _next_month(month)
    return out


def _month(day: datetime) -> datetime:
    return day.astimezone(UTC).replace(day=1, hour=0, minute=0, second=0, microsecond=0)


def _next_month(month: datetime) -> datetime:
    return month.replace(year=month.year + month.month // 12, month=month.month % 12 + 1)
