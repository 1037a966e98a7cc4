"""Which ledger table a read uses: the day ledger for a period of whole UTC days, else the hour
ledger (`ledger_for`, the one place that picks). The hour ledger is pruned past
VGPU_HOUR_RETENTION_DAYS, the day ledger never: a read that needs hours from before the earliest
hour kept is refused (HoursPruned, naming it) rather than summing what is left. The read functions of billing.ledger.totals,
.series and .exports take a period and pick through here; callers outside the ledger never see
a table or a model.

Both tables of a granularity have the same columns besides the time column `at` (the start of
the hour or of the UTC day); a day row keeps the first and last hour it saw usage in.

A read of usage over whole days takes the whole UTC months in it from the month ledger (UsageMonth,
billing.ledger.months) and the other days from days (`usage_rows`): the same rows summed, so the same
sums to the last digit, where a month row can stand in for its days (`month_range`).
"""

from __future__ import annotations

import gc
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal, TypeVar

from django.db import connection, transaction
from django.db.backends.utils import CursorWrapper
from django.db.models import F, Q, Sum

from billing.ledger.models import GpuDay, GpuHour, UsageDay, UsageHour, UsageMonth
from billing.ledger.retention import require_hours_retained
from billing.models.fleet import LocationRate, NodeLocation

__all__ = ["CLOSED_THROUGH", "DAYS", "HOURS", "Granularity", "Ledger", "bucketed_ledger", "fetch_rows", "hour_ledger", "ledger_for",
           "month_range", "month_ranges", "no_cycle_collection", "period_read_cursor", "usage_rows"]

Granularity = Literal["hour", "day"]
_Row = TypeVar("_Row")


def fetch_rows(cur: CursorWrapper, row_type: type[_Row]) -> list[_Row]:
    """Each result row as a `row_type`, its fields matched to the statement's column names (never
    read by position): a column the type lacks, or a field the statement lacks, is a TypeError
    at the first row rather than a value in the wrong field."""
    names = [column.name for column in cur.description]
    return [row_type(**dict(zip(names, values, strict=True))) for values in cur.fetchall()]


@contextmanager
def no_cycle_collection() -> Iterator[None]:
    """Python's cycle collector paused while a read builds its rows: tens of thousands of tuples of
    Decimals and strings, which hold no reference cycles, but whose allocations set off collections
    that walk the whole heap. A per-pod month at 1,000 GPUs spent a quarter of its Python time in
    them (623 against 477 ms of CPU, five runs each). Whoever paused it first resumes it, so nested
    or concurrent reads leave it on."""
    paused = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if paused:
            gc.enable()


@dataclass(frozen=True)
class Ledger:
    """One ledger granularity: its two tables and their column names."""

    at: Granularity
    usage: type[UsageHour] | type[UsageDay]
    gpu: type[GpuHour] | type[GpuDay]
    # First/last ledger hour with usage: the hour itself, or the day row's first_hour/last_hour.
    first_hour: str
    last_hour: str

    @property
    def usage_table(self) -> str:
        return self.usage._meta.db_table

    @property
    def gpu_table(self) -> str:
        return self.gpu._meta.db_table

    def usage_rows(self, start: datetime, end: datetime) -> Any:
        """The usage rows of [start, end) (a QuerySet of UsageHour or UsageDay). For the ledger's own
        reads; in flight (the move into billing.ledger): queries/portal.py still aggregates these itself."""
        return self.usage.objects.filter(**{f"{self.at}__gte": start, f"{self.at}__lt": end})

    def gpu_rows(self, start: datetime, end: datetime) -> Any:
        return self.gpu.objects.filter(**{f"{self.at}__gte": start, f"{self.at}__lt": end})

    def unpriced_seconds(self) -> Sum:
        """Metered seconds of the GPU-hours that were not (wholly) priced."""
        if self.gpu is GpuDay:
            return Sum("unpriced_seconds")
        return Sum("metered_seconds", filter=Q(priced=False))

    def priced_rows(self) -> Q:
        """GPU rows with some priced hour (whose currency is the period's)."""
        if self.gpu is GpuDay:
            return Q(metered_seconds__gt=F("unpriced_seconds"))
        return Q(priced=True)


HOURS = Ledger("hour", UsageHour, GpuHour, first_hour="hour", last_hour="hour")
DAYS = Ledger("day", UsageDay, GpuDay, first_hour="first_hour", last_hour="last_hour")


def _midnight(at: datetime) -> bool:
    at = at.astimezone(UTC)
    return (at.hour, at.minute, at.second, at.microsecond) == (0, 0, 0, 0)


def hour_ledger(start: datetime) -> Ledger:
    """The hour ledger for a read from `start` on; HoursPruned when retention pruned hours after it."""
    require_hours_retained(start=start)
    return HOURS


def ledger_for(start: datetime, end: datetime) -> Ledger:
    """The day ledger for a period of whole UTC days (what the period picker gives), else hours."""
    return DAYS if _midnight(start) and _midnight(end) else hour_ledger(start)


def bucketed_ledger(start: datetime, end: datetime, granularity: Granularity) -> Ledger:
    """Hour buckets need the hour ledger; day buckets read days when the period is whole days.
    (Every read of the ledger picks through this module's `ledger_for`, so one patch of it makes
    them all read hours: tests/billing/test_daily_ledger.py proves days equal hours that way.)"""
    return ledger_for(start, end) if granularity == "day" else hour_ledger(start)


# --- Whole months from the month ledger ---------------------------------------------------------

# The first UTC day the month rows do not hold yet (billing.ledger.months), as a scalar subquery: a read
# puts it in the statement that reads the month rows, so both come from one snapshot.
CLOSED_THROUGH = "(SELECT closed_through FROM billing_month_closed)"

_USAGE_KEYS = ("node_id", "gpu_uuid", "tenant", "namespace", "pod", "container", "pod_uid", "sla_tier")
_USAGE_SUMS = ("seconds", "mem_used_mb_s", "mem_granted_mb_s", "mem_billed_mb_s", "sm_used_s", "sm_granted_s",
               "sm_billed_s", "share_gpu_s", "charge", "idle_share", "energy_j")
_REQUESTED = ("mem_requested_mb_s", "sm_requested_s")


def _month_start(at: datetime) -> bool:
    return _midnight(at) and at.astimezone(UTC).day == 1


def _next_month(at: datetime) -> datetime:
    at = at.astimezone(UTC)
    return at.replace(year=at.year + at.month // 12, month=at.month % 12 + 1, day=1, hour=0, minute=0, second=0,
                      microsecond=0)


def _whole_months(ledger: Ledger, start: datetime, end: datetime) -> tuple[datetime, datetime] | None:
    """[first, last) month starts of the whole UTC months of [start, end) in a read of `ledger` (days
    only), None when none."""
    if ledger is not DAYS:
        return None
    first = start if _month_start(start) else _next_month(start)
    last = end.astimezone(UTC).replace(day=1, hour=0, minute=0, second=0, microsecond=0)
    return (first, last) if first < last else None


def month_range(ledger: Ledger, start: datetime, end: datetime, *,
                starts: Sequence[datetime] | None = None) -> tuple[datetime, datetime] | None:
    """[first, last) month starts: the whole UTC months of [start, end) that a read of `ledger` (the
    day ledger: a read of hours takes no months) may take from the month ledger, None when none.

    A month row stands in for its days where the read puts them all in one group and joins them all
    alike: no set of `starts` begins inside a month (a set is the last start at or before a row), and no
    node's location nor any location's rate starts inside a month (energy is priced by the row's
    date, billing.ledger.energy). Otherwise every month of the read comes from days."""
    months = _whole_months(ledger, start, end)
    if months is None:
        return None
    first, last = months
    if starts is not None and any(first < s < last and not _month_start(s) for s in starts):
        return None
    if _energy_rates_change([months])[0]:
        return None
    return months


def month_ranges(ledger: Ledger, periods: Sequence[tuple[datetime, datetime]]) -> list[tuple[datetime, datetime] | None]:
    """`month_range` of each of `periods` (no sets), in their order: the energy rates
    of all of them checked in one statement (a page's six months and previous period were seven)."""
    months = [_whole_months(ledger, start, end) for start, end in periods]
    asked = list(dict.fromkeys(m for m in months if m is not None))
    changed = dict(zip(asked, _energy_rates_change(asked), strict=True))
    return [None if m is None or changed[m] else m for m in months]


def _energy_rates_change(months: Sequence[tuple[datetime, datetime]]) -> list[bool]:
    """For each [first, last) of `months`: whether some node's location or some location's rate
    starts on a date inside one of its months other than its first day. One statement for them all."""
    if not months:
        return []
    inside = "effective_from > r.lo AND effective_from < r.hi AND extract(day FROM effective_from) <> 1"
    with connection.cursor() as cur:
        cur.execute(f"SELECT EXISTS (SELECT 1 FROM {NodeLocation._meta.db_table} WHERE {inside}) "  # noqa: S608 - the models' own table names
                    f"OR EXISTS (SELECT 1 FROM {LocationRate._meta.db_table} WHERE {inside}) "
                    "FROM unnest(%s::date[], %s::date[]) WITH ORDINALITY AS r(lo, hi, i) ORDER BY r.i",
                    [[first.date() for first, _last in months], [last.date() for _first, last in months]])
        return [bool(row[0]) for row in cur.fetchall()]


def usage_rows(ledger: Ledger, start: datetime, end: datetime, params: dict[str, Any], *,
               months: tuple[datetime, datetime] | None, model: bool = False, requested: bool = False,
               name: str = "rows") -> str:
    """A subquery of the usage rows of [start, end) in `ledger`, of `params["tenants"]` (None: all):
    the month rows of `months` (month_range's) and the rows of `ledger` of the rest. Each row has the
    usage columns, `at` (its hour, day or month), `first_hour`, `last_hour`, `gpu_model` (its GPU row's,
    NULL where it has none; NULL for every hour or day row unless `model`) and, with `requested`, the
    requested figures the rows store (billing.ledger.requests). Parameters are added to `params`,
    named after `name` (one per subquery of a statement)."""
    columns = ", ".join(f"u.{c}" for c in (*_USAGE_KEYS, *_USAGE_SUMS, *(_REQUESTED if requested else ())))
    tenants = "(%(tenants)s::text[] IS NULL OR u.tenant = ANY(%(tenants)s::text[]))"
    ranges = [(start, end)]
    parts = []
    if months is not None:
        params[f"{name}_months_from"], params[f"{name}_months_to"] = months
        parts.append(f"SELECT {columns}, u.month AS at, u.first_hour, u.last_hour, u.gpu_model "  # noqa: S608 - fixed names
                     f"FROM {UsageMonth._meta.db_table} u WHERE u.month >= %({name}_months_from)s "
                     f"AND u.month < %({name}_months_to)s AND {tenants}")
        # The month rows hold the closed days; the days of those months from CLOSED_THROUGH on are read as days.
        ranges = [r for r in ((start, months[0]), (months[1], end)) if r[0] < r[1]]
    at = ledger.at
    for i, (lo, hi) in enumerate(ranges):
        params[f"{name}_{i}_from"], params[f"{name}_{i}_to"] = lo, hi

    def within(table: str) -> str:
        """The windows read from `ledger` (not from month rows), as a condition on `table`'s rows."""
        out = [f"({table}.{at} >= %({name}_{i}_from)s AND {table}.{at} < %({name}_{i}_to)s)" for i in range(len(ranges))]
        if months is not None:
            out.append(f"({table}.{at} >= %({name}_months_from)s AND {table}.{at} < %({name}_months_to)s "
                       f"AND {table}.{at} >= {CLOSED_THROUGH})")
        return f"({' OR '.join(out)})"

    # The GPU rows bounded by the usage rows' windows too, though every row joined is in them (its
    # window is its usage row's): Postgres does not carry a range across an equality, and without the
    # bound it took every GPU row of the table for the join (idle's read of a week's hourly sets at
    # 1,000 GPUs probed the usage index once per GPU-hour of the month: 0.78 s, against 0.58 s
    # hashed); bounded by the period only, a month read hashed the month's GPU-days for the day or two
    # it reads from days (31k rows at 1,000 GPUs, about 20 ms of the portal's month statement).
    joins = (f" LEFT JOIN {ledger.gpu_table} g ON g.node_id = u.node_id AND g.gpu_uuid = u.gpu_uuid AND g.{at} = u.{at} "
             f"AND {within('g')}" if model else "")
    parts.append(
        f"SELECT {columns}, u.{at} AS at, u.{ledger.first_hour} AS first_hour, u.{ledger.last_hour} AS last_hour, "  # noqa: S608 - fixed names
        f"{'g.gpu_model' if model else 'NULL::varchar'} AS gpu_model FROM {ledger.usage_table} u{joins} "
        f"WHERE {within('u')} AND {tenants}")
    return "(" + " UNION ALL ".join(parts) + ")"


# Planner settings for the reads over a period's rows (period_read_cursor), measured at
# 800 GPUs x 31 days (bench/web_pages.py). The planner estimates the join of usage rows to their GPU
# rows on (gpu_uuid, window) as the product of the two columns' selectivities, far too few rows, and
# probes an index once per row in a nested loop: hash joins were 2-5x faster. The sorts of the
# per-workload groups spilled to disk at the default 4 MB. JIT compilation (~0.3 s) cost more than it
# saved on these sub-second reads.
_PERIOD_READ_SETTINGS = {"enable_nestloop": "off", "jit": "off", "work_mem": "32MB"}


@contextmanager
def period_read_cursor(extra: dict[str, str] | None = None) -> Iterator[CursorWrapper]:
    """A cursor under _PERIOD_READ_SETTINGS (and `extra`, a statement's own), for the statements run
    with it only: put back as they were afterwards, for a transaction that was already open
    (set_config(..., true) lasts a transaction)."""
    settings = {**_PERIOD_READ_SETTINGS, **(extra or {})}
    with transaction.atomic(), connection.cursor() as cur:
        names = list(settings)
        # The settings as they were, read by the statement that sets the new ones: the subquery's
        # row (OFFSET 0 keeps it a subquery) is read before the outer list sets them.
        sets, params = _set_config(settings)
        current = ", ".join(f"current_setting('{n}')" for n in names)
        cur.execute(f"SELECT b.*, {sets} FROM (SELECT {current} OFFSET 0) b", params)  # noqa: S608 - fixed setting names
        before = cur.fetchone()[: len(names)]
        yield cur
        _set_local(cur, dict(zip(names, before, strict=True)))


def _set_config(values: dict[str, str]) -> tuple[str, list[str]]:
    """`set_config(name, value, true), ...` for `values` (transaction-local) and its parameters."""
    return ", ".join(["set_config(%s, %s, true)"] * len(values)), [x for item in values.items() for x in item]


def _set_local(cur: Any, values: dict[str, str]) -> None:
    sets, params = _set_config(values)
    cur.execute(f"SELECT {sets}", params)
